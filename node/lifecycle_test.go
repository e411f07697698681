package node

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/mapclient"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
	"github.com/dsmkit/dsm/node/engine"
	"github.com/dsmkit/dsm/node/localcache"
)

// TestRegionLifecycle deletes a region that holds data, Modified and
// Shared copies and a live mapping, and creates it again under the same
// name: delete refuses while the region is mapped unless forced, the
// mapping dies, every node forgets the region (engine, cache, counters),
// and the new region with the old name is a new, empty region everywhere.
func TestRegionLifecycle(t *testing.T) {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const size = 64 << 12
	// Members says when each member was last heard from (probes answer
	// every second or so).
	waitFor(ctx, t, "every member's last-seen time", func() bool {
		mr, err := ms[0].adm.Members(ctx, &dsmpb.MembersRequest{})
		if err != nil || len(mr.Members) != 3 {
			return false
		}
		for _, m := range mr.Members {
			if age := time.Since(time.Unix(0, m.LastSeenUnixNano)); m.LastSeenUnixNano == 0 || age > time.Minute {
				return false
			}
		}
		return true
	})
	old, err := ms[0].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "life", Size: size})
	if err != nil || old.Existed {
		t.Fatalf("create: %v %v", old, err)
	}
	again, err := ms[1].adm.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "life", Size: size})
	if err != nil || !again.Existed || again.Region.Id != old.Region.Id {
		t.Fatalf("create again with the same spec = %v, %v; want existed, same id", again, err)
	}
	waitServed(ctx, t, ms, "life")
	secret := []byte("old-region-bytes")
	for _, off := range []uint64{0, 4096, 8 * 4096} {
		if _, err := ms[0].adm.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{Region: "life", Offset: off, Data: secret}); err != nil {
			t.Fatal(err)
		}
	}
	// n2 reads one page (n1 keeps the others Modified): copies in every state.
	if rd, err := ms[1].adm.ReadMemory(ctx, &dsmpb.ReadMemoryRequest{Region: "life", Offset: 4096, Length: uint32(len(secret))}); err != nil || !bytes.Equal(rd.Data, secret) {
		t.Fatalf("read on n2 = %v, %v", rd, err)
	}

	// A process (this one) maps the region on n3.
	mc, err := mapclient.Connect(ctx, ms[2].n.Addrs().MapSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	m, err := mc.Map(ctx, "life")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	mp, err := ms[0].adm.Mappings(ctx, &dsmpb.MappingsRequest{Region: "life", AllNodes: true})
	if err != nil || len(mp.Nodes) != 3 || len(mp.Nodes[2].Pids) != 1 || mp.Nodes[2].Pids[0] != int32(os.Getpid()) {
		t.Fatalf("Mappings = %v, %v; want this process on n3", mp, err)
	}
	_, err = ms[0].cli.DeleteRegion(ctx, &dsmpb.DeleteRegionRequest{Name: "life"})
	if code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())+" on n3") {
		t.Fatalf("delete while mapped = %v; want FailedPrecondition naming the process", err)
	}
	del, err := ms[0].cli.DeleteRegion(ctx, &dsmpb.DeleteRegionRequest{Name: "life", Force: true})
	if err != nil || del.Id != old.Region.Id || del.Mappings != 1 {
		t.Fatalf("forced delete = %v, %v", del, err)
	}
	select {
	case <-m.Done():
	case <-ctx.Done():
		t.Fatal("the mapping of the deleted region was not ended")
	}
	if err := m.Err(); err == nil {
		t.Fatal("the mapping of a deleted region reports no error")
	}

	// Every node forgets the region: no engine, no cache region, no page
	// held or dirty.
	rid := old.Region.Id
	for i, tm := range ms {
		waitFor(ctx, t, "the deleted region to leave n"+strconv.Itoa(i+1), func() bool {
			_, eerr := tm.n.eng.get(ids.RegionID(rid))
			_, cerr := tm.n.cache.Mappings(ids.RegionID(rid))
			// The session ends before RemoveRegion detaches its client:
			// wait for the count too.
			return errors.Is(eerr, engine.ErrUnknownRegion) && errors.Is(cerr, localcache.ErrUnknownRegion) &&
				tm.n.cache.Stats().Clients == 0
		})
		if st := tm.n.cache.Stats(); st.ResidentPages != 0 || st.DirtyPages != 0 || st.Clients != 0 {
			t.Errorf("n%d after delete: %d pages held, %d dirty, %d clients; want none", i+1, st.ResidentPages, st.DirtyPages, st.Clients)
		}
	}

	// The name again: a new id, and zeros everywhere, through the memory
	// calls and through a new mapping.
	cr, err := ms[1].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "life", Size: size})
	if err != nil || cr.Existed || cr.Region.Id == old.Region.Id {
		t.Fatalf("re-create = %v, %v; want a new region with a new id (old %d)", cr, err, old.Region.Id)
	}
	waitServed(ctx, t, ms, "life")
	zero := make([]byte, len(secret))
	for i, tm := range ms {
		for _, off := range []uint64{0, 4096, 8 * 4096} {
			rd, err := tm.adm.ReadMemory(ctx, &dsmpb.ReadMemoryRequest{Region: "life", Offset: off, Length: uint32(len(secret))})
			if err != nil || !bytes.Equal(rd.Data, zero) {
				t.Errorf("n%d reads %q at %d of the re-created region (%v); want zeros", i+1, rd.GetData(), off, err)
			}
		}
	}
	m2, err := mc.Map(ctx, "life")
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if uint32(m2.Region()) != cr.Region.Id {
		t.Fatalf("mapped %v, want the new region r%d", m2.Region(), cr.Region.Id)
	}
	buf := make([]byte, 3*4096)
	if _, err := m2.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, make([]byte, len(buf))) {
		t.Fatal("a mapping of the re-created region reads the deleted region's bytes")
	}
}

func waitServed(ctx context.Context, t testing.TB, ms []testMember, name string) {
	t.Helper()
	for i, m := range ms {
		waitFor(ctx, t, name+" served on n"+strconv.Itoa(i+1), func() bool {
			_, err := m.cli.Load(ctx, &dsmpb.LoadRequest{Region: name})
			return err == nil
		})
	}
}

func waitFor(ctx context.Context, t testing.TB, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
