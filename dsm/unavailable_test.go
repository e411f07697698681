//go:build linux

package dsm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/uffd"
	"github.com/dsmkit/dsm/node"
	"github.com/dsmkit/dsm/node/localcache"
)

// downHome is a single node's backing store whose misses of the pages in
// down fail as an engine's do when the page's home is down.
type downHome struct {
	localcache.MemHome
	mu   sync.Mutex
	down map[ids.PageNo]bool
}

func (h *downHome) set(p ids.PageNo, down bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.down[p] = down
}

func (h *downHome) check(r ids.RegionID, p ids.PageNo) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down[p] {
		return fmt.Errorf("page %s of region r (%s) unavailable: its home n3 failed in epoch 7: %w", p, r, localcache.ErrUnavailable)
	}
	return nil
}

func (h *downHome) ReadMiss(ctx context.Context, r ids.RegionID, p ids.PageNo, buf []byte) error {
	if err := h.check(r, p); err != nil {
		return err
	}
	return h.MemHome.ReadMiss(ctx, r, p, buf)
}

func (h *downHome) WriteMiss(ctx context.Context, r ids.RegionID, p ids.PageNo, buf []byte) error {
	if err := h.check(r, p); err != nil {
		return err
	}
	return h.MemHome.WriteMiss(ctx, r, p, buf)
}

// TestFaultTimeout: with WithFaultTimeout, ReadAt, WriteAt, Prefault and
// the atomics on a page whose home is down fail with ErrUnavailable naming
// the page and why, instead of waiting; Unavailable lists the page; once
// the page is served again it is read and written as usual. (Plain
// accesses are not made here: this test's dsmd runs in the test process.
// node/localcache's tests and tests/TestUnavailablePageFails cover them.)
func TestFaultTimeout(t *testing.T) {
	if f, err := uffd.Probe(); err != nil || f&uffd.FeaturePoison == 0 {
		t.Skipf("no UFFDIO_POISON here (%v, %v)", f, err)
	}
	home := &downHome{down: map[ids.PageNo]bool{}}
	n, err := node.New(testConfig(t.TempDir()), node.Options{Coherence: home})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	ctx := ctxT(t)
	c := dial(t, ctx, n.Addrs().Socket)
	if err := c.CreateRegion(ctx, "r", 16*4096); err != nil {
		t.Fatal(err)
	}
	// The timeout counts the time dsmd holds no lease too: on a loaded
	// machine this one-node dsmd's lease has lapsed for over a second
	// (the fault then fails saying so, not naming the home). Three
	// seconds keep such a lapse out of the test.
	r, err := c.Map(ctx, "r", WithFaultTimeout(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	home.set(3, true)
	const off = 3*4096 + 8
	_, err = r.ReadAt(make([]byte, 8), off)
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "p3") || !strings.Contains(err.Error(), "home n3") {
		t.Fatalf("ReadAt of a page whose home is down: %v, want ErrUnavailable naming p3 and n3", err)
	}
	t.Logf("ReadAt: %v", err)
	var de *Error
	if !errors.As(err, &de) || de.Op != "read" || de.Offset != off {
		t.Fatalf("ReadAt's error %#v", err)
	}
	// Every other access to the page fails the same way, at once.
	if _, err := r.WriteAt([]byte("x"), off); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("WriteAt: %v", err)
	}
	if err := r.Prefault(3*4096, 4096, false); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Prefault: %v", err)
	}
	if _, err := r.AddUint64(ctx, off, 1); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("AddUint64: %v", err)
	}
	if r.Err() != nil {
		t.Fatalf("the Region died: %v", r.Err())
	}
	u := r.Unavailable()
	if len(u) != 1 || u[0].Page != 3 || u[0].Offset != 3*4096 || !strings.Contains(u[0].Why, "home n3") {
		t.Fatalf("Unavailable() = %+v", u)
	}
	if err := r.FaultErr(off); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "home n3") {
		t.Fatalf("FaultErr on the poisoned page: %v", err)
	}
	// Other pages work meanwhile.
	if _, err := r.WriteAt([]byte("other"), 4*4096); err != nil {
		t.Fatal(err)
	}

	home.set(3, false)
	deadline := time.Now().Add(hang)
	for len(r.Unavailable()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("page 3 still unavailable: %+v", r.Unavailable())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if v, err := r.AddUint64(ctx, off, 5); err != nil || v != 5 {
		t.Fatalf("AddUint64 after the page came back: %d, %v", v, err)
	}
	b := make([]byte, 8)
	if _, err := r.ReadAt(b, off); err != nil || b[0] != 5 {
		t.Fatalf("ReadAt after the page came back: %x, %v", b, err)
	}
}
