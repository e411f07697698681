package coherence

import "github.com/dsmkit/dsm/internal/ids"

// This file holds phResolve: what a node does with a batch of its own
// whose outcome is not known (VerbsDone.Unknown: the transport lost the
// answer; the batch, or a prefix of it, may have executed, and it never
// executes later). A batch of READs is posted again like a failed one. A
// batch that changes the word is never posted again blindly: an FAA twice
// would count a unit twice (and carry into the neighbour's bit), a release
// CAS that executed would be followed by a tenure of someone else. The
// node reads the word (phResolve posts one READ of it, repeated until it
// executes) and judges from it, per phase, whether the batch took effect.
// docs/protocol.md, "Batches of unknown outcome", gives the rules and why
// they are right; each rule below rests on the unit rule (only the node
// adds or removes its own unit, and an acquisition clears every unit and
// moves the version) and on the holder field (only the node's own
// acquisition CAS names it; only its release CAS, or the repair after it
// was declared gone, clears it).

// changesWord reports whether a batch has a verb that changes the slot:
// its outcome must be resolved, not retried.
func changesWord(verbs []Verb) bool {
	for _, v := range verbs {
		if v.Kind != VerbRead {
			return true
		}
	}
	return false
}

// resolveDone judges the unknown batch of phase p.resolving from w, the
// word as read after it, and puts the page back in the phase that follows.
func (n *Node) resolveDone(p *page, w Word) {
	ph := p.resolving
	if ph == phRelease && w.Holder() == NotHome {
		// Not the page's home any more: the slot cannot tell whether
		// the release executed. It stays unresolved (the tenure
		// claimed, wbData kept) until the epoch that moved the page
		// freezes it, or a repair makes the word a home word again.
		p.guess = w
		n.notHome(p)
		return
	}
	p.resolving, p.unknown = phIdle, nil
	p.ph = ph
	p.guess = w
	switch ph {
	case phRead:
		n.resolveRead(p, w)
	case phAcquire:
		n.resolveAcquire(p, w)
	case phRelease:
		n.resolveRelease(p, w)
	case phEvict:
		n.resolveEvict(p, w)
	case phPassTurn:
		n.resolvePassTurn(p, w)
	}
}

// resolveRead: the batch was [FAA +unit, READ page, READ word] (the unit was not
// counted, or no FAA would have been posted).
//
// Exact id: our bit set means the FAA executed at the word's version (no
// one else sets our bit; an acquisition after the FAA would have cleared
// it); a clear bit means it did not, or its unit is gone already. Either
// way the read goes on knowing whether the unit is counted.
//
// Coarse id: the count cannot say whose units it holds. A count of zero
// holds none of ours (the FAA did not execute or its unit is gone): add it
// again. Otherwise the node does not add it again (a phantom unit would
// stay counted for ever); it takes the page's tenure once instead, a write
// miss without a store, whose CAS clears every unit, the phantom
// included, and then releases to S, whose CAS adds its unit exactly.
func (n *Node) resolveRead(p *page, w Word) {
	if isExact(n.cfg.ID) {
		if w.hasExactBit(n.cfg.ID) {
			p.unitCounted, p.unitVer = true, w.Version()
		}
		return
	}
	if w.Coarse() == 0 {
		return
	}
	p.downgrade = true
	p.ph = phAcquire
	p.attempts = 0
}

// resolveAcquire: the batch was [CAS tenure] or [CAS tenure, READ page].
// The CAS executed exactly when the word names this node as the holder at
// the expected version + 1: nobody else names us, and nobody takes a
// tenure from a member that holds it. Then the acquisition goes on as on
// success (the page is read again unless the S copy is current, the
// expected word's sharers are invalidated); else it did not execute and
// the attempt is judged as a failed CAS that returned w.
func (n *Node) resolveAcquire(p *page, w Word) {
	if w.Holder() == n.cfg.ID && w.Version() == p.expect.Version()+1 {
		n.acquired(p, p.expect, w, nil)
		return
	}
	if !n.acquirable(w) {
		p.attempts++
		n.blocked(p, w, true)
	}
}

// resolveRelease: the batch was [WRITE page, CAS release] or [CAS release].
// Holder still this node at copyVer: the CAS did not execute (the WRITE
// may have; it is posted again, and writing the tenure's own data twice is
// harmless). No holder at copyVer: it executed (a release to S added our
// unit at copyVer). Another version: it executed and a later tenure began
// (or the tenure was taken from a node declared gone): whether the copy is
// still recorded cannot be told, so it is dropped, as releaseDone does
// when the tenure was taken.
func (n *Node) resolveRelease(p *page, w Word) {
	switch {

	case w.Version() != p.copyVer:
		n.releaseLost(p)
	case w.Holder() == n.cfg.ID:
		// Not executed: post it again.
	case w.Holder() == ids.None:
		n.released(p, w)
	default:
		// Another holder at our version cannot happen (an acquisition
		// moves the version); the safe reading is "over".
		n.releaseLost(p)
	}
}

// resolveEvict: the batch was [CAS -unit], expecting the unit's version.
// Another version: the unit is gone either way. Exact id: our bit says
// whether the unit is still counted (set: not executed, the eviction goes
// on). Coarse id: a count of zero holds no unit of ours (executed);
// otherwise it is unknowable, and the node takes the tenure, which clears
// every unit: the eviction queued at the head of the page's queue then
// releases the page to I.
func (n *Node) resolveEvict(p *page, w Word) {
	switch {
	case w.Version() != p.unitVer:
		p.unitCounted = false
	case isExact(n.cfg.ID):
		p.unitCounted = w.hasExactBit(n.cfg.ID)
	case w.Coarse() == 0:
		p.unitCounted = false
	default:
		p.unitCounted = false
		p.ph = phAcquire
		p.attempts = 0
		return
	}
	if !p.unitCounted {
		p.ph = phIdle
		n.finishEvict(p)
	}
}

// resolvePassTurn: the batch was [CAS reservation -> HomeTurn]. As
// passTurnDone judges a word: still reserved for us, it did not execute
// (try again); otherwise the turn is back with the home.
func (n *Node) resolvePassTurn(p *page, w Word) {
	if w.Reserved() == n.cfg.ID {
		return
	}
	p.granted = false
	p.ph = phIdle
}
