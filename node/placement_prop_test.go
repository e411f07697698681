package node

import (
	"slices"
	"testing"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
)

// Every copy the placement would promote is written by every release: in
// any history, for every shard, each member after the home that counts as
// complete now is one of the shard's backups (a complete member outside
// the backups would miss releases, and a later departure of the home could
// promote its stale copy). 40 seeded histories (80 s under the race
// detector for 200).
func TestCompleteMembersAreBackups(t *testing.T) {
	randomHistories(40, func(seed int64, step int, rc *regionChains, _, pm *protoMap, log []string) {
		for i := range rc.r.Shards() {
			s := placement.Shard{Region: 1, Index: i}
			sp := rc.place(s, pm)
			c, hi := sp.c, sp.hi
			if pm.departedAt(c[hi]) != 0 {
				continue // lost
			}
			backups := sp.backups()
			for j := hi + 1; j < len(c); j++ {
				if rc.completeAt(sp, c[j], s, never, pm) && !slices.Contains(backups, c[j]) {
					t.Fatalf("seed %d step %d: shard %d: chain %v, home %v, backups %v: %v counts as complete but is no backup, after %v",
						seed, step, i, c, c[hi], backups, c[j], log)
				}
			}
		}
	})
}

// The placement never hands a shard to a member that lacks some of its
// data. A model of the copies: after every step, a release writes the
// shard's home and backups of the view before it (a copy outside them
// misses it: it is complete no more); a fill copies the home's copy to
// every backup; a departure takes the copy with it. Whenever the shard's
// home changes (a departure moved it, or a promotion), the new home must
// hold a complete copy, or the shard must be lost (its home departed). A
// home demoted by a promotion is incomplete until a fill (docs/protocol.md,
// "Moves from live homes").
// Promotions of incomplete backups and of demoted homes are among the
// random steps: the placement must ignore them.
func TestHomesHoldEveryRelease(t *testing.T) {
	type key struct {
		shard uint64
		proto ids.NodeID
	}
	var has map[key]bool
	var lastSeed int64 = -1
	promoted, resets := 0, 0
	randomHistories(30, func(seed int64, step int, rc *regionChains, prev, pm *protoMap, log []string) {
		if seed != lastSeed {
			lastSeed, has = seed, map[key]bool{}
			// The creation set holds everything (nothing written yet).
			for i := range rc.r.Shards() {
				s := placement.Shard{Region: 1, Index: i}
				has[key{i, rc.shardHome(s, prev)}] = true
				for _, b := range rc.shardBackups(s, prev) {
					has[key{i, b}] = true
				}
			}
		}
		for i := range rc.r.Shards() {
			s := placement.Shard{Region: 1, Index: i}
			// The release of the view before the step.
			set := append([]ids.NodeID{rc.shardHome(s, prev)}, rc.shardBackups(s, prev)...)
			for k := range has {
				if k.shard == i && !slices.Contains(set, k.proto) {
					delete(has, k)
				}
			}
			h0, h1 := rc.shardHome(s, prev), rc.shardHome(s, pm)
			if pm.departedAt(h1) != 0 {
				continue // lost
			}
			if h1 != h0 && pm.departedAt(h0) != 0 && prev.departedAt(h0) != 0 && rc.shardHome(s, prev) == h0 {
				// A lost shard brought back: in a memory region (these
				// histories) only by starting over empty (revive), and
				// the new home's copy is then the shard's.
				if !rc.place(s, pm).reset {
					t.Fatalf("seed %d step %d: lost shard %d brought back at %v without a reset, after %v", seed, step, i, h1, log)
				}
				for k := range has {
					if k.shard == i {
						delete(has, k)
					}
				}
				has[key{i, h1}] = true
				resets++
			}
			if !has[key{i, h1}] {
				t.Fatalf("seed %d step %d: shard %d moved from %v to %v, which lacks releases, after %v", seed, step, i, h0, h1, log)
			}
			if h1 != h0 && pm.departedAt(h0) == 0 {
				// A demoted home may miss the releases of members that
				// have not learnt the promotion yet (the new home's stamp
				// turns them back): incomplete until refilled.
				delete(has, key{i, h0})
				promoted++
			}
			if log[len(log)-1] == "fill" {
				for _, b := range rc.shardBackups(s, pm) {
					has[key{i, b}] = true // the home's copy is complete
				}
			}
		}
	})
	if promoted == 0 {
		t.Fatal("no promotion took effect in the histories: the test checks nothing about them")
	}
	t.Logf("%d promotions took effect, %d lost shards started over", promoted, resets)
}

// BenchmarkWalk places one shard, without the cache, after a history of
// 40 restarts, each followed by the fills and the promotions it calls for,
// recorded as the daemon records them (one completeness record per backup
// and fill round, one promotion record per node and round, over ranges of
// shards): the cost of a view change per shard, and of every homeOf call
// of a region too large for the cache (maxCachedChains shards).
func BenchmarkWalk(b *testing.B) {
	d := newDirModel(1, 2, 3, 4)
	rc := d.region(1)
	for i := range 40 {
		d.restart(ids.NodeID(1 + i%4))
		pm := d.pm()
		fills := map[ids.NodeID][]directory.ShardRange{}
		for s := range rc.r.Shards() {
			_, inc := rc.completeBackups(placement.Shard{Region: 1, Index: s}, pm)
			for _, p := range inc {
				n, _ := pm.nodeOf(p)
				fills[n] = append(fills[n], directory.ShardRange{First: s, End: s + 1})
			}
		}
		for n, rs := range fills {
			m := d.members[n]
			d.fills = append(d.fills, directory.FillRecord{Node: n, Incarnation: m.Incarnation, Proto: m.Proto, Since: d.epoch,
				At: d.epoch, Shards: rs})
		}
		pm = d.pm()
		proms := map[ids.NodeID][]directory.ShardRange{}
		for s := range rc.r.Shards() {
			sp := rc.place(placement.Shard{Region: 1, Index: s}, pm)
			if p := sp.preferred; p != sp.c[sp.hi] {
				n, _ := pm.nodeOf(p)
				proms[n] = append(proms[n], directory.ShardRange{First: s, End: s + 1})
			}
		}
		for n, rs := range proms {
			d.epoch++
			m := d.members[n]
			d.proms = append(d.proms, directory.PromoteRecord{Node: n, Incarnation: m.Incarnation, Proto: m.Proto, At: d.epoch, Shards: rs})
		}
	}
	pm := d.pm()
	b.ResetTimer()
	for i := range b.N {
		rc.walk(placement.Shard{Region: 1, Index: uint64(i) % rc.r.Shards()}, pm)
	}
	b.ReportMetric(float64(len(d.fills)), "fill-records")
	b.ReportMetric(float64(len(d.proms)), "promotions")
}
