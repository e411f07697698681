//go:build linux

package localcache

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/localsock"
	"github.com/dsmkit/dsm/internal/mapproto"
	"github.com/dsmkit/dsm/internal/memfd"
)

// Sentinel errors.
var (
	// ErrClosed: the Cache was closed.
	ErrClosed = errors.New("localcache: closed")
	// ErrUnknownRegion: no region with that id or name.
	ErrUnknownRegion = errors.New("localcache: unknown region")
	// ErrRegionExists: AddRegion with an id or name already in use.
	ErrRegionExists = errors.New("localcache: region exists")
	// ErrBadRegion: a region spec with a bad size or page size.
	ErrBadRegion = errors.New("localcache: bad region spec")
	// ErrPageRange: a page number beyond the region's end.
	ErrPageRange = errors.New("localcache: page out of range")
	// ErrShortBuffer: a buffer smaller than the region's page size.
	ErrShortBuffer = errors.New("localcache: buffer shorter than a page")
	// ErrPageValid: Install on a page this node already holds.
	ErrPageValid = errors.New("localcache: page already held")
	// ErrBusy: the Coherence engine refused a call on a page because a
	// remote request is taking the page; retry after releasing its lock.
	ErrBusy = errors.New("localcache: page busy with a remote request")
	// ErrUnavailable: the Coherence engine gave up on a page because a node
	// it waits for is down or unreachable. Access and Flush return it
	// instead of retrying; a client's fault keeps waiting, until its
	// FaultTimeout, when it is poisoned (see the package doc).
	ErrUnavailable = errors.New("localcache: page unavailable")
	// ErrLost marks an ErrUnavailable for good: no copy of the page is
	// left anywhere. A client's fault on it is poisoned at once, without
	// waiting for its FaultTimeout.
	ErrLost = errors.New("localcache: page lost")
	// ErrEvictPending: Coherence.Evict failed after the engine took the
	// eviction over: the write-back completes later (or never, if the
	// page's home is gone) with the data the engine kept. The cache must
	// not take the page back as Modified: the engine no longer treats this
	// node as its holder once the write-back lands.
	ErrEvictPending = errors.New("localcache: write-back pending")
	// ErrRegionRemoved: the region was removed (deleted) while the call
	// was in progress. It matches ErrUnknownRegion.
	ErrRegionRemoved = fmt.Errorf("%w: removed", ErrUnknownRegion)
	// ErrSuspended: the Cache is suspended (Suspend): Install refuses to
	// place a page until Resume.
	ErrSuspended = errors.New("localcache: suspended (no lease)")
	// ErrEnded: End was called: this Cache serves nothing more (dsmd's
	// incarnation that runs it was declared failed). It matches
	// ErrUnavailable; the error's text says why.
	ErrEnded = fmt.Errorf("%w: this dsmd incarnation serves nothing more", ErrUnavailable)
)

// DefaultPageSize is the page size of a region whose spec gives none (or
// the system page size where that is larger).
const DefaultPageSize = 4096

// Config configures a Cache.
type Config struct {
	// Coherence resolves misses and receives evictions. Required.
	Coherence Coherence
	// CapacityPages bounds the pages held (Shared or Modified) over all
	// regions; beyond it the oldest installed pages are evicted. Zero means
	// unbounded. The bound is exceeded by at most the number of faults in
	// flight: eviction runs after a fault is answered.
	CapacityPages int
	// Logger receives diagnostics; nil discards them.
	Logger *slog.Logger
	// Proto is this dsmd's protocol id in the cluster (the directory
	// gives one to each process incarnation), the high part of the
	// session tokens it hands out (mapproto.FeatureSession); nil or 0:
	// sessions get no token.
	Proto func() ids.NodeID
	// SocketPerm is the mode and group of the socket Listen creates; a
	// zero Mode means 0600.
	SocketPerm localsock.Perm
	// Admit, when set, judges each peer of the socket (its credentials,
	// and whether it may use the socket at all). A peer it refuses is told
	// why (Error{CodePermissionDenied}) in answer to its first message,
	// and nothing is served to it. Nil admits every peer.
	Admit func(conn net.Conn) *localsock.Addr
	// MayMap, when set, decides whether an admitted peer may map the
	// region named; its error is the refusal's text. Nil allows all.
	MayMap func(peer localsock.Identity, region string) error
	// Control, when set, answers the requests of control sessions
	// (mapproto.Ctl) for the admitted peer; an error made by Refuse
	// carries its code to the client, any other is CodeInternal. Nil:
	// control sessions are refused (CodeBadRequest).
	Control func(ctx context.Context, peer localsock.Identity, req mapproto.Ctl) (mapproto.Ctl, error)
	// LeasePage makes the Cache keep a lease page (leasepage.go) and give
	// it to the clients that ask (mapproto.FeatureLeasePage), whose
	// watchdogs then make their mappings inaccessible once its deadline
	// passes. It reads "no lease" until the first SetLease: set it only
	// where something (dsmd's lease guard) calls SetLease.
	LeasePage bool
}

// RegionSpec describes a region to serve.
type RegionSpec struct {
	ID       ids.RegionID
	Name     string
	Size     int64 // bytes, a multiple of PageSize; may far exceed memory (sparse)
	PageSize int64 // a multiple of the system page size; 0 means DefaultPageSize
}

// Cache is one node's page cache: per region a memfd shared by the daemon
// and every local client mapping, the local MSI state of each page, and the
// fault service of the attached clients. See the package doc.
type Cache struct {
	coh      Coherence
	proto    func() ids.NodeID
	log      *slog.Logger
	capacity int64

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine the Cache started

	mu       sync.Mutex
	closed   bool
	draining string // Drain's reason: no session is served any more
	// endReason is End's reason; ended is closed by End. After it no
	// session is served and dsmd's own calls fail (endErr).
	endReason string
	ended     chan struct{}
	regions   map[ids.RegionID]*region
	byName    map[string]*region
	clients   map[*client]struct{}
	listeners map[*localsock.Listener]struct{}
	perm      localsock.Perm
	admit     func(net.Conn) *localsock.Addr
	mayMap    func(localsock.Identity, string) error
	control   func(context.Context, localsock.Identity, mapproto.Ctl) (mapproto.Ctl, error)
	sessions  map[*net.UnixConn]struct{}
	lease     *leasePage // nil without Config.LeasePage

	lruMu sync.Mutex
	lru   list.List // of *page: the pages held, oldest install first

	// Suspension (suspend.go). suspendMu serializes Suspend, Resume and
	// DiscardSuspended. suspended is set and cleared under gateMu and
	// read under page locks: an operation that holds a page's lock and
	// reads false may call Coherence for that page, because Suspend sets
	// it before it takes any page lock and takes every page's lock before
	// it returns.
	suspendMu sync.Mutex
	suspended atomic.Bool
	// suspendedAt: when the current suspension began (UnixNano); set
	// with suspended, under gateMu.
	suspendedAt atomic.Int64
	// revoked: the current suspension revoked every local access (a
	// Suspend finished without error); the lease page says so.
	revoked   atomic.Bool
	gateMu    sync.Mutex
	resumed   chan struct{}   // closed while serving; open while suspended
	flight    context.Context // parent of every Coherence call; cancelled by Suspend
	flightEnd context.CancelFunc

	st counters
}

// New returns a Cache with no regions.
func New(cfg Config) (*Cache, error) {
	if cfg.Coherence == nil {
		return nil, errors.New("localcache: Config.Coherence is required")
	}
	if cfg.CapacityPages < 0 {
		return nil, fmt.Errorf("localcache: negative capacity %d", cfg.CapacityPages)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/shmem_enabled"); err == nil && !shmemTHPOff(string(b)) {
		log.Warn("transparent huge pages are enabled for shmem; page-granular invalidation assumes they are off",
			"shmem_enabled", strings.TrimSpace(string(b)))
	}
	var lease *leasePage
	if cfg.LeasePage {
		var err error
		if lease, err = newLeasePage(); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	flight, flightEnd := context.WithCancel(ctx)
	resumed := make(chan struct{})
	close(resumed)
	return &Cache{
		resumed:   resumed,
		flight:    flight,
		flightEnd: flightEnd,
		coh:       cfg.Coherence,
		proto:     cfg.Proto,
		log:       log,
		capacity:  int64(cfg.CapacityPages),
		ctx:       ctx,
		cancel:    cancel,
		regions:   make(map[ids.RegionID]*region),
		byName:    make(map[string]*region),
		clients:   make(map[*client]struct{}),
		listeners: make(map[*localsock.Listener]struct{}),
		perm:      cfg.SocketPerm,
		admit:     cfg.Admit,
		mayMap:    cfg.MayMap,
		control:   cfg.Control,
		sessions:  make(map[*net.UnixConn]struct{}),
		lease:     lease,
		ended:     make(chan struct{}),
	}, nil
}

// shmemTHPOff reports whether a shmem_enabled setting ("always
// within_size advise [never] deny force") keeps memfds on base pages: never
// and deny do, advise does as the Cache never asks for huge pages.
func shmemTHPOff(setting string) bool {
	for _, off := range []string{"[never]", "[deny]", "[advise]"} {
		if strings.Contains(setting, off) {
			return true
		}
	}
	return false
}

// region is one mapped region: its memfd, the daemon's mapping of it, and
// the pages with state or a resolution in progress.
type region struct {
	id       ids.RegionID
	name     string
	size     int64
	pageSize int64
	npages   uint64
	mf       *memfd.File
	mp       *memfd.Mapping
	mem      []byte // mp.Bytes(); written to install, read only where Shared or Modified
	bufs     sync.Pool
	// aside holds the Modified pages that Suspend set aside, each at its
	// offset in mf (see page.aside); created by the first Suspend that
	// sets a page aside, guarded by mu.
	aside *os.File

	mu      sync.Mutex
	pages   map[ids.PageNo]*page // entries exist while held (not Invalid) or referenced
	clients map[*client]struct{} // attached mappings, for write protection
	// refs counts the page references (page.refs) over all pages: while
	// it is above zero somebody may touch mem.
	refs int
	// removed is set by RemoveRegion: no new page reference is taken, and
	// drained is closed when refs falls to zero.
	removed bool
	drained chan struct{}
}

// page is the local state of one page. Absent from region.pages means
// Invalid with nobody resolving it.
type page struct {
	r  *region
	no ids.PageNo
	// lock is a one-slot semaphore held across a whole resolution or
	// remote action on the page, including the Coherence call of a miss.
	lock chan struct{}
	// refs counts goroutines holding or waiting for lock; guarded by r.mu.
	// The entry leaves r.pages when refs is 0 and the state is Invalid.
	refs int
	// state is written with lock held; readable at any time.
	state atomic.Uint32
	// elem is the page's place in Cache.lru while held; guarded by lruMu.
	elem *list.Element
	// aside: the page is Modified and Suspend set it aside: its data is in
	// the region's aside file, and mf has a hole there, until a fault or
	// an Access restores it, or Invalidate, Downgrade, an eviction or
	// DiscardSuspended takes it. Written with lock held.
	aside bool
}

func (pg *page) State() State { return State(pg.state.Load()) }

// AddRegion creates the region's memfd (sparse: nothing is allocated until
// pages are installed) and starts serving it.
func (c *Cache) AddRegion(spec RegionSpec) error {
	ps := spec.PageSize
	if ps == 0 {
		ps = max(DefaultPageSize, int64(os.Getpagesize()))
	}
	sys := int64(os.Getpagesize())
	if ps <= 0 || ps%sys != 0 || spec.Size <= 0 || spec.Size%ps != 0 || spec.ID == 0 || spec.Name == "" {
		return fmt.Errorf("%w: %s %q size %d page size %d", ErrBadRegion, spec.ID, spec.Name, spec.Size, ps)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if c.regions[spec.ID] != nil || c.byName[spec.Name] != nil {
		return fmt.Errorf("%w: %s %q", ErrRegionExists, spec.ID, spec.Name)
	}
	mf, err := memfd.Create("dsm-"+spec.Name, spec.Size)
	if err != nil {
		return fmt.Errorf("localcache: region %q: %w", spec.Name, err)
	}
	mp, err := mf.Map(0, spec.Size, memfd.ReadWrite)
	if err != nil {
		mf.Close()
		return fmt.Errorf("localcache: region %q: %w", spec.Name, err)
	}
	r := &region{
		id: spec.ID, name: spec.Name, size: spec.Size, pageSize: ps,
		npages: uint64(spec.Size / ps), mf: mf, mp: mp, mem: mp.Bytes(),
		pages:   make(map[ids.PageNo]*page),
		clients: make(map[*client]struct{}),
	}
	r.bufs.New = func() any { b := make([]byte, ps); return &b }
	c.regions[r.id] = r
	c.byName[r.name] = r
	return nil
}

func (c *Cache) region(id ids.RegionID) (*region, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	r := c.regions[id]
	if r == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknownRegion, id)
	}
	return r, nil
}

func (r *region) checkPage(p ids.PageNo) error {
	if uint64(p) >= r.npages {
		return fmt.Errorf("%w: %s of %s (%d pages)", ErrPageRange, p, r.id, r.npages)
	}
	return nil
}

// bytes is the daemon's mapping of page p. Read it only while p is Shared
// or Modified: reading a hole allocates a zero page (see package memfd).
func (r *region) bytes(p ids.PageNo) []byte {
	off := int64(p) * r.pageSize
	return r.mem[off : off+r.pageSize : off+r.pageSize]
}

// acquire takes page p's lock, creating its entry if needed. It fails
// with ErrRegionRemoved once the region is being removed.
func (r *region) acquire(ctx context.Context, p ids.PageNo) (*page, error) {
	r.mu.Lock()
	if r.removed {
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", ErrRegionRemoved, r.id)
	}
	pg := r.pages[p]
	if pg == nil {
		pg = &page{r: r, no: p, lock: make(chan struct{}, 1)}
		pg.state.Store(uint32(Invalid))
		r.pages[p] = pg
	}
	pg.refs++
	r.refs++
	r.mu.Unlock()
	select {
	case pg.lock <- struct{}{}:
		return pg, nil
	case <-ctx.Done():
		r.unref(pg)
		return nil, ctx.Err()
	}
}

// tryAcquire takes the lock of a page known to have an entry, or fails at
// once.
func (r *region) tryAcquire(pg *page) bool {
	r.mu.Lock()
	if r.removed {
		r.mu.Unlock()
		return false
	}
	pg.refs++
	r.refs++
	r.mu.Unlock()
	select {
	case pg.lock <- struct{}{}:
		return true
	default:
		r.unref(pg)
		return false
	}
}

func (r *region) release(pg *page) {
	<-pg.lock
	r.unref(pg)
}

func (r *region) unref(pg *page) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pg.refs--
	r.refs--
	if r.removed && r.refs == 0 {
		close(r.drained)
	}
	// With no reference left nobody can change the state meanwhile. An
	// entry reached through the residency list may already have been
	// replaced in the map (dropped and created again): leave the new one.
	if pg.refs == 0 && pg.State() == Invalid && r.pages[pg.no] == pg {
		delete(r.pages, pg.no)
	}
}

// setState moves a locked page to s and keeps the residency list and the
// counters in step.
func (c *Cache) setState(pg *page, s State) {
	old := pg.State()
	if old == s {
		return
	}
	pg.state.Store(uint32(s))
	if old == Modified {
		c.st.dirty.Add(-1)
		c.st.dirtyBytes.Add(-pg.r.pageSize)
	}
	if s == Modified {
		c.st.dirty.Add(1)
		c.st.dirtyBytes.Add(pg.r.pageSize)
	}
	c.lruMu.Lock()
	defer c.lruMu.Unlock()
	switch {
	case old == Invalid:
		pg.elem = c.lru.PushBack(pg)
		c.st.resident.Add(1)
		c.st.residentBytes.Add(pg.r.pageSize)
	case s == Invalid:
		c.lru.Remove(pg.elem)
		pg.elem = nil
		c.st.resident.Add(-1)
		c.st.residentBytes.Add(-pg.r.pageSize)
	}
}

// fill installs data as page p's contents in the memfd; the page must be
// Invalid (a hole), so writing it allocates it and reads nothing. It
// writes with pwrite rather than through the daemon's mapping, so that the
// daemon maps no page it does not use (Access): each page mapped writable
// and written is one more TLB flush when the page is punched (see revoke).
func (r *region) fill(p ids.PageNo, data []byte) {
	data = data[:r.pageSize]
	if n, err := unix.Pwrite(r.mf.Fd(), data, int64(p)*r.pageSize); err != nil || n != len(data) {
		copy(r.bytes(p), data) // as before: a fault that fails is SIGBUS
	}
}

// read copies held page p's contents into dst (one page), with pread, for
// the reason given at fill.
func (r *region) read(p ids.PageNo, dst []byte) {
	dst = dst[:r.pageSize]
	if n, err := unix.Pread(r.mf.Fd(), dst, int64(p)*r.pageSize); err != nil || n != len(dst) {
		copy(dst, r.bytes(p))
	}
}

// punch drops page p from the memfd and so from every local mapping.
func (r *region) punch(p ids.PageNo) error {
	return r.mf.PunchHole(int64(p)*r.pageSize, r.pageSize)
}

// protectAll write-protects page p in every attached client, so that no
// client store can land in it until the page lock is released. A client
// without the page mapped gets a marker that holds when it maps it later.
func (c *Cache) protectAll(r *region, p ids.PageNo) {
	r.mu.Lock()
	cls := make([]*client, 0, len(r.clients))
	for cl := range r.clients {
		cls = append(cls, cl)
	}
	r.mu.Unlock()
	for _, cl := range cls {
		err := cl.u.WriteProtect(cl.addr(p), uint64(r.pageSize), true, 0)
		if err != nil && !clientGone(err) {
			c.log.Warn("write-protect failed", "region", r.id, "page", p, "client", cl.id, "err", err)
			continue
		}
		cl.setWritable(p, false)
	}
}

// Invalidate drops page p of region r from this node, as the engine does
// when another node takes the page exclusively: the page is punched out of
// the memfd, so every local mapping loses it and the next access faults. It
// returns the state the page had; if that was Modified, the contents were
// copied into dst first (with every client write-protected, so no store is
// lost), and dst must hold a page. Invalidating an Invalid page does
// nothing (Invalid, nil).
func (c *Cache) Invalidate(ctx context.Context, rid ids.RegionID, p ids.PageNo, dst []byte) (State, error) {
	r, err := c.region(rid)
	if err != nil {
		return 0, err
	}
	if err := r.checkPage(p); err != nil {
		return 0, err
	}
	pg, err := r.acquire(ctx, p)
	if err != nil {
		return 0, err
	}
	defer r.release(pg)
	was := pg.State()
	switch was {
	case Invalid:
		return was, nil
	case Modified:
		if len(dst) < int(r.pageSize) {
			return 0, fmt.Errorf("%w: %d < %d", ErrShortBuffer, len(dst), r.pageSize)
		}
		if err := c.takeData(pg, dst); err != nil {
			return 0, fmt.Errorf("localcache: invalidate %s/%s: %w", rid, p, err)
		}
	}
	if err := r.punch(p); err != nil {
		return 0, fmt.Errorf("localcache: invalidate %s/%s: %w", rid, p, err)
	}
	c.setState(pg, Invalid)
	c.st.invalidations.Add(1)
	return was, nil
}

// Downgrade makes page p of region r read-only on this node, as the engine
// does when another node wants to read a page held here Modified: every
// attached client is write-protected, the contents are copied into dst
// (which must hold a page) and the page becomes Shared. It returns the
// state the page had; only Modified changes anything.
//
// A page that Suspend set aside is answered from its aside copy, which is
// dropped, and becomes Invalid here rather than Shared: the memfd keeps its
// hole, and the next fault asks the engine, which holds the page Shared
// and serves it from its own copy.
func (c *Cache) Downgrade(ctx context.Context, rid ids.RegionID, p ids.PageNo, dst []byte) (State, error) {
	r, err := c.region(rid)
	if err != nil {
		return 0, err
	}
	if err := r.checkPage(p); err != nil {
		return 0, err
	}
	pg, err := r.acquire(ctx, p)
	if err != nil {
		return 0, err
	}
	defer r.release(pg)
	was := pg.State()
	if was != Modified {
		return was, nil
	}
	if len(dst) < int(r.pageSize) {
		return 0, fmt.Errorf("%w: %d < %d", ErrShortBuffer, len(dst), r.pageSize)
	}
	if pg.aside {
		if err := c.takeData(pg, dst); err != nil {
			return 0, fmt.Errorf("localcache: downgrade %s/%s: %w", rid, p, err)
		}
		c.setState(pg, Invalid)
		c.st.downgrades.Add(1)
		return was, nil
	}
	c.protectAll(r, p)
	r.read(p, dst)
	c.setState(pg, Shared)
	c.st.downgrades.Add(1)
	return was, nil
}

// Install places data (one page) as page p of region r in state s (Shared
// or Modified) without a fault, for an engine that pushes pages (prefetch,
// recovery). The page must be Invalid here (else ErrPageValid), and the
// Cache must not be suspended (else ErrSuspended). Clients map it on their
// next access.
func (c *Cache) Install(ctx context.Context, rid ids.RegionID, p ids.PageNo, data []byte, s State) error {
	if s != Shared && s != Modified {
		return fmt.Errorf("localcache: install in state %s", s)
	}
	r, err := c.region(rid)
	if err != nil {
		return err
	}
	if err := r.checkPage(p); err != nil {
		return err
	}
	if len(data) < int(r.pageSize) {
		return fmt.Errorf("%w: %d < %d", ErrShortBuffer, len(data), r.pageSize)
	}
	pg, err := r.acquire(ctx, p)
	if err != nil {
		return err
	}
	if pg.State() != Invalid {
		r.release(pg)
		return fmt.Errorf("%w: %s/%s is %s", ErrPageValid, rid, p, pg.State())
	}
	if c.suspended.Load() {
		r.release(pg)
		return fmt.Errorf("%w: install of %s/%s", ErrSuspended, rid, p)
	}
	r.fill(p, data[:r.pageSize])
	c.setState(pg, s)
	c.st.installs.Add(1)
	r.release(pg)
	c.makeRoom(ctx)
	return nil
}

// PageState reports the local state of a page (Invalid for unknown ones).
func (c *Cache) PageState(rid ids.RegionID, p ids.PageNo) State {
	r, err := c.region(rid)
	if err != nil {
		return Invalid
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if pg := r.pages[p]; pg != nil {
		return pg.State()
	}
	return Invalid
}

// CachedPages counts the pages of region rid present in its memfd, as the
// kernel sees it (for checks: it equals the pages held Shared or Modified
// and not set aside by Suspend whenever no resolution is in flight).
func (c *Cache) CachedPages(rid ids.RegionID) (int64, error) {
	r, err := c.region(rid)
	if err != nil {
		return 0, err
	}
	return r.mf.CachedPages(0, r.size)
}

// makeRoom evicts the oldest installed pages while more are held than the
// capacity allows. Pages locked by a resolution are skipped.
func (c *Cache) makeRoom(ctx context.Context) {
	if c.capacity == 0 {
		return
	}
	for tries := 0; c.st.resident.Load() > c.capacity; tries++ {
		c.lruMu.Lock()
		n := c.lru.Len()
		if tries >= n {
			c.lruMu.Unlock()
			return // everything left is busy
		}
		e := c.lru.Front()
		pg := e.Value.(*page)
		c.lru.MoveToBack(e)
		c.lruMu.Unlock()
		if !pg.r.tryAcquire(pg) {
			continue
		}
		if err := c.evict(ctx, pg); errors.Is(err, errSuspended) {
			pg.r.release(pg)
			return // nothing is evicted while suspended
		} else if err != nil {
			c.log.Warn("eviction failed", "region", pg.r.id, "page", pg.no, "err", err)
		} else {
			tries = 0
		}
		pg.r.release(pg)
	}
}

// evict drops a locked page to make room: a Modified page is written back
// through Coherence.Evict (and kept if that fails). While the Cache is
// suspended it does nothing and returns errSuspended.
func (c *Cache) evict(ctx context.Context, pg *page) error {
	r, p := pg.r, pg.no
	if c.suspended.Load() {
		return errSuspended
	}
	was := pg.State()
	var dirty []byte
	switch was {
	case Invalid:
		return nil
	case Modified:
		dirty = make([]byte, r.pageSize)
		if err := c.takeData(pg, dirty); err != nil {
			return err
		}
	}
	if err := r.punch(p); err != nil {
		return err
	}
	c.setState(pg, Invalid)
	cctx, done := c.callCtx(ctx)
	err := c.coh.Evict(cctx, r.id, p, dirty)
	done()
	if err != nil && dirty != nil && errors.Is(err, ErrEvictPending) {
		// The engine keeps the data and finishes the write-back when it
		// can: the page stays Invalid here.
		c.st.evictErrors.Add(1)
		return fmt.Errorf("localcache: write-back of %s/%s: %w", r.id, p, err)
	}
	if err != nil && dirty != nil {
		// The only current copy: put it back.
		r.fill(p, dirty)
		c.setState(pg, Modified)
		c.st.evictErrors.Add(1)
		return fmt.Errorf("localcache: write-back of %s/%s: %w", r.id, p, err)
	}
	if err != nil {
		c.st.evictErrors.Add(1)
		c.log.Warn("clean eviction not acknowledged", "region", r.id, "page", p, "err", err)
	}
	c.st.evictions.Add(1)
	if dirty != nil {
		c.st.writebacks.Add(1)
	}
	return nil
}

// Close stops serving: listeners and sessions are closed, every client is
// detached (its faults are no longer served; the client library notices on
// its socket), every goroutine is waited for, and the memfds are released
// (clients that still map them keep their memory).
func (c *Cache) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.cancel() // first, so that sessions cut short below end quietly
	for ln := range c.listeners {
		ln.Close()
	}
	for conn := range c.sessions {
		conn.Close()
	}
	var cls []*client
	for cl := range c.clients {
		cls = append(cls, cl)
	}
	c.mu.Unlock()
	for _, cl := range cls {
		c.detach(cl)
	}
	c.cancel()
	c.wg.Wait()
	// A Suspend or DiscardSuspended in progress uses the files: let it end
	// (the calls it waits for were cancelled above).
	c.suspendMu.Lock()
	defer c.suspendMu.Unlock()
	var errs []error
	if c.lease != nil {
		errs = append(errs, c.lease.close()) // before c.mu: publish takes lp.mu, then c.mu
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.regions {
		errs = append(errs, r.mp.Unmap(), r.mf.Close(), r.closeAside())
	}
	return errors.Join(errs...)
}

// RemoveRegion stops serving region rid and gives its memory back, as dsmd
// does when the region is deleted: the name and id are free at once (an
// AddRegion of the same name makes a new, empty region); every session that
// maps it is told why (an Error of mapproto.CodeUnknownRegion carrying
// reason) and ended; calls in progress on its pages fail with
// ErrRegionRemoved; once the last of them has let go, every page is
// punched out of the memfd, so a process that still maps it can never read
// the region's data again, and the memfd is unmapped and closed. Pages
// held Modified are dropped, not written back: the region is gone.
//
// The caller must first make the region's Coherence calls fail fast (stop
// its engine): RemoveRegion waits for the resolutions in flight.
func (c *Cache) RemoveRegion(ctx context.Context, rid ids.RegionID, reason string) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	r := c.regions[rid]
	if r == nil {
		c.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrUnknownRegion, rid)
	}
	delete(c.regions, rid)
	if c.byName[r.name] == r {
		delete(c.byName, r.name)
	}
	r.mu.Lock()
	r.removed = true
	r.drained = make(chan struct{})
	if r.refs == 0 {
		close(r.drained)
	}
	cls := make([]*client, 0, len(r.clients))
	for cl := range r.clients {
		cls = append(cls, cl)
	}
	r.mu.Unlock()
	c.mu.Unlock()

	// Tell every mapping why it ends, then stop serving it: its workers
	// stop at their next step and the session reader sees the socket
	// close.
	if reason == "" {
		reason = fmt.Sprintf("region %q (%s) was removed", r.name, r.id)
	}
	c.endSessions(cls, mapproto.CodeUnknownRegion, reason)
	select {
	case <-r.drained:
	case <-ctx.Done():
		// Free the memory once the last call lets go (or at Close).
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return fmt.Errorf("localcache: remove %s: %w", rid, ErrClosed)
		}
		c.wg.Add(1)
		c.mu.Unlock()
		go func() {
			defer c.wg.Done()
			select {
			case <-r.drained:
				if err := c.freeRegion(r); err != nil {
					c.log.Warn("removed region freed with errors", "region", r.id, "err", err)
				}
			case <-c.ctx.Done():
			}
		}()
		return fmt.Errorf("localcache: remove %s: calls on its pages still in progress (its memory is freed when they end): %w", rid, ctx.Err())
	}
	return c.freeRegion(r)
}

// freeRegion gives a removed region's memory back once nobody can touch
// it: its pages leave the counters and the residency list, the memfd is
// punched, unmapped and closed.
func (c *Cache) freeRegion(r *region) error {
	r.mu.Lock()
	c.lruMu.Lock()
	for _, pg := range r.pages {
		if pg.aside {
			pg.aside = false
			c.st.aside.Add(-1)
		}
		switch pg.State() {
		case Modified:
			c.st.dirty.Add(-1)
			c.st.dirtyBytes.Add(-r.pageSize)
			fallthrough
		case Shared:
			c.lru.Remove(pg.elem)
			pg.elem = nil
			c.st.resident.Add(-1)
			c.st.residentBytes.Add(-r.pageSize)
		}
		pg.state.Store(uint32(Invalid))
	}
	c.lruMu.Unlock()
	r.pages = nil
	r.mu.Unlock()
	return errors.Join(r.mf.PunchHole(0, r.size), r.mp.Unmap(), r.mf.Close(), r.closeAside())
}

// Mappings lists the process ids of the mappings of region rid (0 for a
// client whose pid the kernel did not tell), one per mapping.
func (c *Cache) Mappings(rid ids.RegionID) ([]int, error) {
	r, err := c.region(rid)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	pids := make([]int, 0, len(r.clients))
	for cl := range r.clients {
		pids = append(pids, cl.pid)
	}
	slices.Sort(pids)
	return pids, nil
}
