package node

import (
	"errors"
	"slices"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/node/pagestore"
)

// A node's page store holds the pages of the durable shards it persisted
// as their home or backup (persist.go). When it no longer backs a shard
// (a promotion demoted it out of the replica set, a joiner took its
// place, or a previous incarnation backed the shard and this one does
// not), nothing reads those pages again: only a node complete for a shard
// when it is lost loads it back (placement.go, lose; docs/durability.md
// §4), and a node that enters the set again is filled, and its fill
// persists. So they are deleted (docs/durability.md §3, "the replica-set
// cleanup"); without it a store kept every shard it ever held until its
// region was deleted, and a cluster that rebalanced filled its disks with
// copies nobody would read.
//
// Kept: the shards that are lost (their home departed with no complete
// member left: this store may be the one that brings them back), all of
// them while this incarnation departs, and the shards of regions of more
// than maxExactTargets shards, which are not placed one by one.

// backs says whether incarnation self is shard s's home or in its replica
// set under ev, and whether the shard is lost.
func (rc *regionChains) backs(s placement.Shard, self ids.NodeID, ev eventsOf) (backed, lost bool) {
	sp := rc.place(s, ev)
	if len(sp.c) == 0 {
		return false, false
	}
	if sp.lostAt != 0 {
		return false, true
	}
	return sp.c[sp.hi] == self || slices.Contains(sp.set, self), false
}

// cleanStore deletes, on a goroutine of its own, the pages of the shards
// of durable region re that self backed under last and does not back
// under pm (storeLeft, dropLeft): the walk of the shards is not paid on
// the path that applies the view.
func (es *engines) cleanStore(re *regionEngine, last, pm *protoMap, self ids.NodeID) {
	if re.region.Durability != directory.DurabilitySynced || es.n.persist == nil {
		return
	}
	go func() {
		if shards := es.storeLeft(re, last, pm, self); len(shards) > 0 {
			es.dropLeft(re, shards)
		}
	}()
}

// storeLeft lists the shards of durable region re that incarnation self
// backed under last and does not back under pm, neither lost: those whose
// pages its store holds for nobody. With last nil (the engine's first
// view, at its start), every shard it does not back: a previous
// incarnation of this node may have backed it.
func (es *engines) storeLeft(re *regionEngine, last, pm *protoMap, self ids.NodeID) []uint64 {
	r := re.region
	if r.Durability != directory.DurabilitySynced || es.n.persist == nil || pm.departedAt(self) != 0 || r.Shards() > maxExactTargets {
		return nil
	}
	var out []uint64
	for i := range r.Shards() {
		s := placement.Shard{Region: r.ID, Index: i}
		if now, lost := re.chains.backs(s, self, pm); now || lost {
			continue
		}
		if last != nil {
			if before, lost := re.chains.backs(s, self, last); !before || lost {
				continue
			}
		}
		out = append(out, i)
	}
	return out
}

// dropLeft deletes from the page store the pages of those of shards
// (storeLeft's) that this node still does not back in the latest view,
// one synced range delete per run of shards, one cleanup at a time per
// region. A fill that puts this node back in a
// shard's set writes the store only after its engine has taken the view
// that does it (a home fills a member only once it has acknowledged the
// epoch, and persists after the fill), so the check against the latest
// view and the deletes, together under the store's write order
// (persister.wmu), never delete what such a fill wrote.
func (es *engines) dropLeft(re *regionEngine, shards []uint64) {
	re.dropRun.Lock()
	defer re.dropRun.Unlock()
	ps := es.n.persist
	r := re.region
	per := r.PagesPerShard()
	// Which of them hold pages (a new incarnation's store mostly holds
	// none of those it does not back): only the log and the metric use
	// it, so it is read before the lock that every persist write takes.
	held := map[uint64]bool{}
	for _, i := range shards {
		if storeHolds(ps.store, r.ID, i*per, min((i+1)*per, r.Pages())) {
			held[i] = true
		}
	}
	self := ids.NodeID(es.self.Load())
	ps.wmu.Lock()
	defer ps.wmu.Unlock()
	pm := es.pv.p.Load()
	if pm == nil || pm.departedAt(self) != 0 || es.n.ctx.Err() != nil {
		return // departing, or the node stops: nothing to clean for
	}
	var ranges []directory.ShardRange
	gone := map[uint64]bool{}
	for _, i := range shards {
		if now, lost := re.chains.backs(placement.Shard{Region: r.ID, Index: i}, self, pm); now || lost {
			continue
		}
		gone[i] = true
		if n := len(ranges); n > 0 && ranges[n-1].End == i {
			ranges[n-1].End++
		} else {
			ranges = append(ranges, directory.ShardRange{First: i, End: i + 1})
		}
	}
	// The delete goes to every shard, ordered after any write queued
	// before it, whether or not it held pages when counted.
	for _, sr := range ranges {
		if err := ps.store.DeleteRange(r.ID, sr.First*per, min(sr.End*per, r.Pages())); err != nil {
			es.log.Warn("page store: pages of shards this node no longer backs not deleted (they stay, unread, until the region is deleted)",
				"region", r.Name, "shards", sr, "err", err)
			return
		}
	}
	// A later copy of these pages is a new write, whatever its sequence
	// number says.
	for k := range ps.latest {
		if k.r == r.ID && gone[uint64(k.no)/per] {
			delete(ps.latest, k)
		}
	}
	var dropped []uint64
	for _, i := range shards {
		if gone[i] && held[i] {
			dropped = append(dropped, i)
		}
	}
	if len(dropped) == 0 {
		return
	}
	es.n.stats.storeShardsDropped.Add(uint64(len(dropped)))
	es.log.Info("page store: pages of shards this node no longer backs deleted", "region", r.Name, "shards", len(dropped),
		"ranges", shardRanges(dropped[:min(len(dropped), 64)]), "protocol_epoch", pm.epoch)
}

// errHolds ends storeHolds's scan at the first page.
var errHolds = errors.New("holds a page")

// storeHolds says whether store holds a page from through to-1 of region
// (a read error counts as yes: the delete goes ahead).
func storeHolds(store *pagestore.Store, region ids.RegionID, from, to uint64) bool {
	return store.Scan(region, from, to, func(pagestore.Page) error { return errHolds }) != nil
}
