package target

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/dsmkit/dsm/rdma"
)

func TestKeysNeverReused(t *testing.T) {
	tb := New(1)
	seen := map[uint64]bool{}
	for i := 0; i < 100; i++ {
		r, err := tb.Register(make([]byte, 64), rdma.AccessAll)
		if err != nil {
			t.Fatal(err)
		}
		k := r.Descriptor().RKey.Key
		if seen[k] {
			t.Fatalf("key %d handed out twice", k)
		}
		seen[k] = true
		if i%2 == 0 {
			if err := r.Deregister(); err != nil {
				t.Fatal(err)
			}
			if err := r.Deregister(); err == nil {
				t.Error("second Deregister succeeded")
			}
		}
	}
	if _, err := tb.Register(make([]byte, 8), 0x80); err == nil {
		t.Error("unknown access bits accepted")
	}
}

// Once Deregister returns, no operation touches the memory: concurrent
// operations either completed before or fail with ErrUnknownKey.
func TestDeregisterWaitsForOpsInFlight(t *testing.T) {
	for round := 0; round < 20; round++ {
		tb := New(1)
		mem, err := rdma.Alloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		r, err := tb.Register(mem, rdma.AccessAll)
		if err != nil {
			t.Fatal(err)
		}
		rk := r.Descriptor().RKey
		var deregistered atomic.Bool
		var wg sync.WaitGroup
		var after atomic.Int64
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 2000; i++ {
					wasGone := deregistered.Load()
					op := rdma.Op{Kind: rdma.OpFAA, RKey: rk, Operand: 1}
					err := tb.Execute(&op)
					if wasGone && err == nil {
						after.Add(1)
					}
					if err != nil && !errors.Is(err, rdma.ErrUnknownKey) {
						t.Errorf("op: %v", err)
						return
					}
				}
			}()
		}
		r.Deregister()
		final := rdma.LoadWord(mem, 0)
		deregistered.Store(true)
		wg.Wait()
		if after.Load() != 0 || rdma.LoadWord(mem, 0) != final {
			t.Fatalf("%d ops executed after Deregister returned (word %d -> %d)", after.Load(), final, rdma.LoadWord(mem, 0))
		}
		rdma.Free(mem)
	}
}
