package node

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// The page store follows the replica sets (docs/durability.md §3): three
// in-process nodes hold a durable region of 32 shards, every shard's
// first page synced; a fourth node joins and is promoted to the home of
// the shards it wins, which demotes their old homes. Once that settles,
// every node's store holds the pages of exactly the shards it backs (as
// home or in the replica set) under its view, so the demoted homes that
// left a set deleted theirs, and the joiner stores what it won. Every page
// still reads back on every node. Without the cleanup the old homes kept
// the shards they left.
func TestStoreDropsShardsItLeft(t *testing.T) {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cr, err := ms[0].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "d", Size: 64 << 20,
		Durability: dsmpb.Durability_DURABILITY_DURABLE})
	if err != nil {
		t.Fatal(err)
	}
	rid := ids.RegionID(cr.Region.Id)
	waitServed(ctx, t, ms, "d")
	re, err := ms[0].n.eng.get(rid)
	if err != nil {
		t.Fatal(err)
	}
	r := re.region
	if r.Shards() != 32 {
		t.Fatalf("the region has %d shards; the test wants 32", r.Shards())
	}
	data := func(i uint64) []byte { return bytes.Repeat([]byte(fmt.Sprintf("shard %d;", i)), 512)[:4096] }
	for i := range r.Shards() {
		off := i * r.PagesPerShard() << 12
		if _, err := ms[i%3].adm.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{Region: "d", Offset: off, Data: data(i), Sync: true}); err != nil {
			t.Fatalf("write shard %d: %v", i, err)
		}
	}
	won := 0
	for i := range r.Shards() {
		if placement.Home(placement.Shard{Region: rid, Index: i}, []ids.NodeID{1, 2, 3, 4}) == 4 {
			won++
		}
	}
	if won == 0 {
		t.Fatal("node 4 would win no shard: the test checks nothing")
	}

	// What the old nodes store before the join, by shard.
	before := map[ids.NodeID]map[uint64]bool{}
	for _, m := range ms {
		before[ids.NodeID(m.n.cfg.ID)] = map[uint64]bool{}
		for no := range storedPages(t, m, rid) {
			before[ids.NodeID(m.n.cfg.ID)][no/r.PagesPerShard()] = true
		}
	}

	ms = append(ms, startMember(t, 4, 3, []string{ms[0].n.Addrs().Gossip}, func(int, *Config) Options { return Options{} }))
	waitServed(ctx, t, ms, "d")
	// storeMatches says how each node's store differs from the shards it
	// backs under its view (nil: it holds exactly those).
	storeMatches := func() error {
		for _, m := range ms {
			re, err := m.n.eng.get(rid)
			if err != nil {
				return err
			}
			self := ids.NodeID(m.n.eng.self.Load())
			m.n.eng.mu.RLock()
			pm := re.last
			m.n.eng.mu.RUnlock()
			stored := storedPages(t, m, rid)
			for i := range r.Shards() {
				backed, _ := re.chains.backs(placement.Shard{Region: rid, Index: i}, self, pm)
				_, has := stored[i*r.PagesPerShard()]
				if backed != has {
					return fmt.Errorf("n%d backs shard %d: %v; its store holds its page: %v", m.n.cfg.ID, i, backed, has)
				}
			}
		}
		return nil
	}
	var last error
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	defer wcancel()
	t.Cleanup(func() {
		if t.Failed() && last != nil {
			t.Logf("last difference: %v", last)
		}
	})
	waitFor(wctx, t, "every store to hold exactly the shards its node backs, with the joiner a home", func() bool {
		homes := 0
		for i := range r.Shards() {
			if h, _ := placed(t, ms[0], rid, ids.PageNo(i*r.PagesPerShard())); h == 4 {
				homes++
			}
		}
		if homes < won {
			last = fmt.Errorf("the joiner homes %d of the %d shards it wins", homes, won)
			return false
		}
		last = storeMatches()
		return last == nil
	})
	if last != nil {
		t.Fatal(last)
	}
	left, dropped := 0, uint64(0)
	for _, m := range ms[:3] {
		stored := storedPages(t, m, rid)
		for i := range before[ids.NodeID(m.n.cfg.ID)] {
			if _, has := stored[i*r.PagesPerShard()]; !has {
				left++
			}
		}
		dropped += m.n.stats.storeShardsDropped.Load()
	}
	if left == 0 || dropped != uint64(left) {
		t.Fatalf("the old nodes' stores lost %d shards they held, and counted %d drops: no old home left a replica set, or the count is wrong", left, dropped)
	}
	if n := ms[3].n.stats.storeShardsDropped.Load(); n != 0 {
		t.Fatalf("the joiner, whose store was empty, counted %d shards dropped", n)
	}
	t.Logf("the joiner won %d shards; the old nodes' stores dropped %d shards they no longer back", won, left)
	for _, m := range ms {
		for i := range r.Shards() {
			off := i * r.PagesPerShard() << 12
			got, err := m.adm.ReadMemory(ctx, &dsmpb.ReadMemoryRequest{Region: "d", Offset: off, Length: 4096})
			if err != nil || !bytes.Equal(got.Data, data(i)) {
				t.Fatalf("n%d reads shard %d as %.16q (%v); want %.16q", m.n.cfg.ID, i, got.GetData(), err, data(i))
			}
		}
	}
}
