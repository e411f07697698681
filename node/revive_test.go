package node

import (
	"slices"
	"testing"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
)

// regionOf creates region 1 over the alive members of d, as d.region, with
// durability dur.
func regionOf(d *dirModel, k int, dur directory.Durability) *regionChains {
	rc := d.region(k)
	r := rc.r
	r.Durability = dur
	protos := make([]ids.NodeID, len(r.Homes))
	for i, h := range r.Homes {
		protos[i] = rc.protos[h]
	}
	return newRegionChains(r, protos)
}

// lostShards lists the shards whose home departed under pm.
func lostShards(rc *regionChains, pm *protoMap) []uint64 {
	var out []uint64
	for i := range rc.r.Shards() {
		if pm.byProto[rc.shardHome(placement.Shard{Region: 1, Index: i}, pm)].departed {
			out = append(out, i)
		}
	}
	return out
}

// killAll restarts every node of d, one after the other, with no fill in
// between: a kill -9 of every dsmd, then a restart of each (a departure
// and a join in one epoch, as the directory records a restart), or, with
// verdicts, a failure verdict first for each.
func killAll(d *dirModel, verdicts bool, nodes ...ids.NodeID) {
	if verdicts {
		for _, n := range nodes {
			d.setState(n, directory.StateFailed)
		}
	}
	for _, n := range nodes {
		d.restart(n)
	}
}

// The whole cluster restarts: every shard of a durable region is lost in
// memory; its candidates start with the node of its last home; once that
// node's new incarnation records itself complete (the load) and is
// promoted, it is the shard's home, complete, and its backups are
// replacements that a fill completes. A later departure of the revived
// home moves the shard on to a filled backup as usual.
func TestFullRestartRevivesFromStore(t *testing.T) {
	for _, verdicts := range []bool{false, true} {
		d := newDirModel(1, 2, 3)
		rc := regionOf(d, 1, directory.DurabilitySynced)
		before := d.pm()
		lastHome := map[uint64]ids.NodeID{}
		killAll(d, verdicts, 1, 2, 3)
		pm := d.pm()
		lost := lostShards(rc, pm)
		if len(lost) != int(rc.r.Shards()) {
			t.Fatalf("verdicts %v: %d of %d shards lost after every node restarted", verdicts, len(lost), rc.r.Shards())
		}
		for _, i := range lost {
			s := placement.Shard{Region: 1, Index: i}
			sp := rc.place(s, pm)
			h, _ := pm.nodeOf(sp.c[sp.hi])
			lastHome[i] = h
			if len(sp.cands) == 0 || sp.cands[0] != h {
				t.Fatalf("verdicts %v: shard %d: candidates %v, want the last home's node %v first", verdicts, i, sp.cands, h)
			}
			if sp.lostAt == 0 {
				t.Fatalf("shard %d: no lostAt", i)
			}
			if got := rc.reviver(sp, pm); got != h {
				t.Fatalf("shard %d: reviver %v, want %v", i, got, h)
			}
			_ = before
		}
		// Each reviver loads, records and is promoted.
		for _, i := range lost {
			d.fill(lastHome[i], d.epoch, i, i+1)
		}
		for _, i := range lost {
			d.promote(lastHome[i], i, i+1)
		}
		pm = d.pm()
		for i := range rc.r.Shards() {
			s := placement.Shard{Region: 1, Index: i}
			sp := rc.place(s, pm)
			home := pm.byProto[sp.c[sp.hi]]
			if home.departed || home.node != lastHome[i] {
				t.Fatalf("verdicts %v: shard %d homed at %v (departed %v), want the new incarnation of %v", verdicts, i, home.node, home.departed, lastHome[i])
			}
			if sp.reset {
				t.Fatalf("shard %d of a durable region started over empty", i)
			}
			if !rc.completeAt(sp, sp.c[sp.hi], s, never, pm) {
				t.Fatalf("shard %d: the revived home is not complete", i)
			}
			if c, inc := rc.completeBackups(s, pm); c != 0 || len(inc) == 0 {
				t.Fatalf("shard %d: %d complete backups, incomplete %v: the replacements need a fill", i, c, inc)
			}
		}
		if rc.contentsLost(pm) {
			t.Fatal("a durable region says contents lost")
		}
		// The fills complete; the revived home restarts alone: its filled
		// backup takes the shard, nothing is lost.
		fillAll(d, rc)
		d.restart(lastHome[0])
		pm = d.pm()
		if l := lostShards(rc, pm); len(l) != 0 {
			t.Fatalf("verdicts %v: shards %v lost by one restart after the fills", verdicts, l)
		}
	}
}

// A promotion record of an incarnation whose node is no candidate (its
// previous incarnation departed before the last home, so its store missed
// Syncs), or whose record began before the loss, or of a node's
// incarnation when an earlier candidate's node has one too (placement
// only checks that it is a candidate), changes nothing where it must not.
func TestReviveOnlyFromCandidates(t *testing.T) {
	d := newDirModel(1, 2, 3)
	rc := regionOf(d, 1, directory.DurabilitySynced)
	killAll(d, false, 1, 2, 3)
	pm := d.pm()
	// Find a shard whose candidates leave out some node.
	var s placement.Shard
	var outsider ids.NodeID
	for i := range rc.r.Shards() {
		sp := rc.place(placement.Shard{Region: 1, Index: i}, pm)
		for n := ids.NodeID(1); n <= 3; n++ {
			in := false
			for _, c := range sp.cands {
				in = in || c == n
			}
			if !in {
				s, outsider = placement.Shard{Region: 1, Index: i}, n
			}
		}
		if outsider != 0 {
			break
		}
	}
	if outsider == 0 {
		t.Fatal("every node is a candidate of every shard")
	}
	recSince := d.epoch
	d.fill(outsider, recSince, s.Index, s.Index+1)
	d.promote(outsider, s.Index, s.Index+1)
	if got := pm.byProto[rc.shardHome(s, d.pm())]; !got.departed {
		t.Fatalf("shard %d revived at n%v, whose store is no candidate's", s.Index, got.node)
	}
	// A record of fills begun before the loss does not count.
	sp := rc.place(s, d.pm())
	cand := sp.cands[0]
	d.fill(cand, sp.lostAt-1, s.Index, s.Index+1)
	d.promote(cand, s.Index, s.Index+1)
	if got := pm.byProto[rc.shardHome(s, d.pm())]; !got.departed {
		t.Fatalf("shard %d revived by a record of fills begun before the loss", s.Index)
	}
	// Without any record, a promotion changes nothing either.
	d2 := newDirModel(1, 2, 3)
	rc2 := regionOf(d2, 1, directory.DurabilitySynced)
	killAll(d2, false, 1, 2, 3)
	d2.promote(1, 0, rc2.r.Shards())
	if l := lostShards(rc2, d2.pm()); len(l) != int(rc2.r.Shards()) {
		t.Fatalf("a promotion without a record revived %d shards", int(rc2.r.Shards())-len(l))
	}
}

// A member declared failed before the last home departed is no candidate:
// it missed the Syncs after its verdict.
func TestFailedMemberIsNoCandidate(t *testing.T) {
	d := newDirModel(1, 2, 3)
	rc := regionOf(d, 2, directory.DurabilitySynced) // every node in every set
	d.setState(2, directory.StateFailed)
	killAll(d, false, 1, 3)
	d.restart(2)
	pm := d.pm()
	for _, i := range lostShards(rc, pm) {
		sp := rc.place(placement.Shard{Region: 1, Index: i}, pm)
		for _, c := range sp.cands {
			if c == 2 {
				t.Fatalf("shard %d: n2, declared failed before the loss, is a candidate (%v)", i, sp.cands)
			}
		}
	}
}

// A memory region: a shard lost while a process of the region's time
// lives on (more than Backups failures, the cluster up) stays lost, even
// when every live process records that it holds nothing of it: its pages
// fail, never read as zeros. After a restart of every node, a lost shard
// starts over empty once no process can hold a copy of it (every
// incarnation that joined before the loss departed, or recorded after the
// loss that it holds nothing), and only then; the region then says
// contents lost.
func TestMemoryRegionStartsOverEmpty(t *testing.T) {
	d := newDirModel(1, 2, 3)
	rc := regionOf(d, 1, directory.DurabilityMemory)
	d.restart(1)
	d.restart(2)
	pm := d.pm()
	lost := lostShards(rc, pm)
	if len(lost) == 0 {
		t.Fatal("no shard lost by two restarts without fills")
	}
	promoteAll := func(records bool) {
		pm := d.pm()
		for _, i := range lostShards(rc, pm) {
			sp := rc.place(placement.Shard{Region: 1, Index: i}, pm)
			n, _ := pm.nodeOf(sp.preferred)
			if records {
				d.fill(n, d.epoch, i, i+1)
			}
			d.promote(n, i, i+1)
		}
	}
	// recordAll has every node record that it holds nothing of the lost
	// shards (a fill record after the loss, of no pages).
	recordAll := func(lost []uint64) {
		for _, i := range lost {
			for n := ids.NodeID(1); n <= 3; n++ {
				d.fill(n, d.epoch, i, i+1)
			}
		}
	}
	// requireReset: no shard is lost any more and the region says contents
	// lost.
	requireReset := func(when string) {
		t.Helper()
		pm := d.pm()
		if l := lostShards(rc, pm); len(l) != 0 {
			t.Fatalf("shards %v still lost %s", l, when)
		}
		if !rc.contentsLost(pm) {
			t.Fatalf("the memory region does not say contents lost %s", when)
		}
	}
	recordAll(lost)
	promoteAll(false)
	pm = d.pm()
	if l := lostShards(rc, pm); len(l) != len(lost) || rc.contentsLost(pm) {
		t.Fatalf("shards reset while n3's first incarnation lives on (%d lost of %d)", len(l), len(lost))
	}
	if turnedOver(rc.r.Epoch, rc.place(placement.Shard{Region: 1, Index: lost[0]}, pm).lostAt, never, pm) {
		t.Fatal("turnedOver with n3's first incarnation alive")
	}
	// n3 restarts too: the cluster turned over. n3's first incarnation was
	// the only one that said nothing; now every shard lost can reset, once
	// the new incarnations that joined before a loss say they hold nothing.
	d.restart(3)
	pm = d.pm()
	lost = lostShards(rc, pm)
	recordAll(lost)
	promoteAll(true)
	requireReset("once the cluster turned over")
	pm = d.pm()
	for _, i := range lost {
		s := placement.Shard{Region: 1, Index: i}
		sp := rc.place(s, pm)
		if !sp.reset {
			t.Fatalf("shard %d brought back without reset", i)
		}
		// The records said "holds nothing": they do not make anyone a
		// complete backup of the new home's shard.
		if c, _ := rc.completeBackups(s, pm); c != 0 {
			t.Fatalf("shard %d: %d complete backups right after the reset", i, c)
		}
	}

	// The whole cluster restarts: every incarnation that joined before a
	// loss says it holds nothing (the new ones joined, in the directory's
	// order, before the last home's departure was recorded); the preferred
	// members' promotions reset every lost shard.
	d = newDirModel(1, 2, 3)
	rc = regionOf(d, 1, directory.DurabilityMemory)
	killAll(d, false, 1, 2, 3)
	pm = d.pm()
	lost = lostShards(rc, pm)
	if len(lost) != int(rc.r.Shards()) {
		t.Fatalf("%d of %d shards lost after every node restarted", len(lost), rc.r.Shards())
	}
	recordAll(lost)
	promoteAll(false)
	requireReset("after the resets")
	// A durable region never resets, whatever the records say.
	d = newDirModel(1, 2, 3)
	rc = regionOf(d, 1, directory.DurabilitySynced)
	killAll(d, false, 1, 2, 3)
	pm = d.pm()
	for _, i := range lostShards(rc, pm) {
		sp := rc.place(placement.Shard{Region: 1, Index: i}, pm)
		n, _ := pm.nodeOf(sp.preferred)
		if slices.Contains(sp.cands, n) {
			continue
		}
		d.fill(n, d.epoch, i, i+1)
		d.promote(n, i, i+1)
	}
	if rc.contentsLost(d.pm()) {
		t.Fatal("a durable region started over empty")
	}
}
