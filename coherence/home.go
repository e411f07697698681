package coherence

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/dsmkit/dsm/internal/ids"
)

// This file holds reconfiguration and the home side of the protocol: the
// repair of the words after a departure, the reservation queue, the
// epoch synchronisation and the rebuild of the words after a home failure.

// homeOp is the kind of a home duty's batch in flight.
type homeOp uint8

const (
	hRepair  homeOp = 1 + iota // CAS of the word after a reconfiguration
	hPoll                      // READ of the word
	hPass                      // CAS passing the reservation to the next in line
	hRebuild                   // CAS writing the rebuilt word
)

// homeDuty is the home's side of one page it serves: the repair after a
// reconfiguration and the reservation queue.
type homeDuty struct {
	no       ids.PageNo
	guess    Word
	fresh    bool // guess was just read or written
	pending  bool // a repair is needed
	inflight uint64
	op       homeOp
	target   ids.NodeID // hPass: the node the reservation goes to
	// passUnsure: an hPass to this node had an unknown outcome; the
	// next word the duty learns says whether the reservation went out.
	passUnsure ids.NodeID
	retryAt    uint64
	pollAt     uint64

	// rebuilding: this node became the page's home after the old one
	// failed; it collects every member's report, then writes the word.
	rebuilding bool
	reports    map[ids.NodeID]Message
	queryAt    uint64
	rebuilt    Word // the word as rebuilt
	rebuiltVer uint16

	queue   []ids.NodeID // starving nodes, first come first served
	granted ids.NodeID   // holder of the reservation, None when none is out
	grantAt uint64       // tick of the last MsgGrant
}

// ---- reconfiguration ----

func (n *Node) stepReconfigure(rc Reconfigure) error {
	if rc.Epoch <= n.epoch {
		return fmt.Errorf("%w: reconfiguration to %v in %v", ErrStaleEpoch, rc.Epoch, n.epoch)
	}
	newMembers := sortedIDs(rc.Members)
	for _, m := range newMembers {
		if m == ids.None || m > MaxNodeID {
			return fmt.Errorf("%w: member id %d", ErrBadConfig, m)
		}
	}
	for no, h := range rc.Moved {
		if _, ok := slices.BinarySearch(newMembers, h); !ok {
			return fmt.Errorf("%w: %v moves to %v, not a member", ErrBadConfig, no, h)
		}
	}
	departed := false
	for _, m := range n.members {
		if _, ok := slices.BinarySearch(newMembers, m); !ok {
			departed = true
		}
	}
	n.epoch = rc.Epoch
	n.members = newMembers
	// Probes of the old epoch are answered no more (an answer would be
	// refused); their senders probe again in the new one.
	clear(n.ackOwed)
	if departed {
		// Acknowledgements count from this epoch on. Without a
		// departure, those of the epochs since the last one still do:
		// a member that acknowledged any of them has dropped what that
		// departure made untrustworthy (under a stream of epochs the
		// probe would otherwise start over at each and a repair wait
		// for a quiet spell).
		n.synced = false
		n.epochAcks = map[ids.NodeID]bool{n.cfg.ID: true}
		n.probing = false
	}
	reprobe := n.probing // probes of an earlier epoch, refused from now on
	for _, p := range n.order {
		if departed && p.state == Shared && p.ph != phWaitAcks {
			// A departed holder may have taken the tenure and died
			// before its invalidations arrived: no shared copy can be
			// trusted any more. The sharer unit stays as it is.
			//
			// That includes the copy of a downgrade (a release to S)
			// in flight: its CAS may have executed already, and a
			// departed node may have acquired the next tenure since
			// and died before its invalidation arrived. The release
			// goes on (wbData keeps the bytes to write back, and the
			// CAS still adds our unit), but the copy is not kept.
			p.state = Invalid
			p.data = nil
			n.effect(PageDrop, p)
		}
		if departed && p.ph == phRead && p.inflight != 0 {
			// The same holds for a read in flight: its READ may have
			// executed before a departed acquirer's CAS (the tag used
			// to reject it). Done again once it completes.
			p.readStale = true
		}
	}
	movedPages := make([]ids.PageNo, 0, len(rc.Moved))
	for no := range rc.Moved {
		movedPages = append(movedPages, no)
	}
	slices.Sort(movedPages)
	for _, no := range movedPages {
		home := rc.Moved[no]
		n.moved[no] = home
		p := n.page(no)
		p.home = home
		if home == n.cfg.ID && n.duty(no) == nil {
			n.addDuty(&homeDuty{no: no, guess: InitialWord(n.epoch),
				rebuilding: true, reports: map[ids.NodeID]Message{}})
		}
		n.freeze(p)
	}
	for _, p := range n.order {
		if p.ph == phWaitAcks {
			for m := range p.awaiting {
				if !n.isMember(m) {
					delete(p.awaiting, m)
				}
			}
			// Retransmit in the new epoch at once: acks of the old
			// epoch are refused from now on.
			n.sendInvalidations(p)
		}
		p.retryAt = n.now
		n.drive(p)
	}
	// An epoch with a departure repairs only once every member has it,
	// on every node, not only a node with duties: a duty created later
	// (MsgStamp, MsgEnqueue) must not repair before that either. A node
	// sends its probes when it has a duty (now or when one starts). An
	// epoch without a departure needs no probe and no repair: by the
	// trust rule a word is not judged by its tag, and the next CAS stamps
	// it. A probe under way asks again, in the new epoch, the members
	// that have not acknowledged.
	//
	// A joining node probes whether or not it has duties: its pages wait
	// for every member of its current epoch (docs/protocol.md, "Members
	// that join"). Members added by this epoch change nothing here: a
	// node that was a member before acts as before (its own id is a
	// member's in every epoch a member can be in).
	switch {
	case n.synced:
	case reprobe:
		n.probe()
	case len(n.homes) > 0 || n.joining:
		n.startProbe()
	}
	for _, h := range n.homes {
		h.queue = slices.DeleteFunc(h.queue, func(id ids.NodeID) bool { return !n.isMember(id) })
		if departed {
			h.pending = true
		}
		if h.rebuilding {
			for id := range h.reports {
				if !n.isMember(id) {
					delete(h.reports, id)
				}
			}
			n.query(h)
		}
		n.driveHome(h)
	}
	return nil
}

// repaired is w in the current epoch without what non-members left in
// it: a departed holder's tenure ends (its unsynced data reverts to the
// home copy), a departed reservation lapses, departed exact sharers are
// removed. The member list is the authority, not a record of departures
// seen: a word may name a node that departed before this node joined.
// Coarse units of departed nodes stay counted until the next acquisition
// clears them; an extra unit only costs an extra invalidation.
func (n *Node) repaired(w Word) Word {
	if h := w.Holder(); h != ids.None && !n.isMember(h) {
		w = w.withHolder(ids.None)
	}
	if r := w.Reserved(); r != ids.None && r != HomeTurn && !n.isMember(r) {
		w = w.withResv(ids.None)
	}
	for id := ids.NodeID(1); id <= ExactSharers; id++ {
		if w.hasExactBit(id) && !n.isMember(id) {
			w -= Word(unit(id))
		}
	}
	return w.withTag(n.tag())
}

// namesDeparted reports whether w names a holder or a reserver that is not
// a member: only the page's home may repair it (MsgStamp), after every
// member has the epoch. Departed sharer bits need no repair (sharersOf
// lists members only).
func (n *Node) namesDeparted(w Word) bool {
	if h := w.Holder(); h != ids.None && !n.isMember(h) {
		return true
	}
	r := w.Reserved()
	return r != ids.None && r != HomeTurn && !n.isMember(r)
}

func (n *Node) duty(no ids.PageNo) *homeDuty { return n.homeIdx[no] }

func (n *Node) addDuty(h *homeDuty) {
	n.homes = append(n.homes, h)
	n.homeIdx[h.no] = h
	n.startProbe()
}

// lazyDuty returns the duty of page no, starting it if this node is the
// page's home and HomedPages left the page out. The guess is only a guess
// (the word is read, or a CAS fails, before it is trusted).
func (n *Node) lazyDuty(no ids.PageNo) *homeDuty {
	h := n.duty(no)
	if h == nil && n.homeOf(no) == n.cfg.ID {
		h = &homeDuty{no: no, guess: InitialWord(n.epoch)}
		n.addDuty(h)
	}
	return h
}

// stamp marks page no's word for repair (at its home): a node found it
// naming a departed holder or reserver. The repair waits until every
// member has the epoch (synced), as after a reconfiguration.
func (n *Node) stamp(no ids.PageNo) {
	h := n.lazyDuty(no)
	if h == nil || h.pending || h.rebuilding {
		return
	}
	h.pending = true
	n.driveHome(h)
}

// enqueue queues node id for the reservation of page no (at its home).
func (n *Node) enqueue(no ids.PageNo, id ids.NodeID) {
	h := n.lazyDuty(no)
	if h == nil || id == h.granted || slices.Contains(h.queue, id) || !n.isMember(id) {
		return
	}
	h.queue = append(h.queue, id)
	n.driveHome(h)
}

func (n *Node) postHome(h *homeDuty, op homeOp, v Verb) {
	n.nextID++
	id := n.nextID
	n.batches[id] = batchRec{page: h.no, home: true, verbs: []Verb{v}, to: n.cfg.ID, epoch: n.epoch}
	n.rd.Batches = append(n.rd.Batches, Batch{ID: id, Home: n.cfg.ID, Verbs: []Verb{v}})
	h.inflight, h.op = id, op
}

func (n *Node) homeCAS(h *homeDuty, op homeOp, next Word) {
	n.postHome(h, op, Verb{Kind: VerbCAS, Page: h.no, Span: SpanWord, Compare: uint64(h.guess), Operand: uint64(next)})
}

// driveHome makes every step the home side of a page can make now: repair
// the word, pass the reservation on when its holder handed it back, poll
// the word while a reservation is out or nodes are queued.
func (n *Node) driveHome(h *homeDuty) {
	for h.inflight == 0 && n.now >= h.retryAt {
		if h.rebuilding {
			for _, m := range n.members {
				if _, ok := h.reports[m]; !ok {
					return
				}
			}
			n.homeCAS(h, hRebuild, n.rebuiltWord(h))
			return
		}
		if h.pending {
			if !n.synced {
				return // every member must be in the new epoch first
			}
			n.homeCAS(h, hRepair, n.repaired(h.guess))
			return
		}
		if h.granted == ids.None && len(h.queue) == 0 && h.passUnsure == ids.None {
			return
		}
		if !h.fresh {
			if n.now < h.pollAt {
				return
			}
			h.pollAt = n.now + 1
			n.postHome(h, hPoll, Verb{Kind: VerbRead, Page: h.no, Span: SpanWord})
			return
		}
		h.fresh = false
		w := h.guess
		if n.namesDeparted(w) {
			// A word of another tag needs nothing (the trust rule; the
			// CAS that passes the reservation stamps it), one that names
			// a departed holder or reserver a repair.
			h.pending = true
			continue
		}
		switch r := w.Reserved(); {
		case r == HomeTurn || r == ids.None:
			// The turn is back (or lapsed with a departed reserver):
			// the next in line gets it.
			next := ids.None
			for len(h.queue) > 0 && next == ids.None {
				if n.isMember(h.queue[0]) {
					next = h.queue[0]
				}
				h.queue = h.queue[1:]
			}
			if r == ids.None && next == ids.None {
				h.granted = ids.None
				return
			}
			h.target = next
			n.homeCAS(h, hPass, w.withResv(next).withTag(n.tag()))
			return
		case r == h.granted:
			if n.now-h.grantAt >= uint64(2*n.cfg.RetransmitTicks) {
				n.sendGrant(h)
			}
			return
		default:
			h.granted = r
		}
	}
}

// sendGrant tells the reserver that the page is reserved for it.
func (n *Node) sendGrant(h *homeDuty) {
	h.grantAt = n.now
	if h.granted == n.cfg.ID {
		n.granted(n.page(h.no))
		return
	}
	n.send(MsgGrant, h.granted, h.no, 0, false)
}

func (n *Node) homeDone(rec batchRec, d VerbsDone) {
	h := n.duty(rec.page)
	if h == nil {
		return
	}
	h.inflight = 0
	op := h.op
	if d.Err != nil || !resultsFit(rec.verbs, d.Results, n.cfg.PageSize) {
		// A batch of unknown outcome needs no READ of its own here:
		// hPoll is a READ; hRepair and hRebuild are posted again as
		// they were, and a CAS posted again is idempotent: it finds
		// its compare value (the first did not execute: nothing acted
		// on the word since, or the word came back to that value, and
		// the new value is again the right one, a function of the
		// compare value and of what the home knows) or it fails and
		// returns the word, which the duty then judges as a READ. Only
		// hPass is settled by the next word the duty learns: its
		// target is queued again at the head if the reservation did not
		// go out, and granted if it did (a blind retry would give it a
		// second turn later).
		if op == hPass && h.target != ids.None {
			if d.Unknown {
				h.passUnsure = h.target
			} else {
				h.queue = append([]ids.NodeID{h.target}, h.queue...)
			}
		}
		h.retryAt = n.now + 1
		return
	}
	var w Word
	if op == hPoll {
		w = Word(binary.LittleEndian.Uint64(d.Results[0].Data))
	} else {
		w = Word(d.Results[0].Word)
	}
	ok := op != hPoll && w == Word(rec.verbs[0].Compare)
	if ok {
		w = Word(rec.verbs[0].Operand)
	}
	h.guess, h.fresh = w, true
	if t := h.passUnsure; t != ids.None && op != hPass {
		// w is the word now: only the home reserves a page for t.
		h.passUnsure = ids.None
		if w.Reserved() == t {
			h.granted = t
			n.sendGrant(h)
		} else {
			h.queue = append([]ids.NodeID{t}, h.queue...)
		}
	}
	switch op {
	case hRebuild:
		if ok && h.rebuilding {
			h.rebuilding = false
			// Rebuilt for the epoch it was computed in: a departure
			// learnt while the CAS was in flight still needs a repair.
			h.pending = h.guess != n.repaired(h.guess)
			h.rebuilt = w
			h.rebuiltVer = w.Version()
			for _, m := range n.members {
				n.sendRebuilt(h, m)
			}
		}
	case hRepair:
		if ok {
			h.pending = h.guess != n.repaired(h.guess)
		}
	case hPass:
		if !ok {
			if h.target != ids.None {
				h.queue = append([]ids.NodeID{h.target}, h.queue...)
			}
			break
		}
		h.granted = h.target
		if h.granted != ids.None {
			n.sendGrant(h)
		}
	}
	n.driveHome(h)
}

// granted notes that the home reserved page p for this node.
func (n *Node) granted(p *page) {
	p.granted = true
	if p.inflight == 0 {
		p.retryAt = n.now // retry at once
	}
	n.drive(p)
}

// ---- epoch synchronisation ----

// startProbe starts asking the members whether they are in the epoch,
// unless every member has acknowledged it or the probes are out already.
func (n *Node) startProbe() {
	if n.synced || n.probing {
		return
	}
	n.probing = true
	n.probe()
	n.epochAck(n.cfg.ID) // a cluster of one is synced at once
}

// probe asks every member that has not acknowledged the epoch yet.
func (n *Node) probe() {
	n.probeAt = n.now
	for _, m := range n.members {
		if !n.epochAcks[m] {
			n.send(MsgEpoch, m, 0, 0, false)
		}
	}
}

func (n *Node) epochAck(from ids.NodeID) {
	if n.synced {
		return
	}
	n.epochAcks[from] = true
	for _, m := range n.members {
		if !n.epochAcks[m] {
			return
		}
	}
	n.synced = true
	n.probing = false
	if n.joining {
		// Every member is in this epoch or a later one (members never
		// go back), and this node is a member until it departs: from
		// now on no member takes its id for a departed node's.
		n.joining = false
		for _, p := range n.order {
			n.drive(p)
		}
	}
	for _, h := range n.homes {
		n.driveHome(h)
	}
}

// epochAckDue answers member to's MsgEpoch, which this node owes, once no
// batch it posted to that member in an older epoch is unfinished. The
// acknowledgement is a fence for earlier verbs: the member repairs or
// rebuilds its words once every member acknowledged, and a verb of the old
// epoch still in flight would land after that (a batch replayed after a
// reconnection can follow a message sent on the new connection). A batch
// is finished when its VerbsDone arrived: done, failed, or of unknown
// outcome (which never executes later).
func (n *Node) epochAckDue(to ids.NodeID) {
	for _, rec := range n.batches {
		if rec.to == to && rec.epoch < n.epoch {
			return
		}
	}
	delete(n.ackOwed, to)
	n.send(MsgEpochAck, to, 0, 0, false)
}

// ---- home failover ----

// freeze stops every transition of a page whose home moved, settles it in
// a stable state (an unfinished release keeps the tenure and its data, an
// unfinished acquisition is abandoned) and reports it to the new home.
func (n *Node) freeze(p *page) {
	if p.releasing() {
		// Did the release take effect at the old home? Only the new
		// home can tell, from everyone's reports: claim the tenure,
		// keep the data, map nothing writable meanwhile. (So also for
		// a release whose batch had an unknown outcome.)
		p.frozenM = true
	}
	switch p.ph {
	case phWaitAcks:
		if p.state == Invalid {
			p.data = nil
		}
	}
	if !p.frozenM {
		p.wbData = nil
	}
	p.awaiting = nil
	p.needData = false
	p.ph = phIdle
	p.resolving, p.unknown = phIdle, nil
	// A tenure taken to settle a coarse unit is not needed any more: the
	// new home's word counts no unit the reports do not show.
	p.downgrade = false
	p.inflight = 0
	p.unitCounted = false
	p.granted = false
	p.recall = false
	p.retryAt = n.now
	p.frozen = true
	n.report(p)
}

func (n *Node) report(p *page) {
	p.reportAt = n.now
	m := Message{Type: MsgReport, From: n.cfg.ID, To: p.home, Epoch: n.epoch, Page: p.no, State: p.state}
	if p.frozenM {
		m.State = Modified
	}
	switch {
	case m.State != Invalid:
		m.Version = p.copyVer
	case p.ended:
		// Evidence for the rebuild: a release claimed at this
		// version or an older one had taken effect.
		m.Ended, m.Version = true, p.endedVer
	}
	if p.home == n.cfg.ID {
		n.gotReport(m)
		return
	}
	n.rd.Messages = append(n.rd.Messages, m)
}

// query asks every member that has not reported yet.
func (n *Node) query(h *homeDuty) {
	h.queryAt = n.now
	for _, m := range n.members {
		if _, ok := h.reports[m]; !ok && m != n.cfg.ID {
			n.send(MsgQuery, m, h.no, 0, false)
		}
	}
}

func (n *Node) gotReport(m Message) {
	h := n.duty(m.Page)
	if h == nil {
		return
	}
	if !h.rebuilding {
		if h.inflight == 0 || h.op != hRebuild {
			n.sendRebuilt(h, m.From) // a reporter that missed the news
		}
		return
	}
	h.reports[m.From] = m
	n.driveHome(h)
}

// rebuiltWord is the word the reports describe. The M reporter of the
// newest tenure is the holder, unless another reporter holds a copy of
// that tenure or a newer one, or knows that it ended (an Invalid report
// with Ended: since the last rebuild it held a copy of that tenure, took
// a later one, or read a word that showed it over). Then the tenure had
// been released (its write-back, or a later one, is in the backup copy):
// only the completion of the release was lost with the old home, or the
// release's outcome was unknown and not yet resolved, and other tenures
// may have followed it. Otherwise the S reporters of the newest version
// are the sharers. The word's version is the newest any report shows.
func (n *Node) rebuiltWord(h *homeDuty) Word {
	w := InitialWord(n.epoch)
	var holder ids.NodeID
	var mVer, sVer, hVer uint16
	sFound, hFound := false, false
	for _, m := range n.members {
		r, ok := h.reports[m]
		switch {
		case !ok:
		case r.State == Modified && (holder == ids.None || newer(r.Version, mVer)):
			holder, mVer = m, r.Version
		case r.State == Shared && (!sFound || newer(r.Version, sVer)):
			sVer, sFound = r.Version, true
		case r.State == Invalid && r.Ended && (!hFound || newer(r.Version, hVer)):
			hVer, hFound = r.Version, true
		}
	}
	if holder != ids.None && (!sFound || newer(mVer, sVer)) && (!hFound || newer(mVer, hVer)) {
		return w.withHolder(holder).withVersion(mVer)
	}
	ver := mVer
	if sFound && (holder == ids.None || !newer(mVer, sVer)) {
		ver = sVer
	}
	if hFound && (holder == ids.None && !sFound || newer(hVer, ver)) {
		ver = hVer
	}
	w = w.withVersion(ver)
	if !sFound || sVer != ver {
		return w
	}
	for _, m := range n.members {
		if r, ok := h.reports[m]; ok && r.State == Shared && r.Version == sVer {
			w += Word(unit(m))
		}
	}
	return w
}

func (n *Node) sendRebuilt(h *homeDuty, to ids.NodeID) {
	counted := h.rebuilt.Holder() == ids.None && h.rebuilt.Version() == h.rebuiltVer &&
		(isExact(to) && h.rebuilt.hasExactBit(to) || !isExact(to) && h.reports[to].State == Shared && h.reports[to].Version == h.rebuiltVer)
	holder := h.rebuilt.Holder() == to
	if to == n.cfg.ID {
		n.unfreeze(n.page(h.no), h.rebuiltVer, counted, holder)
		return
	}
	m := Message{Type: MsgRebuilt, From: n.cfg.ID, To: to, Epoch: n.epoch, Page: h.no, Version: h.rebuiltVer}
	switch {
	case counted:
		m.State = Shared
	case holder:
		m.State = Modified
	}
	n.rd.Messages = append(n.rd.Messages, m)
}

// unfreeze ends the rebuild of page p's word at version ver; counted says
// whether the word records this node's sharer unit, holder whether it
// names this node as the exclusive holder.
func (n *Node) unfreeze(p *page, ver uint16, counted, holder bool) {
	if !p.frozen {
		return
	}
	p.frozen = false
	p.unitCounted, p.unitVer = counted, ver
	// Versions start again from the rebuilt word's, which is at least
	// every version reported: what ended before counts no more.
	p.ended = false
	if p.frozenM {
		// An interrupted release: the tenure is ours again, or it had
		// ended and the copy cannot stay.
		p.frozenM = false
		if holder {
			p.state = Modified
			p.data = p.wbData
			n.effect(PageGrantExclusive, p)
		} else if p.state != Invalid {
			p.state = Invalid
			p.data = nil
			n.effect(PageDrop, p)
		}
		p.wbData = nil
	}
	if p.state == Modified && !holder {
		// Our release had taken effect; only its completion was lost.
		p.state = Invalid
		p.data = nil
		n.effect(PageDrop, p)
	}
	if p.state == Shared && (!counted || p.copyVer != ver) {
		// Not recorded in the rebuilt word: the copy cannot stay.
		p.state = Invalid
		p.data = nil
		n.effect(PageDrop, p)
	}
	if p.state == Shared {
		p.noteEnded(p.copyVer)
	}
	p.guess = InitialWord(n.epoch).withVersion(ver)
	n.drive(p)
}
