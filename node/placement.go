package node

import (
	"slices"
	"sync"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
)

// The placement of a region's pages in the data plane, as dsmd computes it
// from a directory view (docs/failover.md §5 and §7, "the daemon").
//
// Every shard has a chain: the region's homes at its creation (at their
// incarnations then, as protocol ids), in rendezvous order for the shard,
// cut to 1+Backups. The first is the shard's home; a release writes every
// page's data and stamp to the others (its backups) before it releases the
// tenure at the home. When the home departs (restarted or left: its
// process, and its memory, are gone), the shard moves to the next member of
// the chain that was a complete backup at that moment: not departed, and
// never declared failed by then (a failed incarnation was dropped from the
// backups when it failed, and may have missed writes since). The walk
// repeats for a new home that departs later. A shard with no complete
// backup left stays at its departed home: its pages are lost, and calls on
// them fail with the home's reason.
//
// The placement is a function of one view (the departure and failure
// epochs the directory records), so every node computes the same one for
// the same protocol epoch, whichever views it skipped. Nodes that joined
// after the region's creation, or restarted since, are members of its
// protocol but never homes or backups: filling a new copy is not built
// (docs/failover.md §6), so they could never be complete.

// regionChains is the placement of one region: its chains, per shard,
// computed on demand.
type regionChains struct {
	r      directory.Region
	nodes  []ids.NodeID // the homes at creation (node ids)
	protos map[ids.NodeID]ids.NodeID
	length int // 1+Backups, at most len(nodes)

	mu     sync.Mutex
	chains map[uint64][]ids.NodeID // by shard index, up to maxCachedChains
}

// maxCachedChains bounds the chains a region keeps computed.
const maxCachedChains = 1 << 16

func newRegionChains(r directory.Region, homeProtos []ids.NodeID) *regionChains {
	rc := &regionChains{r: r, nodes: slices.Clone(r.Homes), protos: make(map[ids.NodeID]ids.NodeID, len(r.Homes)),
		chains: map[uint64][]ids.NodeID{}}
	for i, h := range r.Homes {
		rc.protos[h] = homeProtos[i]
	}
	k := r.Backups
	if k == 0 {
		k = directory.DefaultBackups
	}
	rc.length = min(1+k, len(r.Homes))
	return rc
}

// chain is the chain of shard s, as protocol ids. The caller must not
// modify it.
func (rc *regionChains) chain(s placement.Shard) []ids.NodeID {
	rc.mu.Lock()
	c, ok := rc.chains[s.Index]
	rc.mu.Unlock()
	if ok {
		return c
	}
	ns := placement.Rank(s, rc.nodes, rc.length)
	c = make([]ids.NodeID, len(ns))
	for i, n := range ns {
		c[i] = rc.protos[n]
	}
	rc.mu.Lock()
	if len(rc.chains) < maxCachedChains {
		rc.chains[s.Index] = c
	}
	rc.mu.Unlock()
	return c
}

// eventsOf are what the placement needs to know of the protocol ids, in
// directory epochs: when each departed (0: never), and whether it was
// declared failed in an epoch after `after` and up to upTo (when unsure,
// it says yes).
type eventsOf interface {
	departedAt(p ids.NodeID) ids.Epoch
	failedBetween(p ids.NodeID, after, upTo ids.Epoch) bool
}

// never is an epoch after every other.
const never = ids.Epoch(^uint64(0))

// homeIndex walks chain c, of a region created in epoch created, through
// the departures of ev and returns the index of the shard's home now. A
// failure verdict before the region's creation does not count: the node
// was alive again when the region was created (its chain holds only the
// members alive then), and has had every release of it.
func homeIndex(c []ids.NodeID, created ids.Epoch, ev eventsOf) int {
	cur := 0
	for {
		d := ev.departedAt(c[cur])
		if d == 0 {
			return cur
		}
		next := -1
		for j := cur + 1; j < len(c); j++ {
			if dj := ev.departedAt(c[j]); dj != 0 && dj <= d {
				continue // gone by then
			}
			if ev.failedBetween(c[j], created, d) {
				continue // not complete by then
			}
			next = j
			break
		}
		if next < 0 {
			return cur // no complete copy left: the shard is lost
		}
		cur = next
	}
}

// place returns the chain of shard s and the index of its home in it
// under ev (c is empty for a region without homes).
func (rc *regionChains) place(s placement.Shard, ev eventsOf) (c []ids.NodeID, home int) {
	c = rc.chain(s)
	if len(c) == 0 {
		return c, 0
	}
	return c, homeIndex(c, rc.r.Epoch, ev)
}

// shardHome is the home of shard s under ev.
func (rc *regionChains) shardHome(s placement.Shard, ev eventsOf) ids.NodeID {
	c, hi := rc.place(s, ev)
	if len(c) == 0 {
		return ids.None
	}
	return c[hi]
}

// shardBackups are the backups of shard s under ev: the members of its
// chain after its home that have not departed and were never declared
// failed since the region's creation.
func (rc *regionChains) shardBackups(s placement.Shard, ev eventsOf) []ids.NodeID {
	c, hi := rc.place(s, ev)
	if len(c) == 0 {
		return nil
	}
	var out []ids.NodeID
	for _, b := range c[hi+1:] {
		if rc.complete(b, ev) {
			out = append(out, b)
		}
	}
	return out
}

// complete reports whether chain member b still holds every release of
// the region: it has not departed, and no failure verdict since the
// region's creation dropped it from the backups.
func (rc *regionChains) complete(b ids.NodeID, ev eventsOf) bool {
	return ev.departedAt(b) == 0 && !ev.failedBetween(b, rc.r.Epoch, never)
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

// noEvents is a view in which nothing departed or failed: every shard at
// the first of its chain.
type noEvents struct{}

func (noEvents) departedAt(ids.NodeID) ids.Epoch                     { return 0 }
func (noEvents) failedBetween(ids.NodeID, ids.Epoch, ids.Epoch) bool { return false }
