package node

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
	"github.com/dsmkit/dsm/node/pagestore"
)

// The load of a lost shard (regionFills.load, docs/durability.md §4) reads
// the shard's pages from this node's page store into the engine's slots:
// every stored page of the shard, and only those, is populated afterwards;
// pages of other shards in the store are left alone; a stored page of the
// wrong size fails the load and names the page.
func TestLoadReadsTheShardFromTheStore(t *testing.T) {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cr, err := ms[0].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "d", Size: 4 << 20,
		Durability: dsmpb.Durability_DURABILITY_DURABLE})
	if err != nil {
		t.Fatal(err)
	}
	rid := ids.RegionID(cr.Region.Id)
	waitServed(ctx, t, ms, "d")
	// A node that is neither home nor backup of shard 1: its slots of the
	// shard are empty.
	pps := uint64(512) // 2 MiB shards of 4 KiB pages
	home, backups := placed(t, ms[0], rid, ids.PageNo(pps))
	var m testMember
	for _, x := range ms {
		if id := ids.NodeID(x.n.cfg.ID); id != home && !slices.Contains(backups, id) {
			m = x
		}
	}
	re, err := m.n.eng.get(rid)
	if err != nil {
		t.Fatal(err)
	}
	if p := re.e.Populated(0, ids.PageNo(2*pps)); len(p) != 0 {
		t.Fatalf("n%d's slots hold pages %v before the load", m.n.cfg.ID, p)
	}
	page := func(b byte) []byte {
		d := make([]byte, 4096)
		for i := range d {
			d[i] = b
		}
		return d
	}
	stored := []pagestore.Page{
		{Region: rid, No: 3, Version: 7, Data: page(1)},         // shard 0
		{Region: rid, No: pps + 2, Version: 9, Data: page(2)},   // shard 1
		{Region: rid, No: pps + 500, Version: 1, Data: page(3)}, // shard 1
	}
	if err := m.n.pages.Write(ctx, stored); err != nil {
		t.Fatal(err)
	}
	n, err := re.fills.load(ctx, 1)
	if err != nil || n != 2 {
		t.Fatalf("load of shard 1: %d pages, %v; want 2", n, err)
	}
	if got, want := re.e.Populated(0, ids.PageNo(2*pps)), []ids.PageNo{ids.PageNo(pps + 2), ids.PageNo(pps + 500)}; !slices.Equal(got, want) {
		t.Fatalf("populated after the load: %v, want %v", got, want)
	}
	if err := m.n.pages.Write(ctx, []pagestore.Page{{Region: rid, No: pps + 7, Version: 2, Data: page(4)[:100]}}); err != nil {
		t.Fatal(err)
	}
	if _, err := re.fills.load(ctx, 1); err == nil {
		t.Fatal("a stored page of 100 bytes was loaded into a 4 KiB slot")
	} else {
		t.Log(err)
	}
}
