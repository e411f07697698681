package sim

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma/mem"
)

// This file is the simulator's model of a partition under leases
// (Options.Partitions, docs/failover.md §9): a node cut off from the
// directory's majority. Its lease ends first: dsmd suspends its page
// cache, so its clients issue nothing more, but its engine runs on. It
// answers invalidations and recalls, retries its batches and posts them to
// every member it can reach. Then the majority removes it (the fence
// waited out its lease). It learns nothing of that: it is a zombie,
// departed for everyone who learnt the epoch, whose verbs still execute
// at the members that have not learnt it yet. Each member fences it when
// it learns the epoch (tcp.Transport.Fence; mem.Endpoint.Fence here), and
// from then on refuses its batches and messages. At last the partition
// heals: the zombie learns it was removed, closes, and a new incarnation
// joins under a new id. The pages it homes move at the removal to
// complete backups, as from a live home that never stamps the slot it
// leaves: it goes on acting as their home for the members that lag.
//
// The pages it held when it was removed are undecided between their home
// copy and its last write: its release may still land at a home that has
// not learnt the removal (the home's word then no longer names it), or
// the home repairs the word once it has. The page's data is decided when
// the home's word stops naming it, and must be one of the two.

// zombieCands are the candidates of a page a removed node held.
type zombieCands struct {
	z     ids.NodeID
	cands [][]byte
	at    slot // the page's home slot at the removal
}

// startPartition suspends a live node that has no request under way and
// whose pages have complete backups elsewhere (with UnsafeLease its
// client goes on). It reports whether it started one.
func (s *Sim) startPartition() bool {
	var cand []ids.NodeID
	alive := 0
	for _, n := range s.nodes[1:] {
		if !n.alive {
			continue
		}
		alive++
		if n.client != nil || n.mstate != 0 || s.draining[n.id] || s.tainted[n.id] || !s.movable(n.id) {
			continue
		}
		cand = append(cand, n.id)
	}
	if alive < 4 || len(cand) == 0 {
		return false
	}
	z := cand[s.rng.Intn(len(cand))]
	s.partitions++
	s.suspendee = z
	s.partIn = 3 + s.rng.Intn(30)
	if !s.Opts.UnsafeLease {
		s.nodes[z].suspended = true
		s.tracef("partition %v: its lease ends, its clients stop; its engine runs on", z)
	} else {
		s.tracef("partition %v: its lease is not honoured (UnsafeLease), its clients go on", z)
	}
	return true
}

// laterTenure reports whether a live node other than x holds page p in M
// or claims its tenure at a version after v.
func (s *Sim) laterTenure(p ids.PageNo, x ids.NodeID, v uint16) bool {
	for _, n := range s.nodes[1:] {
		if info := n.sm.Page(p); n.alive && n.id != x && info.Tenure && int16(info.Version-v) > 0 {
			return true
		}
	}
	return false
}

// movable reports whether every page node id homes has a complete backup
// to move to (its removal moves them there, as a failure verdict does).
func (s *Sim) movable(id ids.NodeID) bool {
	for p, sl := range s.slots {
		if sl.home == id && s.promotableBut(p, id) == ids.None {
			return false
		}
	}
	return true
}

// drivePartition counts the partition under way down: the removal, then
// the heal. It reports whether it took a step.
func (s *Sim) drivePartition() bool {
	if s.partIn > 0 {
		s.partIn--
		return false
	}
	z := s.suspendee
	n := s.nodes[z]
	if !n.zombie {
		if s.reconf >= 0 || len(s.promote) > 0 || !s.movable(z) {
			return false // one reconfiguration at a time; fills first
		}
		s.removeZombie(z)
		s.partIn = 30 + s.rng.Intn(300)
		return true
	}
	s.heal(z)
	return true
}

// removeZombie takes node z out of the members while it lives on. The
// pages it homes move to a complete backup, as from a live home whose
// node layer never stamps the slot it leaves (it learns nothing): lagging
// members' verbs of every kind may land there until they learn the epoch.
func (s *Sim) removeZombie(z ids.NodeID) {
	n := s.nodes[z]
	// Pages it homes and holds: undecided between their home copy and its
	// last write until the new home rebuilds them (settle): its release
	// writes the backups first, the new home's slot among them, unless
	// that home has fenced it.
	held := map[ids.PageNo][][]byte{}
	for _, p := range slices.Sorted(maps.Keys(s.slots)) {
		sl := s.slots[p]
		if sl.home == z {
			s.promote[p] = s.promotableBut(p, z)
			s.stats.ZombieHomes++
			// Its own word names it, or it claims the tenure and no
			// other live node claims a later one (a word it has not
			// rebuilt yet: a stamp). A release of its own whose CAS
			// landed before another node took the page does not count;
			// a stale claim of another node, whose release a move
			// interrupted, does not hide its own.
			info := n.sm.Page(p)
			if home := sl.data(s.Opts.PageSize); (sl.word().Holder() == z || info.Tenure && !s.laterTenure(p, z, info.Version)) && !bytes.Equal(home, s.ref[p]) {
				held[p] = [][]byte{slices.Clone(home), slices.Clone(s.ref[p])}
			}
			continue
		}
		// As for a crash: the word names it, or it claims the tenure of
		// a page frozen or moved to a home it has not learnt of.
		if info := n.sm.Page(p); sl.word().Holder() == z || info.Tenure && (info.Frozen || n.placed[p] != sl.home) {
			home := slices.Clone(sl.data(s.Opts.PageSize))
			if !bytes.Equal(home, s.ref[p]) {
				// Its release goes to the home it knows: the slot a
				// move from a live home left behind, if it lags.
				at := sl
				if bh := n.placed[p]; bh != sl.home && s.former[p][bh] {
					if fs, ok := s.bslots[p][bh]; ok {
						at = fs
					}
				}
				s.zundecided[p] = zombieCands{z: z, cands: [][]byte{home, slices.Clone(s.ref[p])}, at: at}
				s.tracef("%v held %v: its data is its home copy %v or the zombie's %v", z, p, home, s.ref[p])
			}
		}
	}
	n.alive = false
	n.zombie = true
	n.suspended = false
	s.lagging = slices.DeleteFunc(s.lagging, func(x ids.NodeID) bool { return x == z })
	if s.csOwner == z {
		s.csOwner = ids.None
	}
	s.zombieAt[z] = s.epoch + 1
	s.tracef("remove %v: departed for the members, alive behind the partition", z)
	s.reconfigure(s.Opts.AsyncReconfig)
	// Gone only now: the moves above are from a home that lives on. It
	// owes no stamp (it learns nothing of the move) and is nobody's
	// backup (refill dropped it).
	s.gone[z] = true
	for _, p := range slices.Sorted(maps.Keys(held)) {
		for _, c := range held[p] {
			if !slices.ContainsFunc(s.undecided[p], func(u []byte) bool { return bytes.Equal(u, c) }) {
				s.undecided[p] = append(s.undecided[p], c)
			}
		}
		s.tracef("%v homed and held %v: its data is decided when its new home rebuilds it: one of %v", z, p, s.undecided[p])
	}
}

// heal ends the zombie: it learns it was removed and closes (its batches
// still in the network fail), and a new incarnation joins at the next
// reconfiguration.
func (s *Sim) heal(z ids.NodeID) {
	n := s.nodes[z]
	n.zombie = false
	n.client = nil
	n.mstate = 0
	s.net.Crash(z)
	s.suspendee = ids.None
	s.stats.Partitions++
	s.tracef("heal %v: it learns it was removed and closes; a new incarnation joins", z)
	if len(s.nodes)-1+s.toJoin < s.Opts.Nodes+s.Opts.Joins+s.Opts.Restarts+s.Opts.Partitions {
		s.toJoin++
		if s.reconf < 0 {
			s.reconf = 5 + s.rng.Intn(60)
		}
	}
}

// fenceZombies fences, at node n, every zombie removed in an epoch n has
// learnt.
func (s *Sim) fenceZombies(n *simNode) {
	for z, e := range s.zombieAt {
		if n.learnt >= e && !n.ep.Fences(z) {
			n.ep.Fence(z)
			s.tracef("%v fences %v", n.id, z)
		}
	}
}

// noteZombieBatch counts a batch of a removed node about to be delivered.
func (s *Sim) noteZombieBatch(d *mem.Delivery) {
	if d.Kind != mem.BatchDelivery || !s.nodes[d.From].zombie {
		return
	}
	if to := s.nodes[d.To]; to.ep.Fences(d.From) {
		s.stats.ZombieFenced++
	} else {
		s.stats.ZombieVerbs++
	}
}

// settleZombie decides the data of page p, held by a removed node, once
// the word of its home at the removal no longer names it (the node's
// release, or the home's repair). If the page has moved away from that
// home since and the old slot was stamped (or its node is gone), the
// release cannot land there any more: the page's current home decides,
// once its word no longer names the node.
func (s *Sim) settleZombie(p ids.PageNo) {
	zc, ok := s.zundecided[p]
	if !ok {
		return
	}
	sl := zc.at
	if w := sl.word(); s.gone[sl.home] || w.Holder() == coherence.NotHome {
		sl = s.slots[p]
	}
	w := sl.word()
	if s.gone[sl.home] || w == 0 || w.Holder() == zc.z || w.Holder() == coherence.NotHome {
		return
	}
	if h := w.Holder(); h != ids.None {
		// Another node holds the page: its copy, not the slot, is the
		// data. A copy equal to a candidate decides (a tenure given
		// back by a rebuild, no request needed); one that a request
		// already wrote is decided by that request (decideByAccess).
		if int(h) >= len(s.nodes) || !s.nodes[h].alive {
			return
		}
		state, data := s.nodes[h].sm.Copy(p)
		if state != coherence.Modified {
			return
		}
		if i := slices.IndexFunc(zc.cands, func(c []byte) bool { return bytes.Equal(c, data) }); i >= 0 {
			s.decideZombie(p, i, fmt.Sprintf("at its holder %v", h))
		}
		return
	}
	data := sl.data(s.Opts.PageSize)
	if i := slices.IndexFunc(zc.cands, func(c []byte) bool { return bytes.Equal(c, data) }); i >= 0 {
		s.decideZombie(p, i, fmt.Sprintf("at %v", sl.home))
		return
	}
	delete(s.zundecided, p)
	s.fail("partition: the home %v made %v the data of %v, neither its copy nor the zombie %v's write: %v", sl.home, data, p, zc.z, zc.cands)
}

// decideByAccess decides page r.Page, still undecided since a zombie held
// it, by the copy that node n's completed request c used: an access
// served before the word the zombie releases to stopped naming it
// (through a home that moved away and lags, for one).
func (s *Sim) decideByAccess(n *simNode, r coherence.Request, c coherence.Completion) {
	zc, ok := s.zundecided[r.Page]
	if !ok {
		return
	}
	i, ok := s.usedCandidate(n, r, c, zc.cands)
	if !ok {
		return
	}
	if i < 0 {
		delete(s.zundecided, r.Page)
		_, data := n.sm.Copy(r.Page)
		s.fail("partition: %v's %v of %v used %v, neither the home copy nor the zombie %v's write: %v", n.id, r.Op, r.Page, data, zc.z, zc.cands)
		return
	}
	s.decideZombie(r.Page, i, fmt.Sprintf("by %v's %v", n.id, r.Op))
}

// decideZombie makes candidate i of page p, undecided since a zombie held
// it, the page's data; how says what decided it.
func (s *Sim) decideZombie(p ids.PageNo, i int, how string) {
	c := s.zundecided[p].cands[i]
	delete(s.zundecided, p)
	copy(s.ref[p], c)
	if i == 1 {
		s.stats.ZombieReleases++
	}
	s.tracef("%v: its data is decided %s: %v (%s)", p, how, c, []string{"the home copy", "the zombie's write"}[i])
}

// usedCandidate finds which of cands the copy of node n's completed
// request c was, before the request: but for the word the request wrote,
// the copy must equal it, and the word's old value (a load's, an add's,
// a CAS's) chooses between candidates that differ only there. When n
// holds no copy any more (given up as the request completed), the old
// value alone chooses, if exactly one candidate has it. It reports false
// when nothing can judge, and -1 when none matches.
func (s *Sim) usedCandidate(n *simNode, r coherence.Request, c coherence.Completion, cands [][]byte) (int, bool) {
	word := func(b []byte) uint64 { return binary.LittleEndian.Uint64(b[r.Offset:]) }
	state, data := n.sm.Copy(r.Page)
	if state == coherence.Invalid {
		if r.Op == coherence.OpStore {
			return 0, false
		}
		found := -1
		for i, cand := range cands {
			if word(cand) == c.Value {
				if found >= 0 {
					return 0, false // two candidates agree there
				}
				found = i
			}
		}
		return found, true
	}
	for i, cand := range cands {
		same := bytes.Equal(cand[:r.Offset], data[:r.Offset]) && bytes.Equal(cand[r.Offset+8:], data[r.Offset+8:])
		if same && (r.Op == coherence.OpStore || word(cand) == c.Value) {
			return i, true
		}
	}
	return -1, true
}
