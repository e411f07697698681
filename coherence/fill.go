package coherence

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/dsmkit/dsm/internal/ids"
)

// This file holds the home's fill of a backup that entered a page's backup
// set later (docs/failover.md §6, "Filling a backup"): the Fill event and
// the hFill* home operations.
//
// A fill of page p to backup B, at p's home, goes in three steps:
//
//  1. The fence: every member of the home's epoch when the Fill came (that
//     is still a member) acknowledges that epoch or a later one
//     (MsgEpoch, MsgEpochAck), and B does so without Clearing (its slots
//     entered anew read zero data: clear.go). In such an epoch B is a
//     backup of p, so every release from then on writes B before its CAS
//     at the home; and the acknowledgement waits for the batches the
//     member posted to the home in older epochs, so no release that
//     skipped B is still in flight. Members that join later are created in an epoch in which B
//     is a backup.
//  2. The reservation: the home takes the page's turn (HomeTurn in the
//     word's reserved field): with a CAS when the page is not reserved
//     (followed, in its batch, by READs of the page and the word), or by keeping the
//     turn when it comes back from a reserver, instead of passing it on
//     (the home is a client of its own pages: enqueue(no, self) would
//     mix the fill with its own requests). While the page is reserved for the home no node
//     acquires it, so once the word has no holder no release writes B and
//     the home copy does not change. A holder is recalled (a read recall);
//     its release writes B too, and keeps the reservation.
//  3. The copy: a READ of the home's own slot that shows no holder (the
//     word and the data beside it), then one batch to B: [WRITE page,
//     WRITE Stamp(v)], v the word's version. Its completion reports the
//     page filled (Ready.Filled); the turn goes on to the next in line,
//     or back to none, as the reservation queue passes it.
//
// A page whose slot shows no holder, version 0 and all-zero data was
// never written: it is reported filled after the fence, without a copy
// (B's slot, never written or cleared, reads zero data too). A fill that
// cannot complete (B departs or leaves the page's backups, or this node is
// not the page's home) is reported abandoned; a reservation taken for it
// goes on like any other turn of the home.

// Persist (docs/durability.md §2) is a fill without a backup: the same
// reservation and the same READ of a slot that shows no holder, and the
// copy handed to the node layer (Ready.Persisted) instead of written. It
// needs no fence: its copy is the page's data at one moment, not a copy
// that later releases must keep up to date.

// fillOp is one backup to fill with one page, or (to None) one stable copy
// of the page to hand over for a Persist.
type fillOp struct {
	to ids.NodeID
	// epoch is the home's epoch when the Fill came; members the members
	// then: each must acknowledge epoch or a later one first.
	epoch   ids.Epoch
	members []ids.NodeID
	// since (a Persist) is Node.slotReads when it came: its copy comes
	// from a later READ, never from one in flight or done before.
	since uint64
}

// stepFill starts the fills that f asks for.
func (n *Node) stepFill(f Fill) error {
	if f.To == ids.None || f.To > MaxNodeID {
		return fmt.Errorf("%w: fill to %v", ErrBadRequest, f.To)
	}
	return n.startCopies(f)
}

// stepPersist starts the stable copies that p asks for.
func (n *Node) stepPersist(p Persist) error {
	return n.startCopies(Fill{Pages: p.Pages})
}

// startCopies starts the fills of f, or with f.To None the copies of a
// Persist.
func (n *Node) startCopies(f Fill) error {
	if n.target {
		// Pages may have moved to this node and not be rebuilt yet: a
		// duty started now would take the rebuild's place. The fills
		// start when the moves are done (checkMoveDone).
		n.fillsHeld = append(n.fillsHeld, Fill{Pages: slices.Clone(f.Pages), To: f.To})
		return nil
	}
	// The duties given a fill here are driven below; the others with
	// fills are driven by the events they wait for, and by Ticks.
	var touched []*homeDuty
	for _, no := range f.Pages {
		if why := n.fillRefused(no, f.To); why != "" {
			n.copyAbandoned(no, f.To, why)
			continue
		}
		h := n.lazyDuty(no)
		if f.To == ids.None {
			h.fills = append(h.fills, &fillOp{since: n.slotReads})
			touched = append(touched, h)
			continue
		}
		if slices.ContainsFunc(h.fills, func(op *fillOp) bool { return op.to == f.To }) {
			continue
		}
		h.fills = append(h.fills, &fillOp{to: f.To, epoch: n.epoch, members: slices.Clone(n.members)})
		touched = append(touched, h)
	}
	n.fillProbe()
	for _, h := range touched {
		if len(h.fills) > 0 && n.homeIdx[h.no] == h {
			n.driveHome(h)
		}
	}
	return nil
}

// fillRefused says why page no cannot be filled to node to here, now, or
// "" when it can.
func (n *Node) fillRefused(no ids.PageNo, to ids.NodeID) string {
	switch {
	case n.homeOf(no) != n.cfg.ID:
		return fmt.Sprintf("%v is not the home of %v in %v", n.cfg.ID, no, n.epoch)
	case to == ids.None:
		return "" // a Persist
	case to == n.cfg.ID:
		return "a home is no backup of its own pages"
	case !n.isMember(to):
		return fmt.Sprintf("%v is no member in %v", to, n.epoch)
	case n.backupsFn == nil || !slices.Contains(n.backupsFn(no), to):
		return fmt.Sprintf("%v is no backup of %v in %v", to, no, n.epoch)
	}
	return ""
}

func (n *Node) fillDone(no ids.PageNo, to ids.NodeID, err error) {
	n.rd.Filled = append(n.rd.Filled, FillDone{Page: no, To: to, Err: err})
}

// copyAbandoned reports a fill to node to (or a Persist, to None) of page
// no given up, saying why.
func (n *Node) copyAbandoned(no ids.PageNo, to ids.NodeID, why string) {
	if to == ids.None {
		n.rd.Persisted = append(n.rd.Persisted, PersistDone{Page: no, Err: fmt.Errorf("%w: %s", ErrPersistAbandoned, why)})
		return
	}
	n.fillDone(no, to, fmt.Errorf("%w: %s", ErrFillAbandoned, why))
}

// persisted hands the stable copy of page no at version ver to the node
// layer.
func (n *Node) persisted(no ids.PageNo, ver uint16, data []byte) {
	n.rd.Persisted = append(n.rd.Persisted, PersistDone{Page: no, Version: ver, Data: slices.Clone(data)})
}

// pruneFills abandons the fills of h that cannot complete any more.
func (n *Node) pruneFills(h *homeDuty) {
	h.fills = slices.DeleteFunc(h.fills, func(f *fillOp) bool {
		if why := n.fillRefused(h.no, f.to); why != "" {
			n.copyAbandoned(h.no, f.to, why)
			return true
		}
		return false
	})
	if len(h.fills) == 0 {
		h.fillData = nil
	}
}

// fenced reports whether every member of f's epoch that is still a member
// has acknowledged that epoch or a later one, f.to without Clearing (its
// slots entered anew read zero: clear.go).
func (n *Node) fenced(f *fillOp) bool {
	if f.to != ids.None && n.clearedIn[f.to] < f.epoch {
		return false
	}
	for _, m := range f.members {
		if m != n.cfg.ID && n.isMember(m) && n.ackedIn[m] < f.epoch {
			return false
		}
	}
	return true
}

// fillProbe asks every member whose acknowledgement a fill waits for.
func (n *Node) fillProbe() {
	var ask []ids.NodeID
	// A duty with fills is not settled: the active set holds it.
	for _, h := range n.activeHomes {
		if n.homeIdx[h.no] != h {
			continue // dropped (demote)
		}
		for _, f := range h.fills {
			if f.to != ids.None && n.clearedIn[f.to] < f.epoch && !slices.Contains(ask, f.to) {
				ask = append(ask, f.to)
			}
			for _, m := range f.members {
				if m != n.cfg.ID && n.isMember(m) && n.ackedIn[m] < f.epoch && !slices.Contains(ask, m) {
					ask = append(ask, m)
				}
			}
		}
	}
	if len(ask) == 0 {
		return
	}
	n.fillProbeAt = n.now
	slices.Sort(ask)
	for _, m := range ask {
		n.send(MsgEpoch, m, 0, 0, false)
	}
}

// driveFill makes the next step of the first fill of h, when its fence is
// passed. It reports whether the duty is busy with the fill (a batch
// posted, or waiting for the word to change); false lets the reservation
// queue go on as usual (no fill, or one that waits for its fence, or a
// page reserved for another node, whose turn must come back first).
func (n *Node) driveFill(h *homeDuty) bool {
	n.pruneFills(h)
	if len(h.fills) == 0 || !n.fenced(h.fills[0]) {
		return false
	}
	f := h.fills[0]
	if !h.fresh || h.fillData == nil || f.to == ids.None && h.fillSeq <= f.since {
		if n.now < h.pollAt {
			return true
		}
		h.pollAt = n.now + 1
		n.postHomeVerbs(h, hFillRead, slotVerbs(h.no)...)
		return true
	}
	w := h.guess
	if n.namesDeparted(w) {
		// The duty repairs it first (after the departure's probe).
		h.pending = true
		return true
	}
	if f.to != ids.None && w.Holder() == ids.None && w.Version() == 0 && allZero(h.fillData) {
		// Never written: nothing to copy, and every later release
		// writes the backup (the fence). (A Persist takes the turn all
		// the same: its copy is one moment's, and a READ without the
		// turn could race the first tenure's release.)
		h.fills = h.fills[1:]
		n.fillDone(h.no, f.to, nil)
		h.fresh = true
		return true
	}
	r := w.Reserved()
	if h.fillHeld && r != HomeTurn {
		// A READ shows the turn gone: passed on by a pass whose outcome
		// was unknown (settled in homeDone). Take it again.
		h.fillHeld = false
	}
	switch {
	case !h.fillHeld && r == HomeTurn:
		// The turn came back from a reserver: the home keeps it for
		// the fill before it goes on.
		h.fillHeld = true
	case !h.fillHeld && r == ids.None:
		// The CAS, then the page and the word in the same batch: the
		// data and the word as they are once the turn is (or is not)
		// taken; the CAS's old word dates the copy from before.
		n.postHomeVerbs(h, hFillResv,
			Verb{Kind: VerbCAS, Page: h.no, Span: SpanWord, Compare: uint64(w), Operand: uint64(w.withResv(HomeTurn).withTag(n.tag()))},
			Verb{Kind: VerbRead, Page: h.no, Span: SpanPage},
			Verb{Kind: VerbRead, Page: h.no, Span: SpanWord})
		return true
	case !h.fillHeld:
		return false // reserved for another node: its turn comes back first
	}
	if holder := w.Holder(); holder != ids.None {
		// Recalled to S: its release writes the backup, and the home
		// copy after it is what the fill copies.
		if n.now >= h.fillRecallAt {
			h.fillRecallAt = n.now + uint64(n.cfg.RetransmitTicks)
			if holder == n.cfg.ID {
				n.recall(n.page(h.no), w.Version(), false)
			} else {
				n.send(MsgRecall, holder, h.no, w.Version(), false)
			}
		}
		h.fresh = false
		return true
	}
	if f.to == ids.None {
		// A Persist: the copy, read with the turn held and no holder,
		// is the page's data as of tenure w.Version().
		h.fills = h.fills[1:]
		n.persisted(h.no, w.Version(), h.fillData)
		if len(h.fills) == 0 {
			h.fillData = nil
		}
		return true
	}
	n.nextID++
	id := n.nextID
	verbs := []Verb{
		{Kind: VerbWrite, Page: h.no, Span: SpanPage, Data: slices.Clone(h.fillData), HomeCopy: true},
		{Kind: VerbWrite, Page: h.no, Span: SpanWord, Data: binary.LittleEndian.AppendUint64(nil, uint64(Stamp(w.Version())))},
	}
	n.batches[id] = batchRec{page: h.no, home: true, verbs: verbs, to: f.to, epoch: n.epoch}
	n.rd.Batches = append(n.rd.Batches, Batch{ID: id, Home: f.to, Verbs: verbs})
	h.inflight, h.op = id, hFillWrite
	return true
}

// fillWritten ends the fill whose copy to node to completed.
func (n *Node) fillWritten(h *homeDuty, to ids.NodeID) {
	i := slices.IndexFunc(h.fills, func(f *fillOp) bool { return f.to == to })
	if i < 0 {
		return // abandoned meanwhile
	}
	h.fills = slices.Delete(h.fills, i, i+1)
	n.fillDone(h.no, to, nil)
	if len(h.fills) == 0 {
		h.fillData = nil
	}
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}
