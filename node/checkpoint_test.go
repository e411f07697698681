package node

import (
	"context"
	"testing"
	"time"

	"github.com/dsmkit/dsm/directory/placement"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// TestCheckpointDropsRecords: once a join's promotions are recorded, a
// member proposes a placement checkpoint and the directory drops the
// promotion records it covers; every member places every shard alike in
// the view with the checkpoint (the members that cached their placements
// and resume them, and a node that joins afterwards and walks from the
// checkpoint), and every value reads back at every member.
func TestCheckpointDropsRecords(t *testing.T) {
	every := func(_ int, cfg *Config) Options {
		cfg.CheckpointAfter = 1
		return Options{}
	}
	ms := startClusterOpts(t, 3, every)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const name, size = "cp", 64 << 20
	if _, err := ms[0].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: name, Size: size}); err != nil {
		t.Fatal(err)
	}
	r, _ := ms[0].n.dir.View().Region(name)
	shardBytes := uint64(r.ShardSize)
	for i := range r.Shards() {
		if _, err := ms[0].cli.Store(ctx, &dsmpb.StoreRequest{Region: name, Offset: i * shardBytes, Value: 1000 + i}); err != nil {
			t.Fatal(err)
		}
	}
	join := []string{ms[0].n.Addrs().Gossip}
	ms = append(ms, startMember(t, 4, 0, join, every))
	waitFor(ctx, t, "a placement checkpoint after the joiner's promotions", func() bool {
		r, ok := ms[0].n.dir.View().Region(name)
		return ok && r.CheckpointAt != 0
	})
	ms = append(ms, startMember(t, 5, 0, join, every))
	check := func() {
		t.Helper()
		for j, m := range ms {
			for i := range r.Shards() {
				for {
					got, err := m.cli.Load(ctx, &dsmpb.LoadRequest{Region: name, Offset: i * shardBytes})
					if err == nil {
						if got.Value != 1000+i {
							t.Fatalf("n%d loads %d at shard %d, want %d", j+1, got.Value, i, 1000+i)
						}
						break
					}
					if ctx.Err() != nil {
						t.Fatalf("n%d load of shard %d: %v", j+1, i, err)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}
	}
	check()
	v := ms[0].n.dir.View()
	r, _ = v.Region(name)
	if r.CheckpointAt == 0 {
		t.Fatal("the checkpoint is gone")
	}
	for _, p := range r.Promoted {
		if p.At <= r.CheckpointAt {
			t.Fatalf("promotion record of epoch %v kept after the checkpoint of %v", p.At, r.CheckpointAt)
		}
	}
	pm := newProtoMap(v)
	want := make([]*shardPlace, r.Shards())
	for j, m := range ms {
		re, err := m.n.eng.get(r.ID)
		if err != nil {
			t.Fatalf("n%d: %v", j+1, err)
		}
		for i := range r.Shards() {
			sp := re.chains.place(placement.Shard{Region: r.ID, Index: i}, pm)
			if want[i] == nil {
				want[i] = sp
			} else if diff := placeDiff(sp, want[i]); diff != "" {
				t.Fatalf("n%d places shard %d otherwise than n1: %s", j+1, i, diff)
			}
		}
	}
	t.Logf("checkpoint of epoch %v: %d bytes, %d promotion records left", r.CheckpointAt, len(r.Checkpoint), len(r.Promoted))
}
