package sim

import (
	"reflect"
	"strings"
	"testing"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/rdma"
)

// TestDeterministic: a seed is a complete description of a run.
func TestDeterministic(t *testing.T) {
	o := Options{Nodes: 6, Pages: 2, Ops: 80, Faults: true, Evict: true, Crashes: 2, HomeCrashes: 1, Trace: true}
	var traces [2][]string
	var stats [2]Stats
	for i := range traces {
		s, err := New(42, o)
		if err != nil {
			t.Fatal(err)
		}
		stats[i], err = s.run()
		if err != nil {
			t.Fatal(err)
		}
		traces[i] = s.TakeTrace()
	}
	if len(traces[0]) == 0 || !reflect.DeepEqual(traces[0], traces[1]) || stats[0] != stats[1] {
		t.Fatalf("two runs of one seed differ: %d and %d trace lines, %+v and %+v", len(traces[0]), len(traces[1]), stats[0], stats[1])
	}
}

// TestChecksCatch plants faults the protocol would never make and expects
// the checks to report them: the checks can fail.
func TestChecksCatch(t *testing.T) {
	setup := func(t *testing.T) *Sim {
		s, err := New(1, Options{Nodes: 3, Pages: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Request(2, coherence.Request{Op: coherence.OpStore, Page: 0, Value: 7}); err != nil {
			t.Fatal(err)
		}
		if !s.Stabilize(1000) {
			t.Fatal("not stable")
		}
		if err := s.Request(3, coherence.Request{Op: coherence.OpLoad, Page: 0}); err != nil {
			t.Fatal(err)
		}
		if !s.Stabilize(1000) {
			t.Fatal("not stable")
		}
		if err := s.Check(true); err != nil {
			t.Fatal(err)
		}
		return s
	}
	slotOf := func(s *Sim) []byte { sl := s.slots[0]; return sl.reg.Bytes()[sl.off:] }
	for _, c := range []struct {
		name, want string
		plant      func(s *Sim)
		busy       bool // checked as after any step, not only when quiet
	}{
		{"phantom sharer bit", "does not believe", func(s *Sim) {
			w := rdma.LoadWord(slotOf(s), 0)
			rdma.StoreWord(slotOf(s), 0, w|1<<40)
		}, true},
		{"lost sharer bit", "believes its unit counted", func(s *Sim) {
			w := rdma.LoadWord(slotOf(s), 0)
			rdma.StoreWord(slotOf(s), 0, w&^(1<<42))
		}, true},
		{"lost update", "lost update", func(s *Sim) { slotOf(s)[8] ^= 1 }, false},
		{"stray sharer bit", "bit of n1", func(s *Sim) {
			w := rdma.LoadWord(slotOf(s), 0)
			rdma.StoreWord(slotOf(s), 0, w|1<<40)
		}, false},
		{"stale copy", "copy of p0", func(s *Sim) { s.setRef(0, 0, 99) }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := setup(t)
			c.plant(s)
			err := s.Check(!c.busy)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("planted %s: got %v, want a violation mentioning %q", c.name, err, c.want)
			}
		})
	}
}
