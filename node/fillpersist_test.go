package node

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/ids"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// A fill of a durable region persists (docs/durability.md §3): three
// in-process nodes, backups=1; synced pages are on disk at the home and
// the backup only; the backup leaves, the third node becomes the shard's
// backup and its home fills it. Once its completeness record is committed
// (never before its copies are on disk), the third node's page store holds
// every synced page at the version the home's store holds. A memory
// region writes no store. The fill runs three pages at a time
// (fillWindow), so it goes on as the results come.
func TestFillPersistsBeforeRecord(t *testing.T) {
	fillWindowPages.Store(3)
	t.Cleanup(func() { fillWindowPages.Store(fillWindow) })
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const pages = 8
	rid, mid, home, backup := durableAndMemory(ctx, t, ms, pages)
	var third testMember
	for _, m := range ms {
		if id := ids.NodeID(m.n.cfg.ID); id != home && id != backup {
			third = m
		}
	}
	hm := ms[home-1]
	for _, region := range []string{"d", "m"} {
		for p := range uint64(pages) {
			data := bytes.Repeat([]byte(fmt.Sprintf("%s page %d;", region, p)), 4096)[:4096]
			if _, err := third.adm.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{Region: region, Offset: p << 12, Data: data, Sync: true}); err != nil {
				t.Fatalf("write %s page %d: %v", region, p, err)
			}
		}
	}
	if got := storedPages(t, third, rid); len(got) != 0 {
		t.Fatalf("n%d, neither home nor backup, stores %d pages before the fill", third.n.cfg.ID, len(got))
	}
	want := storedPages(t, hm, rid)
	if len(want) != pages {
		t.Fatalf("the home stores %d pages, want %d", len(want), pages)
	}

	// The backup leaves: the third node is the new backup, filled.
	if err := ms[backup-1].n.close(ctx, true); err != nil {
		t.Fatal(err)
	}
	thirdProto := func() ids.NodeID {
		m, _ := hm.n.dir.View().Member(ids.NodeID(third.n.cfg.ID))
		return m.Proto
	}
	waitFor(ctx, t, "the third node's completeness record of d", func() bool {
		r, ok := hm.n.dir.View().RegionByID(rid)
		return ok && slices.ContainsFunc(r.Filled, func(f directory.FillRecord) bool { return f.Proto == thirdProto() && f.Covers(0) })
	})
	got := storedPages(t, third, rid)
	for no, w := range want {
		g, ok := got[no]
		switch {
		case !ok:
			t.Fatalf("n%d, recorded complete, does not store page %d", third.n.cfg.ID, no)
		case g.Version != w.Version || !bytes.Equal(g.Data, w.Data):
			t.Fatalf("n%d stores page %d at version %d (%.20q...), the home at %d (%.20q...)", third.n.cfg.ID, no, g.Version, g.Data, w.Version, w.Data)
		}
	}
	// A memory region is stored nowhere.
	for _, m := range []testMember{third, hm} {
		if got := storedPages(t, m, mid); len(got) != 0 {
			t.Fatalf("n%d stores %d pages of a memory region", m.n.cfg.ID, len(got))
		}
	}
}
