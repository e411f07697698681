//go:build linux

package localcache

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/dsmkit/dsm/internal/ids"
)

// TestAccess: Access holds the page as asked (a read miss, then an
// upgrade), its atomics from many goroutines add up, a client process sees
// the result, and Flush writes the Modified page back and drops it.
func TestAccess(t *testing.T) {
	d := newDaemon(t, 0)
	ctx := context.Background()
	var got uint64
	if err := d.c.Access(ctx, regionR, 3, false, func(b []byte) { got = binary.LittleEndian.Uint64(b) }); err != nil {
		t.Fatal(err)
	}
	if got != 0 || d.state(3) != Shared {
		t.Fatalf("read access: word %d state %v, want 0 S", got, d.state(3))
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				err := d.c.Access(ctx, regionR, 3, true, func(b []byte) {
					atomic.AddUint64((*uint64)(unsafe.Pointer(&b[8])), 1)
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if d.state(3) != Modified {
		t.Fatalf("state %v after write access, want M", d.state(3))
	}
	if c := d.home.counts(); c.reads != 1 || c.upgrades != 1 {
		t.Fatalf("home saw %+v, want one read miss and one upgrade", c)
	}
	p := d.client("a", "r")
	if v := p.load(off(3) + 8); v != 800 {
		t.Fatalf("client loads %d, want 800", v)
	}

	n, err := d.c.Flush(ctx, regionR, 0, 0)
	if err != nil || n != 1 {
		t.Fatalf("Flush = %d, %v; want 1 page", n, err)
	}
	if d.state(3) != Invalid {
		t.Fatalf("state %v after Flush, want I", d.state(3))
	}
	buf := make([]byte, ps)
	d.home.Get(regionR, 3, buf)
	if v := binary.LittleEndian.Uint64(buf[8:]); v != 800 {
		t.Fatalf("home copy holds %d after Flush, want 800", v)
	}
	if n, err := d.c.Flush(ctx, regionR, 0, 0); err != nil || n != 0 {
		t.Fatalf("second Flush = %d, %v; want 0", n, err)
	}
	held, err := d.c.Held(regionR, 0, 0)
	if err != nil || len(held) != 0 {
		t.Fatalf("Held = %v, %v; want nothing", held, err)
	}
}

// TestFlushWritesBackConcurrently: Flush keeps several write-backs under
// way at once (a home or page store that answers each in a round trip
// would make Sync of many pages one round trip per page), and every page
// still reaches the home.
func TestFlushWritesBackConcurrently(t *testing.T) {
	d := newDaemon(t, 0)
	ctx := context.Background()
	const pages, together = 12, 4
	for p := range ids.PageNo(pages) {
		if err := d.c.Access(ctx, regionR, p, true, func(b []byte) { binary.LittleEndian.PutUint64(b, uint64(p)+100) }); err != nil {
			t.Fatal(err)
		}
	}
	// Each write-back waits until `together` are under way, for at most
	// 2 s: one after the other, none would ever see a second.
	var (
		mu       sync.Mutex
		inFlight int
		most     int
		arrived  = sync.NewCond(&mu)
	)
	d.home.mu.Lock()
	d.home.onEvict = func() {
		mu.Lock()
		defer mu.Unlock()
		inFlight++
		most = max(most, inFlight)
		arrived.Broadcast()
		deadline := time.AfterFunc(2*time.Second, func() { mu.Lock(); arrived.Broadcast(); mu.Unlock() })
		start := time.Now()
		for most < together && time.Since(start) < 2*time.Second {
			arrived.Wait()
		}
		deadline.Stop()
		inFlight--
	}
	d.home.mu.Unlock()
	n, err := d.c.Flush(ctx, regionR, 0, 0)
	if err != nil || n != pages {
		t.Fatalf("Flush = %d, %v; want %d pages", n, err, pages)
	}
	if most < together {
		t.Fatalf("at most %d write-backs were under way at once; want %d", most, together)
	}
	buf := make([]byte, ps)
	for p := range ids.PageNo(pages) {
		d.home.Get(regionR, p, buf)
		if v := binary.LittleEndian.Uint64(buf); v != uint64(p)+100 {
			t.Fatalf("home copy of page %d holds %d after Flush, want %d", p, v, uint64(p)+100)
		}
		if st := d.state(p); st != Invalid {
			t.Fatalf("page %d is %v after Flush, want I", p, st)
		}
	}
}

// TestAccessErrors: unknown regions and pages out of range are refused;
// a cancelled access gives up with the context's error.
func TestAccessErrors(t *testing.T) {
	d := newDaemon(t, 0)
	ctx := context.Background()
	nop := func([]byte) {}
	if err := d.c.Access(ctx, regionR+1, 0, false, nop); !errors.Is(err, ErrUnknownRegion) {
		t.Errorf("unknown region: %v", err)
	}
	if err := d.c.Access(ctx, regionR, 1<<20, false, nop); !errors.Is(err, ErrPageRange) {
		t.Errorf("page out of range: %v", err)
	}
	d.home.mu.Lock()
	d.home.honourCtx = true
	d.home.mu.Unlock()
	open := d.home.gate(5)
	defer open()
	cctx, cancel := context.WithCancel(ctx)
	go func() { d.home.waitEntered(t, 5); cancel() }()
	if err := d.c.Access(cctx, regionR, 5, true, nop); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled access: %v", err)
	}
}

// TestWriteBack: WriteBack gives a page up whatever the cache holds of it
// and always tells the engine (Evict without data unless the page is
// Modified here), so that a tenure the engine holds without the cache is
// written back: a Shared copy is dropped, nothing held is an Evict alone,
// a Modified page is written back as Flush does.
func TestWriteBack(t *testing.T) {
	d := newDaemon(t, 0)
	ctx := context.Background()
	if err := d.c.Access(ctx, regionR, 2, false, func([]byte) {}); err != nil {
		t.Fatal(err)
	}
	if err := d.c.WriteBack(ctx, regionR, 2); err != nil {
		t.Fatal(err)
	}
	if st, c := d.state(2), d.home.counts(); st != Invalid || c.evictions != 1 || c.writebacks != 0 {
		t.Fatalf("after WriteBack of a Shared page: %v, %+v; want I, one eviction without data", st, c)
	}
	if err := d.c.WriteBack(ctx, regionR, 4); err != nil { // never held
		t.Fatal(err)
	}
	if c := d.home.counts(); c.evictions != 2 || c.writebacks != 0 {
		t.Fatalf("after WriteBack of a page not held: %+v; want a second eviction without data", c)
	}
	if err := d.c.Access(ctx, regionR, 5, true, func(b []byte) { b[0] = 9 }); err != nil {
		t.Fatal(err)
	}
	if err := d.c.WriteBack(ctx, regionR, 5); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, ps)
	d.home.Get(regionR, 5, buf)
	if st, c := d.state(5), d.home.counts(); st != Invalid || c.writebacks != 1 || buf[0] != 9 {
		t.Fatalf("after WriteBack of a Modified page: %v, %+v, home byte %d; want I, one write-back of 9", st, c, buf[0])
	}
	if err := d.c.WriteBack(ctx, regionR, 1<<40); err == nil {
		t.Fatal("WriteBack past the region's end succeeded")
	}
}
