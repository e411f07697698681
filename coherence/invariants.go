package coherence

import "fmt"

// checkInvariants verifies the node's internal consistency. It runs after
// every Step when built with the invariants tag and panics on a broken
// invariant: that is a bug of this package, never bad input.
func (n *Node) checkInvariants() {
	for _, p := range n.order {
		fail := func(what string) {
			panic(fmt.Sprintf("coherence: invariant: %v %v (%v, %v): %s", n.cfg.ID, p.no, p.state, p.ph, what))
		}
		switch p.state {
		case Invalid:
			if p.data != nil && p.ph != phWaitAcks { // wait-acks: the data of the coming M copy
				fail("an invalid page keeps data")
			}
		case Shared, Modified:
			if len(p.data) != n.cfg.PageSize {
				fail("a valid copy of the wrong size")
			}
		}
		passing := p.ph == phPassTurn || p.ph == phResolve && p.resolving == phPassTurn
		if p.state == Modified && (p.ph != phIdle && !passing || p.unitCounted) {
			fail("M outside the idle phase, or with a counted sharer unit")
		}
		if p.ph == phWaitAcks && p.awaiting == nil {
			fail("waiting for acks from nobody")
		}
		if (p.releasing() || p.frozenM) && p.wbData == nil {
			fail("releasing without the data to write back")
		}
		if (p.ph == phResolve) != (p.unknown != nil) || p.ph == phResolve && !changesWord(p.unknown) {
			fail("resolving without a batch of unknown outcome that changes the word")
		}
		if p.frozenM && !p.frozen {
			fail("an interrupted release outside a freeze")
		}
		if !p.active && !settled(p) {
			fail("not settled, and not in the active set: a Tick would not drive it")
		}
		if p.inflight != 0 {
			if rec, ok := n.batches[p.inflight]; !ok || rec.home || rec.page != p.no {
				fail("the batch in flight is not recorded")
			}
		}
	}
	for _, h := range n.homes {
		for _, f := range h.fills {
			// A fill that can no longer complete was reported abandoned
			// when the node learnt so (Reconfigure, Fill).
			if why := n.fillRefused(h.no, f.to); why != "" {
				panic(fmt.Sprintf("coherence: invariant: %v home of %v: a fill to %v kept: %s", n.cfg.ID, h.no, f.to, why))
			}
		}
		if !h.active && !settledHome(h) {
			panic(fmt.Sprintf("coherence: invariant: %v home of %v: not settled, and not in the active set: a Tick would not drive it", n.cfg.ID, h.no))
		}
		if h.fillHeld && n.homeOf(h.no) != n.cfg.ID {
			panic(fmt.Sprintf("coherence: invariant: %v holds the turn of %v, which it is not the home of", n.cfg.ID, h.no))
		}
		if h.inflight != 0 {
			if rec, ok := n.batches[h.inflight]; !ok || !rec.home || rec.page != h.no {
				panic(fmt.Sprintf("coherence: invariant: %v home of %v: the batch in flight is not recorded", n.cfg.ID, h.no))
			}
		}
	}
}
