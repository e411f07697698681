package node

import (
	"slices"
	"testing"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
)

// events is a table of departures and failure verdicts (one each at
// most) by protocol id.
type events struct{ left, failed map[ids.NodeID]ids.Epoch }

func (e events) departedAt(p ids.NodeID) ids.Epoch { return e.left[p] }
func (e events) failedBetween(p ids.NodeID, after, upTo ids.Epoch) bool {
	f := e.failed[p]
	return f != 0 && f > after && f <= upTo
}

func TestHomeIndexWalksCompleteBackups(t *testing.T) {
	c := []ids.NodeID{1, 2, 3, 4}
	for _, tc := range []struct {
		name         string
		left, failed map[ids.NodeID]ids.Epoch
		want         int
	}{
		{"nothing happened", nil, nil, 0},
		{"the home failed: it stays home", nil, map[ids.NodeID]ids.Epoch{1: 5}, 0},
		{"the home departed", map[ids.NodeID]ids.Epoch{1: 5}, nil, 1},
		{"the first backup failed before", map[ids.NodeID]ids.Epoch{1: 5}, map[ids.NodeID]ids.Epoch{2: 4}, 2},
		{"the first backup failed after the move", map[ids.NodeID]ids.Epoch{1: 5}, map[ids.NodeID]ids.Epoch{2: 6}, 1},
		{"the first backup departed with it", map[ids.NodeID]ids.Epoch{1: 5, 2: 5}, nil, 2},
		{"the new home departed later", map[ids.NodeID]ids.Epoch{1: 5, 2: 7}, map[ids.NodeID]ids.Epoch{3: 6}, 3},
		{"no complete copy left", map[ids.NodeID]ids.Epoch{1: 5, 2: 3}, map[ids.NodeID]ids.Epoch{3: 2, 4: 4}, 0},
		{"the last one departed too", map[ids.NodeID]ids.Epoch{1: 5, 2: 6, 3: 7, 4: 8}, nil, 3},
	} {
		if got := homeIndex(c, 0, events{tc.left, tc.failed}); got != tc.want {
			t.Errorf("%s: home index %d, want %d", tc.name, got, tc.want)
		}
	}
	// A verdict before the region's creation does not count: the node was
	// alive again when the region was created.
	if got := homeIndex(c, 4, events{map[ids.NodeID]ids.Epoch{1: 5}, map[ids.NodeID]ids.Epoch{2: 4}}); got != 1 {
		t.Errorf("a failure before the creation: home index %d, want 1", got)
	}
}

// failedBetween keeps only the first and the last verdict: when it
// cannot rule a verdict out, it says there was one.
func TestFailedBetween(t *testing.T) {
	pm := buildProtoMap([]directory.Member{
		{ID: 1, Incarnation: 1, Proto: 1, State: directory.StateAlive},
		{ID: 2, Incarnation: 1, Proto: 2, State: directory.StateAlive, FailedAt: 5, LastFailedAt: 5, Failures: 1},
		{ID: 3, Incarnation: 1, Proto: 3, State: directory.StateAlive, FailedAt: 3, LastFailedAt: 9, Failures: 2},
	}, nil)
	for _, tc := range []struct {
		p           ids.NodeID
		after, upTo ids.Epoch
		want        bool
	}{
		{1, 0, never, false},
		{2, 0, 4, false}, {2, 0, 5, true}, {2, 5, never, false}, {2, 4, 6, true},
		{3, 9, never, false}, {3, 2, 3, true}, {3, 5, 10, true},
		{3, 5, 7, true}, // unknown: the second verdict may lie in (5, 7]
		{3, 1, 2, false},
	} {
		if got := pm.failedBetween(tc.p, tc.after, tc.upTo); got != tc.want {
			t.Errorf("failedBetween(n%d, %v, %v) = %v, want %v", tc.p, tc.after, tc.upTo, got, tc.want)
		}
	}
}

func TestRegionChainsPlacement(t *testing.T) {
	r := directory.Region{ID: 7, RegionSpec: directory.RegionSpec{Name: "r", Size: 64 << 20, PageSize: 4096, ShardSize: 2 << 20, Backups: 1},
		Homes: []ids.NodeID{1, 2, 3}}
	// Creation protocol ids differ from node ids (incarnations).
	rc := newRegionChains(r, []ids.NodeID{11, 12, 13})
	none := events{}
	// Without events: the rendezvous home of the node ids, as protocol id.
	for p := ids.PageNo(0); p < ids.PageNo(r.Pages()); p += 512 {
		s := r.ShardOf(p)
		want := map[ids.NodeID]ids.NodeID{1: 11, 2: 12, 3: 13}[placement.Home(s, r.Homes)]
		if got := rc.homeOf(none)(p); got != want {
			t.Fatalf("page %v: home %v, want %v", p, got, want)
		}
		if b := rc.backupsOf(none)(p); len(b) != 1 || b[0] == want {
			t.Fatalf("page %v: backups %v (home %v)", p, b, want)
		}
	}
	if got := rc.targets(none, none); got != nil {
		t.Fatalf("targets without a move: %v", got)
	}
	// 12 fails: it leaves every backup set, homes do not move.
	failed := events{failed: map[ids.NodeID]ids.Epoch{12: 4}}
	if rc.anyEvent(none) || !rc.anyEvent(failed) {
		t.Fatal("anyEvent")
	}
	for p := ids.PageNo(0); p < ids.PageNo(r.Pages()); p += 512 {
		if slices.Contains(rc.backupsOf(failed)(p), 12) {
			t.Fatalf("page %v: failed 12 is still a backup", p)
		}
		if rc.homeOf(failed)(p) != rc.homeOf(none)(p) {
			t.Fatalf("page %v moved on a failure", p)
		}
	}
	// Then 12 departs: its shards move to their backups, which are the
	// targets; no other shard moves.
	gone := events{left: map[ids.NodeID]ids.Epoch{12: 5}, failed: map[ids.NodeID]ids.Epoch{12: 4}}
	targets := rc.targets(failed, gone)
	var moved int
	for i := range r.Shards() {
		s := placement.Shard{Region: r.ID, Index: i}
		before, after := rc.shardHome(s, failed), rc.shardHome(s, gone)
		if before != after {
			moved++
			if before != 12 || !slices.Contains(targets, after) || after != rc.chain(s)[1] {
				t.Fatalf("shard %d moved %v -> %v (chain %v, targets %v)", i, before, after, rc.chain(s), targets)
			}
			if b := rc.shardBackups(s, gone); len(b) != 0 {
				t.Fatalf("shard %d: backups %v after its only backup became home", i, b)
			}
		}
	}
	if moved == 0 || len(targets) == 0 || slices.Contains(targets, 12) {
		t.Fatalf("%d shards moved, targets %v", moved, targets)
	}
}

// The protocol epoch counts failures, so that a view where a member is
// dropped from the backups is a new epoch.
func TestProtoEpochCountsFailures(t *testing.T) {
	alive := directory.Member{ID: 1, Incarnation: 1, Proto: 1, State: directory.StateAlive}
	v1 := buildProtoMap([]directory.Member{alive}, nil)
	failed := alive
	failed.State, failed.FailedAt, failed.LastFailedAt, failed.Failures = directory.StateFailed, 2, 2, 1
	v2 := buildProtoMap([]directory.Member{failed}, nil)
	back := failed
	back.State = directory.StateAlive
	v3 := buildProtoMap([]directory.Member{back}, nil)
	e1, e2, e3 := v1.epoch, v2.epoch, v3.epoch
	if !(e1 < e2 && e2 == e3) {
		t.Fatalf("protocol epochs %v %v %v: want a new one at the failure, the same when it is back", e1, e2, e3)
	}
	if pm := v3; !pm.failedBetween(1, 1, 2) || pm.failedBetween(1, 2, never) || pm.departedAt(1) != 0 {
		t.Fatalf("events of 1: failed in (1, 2] %v, after 2 %v, departed %v", pm.failedBetween(1, 1, 2), pm.failedBetween(1, 2, never), pm.departedAt(1))
	}
	// A second verdict is another epoch.
	again := back
	again.State, again.LastFailedAt, again.Failures = directory.StateFailed, 4, 2
	if e4 := buildProtoMap([]directory.Member{again}, nil).epoch; e4 <= e3 {
		t.Fatalf("protocol epoch %v after a second verdict, %v before", e4, e3)
	}
}
