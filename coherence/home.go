package coherence

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"

	"github.com/dsmkit/dsm/internal/ids"
)

// This file holds reconfiguration and the home side of the protocol: the
// repair of the words after a departure, the reservation queue, the
// epoch synchronisation and the rebuild of the words after a home failure.

// homeOp is the kind of a home duty's batch in flight.
type homeOp uint8

const (
	hRepair    homeOp = 1 + iota // CAS of the word after a reconfiguration
	hPoll                        // READ of the word
	hPass                        // CAS passing the reservation to the next in line
	hRebuild                     // CAS writing the rebuilt word
	hBkRead                      // READ of the home copy, to refresh the backups
	hBkWrite                     // WRITE of the home copy and its stamp to a backup
	hFillRead                    // READs of the slot (slotVerbs), for a fill (fill.go)
	hFillResv                    // CAS reserving the page for the home, for a fill
	hFillWrite                   // WRITE of the home copy and its stamp to a backup being filled
)

func (o homeOp) String() string {
	switch o {
	case 0:
		return "none"
	case hRepair:
		return "repair"
	case hPoll:
		return "poll"
	case hPass:
		return "pass"
	case hRebuild:
		return "rebuild"
	case hBkRead:
		return "backup-read"
	case hBkWrite:
		return "backup-write"
	case hFillRead:
		return "fill-read"
	case hFillResv:
		return "fill-reserve"
	case hFillWrite:
		return "fill-write"
	}
	return fmt.Sprintf("homeOp(%d)", uint8(o))
}

// homeDuty is the home's side of one page it serves: the repair after a
// reconfiguration and the reservation queue.
type homeDuty struct {
	no       ids.PageNo
	seq      uint64 // creation order (Node.activeHomes)
	active   bool   // in Node.activeHomes
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
	// departed; it collects every member's reports, then writes the word.
	// reports are those of the current epoch; used those the rebuilt
	// word was computed from. known: guess was read from the slot (or
	// returned by a CAS), not assumed.
	rebuilding bool
	reports    map[ids.NodeID]Message
	used       map[ids.NodeID]Message
	known      bool
	rebuilt    Word // the word as rebuilt
	rebuiltVer uint16

	// Before it repairs a word whose holder departed, the home writes its
	// copy (bkData) and the stamp of the departed tenure to every backup
	// (bkAcked): that tenure's release may have written its data to some
	// backups before the holder died, and the repair makes the home copy
	// the page's data for everyone from then on (docs/failover.md §7).
	// bkFor is the word the refresh is for.
	bkFor   Word
	bkData  []byte
	bkAcked map[ids.NodeID]bool

	queue   []ids.NodeID // starving nodes, first come first served
	granted ids.NodeID   // holder of the reservation, None when none is out
	grantAt uint64       // tick of the last MsgGrant

	// Fills of backups that entered the page's backup set (fill.go):
	// fills in order, the first one under way. fillHeld: the home holds
	// the page's turn (HomeTurn) for them; the reservation queue passes it
	// on once no fill needs it. fillData is the home copy read before the
	// word the duty last learnt by READs of the slot (nil when that word
	// came from elsewhere, or the copy may be torn: a release ended while
	// it was read); fillRecallAt the tick of the next recall of a
	// holder. readPosted numbers the READ of the slot in flight (from
	// Node.slotReads), fillSeq the one fillData came from: a Persist uses
	// only a copy read after it came.
	fills        []*fillOp
	fillHeld     bool
	fillData     []byte
	fillRecallAt uint64
	readPosted   uint64
	fillSeq      uint64
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
	if rc.HomeOf != nil {
		// Checked on the pages this node knows: a page moves to a
		// member that is a target, away from a home that departed or
		// from a live one (a promotion, a drain: the old home is
		// demoted, docs/protocol.md "Moves from live homes"); or it is
		// lost (its home is no member: no copy of its slot is left).
		for _, t := range rc.Targets {
			if _, ok := slices.BinarySearch(newMembers, t); !ok {
				return fmt.Errorf("%w: target %v is not a member", ErrBadConfig, t)
			}
		}
		for _, p := range n.order {
			h := rc.HomeOf(p.no)
			if _, ok := slices.BinarySearch(newMembers, h); !ok {
				continue // lost
			}
			if old := n.homeFn(p.no); old != h && !slices.Contains(rc.Targets, h) {
				return fmt.Errorf("%w: %v moves to %v, not a target", ErrBadConfig, p.no, h)
			}
		}
	} else if len(rc.Targets) > 0 {
		return fmt.Errorf("%w: targets without a placement", ErrBadConfig)
	}
	departed := false
	for _, m := range n.members {
		if _, ok := slices.BinarySearch(newMembers, m); !ok {
			departed = true
		}
	}
	n.epoch = rc.Epoch
	n.members = newMembers
	if rc.ClearPending {
		n.clearNeed = rc.Epoch
		n.clearProbeAt = 0
	}
	// Probes of the old epoch are answered no more (an answer would be
	// refused); their senders probe again in the new one.
	clear(n.ackOwed)
	clear(n.clearTold)
	if departed || rc.HomeOf != nil && slices.Contains(rc.Targets, n.cfg.ID) {
		// Acknowledgements count from this epoch on. Without a
		// departure, those of the epochs since the last one still do:
		// a member that acknowledged any of them has dropped what that
		// departure made untrustworthy (under a stream of epochs the
		// probe would otherwise start over at each and a repair wait
		// for a quiet spell). A new home of moved pages needs this
		// epoch's: each is a fence for the batches its member posted
		// to this node before it (a backup write of the old epoch must
		// not land on a rebuilt slot), with or without a departure.
		n.synced = false
		n.epochAcks = map[ids.NodeID]bool{}
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
	// Moves: reports and counts are those of the current epoch. Every
	// node reports again every page it keeps frozen, and every new home
	// counts again (a departure dropped Shared copies since: the reports
	// change).
	for id := range n.owed {
		if !n.isMember(id) {
			delete(n.owed, id)
		}
	}
	clear(n.sent)
	clear(n.counts)
	clear(n.reportsIn)
	clear(n.queryAt)
	for _, h := range n.homes {
		clear(h.reports)
	}
	if rc.Backups != nil {
		n.backupsFn = rc.Backups
	}
	if rc.HomeOf != nil {
		prev := n.homeFn
		n.homeFn = rc.HomeOf
		n.hist = append(n.hist, rc.HomeOf)
		if slices.Contains(rc.Targets, n.cfg.ID) {
			n.target = true
			if rc.SlotsPending {
				n.slotsNeed = rc.Epoch
			}
		}
		for _, m := range rc.Targets {
			n.owed[m] = true
		}
		for _, p := range n.order {
			h := rc.HomeOf(p.no)
			switch {
			case !n.isMember(h):
				n.lose(p, h)
			case h != prev(p.no):
				p.home = h
				n.freeze(p)
			}
		}
		n.demote()
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
		n.pruneFills(h)
		n.driveHome(h)
	}
	n.reportMoves()
	n.checkMoveDone()
	return nil
}

// demote drops the duties of the pages this node is the home of no more:
// their home moved away while this node stays a member (a promotion of a
// filled backup, a drain). The new home rebuilds each word from the
// members' reports, as for a home that departed; nothing of the duty goes
// with it. A starving node queued here, or granted the reservation, asks
// the new home again once its page is rebuilt (its copy was frozen and
// reported like every other); a fill under way is given up (the node
// layer asks the new home). A batch of the duty still in flight completes
// without a duty and is ignored. The node layer turns the words of the
// slots left behind into stamps (docs/protocol.md, "Moves from live
// homes"): a lagging member's verb that reaches one then finds NotHome.
func (n *Node) demote() {
	kept := n.homes[:0]
	for _, h := range n.homes {
		if n.homeFn(h.no) == n.cfg.ID {
			kept = append(kept, h)
			continue
		}
		for _, f := range h.fills {
			n.copyAbandoned(h.no, f.to, fmt.Sprintf("%v is not the home of %v in %v", n.cfg.ID, h.no, n.epoch))
		}
		if h.inflight != 0 {
			n.dutyAbandoned[h.no]++
		}
		delete(n.homeIdx, h.no)
	}
	clear(n.homes[len(kept):])
	n.homes = kept
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
	n.seq++
	h.seq = n.seq
	n.wakeHome(h)
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

func (n *Node) postHome(h *homeDuty, op homeOp, v Verb) { n.postHomeVerbs(h, op, v) }

// postHomeVerbs posts a batch of h's to this node's own slot.
func (n *Node) postHomeVerbs(h *homeDuty, op homeOp, verbs ...Verb) {
	n.nextID++
	id := n.nextID
	n.batches[id] = batchRec{page: h.no, home: true, verbs: verbs, to: n.cfg.ID, epoch: n.epoch}
	n.rd.Batches = append(n.rd.Batches, Batch{ID: id, Home: n.cfg.ID, Verbs: verbs})
	h.inflight, h.op = id, op
	if op == hFillRead || op == hFillResv {
		n.slotReads++
		h.readPosted = n.slotReads
	}
}

func (n *Node) homeCAS(h *homeDuty, op homeOp, next Word) {
	n.postHome(h, op, Verb{Kind: VerbCAS, Page: h.no, Span: SpanWord, Compare: uint64(h.guess), Operand: uint64(next)})
}

// driveHome makes every step the home side of a page can make now: repair
// the word, pass the reservation on when its holder handed it back, poll
// the word while a reservation is out or nodes are queued.
func (n *Node) driveHome(h *homeDuty) {
	n.wakeHome(h)
	for h.inflight == 0 && n.dutyAbandoned[h.no] == 0 && n.now >= h.retryAt {
		if h.rebuilding {
			if !n.movesReported() || !n.synced {
				// Every member's reports first, and every member in
				// the epoch: its acknowledgement waits for the batches
				// it posted before, a backup write to this slot among
				// them (docs/failover.md §8).
				return
			}
			if !h.known && n.backupsFn != nil {
				// The slot's word first: the refresh below depends on
				// it (a CAS that expects a guess could succeed on a zero
				// word without one).
				n.postHome(h, hPoll, Verb{Kind: VerbRead, Page: h.no, Span: SpanWord})
				return
			}
			h.used = maps.Clone(h.reports)
			next := n.rebuiltWord(h)
			if next.Holder() == ids.None && n.refreshBackups(h) {
				// The slot's data becomes the page's for everyone:
				// the other backups get it first (the stamp says
				// which tenure; a releaser that died may have
				// written its data to some of them).
				return
			}
			n.homeCAS(h, hRebuild, next)
			return
		}
		if h.pending {
			if !n.synced {
				return // every member must be in the new epoch first
			}
			if n.refreshBackups(h) {
				return
			}
			n.homeCAS(h, hRepair, n.repaired(h.guess))
			return
		}
		if n.driveFill(h) {
			return
		}
		if h.granted == ids.None && len(h.queue) == 0 && h.passUnsure == ids.None && !h.fillHeld {
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
				h.fillHeld = false
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

// refreshBackups posts the next step of the refresh of the backups that
// must precede the repair of h's word, if one is needed; it reports whether
// it posted. Needed when the word (as guessed: a CAS succeeds only on the
// word it expects) names a departed holder: its tenure ends without a
// release, and the home copy becomes the data, but the holder may have
// written its data and stamp to some backups before it died. While the
// word names the holder nobody acquires the page or validates a read of
// it, so nothing else writes the backups meanwhile.
func (n *Node) refreshBackups(h *homeDuty) bool {
	w := h.guess
	if n.backupsFn == nil || h.rebuilding && !h.known {
		return false
	}
	// A rebuild whose word names no holder hands out the slot's data
	// whatever the slot's word: a backup slot that a release wrote only in
	// part (its data, not its stamp: a batch of unknown outcome) still has
	// the zero word of a slot never written (fill-crash seed 8287).
	departed := w.Holder() != ids.None && !n.isMember(w.Holder())
	if !departed && !(h.rebuilding && w.Holder() == ids.None) {
		return false
	}
	key := Word(0).withHolder(w.Holder()).withVersion(w.Version())
	if h.bkFor != key || h.bkAcked == nil {
		h.bkFor, h.bkData, h.bkAcked = key, nil, map[ids.NodeID]bool{}
	}
	for _, b := range n.backupsFn(h.no) {
		if b == n.cfg.ID || h.bkAcked[b] || !n.isMember(b) {
			continue
		}
		if h.bkData == nil {
			// The word and the copy in one READ: the guess may be
			// stale (a word that named the holder may have been
			// released since), and the copy must be the one beside
			// the word that names it.
			n.postHomeVerbs(h, hBkRead, slotVerbs(h.no)...)
			return true
		}
		n.nextID++
		id := n.nextID
		// The stamp first, as a release writes it (postBackup).
		verbs := []Verb{
			{Kind: VerbWrite, Page: h.no, Span: SpanWord, Data: binary.LittleEndian.AppendUint64(nil, uint64(Stamp(w.Version())))},
			{Kind: VerbWrite, Page: h.no, Span: SpanPage, Data: slices.Clone(h.bkData), HomeCopy: true},
		}
		n.batches[id] = batchRec{page: h.no, home: true, verbs: verbs, to: b, epoch: n.epoch}
		n.rd.Batches = append(n.rd.Batches, Batch{ID: id, Home: b, Verbs: verbs})
		h.inflight, h.op = id, hBkWrite
		return true
	}
	return false
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
	if h == nil || h.inflight != d.ID {
		// A batch of a duty that demote dropped.
		if n.dutyAbandoned[rec.page]--; n.dutyAbandoned[rec.page] <= 0 {
			delete(n.dutyAbandoned, rec.page)
		}
		if h != nil {
			n.driveHome(h)
		}
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
	switch op {
	case hBkRead:
		before, data, w := slotRead(rec.verbs, d.Results)
		if w.withoutSharers().withTag(0).withResv(ids.None) != h.bkFor || !sameTenure(before, w) {
			// Not the word the refresh is for, or a word that moved
			// while the copy was read: judge the word now.
			h.guess, h.fresh, h.known = w, true, true
			h.bkFor = 0
		} else {
			h.bkData = slices.Clone(data)
		}
		n.driveHome(h)
		return
	case hBkWrite:
		h.bkAcked[rec.to] = true
		n.driveHome(h)
		return
	case hFillWrite:
		n.fillWritten(h, rec.to)
		n.driveHome(h)
		return
	}
	var w Word
	read := rec.verbs[0].Kind == VerbRead
	if read {
		w = Word(binary.LittleEndian.Uint64(d.Results[0].Data))
	} else {
		w = Word(d.Results[0].Word)
	}
	ok := !read && w == Word(rec.verbs[0].Compare)
	if ok {
		w = Word(rec.verbs[0].Operand)
	}
	h.fillData = nil
	if op == hFillRead || op == hFillResv {
		// The page and the word after it (for hFillResv, the word as it
		// is once the turn is, or is not, taken). A copy read while a
		// release ended may be torn: it is read again (driveFill) unless
		// the word shows a holder, which the fill recalls first anyway.
		before, data, after := slotRead(rec.verbs, d.Results)
		w = after
		if sameTenure(before, after) || after.Holder() != ids.None {
			h.fillData = slices.Clone(data)
		}
		h.fillSeq = h.readPosted
	}
	h.guess, h.fresh, h.known = w, true, true
	if t := h.passUnsure; t != ids.None && op != hPass {
		// w is the word now: only the home reserves a page for t.
		h.passUnsure = ids.None
		if w.Reserved() == t {
			h.granted = t
			h.fillHeld = false
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
			// The reporters learn it page by page; the others need
			// nothing but MsgMoveDone.
			for _, m := range n.members {
				_, a := h.used[m]
				_, b := h.reports[m]
				if a || b {
					n.sendRebuilt(h, m)
				}
			}
			n.checkMoveDone()
		}
	case hRepair:
		if ok {
			h.pending = h.guess != n.repaired(h.guess)
		}
	case hFillResv:
		if ok {
			h.fillHeld = true
		}
	case hPass:
		if !ok {
			if h.target != ids.None {
				h.queue = append([]ids.NodeID{h.target}, h.queue...)
			}
			break
		}
		h.granted = h.target
		h.fillHeld = false
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
}

// probe asks every member that has not acknowledged the epoch yet. This
// node acknowledges itself as a member does, once no batch it posted to
// itself in an older epoch is unfinished (epochAckDue): a new home's own
// release of the old epoch writes its slot as a backup's, and that write
// must not land on a word it rebuilt.
func (n *Node) probe() {
	n.probeAt = n.now
	for _, m := range n.members {
		switch {
		case n.epochAcks[m]:
		case m == n.cfg.ID:
			n.ackOwed[m] = true
			n.epochAckDue(m)
		default:
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
//
// Batches of home duties of an older epoch hold back every acknowledgement,
// whatever their destination: a home demoted by a move (demote) may have a
// refresh or a fill of a backup in flight, and the new home rebuilds, and
// then releases write the backups, only once every member acknowledged.
//
// An acknowledgement says, with Clearing, that this node has backup slots
// entered anew that it has not cleared yet (clear.go): a fill to it waits.
func (n *Node) epochAckDue(to ids.NodeID) {
	for _, rec := range n.batches {
		if rec.epoch < n.epoch && (rec.to == to || rec.home) {
			return
		}
	}
	delete(n.ackOwed, to)
	if to == n.cfg.ID {
		n.epochAck(to)
		return
	}
	clearing := n.clearNeed > n.clearedAt
	if clearing {
		n.clearTold[to] = true // told again once cleared
	}
	n.rd.Messages = append(n.rd.Messages, Message{
		Type: MsgEpochAck, From: n.cfg.ID, To: to, Epoch: n.epoch, Clearing: clearing,
	})
}

// ---- moves ----

// A move, in short (docs/protocol.md, "Epochs and failures"): in an epoch whose
// placement changed, every node freezes the pages it has state for whose
// home changed and reports each to its new home (MsgReport), then tells
// every member how many pages it reported to it in this epoch
// (MsgMoveReport). A new home that holds every member's reports rebuilds
// the word of each page reported to it, answers each reporter
// (MsgRebuilt) and tells every member that its moves are done
// (MsgMoveDone), which unfreezes the pages nobody reported. A page this
// node has no state for is frozen when it is created, while its home owes
// MsgMoveDone and its home changed in an epoch since the oldest move this
// node waits for (a joining node: any page). Reports and counts start
// over in every epoch.

// inMove reports whether page no may belong to a move that is not done.
func (n *Node) inMove(no ids.PageNo) bool {
	if len(n.owed) == 0 || !n.owed[n.homeFn(no)] {
		return false
	}
	if n.moveAll {
		return true
	}
	for i := len(n.hist) - 1; i > 0; i-- {
		if n.hist[i](no) != n.hist[i-1](no) {
			return true
		}
	}
	return false
}

// lose gives up a page whose home is no member in the new placement: no
// copy of its home slot is left anywhere (the node layer found no complete
// backup). Nothing will rebuild it, so it is not frozen, and no move waits
// for it; the local copy goes (there is nowhere to write it back), and
// every request for the page is posted to its home, which is gone, and
// fails there as for any home that departed.
func (n *Node) lose(p *page, h ids.NodeID) {
	if p.home == h && !p.frozen {
		return
	}
	p.home = h
	p.frozen, p.mustReport, p.frozenM = false, false, false
	p.awaiting, p.needData, p.wbData = nil, false, nil
	p.ph = phIdle
	n.abandon(p)
	p.resolving, p.unknown = phIdle, nil
	p.downgrade, p.granted, p.recall, p.unitCounted = false, false, false, false
	if p.state != Invalid {
		p.state = Invalid
		p.data = nil
		n.effect(PageDrop, p)
	}
}

// freeze stops every transition of a page whose home moved and settles it
// in a stable state (an unfinished release keeps the tenure and its data,
// an unfinished acquisition is abandoned). Its report goes to the new home
// with the others (reportMoves).
func (n *Node) freeze(p *page) {
	if p.releasing() {
		// Did the release take effect at the old home? Only the new
		// home can tell, from everyone's reports: claim the tenure,
		// keep the data, map nothing writable meanwhile. (So also for
		// a release whose batch had an unknown outcome.)
		p.frozenM = true
		if p.state == Shared {
			// A release to S: the copy is not readable either. The
			// claim reports M, so no rebuilt word counts the copy,
			// and the new home may grant the next tenure before its
			// answer comes (with a live old home, no departure drops
			// the Shared copies). The copy comes back as M if the
			// claim wins; wbData keeps the bytes.
			p.state = Invalid
			p.data = nil
			n.effect(PageDrop, p)
		}
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
	n.abandon(p)
	p.unitCounted = false
	p.granted = false
	p.recall = false
	p.retryAt = n.now
	p.frozen = true
	p.mustReport = true
}

// abandon gives up page p's batch in flight, if any: it is finished when
// its VerbsDone comes, and nothing else is posted for p before (I11).
func (n *Node) abandon(p *page) {
	if p.inflight != 0 {
		p.abandoned = append(p.abandoned, p.inflight)
		p.inflight = 0
	}
}

// reportMoves sends, in a new epoch (or at creation), the report of every
// page this node keeps frozen and its counts to every member whose moves
// it waits for.
func (n *Node) reportMoves() {
	if len(n.owed) == 0 {
		return
	}
	n.moveAt, n.moveEvery = n.now, 2*n.cfg.RetransmitTicks
	for _, p := range n.order {
		if p.frozen && p.mustReport && n.owed[p.home] {
			n.report(p)
		}
	}
	for _, m := range n.members {
		if n.owed[m] {
			n.sendMoveReport(m)
		}
	}
}

// reportTo sends again every report this node sent to member to in this
// epoch, and the count: to holds fewer of them than the count said
// (MsgQuery). That includes the reports of pages unfrozen since (by the
// MsgRebuilt of a rebuild that to completed in an earlier epoch): the
// count holds them, and to answers them without using them.
func (n *Node) reportTo(to ids.NodeID) {
	if !n.owed[to] {
		return
	}
	for _, p := range n.order {
		if n.sent[to][p.no] {
			n.report(p)
		}
	}
	n.sendMoveReport(to)
}

func (n *Node) report(p *page) {
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
	if n.sent[p.home] == nil {
		n.sent[p.home] = map[ids.PageNo]bool{}
	}
	n.sent[p.home][p.no] = true
	if p.home == n.cfg.ID {
		n.gotReport(m)
		return
	}
	n.rd.Messages = append(n.rd.Messages, m)
}

// sendMoveReport tells member to how many distinct pages this node has
// reported to it in this epoch.
func (n *Node) sendMoveReport(to ids.NodeID) {
	c := len(n.sent[to])
	if to == n.cfg.ID {
		n.gotMoveReport(to, c)
		return
	}
	n.send(MsgMoveReport, to, ids.PageNo(c), 0, false)
}

func (n *Node) sendMoveDone(to ids.NodeID) {
	if to == n.cfg.ID {
		n.moveDone(to)
		return
	}
	n.send(MsgMoveDone, to, 0, 0, false)
}

// gotReport takes a report of page m.Page for its rebuild at this node, the
// page's new home.
func (n *Node) gotReport(m Message) {
	h := n.duty(m.Page)
	if h == nil {
		if !n.target || n.homeFn(m.Page) != n.cfg.ID {
			return
		}
		h = &homeDuty{no: m.Page, guess: InitialWord(n.epoch), rebuilding: true}
		n.addDuty(h)
	}
	if h.reports == nil {
		h.reports = map[ids.NodeID]Message{}
	}
	if _, ok := h.reports[m.From]; !ok {
		n.reportsIn[m.From]++
	}
	h.reports[m.From] = m
	if !h.rebuilding {
		n.sendRebuilt(h, m.From) // a reporter that missed the news
		return
	}
	n.checkMoveDone()
}

// gotMoveReport takes member from's count of the pages it reported to this
// node in this epoch.
func (n *Node) gotMoveReport(from ids.NodeID, count int) {
	if !n.target {
		n.sendMoveDone(from)
		return
	}
	n.counts[from] = count
	if n.reportsIn[from] < count && from != n.cfg.ID {
		// Once per retransmission period: the reports may be on their
		// way behind the count, and every query makes the member send
		// them all again.
		if at, ok := n.queryAt[from]; !ok || n.now-at >= uint64(2*n.cfg.RetransmitTicks) {
			n.queryAt[from] = n.now
			n.send(MsgQuery, from, 0, 0, false)
		}
		return
	}
	n.checkMoveDone()
}

// movesReported reports whether this node holds every member's reports of
// this epoch, and its slots are ready.
func (n *Node) movesReported() bool {
	if n.slotsReady < n.slotsNeed {
		return false
	}
	for _, m := range n.members {
		if c, ok := n.counts[m]; !ok || n.reportsIn[m] < c {
			return false
		}
	}
	return true
}

// checkMoveDone rebuilds the reported pages once every report is in, and
// tells every member that the moves to this node are done once they are
// rebuilt.
func (n *Node) checkMoveDone() {
	if !n.target || !n.movesReported() {
		return
	}
	for _, h := range n.homes {
		if h.rebuilding {
			n.driveHome(h)
		}
	}
	for _, h := range n.homes {
		if h.rebuilding {
			return
		}
	}
	n.target = false
	for _, m := range n.members {
		n.sendMoveDone(m)
	}
	held := n.fillsHeld
	n.fillsHeld = nil
	for _, f := range held {
		_ = n.startCopies(f) // checked when it came
	}
}

// moveDone notes that member from completed its moves: the pages this node
// did not report to it are unfrozen. A page it reported and whose
// MsgRebuilt has not come is reported again (the answer was lost).
func (n *Node) moveDone(from ids.NodeID) {
	if !n.owed[from] {
		return
	}
	waiting := false
	for _, p := range n.order {
		if p.frozen && p.mustReport && p.home == from {
			n.report(p)
			waiting = true
		}
	}
	if waiting {
		return
	}
	delete(n.owed, from)
	for _, p := range n.order {
		if p.frozen && p.home == from {
			n.unfreeze(p, 0, false, false)
		}
	}
	if len(n.owed) == 0 {
		n.moveAll = false
		n.hist = []func(ids.PageNo) ids.NodeID{n.homeFn}
	}
}

// rebuiltWord is the word the reports describe. The M reporter of the
// newest tenure is the holder, unless another reporter holds a copy of
// that tenure or a newer one, or knows that it ended (an Invalid report
// with Ended: since the last rebuild it held a copy of that tenure, took
// a later one, or read a word that showed it over). Then the tenure had
// been released (its write-back, or a later one, is in the backup copy):
// only the completion of the release was lost with the old home, or the
// release's outcome was unknown and not yet resolved, and other tenures
// may have followed it. The slot's word (read first) counts as such
// evidence too when it shows a newer tenure than the claim: a backup write
// of a later tenure, whose releaser may be the departed node itself (a
// home that was its own client), so that no report tells of it.
// Otherwise the S reporters of the newest version are the sharers. The
// word's version is the newest any report shows, or the slot's.
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
	// The slot's word, read before the rebuild, gives the newest tenure
	// whose data a release (or a fill, or a refresh) wrote to this
	// backup, or one held at this slot: newer than the claim, it shows
	// the claimed tenure over, as an Ended report does (a later tenure
	// began only after its release took effect). The releaser of that
	// later tenure may be the node that departed, whose reports never
	// come: a leaver that wrote its last tenure back, or a crashed home
	// that was its own client.
	slotVer := h.guess.Version()
	slotNewer := h.known && slotVer != 0 && holder != ids.None && newer(slotVer, mVer)
	if holder != ids.None && (!sFound || newer(mVer, sVer)) && (!hFound || newer(mVer, hVer)) && !slotNewer {
		return w.withHolder(holder).withVersion(mVer)
	}
	ver := mVer
	if sFound && (holder == ids.None || !newer(mVer, sVer)) {
		ver = sVer
	}
	if hFound && (holder == ids.None && !sFound || newer(hVer, ver)) {
		ver = hVer
	}
	if d := h.guess.Version(); h.known && d != 0 && (holder == ids.None && !sFound && !hFound || newer(d, ver)) {
		// The slot's word gives the version of the data beside it (the
		// last released tenure's, from the backup's stamp): the version
		// never goes backwards. (Zero: a page never written back.)
		ver = d
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
		(isExact(to) && h.rebuilt.hasExactBit(to) || !isExact(to) && h.used[to].State == Shared && h.used[to].Version == h.rebuiltVer)
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
	p.frozen, p.mustReport = false, false
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
			n.rd.Pages[len(n.rd.Pages)-1].Reclaimed = true
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
