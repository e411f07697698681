package dsm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/mapclient"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// mapLag bounds how long Map waits for a region that the directory has
// but this dsmd's page cache has not taken yet (it follows the directory
// asynchronously, so right after CreateRegion the two may differ briefly).
const mapLag = 10 * time.Second

// Region is this process's coherent mapping of one region. It is safe for
// concurrent use. Create it with Client.Map; Close it when done.
type Region struct {
	c    *Client
	name string
	m    *mapclient.Mapping

	closeOnce sync.Once
	closeErr  error
}

// mapClient returns the Client's mapping-session client, connecting it on
// first use.
func (c *Client) mapClient(ctx context.Context) (*mapclient.Client, error) {
	c.mu.Lock()
	mc := c.mc
	c.mu.Unlock()
	if mc != nil {
		return mc, nil
	}
	mc, err := mapclient.Connect(ctx, c.mapSocket)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		mc.Close()
		return nil, mapclient.ErrClosed
	}
	if c.mc != nil { // another Map connected meanwhile
		mc.Close()
		return c.mc, nil
	}
	c.mc = mc
	return mc, nil
}

// DefaultFaultTimeout is how long an access to a page of a mapped region
// waits for a page the cluster cannot serve before it fails, unless Map is
// given WithFaultTimeout.
const DefaultFaultTimeout = 30 * time.Second

// MapOption is an option of Map.
type MapOption func(*mapSpec)

type mapSpec struct {
	faultTimeout time.Duration
}

// WithFaultTimeout bounds how long an access to the mapping (a plain load
// or store through Bytes(), ReadAt, WriteAt, Prefault, the atomics) waits
// for a page that the cluster cannot serve now, because its home is down
// or unreachable, or because this machine's dsmd holds no lease (it is cut
// off from the directory's majority) (default DefaultFaultTimeout). After d it fails: ReadAt
// and the others with ErrUnavailable, a plain access with SIGBUS (see the
// package documentation, "Failures"). ReadAt, WriteAt, Prefault and the
// atomics also fail with ErrUnavailable when this machine's dsmd has shown
// no lease for d (it is stopped or stuck: the mapping's watchdog holds it).
// Zero or negative: wait as long as it takes. Waiting for a page that other
// nodes are using (contention) never fails this way.
func WithFaultTimeout(d time.Duration) MapOption {
	return func(s *mapSpec) { s.faultTimeout = d }
}

// Map maps the region name into this process. ctx bounds the handshake
// with dsmd. An unknown name is ErrUnknownRegion; a dsmd without a page
// cache gives ErrNoMappings; a dsmd that cannot be reached gives
// ErrDaemonUnavailable. Every Map of a region on one machine shares the
// same physical pages, in this process and in others. The mapping is
// always of the region the directory names now: right after a region was
// deleted and created again under the same name, Map waits (within ctx)
// until this dsmd serves the new one.
func (c *Client) Map(ctx context.Context, name string, opts ...MapOption) (*Region, error) {
	const op = "map"
	spec := mapSpec{faultTimeout: DefaultFaultTimeout}
	for _, o := range opts {
		o(&spec)
	}
	if c.isClosed() {
		return nil, newErr(op, name, noOffset, ErrClosed, nil)
	}
	if c.mapSocket == "" {
		return nil, newErr(op, name, noOffset, ErrNoMappings,
			fmt.Errorf("dsmd at %s (node %d) runs without a page cache; map through a dsmd that has one", c.addr, c.nodeID))
	}
	mc, err := c.mapClient(ctx)
	if err != nil {
		return nil, newErr(op, name, noOffset, ErrDaemonUnavailable, fmt.Errorf("mapping socket %s: %w", c.mapSocket, err))
	}
	// The directory is the authority on which regions exist and on their
	// ids; the page cache may lag behind it either way.
	info, err := c.rpc.GetRegion(ctx, &dsmpb.GetRegionRequest{Name: name})
	if err != nil {
		return nil, rpcErr(op, name, err)
	}
	if why := info.GetNotServed(); why != "" {
		return nil, newErr(op, name, noOffset, ErrUnavailable, errors.New(why))
	}
	want := ids.RegionID(info.GetRegion().GetId())
	start := time.Now()
	wait := 5 * time.Millisecond
	var m *mapclient.Mapping
	for {
		m, err = mc.MapWith(ctx, name, mapclient.Options{FaultTimeout: spec.faultTimeout, Session: true})
		switch {
		case err == nil && (want == 0 || m.Region() == want):
		case err == nil:
			// The page cache serves another region under this name: one
			// deleted since (its pages are not this region's) or created
			// again after the directory answered. Never hand it out.
			err = fmt.Errorf("this dsmd maps %q as %s, the directory has %s", name, m.Region(), want)
			m.Close()
		case errors.Is(err, mapclient.ErrUnknownRegion):
		default:
			if cerr := ctx.Err(); cerr != nil {
				return nil, newErr(op, name, noOffset, cerr, err)
			}
			return nil, mapErr(op, name, noOffset, err)
		}
		if err == nil {
			break
		}
		// The page cache does not know the region, or not as the
		// directory does: ask the directory again whether and as what it
		// exists.
		info, gerr := c.rpc.GetRegion(ctx, &dsmpb.GetRegionRequest{Name: name})
		if gerr != nil {
			if status.Code(gerr) == codes.NotFound {
				return nil, newErr(op, name, noOffset, ErrUnknownRegion, gerr)
			}
			return nil, rpcErr(op, name, gerr)
		}
		if why := info.GetNotServed(); why != "" {
			return nil, newErr(op, name, noOffset, ErrUnavailable, errors.New(why))
		}
		want = ids.RegionID(info.GetRegion().GetId())
		if time.Since(start) > mapLag {
			return nil, mapErr(op, name, noOffset, fmt.Errorf("the directory has the region (%s) but the page cache still does not serve it after %v: %w", want, mapLag, err))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, newErr(op, name, noOffset, ctx.Err(), err)
		case <-t.C:
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
	r := &Region{c: c, name: name, m: m}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		m.Close()
		return nil, newErr(op, name, noOffset, ErrClosed, nil)
	}
	c.regions[r] = struct{}{}
	c.mu.Unlock()
	return r, nil
}

// Name is the region's name.
func (r *Region) Name() string { return r.name }

// Len is the region's size in bytes.
func (r *Region) Len() int64 { return r.m.Len() }

// PageSize is the region's page size: its unit of coherence.
func (r *Region) PageSize() int64 { return r.m.PageSize() }

// Session is the token by which dsmd names this mapping session in the
// whole cluster (0 when dsmd gave none): the Mutex, Barrier and Semaphore
// record it in region memory, and a *DeadPartyError names a dead party by
// it.
func (r *Region) Session() uint64 { return r.m.Session() }

// Bytes returns the coherent mapping: plain loads and stores, at memory
// speed on pages this machine holds. A load or store that misses blocks its
// OS thread in the kernel until dsmd has fetched the page; the Go runtime
// cannot preempt the thread meanwhile, so a garbage collection waits for
// it too. Use ReadAt and WriteAt (or Prefault first) for bulk or unknown
// ranges.
//
// An access to a page that the cluster cannot serve (its home is down)
// waits at most the mapping's fault timeout (WithFaultTimeout), then
// raises SIGBUS, as does every access to that page until it is served
// again (Unavailable lists such pages); see the package documentation,
// "Failures".
//
// Once the Region is dead (Done is closed: dsmd went away, the region was
// deleted, or Close) the memory is inaccessible: every access, including
// one that was waiting for dsmd at that moment, raises SIGSEGV instead of
// reading zeros or stale data or storing into memory nobody serves. Go
// crashes the program on such a fault ("unexpected fault address") unless
// the goroutine has called debug.SetPanicOnFault(true), which turns it into
// a panic that the goroutine can recover; see the package documentation.
// After Close the memory is unmapped.
func (r *Region) Bytes() []byte { return r.m.Bytes() }

// UnavailablePage is a page of a mapped Region that accesses fail on, and
// why (see WithFaultTimeout).
type UnavailablePage struct {
	Page   int64  // the page's number (Offset / PageSize())
	Offset int64  // of its first byte
	Why    string // dsmd's reason, naming the page, the node and its role
}

// Unavailable lists the pages of the mapping that accesses fail on now,
// by page number: a fault on each waited longer than the fault timeout
// for a page the cluster could not serve (WithFaultTimeout). A page leaves
// the list once dsmd serves it again; then it is accessed as usual. A
// plain access may fault on a page an instant before it is listed (the
// library learns of it from dsmd's message); FaultErr waits for that.
func (r *Region) Unavailable() []UnavailablePage {
	ps := r.m.Unavailable()
	out := make([]UnavailablePage, len(ps))
	for i, p := range ps {
		out[i] = UnavailablePage{Page: int64(p.Page), Offset: p.Offset, Why: p.Why}
	}
	return out
}

// FaultErr says why an access through Bytes() at off faulted (a panic
// recovered by a goroutine that called debug.SetPanicOnFault(true)): Err's
// error if the Region is dead; ErrUnavailable naming the page and why if
// the page is unavailable (it waits, at most a few seconds, for dsmd's
// reason when the fault came first). Call it only after such a fault: for
// a page that is not unavailable it waits those seconds and then returns
// an ErrUnavailable that says dsmd gave no reason.
func (r *Region) FaultErr(off int64) error {
	return mapErr("access", r.name, off, r.m.FaultErr(off))
}

// Done is closed when the mapping stops being served: dsmd went away, the
// region was deleted, or Close.
func (r *Region) Done() <-chan struct{} { return r.m.Done() }

// Err is nil while the mapping is served; after dsmd went away it matches
// ErrDaemonUnavailable, after the region was deleted ErrRegionDeleted (and
// so ErrUnknownRegion), after Close ErrClosed.
func (r *Region) Err() error {
	return mapErr("access", r.name, noOffset, r.m.Err())
}

// ReadAt copies len(p) bytes at off into p (io.ReaderAt). Missing pages
// are faulted in from a syscall, so a miss waits there, not in a load.
// Reading past the end returns the bytes before it and io.EOF. If dsmd goes
// away meanwhile it returns the bytes copied before that and an error that
// matches ErrDaemonUnavailable, never bytes dsmd did not serve. A page the
// cluster cannot serve fails it with ErrUnavailable after the fault
// timeout (WithFaultTimeout), naming the page and why.
func (r *Region) ReadAt(p []byte, off int64) (int, error) {
	n, err := r.m.ReadAt(p, off)
	if err == nil || err == io.EOF {
		return n, err
	}
	return n, mapErr("read", r.name, off, err)
}

// WriteAt copies p into the region at off (io.WriterAt), faulting the
// pages in for writing from a syscall first. A write that would pass the
// end writes nothing and fails with ErrOutOfRange. If dsmd goes away
// meanwhile it fails with ErrDaemonUnavailable: the bytes after the count
// returned may or may not have been written.
func (r *Region) WriteAt(p []byte, off int64) (int, error) {
	n, err := r.m.WriteAt(p, off)
	return n, mapErr("write", r.name, off, err)
}

// Prefault faults the pages of [off, off+length) in from a syscall (for
// writing if write) without copying, so that plain accesses through Bytes()
// that follow find them mapped, unless the coherence protocol takes them
// away again in between (another node reads or writes them).
func (r *Region) Prefault(off, length int64, write bool) error {
	return mapErr("prefault", r.name, off, r.m.Populate(off, length, write))
}

// word runs f on the aligned word at off through the mapping (see
// mapclient.Mapping.Word).
func (r *Region) word(ctx context.Context, op string, off int64, write bool, f func(w *uint64)) error {
	if err := ctx.Err(); err != nil {
		return newErr(op, r.name, off, nil, err)
	}
	if kind, cause := r.checkWords(off, 1); kind != nil {
		return newErr(op, r.name, off, kind, cause)
	}
	return mapErr(op, r.name, off, r.m.Word(off, write, f))
}

// checkWords checks that n aligned words at off lie inside the region. It
// returns the sentinel and the detail of what is wrong.
func (r *Region) checkWords(off int64, n int64) (kind, cause error) {
	size := r.m.Len()
	switch {
	case off < 0 || off > size-8*n:
		return ErrOutOfRange, fmt.Errorf("%d bytes at %d do not fit in the region's %d", 8*n, off, size)
	case off%8 != 0:
		return ErrUnaligned, nil
	}
	return nil, nil
}

// LoadUint64 atomically loads the 8-byte word at off, which must be a
// multiple of 8 inside the region. See the package documentation for why
// the atomics are linearizable cluster-wide. ctx is checked before the
// operation; a miss in progress is not interrupted.
func (r *Region) LoadUint64(ctx context.Context, off int64) (uint64, error) {
	var v uint64
	err := r.word(ctx, "load", off, false, func(w *uint64) { v = atomic.LoadUint64(w) })
	return v, err
}

// StoreUint64 atomically stores v into the 8-byte word at off.
func (r *Region) StoreUint64(ctx context.Context, off int64, v uint64) error {
	return r.word(ctx, "store", off, true, func(w *uint64) { atomic.StoreUint64(w, v) })
}

// AddUint64 atomically adds delta (wrapping) to the 8-byte word at off and
// returns the new value. To subtract d, add ^uint64(d-1).
func (r *Region) AddUint64(ctx context.Context, off int64, delta uint64) (uint64, error) {
	var nv uint64
	err := r.word(ctx, "add", off, true, func(w *uint64) { nv = atomic.AddUint64(w, delta) })
	return nv, err
}

// CompareAndSwapUint64 atomically stores new into the 8-byte word at off if
// it holds old, and reports whether it did.
func (r *Region) CompareAndSwapUint64(ctx context.Context, off int64, old, new uint64) (bool, error) {
	var ok bool
	err := r.word(ctx, "compare-and-swap", off, true, func(w *uint64) { ok = atomic.CompareAndSwapUint64(w, old, new) })
	return ok, err
}

// Sync is the durability point of the whole region: when it returns, the
// region's dirty pages held by this machine are written back to their
// homes and to the region's backups (and leave this machine's cache), so
// the crash of this machine, or of as many other nodes as the region has
// backups, no longer loses them. For a Durable region it also waits until
// the pages this machine wrote are on disk at their homes and backups (a
// restart of the whole cluster then finds them), and fails when a disk
// there cannot take them, or with ErrDataLost when one of those writes was
// lost before, with more of the nodes that held it than the region has
// backups (each such loss is reported once). On a dead Region it fails
// as Err does (nothing it could sync is this mapping's any more), also
// when the mapping dies while Sync runs.
func (r *Region) Sync(ctx context.Context) error {
	const op = "sync"
	if err := r.m.Err(); err != nil {
		return mapErr(op, r.name, noOffset, err)
	}
	_, err := r.c.rpc.Sync(ctx, &dsmpb.SyncRequest{Region: r.name})
	if merr := r.m.Err(); merr != nil {
		return mapErr(op, r.name, noOffset, merr)
	}
	return rpcErr(op, r.name, err)
}

// Close detaches the mapping from dsmd and unmaps it. Plain accesses
// through Bytes() must have stopped; calls of the other methods still in
// progress fail with ErrClosed, later ones too. Closing twice is harmless.
func (r *Region) Close() error {
	r.closeOnce.Do(func() {
		r.closeErr = mapErr("close", r.name, noOffset, r.m.Close())
		r.c.mu.Lock()
		delete(r.c.regions, r)
		r.c.mu.Unlock()
	})
	return r.closeErr
}
