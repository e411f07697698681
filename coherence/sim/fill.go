package sim

import (
	"bytes"
	"maps"
	"slices"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// This file is the simulator's node layer for fills (Options.Fills,
// docs/failover.md §6): the backup sets, which backups are complete, the
// Fill events given to homes and what they report, and the checks I9 and
// I10.

// refill, at a reconfiguration to the members given (after the promotions
// of the crashed homes' pages), drops the departed and tainted backups of
// every page,
// replaces them and the promoted ones by live members that are neither the
// page's home nor its backup (the newest id first), and schedules the
// fill of every backup that is not complete at the page's home.
func (s *Sim) refill(members []ids.NodeID) {
	k := min(s.Opts.Backups, len(members)-1)
	cand := slices.Clone(members)
	slices.Sort(cand)
	for p := ids.PageNo(0); int(p) < s.Opts.Pages; p++ {
		home := s.slots[p].home
		bs := slices.DeleteFunc(s.bset[p], func(b ids.NodeID) bool {
			if s.gone[b] || s.tainted[b] || int(b) < len(s.nodes) && s.nodes[b].zombie {
				delete(s.complete[p], b)
				delete(s.filled[p], b)
				return true
			}
			return false
		})
		for len(bs) < k {
			var free []ids.NodeID
			for _, c := range cand {
				if c != home && !slices.Contains(bs, c) && !s.gone[c] && !s.tainted[c] && !s.draining[c] && c != s.suspendee {
					free = append(free, c)
				}
			}
			if len(free) == 0 {
				break
			}
			c := free[len(free)-1] // the newest: a restarted node, a joiner
			if int(c) <= s.Opts.Nodes && s.rng.Intn(2) == 0 {
				c = free[s.rng.Intn(len(free))]
			}
			bs = append(bs, c)
			s.tracef("%v: %v is a new backup, to fill", p, c)
			if int(c) < len(s.nodes) {
				s.addBackupSlot(p, c)
			} else {
				s.newSlots = append(s.newSlots, fillDue{page: p, to: c})
			}
		}
		s.bset[p] = bs
		s.fillsDue = slices.DeleteFunc(s.fillsDue, func(d fillDue) bool { return d.page == p })
		for _, b := range bs {
			if !s.complete[p][b] && !s.fillOut[fillDue{page: p, to: b, home: home}] {
				s.fillsDue = append(s.fillsDue, fillDue{page: p, to: b, home: home, epoch: s.epoch})
			}
		}
	}
	for d := range s.fillOut {
		if s.gone[d.home] {
			delete(s.fillOut, d) // its home died: it reports nothing
		}
	}
}

// addBackupSlot registers a backup slot of page p at node id: zero, never
// written (a new incarnation's memory, or a slot punched when the node
// stopped backing the page).
func (s *Sim) addBackupSlot(p ids.PageNo, id ids.NodeID) {
	reg, err := s.nodes[id].ep.Register(make([]byte, 8+s.Opts.PageSize), rdma.AccessAll)
	if err != nil {
		s.fail("register a backup slot of %v at %v: %v", p, id, err)
		return
	}
	if s.bslots[p] == nil {
		s.bslots[p] = map[ids.NodeID]slot{}
	}
	s.bslots[p][id] = slot{home: id, reg: reg}
}

// filling reports whether a live backup of some page is not complete yet.
func (s *Sim) filling() bool {
	if !s.Opts.Fills {
		return false
	}
	for p, bs := range s.bset {
		for _, b := range bs {
			if !s.gone[b] && !s.complete[p][b] {
				return true
			}
		}
	}
	return false
}

// fillingBut reports whether a live backup of some page other than node x
// is not complete yet (a leave waits for those, not for its own fills:
// dsmd's hand-over).
func (s *Sim) fillingBut(x ids.NodeID) bool {
	for p, bs := range s.bset {
		for _, b := range bs {
			if b != x && !s.gone[b] && !s.complete[p][b] {
				return true
			}
		}
	}
	return false
}

// mayLose reports whether node id may crash now: every page it is the home
// of keeps a complete live backup (with EarlyPromote, any live backup),
// and home crashes are left.
func (s *Sim) mayLose(id ids.NodeID) bool {
	for p := ids.PageNo(0); int(p) < s.Opts.Pages; p++ {
		if s.slots[p].home != id {
			continue
		}
		if s.homeCrashes >= s.Opts.HomeCrashes {
			return false
		}
		ok := false
		for _, b := range s.bset[p] {
			if b != id && !s.gone[b] && (s.complete[p][b] || s.Opts.EarlyPromote) {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// issueFill gives one home the fills due there, for one backup, once the
// home has learnt their epoch (all of them, when all). It reports whether
// it gave any.
func (s *Sim) issueFill(all bool) bool {
	s.fillsDue = slices.DeleteFunc(s.fillsDue, func(d fillDue) bool {
		return s.gone[d.home] || s.gone[d.to] || !slices.Contains(s.bset[d.page], d.to) || s.complete[d.page][d.to]
	})
	issued := false
	for len(s.fillsDue) > 0 {
		var ready []fillDue
		for _, d := range s.fillsDue {
			if s.nodes[d.home].sm.Epoch() >= d.epoch {
				ready = append(ready, d)
			}
		}
		if len(ready) == 0 {
			return issued
		}
		first := ready[0]
		if !all {
			first = ready[s.rng.Intn(len(ready))]
		}
		f := coherence.Fill{To: first.to}
		s.fillsDue = slices.DeleteFunc(s.fillsDue, func(d fillDue) bool {
			if d.home == first.home && d.to == first.to && s.nodes[d.home].sm.Epoch() >= d.epoch {
				f.Pages = append(f.Pages, d.page)
				s.fillOut[fillDue{page: d.page, to: d.to, home: d.home}] = true
				return true
			}
			return false
		})
		n := s.nodes[first.home]
		s.tracef("%v fills %v with %v", n.id, f.To, f.Pages)
		if err := n.sm.Step(f); err != nil {
			s.fail("%v refused %v: %v", n.id, f, err)
			return true
		}
		s.apply(n)
		issued = true
		if !all {
			return true
		}
	}
	return issued
}

// Fill gives every home the fills due there whose epoch it has learnt, as
// one step; it reports whether there was any.
func (s *Sim) Fill() bool {
	s.step++
	ok := s.issueFill(true)
	s.check(false)
	return ok
}

// fillReported takes node n's report of a fill: a page filled makes its
// backup complete if it is still a backup of the page and n its home; a
// fill given up is asked for again while the backup still needs it.
func (s *Sim) fillReported(n *simNode, f coherence.FillDone) {
	delete(s.fillOut, fillDue{page: f.Page, to: f.To, home: n.id})
	current := s.slots[f.Page].home == n.id && slices.Contains(s.bset[f.Page], f.To) && !s.complete[f.Page][f.To]
	if f.Err != nil {
		s.stats.FillsAbandoned++
		if current {
			s.fillsDue = append(s.fillsDue, fillDue{page: f.Page, to: f.To, home: n.id, epoch: s.epoch})
		}
		return
	}
	s.stats.Fills++
	if current {
		s.complete[f.Page][f.To] = true
		s.filled[f.Page][f.To] = true
		s.tracef("%v: backup %v is complete", f.Page, f.To)
	}
}

// completeBackups is the backups of page p whose copy is complete: with
// Fills, the driver's book; else every backup of the current epoch.
func (s *Sim) completeBackups(p ids.PageNo) []ids.NodeID {
	if s.Opts.Fills {
		var out []ids.NodeID
		for _, b := range s.bset[p] {
			if s.complete[p][b] && !s.gone[b] {
				out = append(out, b)
			}
		}
		return out
	}
	if s.bkCur == nil {
		return nil
	}
	return slices.DeleteFunc(slices.Clone(s.bkCur(p)), func(b ids.NodeID) bool { return s.gone[b] })
}

// checkBackups checks I10 for page p: while the home word names no holder
// (a holder, a departed one or a stamp: the copies are being written, or
// wait for a repair that refreshes them), no live node holds or claims the
// tenure, and the page is not in a move, every complete backup holds the
// home copy. A backup never written (a zero word) holds zero data, which
// must be the home copy then. A stamp newer than the home word excuses
// nothing (it did until session 21, as a release under way: a release
// under way has a live holder or claimant, which backupsSettling covers;
// the excuse hid a demoted home's slot that kept a dead releaser's write,
// counted complete by a fill that skipped the page: promote_before_rebuild.txt).
func (s *Sim) checkBackups(p ids.PageNo) {
	if s.bkCur == nil {
		return
	}
	sl := s.slots[p]
	w := coherence.Word(rdma.LoadWord(sl.reg.Bytes(), sl.off))
	if w.Holder() != ids.None {
		return
	}
	home := sl.reg.Bytes()[sl.off+8 : sl.off+8+uint64(s.Opts.PageSize)]
	for _, b := range s.completeBackups(p) {
		bs, ok := s.bslots[p][b]
		if !ok {
			s.fail("I10: complete backup %v of %v has no slot", b, p)
			return
		}
		bw := bs.word()
		if s.former[p][b] {
			bw = coherence.StampOf(bw) // a lagging verb may have made it a home word again (a CAS on a zero word)
		}
		if bw != 0 && bw.Holder() != coherence.NotHome {
			s.fail("I10: backup %v of %v: word %v is no stamp", b, p, bw)
			return
		}
		if data := bs.data(s.Opts.PageSize); !bytes.Equal(data, home) {
			if s.backupsSettling(p) {
				return
			}
			s.fail("I10: complete backup %v of %v holds %v (stamp %v), not the home's released data %v (word %v)", b, p, data, bw, home, w)
			return
		}
	}
}

// backupsSettling reports whether page p's backups may differ from its
// home copy legitimately: a move some node has not learnt (the slot is no
// home word yet), a move not rebuilt (the slot may hold a partial write of
// a release under a word never stamped), or a live node that holds or
// claims the tenure (its release writes the backups before the home).
func (s *Sim) backupsSettling(p ids.PageNo) bool {
	home := s.slots[p].home
	for _, n := range s.nodes[1:] {
		if !n.alive {
			continue
		}
		if n.placed[p] != home {
			return true
		}
		if info := n.sm.Page(p); info.Frozen || info.Tenure {
			return true
		}
	}
	return false
}

// ---- moves away from live homes (Options.Promotions) ----

// choosePromotion picks a page whose home is live and which has a complete
// live backup, and that backup, for a promotion; ok is false when there is
// none.
func (s *Sim) choosePromotion() (ids.PageNo, ids.NodeID, bool) {
	var pages []ids.PageNo
	for p := ids.PageNo(0); int(p) < s.Opts.Pages; p++ {
		if _, ok := s.promote[p]; !ok && !s.gone[s.slots[p].home] && s.promotable(p) != ids.None {
			pages = append(pages, p)
		}
	}
	if len(pages) == 0 {
		return 0, ids.None, false
	}
	p := pages[s.rng.Intn(len(pages))]
	return p, s.promotable(p), true
}

// promotable is page p's first complete live backup that is neither
// tainted nor draining, or None.
func (s *Sim) promotable(p ids.PageNo) ids.NodeID { return s.promotableBut(p, s.suspendee) }

// promotableBut is promotable, leaving node x out (the node partitioned).
func (s *Sim) promotableBut(p ids.PageNo, x ids.NodeID) ids.NodeID {
	for _, b := range s.bset[p] {
		if !s.gone[b] && !s.tainted[b] && !s.draining[b] && b != x && s.complete[p][b] {
			if _, ok := s.bslots[p][b]; ok {
				return b
			}
		}
	}
	return ids.None
}

// promoteLive moves every page of s.promote away from its live home to the
// backup chosen: the backup's slot becomes the home slot (its stamp turns
// into a home word lazily, as for a crashed home's), the old home becomes
// the page's first backup and owes the stamp of the word it leaves behind.
// It is not complete until the new home has filled it, although its slot
// holds the last released data: the fill waits for every member to
// acknowledge the epoch of the move, and before that a member may still
// hold the page under the old home's word without knowing of the move. A
// move back to the old home before then would be no move at all for that
// member (it skipped the epoch between), while the other members' reports
// rebuild the word without its tenure.
func (s *Sim) promoteLive() {
	for _, p := range slices.Sorted(maps.Keys(s.promote)) {
		c := s.promote[p]
		old := s.slots[p]
		bs, ok := s.bslots[p][c]
		if s.gone[old.home] || s.gone[c] || !ok || !s.complete[p][c] {
			s.tracef("%v: promotion to %v given up", p, c)
			continue
		}
		s.stampFormer(p, c)
		if !s.judgeBackup(p, c, bs, slices.Clone(old.data(s.Opts.PageSize)), old.word()) {
			return
		}
		delete(s.bslots[p], c)
		delete(s.former[p], c)
		s.slots[p] = bs
		s.bslots[p][old.home] = old
		if s.former[p] == nil {
			s.former[p] = map[ids.NodeID]bool{}
		}
		s.former[p][old.home] = true
		s.stampsDue = append(s.stampsDue, stampDue{page: p, node: old.home, epoch: s.epoch})
		s.clearsDue = append(s.clearsDue, stampDue{page: p, node: old.home, epoch: s.epoch})
		i := slices.Index(s.bset[p], c)
		s.bset[p] = slices.Insert(slices.Delete(s.bset[p], i, i+1), 0, old.home)
		delete(s.complete[p], c)
		delete(s.filled[p], c)
		delete(s.complete[p], old.home)
		delete(s.filled[p], old.home)
		s.moved[p] = true
		s.pageMoves[p]++
		s.stats.Promotions++
		s.tracef("%v moves from live %v to %v, which was its backup", p, old.home, c)
	}
	clear(s.promote)
}

// stampFormer drops the stamp node id owes for the slot of page p it left
// behind, when that slot becomes a home slot again: a node that skipped the
// epoch that moved the page away never learnt of the move, and its node
// layer stamps nothing. The slot's word stays as the old home left it, or
// as a lagging member's verb made it.
func (s *Sim) stampFormer(p ids.PageNo, id ids.NodeID) {
	s.stampsDue = slices.DeleteFunc(s.stampsDue, func(d stampDue) bool { return d.page == p && d.node == id })
	s.clearsDue = slices.DeleteFunc(s.clearsDue, func(d stampDue) bool { return d.page == p && d.node == id })
}

// stampSlot turns the word of node id's slot of page p into a stamp, as the
// node layer's CAS loop does: a word without a holder stamps its version
// (the data beside it is that tenure's), a word with a holder the version
// before (the held tenure's data is not there). A zero word or a stamp
// (written by a backup write or a fill since the move) stays.
func (s *Sim) stampSlot(p ids.PageNo, id ids.NodeID) {
	sl, ok := s.bslots[p][id]
	if !ok {
		return
	}
	w := sl.word()
	if st := coherence.StampOf(w); st != w {
		rdma.StoreWord(sl.reg.Bytes(), sl.off, uint64(st))
		s.stats.DemoteStamps++
		s.tracef("%v stamps its old slot of %v: %v -> %v", id, p, w, st)
	}
}

// clearPending reports whether node id owes the clear of a slot left
// behind by a move in epoch e or before.
func (s *Sim) clearPending(id ids.NodeID, e ids.Epoch) bool {
	return slices.ContainsFunc(s.clearsDue, func(d stampDue) bool { return d.node == id && d.epoch <= e })
}

// clearOne makes the clear that one live node asked for (Ready.ClearSlots):
// it zeroes the data of every slot the node left behind by a move up to
// the epoch asked, after the stamp of its word if that is still owed (the
// old home is a backup that entered the page's set anew, and its new
// home's fill, which skips a page never written, must find the slot
// reading zero: docs/failover.md §7, "A page promoted away before its new
// home rebuilt it"), then steps SlotsCleared. It reports whether it did.
// A release's backup write since the move is lost here; the fill, which
// waits for the clear, copies the home's data, which that release wrote
// too.
func (s *Sim) clearOne() bool {
	// Clears owed by departed nodes are dropped.
	s.clearsDue = slices.DeleteFunc(s.clearsDue, func(d stampDue) bool { return s.gone[d.node] })
	for id := range s.clearAsk {
		if s.gone[id] || !s.nodes[id].alive {
			delete(s.clearAsk, id)
		}
	}
	if len(s.clearAsk) == 0 {
		return false
	}
	asked := slices.Sorted(maps.Keys(s.clearAsk))
	id := asked[s.rng.Intn(len(asked))]
	e := s.clearAsk[id]
	delete(s.clearAsk, id)
	s.clearsDue = slices.DeleteFunc(s.clearsDue, func(d stampDue) bool {
		if d.node != id || d.epoch > e {
			return false
		}
		if i := slices.Index(s.stampsDue, d); i >= 0 {
			s.stampsDue = slices.Delete(s.stampsDue, i, i+1)
			s.stampSlot(d.page, id)
		}
		if sl, ok := s.bslots[d.page][id]; ok {
			if data := sl.data(s.Opts.PageSize); !allZero(data) {
				clear(data)
				s.stats.DemoteClears++
				s.tracef("%v clears the data of its old slot of %v", id, d.page)
			}
		}
		return true
	})
	n := s.nodes[id]
	if err := n.sm.Step(coherence.SlotsCleared{Epoch: e}); err != nil {
		s.fail("%v refused SlotsCleared: %v", id, err)
		return true
	}
	s.apply(n)
	return true
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// stampOne makes one stamp owed by a live old home that has learnt the
// epoch of the move (stamps owed by crashed nodes are dropped); it reports
// whether it did.
func (s *Sim) stampOne() bool {
	s.stampsDue = slices.DeleteFunc(s.stampsDue, func(d stampDue) bool { return s.gone[d.node] })
	var ready []int
	for i, d := range s.stampsDue {
		if s.nodes[d.node].sm.Epoch() >= d.epoch {
			ready = append(ready, i)
		}
	}
	if len(ready) == 0 {
		return false
	}
	i := ready[s.rng.Intn(len(ready))]
	d := s.stampsDue[i]
	s.stampsDue = slices.Delete(s.stampsDue, i, i+1)
	s.stampSlot(d.page, d.node)
	return true
}
