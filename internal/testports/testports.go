// Package testports hands loopback ports to the tests of this module so
// that test processes running at the same time (go test runs packages in
// parallel) never pick the same port.
//
// Ports come from 20000-31999, below the kernel's ephemeral range, so that
// no outgoing connection takes one while a node that owns it is down for a
// restart. The range is cut into blocks; a process takes a block by
// holding an exclusive flock on a file named after it in the temporary
// directory for as long as it lives (the kernel drops the lock when the
// process exits, however it exits), and hands out the ports of its blocks
// one after the other, never twice. A port something else on the machine
// holds is skipped.
package testports

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

const (
	first     = 20000
	blockSize = 200
	blocks    = 60 // 20000-31999
)

var (
	mu   sync.Mutex
	next int // next port of the current block; 0: none taken
	end  int // end of the current block
	held []*os.File
)

// Addr returns 127.0.0.1:port with a port free for TCP and UDP (memberlist
// binds both) that no other test process of this module is given.
func Addr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", Range(t, 1))
}

// Range returns the first of n consecutive ports, each free for TCP and
// UDP and given to no other test process; n is at most 200.
func Range(t testing.TB, n int) int {
	t.Helper()
	if n < 1 || n > blockSize {
		t.Fatalf("testports: %d ports asked, 1 to %d can be", n, blockSize)
	}
	mu.Lock()
	defer mu.Unlock()
	for range 4 * blocks {
		if next == 0 || end-next < n {
			if err := takeBlock(); err != nil {
				t.Fatalf("testports: %v", err)
			}
			continue
		}
		base := next
		ok := true
		for p := base; p < base+n; p++ {
			if !free(p) {
				next = p + 1
				ok = false
				break
			}
		}
		if ok {
			next = base + n
			return base
		}
	}
	t.Fatalf("testports: no %d free consecutive ports", n)
	return 0
}

// takeBlock makes a block no other process holds the current one.
func takeBlock() error {
	dir := filepath.Join(os.TempDir(), "dsm-testports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	start := rand.IntN(blocks)
	for i := range blocks {
		b := (start + i) % blocks
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("block-%d", b)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		held = append(held, f) // kept open (and locked) until the process exits
		next, end = first+b*blockSize, first+(b+1)*blockSize
		return nil
	}
	return fmt.Errorf("all %d port blocks are held by other processes", blocks)
}

// free reports whether port is free on loopback for TCP and UDP now.
func free(port int) bool {
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer ln.Close()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	pc.Close()
	return true
}
