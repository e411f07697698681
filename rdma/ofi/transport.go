//go:build ofi

package ofi

/*
#cgo LDFLAGS: -lfabric
#include <stdlib.h>
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include "fab.h"

static const char *dsm_strerror(int code) { return fi_strerror(code); }
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/dsmkit/dsm/rdma/internal/nonce"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// Config tunes a Transport. The zero value lets libfabric choose the
// provider.
type Config struct {
	// Provider names the libfabric provider: "sockets", "tcp;ofi_rxm",
	// "shm", "verbs;ofi_rxm", "efa", ... Empty lets libfabric choose.
	Provider string
	// Logger receives the transport's diagnostics. Nil discards them.
	Logger *slog.Logger
	// OpTimeout bounds how long an operation, a message or a descriptor
	// query waits for its completion when the caller's context has no
	// earlier deadline: a peer that died without closing is declared
	// unreachable after it. Zero means DefaultOpTimeout.
	OpTimeout time.Duration
	// MaxInflight is the number of batches and messages that may be in
	// flight at once; further calls wait for a free one. Zero means 128.
	MaxInflight int
	// RecvBuffers is the number of receive buffers of MaxMessage bytes kept
	// posted. Zero means 16.
	RecvBuffers int
	// Poll is how the poller waits for completions. Zero means PollAuto.
	Poll PollMode
}

// PollMode is how the poller waits when the completion queue is empty.
type PollMode uint8

const (
	// PollAuto blocks where the provider offers a wait object that wakes
	// for incoming traffic (sockets, which also makes progress on its own,
	// and the rxm providers, whose wait object holds their sockets), waits
	// for the doorbell on shm (PollDoorbell) and sleeps otherwise.
	PollAuto PollMode = iota
	// PollSleep reads the queue every 20 µs: little CPU, and the latency
	// of a request grows by up to one period at each side that must poll.
	PollSleep
	// PollBlock waits in fi_cq_sread. Only as good as the provider's wait
	// object: shm's does not wake for requests arriving from peers, so a
	// shm target serves them at most every 10 ms.
	PollBlock
	// PollSpin reads the queue continuously, yielding the CPU between
	// reads: the lowest latency, for a core per endpoint.
	PollSpin
	// PollDoorbell (shm only; its default) waits for the endpoint's
	// doorbell, which every peer of this package rings when it posts a
	// request that needs this endpoint's progress, and rings back the
	// initiators once served (see the package documentation, "Progress").
	PollDoorbell
)

// DefaultOpTimeout is the OpTimeout of a zero Config.
const DefaultOpTimeout = 5 * time.Second

// arenaMax is the most payload bytes one posted segment stages.
const arenaMax = 8 << 20

// Slot states.
const (
	slotIdle int32 = iota
	slotActive
	slotDone
	slotAbandoned
)

// Why a waiter was woken before its completions arrived.
const (
	kickNone int32 = iota
	kickClosed
	kickPeerGone
	kickTimeout
)

// slot is one request in flight (a segment of a batch, or one message) and
// its C memory. A slot is owned by the caller that acquired it until the
// caller abandons it; an abandoned slot is released by the poller once its
// last completion arrived, so a late completion only ever writes C memory.
type slot struct {
	id      uint32
	c       *C.dsm_slot
	pending atomic.Int32 // completions still due, plus one while posting
	state   atomic.Int32
	gen     atomic.Uint64 // bumped at each acquisition; guards kicks
	peer    atomic.Uint32
	// owner is the peer whose endpoint the slot's requests were posted on
	// (nil while idle): closeTx reclaims the slots that a retired endpoint
	// will never complete.
	owner   atomic.Pointer[peer]
	start   atomic.Int64 // unix nanos when the current segment was posted
	kickGen atomic.Uint64
	kickWhy atomic.Int32
	// gate is the in-doubt count of the peer incarnation a Post slot's
	// requests went to (nil for a message); held says that the slot, abandoned
	// with requests the provider may still execute, counts in it until
	// release (see Transport.inDoubt).
	gate  atomic.Pointer[atomic.Int32]
	held  atomic.Bool
	done  chan struct{} // the poller signals completion of an active slot
	kick  chan struct{} // close, peer loss or timeout
	errs  [C.DSM_MAX_BATCH]int32
	prov  [C.DSM_MAX_BATCH]int32
	opIdx [C.DSM_MAX_BATCH]uint16 // C op k -> index in the caller's ops
}

// Transport is one endpoint on a libfabric fabric; it implements
// rdma.Transport. See the package documentation.
type Transport struct {
	id ids.NodeID
	// nonce is this endpoint's incarnation: random, never zero.
	nonce    uint64
	cfg      Config
	log      *slog.Logger
	c        *C.dsm_fab
	prov     string
	addr     string
	virtAddr bool
	strAddr  bool
	namelen  int
	timeout  time.Duration
	shmName  string
	pollMode C.int
	// bell is the doorbell of a PollDoorbell endpoint (nil otherwise): a
	// Unix datagram socket beside the shm endpoint's file, read through
	// the runtime's network poller.
	bell     *os.File
	bellRaw  syscall.RawConn
	bellPath string
	selfBell C.dsm_bell
	// inflight counts the requests posted and not yet completed or given
	// up on: the doorbell poller waits for less long while some are.
	inflight atomic.Int32
	// fastWrite: WRITEs to shm peers that cross-memory attach reaches go
	// without FI_DELIVERY_COMPLETE (see the package documentation).
	fastWrite bool
	// callerPoll lets callers read the completion queue while they wait.
	callerPoll bool
	cqe        *C.dsm_cqe
	cqeN       int
	recvSize   int
	slots      []*slot
	free       chan *slot
	nextKey    atomic.Uint64
	// arenaBytes is the size of all staging arenas together.
	arenaBytes atomic.Int64
	nextReq    atomic.Uint64
	handler    atomic.Pointer[rdma.Handler]
	closing    atomic.Bool
	// wedged reports, once, that the shm provider refuses posts.
	wedged    sync.Once
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once

	// pollMu is held by whoever reads the completion queue (only the
	// poller, today; see the package documentation on caller polling).
	pollMu sync.Mutex

	// life guards every call into C against Close: callers hold it shared
	// while they use the endpoint or a slot's C memory and check closed.
	life   sync.RWMutex
	closed bool

	peerMu sync.RWMutex
	peers  map[ids.NodeID]*peer
	// txPeers are the peers with an endpoint of their own (shm).
	txPeers []*peer

	// doubts counts, per peer incarnation, the Post slots abandoned
	// (overdue, cancelled, peer removed) whose requests the provider has
	// not completed: they may still execute. Under peerMu; one small
	// entry per incarnation a Post reached, never removed.
	doubts map[incarnation]*atomic.Int32

	regMu sync.Mutex
	regs  map[uint64]*registration
	// fenced are the requester incarnations refused for good (Fence), at
	// most maxFencedPerNode per node, oldest first; names are the
	// endpoint names last added for each node (Fence closes the
	// connection to it). Under regMu.
	fenced map[ids.NodeID][]uint64
	names  map[ids.NodeID][]byte

	qmu     sync.Mutex
	queries map[uint64]chan frame

	ctl   chan ctlReq
	inbox inbox
}

// peer is a remote endpoint and what this side knows of its registrations.
type peer struct {
	id   ids.NodeID
	addr string
	fi   C.fi_addr_t
	self bool
	down atomic.Bool // the peer said bye; cleared by any later frame from it
	// want is the incarnation of the peer this node may reach
	// (ExpectNonce; 0: any); seen the one its latest frame came from (0:
	// none yet).
	want atomic.Uint64
	seen atomic.Uint64
	gone atomic.Bool // removed or replaced by RemovePeer or AddPeer
	// removed is closed when gone is set (markGone): control requests
	// waiting for the peer's answer stop waiting.
	removed chan struct{}
	// shm is the liveness of the peer when it is an shm endpoint of this
	// process (nil otherwise): calls that reach it hold shm.mu shared.
	shm *shmLife
	// bell is the peer's doorbell (len 0: none); dc is 1 when WRITEs to it
	// need FI_DELIVERY_COMPLETE. Both are set before the peer is published.
	bell C.dsm_bell
	dc   C.int
	// ep is the endpoint this node's requests to the peer leave from: the
	// transport's own, or on shm one of the peer's own (tx, with its
	// address vector txAV), so that a peer that dies with requests in
	// flight wedges only that one (see the package documentation).
	// Calls into the provider on ep hold txMu shared; retireTx closes tx
	// under it exclusively and sets txClosed.
	ep       *C.struct_fid_ep
	tx       *C.struct_fid_ep
	txAV     *C.struct_fid_av
	txMu     sync.RWMutex
	txClosed bool
	// txRetired is set once tx is closed and what it completed was read:
	// its abandoned slots can be reused.
	txRetired atomic.Bool
	// txSafe is set once the peer answered a request sent on tx, so it has
	// read tx's connection request (see closeTx).
	txSafe atomic.Bool
	// pid is the process of an shm peer of this package (0: unknown);
	// dead is set once that process is gone.
	pid  int
	dead atomic.Bool

	mu    sync.RWMutex
	descs map[uint64]remoteDesc
}

// remoteDesc is a peer's registration as its owner described it, or a
// tombstone for a key the owner revoked (keys are never reused).
type remoteDesc struct {
	len  uint64
	base uint64
	acc  rdma.Access
	// key is the fabric key this incarnation's operations name: the one
	// the owner granted it (Transport.Fence), not the registration's
	// published key.
	key     uint64
	revoked bool
}

// ctlReq is work for the control goroutine: answer a descriptor query, or
// acknowledge a revocation (ack).
type ctlReq struct {
	f   frame
	ack bool
}

var seq atomic.Uint64

// Listen opens an endpoint for node id. addr is "host:port" for the socket
// providers (port 0 picks a free one) and is ignored by shm, whose
// endpoints are named after the process. The transport's Addr is what peers
// pass to AddPeer.
func Listen(id ids.NodeID, addr string, cfg Config) (*Transport, error) {
	if id == ids.None {
		return nil, errors.New("ofi: listen with node id 0")
	}
	t := &Transport{
		id:      id,
		nonce:   nonce.New(),
		cfg:     cfg,
		log:     cfg.Logger,
		timeout: cfg.OpTimeout,
		stop:    make(chan struct{}),
		peers:   map[ids.NodeID]*peer{},
		regs:    map[uint64]*registration{},
		doubts:  map[incarnation]*atomic.Int32{},
		fenced:  map[ids.NodeID][]uint64{},
		names:   map[ids.NodeID][]byte{},
		queries: map[uint64]chan frame{},
		ctl:     make(chan ctlReq, 256),
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if t.timeout <= 0 {
		t.timeout = DefaultOpTimeout
	}
	nslots := cfg.MaxInflight
	if nslots <= 0 {
		nslots = 128
	}
	nrecv := cfg.RecvBuffers
	if nrecv <= 0 {
		nrecv = 16
	}
	t.recvSize = hdrLen + rdma.MaxMessage
	t.inbox.wake = make(chan struct{}, 1)

	var node, service, src *C.char
	if isShm(cfg.Provider) {
		cleanStaleShm(t.log)
		t.shmName = fmt.Sprintf("%s%d_%d_%d", shmPrefix, os.Getpid(), id, seq.Add(1))
		shmOpen(t.shmName)
		src = C.CString(t.shmName)
		defer C.free(unsafe.Pointer(src))
	} else if addr != "" {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("ofi: listen address %q: %w", addr, err)
		}
		node, service = C.CString(host), C.CString(port)
		defer C.free(unsafe.Pointer(node))
		defer C.free(unsafe.Pointer(service))
	}
	prov := C.CString(cfg.Provider)
	defer C.free(unsafe.Pointer(prov))
	var errbuf [256]C.char
	rc := C.dsm_open(prov, node, service, src, C.int(nrecv), C.size_t(t.recvSize), &t.c, &errbuf[0], C.size_t(len(errbuf)))
	if rc != 0 {
		if t.shmName != "" {
			shmShut(t.shmName)
			shmPark(nil, false)
		}
		return nil, fmt.Errorf("ofi: open provider %q: %s: %w", cfg.Provider, C.GoString(&errbuf[0]), fabricErr("open", int(-rc), 0))
	}
	t.prov = C.GoString(C.dsm_prov_name(t.c))
	if isShm(t.prov) && t.shmName == "" {
		// libfabric chose shm: open it again the way shm endpoints are
		// opened here (named, registered with the process's registry).
		C.dsm_close(t.c)
		cfg.Provider = t.prov
		return Listen(id, addr, cfg)
	}
	t.virtAddr = t.c.mr_mode&C.FI_MR_VIRT_ADDR != 0
	t.nextKey.Store(firstKey(t.nonce, int(t.c.info.domain_attr.mr_key_size)))
	t.strAddr = t.c.info.addr_format == C.FI_ADDR_STR
	t.namelen = int(t.c.namelen)
	t.addr = formatAddr(t.prov, C.GoBytes(unsafe.Pointer(&t.c.name[0]), C.int(t.c.namelen)))
	switch cfg.Poll {
	case PollSleep:
		t.pollMode = C.DSM_POLL_SLEEP
	case PollBlock:
		t.pollMode = C.DSM_POLL_BLOCK
	case PollSpin:
		t.pollMode = C.DSM_POLL_SPIN
	case PollDoorbell:
		t.pollMode = C.DSM_POLL_BELL
	default:
		t.pollMode = C.DSM_POLL_SLEEP
		if t.c.waitable != 0 && (t.c.auto_progress != 0 || strings.HasSuffix(t.prov, ";ofi_rxm")) {
			t.pollMode = C.DSM_POLL_BLOCK
		}
	}
	if cfg.Poll == PollAuto && isShm(t.prov) {
		t.pollMode = C.DSM_POLL_BELL
	}
	if t.pollMode == C.DSM_POLL_BLOCK && t.c.waitable == 0 {
		t.pollMode = C.DSM_POLL_SLEEP
	}
	if t.pollMode == C.DSM_POLL_BELL {
		if !isShm(t.prov) {
			t.pollMode = C.DSM_POLL_SLEEP
		} else if err := t.openBell(); err != nil {
			t.log.Warn("ofi: no doorbell, sleeping between reads instead", "err", err)
			t.pollMode = C.DSM_POLL_SLEEP
		}
	}
	t.fastWrite = isShm(t.prov) && t.shmFastWrite()
	// Callers read the queue themselves while they wait on shm (see the
	// package documentation); in blocking mode the poller holds it anyway.
	t.callerPoll = isShm(t.prov) && t.pollMode != C.DSM_POLL_BLOCK
	t.cqeN = 64
	t.cqe = (*C.dsm_cqe)(C.calloc(C.size_t(t.cqeN), C.size_t(unsafe.Sizeof(C.dsm_cqe{}))))
	t.slots = make([]*slot, nslots)
	t.free = make(chan *slot, nslots)
	for i := range t.slots {
		cs := C.dsm_slot_new(t.c, C.uint32_t(i))
		if cs == nil || C.dsm_slot_grow(t.c, cs, 4096) != 0 {
			if cs != nil {
				C.dsm_slot_free(cs)
			}
			t.freeC()
			return nil, errors.New("ofi: out of memory for operation slots")
		}
		t.arenaBytes.Add(int64(cs.arena_len))
		s := &slot{id: uint32(i), c: cs, done: make(chan struct{}, 1), kick: make(chan struct{}, 1)}
		t.slots[i] = s
		t.free <- s
	}
	// The endpoint reaches itself through the fabric, so that posts to the
	// local node take the same path (and the same atomicity domain) as
	// remote ones.
	self := &peer{id: id, addr: t.addr, self: true, descs: map[uint64]remoteDesc{}, removed: make(chan struct{}), bell: t.selfBell, dc: 1}
	if t.fastWrite {
		self.dc = 0 // cross-memory attach always reaches the own process
	}
	self.ep = t.c.ep
	rc = C.dsm_av_insert(t.c, unsafe.Pointer(&t.c.name[0]), &self.fi)
	if rc != 0 {
		t.freeC()
		return nil, fmt.Errorf("ofi: insert own address: %w", fabricErr("fi_av_insert", int(-rc), 0))
	}
	t.peers[id] = self
	t.log.Debug("ofi: listening", "node", id, "provider", t.prov, "addr", t.addr,
		"mr_mode", uint64(t.c.mr_mode), "waitable", t.c.waitable != 0, "auto_progress", t.c.auto_progress != 0)

	t.wg.Add(3)
	if t.bell != nil {
		go t.progressBell()
	} else {
		go t.progress()
	}
	go t.control()
	go t.dispatch()
	return t, nil
}

// openBell opens the endpoint's doorbell beside its shm file.
func (t *Transport) openBell() error {
	path := filepath.Join(shmDir, t.shmName+bellSuffix)
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	fd := C.dsm_bell_open(cpath, &t.selfBell)
	if fd < 0 {
		return fmt.Errorf("doorbell %s: %w", path, syscall.Errno(-fd))
	}
	// The socket is non-blocking, so os.NewFile hands it to the runtime's
	// network poller, and the poller goroutine waits there without an
	// OS thread.
	f := os.NewFile(uintptr(fd), path)
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	t.c.bell_fd = fd
	t.bell, t.bellRaw, t.bellPath = f, raw, path
	return nil
}

// closeBell closes the doorbell; the poller must have stopped.
func (t *Transport) closeBell() {
	if t.bell == nil {
		return
	}
	t.c.bell_fd = -1
	t.bell.Close()
	os.Remove(t.bellPath)
}

// shmFastWrite reports whether WRITEs to shm peers that cross-memory
// attach reaches may go without FI_DELIVERY_COMPLETE: true for the shm
// provider of libfabric 1.17, whose WRITE then copies the payload into the
// target's memory with process_vm_writev before it completes (smr_rma_fast)
// unless FI_SHM_DISABLE_CMA turns cross-memory attach off. Other versions
// keep delivery-complete writes.
func (t *Transport) shmFastWrite() bool {
	v := uint32(t.c.info.fabric_attr.prov_version)
	if v>>16 != 117 {
		return false
	}
	switch strings.ToLower(os.Getenv("FI_SHM_DISABLE_CMA")) {
	case "", "0", "no", "false", "off":
		return true
	}
	return false
}

// freeC releases the C side of a transport whose goroutines are stopped.
func (t *Transport) freeC() {
	if t.c == nil {
		return
	}
	if t.shmName == "" {
		t.closeC()
		return
	}
	shmShut(t.shmName)
	t.closeMRs()
	keep := false
	for _, s := range t.slots {
		if s != nil && s.state.Load() == slotAbandoned && s.pending.Load() > 0 {
			// A peer may still answer this request by writing into this
			// endpoint's mapping: leave the endpoint open (and its memory
			// allocated) rather than unmap it under the peer's feet.
			t.log.Warn("ofi: shm endpoint left open: requests to a peer never completed", "slot", s.id)
			keep = true
			break
		}
	}
	shmPark(t, keep)
}

// closeMRs closes the memory regions that are still registered.
func (t *Transport) closeMRs() {
	t.regMu.Lock()
	defer t.regMu.Unlock()
	for _, r := range t.regs {
		closeGrantsLocked(r)
		if r.mr != nil {
			C.dsm_mr_close(r.mr)
			r.mr = nil
		}
		r.pin.Unpin() // a Pinner dropped while pinning panics
	}
}

// closeC closes the endpoint and frees its C memory.
func (t *Transport) closeC() {
	t.closeTxs()
	C.dsm_close_ep(t.c)
	t.closeMRs()
	for _, s := range t.slots {
		if s == nil {
			continue
		}
		if s.state.Load() == slotAbandoned && s.pending.Load() > 0 {
			// Completions never came. Some providers (shm) let the target
			// write into the initiator's buffers after the initiator's
			// endpoint is closed, so this memory is left allocated rather
			// than handed back to malloc for reuse.
			t.log.Debug("ofi: leaving the memory of an unfinished request allocated", "slot", s.id)
			continue
		}
		C.dsm_slot_free(s.c)
		s.c = nil
	}
	C.dsm_close(t.c)
	t.c = nil
	if t.cqe != nil {
		C.free(unsafe.Pointer(t.cqe))
		t.cqe = nil
	}
	if t.shmName != "" {
		removeShm(t.shmName)
	}
}

// LocalID implements rdma.Transport.
func (t *Transport) LocalID() ids.NodeID { return t.id }

// Nonce is this endpoint's incarnation nonce: random, never zero, drawn by
// Listen. Every frame it sends carries it; dsmd publishes it to the
// directory, like the tcp backend's.
func (t *Transport) Nonce() uint64 { return t.nonce }

// ExpectNonce names the incarnation of peer id that this node may reach
// (0 lifts the check): once a frame from the peer showed another
// incarnation, Post and Send fail with rdma.ErrIncarnation without sending;
// the descriptor queries that precede the first use of a key (and follow
// an operation the provider refused) fail so too when another incarnation
// answers; and every other frame names the incarnation it is meant for, so
// the peer's process drops messages meant for an earlier one. What it learnt of the peer's registrations under another
// incarnation is forgotten.
func (t *Transport) ExpectNonce(id ids.NodeID, nonce uint64) {
	t.peerMu.RLock()
	p := t.peers[id]
	t.peerMu.RUnlock()
	if p == nil || p.self {
		return
	}
	if p.want.Swap(nonce) != nonce {
		p.mu.Lock()
		clear(p.descs)
		p.mu.Unlock()
	}
}

// firstKey is where this incarnation's requested memory keys start (the
// first is one above it): at a random point of the provider's key space,
// drawn from the nonce, so that a key of an earlier process at the same
// fabric address names nothing in this one (a peer that has not learnt of
// the restart is refused by the provider) rather than newer memory.
// Local keys (bit 62) stay clear.
func firstKey(nonce uint64, keySize int) uint64 {
	bits := 8 * keySize
	if bits <= 0 || bits > 62 {
		bits = 62
	}
	if bits <= 16 {
		return 0 // too few keys to spread: count from 1
	}
	// The upper half of the space is spare room for counting up.
	return (nonce % (1 << (bits - 1))) &^ 0xffff
}

// incarnationErr is the error of an operation or message to a peer whose
// process is not the incarnation expected, or nil.
func (p *peer) incarnationErr() error {
	want, seen := p.want.Load(), p.seen.Load()
	if want != 0 && seen != 0 && seen != want {
		return &rdma.PeerError{Peer: p.id, Err: fmt.Errorf("%w: incarnation %#x answers, %#x expected", rdma.ErrIncarnation, seen, want)}
	}
	return nil
}

// Addr implements rdma.Transport.
func (t *Transport) Addr() string { return t.addr }

// Provider is the name of the libfabric provider in use.
func (t *Transport) Provider() string { return t.prov }

// AddPeer implements rdma.Transport.
func (t *Transport) AddPeer(id ids.NodeID, addr string) error {
	if id == ids.None {
		return fmt.Errorf("%w: node id 0", rdma.ErrUnknownPeer)
	}
	if id == t.id {
		if addr != t.addr {
			return fmt.Errorf("ofi: own node %v added with another address %q", id, addr)
		}
		return nil
	}
	prov, name, err := parseAddr(addr)
	if err != nil {
		return err
	}
	if prov != t.prov {
		return fmt.Errorf("%w: %q, this endpoint uses %q", ErrProviderMismatch, prov, t.prov)
	}
	if t.strAddr {
		if len(name) < 2 || name[len(name)-1] != 0 {
			return fmt.Errorf("%w: endpoint name is not a string", ErrBadAddr)
		}
	} else if len(name) != t.namelen {
		return fmt.Errorf("%w: %d-byte endpoint name, want %d", ErrBadAddr, len(name), t.namelen)
	}
	t.peerMu.RLock()
	old := t.peers[id]
	t.peerMu.RUnlock()
	if old != nil && old.addr == addr && !old.down.Load() {
		return nil
	}
	// Copy the name into a zeroed C buffer of the largest name size, so the
	// provider never reads past it whatever its address format.
	cname := (*[maxNameLen + 1]byte)(C.calloc(maxNameLen+1, 1))
	defer C.free(unsafe.Pointer(cname))
	copy(cname[:], name)
	p := &peer{id: id, addr: addr, descs: map[uint64]remoteDesc{}, removed: make(chan struct{}), dc: 1}
	if isShm(t.prov) {
		p.shm = shmPeerLife(name)
		pid, peerBell := shmPeerOf(name)
		if t.bell != nil && peerBell != "" {
			setBell(&p.bell, peerBell)
		}
		if t.fastWrite && pid > 0 && C.dsm_cma_probe(C.int(pid)) == 1 {
			p.dc = 0
		}
		if pid != os.Getpid() {
			p.pid = pid
		}
		if err := t.openTx(p, unsafe.Pointer(cname)); err != nil {
			return err
		}
	}
	t.peerMu.Lock()
	old = t.peers[id]
	if old != nil && old.addr == addr && !old.down.Load() {
		t.peerMu.Unlock()
		t.closeTx(p) // another AddPeer of the same address won
		return nil
	}
	if old != nil {
		old.markGone()
		t.kickPeer(id, kickPeerGone)
	}
	t.life.RLock()
	if t.closed {
		t.life.RUnlock()
		t.peerMu.Unlock()
		return rdma.ErrClosed
	}
	if p.tx == nil {
		p.ep = t.c.ep
		if rc := C.dsm_av_insert(t.c, unsafe.Pointer(cname), &p.fi); rc != 0 {
			t.life.RUnlock()
			t.peerMu.Unlock()
			return fmt.Errorf("ofi: add peer %v: %w", id, fabricErr("fi_av_insert", int(-rc), 0))
		}
	} else {
		t.txPeers = append(t.txPeers, p)
	}
	t.life.RUnlock()
	t.peers[id] = p
	t.peerMu.Unlock()
	t.regMu.Lock()
	t.names[id] = name
	t.regMu.Unlock()
	if old != nil {
		t.retireTx(old)
	}
	return nil
}

// openTx opens the peer's own endpoint (shm). The poller must not read the
// queue meanwhile: the provider's progress would visit the endpoint before
// it is enabled.
func (t *Transport) openTx(p *peer, cname unsafe.Pointer) error {
	t.pollMu.Lock()
	defer t.pollMu.Unlock()
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return rdma.ErrClosed
	}
	name := C.CString(fmt.Sprintf("%s%d_%d_%d", shmPrefix, os.Getpid(), t.id, seq.Add(1)))
	defer C.free(unsafe.Pointer(name))
	if rc := C.dsm_tx_open(t.c, name, cname, &p.tx, &p.txAV, &p.fi); rc != 0 {
		return fmt.Errorf("ofi: add peer %v: %w", p.id, fabricErr("open an endpoint for the peer", int(-rc), 0))
	}
	p.ep = p.tx
	return nil
}

// closeTx closes the peer's own endpoint once, with the poller held off.
//
// libfabric 1.17's shm crashes a target that reads a connection request
// (the first request of an endpoint) after the requesting endpoint closed:
// smr_progress_connreq maps the requester's region by name and reads it
// without checking that the mapping succeeded. So an endpoint is closed
// only once the peer is known to have read its first request (txSafe: an
// answer came back), the peer's process is gone, or the peer is in this
// process (whose endpoints all close together); otherwise it is left open,
// its file in /dev/shm until the process ends (cleanStaleShm removes it).
func (t *Transport) closeTx(p *peer) {
	p.txMu.Lock()
	defer p.txMu.Unlock()
	if p.tx == nil || p.txClosed {
		return
	}
	if p.shm == nil && !p.dead.Load() && !p.txSafe.Load() {
		t.log.Debug("ofi: left the endpoint of a removed peer open: its first request may be unread", "peer", p.id)
		return
	}
	p.txClosed = true
	t.pollMu.Lock()
	defer t.pollMu.Unlock()
	C.dsm_tx_close(p.tx, p.txAV)
	t.reclaim(p)
}

// reclaim frees the slots whose requests went out on p's endpoint, which
// closeTx has just closed: what that endpoint completed before it closed
// is read from the queue first; what it did not will never complete, and
// nothing writes those slots' C memory any more (their results would have
// come through the closed endpoint). The caller holds pollMu.
func (t *Transport) reclaim(p *peer) {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return
	}
	for t.pollLocked(0, 0) > 0 {
	}
	p.txRetired.Store(true)
	for _, s := range t.slots {
		if s.owner.Load() == p {
			t.reclaimSlot(s)
		}
	}
}

// reclaimSlot frees an abandoned slot whose endpoint was retired. The
// caller holds pollMu, so no completion is being handled meanwhile.
func (t *Transport) reclaimSlot(s *slot) {
	if s.state.Load() == slotAbandoned && s.pending.Load() > 0 {
		s.pending.Store(0)
		t.release(s)
	}
}

// abandoned is called by a waiter that has just abandoned its slot: if the
// endpoint the slot's requests went out on was retired meanwhile (reclaim
// ran before the slot was abandoned), the slot is freed here.
func (t *Transport) abandoned(s *slot) {
	p := s.owner.Load()
	if p == nil || !p.txRetired.Load() {
		return
	}
	t.pollMu.Lock()
	defer t.pollMu.Unlock()
	if s.owner.Load() == p {
		t.reclaimSlot(s)
	}
}

// RemovePeer implements rdma.Transport. The fabric address stays in the
// address vector (operations may still be in flight to it); only this
// endpoint's use of it ends.
func (t *Transport) RemovePeer(id ids.NodeID) {
	if id == t.id {
		return
	}
	t.peerMu.Lock()
	p := t.peers[id]
	if p != nil {
		p.markGone()
	}
	delete(t.peers, id)
	t.peerMu.Unlock()
	t.kickPeer(id, kickPeerGone)
	if p != nil {
		t.retireTx(p)
	}
}

// retireTx closes the endpoint of a peer that was removed, replaced or
// found dead, after the requests pending on it were kicked: whatever the
// peer never answered stays in that endpoint, which is gone. The endpoint
// of a peer in this process stays open until the transport closes for
// good (see shmPark).
func (t *Transport) retireTx(p *peer) {
	if p.shm == nil {
		t.closeTx(p)
	}
}

// closeTxs closes the peers' own endpoints; the transport is closing.
func (t *Transport) closeTxs() {
	t.peerMu.Lock()
	ps := t.txPeers
	t.txPeers = nil
	t.peerMu.Unlock()
	for _, p := range ps {
		t.closeTx(p)
	}
}

// checkPeers notices shm peers whose process is gone (its pid no longer
// exists): their pending requests fail at once, later ones before anything
// is posted, and their endpoint is retired. The node layer's RemovePeer
// does the same on the directory's word.
func (t *Transport) checkPeers() {
	if t.shmName == "" {
		return
	}
	t.peerMu.RLock()
	var gone []*peer
	for _, p := range t.peers {
		if p.pid > 0 && !p.dead.Load() && !processRuns(p.pid) {
			gone = append(gone, p)
		}
	}
	t.peerMu.RUnlock()
	for _, p := range gone {
		if p.dead.Swap(true) {
			continue
		}
		t.log.Info("ofi: shm peer's process is gone", "peer", p.id, "pid", p.pid)
		t.kickPeer(p.id, kickPeerGone)
		t.retireTx(p)
	}
}

// markGone records that the peer was removed or replaced.
func (p *peer) markGone() {
	if p.gone.CompareAndSwap(false, true) {
		close(p.removed)
	}
}

// enter and leave bracket a call into the provider that reaches p; enter
// reports false when p is a closed shm endpoint of this process.
func (p *peer) enter() bool {
	if p.shm != nil {
		p.shm.mu.RLock()
		if p.shm.closed {
			p.shm.mu.RUnlock()
			return false
		}
	}
	p.txMu.RLock()
	if p.txClosed {
		p.leave()
		return false
	}
	return true
}

func (p *peer) leave() {
	p.txMu.RUnlock()
	if p.shm != nil {
		p.shm.mu.RUnlock()
	}
}

func (t *Transport) lookup(id ids.NodeID) (*peer, error) {
	if t.closing.Load() {
		return nil, rdma.ErrClosed
	}
	t.peerMu.RLock()
	p := t.peers[id]
	t.peerMu.RUnlock()
	if p == nil {
		return nil, &rdma.PeerError{Peer: id, Err: rdma.ErrUnknownPeer}
	}
	if err := p.incarnationErr(); err != nil {
		return nil, err
	}
	if p.dead.Load() {
		return nil, &rdma.PeerError{Peer: id, Err: fmt.Errorf("%w: its process (pid %d) is gone", rdma.ErrPeerUnreachable, p.pid)}
	}
	if p.down.Load() {
		return nil, &rdma.PeerError{Peer: id, Err: fmt.Errorf("%w: it closed its endpoint", rdma.ErrPeerUnreachable)}
	}
	return p, nil
}

// SetHandler implements rdma.Transport.
func (t *Transport) SetHandler(h rdma.Handler) {
	if h == nil {
		t.handler.Store(nil)
		return
	}
	t.handler.Store(&h)
}

// Close implements rdma.Transport. It tells the peers (best effort, briefly)
// that this endpoint is going away, fails whatever is pending with
// ErrClosed, stops the goroutines and releases the fabric resources.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.closing.Store(true)
		t.sayBye()
		t.life.Lock()
		t.closed = true
		t.life.Unlock()
		for _, s := range t.slots {
			t.kickSlot(s, s.gen.Load(), kickClosed)
		}
		close(t.stop)
		if t.pollMode == C.DSM_POLL_BLOCK {
			C.dsm_wake(t.c) // out of fi_cq_sread
		}
		if t.bell != nil {
			C.dsm_bell_ring(t.c.bell_fd, &t.selfBell, 'A') // wake the poller
		}
		t.wg.Wait()
		t.closeBell()
		t.freeC()
	})
	return nil
}

// sayBye tells every peer that this endpoint is going away and waits
// (briefly, in parallel) for each to acknowledge. Peers fail the operations
// pending on this endpoint at once instead of after OpTimeout, and an
// acknowledging peer has handled every request this endpoint sent before:
// shm peers of the same process would otherwise answer them into this
// endpoint's mapping after it is gone.
func (t *Transport) sayBye() {
	t.peerMu.RLock()
	ps := make([]*peer, 0, len(t.peers))
	for _, p := range t.peers {
		if !p.self && !p.down.Load() && !p.gone.Load() {
			ps = append(ps, p)
		}
	}
	t.peerMu.RUnlock()
	if len(ps) == 0 {
		return
	}
	wait := min(t.timeout, 500*time.Millisecond)
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			if _, err := t.rpc(ctx, p, wait, func(b []byte, id uint64) int { return encodeBye(b, t.id, id) }); err != nil {
				t.log.Debug("ofi: bye not acknowledged", "peer", p.id, "err", err)
			}
		}()
	}
	wg.Wait()
}

// acquire takes a free slot for a request to peer.
func (t *Transport) acquire(ctx context.Context, peer ids.NodeID) (*slot, uint64, error) {
	var s *slot
	select {
	case s = <-t.free:
	default:
		timer := time.NewTimer(t.timeout)
		defer timer.Stop()
		select {
		case s = <-t.free:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-t.stop:
			return nil, 0, rdma.ErrClosed
		case <-timer.C:
			return nil, 0, &rdma.PeerError{Peer: peer, Err: fmt.Errorf("%w: no free operation slot in %v", rdma.ErrPeerUnreachable, t.timeout)}
		}
	}
	select {
	case <-s.kick:
	default:
	}
	s.peer.Store(uint32(peer))
	gen := s.gen.Add(1)
	s.state.Store(slotIdle)
	return s, gen, nil
}

func (t *Transport) release(s *slot) {
	if s.held.Swap(false) {
		s.gate.Load().Add(-1) // its requests completed (or never will: closed)
	}
	s.gate.Store(nil)
	s.owner.Store(nil)
	s.state.Store(slotIdle)
	t.free <- s
}

// kickSlot wakes the owner of an active slot with a reason. gen is the
// slot's generation, loaded before whatever check chose the slot, so that
// an owner that acquired the slot since ignores the kick.
func (t *Transport) kickSlot(s *slot, gen uint64, why int32) {
	if s.state.Load() != slotActive {
		return
	}
	s.kickWhy.Store(why)
	s.kickGen.Store(gen)
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (t *Transport) kickPeer(id ids.NodeID, why int32) {
	for _, s := range t.slots {
		gen := s.gen.Load()
		if s.peer.Load() == uint32(id) {
			t.kickSlot(s, gen, why)
		}
	}
}

// await waits until the slot's posted requests completed. If the caller's
// context ends, the peer is lost, the transport closes or OpTimeout passes
// first, the slot is abandoned to the poller and await returns why; the
// caller must not touch the slot again.
func (t *Transport) await(ctx context.Context, s *slot, gen uint64, peer ids.NodeID) error {
	if t.callerPoll {
		var until time.Time
		for i := 0; ; i++ {
			select {
			case <-s.done:
				return nil
			default:
			}
			if i%callerPolls == 0 {
				now := time.Now()
				if i == 0 {
					until = now.Add(callerSpin)
				} else if now.After(until) {
					break
				}
			}
			if !t.pollOnce() {
				runtime.Gosched()
			}
		}
	}
	for {
		var why error
		select {
		case <-s.done:
			return nil
		case <-s.kick:
			if s.kickGen.Load() != gen {
				continue
			}
			// The requests were posted: the target may have executed
			// them, and their completions will never say.
			switch s.kickWhy.Load() {
			case kickClosed:
				why = fmt.Errorf("%w: %w", rdma.ErrClosed, rdma.ErrOutcomeUnknown)
			case kickTimeout:
				why = &rdma.PeerError{Peer: peer, Err: fmt.Errorf("%w: %w: no completion within %v", rdma.ErrPeerUnreachable, rdma.ErrOutcomeUnknown, t.timeout)}
			default:
				why = &rdma.PeerError{Peer: peer, Err: fmt.Errorf("%w: %w: peer removed or closed", rdma.ErrPeerUnreachable, rdma.ErrOutcomeUnknown)}
			}
		case <-ctx.Done():
			// The requests were posted: as for a kick, they may execute.
			why = fmt.Errorf("%w: %w", ctx.Err(), rdma.ErrOutcomeUnknown)
		}
		// A Post's requests that the provider may still execute put the
		// peer in doubt until they complete (inDoubt); counted before the
		// slot is abandoned, so that the poller's release finds it.
		g := s.gate.Load()
		if g != nil {
			g.Add(1)
			s.held.Store(true)
		}
		if s.state.CompareAndSwap(slotActive, slotAbandoned) {
			t.abandoned(s)
			return why
		}
		if g != nil {
			s.held.Store(false)
			g.Add(-1)
		}
		<-s.done
		return nil
	}
}

// finishPost ends the posting phase of a slot with n requests of which
// posted were accepted by the provider. It reports whether completions are
// still due.
func finishPost(s *slot, n, posted int) bool {
	if s.pending.Add(int32(-(1 + n - posted))) == 0 {
		s.state.Store(slotDone)
		return false
	}
	return true
}

// send posts one two-sided frame (already encoded in b, or a user message
// after a header when user is not nil) and waits for its completion.
func (t *Transport) send(ctx context.Context, p *peer, hdr []byte, user []byte) error {
	s, gen, err := t.acquire(ctx, p.id)
	if err != nil {
		return err
	}
	n := len(hdr) + len(user)
	t.life.RLock()
	if t.closed {
		t.life.RUnlock()
		t.release(s)
		return rdma.ErrClosed
	}
	if rc := t.grow(s, n); rc != 0 {
		t.life.RUnlock()
		t.release(s)
		return fabricErr("grow staging buffer", int(-rc), 0)
	}
	arena := unsafe.Slice((*byte)(unsafe.Pointer(s.c.arena)), n)
	copy(arena, hdr)
	to := p.want.Load()
	if frameKind(hdr[1]) == frameQuery {
		// Any incarnation answers a descriptor query (query checks whose
		// answer it is), so that an initiator learns of a restart.
		to = 0
	}
	stampNonces(arena, t.nonce, to)
	copy(arena[len(hdr):], user)
	t.life.RUnlock()

	// start before state: the reaper reads them in the other order.
	s.start.Store(time.Now().UnixNano())
	s.owner.Store(p)
	s.state.Store(slotActive)
	s.pending.Store(2)
	posted := 0
	var postErr error
	var wait time.Duration
	for {
		t.life.RLock()
		if t.closed {
			t.life.RUnlock()
			postErr = rdma.ErrClosed
			break
		}
		if !p.enter() {
			t.life.RUnlock()
			postErr = &rdma.PeerError{Peer: p.id, Err: fmt.Errorf("%w: endpoint closed", rdma.ErrPeerUnreachable)}
			break
		}
		t.inflight.Add(1)
		rc := C.dsm_send(t.c, p.ep, s.c, p.fi, C.size_t(n), &p.bell)
		if rc != 0 {
			t.inflight.Add(-1)
		}
		p.leave()
		t.life.RUnlock()
		if rc == 0 {
			posted = 1
			break
		}
		if rc != -C.FI_EAGAIN {
			postErr = &rdma.PeerError{Peer: p.id, Err: fmt.Errorf("%w: %w", rdma.ErrPeerUnreachable, fabricErr("fi_send", int(-rc), 0))}
			break
		}
		if err := t.backoff(ctx, p, s.start.Load(), &wait); err != nil {
			postErr = err
			break
		}
	}
	if finishPost(s, 1, posted) {
		if err := t.await(ctx, s, gen, p.id); err != nil {
			t.inflight.Add(int32(-posted))
			return err
		}
	}
	t.inflight.Add(int32(-posted))
	code, prov := s.errs[0], s.prov[0]
	t.release(s)
	if postErr != nil {
		return postErr
	}
	if code != 0 {
		return &rdma.PeerError{Peer: p.id, Err: fmt.Errorf("%w: %w", rdma.ErrPeerUnreachable, fabricErr("send completion", int(code), int(prov)))}
	}
	return nil
}

// backoff waits a moment (growing with each call) for the provider's queues
// to drain before a post
// that got FI_EAGAIN is retried, and gives up when the peer is gone, the
// transport closes, the context ends or the post has been refused for
// OpTimeout (a provider may refuse posts to a dead peer forever).
func (t *Transport) backoff(ctx context.Context, p *peer, since int64, wait *time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if t.closing.Load() {
		return rdma.ErrClosed
	}
	if p.down.Load() || p.gone.Load() || p.dead.Load() {
		return &rdma.PeerError{Peer: p.id, Err: fmt.Errorf("%w: peer removed, closed or gone", rdma.ErrPeerUnreachable)}
	}
	if time.Now().UnixNano()-since > int64(t.timeout) {
		if isShm(t.prov) {
			t.wedged.Do(func() {
				t.log.Error("ofi: the shm provider has refused posts to a peer for OpTimeout; the likely cause: the peer's process died or hangs with atomics or messages to it in flight, which leaves the endpoint for that peer unable to post them again; RemovePeer (the directory's failure verdict) retires it (docs/operations.md, Running on an RDMA fabric)",
					"peer", p.id)
			})
		}
		return &rdma.PeerError{Peer: p.id, Err: fmt.Errorf("%w: provider refused posts for %v", rdma.ErrPeerUnreachable, t.timeout)}
	}
	// Back off exponentially: posters that retry at once would take the
	// CPU from the poller that frees the provider's queue.
	if *wait == 0 {
		*wait = 5 * time.Microsecond
	}
	time.Sleep(*wait)
	*wait = min(2**wait, 50*time.Microsecond)
	return nil
}

// Send implements rdma.Transport.
func (t *Transport) Send(ctx context.Context, peer ids.NodeID, msg []byte) error {
	if len(msg) > rdma.MaxMessage {
		return fmt.Errorf("%w: %d-byte message (max %d)", rdma.ErrTooLarge, len(msg), rdma.MaxMessage)
	}
	// A context already ended sends nothing (as Post): otherwise a message
	// that completes at once races the context in await.
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := t.lookup(peer)
	if err != nil {
		return err
	}
	var hdr [hdrLen]byte
	putHdr(hdr[:], frameUser, t.id)
	return t.send(ctx, p, hdr[:], msg)
}

// FabricError is a failure reported by libfabric: a call that returned an
// error code, or an error completion.
type FabricError struct {
	Op       string
	Code     int // FI_E* (positive)
	ProvCode int // the provider's own code of an error completion
}

func (e *FabricError) Error() string {
	s := fmt.Sprintf("ofi: %s: %s (%d)", e.Op, C.GoString(C.dsm_strerror(C.int(e.Code))), e.Code)
	if e.ProvCode != 0 {
		s += fmt.Sprintf(", provider code %d", e.ProvCode)
	}
	return s
}

func fabricErr(op string, code, prov int) *FabricError {
	return &FabricError{Op: op, Code: code, ProvCode: prov}
}
