package sim

import (
	"bytes"
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
// joins under a new id.
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

// startPartition suspends a live node that homes no page and has no
// request under way (with UnsafeLease its client goes on). It reports
// whether it started one.
func (s *Sim) startPartition() bool {
	var cand []ids.NodeID
	alive := 0
	for _, n := range s.nodes[1:] {
		if !n.alive {
			continue
		}
		alive++
		if n.client != nil || n.mstate != 0 || s.draining[n.id] || s.tainted[n.id] || s.homesAny(n.id) || s.Opts.Fills && !s.mayLose(n.id) {
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

// homesAny reports whether node id is the home of a page.
func (s *Sim) homesAny(id ids.NodeID) bool {
	for _, sl := range s.slots {
		if sl.home == id {
			return true
		}
	}
	return false
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
		if s.reconf >= 0 {
			return false // one reconfiguration at a time
		}
		s.removeZombie(z)
		s.partIn = 30 + s.rng.Intn(300)
		return true
	}
	s.heal(z)
	return true
}

// removeZombie takes node z out of the members while it lives on.
func (s *Sim) removeZombie(z ids.NodeID) {
	n := s.nodes[z]
	for _, p := range slices.Sorted(maps.Keys(s.slots)) {
		sl := s.slots[p]
		// As for a crash: the word names it, or it claims the tenure of
		// a page frozen or moved to a home it has not learnt of.
		if info := n.sm.Page(p); sl.word().Holder() == z || info.Tenure && (info.Frozen || n.placed[p] != sl.home) {
			home := slices.Clone(sl.data(s.Opts.PageSize))
			if !bytes.Equal(home, s.ref[p]) {
				s.zundecided[p] = zombieCands{z: z, cands: [][]byte{home, slices.Clone(s.ref[p])}, at: sl}
				s.tracef("%v held %v: its data is its home copy %v or the zombie's %v", z, p, home, s.ref[p])
			}
		}
	}
	n.alive = false
	n.zombie = true
	n.suspended = false
	s.gone[z] = true
	s.lagging = slices.DeleteFunc(s.lagging, func(x ids.NodeID) bool { return x == z })
	if s.csOwner == z {
		s.csOwner = ids.None
	}
	s.zombieAt[z] = s.epoch + 1
	s.tracef("remove %v: departed for the members, alive behind the partition", z)
	s.reconfigure(s.Opts.AsyncReconfig)
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
	delete(s.zundecided, p)
	data := sl.data(s.Opts.PageSize)
	for i, c := range zc.cands {
		if bytes.Equal(c, data) {
			copy(s.ref[p], data)
			if i == 1 {
				s.stats.ZombieReleases++
			}
			s.tracef("%v: its data is decided at %v: %v (%s)", p, sl.home, data, []string{"the home copy", "the zombie's write"}[i])
			return
		}
	}
	s.fail("partition: the home %v made %v the data of %v, neither its copy nor the zombie %v's write: %v", sl.home, data, p, zc.z, zc.cands)
}
