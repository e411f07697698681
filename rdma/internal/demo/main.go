// Command demo shows two nodes doing one-sided verbs over the tcp
// transport: node 2 (a child process) registers memory and does nothing
// else; node 1 reads, writes and updates that memory with READ, WRITE, CAS
// and FAA, then asks node 2 what its memory holds now.
//
// Run it with `make run` (or `go run ./rdma/internal/demo`).
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/tcp"
)

const (
	roleEnv = "DSM_DEMO_ROLE"
	memSize = 1 << 20
	counter = 0    // offset of the FAA counter word
	lockOff = 8    // offset of the CAS word
	textOff = 4096 // offset of the text page
)

func main() {
	var err error
	if os.Getenv(roleEnv) == "target" {
		err = target()
	} else {
		err = initiator()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// target is node 2: it registers memory, tells its parent how to reach it,
// and prints its memory when asked.
func target() error {
	t, err := tcp.Listen(2, "127.0.0.1:0", tcp.Config{})
	if err != nil {
		return err
	}
	defer t.Close()
	mem, err := rdma.Alloc(memSize)
	if err != nil {
		return err
	}
	reg, err := t.Register(mem, rdma.AccessAll)
	if err != nil {
		return err
	}
	d := reg.Descriptor()
	fmt.Printf("READY %s %d %d\n", t.Addr(), d.RKey.Key, d.RKey.Base)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "show" {
			text := strings.TrimRight(string(mem[textOff:textOff+64]), "\x00")
			fmt.Printf("SHOW counter=%d lock=%d text=%q\n", rdma.LoadWord(mem, counter), rdma.LoadWord(mem, lockOff), text)
		}
	}
	return nil
}

func initiator() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.Command(self)
	child.Env = append(os.Environ(), roleEnv+"=target")
	child.Stderr = os.Stderr
	toChild, err := child.StdinPipe()
	if err != nil {
		return err
	}
	fromChild, err := child.StdoutPipe()
	if err != nil {
		return err
	}
	if err := child.Start(); err != nil {
		return err
	}
	defer func() {
		toChild.Close()
		child.Wait()
	}()
	lines := bufio.NewScanner(fromChild)
	if !lines.Scan() {
		return fmt.Errorf("node 2 did not start")
	}
	f := strings.Fields(lines.Text())
	if len(f) != 4 || f[0] != "READY" {
		return fmt.Errorf("node 2 said %q", lines.Text())
	}
	key, _ := strconv.ParseUint(f[2], 10, 64)
	base, _ := strconv.ParseUint(f[3], 10, 64)
	rk := rdma.RKey{Key: key, Base: base}
	fmt.Printf("node 2 (pid %d) registered %d KiB at %s, key %#x\n", child.Process.Pid, memSize>>10, f[1], key)

	t, err := tcp.Listen(1, "127.0.0.1:0", tcp.Config{})
	if err != nil {
		return err
	}
	defer t.Close()
	if err := t.AddPeer(2, f[1]); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const peer ids.NodeID = 2

	step := func(what string, ops ...rdma.Op) ([]rdma.Op, error) {
		start := time.Now()
		err := t.Post(ctx, peer, ops)
		fmt.Printf("  %-50s %8v\n", what, time.Since(start).Round(time.Microsecond))
		return ops, err
	}
	fmt.Println("node 1 -> node 2, one-sided (node 2's code is not involved):")
	text := []byte("hello from node 1, written with one-sided WRITE")
	if _, err := step("WRITE 47 bytes at offset 4096 (connects first)", rdma.Op{Kind: rdma.OpWrite, RKey: rk, Offset: textOff, Buf: text}); err != nil {
		return err
	}
	ops, err := step("READ them back", rdma.Op{Kind: rdma.OpRead, RKey: rk, Offset: textOff, Buf: make([]byte, len(text))})
	if err != nil {
		return err
	}
	fmt.Printf("    -> %q\n", ops[0].Buf)
	ops, err = step("CAS lock word 0 -> 1 (take a lock)", rdma.Op{Kind: rdma.OpCAS, RKey: rk, Offset: lockOff, Compare: 0, Operand: 1})
	if err != nil {
		return err
	}
	fmt.Printf("    -> old value %d: lock taken\n", ops[0].Result)
	ops, err = step("CAS lock word 0 -> 1 again", rdma.Op{Kind: rdma.OpCAS, RKey: rk, Offset: lockOff, Compare: 0, Operand: 1})
	if err != nil {
		return err
	}
	fmt.Printf("    -> old value %d: already held, nothing changed\n", ops[0].Result)
	ops, err = step("batch: FAA counter +1 and READ the counter",
		rdma.Op{Kind: rdma.OpFAA, RKey: rk, Offset: counter, Operand: 1},
		rdma.Op{Kind: rdma.OpRead, RKey: rk, Offset: counter, Buf: make([]byte, 8)})
	if err != nil {
		return err
	}
	fmt.Printf("    -> FAA returned %d, READ saw %d (one round trip, in order)\n", ops[0].Result, binary.NativeEndian.Uint64(ops[1].Buf))

	const workers, each = 8, 1000
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			op := []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Offset: counter, Operand: 1}}
			for i := 0; i < each; i++ {
				if err := t.Post(ctx, peer, op); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	el := time.Since(start)
	fmt.Printf("  %d goroutines x %d FAA: %v (%.0f ops/s)\n", workers, each, el.Round(time.Millisecond), workers*each/el.Seconds())

	bad := t.Post(ctx, peer, []rdma.Op{{Kind: rdma.OpWrite, RKey: rk, Offset: memSize, Buf: []byte("x")}})
	fmt.Printf("  WRITE past the end of the registration -> %v\n", bad)

	fmt.Fprintln(toChild, "show")
	if !lines.Scan() {
		return fmt.Errorf("node 2 did not answer")
	}
	fmt.Println("node 2's own view of its memory:")
	fmt.Println("  ", strings.TrimPrefix(lines.Text(), "SHOW "))
	fmt.Printf("  (expected counter=%d lock=1)\n", 1+workers*each)
	return nil
}
