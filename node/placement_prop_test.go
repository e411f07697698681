package node

import (
	"fmt"
	"log/slog"
	"maps"
	"math/rand"
	"os"
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
	promoted, resets, handedOver := 0, 0, 0
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
				if pm.drainedAt(h0) != 0 {
					handedOver++
				}
			}
			if log[len(log)-1] == "fill" {
				for _, b := range rc.shardBackups(s, pm) {
					has[key{i, b}] = true // the home's copy is complete
				}
			}
		}
	})
	if promoted == 0 || handedOver == 0 {
		t.Fatalf("%d promotions took effect, %d of a draining home's shard: the test checks too little about them", promoted, handedOver)
	}
	t.Logf("%d promotions took effect (%d of a draining home's shard), %d lost shards started over", promoted, handedOver, resets)
}

// BenchmarkWalk places one shard, without the cache, after a history of
// 40 and of 160 restarts, each followed by the fills and the promotions it
// calls for, recorded as the daemon records them (one completeness record
// per backup and fill round, one promotion record per node and round, over
// ranges of shards): the cost of a view change per shard when nothing is
// cached (a new dsmd), and of every homeOf call of a region too large for
// the cache (maxCachedChains shards).
func BenchmarkWalk(b *testing.B) {
	benchHistories(b, func(rc *regionChains, s placement.Shard, pm *protoMap) { rc.walk(s, pm) })
}

// BenchmarkWalkReference is BenchmarkWalk with the reference walk (the
// whole chain at once, departed members kept), for the ratio.
func BenchmarkWalkReference(b *testing.B) {
	benchHistories(b, func(rc *regionChains, s placement.Shard, pm *protoMap) { rc.walkReference(s, pm) })
}

// benchHistories runs walk on every shard in turn after the histories of
// BenchmarkWalk.
func benchHistories(b *testing.B, walk func(*regionChains, placement.Shard, *protoMap)) {
	for _, rounds := range []int{40, 160} {
		d, rc := restartHistory(rounds)
		pm := d.pm()
		b.Run(fmt.Sprintf("restarts=%d", rounds), func(b *testing.B) {
			for i := range b.N {
				walk(rc, placement.Shard{Region: 1, Index: uint64(i) % rc.r.Shards()}, pm)
			}
			b.ReportMetric(float64(len(d.fills)), "fill-records")
			b.ReportMetric(float64(len(d.proms)), "promotions")
		})
	}
}

// BenchmarkResume is the cost of one more restart per shard after the
// histories of BenchmarkWalk, when every shard's placement under the view
// before it is cached (resume): what a running dsmd pays per view change.
func BenchmarkResume(b *testing.B) {
	for _, rounds := range []int{40, 160} {
		d, rc := restartHistory(rounds)
		pm := d.pm()
		before := make([]*shardPlace, rc.r.Shards())
		for i := range before {
			before[i] = rc.walk(placement.Shard{Region: 1, Index: uint64(i)}, pm)
		}
		d.restart(2)
		pm = d.pm()
		b.Run(fmt.Sprintf("restarts=%d", rounds), func(b *testing.B) {
			for i := range b.N {
				s := uint64(i) % rc.r.Shards()
				rc.resume(before[s], placement.Shard{Region: 1, Index: s}, pm)
			}
		})
	}
}

// BenchmarkWalkFromCheckpoint is BenchmarkResume for a dsmd that caches
// nothing: each shard walked from a checkpoint of the view before the
// restart, in the view without the records it drops.
func BenchmarkWalkFromCheckpoint(b *testing.B) {
	for _, rounds := range []int{40, 160} {
		d, rc := restartHistory(rounds)
		cp := rc.checkpoint(d.pm())
		d.restart(2)
		pm, _ := prunedView(d.pm(), cp)
		b.Run(fmt.Sprintf("restarts=%d", rounds), func(b *testing.B) {
			for i := range b.N {
				rc.walkFrom(cp, placement.Shard{Region: 1, Index: uint64(i) % rc.r.Shards()}, pm)
			}
			b.ReportMetric(float64(len(cp.Encode())), "checkpoint-bytes")
			b.ReportMetric(float64(len(cp.States)), "states")
		})
	}
}

// restartHistory is a region of 64 shards on four nodes after `rounds`
// restarts, each followed by the fills and the promotions it calls for,
// recorded as the daemon records them.
func restartHistory(rounds int) (*dirModel, *regionChains) {
	d := newDirModel(1, 2, 3, 4)
	rc := d.region(1)
	for i := range rounds {
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
	return d, rc
}

// A walk resumed from the placement under an earlier view is the walk
// under the later one: after every step of seeded random histories, of
// memory and durable regions, each shard's placement as the daemon gets
// it (place: resumed from the last step's), resumed from the placement of
// a random earlier step (several steps of events at once), and walked
// from the region's creation are the same, departed members forgotten
// alike. 3 histories of each (DSM_LONG_TESTS=1, make sim: 200).
func TestResumeIsWalk(t *testing.T) {
	seeds := historySeeds()
	resumed, events := 0, 0
	for _, dur := range []directory.Durability{directory.DurabilityMemory, directory.DurabilitySynced} {
		var past [][]*shardPlace // by step, by shard
		lastSeed := int64(-1)
		randomHistoriesOf(seeds, dur, func(seed int64, step int, rc *regionChains, _, pm *protoMap, log []string) {
			if seed != lastSeed {
				lastSeed, past = seed, nil
			}
			rng := rand.New(rand.NewSource(seed*1000 + int64(step)))
			now := make([]*shardPlace, rc.r.Shards())
			for i := range rc.r.Shards() {
				s := placement.Shard{Region: 1, Index: i}
				want := rc.walk(s, pm)
				now[i] = want
				if diff := placeDiff(rc.place(s, pm), want); diff != "" {
					t.Fatalf("%v seed %d step %d shard %d: the cached and resumed placement differs from the walk: %s; after %v", dur, seed, step, i, diff, log)
				}
				if len(past) == 0 {
					continue
				}
				from := past[rng.Intn(len(past))][i]
				if from.known == want.known {
					continue
				}
				got := rc.resume(from, s, pm)
				resumed++
				if got.last != from.last {
					events++
				}
				if got.known != pm.known() {
					t.Fatalf("resumed to epoch %d, want %d", got.known, pm.known())
				}
				if diff := placeDiff(got, want); diff != "" {
					t.Fatalf("%v seed %d step %d shard %d: resumed from epoch %d: %s; after %v", dur, seed, step, i, from.known, diff, log)
				}
			}
			past = append(past, now)
		})
	}
	if resumed == 0 || events == 0 {
		t.Fatalf("%d placements resumed, %d of them over events: the test checks nothing", resumed, events)
	}
	t.Logf("%d placements resumed, %d of them over events", resumed, events)
}

// placeDiff says how two placements differ ("": they do not), but for the
// views they came from (a view that moves no protocol epoch places every
// shard as the one before: place keeps the one it has).
func placeDiff(a, b *shardPlace) string {
	switch {
	case !slices.Equal(a.c, b.c) || a.hi != b.hi:
		return fmt.Sprintf("chain %v home %d, want %v home %d", a.c, a.hi, b.c, b.hi)
	case !slices.Equal(a.set, b.set) || a.preferred != b.preferred:
		return fmt.Sprintf("set %v preferred %v, want %v preferred %v", a.set, a.preferred, b.set, b.preferred)
	case !maps.Equal(a.since, b.since) || !maps.Equal(a.loaded, b.loaded):
		return fmt.Sprintf("since %v loaded %v, want %v loaded %v", a.since, a.loaded, b.since, b.loaded)
	case a.lostAt != b.lostAt || !slices.Equal(a.cands, b.cands) || a.reset != b.reset:
		return fmt.Sprintf("lost at %d candidates %v reset %v, want %d %v %v", a.lostAt, a.cands, a.reset, b.lostAt, b.cands, b.reset)
	case a.last != b.last:
		return fmt.Sprintf("last event %d, want %d", a.last, b.last)
	}
	return ""
}

// The walk places every shard as the reference walk (the whole chain at
// once, departed members kept) in seeded random histories of memory and
// durable regions, after every step: the same home, replica set,
// preferred member, entry epochs, loss and revival, and the same chain
// once the reference's departed members other than the home are dropped.
// 3 histories of each (DSM_LONG_TESTS=1, make sim: 200).
func TestWalkIsReference(t *testing.T) {
	seeds := historySeeds()
	moved, lost := 0, 0
	for _, dur := range []directory.Durability{directory.DurabilityMemory, directory.DurabilitySynced} {
		randomHistoriesOf(seeds, dur, func(seed int64, step int, rc *regionChains, _, pm *protoMap, log []string) {
			for i := range rc.r.Shards() {
				s := placement.Shard{Region: 1, Index: i}
				ref := rc.walkReference(s, pm)
				ref.last = 0
				if len(ref.c) > 0 {
					if ref.hi != 0 {
						moved++
					}
					ref.c = slices.Clone(ref.c) // the cached chain
					ref.forgetDeparted(pm, never)
				}
				if ref.lostAt != 0 {
					lost++
				}
				got := *rc.walk(s, pm)
				got.last = 0
				if diff := placeDiff(&got, ref); diff != "" {
					t.Fatalf("%v seed %d step %d shard %d: %s; after %v", dur, seed, step, i, diff, log)
				}
			}
		})
	}
	if moved == 0 || lost == 0 {
		t.Fatalf("%d placements with a moved home, %d lost: the histories check too little", moved, lost)
	}
	t.Logf("%d placements with a moved home, %d lost", moved, lost)
}

// A walk from a checkpoint of an earlier view, in the view with the
// records the checkpoint lets the directory drop (completeness records of
// the incarnations departed by its epoch, promotion records up to it),
// places every shard as the walk from the region's creation in the whole
// view: after every step of seeded random histories of memory and durable
// regions, from a checkpoint taken (encoded and decoded) at a random
// earlier step. 3 histories of each (DSM_LONG_TESTS=1, make sim: 200).
func TestCheckpointIsWalk(t *testing.T) {
	seeds := historySeeds()
	checked, dropped, across := 0, 0, 0
	for _, dur := range []directory.Durability{directory.DurabilityMemory, directory.DurabilitySynced} {
		var cps []*placement.Checkpoint
		var past [][]*shardPlace // by step, by shard
		lastSeed := int64(-1)
		randomHistoriesOf(seeds, dur, func(seed int64, step int, rc *regionChains, _, pm *protoMap, log []string) {
			if seed != lastSeed {
				lastSeed, cps, past = seed, nil, nil
			}
			rng := rand.New(rand.NewSource(seed*1000 + int64(step)))
			now := make([]*shardPlace, rc.r.Shards())
			if len(cps) > 0 {
				cp := cps[rng.Intn(len(cps))]
				pruned, n := prunedView(pm, cp)
				dropped += n
				// A dsmd that starts now: no placement cached.
				protos := make([]ids.NodeID, len(rc.r.Homes))
				for i, h := range rc.r.Homes {
					protos[i] = rc.protos[h]
				}
				fresh := newRegionChains(rc.r, protos)
				from := past[rng.Intn(len(past))]
				for i := range rc.r.Shards() {
					s := placement.Shard{Region: 1, Index: i}
					want := rc.walk(s, pm)
					now[i] = want
					if diff := placeDiff(rc.walkFrom(cp, s, pruned), want); diff != "" {
						t.Fatalf("%v seed %d step %d shard %d: from the checkpoint of epoch %d: %s; after %v", dur, seed, step, i, cp.At, diff, log)
					}
					if diff := placeDiff(fresh.place(s, pruned), want); diff != "" {
						t.Fatalf("%v seed %d step %d shard %d: placed in the view with the checkpoint of epoch %d: %s; after %v", dur, seed, step, i, cp.At, diff, log)
					}
					// A running dsmd: its placement under an earlier view,
					// before or after the checkpoint's epoch.
					if from[i].known < cp.At {
						across++
					}
					if diff := placeDiff(rc.resume(from[i], s, pruned), want); diff != "" {
						t.Fatalf("%v seed %d step %d shard %d: resumed from epoch %d in the view with the checkpoint of epoch %d: %s; after %v",
							dur, seed, step, i, from[i].known, cp.At, diff, log)
					}
					checked++
				}
			} else {
				for i := range now {
					now[i] = rc.walk(placement.Shard{Region: 1, Index: uint64(i)}, pm)
				}
			}
			past = append(past, now)
			b := rc.checkpoint(pm).Encode()
			cp, err := placement.DecodeCheckpoint(b, rc.r.Shards())
			if err != nil {
				t.Fatalf("seed %d step %d: the checkpoint does not decode: %v", seed, step, err)
			}
			cps = append(cps, cp)
		})
	}
	if dropped == 0 || across == 0 {
		t.Fatalf("%d records dropped, %d placements resumed across a checkpoint: the test checks too little", dropped, across)
	}
	t.Logf("%d placements from checkpoints (%d resumed across one), %d records dropped", checked, across, dropped)
}

// prunedView is pm with checkpoint cp and without the records it lets the
// directory drop (directory.Region.Checkpoint), and how many it dropped.
func prunedView(pm *protoMap, cp *placement.Checkpoint) (*protoMap, int) {
	p := *pm
	p.fills, p.proms = map[ids.RegionID][]directory.FillRecord{}, map[ids.RegionID][]directory.PromoteRecord{}
	p.cps = map[ids.RegionID]regionCheckpoint{1: {cp.At, cp.Encode()}}
	n := 0
	for r, fs := range pm.fills {
		p.fills[r] = slices.DeleteFunc(slices.Clone(fs), func(f directory.FillRecord) bool {
			d := pm.departedAt(f.Proto)
			return d != 0 && d <= cp.At
		})
		n += len(fs) - len(p.fills[r])
	}
	for r, ps := range pm.proms {
		p.proms[r] = slices.DeleteFunc(slices.Clone(ps), func(x directory.PromoteRecord) bool { return x.At <= cp.At })
		n += len(ps) - len(p.proms[r])
	}
	return &p, n
}

// historySeeds is how many random histories of each durability the
// placement property tests run: 3, or 200 under DSM_LONG_TESTS=1 (make sim).
func historySeeds() int64 {
	if os.Getenv("DSM_LONG_TESTS") != "" {
		return 200
	}
	return 3
}

// BenchmarkEnteredAnew is the walk that dsmd makes at every epoch, before
// the engine takes it, to find the shards whose replica set this node
// entered anew (engines.enteredAnew): one op walks the whole region under
// a new view after the histories of BenchmarkWalk, for each member in
// turn. Only the first op of a view places its shards (BenchmarkResume's
// cost per shard); the others find them cached, so the figure is the
// walk's own cost, and a view change costs BenchmarkResume per shard more.
// shards/op says how many shards each walk visits.
func BenchmarkEnteredAnew(b *testing.B) {
	es := &engines{log: slog.New(slog.DiscardHandler)}
	for _, rounds := range []int{40, 160} {
		d, rc := restartHistory(rounds)
		last := d.pm()
		for i := range rc.r.Shards() {
			rc.place(placement.Shard{Region: 1, Index: i}, last)
		}
		d.restart(2)
		pm := d.pm()
		re := &regionEngine{region: rc.r, chains: rc}
		b.Run(fmt.Sprintf("restarts=%d", rounds), func(b *testing.B) {
			found := 0
			for i := range b.N {
				self := pm.members[i%len(pm.members)]
				found += len(es.enteredAnew(re, last, pm, self))
			}
			b.ReportMetric(float64(rc.r.Shards()), "shards/op")
			b.ReportMetric(float64(found)/float64(b.N), "entered/op")
		})
	}
}
