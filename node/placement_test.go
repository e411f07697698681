package node

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
)

// events is a table of departures and failure verdicts (one each at
// most) by protocol id, and of joins, incarnations and completeness
// records.
type events struct {
	left, failed map[ids.NodeID]ids.Epoch
	drained      map[ids.NodeID]ids.Epoch
	gen          ids.Epoch
	ins          []protoInc
	recs         []directory.FillRecord
	proms        []directory.PromoteRecord
}

func (e events) known() ids.Epoch                            { return 0 }
func (e events) checkpoint(ids.RegionID) (ids.Epoch, []byte) { return 0, nil }
func (e events) incarnation(p ids.NodeID) (protoInc, bool) {
	i := slices.IndexFunc(e.ins, func(in protoInc) bool { return in.proto == p })
	if i < 0 {
		return protoInc{}, false
	}
	return e.ins[i], true
}
func (e events) departedAt(p ids.NodeID) ids.Epoch               { return e.left[p] }
func (e events) drainedAt(p ids.NodeID) ids.Epoch                { return e.drained[p] }
func (e events) incarnations() (ids.Epoch, []protoInc)           { return e.gen, e.ins }
func (e events) fillRecords(ids.RegionID) []directory.FillRecord { return e.recs }
func (e events) promoteRecords(ids.RegionID) []directory.PromoteRecord {
	return e.proms
}
func (e events) failedBetween(p ids.NodeID, after, upTo ids.Epoch) bool {
	f := e.failed[p]
	return f != 0 && f > after && f <= upTo
}

// walk is the index of the home of a shard whose chain is c, all of it the
// creation chain (every member a backup), in a region created in epoch
// created.
func walk(c []ids.NodeID, created ids.Epoch, ev eventsOf) int {
	rc := &regionChains{r: directory.Region{ID: 1, Epoch: created}, k: len(c) - 1, length: len(c),
		chains: map[uint64]chainEntry{0: {gen: 1, c: c}}, places: map[uint64]placeEntry{}}
	e := ev.(events)
	e.gen = 1 // the chain above
	sp := rc.place(placement.Shard{Region: 1}, e)
	return slices.Index(c, sp.c[sp.hi])
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
		if got := walk(c, 0, events{left: tc.left, failed: tc.failed}); got != tc.want {
			t.Errorf("%s: home index %d, want %d", tc.name, got, tc.want)
		}
	}
	// A verdict before the region's creation does not count: the node was
	// alive again when the region was created.
	if got := walk(c, 4, events{left: map[ids.NodeID]ids.Epoch{1: 5}, failed: map[ids.NodeID]ids.Epoch{2: 4}}); got != 1 {
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
			if before != 12 || !slices.Contains(targets, after) || after != rc.baseChain(s)[1] {
				t.Fatalf("shard %d moved %v -> %v (chain %v, targets %v)", i, before, after, rc.baseChain(s), targets)
			}
			// Its only backup became home: the third home replaces it,
			// incomplete until filled.
			b := rc.shardBackups(s, gone)
			if complete, inc := rc.completeBackups(s, gone); len(b) != 1 || b[0] != rc.baseChain(s)[2] || complete != 0 || !slices.Equal(inc, b) {
				t.Fatalf("shard %d: backups %v (complete %d, incomplete %v) after its only backup became home", i, b, complete, inc)
			}
		}
	}
	if moved == 0 || len(targets) == 0 || slices.Contains(targets, 12) {
		t.Fatalf("%d shards moved, targets %v", moved, targets)
	}
}

// A failure verdict is a departure, in a new protocol epoch: the
// incarnation leaves the members in the epoch of the verdict; its removal
// later changes nothing; its restart (quarantine and a new incarnation) is
// another epoch, and the old incarnation still departed at the verdict.
func TestProtoEpochCountsFailures(t *testing.T) {
	alive := directory.Member{ID: 1, Incarnation: 1, Proto: 1, State: directory.StateAlive, Epoch: 1}
	other := directory.Member{ID: 2, Incarnation: 1, Proto: 2, State: directory.StateAlive, Epoch: 1}
	v1 := buildProtoMap([]directory.Member{alive, other}, nil)
	failed := alive
	failed.State, failed.Epoch, failed.FailedAt, failed.LastFailedAt, failed.Failures = directory.StateFailed, 2, 2, 2, 1
	v2 := buildProtoMap([]directory.Member{failed, other}, nil)
	removed := failed
	removed.State, removed.Epoch = directory.StateLeft, 3
	v3 := buildProtoMap([]directory.Member{removed, other}, nil)
	q := directory.Quarantined{Proto: 1, LeftAt: 2, Node: 1, Incarnation: 1, FailedAt: 2, LastFailedAt: 2, Failures: 1}
	restarted := directory.Member{ID: 1, Incarnation: 2, Proto: 3, State: directory.StateAlive, Epoch: 4, JoinedAt: 4}
	v4 := buildProtoMap([]directory.Member{restarted, other}, []directory.Quarantined{q})
	e1, e2, e3, e4 := v1.epoch, v2.epoch, v3.epoch, v4.epoch
	if !(e1 < e2 && e2 == e3 && e3 < e4) {
		t.Fatalf("protocol epochs %v %v %v %v: want a new one at the failure, the same at the removal, a new one at the restart", e1, e2, e3, e4)
	}
	for i, pm := range []*protoMap{v2, v3, v4} {
		if pm.departedAt(1) != 2 || slices.Contains(pm.members, 1) || !pm.byProto[1].departed || !pm.failedBetween(1, 1, 2) {
			t.Fatalf("view %d: proto 1 departed at %v, member %v, failed in (1, 2] %v; want departed at the verdict (2)",
				i+2, pm.departedAt(1), slices.Contains(pm.members, 1), pm.failedBetween(1, 1, 2))
		}
	}
	if !slices.Equal(v4.members, []ids.NodeID{2, 3}) {
		t.Fatalf("members after the restart: %v", v4.members)
	}
}

// dirModel plays the directory's member table for placement tests: joins,
// restarts, failure verdicts, returns and completeness records, each in
// the epochs the FSM gives them.
type dirModel struct {
	epoch      ids.Epoch
	members    map[ids.NodeID]*directory.Member
	quarantine []directory.Quarantined
	nextProto  ids.NodeID
	fills      []directory.FillRecord
	proms      []directory.PromoteRecord
	drains     int
}

func newDirModel(nodes ...ids.NodeID) *dirModel {
	d := &dirModel{members: map[ids.NodeID]*directory.Member{}, nextProto: 1}
	for _, n := range nodes {
		d.join(n)
	}
	return d
}

func (d *dirModel) join(n ids.NodeID) {
	d.epoch++
	d.members[n] = &directory.Member{ID: n, Incarnation: 1, Proto: d.nextProto, State: directory.StateAlive, Epoch: d.epoch, JoinedAt: d.epoch}
	d.nextProto++
}

func (d *dirModel) restart(n ids.NodeID) {
	d.epoch++
	m := d.members[n]
	left := d.epoch
	if dep := m.DepartedAt(); dep != 0 {
		left = dep // left, or declared failed: as the directory's FSM
	}
	d.quarantine = append(d.quarantine, directory.Quarantined{Proto: m.Proto, LeftAt: left, Node: n, Incarnation: m.Incarnation,
		FailedAt: m.FailedAt, LastFailedAt: m.LastFailedAt, Failures: m.Failures, JoinedAt: m.JoinedAt, DrainingAt: m.DrainingAt})
	d.members[n] = &directory.Member{ID: n, Incarnation: m.Incarnation + 1, Proto: d.nextProto, State: directory.StateAlive,
		Epoch: d.epoch, JoinedAt: d.epoch}
	d.nextProto++
}

// setState changes n's state as the directory's FSM does: a departed
// incarnation (left, or declared failed) never comes back alive, and one
// that left stays left.
func (d *dirModel) setState(n ids.NodeID, st directory.MemberState) {
	m := d.members[n]
	if m.DepartedAt() != 0 && st == directory.StateAlive || m.State == directory.StateLeft || m.State == st {
		return
	}
	d.epoch++
	m.State, m.Epoch = st, d.epoch
	if st == directory.StateFailed {
		if m.FailedAt == 0 {
			m.FailedAt = d.epoch
		}
		m.LastFailedAt = d.epoch
		m.Failures++
	}
}

// drain marks n's incarnation draining for a hand-over, as the
// directory's FSM does (SetDraining): an alive incarnation, once, in an
// epoch of its own.
func (d *dirModel) drain(n ids.NodeID) bool {
	m := d.members[n]
	if m.State != directory.StateAlive || m.DrainingAt != 0 {
		return false
	}
	d.epoch++
	m.Epoch, m.Draining, m.DrainingAt = d.epoch, true, d.epoch
	d.drains++
	return true
}

// fill records that n's incarnation holds shards [first, end) of region
// 1, its fills begun in epoch since.
func (d *dirModel) fill(n ids.NodeID, since ids.Epoch, first, end uint64) {
	m := d.members[n]
	d.fills = append(d.fills, directory.FillRecord{Node: n, Incarnation: m.Incarnation, Proto: m.Proto, Since: since, At: d.epoch,
		Shards: []directory.ShardRange{{First: first, End: end}}})
}

func (d *dirModel) pm() *protoMap {
	var ms []directory.Member
	for _, m := range d.members {
		ms = append(ms, *m)
	}
	slices.SortFunc(ms, func(a, b directory.Member) int { return int(a.ID) - int(b.ID) })
	pm := buildProtoMap(ms, slices.Clone(d.quarantine))
	pm.fills = map[ids.RegionID][]directory.FillRecord{1: slices.Clone(d.fills)}
	pm.proms = map[ids.RegionID][]directory.PromoteRecord{1: slices.Clone(d.proms)}
	pm.epoch += ids.Epoch(len(d.proms) + d.drains) // as newProtoMap: each promotion and drain mark moves it
	pm.dirEpoch = d.epoch
	return pm
}

// promote records, in an epoch of its own, the promotion of n's
// incarnation to home of shards [first, end) of region 1 (the directory
// refuses it for a draining member: nothing is recorded).
func (d *dirModel) promote(n ids.NodeID, first, end uint64) {
	m := d.members[n]
	if m.DrainingAt != 0 {
		return
	}
	d.epoch++
	d.proms = append(d.proms, directory.PromoteRecord{Node: n, Incarnation: m.Incarnation, Proto: m.Proto, At: d.epoch,
		Shards: []directory.ShardRange{{First: first, End: end}}})
}

// region creates region 1 (64 shards, k backups) over the alive members.
func (d *dirModel) region(k int) *regionChains {
	r := directory.Region{ID: 1, RegionSpec: directory.RegionSpec{Name: "r", Size: 128 << 20, PageSize: 4096, ShardSize: 2 << 20, Backups: k},
		Epoch: d.epoch}
	var protos []ids.NodeID
	for n := ids.NodeID(1); int(n) <= len(d.members)+16; n++ {
		if m, ok := d.members[n]; ok && m.State == directory.StateAlive {
			r.Homes = append(r.Homes, n)
			r.HomeIncarnations = append(r.HomeIncarnations, m.Incarnation)
			protos = append(protos, m.Proto)
		}
	}
	return newRegionChains(r, protos)
}

// fillAll records every incomplete backup of every shard complete, as the
// homes' fills would, with the fills begun in the current epoch.
func fillAll(d *dirModel, rc *regionChains) {
	pm := d.pm()
	for i := range rc.r.Shards() {
		_, inc := rc.completeBackups(placement.Shard{Region: 1, Index: i}, pm)
		for _, b := range inc {
			n, _ := pm.nodeOf(b)
			d.fill(n, d.epoch, i, i+1)
		}
	}
}

// A departed backup is replaced by the next usable member of the chain at
// once, incomplete until its fill is recorded; with fills recorded between
// restarts, restarting every node in turn, many rounds over, never loses a
// shard, and every shard ends each round with all its backups complete.
func TestRollingRestartPlacement(t *testing.T) {
	for _, k := range []int{1, 2} {
		d := newDirModel(1, 2, 3, 4)
		rc := d.region(k)
		for round := range 5 {
			for n := ids.NodeID(1); n <= 4; n++ {
				d.restart(n)
				pm := d.pm()
				for i := range rc.r.Shards() {
					s := placement.Shard{Region: 1, Index: i}
					home := pm.byProto[rc.shardHome(s, pm)]
					if home.departed {
						t.Fatalf("k=%d round %d, restart of %v: shard %d lost (chain %v)", k, round, n, i, first(rc.chain(s, pm)))
					}
					bs := rc.shardBackups(s, pm)
					sp := rc.place(s, pm)
					if len(bs) != k && !(len(bs) == k+1 && bs[k] == sp.preferred) {
						t.Fatalf("k=%d round %d: shard %d has backups %v (preferred %v)", k, round, i, bs, sp.preferred)
					}
					for _, b := range bs {
						if pm.byProto[b].departed || b == rc.shardHome(s, pm) {
							t.Fatalf("shard %d: backup %v", i, b)
						}
					}
				}
				fillAll(d, rc)
				pm = d.pm()
				for i := range rc.r.Shards() {
					s := placement.Shard{Region: 1, Index: i}
					if c, _ := rc.completeBackups(s, pm); c != len(rc.shardBackups(s, pm)) {
						t.Fatalf("k=%d: shard %d has %d complete backups of %v after the fills", k, i, c, rc.shardBackups(s, pm))
					}
				}
			}
		}
	}
}

func first(c []ids.NodeID, _ int) []ids.NodeID { return c }

// Without fills, the second restart loses the shards whose only complete
// copy it held; a record committed after a departure does not count for
// it; a record whose incarnation failed since its fills began does not
// count.
func TestReplacementNeedsARecord(t *testing.T) {
	d := newDirModel(1, 2, 3)
	rc := d.region(1)
	d.restart(1)
	d.restart(2)
	pm := d.pm()
	lost := 0
	for i := range rc.r.Shards() {
		if pm.byProto[rc.shardHome(placement.Shard{Region: 1, Index: i}, pm)].departed {
			lost++
		}
	}
	if lost == 0 {
		t.Fatal("no shard lost by two restarts without fills")
	}
	// homedAt counts them (the number "member down" logs).
	if got := rc.homedAt(d.quarantine[0].Proto, pm) + rc.homedAt(d.quarantine[1].Proto, pm); got != lost {
		t.Fatalf("homedAt counts %d shards at the departed homes, %d are there", got, lost)
	}
	if got := rc.homedAt(d.members[3].Proto, pm); got != int(rc.r.Shards())-lost {
		t.Fatalf("homedAt counts %d shards at the live home, want %d", got, int(rc.r.Shards())-lost)
	}
	// The same, with the fills recorded only after the second departure.
	d = newDirModel(1, 2, 3)
	rc = d.region(1)
	d.restart(1)
	since := d.epoch
	d.restart(2)
	before := d.pm()
	d.fill(3, since, 0, rc.r.Shards())
	d.fill(1, since, 0, rc.r.Shards())
	after := d.pm()
	for i := range rc.r.Shards() {
		s := placement.Shard{Region: 1, Index: i}
		if rc.shardHome(s, before) != rc.shardHome(s, after) {
			t.Fatalf("shard %d: a record committed after the departure moved its home", i)
		}
	}
	// A failure after the fills began voids the record.
	d = newDirModel(1, 2, 3)
	rc = d.region(1)
	d.restart(1)
	fillAll(d, rc)
	d.setState(3, directory.StateFailed)
	d.restart(2)
	pm = d.pm()
	p3 := d.members[3].Proto
	for i := range rc.r.Shards() {
		s := placement.Shard{Region: 1, Index: i}
		sp := rc.place(s, pm)
		if sp.c[sp.hi] == p3 && sp.since[p3] != rc.r.Epoch {
			t.Fatalf("shard %d promoted replacement n3, declared failed after its fill", i)
		}
	}
}

// A joiner goes to the end of every chain: it never takes the place of a
// backup, so the homes and backups of every shard stay as they were; it is
// an extra backup of the shards it wins (rendezvous), about a quarter of
// them, and only of those.
func TestJoinerGoesLast(t *testing.T) {
	d := newDirModel(1, 2, 3)
	rc := d.region(1)
	d.restart(2)
	fillAll(d, rc)
	pm := d.pm()
	d.join(4)
	pm4 := d.pm()
	if pm4.epoch == pm.epoch {
		t.Fatal("a join did not move the protocol epoch")
	}
	p4 := d.members[4].Proto
	wins := 0
	for i := range rc.r.Shards() {
		s := placement.Shard{Region: 1, Index: i}
		b0, b4 := rc.shardBackups(s, pm)[:1], rc.shardBackups(s, pm4) // k = 1, and the extra
		won := placement.Home(s, []ids.NodeID{1, 2, 3, 4}) == 4
		if won {
			wins++
			if !slices.Equal(append(slices.Clone(b0), p4), b4) {
				t.Fatalf("shard %d, won by the joiner: backups %v, then %v; want the joiner added", i, b0, b4)
			}
		} else if !slices.Equal(b0, b4[:1]) || slices.Contains(b4, p4) {
			t.Fatalf("shard %d: a join changed its backups from %v to %v", i, b0, b4)
		}
		if rc.shardHome(s, pm) != rc.shardHome(s, pm4) {
			t.Fatalf("shard %d: a join changed its home", i)
		}
		if c, _ := rc.chain(s, pm4); c[len(c)-1] != d.members[4].Proto {
			t.Fatalf("shard %d: chain %v does not end with the joiner", i, c)
		}
	}
	if n := int(rc.r.Shards()); wins < n/8 || wins > n/2 {
		t.Fatalf("the joiner won %d of %d shards; rendezvous gives about a quarter", wins, n)
	}
}

// randomHistories runs seeds seeded random histories of 60 steps each
// (restarts, failure verdicts, removals of failed members, leaves, joins,
// fills and promotions of a shard's backup, complete or not) on a region
// over four members, and calls check after every step with the protocol
// views before and after it and the steps so far (a promotion's is
// "promote <proto> shard <i>").
func randomHistories(seeds int64, check func(seed int64, step int, rc *regionChains, prev, pm *protoMap, log []string)) {
	randomHistoriesOf(seeds, directory.DurabilityMemory, check)
}

// randomHistoriesOf is randomHistories of a region of durability dur.
func randomHistoriesOf(seeds int64, dur directory.Durability, check func(seed int64, step int, rc *regionChains, prev, pm *protoMap, log []string)) {
	for seed := int64(1); seed <= seeds; seed++ {
		rng := rand.New(rand.NewSource(seed))
		d := newDirModel(1, 2, 3, 4)
		rc := regionOf(d, 1+rng.Intn(2), dur)
		prev := d.pm()
		next := ids.NodeID(5)
		var log []string
		for step := 0; step < 60; step++ {
			n := ids.NodeID(1 + rng.Intn(int(next)-1))
			m := d.members[n]
			switch op := rng.Intn(11); {
			case op < 3:
				d.restart(n)
				log = append(log, fmt.Sprintf("restart %v", n))
			case op < 4 && m.State == directory.StateAlive:
				d.setState(n, directory.StateFailed)
				log = append(log, fmt.Sprintf("fail %v", n))
			case op < 5 && m.State == directory.StateFailed:
				d.setState(n, directory.StateLeft) // removed
				log = append(log, fmt.Sprintf("remove %v", n))
			case op < 6 && m.State != directory.StateLeft:
				d.setState(n, directory.StateLeft)
				log = append(log, fmt.Sprintf("leave %v", n))
			case op < 7 && next < 10:
				d.join(next)
				log = append(log, fmt.Sprintf("join %v", next))
				next++
			case op < 8:
				i := uint64(rng.Intn(int(rc.r.Shards())))
				sp := rc.place(placement.Shard{Region: 1, Index: i}, d.pm())
				bs := sp.backups()
				if len(bs) == 0 {
					continue
				}
				b := bs[rng.Intn(len(bs))]
				if sp.preferred != ids.None && rng.Intn(2) == 0 {
					b = sp.preferred // as the proposer does, a drain's hand-over among them
				}
				bn, _ := d.pm().nodeOf(b)
				if d.members[bn].Proto != b {
					continue
				}
				d.promote(bn, i, i+1)
				log = append(log, fmt.Sprintf("promote %v shard %d", b, i))
			case op == 10 && d.drain(n):
				log = append(log, fmt.Sprintf("drain %v", n))
			default:
				fillAll(d, rc)
				log = append(log, "fill")
			}
			pm := d.pm()
			check(seed, step, rc, prev, pm, log)
			prev = pm
		}
	}
}

// Seeded random histories: a view whose protocol epoch is that of the
// view before places every shard as it did (completeness records and
// removals of failed members move no protocol epoch), and a shard's home
// changes only when its home departed.
func TestPlacementFollowsEpochs(t *testing.T) {
	randomHistories(12, func(seed int64, _ int, rc *regionChains, prev, pm *protoMap, log []string) {
		for i := range rc.r.Shards() {
			s := placement.Shard{Region: 1, Index: i}
			h0, h1 := rc.shardHome(s, prev), rc.shardHome(s, pm)
			same := h0 == h1 && slices.Equal(rc.shardBackups(s, prev), rc.shardBackups(s, pm))
			if pm.epoch == prev.epoch && !same {
				t.Fatalf("seed %d: shard %d placed anew in protocol epoch %v after %v", seed, i, pm.epoch, log)
			}
			if h0 != h1 && pm.departedAt(h0) == 0 && log[len(log)-1] != fmt.Sprintf("promote %v shard %d", h1, i) {
				t.Fatalf("seed %d: shard %d moved from live home %v to %v after %v", seed, i, h0, h1, log)
			}
		}
	})
}

// A failure verdict moves the failed home's shards at once, each to its
// backup (complete since the creation), and only those; the failed
// incarnation is in no backup set. A restart afterwards moves nothing
// more: the new incarnation joins at the end of every chain.
func TestFailureMovesHomes(t *testing.T) {
	d := newDirModel(1, 2, 3)
	rc := d.region(1)
	before := d.pm()
	p3 := d.members[3].Proto
	d.setState(3, directory.StateFailed)
	failed := d.pm()
	moved := 0
	for i := range rc.r.Shards() {
		s := placement.Shard{Region: 1, Index: i}
		h0, h1 := rc.shardHome(s, before), rc.shardHome(s, failed)
		switch {
		case h0 == p3 && (h1 == p3 || h1 != rc.shardBackups(s, before)[0]):
			t.Fatalf("shard %d: homed at the failed %v, then at %v; want its backup %v", i, h0, h1, rc.shardBackups(s, before))
		case h0 != p3 && h1 != h0:
			t.Fatalf("shard %d moved from the live %v to %v", i, h0, h1)
		case slices.Contains(rc.shardBackups(s, failed), p3):
			t.Fatalf("shard %d: the failed incarnation is still a backup", i)
		}
		if h0 == p3 {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no shard was homed at n3")
	}
	d.restart(3)
	back := d.pm()
	for i := range rc.r.Shards() {
		s := placement.Shard{Region: 1, Index: i}
		if rc.shardHome(s, back) != rc.shardHome(s, failed) {
			t.Fatalf("shard %d moved again at the restart of the failed node", i)
		}
	}
}

// A promotion of a backup makes it the home and its old home its backup,
// incomplete (demoted) until the new home fills it; only the shards it
// names move, and the protocol epoch moves with them. If the new home
// departs before the refill, the shard does not go back to the demoted
// home (it may have missed releases: the simulator's promote-crash seed
// 8), and with k=1 nobody else is complete: the shard is lost.
func TestPromotionSwapsHomeAndBackup(t *testing.T) {
	d := newDirModel(1, 2, 3)
	rc := d.region(1)
	before := d.pm()
	s := placement.Shard{Region: 1, Index: 5}
	h, b := rc.shardHome(s, before), rc.shardBackups(s, before)[0]
	bn, _ := before.nodeOf(b)
	d.promote(bn, 5, 6)
	after := d.pm()
	if after.epoch == before.epoch {
		t.Fatal("a promotion did not move the protocol epoch")
	}
	if got := rc.shardHome(s, after); got != b {
		t.Fatalf("promoted shard homed at %v, want the promoted backup %v", got, b)
	}
	if got := rc.shardBackups(s, after); !slices.Equal(got, []ids.NodeID{h}) {
		t.Fatalf("promoted shard's backups %v, want the old home %v", got, h)
	}
	if c, inc := rc.completeBackups(s, after); c != 0 || !slices.Equal(inc, []ids.NodeID{h}) {
		t.Fatalf("the demoted home counts as complete (%d complete, incomplete %v)", c, inc)
	}
	for i := range rc.r.Shards() {
		o := placement.Shard{Region: 1, Index: i}
		if i != 5 && (rc.shardHome(o, after) != rc.shardHome(o, before) || !slices.Equal(rc.shardBackups(o, after), rc.shardBackups(o, before))) {
			t.Fatalf("shard %d, not named by the record, was placed anew", i)
		}
	}
	if ts := rc.targets(before, after); !slices.Contains(ts, b) {
		t.Fatalf("targets %v do not name the new home %v", ts, b)
	}
	// The new home departs before the refill.
	d.restart(bn)
	gone := d.pm()
	if got := rc.shardHome(s, gone); got == h {
		t.Fatalf("the shard went back to its demoted home %v, never refilled", h)
	} else if got != b {
		t.Fatalf("shard homed at %v after its new home %v departed; want it lost there (no complete copy)", got, b)
	}
	// With the refill recorded first, the demoted home takes it back.
	d = newDirModel(1, 2, 3)
	rc = d.region(1)
	d.promote(bn, 5, 6)
	fillAll(d, rc)
	if c, _ := rc.completeBackups(s, d.pm()); c != 1 {
		t.Fatalf("after the refill, %d complete backups, want 1", c)
	}
	d.restart(bn)
	if got := rc.shardHome(s, d.pm()); got != h {
		t.Fatalf("refilled old home %v did not take the shard back (home %v)", h, got)
	}
}

// A promotion record of a member that is not complete when it is
// committed changes nothing: a joiner outside the replica set, a backup
// whose fills began before its latest entry into the set, the home itself.
func TestPromotionOfIncompleteMemberIgnored(t *testing.T) {
	d := newDirModel(1, 2, 3)
	rc := d.region(1)
	d.join(4)
	before := d.pm()
	d.fill(4, d.epoch, 0, rc.r.Shards()) // a record, but n4 is in no shard's set
	d.promote(4, 0, rc.r.Shards())
	for _, n := range []ids.NodeID{1, 2, 3} {
		d.promote(n, 0, rc.r.Shards()) // the home of some shards, a backup of others
	}
	after := d.pm()
	p4 := d.members[4].Proto
	for i := range rc.r.Shards() {
		s := placement.Shard{Region: 1, Index: i}
		if rc.shardHome(s, after) == p4 {
			t.Fatalf("shard %d promoted to n4, which was never in its replica set", i)
		}
	}
	// The backups of the creation prefix were complete: the three records
	// move every shard (each to the last one named among its set), and
	// n4's moved none.
	moved := 0
	for i := range rc.r.Shards() {
		s := placement.Shard{Region: 1, Index: i}
		if rc.shardHome(s, after) != rc.shardHome(s, before) {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no promotion of a complete backup took effect")
	}
}

// A region of more shards than the cache holds keeps the bound, and the
// shard placed last is cached: a new placement takes the place of an
// older one.
func TestPlacementCacheEvicts(t *testing.T) {
	d := newDirModel(1, 2, 3)
	r := directory.Region{ID: 1, RegionSpec: directory.RegionSpec{Name: "big", Size: (maxCachedChains + 8) * (2 << 20), PageSize: 4096,
		ShardSize: 2 << 20, Backups: 1}, Epoch: d.epoch}
	var protos []ids.NodeID
	for n := ids.NodeID(1); n <= 3; n++ {
		r.Homes, r.HomeIncarnations = append(r.Homes, n), append(r.HomeIncarnations, 1)
		protos = append(protos, d.members[n].Proto)
	}
	rc := newRegionChains(r, protos)
	d.restart(2) // something to walk
	pm := d.pm()
	for i := range r.Shards() {
		rc.place(placement.Shard{Region: 1, Index: i}, pm)
	}
	last := placement.Shard{Region: 1, Index: r.Shards() - 1}
	if len(rc.places) != maxCachedChains || len(rc.chains) != maxCachedChains {
		t.Fatalf("%d placements and %d chains cached, want %d", len(rc.places), len(rc.chains), maxCachedChains)
	}
	first := rc.place(last, pm)
	if again := rc.place(last, pm); again != first {
		t.Fatal("the shard placed last is not cached")
	}
}

// A drain mark hands a member's shards over before it leaves
// (docs/failover.md §11): at the mark it is nobody's preferred member and
// enters no replica set, but stays home of its shards and in the sets it
// is in, and a replacement enters them; each shard it is home of has a
// complete preferred member (a creation backup, with no completeness
// record), whose promotion makes it the home and takes the drained member
// out of the set. Once the replacements are filled nothing needs it
// (handOver), and its leave moves no shard and loses none.
func TestDrainHandsOver(t *testing.T) {
	for _, k := range []int{1, 2} {
		d := newDirModel(1, 2, 3, 4)
		rc := d.region(k)
		before := d.pm()
		p1 := d.members[1].Proto
		homed := rc.homedAt(p1, before)
		watch := rc.needing(p1, before)
		if homed == 0 || rc.handOver(p1, before, watch) != homed || len(watch) <= homed {
			t.Fatalf("k=%d: n1 homes %d shards, is needed by %d, %d to hand over before its mark", k, homed, len(watch), rc.handOver(p1, before, watch))
		}
		d.drain(1)
		marked := d.pm()
		if marked.epoch == before.epoch {
			t.Fatal("a drain mark did not move the protocol epoch")
		}
		var promote []uint64
		for i := range rc.r.Shards() {
			s := placement.Shard{Region: 1, Index: i}
			sp0, sp := rc.place(s, before), rc.place(s, marked)
			h := sp.c[sp.hi]
			switch {
			case h != sp0.c[sp0.hi]:
				t.Fatalf("k=%d shard %d: the mark moved its home from %v to %v", k, i, sp0.c[sp0.hi], h)
			case sp.preferred == p1:
				t.Fatalf("k=%d shard %d: the draining member is preferred", k, i)
			case slices.Contains(sp0.set, p1) && !slices.Contains(sp.set, p1):
				t.Fatalf("k=%d shard %d: the draining member left set %v (now %v) before its departure", k, i, sp0.set, sp.set)
			case !slices.Contains(sp0.set, p1) && slices.Contains(sp.set, p1):
				t.Fatalf("k=%d shard %d: the draining member entered set %v", k, i, sp.set)
			}
			if h == p1 {
				if !rc.completeAt(sp, sp.preferred, s, never, marked) {
					t.Fatalf("k=%d shard %d: preferred %v is not complete", k, i, sp.preferred)
				}
				promote = append(promote, i)
			} else if slices.Contains(sp.set, p1) {
				if c, inc := rc.completeBackups(s, marked); len(inc) == 0 || c < k {
					t.Fatalf("k=%d shard %d: set %v, %d complete backups, incomplete %v: want the drained one complete and a replacement", k, i, sp.set, c, inc)
				}
			}
		}
		for _, i := range promote {
			pn, _ := marked.nodeOf(rc.place(placement.Shard{Region: 1, Index: i}, marked).preferred)
			d.promote(pn, i, i+1)
		}
		if n := rc.handOver(p1, d.pm(), watch); n == 0 {
			t.Fatalf("k=%d: after the promotions, before the fills, nothing to hand over", k)
		}
		fillAll(d, rc)
		done := d.pm()
		if n := rc.handOver(p1, done, watch); n != 0 || rc.homedAt(p1, done) != 0 {
			t.Fatalf("k=%d: after the promotions and fills, %d shards to hand over, %d homed", k, n, rc.homedAt(p1, done))
		}
		for _, i := range promote {
			s := placement.Shard{Region: 1, Index: i}
			if sp := rc.place(s, done); slices.Contains(sp.set, p1) {
				t.Fatalf("k=%d shard %d: the drained home stays in set %v after its promotion", k, i, sp.set)
			}
		}
		d.setState(1, directory.StateLeft)
		left := d.pm()
		for i := range rc.r.Shards() {
			s := placement.Shard{Region: 1, Index: i}
			if rc.shardHome(s, left) != rc.shardHome(s, done) {
				t.Fatalf("k=%d shard %d moved at the departure", k, i)
			}
			if c, _ := rc.completeBackups(s, left); c < k {
				t.Fatalf("k=%d shard %d: %d complete backups after the departure", k, i, c)
			}
		}
	}
}

// The homes digest that dsmd logs with each epoch is the same for every
// node that computes the placement of one view (a cached and a fresh
// regionChains alike), and changes when a home departs.
func TestHomesDigest(t *testing.T) {
	d := newDirModel(1, 2, 3)
	rc := d.region(1)
	before := rc.homesDigest(d.pm())
	d.restart(2)
	pm := d.pm()
	after := rc.homesDigest(pm)
	if len(after) != 16 || after == before {
		t.Fatalf("digest %q before the restart of a home, %q after: want two different 16-digit ones", before, after)
	}
	protos := make([]ids.NodeID, len(rc.r.Homes))
	for i, h := range rc.r.Homes {
		protos[i] = rc.protos[h]
	}
	if fresh := newRegionChains(rc.r, protos).homesDigest(pm); fresh != after {
		t.Errorf("a fresh placement's digest %q, the cached one's %q", fresh, after)
	}
}
