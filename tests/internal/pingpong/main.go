// Command pingpong is the far end of the same-host ping-pong benchmark of
// package tests: it answers 32-byte messages either through a mapped dsm
// region (-region) or over a Unix socket (-unix), until stdin closes.
//
// Through a region, the message is 32 bytes at -off: a sequence word and
// 24 bytes of payload; the answer is the same 32 bytes at -off+128 (another
// cache line of the same page). The pinger writes the payload, then stores
// the sequence word; pingpong spins until the sequence word changes,
// copies the message and stores the answer's sequence word last. Both
// processes map the same memfd page on one node: after the first fault of
// each, every exchange is plain memory, with no message to dsmd. It prints
// "ready SEQ" once it listens, SEQ being the sequence word it takes for
// "no ping yet"; the pinger counts on from SEQ.
//
// Over a Unix socket, it echoes every 32-byte message it reads.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/dsmkit/dsm/dsm"
)

const msgLen = 32

func main() {
	addr := flag.String("addr", "", "dsmd socket (default $DSM_ADDR)")
	region := flag.String("region", "", "region to answer through")
	off := flag.Int64("off", 0, "offset of the ping message (a multiple of 64)")
	unixPath := flag.String("unix", "", "answer over this Unix socket instead")
	flag.Parse()
	var err error
	switch {
	case *unixPath != "":
		err = serveUnix(*unixPath)
	case *region != "":
		err = serveRegion(*addr, *region, *off)
	default:
		err = fmt.Errorf("give -region or -unix")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pingpong:", err)
		os.Exit(1)
	}
}

// stdinClosed is closed when stdin reaches end of file: the pinger is done.
func stdinClosed() <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(ch)
	}()
	return ch
}

func serveRegion(addr, name string, off int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := dsm.Dial(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	r, err := c.Map(ctx, name)
	if err != nil {
		return err
	}
	defer r.Close()
	if off%64 != 0 || off < 0 || off+256 > r.Len() {
		return fmt.Errorf("offset %d: want a multiple of 64 with 256 bytes in the region", off)
	}
	if err := r.Prefault(off, 256, true); err != nil {
		return err
	}
	b := r.Bytes()
	ping := (*uint64)(unsafe.Pointer(&b[off]))
	pong := (*uint64)(unsafe.Pointer(&b[off+128]))
	// The sequence word as it is before "ready", announced with it: the
	// pinger starts counting from the announced word, not from a load of
	// its own, and stores its first ping only after reading the line, so
	// every later value is a ping to answer. (Read after "ready", a ping
	// stored in between was taken for the old value and never answered.)
	last := atomic.LoadUint64(ping)
	fmt.Println("ready", last)
	done := stdinClosed()
	for spins := 0; ; spins++ {
		seq := atomic.LoadUint64(ping)
		if seq == last {
			if spins&0xffff == 0 {
				select {
				case <-done:
					return nil
				default:
				}
			}
			continue
		}
		copy(b[off+128+8:off+128+msgLen], b[off+8:off+msgLen])
		atomic.StoreUint64(pong, seq)
		last = seq
	}
}

func serveUnix(path string) error {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Println("ready")
	done := stdinClosed()
	go func() { <-done; ln.Close() }()
	conn, err := ln.Accept()
	if err != nil {
		return nil
	}
	defer conn.Close()
	buf := make([]byte, msgLen)
	for {
		if _, err := io.ReadFull(conn, buf); err != nil {
			return nil
		}
		if _, err := conn.Write(buf); err != nil {
			return nil
		}
	}
}
