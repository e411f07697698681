package coherence

import (
	"encoding/binary"
	"errors"
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

// TestStampWaitsForProbe: a home with no duties learns a departure and
// sends no probe; a stamp request then starts the page's duty, and the
// repair waits until every member has acknowledged the epoch.
func TestStampWaitsForProbe(t *testing.T) {
	n := newTestNode(t, 1, 3) // home of every page, HomedPages empty
	if err := n.Step(Reconfigure{Epoch: 2, Members: []ids.NodeID{1, 2}}); err != nil {
		t.Fatal(err)
	}
	if rd := n.Ready(); len(rd.Messages) != 0 || len(rd.Batches) != 0 {
		t.Fatalf("a node without duties acted on the departure: %+v", rd)
	}
	if err := n.Step(Receive{Msg: Message{Type: MsgStamp, From: 2, To: 1, Epoch: 2, Page: 9}}); err != nil {
		t.Fatal(err)
	}
	rd := n.Ready()
	if len(rd.Batches) != 0 || len(rd.Messages) != 1 || rd.Messages[0].Type != MsgEpoch || rd.Messages[0].To != 2 {
		t.Fatalf("after the stamp request: %+v, want only the probe of n2", rd)
	}
	if n.duty(9) == nil || !n.duty(9).pending {
		t.Fatal("the stamp request left no pending duty")
	}
	if err := n.Step(Receive{Msg: Message{Type: MsgEpochAck, From: 2, To: 1, Epoch: 2}}); err != nil {
		t.Fatal(err)
	}
	rd = n.Ready()
	if len(rd.Batches) != 1 || rd.Batches[0].Verbs[0].Kind != VerbCAS || Word(rd.Batches[0].Verbs[0].Operand).Tag() != 2 {
		t.Fatalf("after the probe: %+v, want the repair CAS", rd)
	}
}

// TestRebuildAcrossDeparture: a new home's rebuild CAS is in flight when
// it learns another departure; the rebuilt word was computed for the
// previous epoch, so the departure's repair still follows.
func TestRebuildAcrossDeparture(t *testing.T) {
	n, err := NewNode(Config{ID: 1, PageSize: testPageSize, Epoch: 1, Members: []ids.NodeID{1, 2, 3},
		HomeOf: func(ids.PageNo) ids.NodeID { return 3 }})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Step(Reconfigure{Epoch: 2, Members: []ids.NodeID{1, 2}, HomeOf: func(ids.PageNo) ids.NodeID { return 1 }, Targets: []ids.NodeID{1}}); err != nil {
		t.Fatal(err)
	}
	n.Ready()
	if err := n.Step(Receive{Msg: Message{Type: MsgReport, From: 2, To: 1, Epoch: 2, Page: 9, State: Shared, Version: 4}}); err != nil {
		t.Fatal(err)
	}
	if rd := n.Ready(); len(rd.Batches) != 0 {
		t.Fatalf("before n2's count: %+v, want no rebuild yet", rd)
	}
	if err := n.Step(Receive{Msg: Message{Type: MsgMoveReport, From: 2, To: 1, Epoch: 2, Page: 1}}); err != nil {
		t.Fatal(err)
	}
	if rd := n.Ready(); len(rd.Batches) != 0 {
		t.Fatalf("before n2 acknowledged the epoch: %+v, want no rebuild yet", rd)
	}
	if err := n.Step(Receive{Msg: Message{Type: MsgEpochAck, From: 2, To: 1, Epoch: 2}}); err != nil {
		t.Fatal(err)
	}
	rd := n.Ready()
	if len(rd.Batches) != 1 || rd.Batches[0].Verbs[0].Kind != VerbCAS {
		t.Fatalf("with every report: %+v, want the rebuild CAS", rd)
	}
	b := rd.Batches[0]
	if w := Word(b.Verbs[0].Operand); !w.hasExactBit(2) || w.Tag() != 2 {
		t.Fatalf("rebuilt word %v, want n2's unit, tag 2", w)
	}
	if err := n.Step(Reconfigure{Epoch: 3, Members: []ids.NodeID{1}}); err != nil {
		t.Fatal(err)
	}
	n.Ready()
	if err := n.Step(VerbsDone{ID: b.ID, Results: []Result{{Word: b.Verbs[0].Compare}}}); err != nil {
		t.Fatal(err)
	}
	rd = n.Ready()
	var repair *Verb
	for _, bb := range rd.Batches {
		if v := bb.Verbs[0]; v.Kind == VerbCAS && v.Page == 9 {
			repair = &v
		}
	}
	if repair == nil {
		t.Fatalf("after the rebuild: %+v, want the repair of the departure of n2", rd)
	}
	if w := Word(repair.Operand); w.hasExactBit(2) || w.Tag() != 3 {
		t.Fatalf("repair writes %v, want n2's bit cleared, tag 3", w)
	}
}

// TestAcksAcrossEmptyEpochs: an acknowledgement of any epoch since the
// last departure keeps counting when epochs without a departure follow;
// the probe asks only the members still missing, in the new epoch.
func TestAcksAcrossEmptyEpochs(t *testing.T) {
	n := newTestNode(t, 1, 4)
	step := func(ev Event) Ready {
		t.Helper()
		if err := n.Step(ev); err != nil {
			t.Fatal(err)
		}
		return n.Ready()
	}
	step(Reconfigure{Epoch: 2, Members: []ids.NodeID{1, 2, 3}})
	rd := step(Receive{Msg: Message{Type: MsgStamp, From: 2, To: 1, Epoch: 2, Page: 9}})
	if len(rd.Messages) != 2 {
		t.Fatalf("probes: %+v, want n2 and n3", rd.Messages)
	}
	step(Receive{Msg: Message{Type: MsgEpochAck, From: 2, To: 1, Epoch: 2}})
	rd = step(Reconfigure{Epoch: 3, Members: []ids.NodeID{1, 2, 3}})
	if len(rd.Messages) != 1 || rd.Messages[0].Type != MsgEpoch || rd.Messages[0].To != 3 || rd.Messages[0].Epoch != 3 {
		t.Fatalf("after an empty epoch: %+v, want one probe, of n3 in e3", rd.Messages)
	}
	rd = step(Receive{Msg: Message{Type: MsgEpochAck, From: 3, To: 1, Epoch: 3}})
	if len(rd.Batches) != 1 || Word(rd.Batches[0].Verbs[0].Operand).Tag() != 3 {
		t.Fatalf("with every member past the departure: %+v, want the repair CAS", rd)
	}
}

// TestLostPage: a placement may name a home that is no member for a page
// whose every copy is gone (the node layer found no complete backup): the
// page is lost, not moved. It is neither frozen nor waited for, whether
// its home stays the departed one or a node that skipped epochs learns
// another departed home for it; a page frozen by a move whose new home
// departs too is given up.
func TestLostPage(t *testing.T) {
	n, err := NewNode(Config{ID: 1, PageSize: testPageSize, Epoch: 1, Members: []ids.NodeID{1, 2, 3, 4},
		HomeOf: func(ids.PageNo) ids.NodeID { return 3 }})
	if err != nil {
		t.Fatal(err)
	}
	step := func(ev Event) {
		t.Helper()
		if err := n.Step(ev); err != nil {
			t.Fatal(err)
		}
		n.Ready()
	}
	step(Request{ID: 1, Op: OpLoad, Page: 5})
	// n3 departs; p5 moves to n4, which rebuilds it: frozen meanwhile.
	step(Reconfigure{Epoch: 2, Members: []ids.NodeID{1, 2, 4}, HomeOf: func(ids.PageNo) ids.NodeID { return 4 }, Targets: []ids.NodeID{4}})
	if !n.Page(5).Frozen || n.Home(5) != 4 {
		t.Fatalf("after the move: frozen %v, home %v; want frozen, home n4", n.Page(5).Frozen, n.Home(5))
	}
	// n4 departs before the rebuild, with no copy left: p5 is lost.
	step(Reconfigure{Epoch: 3, Members: []ids.NodeID{1, 2}, HomeOf: func(ids.PageNo) ids.NodeID { return 4 }})
	if n.Page(5).Frozen || n.Home(5) != 4 || n.Page(5).State != Invalid {
		t.Fatalf("lost: frozen %v, home %v, state %v; want not frozen, home n4, Invalid", n.Page(5).Frozen, n.Home(5), n.Page(5).State)
	}
	// A placement that names another departed home for it (as a node that
	// skipped the move would learn) is accepted too.
	step(Reconfigure{Epoch: 4, Members: []ids.NodeID{1, 2}, HomeOf: func(ids.PageNo) ids.NodeID { return 3 }})
	if n.Page(5).Frozen || n.Home(5) != 3 {
		t.Fatalf("lost, another departed home: frozen %v, home %v", n.Page(5).Frozen, n.Home(5))
	}
	// A target that is no member is still refused.
	if err := n.Step(Reconfigure{Epoch: 5, Members: []ids.NodeID{1, 2}, HomeOf: func(ids.PageNo) ids.NodeID { return 3 }, Targets: []ids.NodeID{3}}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("a target that is no member: %v", err)
	}
}
