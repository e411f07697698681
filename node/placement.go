package node

import (
	"cmp"
	"slices"
	"sync"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
)

// The placement of a region's pages in the data plane, as dsmd computes it
// from a directory view (docs/failover.md §5, §6 and §7, "the daemon").
//
// Every shard has a chain of incarnations (as protocol ids). It begins
// with the region's homes at its creation (at their incarnations then), in
// rendezvous order for the shard; then come every incarnation that joined
// since (a new node, or a restart), in the order they joined. The first
// 1+Backups members are complete from the start (the creation chain of
// the step before fills); every later one is a replacement, complete only
// once its home has filled it.
//
// The backups of a shard are the first Backups usable members after its
// home: not departed, never declared failed since the region's creation.
// A release writes every page's data and stamp to them before it releases
// the tenure at the home, so a replacement that enters the backups is
// written by every release from then on, and its home fills it with the
// pages released before (coherence.Fill, fills.go). Once every populated
// page is copied, the home records it complete in the directory
// (directory.FillRecord).
//
// When the home departs (restarted or left: its process, and its memory,
// are gone), the shard moves to the first member after it in the chain
// that was complete at that moment: not departed, and either one of the
// first 1+Backups never declared failed by then, or a replacement whose
// completeness record was committed before the departure and that was not
// declared failed after its fills began. The walk repeats for a new home
// that departs later. A shard with no complete member left stays at its
// departed home: its pages are lost, and calls on them fail with the
// home's reason.
//
// Why a record stays true: a member after the home leaves the backups only
// by departing, by a failure verdict (both checked), or when the home
// moves past it (it is then before the home, and the walk never looks
// back). Joiners go to the end of every chain, and the members ahead of a
// backup only leave, so nobody pushes a backup out of the first Backups.
// The price: a new node is a backup only once the members before it are
// gone (joins that win shards are docs/failover.md §6's promotion).
//
// The placement is a function of one view, so every node computes the
// same one for the same protocol epoch, whichever views it skipped: the
// chains depend on the incarnations given out, the backups on departures
// and failure verdicts, and the homes on departures, verdicts and the
// records committed before each departure. Each of those but the records
// moves the protocol epoch (protoMap.epoch), and a record counts only for
// departures after it, each of which moves it.

// regionChains is the placement of one region: its chains, per shard,
// computed on demand.
type regionChains struct {
	r      directory.Region
	nodes  []ids.NodeID // the homes at creation (node ids)
	protos map[ids.NodeID]ids.NodeID
	length int // of the complete prefix: 1+Backups, at most len(nodes)
	k      int // backups per shard

	mu     sync.Mutex
	chains map[uint64]chainEntry // by shard index, up to maxCachedChains
}

// chainEntry is one shard's chain for the incarnations of gen.
type chainEntry struct {
	gen ids.Epoch
	c   []ids.NodeID
}

// maxCachedChains bounds the chains a region keeps computed.
const maxCachedChains = 1 << 16

func newRegionChains(r directory.Region, homeProtos []ids.NodeID) *regionChains {
	rc := &regionChains{r: r, nodes: slices.Clone(r.Homes), protos: make(map[ids.NodeID]ids.NodeID, len(r.Homes)),
		chains: map[uint64]chainEntry{}}
	for i, h := range r.Homes {
		rc.protos[h] = homeProtos[i]
	}
	k := r.Backups
	if k == 0 {
		k = directory.DefaultBackups
	}
	rc.k = k
	rc.length = min(1+k, len(r.Homes))
	return rc
}

// baseChain is the region's homes at creation in shard s's rendezvous
// order, as protocol ids.
func (rc *regionChains) baseChain(s placement.Shard) []ids.NodeID {
	ns := placement.Rank(s, rc.nodes, len(rc.nodes))
	c := make([]ids.NodeID, len(ns))
	for i, n := range ns {
		c[i] = rc.protos[n]
	}
	return c
}

// chain is the chain of shard s under ev, as protocol ids, and the
// length of its complete prefix (1+Backups). The caller must not modify
// it.
func (rc *regionChains) chain(s placement.Shard, ev eventsOf) (c []ids.NodeID, base int) {
	gen, ins := ev.incarnations()
	rc.mu.Lock()
	e, ok := rc.chains[s.Index]
	rc.mu.Unlock()
	if ok && e.gen == gen {
		return e.c, min(rc.length, len(e.c))
	}
	c = rc.baseChain(s)
	base = min(rc.length, len(c))
	type cand struct {
		joined ids.Epoch
		score  uint64
		in     protoInc
	}
	var later []cand
	for _, in := range ins {
		if slices.Contains(c, in.proto) {
			continue
		}
		if d := ev.departedAt(in.proto); d != 0 && d <= rc.r.Epoch {
			continue // gone before the region existed
		}
		later = append(later, cand{in.joined, placement.Score(s, in.node), in})
	}
	slices.SortFunc(later, func(a, b cand) int {
		switch {
		case a.joined != b.joined:
			return cmp.Compare(a.joined, b.joined)
		case a.score != b.score:
			return -cmp.Compare(a.score, b.score)
		case a.in.node != b.in.node:
			return cmp.Compare(a.in.node, b.in.node)
		}
		return cmp.Compare(a.in.inc, b.in.inc)
	})
	for _, x := range later {
		c = append(c, x.in.proto)
	}
	if gen != 0 {
		rc.mu.Lock()
		if len(rc.chains) < maxCachedChains || ok {
			rc.chains[s.Index] = chainEntry{gen, c}
		}
		rc.mu.Unlock()
	}
	return c, base
}

// protoInc names one incarnation: its protocol id, node and number, and
// the directory epoch in which it joined (0: unknown, before every region).
type protoInc struct {
	proto, node ids.NodeID
	inc         uint64
	joined      ids.Epoch
}

// eventsOf are what the placement needs to know of the protocol ids, in
// directory epochs: when each departed (0: never), whether it was
// declared failed in an epoch after `after` and up to upTo (when unsure,
// it says yes), every incarnation given out (gen names that set: equal
// gens, equal sets; 0 for none), and the completeness records of a
// region.
type eventsOf interface {
	departedAt(p ids.NodeID) ids.Epoch
	failedBetween(p ids.NodeID, after, upTo ids.Epoch) bool
	incarnations() (gen ids.Epoch, ins []protoInc)
	fillRecords(r ids.RegionID) []directory.FillRecord
}

// never is an epoch after every other.
const never = ids.Epoch(^uint64(0))

// completeAt reports whether c[j] (base: the length of the chain's
// complete prefix) held every release of shard s up to epoch d,
// exclusive: it had not departed by d, and either it is of the complete
// prefix and was not declared failed since the region's creation, or a
// completeness record committed before d covers s and it was not declared
// failed after that record's fills began.
func (rc *regionChains) completeAt(c []ids.NodeID, base, j int, s placement.Shard, d ids.Epoch, ev eventsOf) bool {
	b := c[j]
	if dj := ev.departedAt(b); dj != 0 && dj <= d {
		return false
	}
	if j < base {
		return !ev.failedBetween(b, rc.r.Epoch, d)
	}
	for _, f := range ev.fillRecords(rc.r.ID) {
		if f.Proto == b && f.At < d && f.Covers(s.Index) && !ev.failedBetween(b, f.Since, d) {
			return true
		}
	}
	return false
}

// homeIndex walks chain c of shard s (its first base members the creation
// chain) through the departures of ev and returns the index of the shard's
// home now. A failure verdict before the region's creation does not
// count: the node was alive again when the region was created (its chain
// holds only the members alive then), and has had every release of it.
func (rc *regionChains) homeIndex(c []ids.NodeID, base int, s placement.Shard, ev eventsOf) int {
	cur := 0
	for {
		d := ev.departedAt(c[cur])
		if d == 0 {
			return cur
		}
		next := -1
		for j := cur + 1; j < len(c); j++ {
			if rc.completeAt(c, base, j, s, d, ev) {
				next = j
				break
			}
		}
		if next < 0 {
			return cur // no complete copy left: the shard is lost
		}
		cur = next
	}
}

// place returns the chain of shard s, the length of its creation chain
// and the index of its home in it under ev (c is empty for a region
// without homes).
func (rc *regionChains) place(s placement.Shard, ev eventsOf) (c []ids.NodeID, base, home int) {
	c, base = rc.chain(s, ev)
	if len(c) == 0 {
		return c, 0, 0
	}
	return c, base, rc.homeIndex(c, base, s, ev)
}

// shardHome is the home of shard s under ev.
func (rc *regionChains) shardHome(s placement.Shard, ev eventsOf) ids.NodeID {
	c, _, hi := rc.place(s, ev)
	if len(c) == 0 {
		return ids.None
	}
	return c[hi]
}

// backupIndexes are the indexes in c of the backups of a shard whose home
// is c[hi]: the first k usable members after it.
func (rc *regionChains) backupIndexes(c []ids.NodeID, hi int, ev eventsOf) []int {
	var out []int
	for j := hi + 1; j < len(c) && len(out) < rc.k; j++ {
		if rc.usable(c[j], ev) {
			out = append(out, j)
		}
	}
	return out
}

// shardBackups are the backups of shard s under ev: the first Backups
// members of its chain after its home that have not departed and were
// never declared failed since the region's creation, complete or not.
func (rc *regionChains) shardBackups(s placement.Shard, ev eventsOf) []ids.NodeID {
	c, _, hi := rc.place(s, ev)
	if len(c) == 0 {
		return nil
	}
	var out []ids.NodeID
	for _, j := range rc.backupIndexes(c, hi, ev) {
		out = append(out, c[j])
	}
	return out
}

// completeBackups counts the backups of shard s under ev that are
// complete now, and returns the others (those a fill must complete).
func (rc *regionChains) completeBackups(s placement.Shard, ev eventsOf) (complete int, incomplete []ids.NodeID) {
	c, base, hi := rc.place(s, ev)
	for _, j := range rc.backupIndexes(c, hi, ev) {
		if rc.completeAt(c, base, j, s, never, ev) {
			complete++
		} else {
			incomplete = append(incomplete, c[j])
		}
	}
	return complete, incomplete
}

// usable reports whether b can be a backup of the region: it has not
// departed, and no failure verdict since the region's creation dropped it
// (it may have missed releases, and the protocol epoch does not move when
// it comes back: it stays out until it restarts, as a new incarnation).
func (rc *regionChains) usable(b ids.NodeID, ev eventsOf) bool {
	return ev.departedAt(b) == 0 && !ev.failedBetween(b, rc.r.Epoch, never)
}

// complete reports whether member b of a creation chain still holds every
// release of the region: it has not departed, and no failure verdict since
// the region's creation dropped it from the backups.
func (rc *regionChains) complete(b ids.NodeID, ev eventsOf) bool {
	return rc.usable(b, ev)
}

// homeOf and backupsOf are the placement of the region's pages under ev.
func (rc *regionChains) homeOf(ev eventsOf) func(ids.PageNo) ids.NodeID {
	if !rc.anyDeparted(ev) {
		// Every shard at the first of its chain: no chain is built.
		return func(p ids.PageNo) ids.NodeID { return rc.protos[placement.Home(rc.r.ShardOf(p), rc.nodes)] }
	}
	return func(p ids.PageNo) ids.NodeID { return rc.shardHome(rc.r.ShardOf(p), ev) }
}

func (rc *regionChains) backupsOf(ev eventsOf) func(ids.PageNo) []ids.NodeID {
	return func(p ids.PageNo) []ids.NodeID { return rc.shardBackups(rc.r.ShardOf(p), ev) }
}

// maxExactTargets bounds the shards whose homes are compared one by one to
// find the targets of a move; a larger region names every chain member
// still there as a possible target (each one then answers every member's
// count, and nothing else changes).
const maxExactTargets = 1 << 16

// targets are the new homes, under now, of the shards whose home differs
// from the one under last and is still there (nil: nothing moved).
func (rc *regionChains) targets(last, now eventsOf) []ids.NodeID {
	if !rc.anyDeparted(now) {
		return nil
	}
	var out []ids.NodeID
	add := func(h ids.NodeID) {
		if !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	n := rc.r.Shards()
	if n > maxExactTargets {
		_, ins := now.incarnations()
		for _, in := range ins {
			if now.departedAt(in.proto) == 0 {
				add(in.proto)
			}
		}
		for _, p := range rc.protos {
			if now.departedAt(p) == 0 {
				add(p)
			}
		}
	} else {
		for i := range n {
			s := placement.Shard{Region: rc.r.ID, Index: i}
			// A shard whose new home departed too is lost, not moved:
			// no target (coherence: the page's home is no member).
			if h := rc.shardHome(s, now); h != rc.shardHome(s, last) && h != ids.None && now.departedAt(h) == 0 {
				add(h)
			}
		}
	}
	slices.Sort(out)
	return out
}

// homedAt counts the shards whose home under ev is protocol id p, or
// returns -1 for a region of more than maxExactTargets shards (too many to
// place one by one on every epoch).
func (rc *regionChains) homedAt(p ids.NodeID, ev eventsOf) int {
	n := rc.r.Shards()
	if n > maxExactTargets {
		return -1
	}
	c := 0
	for i := range n {
		if rc.shardHome(placement.Shard{Region: rc.r.ID, Index: i}, ev) == p {
			c++
		}
	}
	return c
}

// anyEvent reports whether a home at the region's creation departed, or
// failed since, under ev (otherwise every shard is at the first of its
// chain, with all its backups).
func (rc *regionChains) anyEvent(ev eventsOf) bool {
	for _, p := range rc.protos {
		if !rc.complete(p, ev) {
			return true
		}
	}
	return false
}

// anyDeparted reports whether a home at the region's creation departed
// under ev (otherwise every shard is at the first of its chain).
func (rc *regionChains) anyDeparted(ev eventsOf) bool {
	for _, p := range rc.protos {
		if ev.departedAt(p) != 0 {
			return true
		}
	}
	return false
}

// noEvents is a view in which nothing departed or failed and nobody
// joined: every shard at the first of its chain.
type noEvents struct{}

func (noEvents) departedAt(ids.NodeID) ids.Epoch                     { return 0 }
func (noEvents) failedBetween(ids.NodeID, ids.Epoch, ids.Epoch) bool { return false }
func (noEvents) incarnations() (ids.Epoch, []protoInc)               { return 0, nil }
func (noEvents) fillRecords(ids.RegionID) []directory.FillRecord     { return nil }
