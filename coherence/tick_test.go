package coherence

import (
	"errors"
	"fmt"
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
)

// readPages makes node n (not the home of any page: newTestNode's home is
// n1) read pages 0 to count-1, each one uncontended miss, so that it ends
// up holding count Shared copies with nothing in progress.
func readPages(tb testing.TB, n *Node, count int) {
	tb.Helper()
	word := InitialWord(1).withVersion(3)
	for i := range count {
		no := ids.PageNo(i)
		if err := n.Step(Request{ID: uint64(i) + 1, Op: OpLoad, Page: no}); err != nil {
			tb.Fatal(err)
		}
		rd := n.Ready()
		if len(rd.Batches) != 1 {
			tb.Fatalf("read miss of %v: %+v", no, rd)
		}
		err := n.Step(VerbsDone{ID: rd.Batches[0].ID, Results: []Result{
			{Word: uint64(word)}, {Data: pageBytes(nil)}, {Data: wordBytes(word + Word(unit(n.ID())))},
		}})
		if err != nil {
			tb.Fatal(err)
		}
		if rd := n.Ready(); len(rd.Completions) != 1 {
			tb.Fatalf("read of %v did not complete: %+v", no, rd)
		}
	}
}

// A Tick drives the pages and duties that have something in progress, not
// every page the node ever touched: once the reads are done the active
// set empties, a request puts its page back, and its completion lets the
// next Tick drop it again.
func TestTickWalksOnlyActivePages(t *testing.T) {
	n := newTestNode(t, 2, 3)
	readPages(t, n, 100)
	if err := n.Step(Tick{}); err != nil {
		t.Fatal(err)
	}
	if len(n.active) != 0 || !n.Quiet() {
		t.Fatalf("after the reads settled: %d active pages, quiet %v", len(n.active), n.Quiet())
	}
	if err := n.Step(Request{ID: 1000, Op: OpStore, Page: 42, Value: 7}); err != nil {
		t.Fatal(err)
	}
	if len(n.active) != 1 || n.active[0].no != 42 || n.Quiet() {
		t.Fatalf("after a write request: active %d, quiet %v", len(n.active), n.Quiet())
	}
	rd := n.Ready()
	if len(rd.Batches) != 1 {
		t.Fatalf("write miss: %+v", rd)
	}
	// The CAS fails (the word moved): the miss retries on a later Tick,
	// which must still find the page.
	if err := n.Step(VerbsDone{ID: rd.Batches[0].ID, Err: errors.New("refused: not executed")}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := n.Step(Tick{}); err != nil {
			t.Fatal(err)
		}
	}
	if rd := n.Ready(); len(rd.Batches) != 1 {
		t.Fatalf("the miss was not retried on a Tick: %+v", rd)
	}
	if len(n.active) != 1 {
		t.Fatalf("%d active pages while the miss is in flight", len(n.active))
	}
}

// BenchmarkTick is the cost of a Tick on a node that holds many pages and
// has one transition in progress: it should not grow with the pages held
// (compare pages=64 with pages=65536).
func BenchmarkTick(b *testing.B) {
	for _, count := range []int{64, 65536} {
		b.Run(fmt.Sprintf("pages=%d", count), func(b *testing.B) {
			var m []ids.NodeID
			for i := 1; i <= 3; i++ {
				m = append(m, ids.NodeID(i))
			}
			n, err := NewNode(Config{ID: 2, PageSize: testPageSize, Epoch: 1, Members: m,
				HomeOf: func(ids.PageNo) ids.NodeID { return 1 }})
			if err != nil {
				b.Fatal(err)
			}
			readPages(b, n, count)
			if err := n.Step(Request{ID: 1 << 40, Op: OpStore, Page: ids.PageNo(count), Value: 1}); err != nil {
				b.Fatal(err)
			}
			n.Ready()
			b.ResetTimer()
			for b.Loop() {
				if err := n.Step(Tick{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
