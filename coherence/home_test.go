package coherence

import (
	"encoding/binary"
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
)

// TestRebuiltWord: the word a new home writes from the members' reports.
func TestRebuiltWord(t *testing.T) {
	n := newTestNode(t, 1, 20)
	h := &homeDuty{reports: map[ids.NodeID]Message{}}
	report := func(from ids.NodeID, st State, ver uint16) {
		h.reports[from] = Message{Type: MsgReport, From: from, State: st, Version: ver}
	}
	for _, c := range []struct {
		name    string
		reports func()
		holder  ids.NodeID
		version uint16
		exact   uint16
		coarse  uint16
	}{
		{"nobody", func() {}, ids.None, 0, 0, 0},
		{"sharers of the newest version", func() {
			report(2, Shared, 7)
			report(3, Shared, 7)
			report(16, Shared, 7)
			report(4, Shared, 6) // older: not recorded, it drops its copy
		}, ids.None, 7, 1<<1 | 1<<2, 1},
		{"the M holder", func() {
			report(5, Modified, 9)
			report(2, Shared, 8) // cannot happen beside a true holder; not recorded
		}, 5, 9, 0, 0},
		{"a release that took effect", func() {
			report(5, Modified, 9) // its release completion was lost
			report(2, Shared, 9)   // read after that release
		}, ids.None, 9, 1 << 1, 0},
		{"the newest of two claims", func() {
			report(5, Modified, 9)
			report(6, Modified, 10)
		}, 6, 10, 0, 0},
		{"across the version wrap", func() {
			report(2, Shared, 65535)
			report(3, Shared, 0) // newer than 65535
		}, ids.None, 0, 1 << 2, 0},
	} {
		clear(h.reports)
		c.reports()
		w := n.rebuiltWord(h)
		if w.Holder() != c.holder || w.Version() != c.version || w.Exact() != c.exact || w.Coarse() != c.coarse || w.Tag() != 1 {
			t.Errorf("%s: rebuilt %v, want holder %v version %d exact %#x coarse %d", c.name, w, c.holder, c.version, c.exact, c.coarse)
		}
	}
}

// TestLazyHomeDuty: a home that was not given a page in HomedPages (a
// sparse region) starts that page's duty when a starving node queues for
// it: it reads the word before it trusts its guess, then hands the
// reservation to the node with a CAS.
func TestLazyHomeDuty(t *testing.T) {
	n := newTestNode(t, 1, 3) // home of every page, HomedPages empty
	if n.duty(9) != nil {
		t.Fatal("duty exists before any request")
	}
	if err := n.Step(Receive{Msg: Message{Type: MsgEnqueue, From: 2, To: 1, Epoch: 1, Page: 9}}); err != nil {
		t.Fatal(err)
	}
	if n.duty(9) == nil {
		t.Fatal("enqueue created no duty")
	}
	rd := n.Ready()
	if len(rd.Batches) != 1 || rd.Batches[0].Home != 1 || rd.Batches[0].Verbs[0].Kind != VerbRead || rd.Batches[0].Verbs[0].Span != SpanWord {
		t.Fatalf("lazy duty emitted %+v, want one READ of p9's word at n1", rd)
	}
	b := rd.Batches[0]
	w := InitialWord(1).withVersion(5)
	word := make([]byte, 8)
	binary.LittleEndian.PutUint64(word, uint64(w))
	if err := n.Step(VerbsDone{ID: b.ID, Results: []Result{{Data: word}}}); err != nil {
		t.Fatal(err)
	}
	rd = n.Ready()
	if len(rd.Batches) != 1 || rd.Batches[0].Verbs[0].Kind != VerbCAS {
		t.Fatalf("after the poll: %+v, want the CAS that reserves p9", rd)
	}
	cas := rd.Batches[0].Verbs[0]
	if Word(cas.Compare) != w || Word(cas.Operand).Reserved() != 2 {
		t.Fatalf("CAS %v, want %v -> reserved by n2", cas, w)
	}
	// A node that is not the page's home creates nothing.
	o := newTestNode(t, 3, 3)
	if err := o.Step(Receive{Msg: Message{Type: MsgEnqueue, From: 2, To: 3, Epoch: 1, Page: 9}}); err != nil {
		t.Fatal(err)
	}
	if o.duty(9) != nil {
		t.Fatal("a non-home created a duty")
	}
}
