//go:build ofi

package ofi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dsmkit/dsm/rdma"
)

// TestAbandonedSlots cancels posts while their requests are in flight: each
// Post returns the context's error at once, and every slot comes back to
// the free list once the late completions arrived (into C memory).
func TestAbandonedSlots(t *testing.T) {
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			a, b := pair(t, prov)
			mem, err := rdma.Alloc(4 << 20)
			if err != nil {
				t.Fatal(err)
			}
			defer rdma.Free(mem)
			reg, err := b.Register(mem, rdma.AccessAll)
			if err != nil {
				t.Fatal(err)
			}
			rk := reg.Descriptor().RKey
			bg, cancelBg := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancelBg()
			// Learn the descriptor first, so the cancelled posts below
			// reach the fabric.
			if err := a.Post(bg, 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}); err != nil {
				t.Fatal(err)
			}
			cancelled := 0
			for i := 0; i < 20; i++ {
				ctx, cancel := context.WithTimeout(bg, 50*time.Microsecond)
				buf := make([]byte, 2<<20)
				err := a.Post(ctx, 2, []rdma.Op{{Kind: rdma.OpRead, RKey: rk, Buf: buf}})
				cancel()
				if errors.Is(err, context.DeadlineExceeded) {
					cancelled++
				} else if err != nil {
					t.Fatalf("post %d: %v", i, err)
				}
			}
			t.Logf("%d of 20 posts abandoned in flight", cancelled)
			deadline := time.Now().Add(10 * time.Second)
			for len(a.free) != len(a.slots) {
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d slots free 10 s after the last post", len(a.free), len(a.slots))
				}
				time.Sleep(10 * time.Millisecond)
			}
			ops := []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}
			if err := a.Post(bg, 2, ops); err != nil || ops[0].Result != 1 {
				t.Fatalf("post after abandoned ones: %v, result %d", err, ops[0].Result)
			}
		})
	}
}

// TestShmStaleFiles checks that Listen removes the /dev/shm files of shm
// endpoints whose process is gone, and leaves the others alone.
func TestShmStaleFiles(t *testing.T) {
	stale := filepath.Join(shmDir, shmPrefix+"2147483646_1_1") // no such pid
	alive := filepath.Join(shmDir, shmPrefix+"1_1_1")          // init never dies
	for _, f := range []string{stale, alive} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Skipf("cannot write %s: %v", f, err)
		}
	}
	defer os.Remove(alive)
	defer os.Remove(stale)
	a, err := Listen(1, "", Config{Provider: "shm"})
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(shmDir)
	own := false
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), a.shmName) {
			own = true
		}
	}
	a.Close()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale file %s survived Listen: %v", stale, err)
	}
	if _, err := os.Stat(alive); err != nil {
		t.Errorf("file of a live process removed: %v", err)
	}
	if !own {
		t.Errorf("no /dev/shm file named after the endpoint %s: the naming assumption is wrong", a.shmName)
	}
	if _, err := os.Stat(filepath.Join(shmDir, a.shmName)); !os.IsNotExist(err) {
		t.Errorf("own file left after Close: %v", err)
	}
}

// TestGoMemoryRegistration registers memory of the Go heap (pinned while
// registered), reads it remotely through a collection, and closes the
// transport before deregistering.
func TestGoMemoryRegistration(t *testing.T) {
	a, b := pair(t, "sockets")
	mem := make([]byte, 4096)
	copy(mem, "go heap")
	reg, err := b.Register(mem, rdma.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	mem = nil
	runtime.GC()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ops := []rdma.Op{{Kind: rdma.OpRead, RKey: reg.Descriptor().RKey, Buf: make([]byte, 7)}}
	if err := a.Post(ctx, 2, ops); err != nil || string(ops[0].Buf) != "go heap" {
		t.Fatalf("read of Go memory: %v %q", err, ops[0].Buf)
	}
	b.Close()
	if err := reg.Deregister(); err != nil {
		t.Errorf("deregister after close: %v", err)
	}
}
