package coherence

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
)

const testPageSize = 16

func newTestNode(t *testing.T, id ids.NodeID, members int) *Node {
	t.Helper()
	var m []ids.NodeID
	for i := 1; i <= members; i++ {
		m = append(m, ids.NodeID(i))
	}
	n, err := NewNode(Config{
		ID: id, PageSize: testPageSize, Epoch: 1, Members: m,
		HomeOf: func(ids.PageNo) ids.NodeID { return 1 },
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// wordBytes is the result of a READ of a word.
func wordBytes(w Word) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(w)) }

// pageBytes is the result of a READ of a page holding data.
func pageBytes(data []byte) []byte {
	b := make([]byte, testPageSize)
	copy(b, data)
	return b
}

// slotResults are the results of the READs of slotVerbs for a slot whose
// word is w before and after the page.
func slotResults(w Word, data []byte) []Result {
	return []Result{{Data: wordBytes(w)}, {Data: pageBytes(data)}, {Data: wordBytes(w)}}
}

// TestReadMissIsOneBatch: an uncontended read miss is one batch of FAA
// (the node's sharer unit), READ of the page and READ of the word, posted
// to the home, and
// nothing else; its result installs the page and completes the load.
func TestReadMissIsOneBatch(t *testing.T) {
	for _, id := range []ids.NodeID{2, 40} { // an exact and a coarse sharer
		n := newTestNode(t, id, 64)
		if err := n.Step(Request{ID: 1, Op: OpLoad, Page: 7, Offset: 8}); err != nil {
			t.Fatal(err)
		}
		rd := n.Ready()
		if len(rd.Batches) != 1 || len(rd.Messages) != 0 || len(rd.Completions) != 0 {
			t.Fatalf("%v: read miss emitted %+v, want exactly one batch", id, rd)
		}
		b := rd.Batches[0]
		if b.Home != 1 || len(b.Verbs) != 3 {
			t.Fatalf("%v: batch %v, want FAA, READ page, READ word to n1", id, b)
		}
		faa, rdp, rdw := b.Verbs[0], b.Verbs[1], b.Verbs[2]
		if faa.Kind != VerbFAA || faa.Span != SpanWord || faa.Page != 7 || faa.Operand != unit(id) {
			t.Fatalf("%v: first verb %v, want FAA of the unit on p7's word", id, faa)
		}
		if rdp.Kind != VerbRead || rdp.Span != SpanPage || rdp.Page != 7 {
			t.Fatalf("%v: second verb %v, want READ of p7's page", id, rdp)
		}
		if rdw.Kind != VerbRead || rdw.Span != SpanWord || rdw.Page != 7 {
			t.Fatalf("%v: third verb %v, want READ of p7's word", id, rdw)
		}
		before := InitialWord(1).withVersion(3)
		data := make([]byte, testPageSize)
		binary.LittleEndian.PutUint64(data[8:], 42)
		err := n.Step(VerbsDone{ID: b.ID, Results: []Result{
			{Word: uint64(before)}, {Data: data}, {Data: wordBytes(before + Word(unit(id)))},
		}})
		if err != nil {
			t.Fatal(err)
		}
		rd = n.Ready()
		if len(rd.Pages) != 1 || rd.Pages[0].Kind != PageInstallShared || len(rd.Completions) != 1 || rd.Completions[0].Value != 42 {
			t.Fatalf("%v: after the read %+v", id, rd)
		}
		if len(rd.Batches) != 0 || len(rd.Messages) != 0 {
			t.Fatalf("%v: an uncontended read miss needs nothing more, got %+v", id, rd)
		}
		if st, _ := n.Copy(7); st != Shared {
			t.Fatalf("%v: state %v", id, st)
		}
	}
}

// TestInvalidationsInOneStep: once the tenure is taken, every sharer gets
// its invalidation in the same Ready.
func TestInvalidationsInOneStep(t *testing.T) {
	n := newTestNode(t, 3, 64)
	if err := n.Step(Request{ID: 1, Op: OpStore, Page: 0, Value: 9}); err != nil {
		t.Fatal(err)
	}
	rd := n.Ready()
	if len(rd.Batches) != 1 || rd.Batches[0].Verbs[0].Kind != VerbCAS {
		t.Fatalf("write miss emitted %+v, want one batch starting with CAS", rd)
	}
	// The CAS fails: the word shows exact sharers 1, 2, 5, 9 and coarse
	// sharers; the retry succeeds.
	cur := InitialWord(1).withVersion(11)
	for _, s := range []ids.NodeID{1, 2, 5, 9, 30, 31} {
		cur += Word(unit(s))
	}
	if err := n.Step(VerbsDone{ID: rd.Batches[0].ID, Results: []Result{{Word: uint64(cur)}, {Data: make([]byte, testPageSize)}}}); err != nil {
		t.Fatal(err)
	}
	rd = n.Ready()
	if len(rd.Batches) != 1 {
		t.Fatalf("retry: %+v", rd)
	}
	cas := rd.Batches[0].Verbs[0]
	if cas.Kind != VerbCAS || Word(cas.Compare) != cur || Word(cas.Operand).Holder() != 3 || Word(cas.Operand).Version() != 12 || Word(cas.Operand).HasSharers() {
		t.Fatalf("retry CAS %v", cas)
	}
	if err := n.Step(VerbsDone{ID: rd.Batches[0].ID, Results: []Result{{Word: uint64(cur)}, {Data: make([]byte, testPageSize)}}}); err != nil {
		t.Fatal(err)
	}
	rd = n.Ready()
	want := map[ids.NodeID]bool{1: true, 2: true, 5: true, 9: true}
	for id := ids.NodeID(ExactSharers + 1); id <= 64; id++ {
		want[id] = true // the coarse count: every member above the exact range
	}
	got := map[ids.NodeID]bool{}
	for _, m := range rd.Messages {
		if m.Type != MsgInvalidate || m.Version != 12 || m.Epoch != 1 || m.Page != 0 {
			t.Fatalf("unexpected message %v", m)
		}
		got[m.To] = true
	}
	if len(got) != len(want) || len(rd.Messages) != len(want) {
		t.Fatalf("invalidated %d nodes in one step (%d messages), want %d", len(got), len(rd.Messages), len(want))
	}
	for id := range want {
		if !got[id] {
			t.Fatalf("%v not invalidated", id)
		}
	}
	if len(rd.Completions) != 0 {
		t.Fatal("store completed before the acknowledgements")
	}
	// Acks from all but one: still waiting. The last one grants M and the
	// store completes.
	var last ids.NodeID
	for id := range want {
		last = id
	}
	for id := range want {
		if id == last {
			continue
		}
		if err := n.Step(Receive{Msg: Message{Type: MsgInvAck, From: id, To: 3, Epoch: 1, Page: 0, Version: 12}}); err != nil {
			t.Fatal(err)
		}
	}
	if rd := n.Ready(); len(rd.Completions) != 0 {
		t.Fatalf("completed with an ack missing: %+v", rd)
	}
	if err := n.Step(Receive{Msg: Message{Type: MsgInvAck, From: last, To: 3, Epoch: 1, Page: 0, Version: 12}}); err != nil {
		t.Fatal(err)
	}
	rd = n.Ready()
	if len(rd.Completions) != 1 || len(rd.Pages) != 1 || rd.Pages[0].Kind != PageGrantExclusive {
		t.Fatalf("after the last ack: %+v", rd)
	}
}

func TestStaleEpochRefused(t *testing.T) {
	n := newTestNode(t, 2, 3)
	err := n.Step(Receive{Msg: Message{Type: MsgInvalidate, From: 1, To: 2, Epoch: 5, Page: 0, Version: 1}})
	if !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("got %v, want ErrStaleEpoch", err)
	}
	if rd := n.Ready(); !rd.Empty() {
		t.Fatalf("a refused message produced %+v", rd)
	}
	if err := n.Step(Reconfigure{Epoch: 1, Members: []ids.NodeID{1, 2}}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("reconfiguration to the same epoch: %v", err)
	}
}

func TestBadRequests(t *testing.T) {
	n := newTestNode(t, 2, 3)
	for _, r := range []Request{
		{Op: OpLoad, Offset: 3},
		{Op: OpLoad, Offset: testPageSize},
		{Op: OpStore, Offset: -8},
		{Op: 0},
		{Op: 99},
	} {
		if err := n.Step(r); !errors.Is(err, ErrBadRequest) {
			t.Errorf("%+v: got %v", r, err)
		}
	}
	if err := n.Step(Request{Op: OpLoad, Page: 0}); err != nil {
		t.Fatal(err)
	}
	if err := n.Step(Reconfigure{Epoch: 2, Members: []ids.NodeID{1, 2}, HomeOf: func(ids.PageNo) ids.NodeID { return 3 }, Targets: []ids.NodeID{3}}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("a page moved to a non-member: %v", err)
	}
	if err := n.Step(Reconfigure{Epoch: 2, Members: []ids.NodeID{1, 2, 3}, HomeOf: func(ids.PageNo) ids.NodeID { return 3 }, Targets: []ids.NodeID{2}}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("a page moved to a member that is no target: %v", err)
	}
	if n.Epoch() != 1 {
		t.Errorf("a refused reconfiguration changed the epoch to %v", n.Epoch())
	}
	if err := n.Step(VerbsDone{ID: 99}); !errors.Is(err, ErrUnknownBatch) {
		t.Errorf("unknown batch: %v", err)
	}
	if _, err := NewNode(Config{ID: MaxNodeID + 1, PageSize: 8, Epoch: 1, HomeOf: func(ids.PageNo) ids.NodeID { return 1 }}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("node id beyond the word: %v", err)
	}
}
