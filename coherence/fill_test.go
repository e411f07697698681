package coherence

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
)

// newFillHome is node 1 of members 1..3, the home of every page, with
// backups given by bk.
func newFillHome(t *testing.T, bk []ids.NodeID) *Node {
	t.Helper()
	n, err := NewNode(Config{
		ID: 1, PageSize: testPageSize, Epoch: 1, Members: []ids.NodeID{1, 2, 3},
		HomeOf:  func(ids.PageNo) ids.NodeID { return 1 },
		Backups: func(ids.PageNo) []ids.NodeID { return bk },
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ackAll answers the home's epoch probes as every member would.
func ackAll(t *testing.T, n *Node, rd Ready) {
	t.Helper()
	for _, m := range rd.Messages {
		if m.Type == MsgEpoch {
			if err := n.Step(Receive{Msg: Message{Type: MsgEpochAck, From: m.To, To: 1, Epoch: n.Epoch()}}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestFillRefused: a fill the home cannot run is reported abandoned at
// once, with the reason; a bad backup id is refused by Step.
func TestFillRefused(t *testing.T) {
	n := newFillHome(t, []ids.NodeID{2})
	if err := n.Step(Fill{Pages: []ids.PageNo{1}, To: ids.None}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("fill to None: %v, want ErrBadRequest", err)
	}
	for _, to := range []ids.NodeID{1, 3, 9} { // itself, no backup, no member
		if err := n.Step(Fill{Pages: []ids.PageNo{1}, To: to}); err != nil {
			t.Fatal(err)
		}
		rd := n.Ready()
		if len(rd.Filled) != 1 || !errors.Is(rd.Filled[0].Err, ErrFillAbandoned) || rd.Filled[0].To != to {
			t.Fatalf("fill to %v: %+v, want one abandoned fill", to, rd.Filled)
		}
	}
}

// TestFillWaitsForTheFence: nothing is posted until every member has
// acknowledged the epoch; then a page never written is filled without a
// copy, and a written one is reserved, read and copied with its stamp, and
// the turn goes back.
func TestFillWaitsForTheFence(t *testing.T) {
	n := newFillHome(t, []ids.NodeID{2})
	if err := n.Step(Fill{Pages: []ids.PageNo{4, 5}, To: 2}); err != nil {
		t.Fatal(err)
	}
	rd := n.Ready()
	if len(rd.Batches) != 0 || len(rd.Filled) != 0 {
		t.Fatalf("before the fence: %+v", rd)
	}
	ackAll(t, n, rd)
	rd = n.Ready()
	reads := map[ids.PageNo]Batch{}
	for _, b := range rd.Batches {
		if b.Home != 1 || fmt.Sprint(b.Verbs) != fmt.Sprint(slotVerbs(b.Verbs[0].Page)) {
			t.Fatalf("after the fence: %v, want READs of the slots", b)
		}
		reads[b.Verbs[0].Page] = b
	}
	if len(reads) != 2 {
		t.Fatalf("after the fence: %+v, want a READ of p4 and p5", rd.Batches)
	}
	// p4 was never written; p5 holds data of tenure 3.
	if err := n.Step(VerbsDone{ID: reads[4].ID, Results: slotResults(0, nil)}); err != nil {
		t.Fatal(err)
	}
	data := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	w := InitialWord(1).withVersion(3)
	if err := n.Step(VerbsDone{ID: reads[5].ID, Results: slotResults(w, data)}); err != nil {
		t.Fatal(err)
	}
	rd = n.Ready()
	if len(rd.Filled) != 1 || rd.Filled[0] != (FillDone{Page: 4, To: 2}) {
		t.Fatalf("p4: %+v, want filled without a copy", rd.Filled)
	}
	if len(rd.Batches) != 1 || rd.Batches[0].Verbs[0].Kind != VerbCAS || Word(rd.Batches[0].Verbs[0].Operand).Reserved() != HomeTurn {
		t.Fatalf("p5: %+v, want the CAS that takes the turn", rd.Batches)
	}
	cas := rd.Batches[0]
	if len(cas.Verbs) != 3 || fmt.Sprint(cas.Verbs[1:]) != fmt.Sprint(slotVerbs(5)[1:]) {
		t.Fatalf("p5: %v, want the CAS followed by READs of the page and the word", cas)
	}
	held := Word(cas.Verbs[0].Operand)
	if err := n.Step(VerbsDone{ID: cas.ID, Results: []Result{{Word: cas.Verbs[0].Compare}, {Data: pageBytes(data)}, {Data: wordBytes(held)}}}); err != nil {
		t.Fatal(err)
	}
	rd = n.Ready()
	if len(rd.Batches) != 1 || rd.Batches[0].Home != 2 || len(rd.Batches[0].Verbs) != 2 {
		t.Fatalf("p5 read: %+v, want the copy to n2", rd.Batches)
	}
	cp := rd.Batches[0]
	if !slices.Equal(cp.Verbs[0].Data, data) || Word(binary.LittleEndian.Uint64(cp.Verbs[1].Data)) != Stamp(3) {
		t.Fatalf("copy %v: data %v, stamp %v", cp, cp.Verbs[0].Data, cp.Verbs[1].Data)
	}
	if err := n.Step(VerbsDone{ID: cp.ID, Results: []Result{{}, {}}}); err != nil {
		t.Fatal(err)
	}
	rd = n.Ready()
	if len(rd.Filled) != 1 || rd.Filled[0] != (FillDone{Page: 5, To: 2}) {
		t.Fatalf("p5: %+v, want filled", rd.Filled)
	}
	if len(rd.Batches) != 1 || Word(rd.Batches[0].Verbs[0].Operand).Reserved() != ids.None {
		t.Fatalf("p5 filled: %+v, want the CAS that gives the turn back", rd.Batches)
	}
	pass := rd.Batches[0]
	if err := n.Step(VerbsDone{ID: pass.ID, Results: []Result{{Word: pass.Verbs[0].Compare}}}); err != nil {
		t.Fatal(err)
	}
	if !n.Quiet() {
		t.Fatalf("not quiet after the fills")
	}
}

// TestFillAbandonedWhenTheBackupDeparts: a fill under way whose backup
// departs is reported abandoned at the reconfiguration, and the turn it
// holds goes back.
func TestFillAbandonedWhenTheBackupDeparts(t *testing.T) {
	n := newFillHome(t, []ids.NodeID{2})
	if err := n.Step(Fill{Pages: []ids.PageNo{5}, To: 2}); err != nil {
		t.Fatal(err)
	}
	ackAll(t, n, n.Ready())
	rd := n.Ready()
	w := InitialWord(1).withVersion(3)
	if err := n.Step(VerbsDone{ID: rd.Batches[0].ID, Results: slotResults(w, nil)}); err != nil {
		t.Fatal(err)
	}
	cas := n.Ready().Batches[0]
	held := Word(cas.Verbs[0].Operand)
	if err := n.Step(VerbsDone{ID: cas.ID, Results: []Result{{Word: cas.Verbs[0].Compare}, {Data: pageBytes(nil)}, {Data: wordBytes(held)}}}); err != nil {
		t.Fatal(err)
	}
	n.Ready()
	if err := n.Step(Reconfigure{Epoch: 2, Members: []ids.NodeID{1, 3}, Backups: func(ids.PageNo) []ids.NodeID { return []ids.NodeID{3} }}); err != nil {
		t.Fatal(err)
	}
	rd = n.Ready()
	if len(rd.Filled) != 1 || !errors.Is(rd.Filled[0].Err, ErrFillAbandoned) {
		t.Fatalf("after n2 departed: %+v, want the fill abandoned", rd.Filled)
	}
	if n.Quiet() {
		t.Fatalf("quiet with the turn still held")
	}
}
