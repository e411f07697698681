package dsm

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dsmkit/dsm/internal/mapclient/mapclienttest"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// fakeDsmd stands in for dsmd where a test needs what a real one does not
// do on demand: its Client service (Session, GetRegion, DeleteRegion,
// Sync) over gRPC on a Unix socket, with a directory of its own, and its
// mapping sessions from mapclienttest, which may serve a name as another
// region than the directory says (a page cache lagging behind).
type fakeDsmd struct {
	dsmpb.UnimplementedClientServer
	addr string
	maps *mapclienttest.Daemon

	mu  sync.Mutex
	dir map[string]mapclienttest.Region // the directory
}

// newFakeDsmd starts a fakeDsmd whose directory and page cache both have
// regions. It stops at the end of the test.
func newFakeDsmd(t *testing.T, regions ...mapclienttest.Region) *fakeDsmd {
	t.Helper()
	f := &fakeDsmd{maps: mapclienttest.New(t, regions...), dir: make(map[string]mapclienttest.Region)}
	for _, r := range regions {
		f.dir[r.Name] = r
	}
	f.addr = filepath.Join(t.TempDir(), "dsmd.sock")
	ln, err := net.Listen("unix", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	dsmpb.RegisterClientServer(s, f)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	return f
}

// setDir makes the directory name r (as if created again).
func (f *fakeDsmd) setDir(r mapclienttest.Region) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dir[r.Name] = r
}

func (f *fakeDsmd) Session(context.Context, *dsmpb.SessionRequest) (*dsmpb.SessionResponse, error) {
	return &dsmpb.SessionResponse{NodeId: 1, Version: "fake", MapSocket: f.maps.Path}, nil
}

func (f *fakeDsmd) GetRegion(_ context.Context, req *dsmpb.GetRegionRequest) (*dsmpb.GetRegionResponse, error) {
	f.mu.Lock()
	r, ok := f.dir[req.GetName()]
	f.mu.Unlock()
	if !ok {
		return nil, status.Errorf(codes.NotFound, "region %q not found", req.GetName())
	}
	return &dsmpb.GetRegionResponse{Region: &dsmpb.Region{Name: r.Name, Id: uint32(r.ID),
		Size: uint64(r.Pages * 4096), PageSize: 4096, Durability: dsmpb.Durability_DURABILITY_MEMORY}}, nil
}

// DeleteRegion refuses a region with a live session unless forced, as
// dsmd does, and ends those sessions when forced.
func (f *fakeDsmd) DeleteRegion(_ context.Context, req *dsmpb.DeleteRegionRequest) (*dsmpb.DeleteRegionResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.dir[req.GetName()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "region %q not found", req.GetName())
	}
	var open uint64
	for _, s := range f.maps.Sessions() {
		if s.Region == r && !s.Ended {
			open++
		}
	}
	if open > 0 && !req.GetForce() {
		return nil, status.Errorf(codes.FailedPrecondition, "region %q is mapped by %d processes", r.Name, open)
	}
	delete(f.dir, r.Name)
	f.maps.DeleteRegion(r.Name)
	return &dsmpb.DeleteRegionResponse{Id: uint32(r.ID), Mappings: open}, nil
}

// Sync succeeds for any region the directory has: a Sync of a dead Region
// must fail on the mapping's state, not on dsmd's answer.
func (f *fakeDsmd) Sync(_ context.Context, req *dsmpb.SyncRequest) (*dsmpb.SyncResponse, error) {
	f.mu.Lock()
	_, ok := f.dir[req.GetRegion()]
	f.mu.Unlock()
	if !ok {
		return nil, status.Errorf(codes.NotFound, "region %q not found", req.GetRegion())
	}
	return &dsmpb.SyncResponse{}, nil
}

// A region deleted while mapped (with Force; without, DeleteRegion is
// ErrInUse): the Region dies with ErrRegionDeleted, which is also
// ErrUnknownRegion, every access fails with it, and plain accesses through
// Bytes() fault whatever the page's state, rather than read or write the
// memory that dsmd punched out.
func TestRegionDeleted(t *testing.T) {
	f := newFakeDsmd(t, mapclienttest.Region{Name: "r", ID: 7, Pages: 4})
	ctx := ctxT(t)
	c := dial(t, ctx, f.addr)
	r, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 1)
	if _, err := r.ReadAt(got, 0); err != nil || got[0] != 1 {
		t.Fatalf("ReadAt = %#x, %v", got, err)
	}
	if err := c.DeleteRegion(ctx, "r"); !errors.Is(err, ErrInUse) {
		t.Fatalf("DeleteRegion of a mapped region: %v, want ErrInUse", err)
	}
	if r.Err() != nil {
		t.Fatalf("Err after a refused delete: %v", r.Err())
	}
	if err := c.DeleteRegion(ctx, "r", Force()); err != nil {
		t.Fatalf("DeleteRegion with Force: %v", err)
	}
	select {
	case <-r.Done():
	case <-time.After(hang):
		t.Fatal("Done not closed after the region was deleted")
	}
	err = r.Err()
	if !errors.Is(err, ErrRegionDeleted) || !errors.Is(err, ErrUnknownRegion) || errors.Is(err, ErrDaemonUnavailable) {
		t.Fatalf("Err = %v, want ErrRegionDeleted (and so ErrUnknownRegion)", err)
	}
	if !strings.Contains(err.Error(), "was deleted") {
		t.Errorf("Err does not say what dsmd said: %v", err)
	}
	for _, a := range []struct {
		what  string
		off   int
		store bool
	}{
		{"load of a page held before", 0, false},
		{"load of a page never held", 4096 + 1, false},
		{"store to a page never held", 2*4096 + 2, true},
	} {
		if faulted, v := touch(t, r.Bytes(), a.off, a.store); !faulted {
			t.Errorf("%s after the delete: no fault (read %#x)", a.what, v)
		}
	}
	for what, err := range map[string]error{
		"ReadAt":   func() error { _, err := r.ReadAt(got, 0); return err }(),
		"WriteAt":  func() error { _, err := r.WriteAt(got, 0); return err }(),
		"Prefault": r.Prefault(0, 4096, false),
		"Load":     func() error { _, err := r.LoadUint64(ctx, 8); return err }(),
		"Add":      func() error { _, err := r.AddUint64(ctx, 8, 1); return err }(),
		"Sync":     r.Sync(ctx),
	} {
		if !errors.Is(err, ErrRegionDeleted) {
			t.Errorf("%s after the delete: %v, want ErrRegionDeleted", what, err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := c.Map(ctx, "r"); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("Map after the delete: %v, want ErrUnknownRegion", err)
	}
}

// The page cache serves the name as another region than the directory
// has (the region was deleted and created again, and the page cache has
// not caught up): Map does not hand that mapping out, but closes it and
// tries again until the ids agree.
func TestMapRegionIDMismatch(t *testing.T) {
	old := mapclienttest.Region{Name: "r", ID: 1, Pages: 2}
	f := newFakeDsmd(t, old)
	cur := mapclienttest.Region{Name: "r", ID: 2, Pages: 2}
	f.setDir(cur)
	ctx := ctxT(t)
	c := dial(t, ctx, f.addr)
	type result struct {
		r   *Region
		err error
	}
	res := make(chan result, 1)
	go func() {
		r, err := c.Map(ctx, "r")
		res <- result{r, err}
	}()
	// Two mappings of the old region made and closed by the library.
	for {
		n := 0
		for _, s := range f.maps.Sessions() {
			if s.Region == old && s.Ended {
				n++
			}
		}
		if n >= 2 {
			break
		}
		select {
		case r := <-res:
			t.Fatalf("Map returned while only the old region was served: %v", r.err)
		case <-time.After(time.Millisecond):
		}
	}
	f.maps.SetRegion(cur)
	var r result
	select {
	case r = <-res:
	case <-time.After(hang):
		t.Fatal("Map did not return once the page cache caught up")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.r.Close()
	if id := r.r.m.Region(); id != cur.ID {
		t.Fatalf("Map returned a mapping of %s, want %s", id, cur.ID)
	}
	for _, s := range f.maps.Sessions() {
		if s.Region == old && !s.Ended {
			t.Errorf("a mapping of the old region was left open")
		}
	}
}
