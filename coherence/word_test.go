package coherence

import (
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
)

func TestWordFields(t *testing.T) {
	w := InitialWord(17).withHolder(MaxNodeID).withResv(5).withVersion(65535)
	if w.Holder() != MaxNodeID || w.Reserved() != 5 || w.Version() != 65535 || w.Tag() != 1 {
		t.Fatalf("fields of %v", w)
	}
	if w.HasSharers() {
		t.Fatalf("%v has sharers", w)
	}
	// Every node's unit lands in the sharer fields and nowhere else.
	for id := ids.NodeID(1); id <= MaxNodeID; id++ {
		x := w + Word(unit(id))
		if x.Holder() != w.Holder() || x.Reserved() != w.Reserved() || x.Version() != w.Version() || x.Tag() != w.Tag() {
			t.Fatalf("unit of %v disturbs other fields: %v", id, x)
		}
		if isExact(id) != x.hasExactBit(id) {
			t.Fatalf("unit of %v: exact bit %t", id, x.hasExactBit(id))
		}
		if !isExact(id) && x.Coarse() != 1 {
			t.Fatalf("unit of %v: coarse %d", id, x.Coarse())
		}
	}
	// All exact bits and the largest coarse count fit without carry.
	all := w
	for id := ids.NodeID(1); id <= ExactSharers; id++ {
		all += Word(unit(id))
	}
	for i := 0; i < MaxNodeID-ExactSharers; i++ {
		all += Word(unit(ExactSharers + 1))
	}
	if all.Exact() != exactMask || int(all.Coarse()) != MaxNodeID-ExactSharers || all.Holder() != MaxNodeID {
		t.Fatalf("full word %v", all)
	}
	if all.withoutSharers() != w {
		t.Fatalf("withoutSharers(%v) = %v", all, all.withoutSharers())
	}
}

func TestNewer(t *testing.T) {
	for _, c := range []struct {
		a, b uint16
		want bool
	}{{1, 0, true}, {0, 1, false}, {0, 65535, true}, {5, 5, false}, {32767, 0, true}, {32768, 0, false}} {
		if got := newer(c.a, c.b); got != c.want {
			t.Errorf("newer(%d, %d) = %t", c.a, c.b, got)
		}
	}
}
