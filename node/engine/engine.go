package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/node/localcache"
	"github.com/dsmkit/dsm/rdma"
)

// Errors.
var (
	// ErrClosed reports a call on a closed engine.
	ErrClosed = errors.New("engine: closed")
	// ErrUnknownRegion reports a region this engine does not serve.
	ErrUnknownRegion = errors.New("engine: unknown region")
	// ErrConflict fails a local miss or eviction because a remote request
	// is taking the page; the caller releases the page's lock and retries.
	// It wraps localcache.ErrBusy.
	ErrConflict = fmt.Errorf("engine: miss interrupted by a remote request: %w", localcache.ErrBusy)
	// ErrBadConfig refuses an invalid configuration.
	ErrBadConfig = errors.New("engine: bad configuration")
	// ErrNoHome reports a page whose home memory is not known.
	ErrNoHome = errors.New("engine: home memory unknown")
)

// Pages is the local page cache as the engine drives it: it gives pages up
// when the protocol takes them away. Data reaches the cache through the
// buffer of ReadMiss and WriteMiss (localcache.Coherence), so there is no
// install call. localcache.Cache's Invalidate and Downgrade are meant to
// implement it.
//
// Both methods are called from the engine's goroutine and may block only
// on the page's own lock (the engine fails a miss of the page first). Both
// return the page's current contents when the cache held it Modified (the
// write-back data), nil otherwise; a page not held is a no-op.
type Pages interface {
	// Drop removes the page from every local mapping (-> Invalid).
	Drop(r ids.RegionID, p ids.PageNo) (dirty []byte)
	// Downgrade write-protects the page (Modified -> Shared).
	Downgrade(r ids.RegionID, p ids.PageNo) (dirty []byte)
}

// Config configures an Engine.
type Config struct {
	// ID is this node.
	ID ids.NodeID
	// Region is the one region the engine serves: pages 0..NumPages-1.
	Region   ids.RegionID
	NumPages int
	// Name is the region's name, for errors (optional).
	Name string
	// PageSize in bytes: a positive multiple of 8.
	PageSize int
	// Epoch and Members are the initial configuration; Reconfigure
	// changes them. Epoch is any positive epoch: home memory is zero until
	// a page is first touched, and by the trust rule of package coherence
	// the zero word (no holder, no reservation) is valid in every epoch
	// and stamped by its first CAS.
	Epoch   ids.Epoch
	Members []ids.NodeID
	// Joining: this node is new to the region's protocol
	// (coherence.Config.Joining): it acts once every member has
	// acknowledged its epoch. A call that waits on that for a member set
	// down fails after UnavailableAfter.
	Joining bool
	// HomeOf names the home of every page of the region in the initial
	// epoch (a pure function); Reconfigure moves pages with a new
	// placement. Every node keeps the slot of page p at offset
	// SlotOffset(p, PageSize) of its registration: the home's slot is the
	// page's word and home copy, a backup's holds the backup copy and its
	// stamp, and when a backup becomes the page's home its slot is the
	// home slot as it is.
	HomeOf func(ids.PageNo) ids.NodeID
	// Backups names the backups of every page in the initial epoch (never
	// its home; nil: none): a release writes the page's data and a stamp
	// to each before it releases the tenure at the home
	// (coherence.Config.Backups).
	Backups func(ids.PageNo) []ids.NodeID
	// Targets: with Joining, the homes whose moves may not be done yet
	// (coherence.Config.Targets): the pages they home wait until each
	// says its moves are done.
	Targets []ids.NodeID
	// Transport is this node's endpoint. The caller closes it after the
	// engine.
	Transport rdma.Transport
	// NodeOf maps a protocol id (ID, Members, HomeOf, the ids of
	// messages) to the transport's node id, for every id it was ever
	// given, and reports false for an id it does not know. nil: the
	// identity (protocol ids are node ids). dsmd gives each process
	// incarnation a protocol id of its own (docs/failover.md).
	NodeOf func(ids.NodeID) (ids.NodeID, bool)
	// Send, when set, carries the engine's messages instead of
	// Transport.Send, and the engine does not install a message handler:
	// the caller routes what arrives to Deliver (dsmd runs one engine per
	// region over one transport).
	Send func(ctx context.Context, to ids.NodeID, msg []byte) error
	// Pages receives drops and downgrades; nil: none (atomics only).
	Pages Pages
	// Filled receives the ends of the fills asked for with Fill
	// (coherence.Ready.Filled), on the engine's goroutine: it must not
	// block (dsmd hands them to its own goroutine). nil: discarded.
	Filled func([]coherence.FillDone)
	// Persisted receives the stable copies asked for with Persist
	// (coherence.Ready.Persisted), on the engine's goroutine: it must not
	// block. nil: discarded.
	Persisted func([]coherence.PersistDone)
	// ClearSlots receives the state machine's request to clear the slots
	// this node entered anew up to an epoch (coherence.Ready.ClearSlots,
	// after a Reconfigure with ClearPending), on the engine's goroutine:
	// it must not block. The node layer clears them (ClearData) and then
	// calls SlotsCleared. nil: the request is answered at once, as if
	// nothing needed clearing (a caller that never sets ClearPending).
	ClearSlots func(ids.Epoch)
	// Released, when set, is told of every page this node gives up
	// Modified (a drop or downgrade the protocol asks for, an eviction or
	// the write-back of a Sync), with the version of the tenure it
	// releases (0 when the state machine no longer knows it), on the
	// engine's goroutine when the release begins: it must not block. The
	// node layer records these pages for the persist requests of a
	// durable region's Sync (docs/durability.md §2).
	Released func(p ids.PageNo, version uint16)
	// Tick is the interval of the protocol clock (default 1ms).
	Tick time.Duration
	// UnavailableAfter is how long a call may wait for a page whose home
	// is unreachable, or that waits for a node set down (SetDown) as its
	// holder, reserver or sharer, before it fails with an
	// *UnavailableError (default DefaultUnavailableAfter; negative:
	// never). A call on a page whose home is down fails at once, unless
	// the home's pages are awaited (SetDownAwaited): then after it.
	UnavailableAfter time.Duration
	// StallAfter is how long a call may wait for a member that is not set
	// down but holds the page (its tenure or its reservation), or owes
	// the acknowledgement of an invalidation, while nothing about the
	// page moves (the word's holder, reservation and version as this node
	// sees them, and the acknowledgements awaited), before it fails with
	// an *UnavailableError that names that member: a live dsmd that does
	// not serve the page (stuck, or starved for far longer than a lease)
	// bounds the wait as a dead one does. Contention moves the word and
	// never stalls a call so long. Default: 6 × UnavailableAfter, at least
	// minStallAfter (60 s by default); negative, or with UnavailableAfter
	// negative: never.
	StallAfter time.Duration
	// Logger; nil: discard.
	Logger *slog.Logger
}

// Engine runs the coherence protocol of one node for one region.
type Engine struct {
	cfg Config
	sm  *coherence.Node
	// ticks counts the protocol clock's ticks (tests: an idle engine's
	// clock stops).
	ticks atomic.Uint64
	reg   rdma.Registration
	mem   []byte
	log   *slog.Logger

	peerMu sync.Mutex
	peers  map[ids.NodeID]rdma.Descriptor

	reqCh    chan submit
	doneCh   chan posted
	recvCh   chan coherence.Message
	reconfCh chan coherence.Reconfigure
	clearCh  chan ids.Epoch
	fillCh   chan coherence.Fill
	persCh   chan coherence.Persist
	relCh    chan *releaseWait
	// effectCh returns the cache's answers to drops and downgrades.
	effectCh chan *effectJob
	stop     chan struct{}
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	startOnce sync.Once
	closeOnce sync.Once
	// memMu: Populated reads the home memory under it (read), and Close
	// frees it under it (write).
	memMu sync.RWMutex

	// Nodes set down (SetDown), those of them whose pages are awaited
	// (SetDownAwaited), and the loop's wake-up when they change.
	availMu sync.Mutex
	down    map[ids.NodeID]string
	awaited map[ids.NodeID]bool
	availCh chan struct{}
	// suspended: the node's lease is over (Suspend): no batch is posted
	// until Resume; they wait in parked.
	suspended bool

	// Owned by the loop goroutine.
	nextID  uint64
	waiters map[uint64]*waiter
	// wb holds the cache's contents of a page it gave up Modified (by a
	// drop, a downgrade or an eviction). The state machine's copy is not
	// updated by the cache's stores, so while wb has a page, wb is the
	// page's truth at this node: write-backs post it instead of the state
	// machine's copy, and misses that complete on the node's own copy
	// return it. A page leaves wb when the node takes a fresh copy from
	// the home (an install from Invalid, or a grant from Invalid).
	wb map[ids.PageNo][]byte
	// held is the state machine's state of each page as its effects said
	// (absent: Invalid).
	held     map[ids.PageNo]coherence.State
	evicting map[ids.PageNo]int // Evict calls in progress: the cache already dropped the page
	effects  map[ids.PageNo][]*effectJob
	// reclaimed: pages whose tenure a rebuild gave back to this node
	// after the cache had given them up (a reclaimed grant): held
	// Modified by the state machine, with their data in wb, until the
	// cache takes the page again or gives it up. relWaits: WaitReleases
	// calls (released.go).
	reclaimed map[ids.PageNo]bool
	relWaits  []*releaseWait
	// unreach: homes whose batches fail; parked: batches held back for
	// homes that are down, posted when they are up again.
	unreach   map[ids.NodeID]unreachable
	parked    map[ids.NodeID][]coherence.Batch
	lastSweep time.Time
	// flying: the batches posted and not answered yet, by id (see
	// unanswered).
	flying map[uint64]flight

	// hooks replace the goroutines the loop starts; nil in production.
	hooks hooks
}

// hooks let the engine simulation (sim_test.go) run an engine without its
// loop: batches and the cache's drops and downgrades wait in the driver's
// queue and complete in the order it chooses, on its goroutine.
type hooks struct {
	// post takes a batch instead of a goroutine that posts it; ops and
	// err are what e.ops made of it.
	post func(b coherence.Batch, ops []rdma.Op, err error)
	// effect takes a drop or downgrade instead of a goroutine that asks
	// the cache.
	effect func(j *effectJob)
	// now replaces the wall clock.
	now func() time.Time
}

// now is the engine's clock: the wall clock, or the simulation's.
func (e *Engine) now() time.Time {
	if e.hooks.now != nil {
		return e.hooks.now()
	}
	return time.Now()
}

// posted is the outcome of a batch, with the home it went to.
type posted struct {
	d    coherence.VerbsDone
	home ids.NodeID
}

type missKind uint8

const (
	atomicOp missKind = 1 + iota
	readMiss
	writeMiss
	evictOp
)

func (k missKind) String() string {
	switch k {
	case atomicOp:
		return "atomic"
	case readMiss:
		return "read miss"
	case writeMiss:
		return "write miss"
	case evictOp:
		return "write-back"
	}
	return fmt.Sprintf("missKind(%d)", uint8(k))
}

type submit struct {
	req   coherence.Request
	kind  missKind
	dirty []byte // evictOp: the data to write back
	w     *waiter
}

type waiter struct {
	page  ids.PageNo
	kind  missKind
	start time.Time
	ch    chan result // buffered 1
	// reported: the call was logged as waiting long (sweep).
	reported bool
	// seen is what the call waits on as sweep last saw it, since
	// seenSince (stalled).
	seen      stallKey
	seenSince time.Time
}

type result struct {
	c     coherence.Completion
	data  []byte // misses: a copy of the page
	err   error
	taken bool // the state machine took the request
}

var _ localcache.Coherence = (*Engine)(nil)

// SlotOffset is the offset of page p's slot (its coherence word, then the
// home copy) in a home's registration.
func SlotOffset(p ids.PageNo, pageSize int) uint64 { return uint64(p) * uint64(8+pageSize) }

// New validates cfg, reserves and registers the home slots of the region
// and returns an engine that is not running yet. The slots of every page
// are reserved (address space only: memory is committed when a page is
// first touched), so a 1 TiB region costs nothing until used.
func New(cfg Config) (*Engine, error) {
	if cfg.Transport == nil || cfg.HomeOf == nil || cfg.NumPages <= 0 {
		return nil, fmt.Errorf("%w: transport, HomeOf and NumPages are required", ErrBadConfig)
	}
	if cfg.Epoch == 0 {
		return nil, fmt.Errorf("%w: epoch 0", ErrBadConfig)
	}
	if cfg.PageSize <= 0 || cfg.PageSize%8 != 0 {
		return nil, fmt.Errorf("%w: page size %d", ErrBadConfig, cfg.PageSize)
	}
	if cfg.NodeOf == nil {
		cfg.NodeOf = func(id ids.NodeID) (ids.NodeID, bool) { return id, true }
	}
	if n, ok := cfg.NodeOf(cfg.ID); !ok || cfg.Transport.LocalID() != n {
		return nil, fmt.Errorf("%w: transport is %v, engine %v (node %v)", ErrBadConfig, cfg.Transport.LocalID(), cfg.ID, n)
	}
	if cfg.Tick <= 0 {
		cfg.Tick = time.Millisecond
	}
	if cfg.UnavailableAfter == 0 {
		cfg.UnavailableAfter = DefaultUnavailableAfter
	}
	if cfg.StallAfter == 0 {
		cfg.StallAfter = max(6*cfg.UnavailableAfter, minStallAfter)
		if cfg.UnavailableAfter < 0 {
			cfg.StallAfter = -1
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sm, err := coherence.NewNode(coherence.Config{
		ID: cfg.ID, PageSize: cfg.PageSize, Epoch: cfg.Epoch, Members: cfg.Members, Joining: cfg.Joining,
		HomeOf:  bounded(cfg.NumPages, cfg.HomeOf),
		Backups: cfg.Backups, Targets: cfg.Targets,
		// Homes start a page's duty when it is first needed (sparse
		// regions): a starving node queues for it, or a node finds its
		// word naming a departed node after a Reconfigure.
		HomedPages: nil,
	})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Engine{
		cfg: cfg, sm: sm, log: log,
		reqCh:    make(chan submit),
		doneCh:   make(chan posted),
		down:     map[ids.NodeID]string{},
		awaited:  map[ids.NodeID]bool{},
		availCh:  make(chan struct{}, 1),
		unreach:  map[ids.NodeID]unreachable{},
		flying:   map[uint64]flight{},
		parked:   map[ids.NodeID][]coherence.Batch{},
		recvCh:   make(chan coherence.Message, 256),
		reconfCh: make(chan coherence.Reconfigure),
		clearCh:  make(chan ids.Epoch),
		fillCh:   make(chan coherence.Fill),
		persCh:   make(chan coherence.Persist),
		relCh:    make(chan *releaseWait),
		stop:     make(chan struct{}),
		ctx:      ctx, cancel: cancel,
		peers:     map[ids.NodeID]rdma.Descriptor{},
		waiters:   map[uint64]*waiter{},
		wb:        map[ids.PageNo][]byte{},
		held:      map[ids.PageNo]coherence.State{},
		evicting:  map[ids.PageNo]int{},
		effects:   map[ids.PageNo][]*effectJob{},
		reclaimed: map[ids.PageNo]bool{},
		effectCh:  make(chan *effectJob),
	}
	n := int(SlotOffset(ids.PageNo(cfg.NumPages), cfg.PageSize))
	mem, err := rdma.Alloc(n)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("engine: reserve home slots: %w", err)
	}
	reg, err := cfg.Transport.Register(mem, rdma.AccessAll)
	if err != nil {
		_ = rdma.Free(mem)
		cancel()
		return nil, fmt.Errorf("engine: register home slots: %w", err)
	}
	e.mem, e.reg = mem, reg
	e.peers[cfg.ID] = reg.Descriptor()
	return e, nil
}

// Descriptor is the descriptor of this node's home memory. Peers need it
// to reach the slots of the pages this node is home of.
func (e *Engine) Descriptor() rdma.Descriptor { return e.reg.Descriptor() }

// SetPeer records the home memory descriptor of a peer; it may come
// before or after Start. Until a home's descriptor is known, the verbs to
// it fail (ErrNoHome) and the protocol retries them.
func (e *Engine) SetPeer(id ids.NodeID, d rdma.Descriptor) {
	e.peerMu.Lock()
	defer e.peerMu.Unlock()
	e.peers[id] = d
}

func (e *Engine) peer(id ids.NodeID) (rdma.Descriptor, bool) {
	e.peerMu.Lock()
	defer e.peerMu.Unlock()
	d, ok := e.peers[id]
	return d, ok
}

// Start runs the engine with the home memory descriptors of the peers
// known so far (SetPeer adds more).
func (e *Engine) Start(peers map[ids.NodeID]rdma.Descriptor) {
	e.startOnce.Do(func() {
		for id, d := range peers {
			if id != e.cfg.ID {
				e.SetPeer(id, d)
			}
		}
		if e.cfg.Send == nil {
			e.cfg.Transport.SetHandler(e.Deliver)
		}
		e.wg.Add(1)
		go e.loop()
	})
}

// Close stops the engine: calls in progress fail with ErrClosed, the
// handler is removed, verbs in flight are abandoned and the home memory is
// deregistered and freed. It waits for every goroutine it started.
func (e *Engine) Close() error {
	var err error
	e.closeOnce.Do(func() {
		if e.cfg.Send == nil {
			e.cfg.Transport.SetHandler(nil)
		}
		close(e.stop)
		e.cancel()
		e.wg.Wait()
		if e.reg != nil {
			e.memMu.Lock()
			err = errors.Join(e.reg.Deregister(), rdma.Free(e.mem))
			e.memMu.Unlock()
		}
	})
	return err
}

// Deliver hands the engine a message from a peer: the transport's message
// handler, or the caller's router when Config.Send is set. It does not
// keep b.
func (e *Engine) Deliver(from ids.NodeID, b []byte) {
	m, ok := e.decode(from, b)
	if !ok {
		return
	}
	select {
	case e.recvCh <- m:
	case <-e.stop:
	}
}

// decode unmarshals a message from a peer and checks its sender.
func (e *Engine) decode(from ids.NodeID, b []byte) (coherence.Message, bool) {
	m, err := coherence.Unmarshal(b)
	if err != nil {
		e.log.Warn("undecodable message", "from", from, "err", err)
		return m, false
	}
	switch n, ok := e.cfg.NodeOf(m.From); {
	case !ok:
		// A member this node does not know yet (it lags the directory):
		// the sender retransmits.
		e.log.Debug("message from an unknown protocol id", "from", from, "claims", m.From)
		return m, false
	case n != from:
		e.log.Warn("message with a forged sender", "from", from, "claims", m.From)
		return m, false
	}
	return m, true
}

// bounded limits a placement to the region's pages: ids.None past its end.
func bounded(numPages int, homeOf func(ids.PageNo) ids.NodeID) func(ids.PageNo) ids.NodeID {
	if homeOf == nil {
		return nil
	}
	return func(p ids.PageNo) ids.NodeID {
		if int64(p) >= int64(numPages) {
			return ids.None
		}
		return homeOf(p)
	}
}

// Reconfigure hands the engine a new configuration (coherence.Reconfigure):
// the epoch, the members (those absent from the list departed) and, when
// pages move or backups change, the new placement, its targets and the
// new backups. It waits until the loop has taken it (after Start) or the
// engine is closed; the loop steps it and applies what it asks (dropping
// Shared copies after a departure, freezing and reporting the pages that
// moved). Batches held back for nodes that are down are failed, as never
// posted: the state machine posts them again where the new configuration
// says. A refused configuration (an epoch not after the current one, a
// bad member id) is logged and changes nothing.
func (e *Engine) Reconfigure(rc coherence.Reconfigure) {
	rc.Members = slices.Clone(rc.Members)
	rc.Targets = slices.Clone(rc.Targets)
	rc.HomeOf = bounded(e.cfg.NumPages, rc.HomeOf)
	select {
	case e.reconfCh <- rc:
	case <-e.stop:
	}
}

// SlotsCleared tells the state machine that the slots this node entered
// anew up to epoch ep are cleared (coherence.SlotsCleared), after a
// Config.ClearSlots request of ep. It waits until the loop has taken it
// or the engine is closed.
func (e *Engine) SlotsCleared(ep ids.Epoch) {
	select {
	case e.clearCh <- ep:
	case <-e.stop:
	}
}

// Fill asks this node, the home of pages, to fill backup `to` with them
// (coherence.Fill): once the engine is in an epoch whose Backups name `to`
// for each page, the call's pages end, each, in a coherence.FillDone
// handed to Config.Filled. It waits until the loop has taken it (after
// Start) or the engine is closed; a Fill the state machine refuses ends
// every page abandoned.
func (e *Engine) Fill(pages []ids.PageNo, to ids.NodeID) {
	select {
	case e.fillCh <- coherence.Fill{Pages: slices.Clone(pages), To: to}:
	case <-e.stop:
	}
}

// Persist asks this node, the home of pages, for a stable copy of each
// (coherence.Persist, docs/durability.md §2): every page ends in a
// coherence.PersistDone handed to Config.Persisted, with the page's data as
// of its word's version, read after the call, or abandoned when this node
// is not the page's home. It waits until the loop has taken it (after
// Start) or the engine is closed; a Persist the state machine refuses
// ends every page abandoned.
func (e *Engine) Persist(pages []ids.PageNo) {
	select {
	case e.persCh <- coherence.Persist{Pages: slices.Clone(pages)}:
	case <-e.stop:
	}
}

// StampLeftBehind turns the word of every populated slot of pages [first,
// end) into its stamp (coherence.StampOf), with a CAS on the word, the
// instruction the software transports execute for a remote CAS: what the
// node layer does for the slots of pages that moved away from this live
// node (docs/protocol.md, "Moves from live homes"), after the engine
// learnt the epoch that moved them. A lagging member's CAS that lands
// after it fails on the stamp; one that lands before is undone by it. It
// returns how many words it changed. It must not be called for pages this
// node is home of.
//
// The node's own batches to such a slot that land after the walk (a home's
// CAS from a stamp to a home word, posted before the page moved) are
// followed by a stamp of that slot when the engine takes their outcome
// (onPosted).
func (e *Engine) StampLeftBehind(first, end ids.PageNo) int {
	n := 0
	for _, p := range e.Populated(first, end) {
		if e.stampSlot(p) {
			n++
		}
	}
	return n
}

// LoadSlot writes a page's data and the stamp of its tenure version into
// this node's slot of page p, as a release writes a backup's slot (the
// data first, then coherence.Stamp(version) in the word): what the node
// layer does with the pages of a lost shard that it loads from its page
// store before it becomes the shard's home (docs/durability.md §4). The
// write goes through the transport, as the state machine's own verbs do,
// so that it is ordered with the peers' writes. The slot must be one no
// release or fill writes meanwhile (a shard whose home departed).
func (e *Engine) LoadSlot(ctx context.Context, p ids.PageNo, version uint16, data []byte) error {
	if int64(p) >= int64(e.cfg.NumPages) || len(data) != e.cfg.PageSize {
		return fmt.Errorf("%w: load of page %v with %d bytes", ErrBadConfig, p, len(data))
	}
	off := SlotOffset(p, e.cfg.PageSize)
	rkey := e.reg.Descriptor().RKey
	stamp := binary.LittleEndian.AppendUint64(nil, uint64(coherence.Stamp(version)))
	ops := []rdma.Op{
		{Kind: rdma.OpWrite, RKey: rkey, Offset: off + 8, Buf: data},
		{Kind: rdma.OpWrite, RKey: rkey, Offset: off, Buf: stamp},
	}
	return e.cfg.Transport.Post(ctx, e.cfg.Transport.LocalID(), ops)
}

// ClearSlots zeroes this node's populated slots of pages [first, end),
// data and word, through the transport: what the node layer does for the
// slots of a lost shard that this node is a backup of once the shard is
// brought back (a fill requires the slot of a backup that enters the set
// to read zero), before the engine learns the epoch that brings it back.
// It returns how many slots it cleared.
func (e *Engine) ClearSlots(ctx context.Context, first, end ids.PageNo) (int, error) {
	n := 0
	rkey := e.reg.Descriptor().RKey
	zero := make([]byte, 8+e.cfg.PageSize)
	for _, p := range e.Populated(first, end) {
		off := SlotOffset(p, e.cfg.PageSize)
		ops := []rdma.Op{
			{Kind: rdma.OpWrite, RKey: rkey, Offset: off + 8, Buf: zero[8:]},
			{Kind: rdma.OpWrite, RKey: rkey, Offset: off, Buf: zero[:8]},
		}
		if err := e.cfg.Transport.Post(ctx, e.cfg.Transport.LocalID(), ops); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// ClearData stamps the word of every populated slot of pages [first, end)
// (as StampLeftBehind does) and then zeroes the slot's data, through the
// transport: what the node layer does, when the state machine asks
// (Config.ClearSlots), for the slots of pages whose backup set this node
// entered anew, a home demoted by a promotion for one (docs/failover.md
// §7, "A page promoted away before its new home rebuilt it"). It returns how
// many slots it cleared. It must not be called for pages this node is
// home of. On a closed engine it does nothing and returns ErrClosed: it may
// run on the node layer's goroutine while the region is removed, and holds
// the home memory (memMu) meanwhile.
func (e *Engine) ClearData(ctx context.Context, first, end ids.PageNo) (int, error) {
	e.memMu.RLock()
	defer e.memMu.RUnlock()
	select {
	case <-e.stop:
		return 0, ErrClosed
	default:
	}
	n := 0
	rkey := e.reg.Descriptor().RKey
	zero := make([]byte, e.cfg.PageSize)
	for _, p := range e.populated(first, end) {
		e.stampSlot(p)
		off := SlotOffset(p, e.cfg.PageSize)
		ops := []rdma.Op{{Kind: rdma.OpWrite, RKey: rkey, Offset: off + 8, Buf: zero}}
		if err := e.cfg.Transport.Post(ctx, e.cfg.Transport.LocalID(), ops); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// stampSlot turns the word of page p's slot into its stamp with a CAS loop
// (zero words and stamps stay), and reports whether it changed it.
func (e *Engine) stampSlot(p ids.PageNo) bool {
	off := SlotOffset(p, e.cfg.PageSize)
	for {
		w := coherence.Word(rdma.LoadWord(e.mem, off))
		st := coherence.StampOf(w)
		if st == w {
			return false
		}
		if rdma.CASWord(e.mem, off, uint64(w), uint64(st)) == uint64(w) {
			return true
		}
	}
}

// Populated lists the pages in [first, end) whose slot here may hold data
// that was written: every page whose word is not zero, and every page
// whose word is zero but whose data is not (a version that wrapped around
// to a zero word). A page left out was never written here, which is what
// coherence.Fill asks of the pages a fill leaves out.
func (e *Engine) Populated(first, end ids.PageNo) []ids.PageNo {
	e.memMu.RLock()
	defer e.memMu.RUnlock()
	select {
	case <-e.stop:
		return nil // closed: the memory is gone
	default:
	}
	return e.populated(first, end)
}

// populated is Populated with memMu held (read) and the engine open.
func (e *Engine) populated(first, end ids.PageNo) []ids.PageNo {
	end = min(end, ids.PageNo(e.cfg.NumPages))
	var out []ids.PageNo
	for p := first; p < end; p++ {
		off := SlotOffset(p, e.cfg.PageSize)
		if rdma.LoadWord(e.mem, off) != 0 || !e.zeroData(p) {
			out = append(out, p)
		}
	}
	return out
}

// zeroData reports whether the home copy in page p's slot is all zero. It
// reads the slot through the transport, as the state machine's own verbs
// do, so that it is ordered with the peers' writes.
func (e *Engine) zeroData(p ids.PageNo) bool {
	off := SlotOffset(p, e.cfg.PageSize) + 8
	buf := make([]byte, e.cfg.PageSize)
	op := rdma.Op{Kind: rdma.OpRead, RKey: e.reg.Descriptor().RKey, Offset: off, Buf: buf}
	if err := e.cfg.Transport.Post(e.ctx, e.cfg.Transport.LocalID(), []rdma.Op{op}); err != nil {
		return false // unsure: list it
	}
	for _, b := range buf {
		if b != 0 {
			return false
		}
	}
	return true
}

// ---- the loop: sole owner of the state machine ----

func (e *Engine) loop() {
	defer e.wg.Done()
	// The protocol clock runs only while the state machine has something
	// in progress: an idle engine (a region nobody touches) costs no CPU.
	t := time.NewTicker(e.cfg.Tick)
	defer t.Stop()
	ticking := true
	defer func() {
		for id, w := range e.waiters {
			w.ch <- result{err: ErrClosed, taken: true}
			delete(e.waiters, id)
		}
	}()
	for {
		tick := false
		select {
		case <-e.stop:
			return
		case s := <-e.reqCh:
			e.onSubmit(s)
		case pd := <-e.doneCh:
			e.onPosted(pd)
		case <-e.availCh:
			e.sweep(e.now())
		case m := <-e.recvCh:
			e.onReceive(m)
		case rc := <-e.reconfCh:
			e.onReconfigure(rc)
		case ep := <-e.clearCh:
			e.onSlotsCleared(ep)
		case f := <-e.fillCh:
			e.onFill(f)
		case p := <-e.persCh:
			e.onPersist(p)
		case w := <-e.relCh:
			e.onReleaseWait(w)
		case j := <-e.effectCh:
			e.effectDone(j)
		case now := <-t.C:
			e.ticks.Add(1)
			e.onTick(now)
			tick = true
		}
		e.apply()
		e.checkReleaseWaits()
		// busy walks every page the state machine knows, so it is asked
		// only when the answer can change what the loop does: after any
		// input while the clock is stopped (it may have to start), and at
		// each tick while it runs (it may stop). A clock that runs one
		// tick longer than needed costs one step of Tick.
		if ticking && !tick {
			continue
		}
		switch busy := e.busy(); {
		case busy && !ticking:
			t.Reset(e.cfg.Tick)
			ticking = true
		case !busy && ticking:
			t.Stop()
			ticking = false
		}
	}
}

// The loop's handlers: each takes one input, steps the state machine and
// leaves what it asks for apply. They run on the loop's goroutine only (or
// on the engine simulation's driver, which owns an engine without a loop).

func (e *Engine) onSubmit(s submit) {
	if s.kind != atomicOp && len(e.effects[s.req.Page]) > 0 {
		// The cache is giving the page up: let it take the page's lock
		// first (the caller holds it).
		s.w.ch <- result{err: ErrConflict}
		return
	}
	if err := e.unavailable(s.req.Page, 0, true); err != nil {
		s.w.ch <- result{err: err}
		return
	}
	e.nextID++
	s.req.ID = e.nextID
	if s.kind == evictOp {
		if s.dirty != nil {
			e.wb[s.req.Page] = s.dirty
		}
		e.evicting[s.req.Page]++
		if e.held[s.req.Page] == coherence.Modified {
			e.released(s.req.Page)
		}
	}
	if err := e.sm.Step(s.req); err != nil {
		if s.kind == evictOp {
			e.evicting[s.req.Page]--
		}
		s.w.ch <- result{err: err}
		return
	}
	e.waiters[s.req.ID] = s.w
}

func (e *Engine) onPosted(pd posted) {
	f, ok := e.flying[pd.d.ID]
	delete(e.flying, pd.d.ID)
	e.noteOutcome(pd.home, pd.d.Err)
	if err := e.sm.Step(pd.d); err != nil {
		e.log.Debug("completion refused", "batch", pd.d.ID, "err", err)
	}
	if ok && f.to == e.cfg.ID && e.homeOf(f.page) != e.cfg.ID {
		// A batch of this node to its own slot of a page it is home of no
		// more, posted before the page moved away: a home's CAS from a
		// stamp to a home word (a rebuild, the repair of a stamp) that
		// lands after StampLeftBehind walked the slot would leave a home
		// word in a slot left behind. The slot is stamped again once it
		// is done.
		e.stampSlot(f.page)
	}
}

func (e *Engine) onReceive(m coherence.Message) {
	if err := e.sm.Step(coherence.Receive{Msg: m}); err != nil {
		e.log.Debug("message refused", "msg", m, "err", err)
	}
}

func (e *Engine) onReconfigure(rc coherence.Reconfigure) {
	if err := e.sm.Step(rc); err != nil {
		e.log.Warn("reconfiguration refused", "epoch", rc.Epoch, "err", err)
		return
	}
	e.unpark()
}

func (e *Engine) onSlotsCleared(ep ids.Epoch) {
	if err := e.sm.Step(coherence.SlotsCleared{Epoch: ep}); err != nil {
		e.log.Warn("slots cleared refused", "epoch", ep, "err", err)
	}
}

func (e *Engine) onFill(f coherence.Fill) {
	if err := e.sm.Step(f); err != nil {
		e.log.Warn("fill refused", "to", f.To, "pages", len(f.Pages), "err", err)
		if e.cfg.Filled != nil {
			done := make([]coherence.FillDone, len(f.Pages))
			for i, p := range f.Pages {
				done[i] = coherence.FillDone{Page: p, To: f.To, Err: fmt.Errorf("%w: %v", coherence.ErrFillAbandoned, err)}
			}
			e.cfg.Filled(done)
		}
	}
}

func (e *Engine) onPersist(p coherence.Persist) {
	if err := e.sm.Step(p); err != nil {
		e.log.Warn("persist refused", "pages", len(p.Pages), "err", err)
		if e.cfg.Persisted != nil {
			done := make([]coherence.PersistDone, len(p.Pages))
			for i, no := range p.Pages {
				done[i] = coherence.PersistDone{Page: no, Err: fmt.Errorf("%w: %v", coherence.ErrPersistAbandoned, err)}
			}
			e.cfg.Persisted(done)
		}
	}
}

func (e *Engine) onTick(now time.Time) {
	_ = e.sm.Step(coherence.Tick{})
	if now.Sub(e.lastSweep) >= sweepInterval {
		e.lastSweep = now
		e.sweep(now)
	}
}

// busy reports whether the protocol clock must run: the state machine has
// something in progress, a call waits, or the cache is giving a page up.
func (e *Engine) busy() bool {
	return len(e.waiters) > 0 || len(e.effects) > 0 || len(e.relWaits) > 0 || !e.sm.Quiet()
}

// apply executes what the state machine asks until it asks nothing.
func (e *Engine) apply() {
	for {
		rd := e.sm.Ready()
		if rd.Empty() {
			return
		}
		for _, pe := range rd.Pages {
			e.pageEffect(pe)
		}
		for _, c := range rd.Completions {
			e.complete(c)
		}
		if len(rd.Filled) > 0 && e.cfg.Filled != nil {
			e.cfg.Filled(rd.Filled)
		}
		if len(rd.Persisted) > 0 && e.cfg.Persisted != nil {
			e.cfg.Persisted(rd.Persisted)
		}
		if rd.ClearSlots != 0 {
			if e.cfg.ClearSlots != nil {
				e.cfg.ClearSlots(rd.ClearSlots)
			} else {
				e.onSlotsCleared(rd.ClearSlots)
			}
		}
		for _, m := range rd.Messages {
			if q := e.effects[m.Page]; len(q) > 0 {
				j := q[len(q)-1]
				j.msgs = append(j.msgs, m)
				continue
			}
			e.send(m)
		}
		for _, b := range rd.Batches {
			if q := e.effects[b.Verbs[0].Page]; len(q) > 0 {
				j := q[len(q)-1]
				j.held = append(j.held, b)
				continue
			}
			e.post(b)
		}
	}
}

// pageEffect applies one page effect. A drop or downgrade first fails
// the local misses of the page (the lock order of localcache: the cache's
// page lock may be held by such a miss), then asks the cache, on a
// goroutine, for the page; the loop goes on meanwhile. Until the cache
// answered, every batch and message about the page is held (see apply):
// an invalidation is acknowledged only once the cache dropped the page,
// and a write-back carries the cache's data when it held the page
// Modified (see effectDone).
func (e *Engine) pageEffect(pe coherence.PageEffect) {
	was := e.held[pe.Page]
	delete(e.reclaimed, pe.Page)
	switch pe.Kind {
	case coherence.PageInstallShared:
		e.held[pe.Page] = coherence.Shared
		delete(e.wb, pe.Page) // a fresh copy from the home
		return
	case coherence.PageGrantExclusive:
		e.held[pe.Page] = coherence.Modified
		if pe.Reclaimed {
			e.reclaimed[pe.Page] = true
		}
		if was == coherence.Invalid && !pe.Reclaimed {
			delete(e.wb, pe.Page) // a fresh copy from the home
		}
		// A reclaimed tenure (a release interrupted by a move, kept by
		// the rebuild) keeps wb: it holds what the cache gave up, newer
		// than the state machine's copy.
		// An upgrade keeps the node's copy: if the cache gave the
		// page up Modified before (a downgrade), wb still holds what
		// the cache holds, and the state machine's copy is older.
		return
	case coherence.PageDowngrade:
		e.held[pe.Page] = coherence.Shared
	case coherence.PageDrop:
		delete(e.held, pe.Page)
	}
	if was == coherence.Modified && e.evicting[pe.Page] == 0 {
		e.released(pe.Page) // an eviction told it already
	}
	e.failMisses(pe.Page)
	if e.cfg.Pages == nil || e.evicting[pe.Page] > 0 {
		return
	}
	j := &effectJob{kind: pe.Kind, page: pe.Page}
	q := e.effects[pe.Page]
	e.effects[pe.Page] = append(q, j)
	if len(q) == 0 {
		e.runEffect(j)
	}
}

// released tells Config.Released that this node gives page p up Modified,
// with the tenure the state machine's copy is of.
func (e *Engine) released(p ids.PageNo) {
	if e.cfg.Released != nil {
		e.cfg.Released(p, e.sm.Page(p).Version)
	}
}

// effectJob is a drop or downgrade the cache is applying. Jobs of one
// page run one at a time, in order.
type effectJob struct {
	kind  coherence.PageEffectKind
	page  ids.PageNo
	held  []coherence.Batch // batches and messages about the page, waiting
	msgs  []coherence.Message
	dirty []byte // set by the goroutine
}

func (e *Engine) failMisses(p ids.PageNo) {
	for id, w := range e.waiters {
		if w.page == p && (w.kind == readMiss || w.kind == writeMiss) {
			w.ch <- result{err: ErrConflict}
			delete(e.waiters, id)
		}
	}
}

func (e *Engine) runEffect(j *effectJob) {
	if e.hooks.effect != nil {
		e.hooks.effect(j)
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.askCache(j)
		select {
		case e.effectCh <- j:
		case <-e.stop:
		}
	}()
}

// askCache has the cache apply a drop or downgrade and keeps its answer.
func (e *Engine) askCache(j *effectJob) {
	if j.kind == coherence.PageDrop {
		j.dirty = e.cfg.Pages.Drop(e.cfg.Region, j.page)
	} else {
		j.dirty = e.cfg.Pages.Downgrade(e.cfg.Region, j.page)
	}
}

// effectDone takes the cache's answer: its data becomes what the page's
// write-backs carry (see Engine.wb); the held batches and messages go out
// now and the page's next job starts.
func (e *Engine) effectDone(j *effectJob) {
	if j.dirty != nil {
		e.wb[j.page] = j.dirty
	}
	for _, m := range j.msgs {
		e.send(m)
	}
	for _, b := range j.held {
		e.post(b)
	}
	q := e.effects[j.page][1:]
	if len(q) == 0 {
		delete(e.effects, j.page)
		return
	}
	e.effects[j.page] = q
	e.runEffect(q[0])
}

func (e *Engine) complete(c coherence.Completion) {
	w, ok := e.waiters[c.ID]
	if !ok {
		return // its caller went away
	}
	delete(e.waiters, c.ID)
	r := result{c: c, taken: true}
	switch w.kind {
	case readMiss, writeMiss:
		st, data := e.sm.Copy(c.Page)
		if d := e.wb[c.Page]; d != nil {
			data = d // newer than the state machine's copy
		}
		if st == coherence.Invalid || (w.kind == writeMiss && st != coherence.Modified) {
			r.err = ErrConflict
		} else {
			r.data = append([]byte(nil), data...)
			if w.kind == writeMiss {
				delete(e.reclaimed, c.Page) // the cache holds it Modified again
			}
		}
	case evictOp:
		delete(e.reclaimed, c.Page)
		e.evicting[c.Page]--
		if e.evicting[c.Page] <= 0 {
			delete(e.evicting, c.Page)
		}
	}
	w.ch <- r
}

// send queues a message; a lost one is retransmitted by the protocol.
func (e *Engine) send(m coherence.Message) {
	var err error
	if e.cfg.Send != nil {
		err = e.cfg.Send(e.ctx, m.To, m.Marshal())
	} else if to, ok := e.cfg.NodeOf(m.To); ok {
		err = e.cfg.Transport.Send(e.ctx, to, m.Marshal())
	} else {
		err = fmt.Errorf("engine: no node for protocol id %v", m.To)
	}
	if err != nil {
		e.log.Debug("send", "msg", m, "err", err)
	}
}

// post executes one batch at its home on a goroutine of its own and steps
// the outcome back in.
func (e *Engine) post(b coherence.Batch) {
	if e.park(b) {
		return
	}
	ops, err := e.ops(b)
	if len(b.Verbs) > 0 {
		e.flying[b.ID] = flight{page: b.Verbs[0].Page, to: b.Home, since: e.now()}
	}
	if e.hooks.post != nil {
		e.hooks.post(b, ops, err)
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if err == nil {
			if to, ok := e.cfg.NodeOf(b.Home); ok {
				err = e.cfg.Transport.Post(e.ctx, to, ops)
			} else {
				err = fmt.Errorf("%w: no node for protocol id %v", ErrNoHome, b.Home)
			}
		}
		select {
		case e.doneCh <- e.outcome(b, ops, err):
		case <-e.stop:
		}
	}()
}

// outcome is the completion of batch b, posted as ops, that ended with err.
func (e *Engine) outcome(b coherence.Batch, ops []rdma.Op, err error) posted {
	// A batch whose answer was lost may have executed: the state machine
	// resolves it by reading the word instead of posting it again.
	d := coherence.VerbsDone{ID: b.ID, Err: err, Unknown: errors.Is(err, rdma.ErrOutcomeUnknown)}
	if err == nil {
		d.Results = make([]coherence.Result, len(ops))
		for i := range ops {
			d.Results[i] = coherence.Result{Word: ops[i].Result}
			if ops[i].Kind == rdma.OpRead {
				d.Results[i].Data = ops[i].Buf
			}
		}
	}
	return posted{d: d, home: b.Home}
}

// ops turns a batch into rdma operations on the home's slots.
func (e *Engine) ops(b coherence.Batch) ([]rdma.Op, error) {
	desc, ok := e.peer(b.Home)
	if !ok {
		return nil, fmt.Errorf("%w: %v", ErrNoHome, b.Home)
	}
	ops := make([]rdma.Op, len(b.Verbs))
	for i, v := range b.Verbs {
		if int64(v.Page) >= int64(e.cfg.NumPages) {
			return nil, fmt.Errorf("%w: page %v", ErrNoHome, v.Page)
		}
		op := rdma.Op{RKey: desc.RKey, Offset: SlotOffset(v.Page, e.cfg.PageSize) + v.Span.Offset()}
		switch v.Kind {
		case coherence.VerbRead:
			op.Kind = rdma.OpRead
			op.Buf = make([]byte, v.Span.Len(e.cfg.PageSize))
		case coherence.VerbWrite:
			op.Kind = rdma.OpWrite
			op.Buf = v.Data
			// A write-back carries what the cache gave up (wb), newer
			// than the state machine's copy; the home's copy that a
			// fill or a refresh of the backups writes is sent as it is
			// (wb is this node's client side's, possibly older).
			if d := e.wb[v.Page]; d != nil && v.Span == coherence.SpanPage && !v.HomeCopy {
				op.Buf = d
			}
		case coherence.VerbCAS:
			op.Kind, op.Compare, op.Operand = rdma.OpCAS, v.Compare, v.Operand
		case coherence.VerbFAA:
			op.Kind, op.Operand = rdma.OpFAA, v.Operand
		}
		ops[i] = op
	}
	return ops, nil
}

// ---- blocking calls ----

// do submits a request and waits for its completion or ctx. It reports
// whether the state machine took the request (it then goes on with it even
// when do returns an error).
func (e *Engine) do(ctx context.Context, kind missKind, req coherence.Request, dirty []byte) (result, bool, error) {
	w := &waiter{page: req.Page, kind: kind, start: e.now(), ch: make(chan result, 1)}
	select {
	case e.reqCh <- submit{req: req, kind: kind, dirty: dirty, w: w}:
	case <-e.stop:
		return result{}, false, ErrClosed
	case <-ctx.Done():
		return result{}, false, ctx.Err()
	}
	select {
	case r := <-w.ch:
		return r, r.taken, r.err
	case <-e.stop:
		return result{}, true, ErrClosed
	case <-ctx.Done():
		return result{}, true, ctx.Err()
	}
}

func (e *Engine) checkRegion(r ids.RegionID) error {
	if r != e.cfg.Region {
		return fmt.Errorf("%w: %v", ErrUnknownRegion, r)
	}
	return nil
}

// ReadMiss obtains a Shared copy of page p and writes it into buf. It
// implements localcache.Coherence.
func (e *Engine) ReadMiss(ctx context.Context, r ids.RegionID, p ids.PageNo, buf []byte) error {
	if err := e.checkRegion(r); err != nil {
		return err
	}
	res, _, err := e.do(ctx, readMiss, coherence.Request{Op: coherence.OpLoad, Page: p}, nil)
	if err != nil {
		return err
	}
	copy(buf, res.data)
	return nil
}

// WriteMiss obtains the exclusive (Modified) copy of page p and, when buf
// is not nil, writes its contents into buf. It implements
// localcache.Coherence. The tenure is taken with an add of 0 to the
// page's first word, which changes no data.
func (e *Engine) WriteMiss(ctx context.Context, r ids.RegionID, p ids.PageNo, buf []byte) error {
	if err := e.checkRegion(r); err != nil {
		return err
	}
	res, _, err := e.do(ctx, writeMiss, coherence.Request{Op: coherence.OpAdd, Page: p, Value: 0}, nil)
	if err != nil {
		return err
	}
	if buf != nil {
		copy(buf, res.data)
	}
	return nil
}

// Evict gives up this node's copy of page p; dirty (the contents of a
// Modified copy) is written back to the home. It implements
// localcache.Coherence. ErrConflict means that the protocol is taking the
// page from the cache at this moment: the caller releases the page's lock
// and retries.
func (e *Engine) Evict(ctx context.Context, r ids.RegionID, p ids.PageNo, dirty []byte) error {
	if err := e.checkRegion(r); err != nil {
		return err
	}
	if dirty != nil {
		dirty = append([]byte(nil), dirty...)
	}
	_, taken, err := e.do(ctx, evictOp, coherence.Request{Op: coherence.OpEvict, Page: p}, dirty)
	if err != nil && taken {
		// The state machine goes on with the write-back, with the data
		// kept in e.wb: the cache must not take the page back.
		return fmt.Errorf("%w: %w", localcache.ErrEvictPending, err)
	}
	return err
}

// Load returns the 8-byte word at byte offset off of page p (a multiple
// of 8).
func (e *Engine) Load(ctx context.Context, p ids.PageNo, off int) (uint64, error) {
	res, _, err := e.do(ctx, atomicOp, coherence.Request{Op: coherence.OpLoad, Page: p, Offset: off}, nil)
	return res.c.Value, err
}

// Store writes v to the word at offset off of page p. A call that returns
// ctx's error may still take effect.
func (e *Engine) Store(ctx context.Context, p ids.PageNo, off int, v uint64) error {
	_, _, err := e.do(ctx, atomicOp, coherence.Request{Op: coherence.OpStore, Page: p, Offset: off, Value: v}, nil)
	return err
}

// Add adds delta to the word at offset off of page p and returns the old
// value. A call that returns ctx's error may still take effect.
func (e *Engine) Add(ctx context.Context, p ids.PageNo, off int, delta uint64) (uint64, error) {
	res, _, err := e.do(ctx, atomicOp, coherence.Request{Op: coherence.OpAdd, Page: p, Offset: off, Value: delta}, nil)
	return res.c.Value, err
}

// CompareAndSwap replaces the word at offset off of page p with new if it
// equals old; it returns the old value and whether it swapped. A call that
// returns ctx's error may still take effect.
func (e *Engine) CompareAndSwap(ctx context.Context, p ids.PageNo, off int, old, new uint64) (uint64, bool, error) {
	res, _, err := e.do(ctx, atomicOp, coherence.Request{Op: coherence.OpCAS, Page: p, Offset: off, Compare: old, Value: new}, nil)
	return res.c.Value, res.c.Swapped, err
}
