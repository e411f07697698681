//go:build linux

package localcache

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
)

// TestRemoveRegion removes a region with pages held Shared and Modified
// and an access waiting in a miss: the access fails with ErrRegionRemoved,
// RemoveRegion waits for it, the counters forget the region's pages, the
// name is free at once, and a region added under it is new and empty.
func TestRemoveRegion(t *testing.T) {
	d := newDaemon(t, 0)
	ctx := context.Background()
	if err := d.c.Access(ctx, regionR, 1, false, func([]byte) {}); err != nil {
		t.Fatal(err)
	}
	if err := d.c.Access(ctx, regionR, 2, true, func(b []byte) { copy(b, "old-region") }); err != nil {
		t.Fatal(err)
	}
	if s := d.c.Stats(); s.ResidentPages != 2 || s.DirtyPages != 1 {
		t.Fatalf("before: %d held, %d dirty; want 2, 1", s.ResidentPages, s.DirtyPages)
	}
	// An access whose miss is held at the home.
	d.home.honourCtx = true
	open := d.home.gate(5)
	defer open()
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	accessErr := make(chan error, 1)
	go func() { accessErr <- d.c.Access(actx, regionR, 5, false, func([]byte) {}) }()
	d.home.waitEntered(t, 5)

	removed := make(chan error, 1)
	go func() { removed <- d.c.RemoveRegion(ctx, regionR, "region r was deleted") }()
	select {
	case err := <-removed:
		t.Fatalf("RemoveRegion returned (%v) while a miss was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	// The engine fails the miss (as dsmd's does once stopped): the access
	// gives up, and the removal completes.
	cancel()
	if err := <-accessErr; err == nil {
		t.Fatal("the access in flight succeeded on a removed region")
	}
	if err := <-removed; err != nil {
		t.Fatal(err)
	}
	if err := d.c.Access(ctx, regionR, 1, false, func([]byte) {}); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("access after removal = %v, want ErrUnknownRegion", err)
	}
	if s := d.c.Stats(); s.ResidentPages != 0 || s.DirtyPages != 0 {
		t.Fatalf("after: %d held, %d dirty; want none", s.ResidentPages, s.DirtyPages)
	}
	if err := d.c.RemoveRegion(ctx, regionR, ""); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("second RemoveRegion = %v", err)
	}

	// The name again, with a new id: empty.
	const again = ids.RegionID(99)
	if err := d.c.AddRegion(RegionSpec{ID: again, Name: "r", Size: testSize}); err != nil {
		t.Fatal(err)
	}
	d.home.Put(again, 2, make([]byte, ps))
	var got string
	if err := d.c.Access(ctx, again, 2, false, func(b []byte) { got = string(b[:10]) }); err != nil {
		t.Fatal(err)
	}
	if got == "old-region" {
		t.Fatal("the region added under a removed region's name reads its data")
	}
	if n, err := d.c.CachedPages(again); err != nil || n != 1 {
		t.Fatalf("the new region's memfd holds %d pages (%v), want 1", n, err)
	}
}

// TestFlushRetriesBusy: a write-back that the engine refuses because a
// remote request is taking the page is tried again once the page's lock
// was released, so Sync does not fail on a page that is merely contended.
func TestFlushRetriesBusy(t *testing.T) {
	d := newDaemon(t, 0)
	ctx := context.Background()
	if err := d.c.Access(ctx, regionR, 4, true, func(b []byte) { copy(b, "dirty") }); err != nil {
		t.Fatal(err)
	}
	var remote sync.Mutex
	d.home.remote = &remote
	remote.Lock() // a remote request is in progress
	type res struct {
		n   int
		err error
	}
	done := make(chan res, 1)
	go func() {
		n, err := d.c.Flush(ctx, regionR, 0, 0)
		done <- res{n, err}
	}()
	eventually(t, "an eviction refused as busy", func() bool {
		d.home.mu.Lock()
		defer d.home.mu.Unlock()
		return d.home.busy > 0
	})
	remote.Unlock()
	r := <-done
	if r.err != nil || r.n != 1 {
		t.Fatalf("Flush = %d, %v; want the page written back once the engine was free", r.n, r.err)
	}
	buf := make([]byte, ps)
	d.home.Get(regionR, 4, buf)
	if string(buf[:5]) != "dirty" {
		t.Fatalf("home copy %q after Flush", buf[:5])
	}
}

// TestRemoveRegionOutlastsItsContext: a removal whose context ends while a
// call is still in progress on the region frees the name at once and the
// memory once the call lets go.
func TestRemoveRegionOutlastsItsContext(t *testing.T) {
	d := newDaemon(t, 0)
	ctx := context.Background()
	if err := d.c.Access(ctx, regionR, 1, true, func([]byte) {}); err != nil {
		t.Fatal(err)
	}
	open := d.home.gate(6) // a miss that ignores its context
	defer open()
	go d.c.Access(ctx, regionR, 6, false, func([]byte) {})
	d.home.waitEntered(t, 6)
	rctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := d.c.RemoveRegion(rctx, regionR, ""); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("RemoveRegion with a call in flight past its context = %v", err)
	}
	if err := d.c.AddRegion(RegionSpec{ID: 7, Name: "r", Size: testSize}); err != nil {
		t.Fatalf("the name is not free after the removal: %v", err)
	}
	if s := d.c.Stats(); s.ResidentPages != 1 {
		t.Fatalf("%d pages held while the removed region's call is in flight, want its 1", s.ResidentPages)
	}
	open()
	eventually(t, "the removed region's pages forgotten once its call ended", func() bool {
		return d.c.Stats().ResidentPages == 0 && d.c.Stats().DirtyPages == 0
	})
}
