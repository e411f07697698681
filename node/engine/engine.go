package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
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
	// ErrConflict fails a local miss because a remote request took the
	// page from under it; the caller retries the miss.
	ErrConflict = errors.New("engine: miss interrupted by a remote request")
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
	// PageSize in bytes: a positive multiple of 8.
	PageSize int
	// Epoch and Members are the configuration.
	Epoch   ids.Epoch
	Members []ids.NodeID
	// HomeOf names the home of every page of the region (a pure
	// function). The home of page p keeps its slot at offset
	// SlotOffset(p) of its registration.
	HomeOf func(ids.PageNo) ids.NodeID
	// Transport is this node's endpoint; the engine installs its message
	// handler. The caller closes it after the engine.
	Transport rdma.Transport
	// Pages receives drops and downgrades; nil: none (atomics only).
	Pages Pages
	// Tick is the interval of the protocol clock (default 1ms).
	Tick time.Duration
	// Logger; nil: discard.
	Logger *slog.Logger
}

// Engine runs the coherence protocol of one node for one region.
type Engine struct {
	cfg     Config
	sm      *coherence.Node
	reg     rdma.Registration // nil when this node homes no page
	mem     []byte
	slotOff map[ids.PageNo]uint64
	log     *slog.Logger

	reqCh  chan submit
	doneCh chan coherence.VerbsDone
	recvCh chan coherence.Message
	// effectCh returns the cache's answers to drops and downgrades.
	effectCh chan *effectJob
	stop     chan struct{}
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	startOnce sync.Once
	closeOnce sync.Once

	// Owned by the loop goroutine.
	peers    map[ids.NodeID]rdma.Descriptor
	nextID   uint64
	waiters  map[uint64]*waiter
	granted  map[ids.PageNo][]byte // the state machine's M copy, kept equal to the cache's
	evicting map[ids.PageNo]int    // Evict calls in progress: the cache already dropped the page
	effects  map[ids.PageNo][]*effectJob
}

type missKind uint8

const (
	atomicOp missKind = 1 + iota
	readMiss
	writeMiss
	evictOp
)

type submit struct {
	req   coherence.Request
	kind  missKind
	dirty []byte // evictOp: the data to write back
	w     *waiter
}

type waiter struct {
	page ids.PageNo
	kind missKind
	ch   chan result // buffered 1
}

type result struct {
	c    coherence.Completion
	data []byte // misses: a copy of the page
	err  error
}

var _ localcache.Coherence = (*Engine)(nil)

// New validates cfg, allocates and registers the home slots of the pages
// this node is home of, and returns an engine that is not running yet.
func New(cfg Config) (*Engine, error) {
	if cfg.Transport == nil || cfg.HomeOf == nil || cfg.NumPages <= 0 {
		return nil, fmt.Errorf("%w: transport, HomeOf and NumPages are required", ErrBadConfig)
	}
	if cfg.Transport.LocalID() != cfg.ID {
		return nil, fmt.Errorf("%w: transport is %v, engine %v", ErrBadConfig, cfg.Transport.LocalID(), cfg.ID)
	}
	if cfg.Tick <= 0 {
		cfg.Tick = time.Millisecond
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	homed, slotOff := layout(cfg)
	sm, err := coherence.NewNode(coherence.Config{
		ID: cfg.ID, PageSize: cfg.PageSize, Epoch: cfg.Epoch, Members: cfg.Members,
		HomeOf: func(p ids.PageNo) ids.NodeID {
			if int64(p) >= int64(cfg.NumPages) {
				return ids.None
			}
			return cfg.HomeOf(p)
		},
		HomedPages: homed,
	})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Engine{
		cfg: cfg, sm: sm, slotOff: slotOff, log: log,
		reqCh:  make(chan submit),
		doneCh: make(chan coherence.VerbsDone),
		recvCh: make(chan coherence.Message, 256),
		stop:   make(chan struct{}),
		ctx:    ctx, cancel: cancel,
		peers:    map[ids.NodeID]rdma.Descriptor{},
		waiters:  map[uint64]*waiter{},
		granted:  map[ids.PageNo][]byte{},
		evicting: map[ids.PageNo]int{},
		effects:  map[ids.PageNo][]*effectJob{},
		effectCh: make(chan *effectJob),
	}
	if len(homed) > 0 {
		n := len(homed) * (8 + cfg.PageSize)
		mem, err := rdma.Alloc(n)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("engine: %w", err)
		}
		for _, p := range homed {
			rdma.StoreWord(mem, slotOff[p], uint64(coherence.InitialWord(cfg.Epoch)))
		}
		reg, err := cfg.Transport.Register(mem, rdma.AccessAll)
		if err != nil {
			_ = rdma.Free(mem)
			cancel()
			return nil, fmt.Errorf("engine: register home slots: %w", err)
		}
		e.mem, e.reg = mem, reg
	}
	return e, nil
}

// layout lists the pages cfg.ID is home of and the slot offset of every
// page at its home: the pages of one home, in page order, one slot of
// 8+PageSize bytes each. Every node computes the same layout.
func layout(cfg Config) ([]ids.PageNo, map[ids.PageNo]uint64) {
	next := map[ids.NodeID]uint64{}
	off := make(map[ids.PageNo]uint64, cfg.NumPages)
	var homed []ids.PageNo
	for i := 0; i < cfg.NumPages; i++ {
		p := ids.PageNo(i)
		h := cfg.HomeOf(p)
		off[p] = next[h]
		next[h] += uint64(8 + cfg.PageSize)
		if h == cfg.ID {
			homed = append(homed, p)
		}
	}
	return homed, off
}

// Descriptor is the descriptor of this node's home memory (ok false when
// it homes no page). Peers need it to reach the slots of its pages.
func (e *Engine) Descriptor() (rdma.Descriptor, bool) {
	if e.reg == nil {
		return rdma.Descriptor{}, false
	}
	return e.reg.Descriptor(), true
}

// Start runs the engine with the home memory descriptors of the peers
// (this node's own may be included; it is added if missing).
func (e *Engine) Start(peers map[ids.NodeID]rdma.Descriptor) {
	e.startOnce.Do(func() {
		ps := make(map[ids.NodeID]rdma.Descriptor, len(peers)+1)
		for id, d := range peers {
			ps[id] = d
		}
		if d, ok := e.Descriptor(); ok {
			ps[e.cfg.ID] = d
		}
		e.peers = ps
		e.cfg.Transport.SetHandler(e.handle)
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
		e.cfg.Transport.SetHandler(nil)
		close(e.stop)
		e.cancel()
		e.wg.Wait()
		if e.reg != nil {
			err = errors.Join(e.reg.Deregister(), rdma.Free(e.mem))
		}
	})
	return err
}

// handle is the transport's message handler.
func (e *Engine) handle(from ids.NodeID, b []byte) {
	m, err := coherence.Unmarshal(b)
	if err != nil {
		e.log.Warn("undecodable message", "from", from, "err", err)
		return
	}
	if m.From != from {
		e.log.Warn("message with a forged sender", "from", from, "claims", m.From)
		return
	}
	select {
	case e.recvCh <- m:
	case <-e.stop:
	}
}

// ---- the loop: sole owner of the state machine ----

func (e *Engine) loop() {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.Tick)
	defer t.Stop()
	defer func() {
		for id, w := range e.waiters {
			w.ch <- result{err: ErrClosed}
			delete(e.waiters, id)
		}
	}()
	for {
		select {
		case <-e.stop:
			return
		case s := <-e.reqCh:
			if s.kind != atomicOp && len(e.effects[s.req.Page]) > 0 {
				// The cache is giving the page up: let it take the
				// page's lock first (the caller holds it).
				s.w.ch <- result{err: ErrConflict}
				continue
			}
			e.nextID++
			s.req.ID = e.nextID
			if s.kind == evictOp {
				if s.dirty != nil {
					if g := e.granted[s.req.Page]; g != nil {
						copy(g, s.dirty)
					}
				}
				e.evicting[s.req.Page]++
			}
			if err := e.sm.Step(s.req); err != nil {
				if s.kind == evictOp {
					e.evicting[s.req.Page]--
				}
				s.w.ch <- result{err: err}
				continue
			}
			e.waiters[s.req.ID] = s.w
		case d := <-e.doneCh:
			if err := e.sm.Step(d); err != nil {
				e.log.Debug("completion refused", "batch", d.ID, "err", err)
			}
		case m := <-e.recvCh:
			if err := e.sm.Step(coherence.Receive{Msg: m}); err != nil {
				e.log.Debug("message refused", "msg", m, "err", err)
			}
		case j := <-e.effectCh:
			e.effectDone(j)
		case <-t.C:
			_ = e.sm.Step(coherence.Tick{})
		}
		e.apply()
	}
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
	switch pe.Kind {
	case coherence.PageGrantExclusive:
		e.granted[pe.Page] = pe.Data
		return
	case coherence.PageInstallShared:
		delete(e.granted, pe.Page)
		return
	}
	e.failMisses(pe.Page)
	if e.cfg.Pages == nil || e.evicting[pe.Page] > 0 {
		if pe.Kind == coherence.PageDrop {
			delete(e.granted, pe.Page)
		}
		return
	}
	j := &effectJob{kind: pe.Kind, page: pe.Page, alias: e.granted[pe.Page]}
	if pe.Kind == coherence.PageDrop {
		delete(e.granted, pe.Page)
	}
	q := e.effects[pe.Page]
	e.effects[pe.Page] = append(q, j)
	if len(q) == 0 {
		e.runEffect(j)
	}
}

// effectJob is a drop or downgrade the cache is applying. Jobs of one
// page run one at a time, in order.
type effectJob struct {
	kind  coherence.PageEffectKind
	page  ids.PageNo
	alias []byte            // the state machine's M copy, if any
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
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if j.kind == coherence.PageDrop {
			j.dirty = e.cfg.Pages.Drop(e.cfg.Region, j.page)
		} else {
			j.dirty = e.cfg.Pages.Downgrade(e.cfg.Region, j.page)
		}
		select {
		case e.effectCh <- j:
		case <-e.stop:
		}
	}()
}

// effectDone takes the cache's answer: its data replaces the state
// machine's copy and the page data of the held write-backs, which are
// posted now; the page's next job starts.
func (e *Engine) effectDone(j *effectJob) {
	if j.dirty != nil {
		if j.alias != nil {
			copy(j.alias, j.dirty)
		}
		for _, b := range j.held {
			for i := range b.Verbs {
				v := &b.Verbs[i]
				if v.Kind == coherence.VerbWrite && v.Span == coherence.SpanPage && v.Page == j.page {
					copy(v.Data, j.dirty)
				}
			}
		}
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
	r := result{c: c}
	switch w.kind {
	case readMiss, writeMiss:
		st, data := e.sm.Copy(c.Page)
		if st == coherence.Invalid || (w.kind == writeMiss && st != coherence.Modified) {
			r.err = ErrConflict
		} else {
			r.data = append([]byte(nil), data...)
		}
	case evictOp:
		e.evicting[c.Page]--
		if e.evicting[c.Page] <= 0 {
			delete(e.evicting, c.Page)
		}
	}
	w.ch <- r
}

// send queues a message; a lost one is retransmitted by the protocol.
func (e *Engine) send(m coherence.Message) {
	if err := e.cfg.Transport.Send(e.ctx, m.To, m.Marshal()); err != nil {
		e.log.Debug("send", "msg", m, "err", err)
	}
}

// post executes one batch at its home on a goroutine of its own and steps
// the outcome back in.
func (e *Engine) post(b coherence.Batch) {
	ops, err := e.ops(b)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		d := coherence.VerbsDone{ID: b.ID, Err: err}
		if err == nil {
			d.Err = e.cfg.Transport.Post(e.ctx, b.Home, ops)
		}
		if d.Err == nil {
			d.Results = make([]coherence.Result, len(ops))
			for i := range ops {
				d.Results[i] = coherence.Result{Word: ops[i].Result}
				if ops[i].Kind == rdma.OpRead {
					d.Results[i].Data = ops[i].Buf
				}
			}
		}
		select {
		case e.doneCh <- d:
		case <-e.stop:
		}
	}()
}

// ops turns a batch into rdma operations on the home's slots.
func (e *Engine) ops(b coherence.Batch) ([]rdma.Op, error) {
	desc, ok := e.peers[b.Home]
	if !ok {
		return nil, fmt.Errorf("%w: %v", ErrNoHome, b.Home)
	}
	ops := make([]rdma.Op, len(b.Verbs))
	for i, v := range b.Verbs {
		off, ok := e.slotOff[v.Page]
		if !ok {
			return nil, fmt.Errorf("%w: page %v", ErrNoHome, v.Page)
		}
		op := rdma.Op{RKey: desc.RKey, Offset: off + v.Span.Offset()}
		switch v.Kind {
		case coherence.VerbRead:
			op.Kind = rdma.OpRead
			op.Buf = make([]byte, v.Span.Len(e.cfg.PageSize))
		case coherence.VerbWrite:
			op.Kind = rdma.OpWrite
			op.Buf = v.Data
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

// do submits a request and waits for its completion or ctx.
func (e *Engine) do(ctx context.Context, kind missKind, req coherence.Request, dirty []byte) (result, error) {
	w := &waiter{page: req.Page, kind: kind, ch: make(chan result, 1)}
	select {
	case e.reqCh <- submit{req: req, kind: kind, dirty: dirty, w: w}:
	case <-e.stop:
		return result{}, ErrClosed
	case <-ctx.Done():
		return result{}, ctx.Err()
	}
	select {
	case r := <-w.ch:
		return r, r.err
	case <-e.stop:
		return result{}, ErrClosed
	case <-ctx.Done():
		return result{}, ctx.Err()
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
	res, err := e.do(ctx, readMiss, coherence.Request{Op: coherence.OpLoad, Page: p}, nil)
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
	res, err := e.do(ctx, writeMiss, coherence.Request{Op: coherence.OpAdd, Page: p, Value: 0}, nil)
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
	_, err := e.do(ctx, evictOp, coherence.Request{Op: coherence.OpEvict, Page: p}, dirty)
	return err
}

// Load returns the 8-byte word at byte offset off of page p (a multiple
// of 8).
func (e *Engine) Load(ctx context.Context, p ids.PageNo, off int) (uint64, error) {
	res, err := e.do(ctx, atomicOp, coherence.Request{Op: coherence.OpLoad, Page: p, Offset: off}, nil)
	return res.c.Value, err
}

// Store writes v to the word at offset off of page p. A call that returns
// ctx's error may still take effect.
func (e *Engine) Store(ctx context.Context, p ids.PageNo, off int, v uint64) error {
	_, err := e.do(ctx, atomicOp, coherence.Request{Op: coherence.OpStore, Page: p, Offset: off, Value: v}, nil)
	return err
}

// Add adds delta to the word at offset off of page p and returns the old
// value. A call that returns ctx's error may still take effect.
func (e *Engine) Add(ctx context.Context, p ids.PageNo, off int, delta uint64) (uint64, error) {
	res, err := e.do(ctx, atomicOp, coherence.Request{Op: coherence.OpAdd, Page: p, Offset: off, Value: delta}, nil)
	return res.c.Value, err
}

// CompareAndSwap replaces the word at offset off of page p with new if it
// equals old; it returns the old value and whether it swapped. A call that
// returns ctx's error may still take effect.
func (e *Engine) CompareAndSwap(ctx context.Context, p ids.PageNo, off int, old, new uint64) (uint64, bool, error) {
	res, err := e.do(ctx, atomicOp, coherence.Request{Op: coherence.OpCAS, Page: p, Offset: off, Compare: old, Value: new}, nil)
	return res.c.Value, res.c.Swapped, err
}
