package coherence

import (
	"encoding/binary"
	"slices"

	"github.com/dsmkit/dsm/internal/ids"
)

// This file holds the client side of the transitions of one page: the
// read miss, the acquisition of a tenure, the release, the eviction and
// the hand-back of a reservation.

// ---- reading a slot ----

// slotVerbs reads page p's slot so that the copy can be dated: the word,
// the page, the word again. A READ is not atomic and does not read its
// bytes in address order (a memmove reads a copy's tail first, a NIC in
// any order), so a word read in the same READ as the page cannot date it;
// the words before and after it can (sameTenure). The verbs of a batch
// execute in order at the target. A batch whose first verb is an FAA or a
// CAS of the word uses that verb's old word as the word before.
func slotVerbs(p ids.PageNo) []Verb {
	return []Verb{
		{Kind: VerbRead, Page: p, Span: SpanWord},
		{Kind: VerbRead, Page: p, Span: SpanPage},
		{Kind: VerbRead, Page: p, Span: SpanWord},
	}
}

// slotRead takes apart the results of a batch that ends with a READ of
// the page and a READ of the word: the word before the page (the first
// verb's: a READ of the word, or an FAA's or CAS's old word), the page,
// and the word after it.
func slotRead(verbs []Verb, res []Result) (before Word, data []byte, after Word) {
	if verbs[0].Kind == VerbRead {
		before = Word(binary.LittleEndian.Uint64(res[0].Data))
	} else {
		before = Word(res[0].Word)
	}
	n := len(res)
	return before, res[n-2].Data, Word(binary.LittleEndian.Uint64(res[n-1].Data))
}

// sameTenure reports whether no tenure began or ended between two words of
// a slot: the same holder (or none) and the same version. A release writes
// the page only while its tenure holds the word, so a page read between
// two such words without a holder is the data of that version's release,
// whole.
func sameTenure(a, b Word) bool {
	return a.Holder() == b.Holder() && a.Version() == b.Version()
}

// ---- read miss ----

func (n *Node) startRead(p *page) {
	p.ph = phRead
	p.attempts = 0
	n.postRead(p)
}

func (n *Node) postRead(p *page) {
	p.invSeen = false
	p.readStale = false
	verbs := slotVerbs(p.no)
	if !p.unitCounted {
		verbs[0] = Verb{Kind: VerbFAA, Page: p.no, Span: SpanWord, Operand: unit(n.cfg.ID)}
	}
	p.inflight = n.post(p, false, verbs...)
}

// readDone judges a read miss's batch: a word before the page (the FAA's
// old word, or a READ of the word), the page, the word after it. A READ
// is not atomic and does not read its bytes in address order (a memmove
// reads a copy's tail first; a NIC in any order), so no word read with
// the page can date it; the two around it do: both without a holder and
// at one version means no tenure, hence no release, wrote the page while
// it was read (docs/protocol.md, "The home slot and the coherence word").
func (n *Node) readDone(p *page, verbs []Verb, res []Result) {
	before, data, w := slotRead(verbs, res)
	if verbs[0].Kind == VerbFAA {
		p.unitCounted = true
		p.unitVer = before.Version()
	}
	p.guess = w
	if w.Version() != p.unitVer || (p.invSeen && newer(p.invMax, p.unitVer)) {
		// An acquisition after our unit was added cleared it.
		p.unitCounted = false
	}
	whole := before.Holder() == ids.None && sameTenure(before, w)
	// The trust rule: no holder validates the data whatever the tag (the
	// unit rule and the version make the data current, not the tag), but
	// only from a READ that the node posted knowing every departure.
	if p.unitCounted && w.Holder() == ids.None && whole && !p.readStale {
		p.state = Shared
		p.data = slices.Clone(data)
		p.copyVer = p.unitVer
		p.noteEnded(p.copyVer)
		n.effect(PageInstallShared, p)
		p.attempts = 0
		if w.Reserved() == n.cfg.ID {
			p.granted = true // idle will hand the turn back
		}
		p.ph = phIdle
		return
	}
	p.attempts++
	if p.readStale {
		return // read again, in the new epoch, at once
	}
	if w.Holder() == ids.None && p.attempts < 4 {
		// Raced with an acquisition (add the unit again) or with the
		// end of a release (the page may be torn): read again at once.
		return
	}
	n.blocked(p, w, false)
}

// blocked handles an attempt that found the page held or reserved: recall
// a holder that is a member (whatever the word's tag), ask the home to
// repair a word that names a departed holder or reserver, reserve the page
// when starving, back off.
func (n *Node) blocked(p *page, w Word, write bool) {
	if h := w.Holder(); h != ids.None && h != n.cfg.ID && n.isMember(h) {
		n.send(MsgRecall, h, p.no, w.Version(), write)
	}
	if n.namesDeparted(w) {
		if p.home == n.cfg.ID {
			n.stamp(p.no)
		} else {
			n.send(MsgStamp, p.home, p.no, 0, false)
		}
	}
	if p.attempts >= n.cfg.StarveAttempts && w.Reserved() != n.cfg.ID {
		// Starving: queue for the reservation at the home (again on
		// every attempt: the home ignores duplicates).
		if p.home == n.cfg.ID {
			n.enqueue(p.no, n.cfg.ID)
		} else {
			n.send(MsgEnqueue, p.home, p.no, 0, false)
		}
	}
	n.backoff(p)
}

// ---- write miss / upgrade ----

func (n *Node) startAcquire(p *page) {
	p.ph = phAcquire
	p.attempts = 0
	n.postAcquire(p)
}

// acquirable reports whether this node may CAS itself in as the holder:
// no holder, and no reservation other than its own, whatever the tag (the
// CAS stamps the node's own tag).
func (n *Node) acquirable(w Word) bool {
	return w.Holder() == ids.None && (w.Reserved() == ids.None || w.Reserved() == n.cfg.ID)
}

func (n *Node) postAcquire(p *page) {
	g := p.guess
	if !n.acquirable(g) {
		p.expect = 0
		p.inflight = n.post(p, false, Verb{Kind: VerbRead, Page: p.no, Span: SpanWord})
		return
	}
	next := g.withHolder(n.cfg.ID).withVersion(g.Version() + 1).withoutSharers().withTag(n.tag())
	if g.Reserved() == n.cfg.ID {
		next = next.withResv(HomeTurn) // our turn is used: the home passes it on
	}
	p.expect = g
	cas := Verb{Kind: VerbCAS, Page: p.no, Span: SpanWord, Compare: uint64(g), Operand: uint64(next)}
	if p.state == Shared && p.copyVer == g.Version() {
		p.inflight = n.post(p, false, cas)
		return
	}
	p.inflight = n.post(p, false, cas, Verb{Kind: VerbRead, Page: p.no, Span: SpanPage})
}

func (n *Node) acquireDone(p *page, verbs []Verb, res []Result) {
	var w Word
	if verbs[0].Kind == VerbRead {
		w = Word(binary.LittleEndian.Uint64(res[0].Data))
	} else {
		w = Word(res[0].Word)
	}
	if verbs[0].Kind != VerbCAS || w != p.expect {
		p.guess = w
		if n.acquirable(w) {
			if verbs[0].Kind == VerbCAS {
				p.attempts++
			}
			if p.attempts < 8 {
				return // the word moved under us: try again at once
			}
			n.backoff(p)
			return
		}
		p.attempts++
		n.blocked(p, w, true)
		return
	}
	// The tenure is ours.
	var data []byte
	if len(res) == 2 {
		data = res[1].Data
	}
	n.acquired(p, w, Word(verbs[0].Operand), data)
}

// acquired starts tenure old.Version()+1, taken by a CAS that expected
// old; cur is the word as last seen, data the page as read with the CAS
// (nil when not read: it is read now unless the S copy is of old's
// version). Every sharer old records is invalidated.
func (n *Node) acquired(p *page, old, cur Word, data []byte) {
	if old.Reserved() == n.cfg.ID {
		p.granted = false // the CAS handed the turn back
	}
	p.acqVer = old.Version() + 1
	p.noteEnded(old.Version())
	p.guess = cur
	p.unitCounted = false
	switch {
	case data != nil:
		p.data = slices.Clone(data)
		p.needData = false
	case p.state == Shared && p.copyVer == old.Version():
		p.needData = false
	default:
		p.needData = true
	}
	p.awaiting = map[ids.NodeID]bool{}
	for _, m := range n.sharersOf(old) {
		p.awaiting[m] = true
	}
	p.ph = phWaitAcks
	p.attempts = 0
	p.invEvery = n.cfg.RetransmitTicks
	n.sendInvalidations(p)
}

// noteEnded records that tenure v of the page has ended (a copy of it
// was installed: only a released tenure is read; a later tenure was
// taken; a word showed it without a holder, or a later version), keeping
// the newest.
func (p *page) noteEnded(v uint16) {
	if !p.ended || newer(v, p.endedVer) {
		p.ended, p.endedVer = true, v
	}
}

// noteWords notes the tenures ended that the words in the results of a
// batch of the page's client side show: the old word returned by a CAS or
// FAA, the word at the head of a READ of the word or the slot. A word
// without a holder at version v shows tenure v over; one with a holder,
// tenure v-1 (a version moves only by an acquisition, which needs the
// word without a holder).
func (p *page) noteWords(verbs []Verb, res []Result) {
	for i, v := range verbs {
		var w Word
		switch {
		case v.Kind == VerbCAS || v.Kind == VerbFAA:
			w = Word(res[i].Word)
		case v.Kind == VerbRead && (v.Span == SpanWord || v.Span == SpanSlot):
			w = Word(binary.LittleEndian.Uint64(res[i].Data))
		default:
			continue
		}
		if w.Holder() == ids.None {
			p.noteEnded(w.Version())
		} else {
			p.noteEnded(w.Version() - 1)
		}
	}
}

// sharersOf lists the members the word may record as sharers, other than
// this node: the exact bits, and every member above ExactSharers when the
// coarse count is not zero.
func (n *Node) sharersOf(w Word) []ids.NodeID {
	var out []ids.NodeID
	for _, m := range n.members {
		if m == n.cfg.ID {
			continue
		}
		if isExact(m) && w.hasExactBit(m) || !isExact(m) && w.Coarse() > 0 {
			out = append(out, m)
		}
	}
	return out
}

// sendInvalidations sends the invalidation to every sharer still to
// acknowledge, all in one step.
func (n *Node) sendInvalidations(p *page) {
	p.invSent = n.now
	for _, m := range n.members {
		if p.awaiting[m] {
			n.send(MsgInvalidate, m, p.no, p.acqVer, false)
		}
	}
}

func (n *Node) grant(p *page) {
	p.state = Modified
	p.copyVer = p.acqVer
	p.awaiting = nil
	p.ph = phIdle
	n.effect(PageGrantExclusive, p)
}

// ---- release (recall, eviction of M) ----

func (n *Node) startRelease(p *page, write bool) {
	// Write-protect first: no store may land after the copy that is
	// written back. The tenure stays ours until the CAS releases it.
	p.wbData = p.data
	p.downgrade = false
	if write {
		// Going to I: unmap now, keep the bytes for the write-back.
		p.state = Invalid
		p.data = nil
		n.effect(PageDrop, p)
	} else {
		p.state = Shared
		n.effect(PageDowngrade, p)
	}
	p.relWrite = write
	p.wroteBack = false
	p.ph = phBackup
	p.bkAcked = map[ids.NodeID]bool{}
	n.postBackup(p)
}

// postBackup writes the stamp of the tenure being released, then its data,
// to the next backup of the page (in the current epoch) that does not hold
// them yet; when every backup does, the release goes on at the home. Stamp
// before data, in one batch: a batch that executes in part leaves the
// stamp beside the data of the tenure before, never this tenure's data
// beside the zero word of a slot never written, which a new home made of
// that backup would hand out as it is while the other backups hold the old
// copy; a stamp has the home refresh them first (docs/failover.md §7,
// "Data beside a word never written"). One backup at a time: no two
// batches of a page are in flight.
func (n *Node) postBackup(p *page) {
	if n.backupsFn != nil {
		for _, b := range n.backupsFn(p.no) {
			if b == p.home || p.bkAcked[b] || !n.isMember(b) {
				continue
			}
			p.inflight = n.postTo(p, b,
				Verb{Kind: VerbWrite, Page: p.no, Span: SpanWord, Data: binary.LittleEndian.AppendUint64(nil, uint64(Stamp(p.copyVer)))},
				Verb{Kind: VerbWrite, Page: p.no, Span: SpanPage, Data: slices.Clone(p.wbData)})
			return
		}
	}
	p.bkAcked = nil
	p.ph = phRelease
	n.postRelease(p)
}

// releasing reports whether the page is in a release, or in the
// resolution of a release batch of unknown outcome: either way the node
// may still hold the tenure, and wbData its only up-to-date data.
func (p *page) releasing() bool {
	return p.ph == phBackup || p.ph == phRelease || p.ph == phResolve && p.resolving == phRelease
}

// inRelease reports whether the node may hold the page's tenure without
// holding the page Modified: releasing, or frozen in a release (frozenM).
func (p *page) inRelease() bool { return p.releasing() || p.frozenM }

func (n *Node) releaseTarget(g Word, write bool) Word {
	next := g.withHolder(ids.None).withTag(n.tag())
	if !write {
		next += Word(unit(n.cfg.ID))
	}
	return next
}

func (n *Node) postRelease(p *page) {
	g := p.guess
	if g.Holder() != n.cfg.ID || g.Version() != p.copyVer {
		g = g.withHolder(n.cfg.ID).withVersion(p.copyVer)
	}
	p.expect = g
	cas := Verb{Kind: VerbCAS, Page: p.no, Span: SpanWord, Compare: uint64(g), Operand: uint64(n.releaseTarget(g, p.relWrite))}
	if p.wroteBack {
		p.inflight = n.post(p, false, cas)
		return
	}
	p.inflight = n.post(p, false, Verb{Kind: VerbWrite, Page: p.no, Span: SpanPage, Data: slices.Clone(p.wbData)}, cas)
}

func (n *Node) releaseDone(p *page, verbs []Verb, res []Result) {
	if len(verbs) == 2 {
		p.wroteBack = true
	}
	w := Word(res[len(res)-1].Word)
	if w == p.expect {
		n.released(p, n.releaseTarget(w, p.relWrite))
		return
	}
	p.guess = w
	if w.Holder() == NotHome {
		// Not the page's home any more (a move away from a live home
		// that this node has not learnt yet): the tenure is still
		// ours. Try again; the epoch brings the freeze, and the claim
		// goes to the new home.
		n.notHome(p)
		return
	}
	if w.Holder() != n.cfg.ID || w.Version() != p.copyVer {
		// The tenure was taken from us (we were declared gone): the
		// data reverts to the home copy.
		n.releaseLost(p)
	}
}

// notHome handles a word with the NotHome holder found where this node
// took the page's home to be: a slot left behind by a move (the old home
// stamped it) or a promoted backup's stamp not yet turned into a home
// word. The home is asked to repair it (a new home turns its stamp into a
// word; an old home ignores it) and the phase is tried again later: a
// node that lags behind a move learns the epoch, which freezes the page.
func (n *Node) notHome(p *page) {
	if p.home == n.cfg.ID {
		n.stamp(p.no)
	} else {
		n.send(MsgStamp, p.home, p.no, 0, false)
	}
	p.attempts++
	n.backoff(p)
}

// released ends a release whose CAS took effect; cur is the word as last
// seen. A release to S added our unit at the tenure's version.
func (n *Node) released(p *page, cur Word) {
	p.guess = cur
	p.recall = false
	p.ph = phIdle
	p.wbData = nil
	if !p.relWrite {
		p.unitCounted = true
		p.unitVer = p.copyVer
	}
	n.finishEvict(p)
}

// releaseLost ends a release that cannot tell whether the copy is still
// recorded: the tenure is over (taken from us, or released and followed by
// a newer one); the copy is dropped.
func (n *Node) releaseLost(p *page) {
	if p.state != Invalid {
		p.state = Invalid
		p.data = nil
		n.effect(PageDrop, p)
	}
	p.wbData = nil
	p.recall = false
	p.ph = phIdle
	n.finishEvict(p)
}

func (n *Node) finishEvict(p *page) {
	if len(p.queue) > 0 && p.queue[0].Op == OpEvict && p.state == Invalid {
		r := p.queue[0]
		p.queue = p.queue[1:]
		n.complete(Completion{ID: r.ID, Op: r.Op, Page: r.Page})
	}
}

// ---- eviction of S ----

func (n *Node) evictCASOK(p *page) bool {
	g := p.guess
	if g.Version() != p.unitVer {
		return false
	}
	if isExact(n.cfg.ID) {
		return g.hasExactBit(n.cfg.ID)
	}
	return g.Coarse() > 0
}

// evictTarget is g without this node's unit, stamped with its tag.
func (n *Node) evictTarget(g Word) Word { return (g - Word(unit(n.cfg.ID))).withTag(n.tag()) }

func (n *Node) postEvict(p *page) {
	if !p.unitCounted {
		p.ph = phIdle
		n.finishEvict(p)
		return
	}
	if !n.evictCASOK(p) {
		p.expect = 0
		p.inflight = n.post(p, false, Verb{Kind: VerbRead, Page: p.no, Span: SpanWord})
		return
	}
	g := p.guess
	p.expect = g
	p.inflight = n.post(p, false, Verb{Kind: VerbCAS, Page: p.no, Span: SpanWord, Compare: uint64(g), Operand: uint64(n.evictTarget(g))})
}

func (n *Node) evictDone(p *page, verbs []Verb, res []Result) {
	var w Word
	if verbs[0].Kind == VerbRead {
		w = Word(binary.LittleEndian.Uint64(res[0].Data))
	} else {
		w = Word(res[0].Word)
	}
	switch {
	case verbs[0].Kind == VerbCAS && w == p.expect:
		p.guess = n.evictTarget(w)
		p.unitCounted = false
	case w.Holder() == NotHome:
		// Not the page's home any more (see notHome): the copy goes
		// without its unit, which no home word counts now (a phantom
		// unit costs an invalidation at most).
		p.guess = w
		p.unitCounted = false
	default:
		p.guess = w
		if w.Version() != p.unitVer {
			p.unitCounted = false
		}
	}
	if !p.unitCounted {
		p.ph = phIdle
		n.finishEvict(p)
	}
}

// ---- reservation ----

// postPassTurn hands a reservation we hold back to the home.
func (n *Node) postPassTurn(p *page) {
	g := p.guess
	if g.Reserved() != n.cfg.ID {
		g = g.withResv(n.cfg.ID)
	}
	p.expect = g
	p.inflight = n.post(p, false, Verb{Kind: VerbCAS, Page: p.no, Span: SpanWord, Compare: uint64(g), Operand: uint64(g.withResv(HomeTurn).withTag(n.tag()))})
}

func (n *Node) passTurnDone(p *page, res []Result) {
	w := Word(res[0].Word)
	if w == p.expect {
		p.guess = w.withResv(HomeTurn).withTag(n.tag())
	} else {
		p.guess = w
		if w.Reserved() == n.cfg.ID {
			return // try again with the word as it is
		}
	}
	p.granted = false
	p.ph = phIdle
}
