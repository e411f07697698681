package sim

import (
	"fmt"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// This file is the simulator's node layer for graceful leaves
// (Options.Drains, docs/failover.md §11): what dsmd does between SIGTERM
// and its departure, one step at a time. The core has no drain of its
// own: a leave is evictions (Modified pages written back to their homes
// and backups), moves away from a live home (promotions) and, once the
// node holds and homes nothing, a departure. The run checks that the
// departure reverts nothing.

// startDrain marks a live node draining, in an epoch of its own (dsmd's
// drain mark moves the protocol epoch): a node of the first epoch or a
// joiner, neither tainted nor draining, while at least three members
// stay. It reports whether it started one.
func (s *Sim) startDrain() bool {
	var cand, alive []ids.NodeID
	for _, n := range s.nodes[1:] {
		if !n.alive {
			continue
		}
		alive = append(alive, n.id)
		if !s.tainted[n.id] && !s.draining[n.id] {
			cand = append(cand, n.id)
		}
	}
	if len(alive) < 4 || len(cand) == 0 || s.filling() {
		return false
	}
	x := cand[s.rng.Intn(len(cand))]
	s.drains++
	s.drainer = x
	s.draining[x] = true
	s.tracef("drain %v: its client stops, it backs up and takes no page from now on", x)
	s.reconfigure(s.Opts.AsyncReconfig)
	return true
}

// driveDrain takes the drainer one step further: an eviction of a page it
// holds Modified, a move of a page it homes, or its departure. It reports
// whether it took a step.
func (s *Sim) driveDrain() bool {
	x := s.drainer
	n := s.nodes[x]
	if !n.alive {
		// A leave cut short (the run does not crash drainers: a bug
		// of the driver).
		s.fail("drain: %v died while draining", x)
		return false
	}
	if n.client != nil {
		return false // its last request first (a write-back under way)
	}
	for p := range ids.PageNo(s.Opts.Pages) {
		if info := n.sm.Page(p); (info.Tenure || info.State == coherence.Modified) && !s.Opts.LeaveHolding {
			s.stats.DrainEvictions++
			if err := s.request(x, coherence.Request{Op: coherence.OpEvict, Page: p}); err != nil {
				s.fail("drain: evict %v at %v: %v", p, x, err)
			}
			return true
		}
	}
	if s.reconf >= 0 || len(s.promote) > 0 || len(s.lagging) > 0 && !s.Opts.SkipMoves {
		return false
	}
	for p := range ids.PageNo(s.Opts.Pages) {
		if s.slots[p].home != x {
			continue
		}
		c := s.promotable(p)
		if c == ids.None {
			return false // a fill first
		}
		s.stats.DrainPromotions++
		s.promote[p] = c
		s.tracef("promote %v from the draining %v to %v", p, x, c)
		s.reconfigure(s.Opts.AsyncReconfig)
		return true
	}
	if len(s.lagging) > 0 || s.fillingBut(x) {
		return false
	}
	if err := s.leave(x); err != nil {
		s.fail("%v", err)
		return false
	}
	s.drainer = ids.None
	s.stats.Drains++
	s.reconf = 5 + s.rng.Intn(60)
	return true
}

// leave is a drained node's departure: it must hold no tenure and home no
// page, so that its departure reverts nothing (the reference keeps every
// page as it is). The reconfiguration that removes it comes later.
func (s *Sim) leave(x ids.NodeID) error {
	if int(x) <= 0 || int(x) >= len(s.nodes) || !s.nodes[x].alive {
		return fmt.Errorf("leave: no live node %v", x)
	}
	n := s.nodes[x]
	for p := ids.PageNo(0); int(p) < s.Opts.Pages; p++ {
		sl := s.slots[p]
		if sl.home == x {
			return fmt.Errorf("leave: %v departs as the home of %v", x, p)
		}
		w := coherence.Word(rdma.LoadWord(sl.reg.Bytes(), sl.off))
		if info := n.sm.Page(p); (w.Holder() == x || info.Tenure) && !s.Opts.LeaveHolding {
			return fmt.Errorf("leave: %v departs holding %v (word %v, %s at the node): its write would be lost", x, p, w, info.Phase)
		}
	}
	s.tracef("leave %v: it holds and homes nothing", x)
	return s.depart(x, true)
}
