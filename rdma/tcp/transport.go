package tcp

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/internal/nonce"
	"github.com/dsmkit/dsm/rdma/internal/target"
)

// Config tunes a Transport. The zero value is usable.
type Config struct {
	// Logger receives connection events (refused handshakes, broken
	// connections, protocol violations). Nil discards them.
	Logger *slog.Logger
	// FirstKey is the key of the first registration (the next ones follow
	// it). 0, the default, draws it at random, so that the keys of a
	// restarted process never name the memory of the previous one; tests
	// set it to make two incarnations' keys equal.
	FirstKey uint64
	// DialTimeout bounds one attempt to connect to a peer, handshake
	// included. Zero means 5 s.
	DialTimeout time.Duration
	// HandshakeTimeout bounds the handshake of an accepted connection.
	// Zero means 5 s.
	HandshakeTimeout time.Duration
	// KeepAlive is the TCP keep-alive period of every connection: how soon
	// a silent, vanished peer is noticed when no operation is waiting on
	// it. Zero means 15 s; negative disables keep-alives.
	KeepAlive time.Duration
	// UserTimeout is how long data sent on a connection may stay
	// unacknowledged before the kernel breaks the connection
	// (TCP_USER_TIMEOUT, Linux only). Without it a connection whose
	// packets are lost for a while stays open while TCP backs its
	// retransmissions off, up to minutes apart, and a Post on it waits
	// for its answer for as long (docs/failover.md §10); broken, it is
	// dialed again within RetryWindow. It also ends a connection whose
	// keep-alive probes go unanswered that long. Zero means 5 s; negative
	// leaves the kernel's default (about 15 minutes).
	UserTimeout time.Duration
	// RetryWindow bounds how long, after the connection that carried a
	// batch broke before its response came back, Post keeps trying to
	// reach the same incarnation of the peer to finish the batch (the
	// peer answers a batch it executed from its record, and executes one
	// it never saw). When the window passes first, Post fails with
	// rdma.ErrOutcomeUnknown. The Post's context bounds it too. Zero means
	// 10 s; negative means no retry at all.
	RetryWindow time.Duration
	// SessionLinger is how long this node, as a responder, keeps the
	// record of a requester incarnation's recent batches after its last
	// connection closed. It should exceed the requesters' RetryWindow.
	// Zero means 1 minute.
	SessionLinger time.Duration
	// TLS, when set, makes every connection mutual TLS 1.3: see TLS.
	// Nil: plain TCP, no authentication beyond the hello (loopback and
	// tests only).
	TLS *TLS
}

// TLS is the mutual TLS of a Transport. A connection is authenticated by
// the TLS handshake (each side's certificate valid under the cluster CA, as
// the configs check) and then by the hello: the node id that the dialer's
// hello claims must be the one its certificate names, and the listener's
// certificate must name the node dialed. A connection that fails either
// check is closed before any request is read from it, so no memory key is
// ever used on a connection that did not authenticate as the node it
// claims to be.
type TLS struct {
	// Server is the config of accepted connections; it must require and
	// verify the dialer's certificate (tlsconf.Manager.ServerConfig).
	Server *tls.Config
	// Client is the config of dialed connections
	// (tlsconf.Manager.ClientConfig).
	Client *tls.Config
	// PeerNode returns the node id that the verified certificate of an
	// established connection names (tlsconf.PeerNode).
	PeerNode func(tls.ConnectionState) (ids.NodeID, error)
	// Plaintext, for trusted fabrics only, authenticates each connection
	// with TLS as above and then carries the frames in plaintext: no
	// encryption and no integrity after the hellos. Both ends must agree
	// (the TLS handshake fails otherwise, ALPN "dsm-verbs-plain" against
	// "dsm-verbs-tls").
	Plaintext bool
}

// ALPN protocol names of the verbs transport over TLS.
const (
	alpnTLS   = "dsm-verbs-tls"
	alpnPlain = "dsm-verbs-plain"
)

// prepared returns the configs with the transport's ALPN protocol set.
func (c *TLS) prepared() (*TLS, error) {
	if c.Server == nil || c.Client == nil || c.PeerNode == nil {
		return nil, errors.New("tcp: TLS needs Server, Client and PeerNode")
	}
	protos := []string{alpnTLS}
	if c.Plaintext {
		protos = []string{alpnPlain}
	}
	p := *c
	p.Client = c.Client.Clone()
	p.Client.NextProtos = protos
	p.Server = c.Server.Clone()
	p.Server.NextProtos = protos
	if get := c.Server.GetConfigForClient; get != nil {
		p.Server.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			cfg, err := get(h)
			if cfg != nil {
				cfg = cfg.Clone()
				cfg.NextProtos = protos
			}
			return cfg, err
		}
	}
	return &p, nil
}

func (c *Config) fill() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 5 * time.Second
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = 15 * time.Second
	}
	if c.RetryWindow == 0 {
		c.RetryWindow = 10 * time.Second
	}
	if c.UserTimeout == 0 {
		c.UserTimeout = 5 * time.Second
	}
	if c.SessionLinger <= 0 {
		c.SessionLinger = time.Minute
	}
}

// Transport is one node's endpoint of the tcp backend. It implements
// rdma.Transport; see the package documentation for the protocol.
type Transport struct {
	id    ids.NodeID
	nonce uint64 // this incarnation: the requester's session, the responder's identity
	cfg   Config
	log   *slog.Logger
	ln    net.Listener
	table *target.Table

	handler atomic.Pointer[rdma.Handler]
	closed  atomic.Bool

	ctx    context.Context // cancelled by Close; parent of dials
	cancel context.CancelFunc

	mu      sync.Mutex
	peers   map[ids.NodeID]*peer // under mu
	inbound map[net.Conn]*conn   // accepted, handshaking (nil) or serving; under mu
	// outs are this node's sessions as a requester, one per peer node
	// ever added; never removed, so that sequence numbers towards a node
	// are never reused. Under mu.
	outs map[ids.NodeID]*outSession
	// sessions are the requester sessions this node serves; lastSession
	// numbers them. Under mu.
	sessions    map[sessionKey]*inSession
	lastSession uint64
	// fenced are the requester incarnations refused for good (Fence), at
	// most maxFencedPerNode per node, oldest first. Under mu.
	fenced map[ids.NodeID][]uint64
	wg     sync.WaitGroup // every goroutine of the transport
}

// maxFencedPerNode bounds the incarnations of one node that Fence keeps
// refusing (the directory keeps as many past nonces per node).
const maxFencedPerNode = 64

var _ rdma.Transport = (*Transport)(nil)

// peer is what the transport knows of one peer: its address and the
// outbound connection that carries this node's requests to it.
type peer struct {
	id   ids.NodeID
	addr string
	// nonce is the incarnation this node may reach (ExpectNonce); 0: any.
	nonce uint64
	out   *outSession
	conn  *conn        // nil until the first use, or after a failure
	dial  *dialAttempt // the connection attempt in progress, if any
}

// dialAttempt is one connection attempt that every caller needing the
// peer meanwhile waits for.
type dialAttempt struct {
	done chan struct{}
	conn *conn
	err  error
}

// Listen starts the endpoint of node id on addr (host:port; port 0 picks a
// free one, see Addr).
func Listen(id ids.NodeID, addr string, cfg Config) (*Transport, error) {
	if id == ids.None {
		return nil, errors.New("tcp: listen: node id 0 is reserved")
	}
	cfg.fill()
	if cfg.TLS != nil {
		p, err := cfg.TLS.prepared()
		if err != nil {
			return nil, err
		}
		cfg.TLS = p
	}
	lc := net.ListenConfig{KeepAlive: cfg.KeepAlive}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: listen on %s: %w", addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &Transport{
		id:    id,
		nonce: nonce.New(),
		cfg:   cfg,
		log:   cfg.Logger.With("node", id),
		ln:    ln,
		// Keys start at a random number, so that no key of this
		// incarnation names memory of the next one (see doc.go, A
		// restarted peer).
		table:    target.NewFrom(id, cmp.Or(cfg.FirstKey, nonce.New()>>1)),
		ctx:      ctx,
		cancel:   cancel,
		peers:    make(map[ids.NodeID]*peer),
		inbound:  make(map[net.Conn]*conn),
		outs:     make(map[ids.NodeID]*outSession),
		sessions: make(map[sessionKey]*inSession),
		fenced:   make(map[ids.NodeID][]uint64),
	}
	t.wg.Add(1)
	go t.acceptLoop()
	return t, nil
}

// LocalID implements rdma.Transport.
func (t *Transport) LocalID() ids.NodeID { return t.id }

// Nonce is this transport's incarnation nonce: random, never zero, drawn
// once by Listen. Peers see it in every hello; the daemon publishes it to
// the directory, which counts a new nonce under the same node id as a new
// incarnation of that node.
func (t *Transport) Nonce() uint64 { return t.nonce }

// Addr implements rdma.Transport: the address the listener is bound to.
func (t *Transport) Addr() string { return t.ln.Addr().String() }

func (t *Transport) isClosed() bool { return t.closed.Load() }

// AddPeer implements rdma.Transport. Changing a peer's address closes its
// current connection; the next operation connects to the new address.
// Adding the local node itself is accepted and changes nothing: operations
// on the local node never use the network.
func (t *Transport) AddPeer(id ids.NodeID, addr string) error {
	if id == ids.None {
		return errors.New("tcp: add peer: node id 0 is reserved")
	}
	if id == t.id {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("tcp: add peer %v: address %q: %w", id, addr, err)
	}
	t.mu.Lock()
	if t.isClosed() {
		t.mu.Unlock()
		return rdma.ErrClosed
	}
	p := t.peers[id]
	if p == nil {
		out := t.outs[id]
		if out == nil {
			out = newOutSession()
			t.outs[id] = out
		}
		t.peers[id] = &peer{id: id, addr: addr, out: out}
		t.mu.Unlock()
		return nil
	}
	var old *conn
	if p.addr != addr {
		p.addr = addr
		old, p.conn = p.conn, nil
		p.dial = nil // an attempt to the old address completes unused
	}
	t.mu.Unlock()
	if old != nil {
		old.shutdown(errors.New("peer address changed"))
	}
	return nil
}

// RemovePeer implements rdma.Transport. The peer's connections in both
// directions are closed, and the record of its recent batches is dropped:
// a batch of it still in flight then fails with rdma.ErrOutcomeUnknown.
func (t *Transport) RemovePeer(id ids.NodeID) {
	t.mu.Lock()
	p := t.peers[id]
	delete(t.peers, id)
	var down []*conn
	if p != nil && p.conn != nil {
		down = append(down, p.conn)
	}
	for _, s := range t.sessions {
		if s.node == id {
			t.evictSession(s)
		}
	}
	for _, c := range t.inbound {
		if c != nil && c.peer == id {
			down = append(down, c)
		}
	}
	t.mu.Unlock()
	for _, c := range down {
		c.shutdown(errors.New("peer removed"))
	}
}

// Fence refuses, from now on, every batch of requester incarnation nonce
// of node id: its session is dropped (nothing executes in it after Fence
// returns; a batch executing now finishes first) with every connection
// that carries it, and its later handshakes are refused (hello status
// "fenced"). The node layer fences every incarnation the directory says
// departed, so that a process removed while it was cut off executes no
// verb here after it comes back. Other incarnations of id are untouched.
func (t *Transport) Fence(id ids.NodeID, nonce uint64) {
	if nonce == 0 {
		return
	}
	t.mu.Lock()
	if !slices.Contains(t.fenced[id], nonce) {
		f := append(t.fenced[id], nonce)
		if len(f) > maxFencedPerNode {
			f = f[len(f)-maxFencedPerNode:]
		}
		t.fenced[id] = f
	}
	var down []*conn
	if s := t.sessions[sessionKey{id, nonce}]; s != nil {
		down = t.evictSession(s)
	}
	t.mu.Unlock()
	for _, c := range down {
		c.shutdown(errFenced)
	}
}

// errFenced closes the connections of a fenced requester incarnation.
var errFenced = errors.New("the requester's incarnation is fenced: it departed the cluster")

// Register implements rdma.Transport.
func (t *Transport) Register(mem []byte, access rdma.Access) (rdma.Registration, error) {
	if t.isClosed() {
		return nil, rdma.ErrClosed
	}
	return t.table.Register(mem, access)
}

// SetHandler implements rdma.Transport.
func (t *Transport) SetHandler(h rdma.Handler) { t.handler.Store(&h) }

func (t *Transport) deliver(from ids.NodeID, msg []byte) {
	if h := t.handler.Load(); h != nil && *h != nil {
		(*h)(from, msg)
	}
}

// Post implements rdma.Transport.
//
// Each batch gets a sequence number in this incarnation's session with the
// peer. When the connection that carried it breaks before the response
// came back, Post connects again (within Config.RetryWindow and ctx) and,
// if the same incarnation of the peer still holds this session, sends the
// batch again under the same number: the peer answers from its record if
// it executed the batch, and executes it if it never saw it. Otherwise
// Post fails with an error that wraps rdma.ErrOutcomeUnknown. See the
// package documentation for what each error means.
func (t *Transport) Post(ctx context.Context, peer ids.NodeID, ops []rdma.Op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if t.isClosed() {
		return rdma.ErrClosed
	}
	if err := rdma.CheckBatch(ops); err != nil {
		rdma.FailAll(ops, err)
		return err
	}
	if peer == t.id {
		return t.table.ExecuteBatch(ops)
	}
	reqLen, _, err := requestSize(ops)
	if err != nil {
		rdma.FailAll(ops, err)
		return err
	}
	a := attempt{t: t, peer: peer, ops: ops, reqLen: reqLen}
	err = a.run(ctx)
	if a.seq != 0 {
		a.out.release(a.seq)
	}
	return err
}

// attempt is one Post through its connections.
type attempt struct {
	t      *Transport
	peer   ids.NodeID
	ops    []rdma.Op
	reqLen int

	out *outSession
	seq uint64 // 0 until acquired
	// The peer incarnation and session that the request may have reached,
	// zero while it certainly reached none.
	sentNonce, sentSess uint64
	brokeAt             time.Time // when its first connection broke
	fresh               int       // connections found down before sending
	backoff             time.Duration
}

func (a *attempt) sent() bool { return a.sentNonce != 0 }

// run posts the batch until it completes or cannot be finished; the
// returned error is final, and the ops report it unless the peer did.
func (a *attempt) run(ctx context.Context) error {
	for {
		c, err := a.t.conn(ctx, a.peer)
		if err != nil {
			if !a.sent() {
				return a.fail(err) // nothing was sent
			}
			if ctx.Err() != nil {
				return a.fail(ctxUnknown(ctx.Err()))
			}
			if !retryable(err) {
				return a.fail(outcomeUnknown(a.peer, err))
			}
			if err := a.wait(ctx, err); err != nil {
				return a.fail(err)
			}
			continue
		}
		if a.seq == 0 {
			a.out = c.out
			if a.seq, err = a.out.acquire(ctx); err != nil {
				return a.fail(err) // waiting for room; nothing was sent
			}
		}
		if a.sent() && (c.peerNonce != a.sentNonce || c.peerSess != a.sentSess) {
			why := "the peer restarted: a new incarnation answered"
			if c.peerNonce == a.sentNonce {
				why = "the peer no longer holds this node's session"
			}
			return a.fail(outcomeUnknown(a.peer, errors.New(why)))
		}
		err = c.post(ctx, a.ops, a.reqLen, a.seq)
		switch {
		case err == errConnDown:
			// Found down before the request was queued on it.
			if !a.sent() {
				a.fresh++
				if a.fresh > 1 {
					return a.fail(c.failure())
				}
				continue
			}
			if err := a.wait(ctx, c.failure()); err != nil {
				return a.fail(err)
			}
		case err == errBroken:
			a.sentNonce, a.sentSess = c.peerNonce, c.peerSess
			if a.brokeAt.IsZero() {
				a.brokeAt = time.Now()
			}
			if a.t.isClosed() || a.t.cfg.RetryWindow < 0 {
				return a.fail(outcomeUnknown(a.peer, c.failure()))
			}
		case err != nil && ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
			// The request was queued: it may have executed.
			return a.fail(ctxUnknown(err))
		default:
			return err // the peer's answer, or a final failure already in ops
		}
	}
}

// fail reports err in every op.
func (a *attempt) fail(err error) error {
	rdma.FailAll(a.ops, err)
	return err
}

// wait sleeps before the next try to reach the peer after cause, or fails
// when the retry window or ctx ends first.
func (a *attempt) wait(ctx context.Context, cause error) error {
	if a.brokeAt.IsZero() {
		a.brokeAt = time.Now()
	}
	left := a.t.cfg.RetryWindow - time.Since(a.brokeAt)
	if left <= 0 {
		return outcomeUnknown(a.peer, cause)
	}
	switch {
	case a.backoff == 0:
		a.backoff = 5 * time.Millisecond
	case a.backoff < 200*time.Millisecond:
		a.backoff *= 2
	}
	tm := time.NewTimer(min(a.backoff, left))
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctxUnknown(ctx.Err())
	case <-a.t.ctx.Done():
		return outcomeUnknown(a.peer, rdma.ErrClosed)
	}
}

// retryable reports whether a failure to reach a peer may pass: not when
// the transport closed, the peer was removed, nobody listens at its
// address any more (its incarnation ended), or it refused the handshake.
func retryable(err error) bool {
	switch {
	case errors.Is(err, rdma.ErrClosed), errors.Is(err, rdma.ErrUnknownPeer), errors.Is(err, rdma.ErrIncarnation),
		errors.Is(err, syscall.ECONNREFUSED), errors.As(err, new(*refusal)):
		return false
	}
	return true
}

// ctxUnknown is the error of a Post whose context ended after its request
// was queued: it matches both the context's error and
// rdma.ErrOutcomeUnknown.
func ctxUnknown(err error) error {
	return fmt.Errorf("%w (%w)", err, rdma.ErrOutcomeUnknown)
}

// errBroken is reported by conn.post when the connection broke after the
// request was queued and before its response was complete: the batch may
// have executed, and the ops hold nothing of value.
var errBroken = errors.New("tcp: connection broke with the request in flight")

// post runs one batch with sequence number seq on an outbound connection.
// It returns errConnDown, with ops untouched, when the connection was down
// before the request could be queued, and errBroken when it broke before
// the response was complete.
func (c *conn) post(ctx context.Context, ops []rdma.Op, reqLen int, seq uint64) error {
	cl := callPool.Get().(*call)
	cl.conn = c
	cl.ops = ops
	cl.err = nil
	cl.cancelled = false
	cl.cancel.Store(false)
	cl.state.Store(callPending)
	cl.id = seq
	own, err := c.register(cl)
	if err != nil {
		cl.ops = nil
		callPool.Put(cl)
		return err
	}
	fb := getBuf(hdrLen + reqLen)
	encodeRequest(fb.b, seq, c.out.floor.Load(), ops, reqLen)
	if err := c.enqueue(fb, own); err != nil {
		if own {
			c.releaseRead()
		}
		// Not sent. If shutdown has not failed the call yet, take it back;
		// the call may still be referenced by shutdown, so it is not reused.
		if cl.state.CompareAndSwap(callPending, callAbandoned) {
			c.forget(seq)
		} else {
			<-cl.done
		}
		return errConnDown
	}
	reuse := true
	if own {
		// Read the response here; a context that ends interrupts the read.
		var stop func() bool
		if ctx.Done() != nil {
			stop = context.AfterFunc(ctx, cl.onCancel)
		}
		c.readOwn(cl)
		if stop != nil && !stop() {
			reuse = false // cancelFn may still be running
		}
	}
	select {
	case <-cl.done:
		if cl.cancelled {
			err := ctx.Err()
			rdma.FailAll(ops, err)
			if reuse {
				cl.ops = nil
				callPool.Put(cl)
			}
			return err
		}
	case <-ctx.Done():
		if cl.state.CompareAndSwap(callPending, callAbandoned) {
			// The response, if it comes, is discarded by the reader. The
			// reader may hold a reference from its lookup, so the call is
			// left to the garbage collector.
			c.forget(seq)
			err := ctx.Err()
			rdma.FailAll(ops, err)
			return err
		}
		// A reader is filling ops: stop it and wait until it has let go.
		cl.cancel.Store(true)
		c.interrupt()
		<-cl.done
		if cl.cancelled {
			err := ctx.Err()
			rdma.FailAll(ops, err)
			if reuse {
				cl.ops = nil
				callPool.Put(cl)
			}
			return err
		}
	}
	err = cl.err
	cl.ops = nil
	cl.err = nil
	if reuse {
		callPool.Put(cl)
	}
	return err
}

// Send implements rdma.Transport. It returns once the message is queued on
// the peer's connection (msg is copied; the caller keeps it). Messages to
// one peer travel on one connection, behind the operations posted before
// them, so they arrive in order; a message queued on a connection that
// then fails is lost. A message to the local node is handed to the local
// handler before Send returns.
func (t *Transport) Send(ctx context.Context, peer ids.NodeID, msg []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if t.isClosed() {
		return rdma.ErrClosed
	}
	if len(msg) > rdma.MaxMessage {
		return fmt.Errorf("%w: %d-byte message (max %d)", rdma.ErrTooLarge, len(msg), rdma.MaxMessage)
	}
	if peer == t.id {
		t.deliver(t.id, append([]byte(nil), msg...))
		return nil
	}
	for attempt := 0; ; attempt++ {
		c, err := t.conn(ctx, peer)
		if err != nil {
			return err
		}
		fb := getBuf(hdrLen + len(msg))
		h := header{bodyLen: uint32(len(msg)), typ: frameMessage}
		h.encode(fb.b)
		copy(fb.b[hdrLen:], msg)
		err = c.enqueue(fb, false)
		if err == errConnDown && attempt == 0 {
			continue
		}
		if err == errConnDown {
			return c.failure()
		}
		return err
	}
}

// conn returns the live outbound connection to id, connecting first when
// there is none. Callers that need the same peer meanwhile share one
// attempt.
func (t *Transport) conn(ctx context.Context, id ids.NodeID) (*conn, error) {
	t.mu.Lock()
	if t.isClosed() {
		t.mu.Unlock()
		return nil, rdma.ErrClosed
	}
	p := t.peers[id]
	if p == nil {
		t.mu.Unlock()
		return nil, &rdma.PeerError{Peer: id, Err: rdma.ErrUnknownPeer}
	}
	if c := p.conn; c != nil && !c.isDown() {
		want := p.nonce
		t.mu.Unlock()
		if !c.closedByPeer() {
			return admit(id, c, want)
		}
		c.shutdown(errors.New("closed by the peer while idle"))
		t.mu.Lock()
		if p.conn == c {
			p.conn = nil
		}
		t.mu.Unlock()
		return t.conn(ctx, id)
	}
	p.conn = nil
	d := p.dial
	if d == nil {
		d = &dialAttempt{done: make(chan struct{})}
		p.dial = d
		t.wg.Add(1)
		go t.dial(p, d, p.addr)
	}
	t.mu.Unlock()
	select {
	case <-d.done:
		if d.err != nil {
			return nil, d.err
		}
		t.mu.Lock()
		want := p.nonce
		t.mu.Unlock()
		return admit(id, d.conn, want)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// admit returns c if the peer's process behind it is incarnation want
// (any when want is 0). The connection stays up either way: it is the
// right one once the directory names that incarnation.
func admit(id ids.NodeID, c *conn, want uint64) (*conn, error) {
	if want != 0 && c.peerNonce != want {
		return nil, &rdma.PeerError{Peer: id, Err: fmt.Errorf("%w: incarnation %#x answers, %#x expected", rdma.ErrIncarnation, c.peerNonce, want)}
	}
	return c, nil
}

// ExpectNonce names the incarnation of peer id that this node may reach:
// operations and messages go only to a process whose handshake shows that
// nonce, and fail with rdma.ErrIncarnation (not sent) otherwise. 0 lifts
// the check. dsmd passes the nonce the directory records for the member,
// so that a restarted peer is reached only once the directory says so
// (with its new descriptors), never with the previous process's keys.
func (t *Transport) ExpectNonce(id ids.NodeID, nonce uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.peers[id]; p != nil {
		p.nonce = nonce
	}
}

// dial connects to p at addr for attempt d.
func (t *Transport) dial(p *peer, d *dialAttempt, addr string) {
	defer t.wg.Done()
	defer close(d.done)
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.DialTimeout)
	defer cancel()
	c, err := t.connect(ctx, p, addr)
	t.mu.Lock()
	if err == nil {
		switch {
		case t.isClosed():
			err = rdma.ErrClosed
		case t.peers[p.id] != p || p.dial != d:
			err = &rdma.PeerError{Peer: p.id, Err: fmt.Errorf("%w: peer removed or moved while connecting", rdma.ErrPeerUnreachable)}
		default:
			p.conn = c
			c.start()
		}
	}
	if p.dial == d {
		p.dial = nil
	}
	t.mu.Unlock()
	if err != nil {
		if c != nil {
			c.nc.Close()
		}
		if !errors.Is(err, rdma.ErrClosed) {
			t.log.Debug("tcp: connect failed", "peer", p.id, "addr", addr, "err", err)
		}
		d.err = err
		return
	}
	d.conn = c
}

// connect dials addr and performs the dialer's half of the handshake.
func (t *Transport) connect(ctx context.Context, p *peer, addr string) (*conn, error) {
	id := p.id
	unreachable := func(err error) error {
		if t.isClosed() {
			return rdma.ErrClosed
		}
		return &rdma.PeerError{Peer: id, Err: fmt.Errorf("%w: %w", rdma.ErrPeerUnreachable, err)}
	}
	dl := net.Dialer{KeepAlive: t.cfg.KeepAlive}
	nc, err := dl.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, unreachable(err)
	}
	setUserTimeout(nc, t.cfg.UserTimeout)
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	// Close unblocks a handshake in progress.
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	sc, err := t.secureDial(nc, id)
	var r hello
	if err == nil {
		r, err = t.handshakeDial(sc, id)
	}
	if !stop() {
		err = errors.Join(err, ctx.Err())
	}
	if err != nil {
		nc.Close()
		return nil, unreachable(err)
	}
	nc.SetDeadline(time.Time{})
	if t.cfg.TLS != nil && t.cfg.TLS.Plaintext {
		sc = nc // authenticated; the frames go in plaintext
	}
	c := newConn(t, sc, nc, id, true)
	c.out = p.out
	c.peerNonce, c.peerSess = r.nonce, r.session
	return c, nil
}

// secureDial runs the TLS handshake on nc, when the transport has TLS, and
// checks that the listener's certificate names node id. It returns the
// connection to run the hello on.
func (t *Transport) secureDial(nc net.Conn, id ids.NodeID) (net.Conn, error) {
	if t.cfg.TLS == nil {
		return nc, nil
	}
	tc := tls.Client(nc, t.cfg.TLS.Client)
	if err := tc.Handshake(); err != nil {
		err = fmt.Errorf("%w: TLS with %s: %w", ErrHandshake, nc.RemoteAddr(), err)
		if transient(err) {
			return nil, err
		}
		return nil, &refusal{err}
	}
	got, err := t.cfg.TLS.PeerNode(tc.ConnectionState())
	if err != nil {
		return nil, &refusal{fmt.Errorf("%w: TLS with %s: %w", ErrHandshake, nc.RemoteAddr(), err)}
	}
	if got != id {
		return nil, &refusal{fmt.Errorf("%w: the certificate of %s names node %v, %v was dialed", ErrHandshake, nc.RemoteAddr(), got, id)}
	}
	return tc, nil
}

// transient reports whether a TLS handshake failed on the network (a
// reset, a timeout, the connection closed), not on a certificate: another
// try may succeed.
func transient(err error) bool {
	var ne net.Error
	var oe *net.OpError
	var ae tls.AlertError
	var ve *tls.CertificateVerificationError
	switch {
	case errors.As(err, &ae), errors.As(err, &ve):
		return false
	case errors.As(err, &oe) && oe.Op == "remote error":
		return false // the listener sent an alert: it refused us
	case errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return true
	}
	return false
}

// refusal is a handshake failure that another try would meet again: the
// listener refused, or it is not the node or protocol wanted.
type refusal struct{ error }

func (r *refusal) Unwrap() error { return r.error }

// handshakeDial performs the dialer's half of the handshake on nc and
// returns the listener's hello.
func (t *Transport) handshakeDial(nc net.Conn, id ids.NodeID) (hello, error) {
	var b [helloLen]byte
	h := hello{magic: magic, version: version, from: t.id, to: id, nonce: t.nonce}
	h.encode(b[:])
	if _, err := nc.Write(b[:]); err != nil {
		return hello{}, fmt.Errorf("%w: send hello: %w", ErrHandshake, err)
	}
	if _, err := io.ReadFull(nc, b[:helloPrefix]); err != nil {
		err = fmt.Errorf("%w: read hello: %w", ErrHandshake, err)
		if _, ok := nc.(*tls.Conn); ok && !transient(err) {
			// In TLS 1.3 the listener checks this node's certificate
			// after the dialer's handshake returned: its refusal (an
			// alert) arrives here.
			return hello{}, &refusal{err}
		}
		return hello{}, err
	}
	r := decodeHello(b[:helloPrefix])
	refused := func(format string, args ...any) (hello, error) {
		return hello{}, &refusal{fmt.Errorf("%w: "+format, append([]any{ErrHandshake}, args...)...)}
	}
	switch {
	case r.magic != magic:
		return refused("%s does not speak this protocol (magic %#x)", nc.RemoteAddr(), r.magic)
	case r.status != helloOK:
		return refused("refused by %s: %s", nc.RemoteAddr(), helloRefusal(r.status))
	case r.version != version:
		return refused("%s speaks version %d, want %d", nc.RemoteAddr(), r.version, version)
	}
	if _, err := io.ReadFull(nc, b[helloPrefix:]); err != nil {
		return hello{}, fmt.Errorf("%w: read hello: %w", ErrHandshake, err)
	}
	r = decodeHello(b[:])
	switch {
	case r.from != id:
		return refused("%s is node %v, want %v", nc.RemoteAddr(), r.from, id)
	case r.to != t.id:
		return refused("%s answered node %v, want %v", nc.RemoteAddr(), r.to, t.id)
	case r.nonce == 0 || r.session == 0:
		return refused("%s sent a hello without incarnation or session", nc.RemoteAddr())
	}
	return r, nil
}

func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	for {
		nc, err := t.ln.Accept()
		if err != nil {
			if t.isClosed() {
				return
			}
			t.log.Warn("tcp: accept", "err", err)
			select {
			case <-time.After(10 * time.Millisecond):
			case <-t.ctx.Done():
				return
			}
			continue
		}
		t.mu.Lock()
		if t.isClosed() {
			t.mu.Unlock()
			nc.Close()
			return
		}
		t.inbound[nc] = nil
		t.wg.Add(1)
		t.mu.Unlock()
		setUserTimeout(nc, t.cfg.UserTimeout)
		go t.accept(nc)
	}
}

// accept performs the acceptor's half of the handshake on nc and starts
// serving it.
func (t *Transport) accept(nc net.Conn) {
	defer t.wg.Done()
	sc, auth, err := t.secureAccept(nc)
	var from ids.NodeID
	var sess *inSession
	if err == nil {
		from, sess, err = t.handshakeAccept(sc, auth)
	}
	t.mu.Lock()
	switch {
	case err != nil:
	case t.isClosed():
		err = rdma.ErrClosed
	case sess.evicted:
		// Evicted since the hello: the dialer comes back to a new session.
		err = errSessionGone
	}
	if err != nil {
		delete(t.inbound, nc)
		t.mu.Unlock()
		nc.Close()
		if !errors.Is(err, rdma.ErrClosed) {
			t.log.Info("tcp: refused connection", "remote", nc.RemoteAddr(), "err", err)
		}
		return
	}
	if t.cfg.TLS != nil && t.cfg.TLS.Plaintext {
		sc = nc // authenticated; the frames go in plaintext
	}
	c := newConn(t, sc, nc, from, false)
	c.sess = sess
	// The session's older connections close before this one serves: from
	// here on nothing that arrives on them executes (see inSession.serve).
	for _, o := range t.bindSession(c) {
		o.shutdown(errors.New("superseded by a new connection of the same session"))
	}
	t.inbound[nc] = c
	c.start()
	t.mu.Unlock()
}

// forgetInbound drops a served connection that is down.
func (t *Transport) forgetInbound(c *conn) {
	t.mu.Lock()
	if t.inbound[c.sock] == c {
		delete(t.inbound, c.sock)
		t.unbindSession(c)
	}
	t.mu.Unlock()
}

// secureAccept runs the TLS handshake on an accepted nc, when the
// transport has TLS, and returns the connection to run the hello on and
// the node its certificate names (ids.None without TLS). The handshake
// timeout bounds it.
func (t *Transport) secureAccept(nc net.Conn) (net.Conn, ids.NodeID, error) {
	if t.cfg.TLS == nil {
		return nc, ids.None, nil
	}
	nc.SetDeadline(time.Now().Add(t.cfg.HandshakeTimeout))
	tc := tls.Server(nc, t.cfg.TLS.Server)
	if err := tc.Handshake(); err != nil {
		return nil, ids.None, fmt.Errorf("%w: TLS: %w", ErrHandshake, err)
	}
	n, err := t.cfg.TLS.PeerNode(tc.ConnectionState())
	if err != nil {
		return nil, ids.None, fmt.Errorf("%w: TLS: %w", ErrHandshake, err)
	}
	return tc, n, nil
}

// handshakeAccept performs the acceptor's half of the handshake on nc: it
// returns the dialer's node and the session its requests execute in. auth
// is the node the dialer's certificate names (ids.None without TLS): a
// hello that claims another node is refused.
func (t *Transport) handshakeAccept(nc net.Conn, auth ids.NodeID) (ids.NodeID, *inSession, error) {
	nc.SetDeadline(time.Now().Add(t.cfg.HandshakeTimeout))
	var b [helloLen]byte
	if _, err := io.ReadFull(nc, b[:helloPrefix]); err != nil {
		return 0, nil, fmt.Errorf("%w: read hello: %w", ErrHandshake, err)
	}
	h := decodeHello(b[:helloPrefix])
	if h.magic != magic {
		// Not one of ours: no answer.
		return 0, nil, fmt.Errorf("%w: bad magic %#x", ErrHandshake, h.magic)
	}
	status := uint16(helloOK)
	var err error
	if h.version == version {
		// The rest of a hello of this version.
		if _, err := io.ReadFull(nc, b[helloPrefix:]); err != nil {
			return 0, nil, fmt.Errorf("%w: read hello: %w", ErrHandshake, err)
		}
		h = decodeHello(b[:])
	}
	switch {
	case h.version != version:
		status = helloBadVersion
		err = fmt.Errorf("%w: version %d from %v, want %d", ErrHandshake, h.version, h.from, version)
	case h.from == ids.None:
		status = helloBadNode
		err = fmt.Errorf("%w: dialer claims node id 0", ErrHandshake)
	case t.cfg.TLS != nil && h.from != auth:
		status = helloNotAuthenticated
		err = fmt.Errorf("%w: the dialer claims node %v, its certificate names %v", ErrHandshake, h.from, auth)
	case h.to != t.id:
		status = helloWrongNode
		err = fmt.Errorf("%w: %v dialed node %v, this is %v", ErrHandshake, h.from, h.to, t.id)
	case h.status != helloOK:
		status = helloBadNode
		err = fmt.Errorf("%w: dialer hello with status %d", ErrHandshake, h.status)
	case h.nonce == 0 || h.session != 0:
		status = helloBadHello
		err = fmt.Errorf("%w: dialer hello with incarnation %#x and session %#x", ErrHandshake, h.nonce, h.session)
	}
	var sess *inSession
	var evicted []*conn
	if err == nil {
		t.mu.Lock()
		switch {
		case t.isClosed():
			status = helloShuttingDown
			err = rdma.ErrClosed
		case slices.Contains(t.fenced[h.from], h.nonce):
			status = helloFenced
			err = fmt.Errorf("%w: %v incarnation %#x is fenced: it departed the cluster", ErrHandshake, h.from, h.nonce)
		default:
			sess, evicted = t.openSession(h.from, h.nonce)
		}
		t.mu.Unlock()
	}
	for _, c := range evicted {
		c.shutdown(errSessionGone)
	}
	r := hello{magic: magic, version: version, status: status, from: t.id, to: h.from, nonce: t.nonce}
	n := helloPrefix // a refusal is understood by every version
	if sess != nil {
		r.session = sess.id
		n = helloLen
	}
	r.encode(b[:])
	if _, werr := nc.Write(b[:n]); werr != nil && err == nil {
		err = fmt.Errorf("%w: send hello: %w", ErrHandshake, werr)
	}
	if err != nil {
		// Let the refusal arrive: closing with unread bytes (a longer hello
		// of another version) would reset the connection, and a reset can
		// discard the refusal before the dialer reads it. The dialer closes
		// once it has read it; the handshake deadline bounds the wait.
		if tc, ok := nc.(interface{ CloseWrite() error }); ok && status != helloOK {
			tc.CloseWrite()
			io.Copy(io.Discard, io.LimitReader(nc, 1<<12))
		}
		return 0, nil, err
	}
	nc.SetDeadline(time.Time{})
	return h.from, sess, nil
}

// Close implements rdma.Transport. It stops every goroutine of the
// transport before it returns; pending operations fail with
// rdma.ErrClosed. Calling it again does nothing.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed.Swap(true) {
		t.mu.Unlock()
		return nil
	}
	t.cancel()
	var conns []*conn
	var raw []net.Conn
	for _, p := range t.peers {
		if p.conn != nil {
			conns = append(conns, p.conn)
		}
	}
	for nc, c := range t.inbound {
		if c != nil {
			conns = append(conns, c)
		} else {
			raw = append(raw, nc)
		}
	}
	t.mu.Unlock()
	err := t.ln.Close()
	for _, c := range conns {
		c.shutdown(rdma.ErrClosed)
	}
	for _, nc := range raw {
		nc.Close()
	}
	t.wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("tcp: close listener: %w", err)
	}
	return nil
}
