package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/internal/target"
)

// Config tunes a Transport. The zero value is usable.
type Config struct {
	// Logger receives connection events (refused handshakes, broken
	// connections, protocol violations). Nil discards them.
	Logger *slog.Logger
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
}

// Transport is one node's endpoint of the tcp backend. It implements
// rdma.Transport; see the package documentation for the protocol.
type Transport struct {
	id    ids.NodeID
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
	wg      sync.WaitGroup       // every goroutine of the transport
}

var _ rdma.Transport = (*Transport)(nil)

// peer is what the transport knows of one peer: its address and the
// outbound connection that carries this node's requests to it.
type peer struct {
	id   ids.NodeID
	addr string
	conn *conn        // nil until the first use, or after a failure
	dial *dialAttempt // the connection attempt in progress, if any
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
	lc := net.ListenConfig{KeepAlive: cfg.KeepAlive}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: listen on %s: %w", addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &Transport{
		id:      id,
		cfg:     cfg,
		log:     cfg.Logger.With("node", id),
		ln:      ln,
		table:   target.New(id),
		ctx:     ctx,
		cancel:  cancel,
		peers:   make(map[ids.NodeID]*peer),
		inbound: make(map[net.Conn]*conn),
	}
	t.wg.Add(1)
	go t.acceptLoop()
	return t, nil
}

// LocalID implements rdma.Transport.
func (t *Transport) LocalID() ids.NodeID { return t.id }

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
		t.peers[id] = &peer{id: id, addr: addr}
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
// directions are closed.
func (t *Transport) RemovePeer(id ids.NodeID) {
	t.mu.Lock()
	p := t.peers[id]
	delete(t.peers, id)
	var down []*conn
	if p != nil && p.conn != nil {
		down = append(down, p.conn)
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
	// A connection can turn out to be down before anything was sent on
	// it; then one fresh connection is tried.
	for attempt := 0; ; attempt++ {
		c, err := t.conn(ctx, peer)
		if err != nil {
			rdma.FailAll(ops, err)
			return err
		}
		err = c.post(ctx, ops, reqLen)
		if err == errConnDown && attempt == 0 {
			continue
		}
		if err == errConnDown {
			err = c.failure()
			rdma.FailAll(ops, err)
		}
		return err
	}
}

// post runs one batch on an outbound connection. It returns errConnDown,
// with ops untouched, when the connection was down before the request
// could be queued.
func (c *conn) post(ctx context.Context, ops []rdma.Op, reqLen int) error {
	cl := callPool.Get().(*call)
	cl.conn = c
	cl.ops = ops
	cl.err = nil
	cl.cancelled = false
	cl.cancel.Store(false)
	cl.state.Store(callPending)
	id, own, err := c.register(cl)
	if err != nil {
		cl.ops = nil
		callPool.Put(cl)
		return err
	}
	cl.id = id
	fb := getBuf(hdrLen + reqLen)
	encodeRequest(fb.b, id, ops, reqLen)
	if err := c.enqueue(fb, own); err != nil {
		if own {
			c.releaseRead()
		}
		// Not sent. If shutdown has not failed the call yet, take it back;
		// the call may still be referenced by shutdown, so it is not reused.
		if cl.state.CompareAndSwap(callPending, callAbandoned) {
			c.forget(id)
			return errConnDown
		}
		<-cl.done
		return cl.err
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
			c.forget(id)
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
		t.mu.Unlock()
		if !c.closedByPeer() {
			return c, nil
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
		return d.conn, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// dial connects to p at addr for attempt d.
func (t *Transport) dial(p *peer, d *dialAttempt, addr string) {
	defer t.wg.Done()
	defer close(d.done)
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.DialTimeout)
	defer cancel()
	c, err := t.connect(ctx, p.id, addr)
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
func (t *Transport) connect(ctx context.Context, id ids.NodeID, addr string) (*conn, error) {
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
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	// Close unblocks a handshake in progress.
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	err = t.handshakeDial(nc, id)
	if !stop() {
		err = errors.Join(err, ctx.Err())
	}
	if err != nil {
		nc.Close()
		return nil, unreachable(err)
	}
	nc.SetDeadline(time.Time{})
	return newConn(t, nc, id, true), nil
}

func (t *Transport) handshakeDial(nc net.Conn, id ids.NodeID) error {
	var b [helloLen]byte
	h := hello{magic: magic, version: version, from: t.id, to: id}
	h.encode(b[:])
	if _, err := nc.Write(b[:]); err != nil {
		return fmt.Errorf("%w: send hello: %w", ErrHandshake, err)
	}
	if _, err := io.ReadFull(nc, b[:]); err != nil {
		return fmt.Errorf("%w: read hello: %w", ErrHandshake, err)
	}
	r := decodeHello(b[:])
	switch {
	case r.magic != magic:
		return fmt.Errorf("%w: %s does not speak this protocol (magic %#x)", ErrHandshake, nc.RemoteAddr(), r.magic)
	case r.status != helloOK:
		return fmt.Errorf("%w: refused by %s: %s", ErrHandshake, nc.RemoteAddr(), helloRefusal(r.status))
	case r.version != version:
		return fmt.Errorf("%w: %s speaks version %d, want %d", ErrHandshake, nc.RemoteAddr(), r.version, version)
	case r.from != id:
		return fmt.Errorf("%w: %s is node %v, want %v", ErrHandshake, nc.RemoteAddr(), r.from, id)
	case r.to != t.id:
		return fmt.Errorf("%w: %s answered node %v, want %v", ErrHandshake, nc.RemoteAddr(), r.to, t.id)
	}
	return nil
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
		go t.accept(nc)
	}
}

// accept performs the acceptor's half of the handshake on nc and starts
// serving it.
func (t *Transport) accept(nc net.Conn) {
	defer t.wg.Done()
	from, err := t.handshakeAccept(nc)
	t.mu.Lock()
	if err == nil && t.isClosed() {
		err = rdma.ErrClosed
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
	c := newConn(t, nc, from, false)
	t.inbound[nc] = c
	c.start()
	t.mu.Unlock()
}

// forgetInbound drops a served connection that is down.
func (t *Transport) forgetInbound(nc net.Conn) {
	t.mu.Lock()
	delete(t.inbound, nc)
	t.mu.Unlock()
}

func (t *Transport) handshakeAccept(nc net.Conn) (ids.NodeID, error) {
	nc.SetDeadline(time.Now().Add(t.cfg.HandshakeTimeout))
	var b [helloLen]byte
	if _, err := io.ReadFull(nc, b[:]); err != nil {
		return 0, fmt.Errorf("%w: read hello: %w", ErrHandshake, err)
	}
	h := decodeHello(b[:])
	if h.magic != magic {
		// Not one of ours: no answer.
		return 0, fmt.Errorf("%w: bad magic %#x", ErrHandshake, h.magic)
	}
	status := uint16(helloOK)
	var err error
	switch {
	case h.version != version:
		status = helloBadVersion
		err = fmt.Errorf("%w: version %d from %v, want %d", ErrHandshake, h.version, h.from, version)
	case h.from == ids.None:
		status = helloBadNode
		err = fmt.Errorf("%w: dialer claims node id 0", ErrHandshake)
	case h.to != t.id:
		status = helloWrongNode
		err = fmt.Errorf("%w: %v dialed node %v, this is %v", ErrHandshake, h.from, h.to, t.id)
	case h.status != helloOK:
		status = helloBadNode
		err = fmt.Errorf("%w: dialer hello with status %d", ErrHandshake, h.status)
	}
	r := hello{magic: magic, version: version, status: status, from: t.id, to: h.from}
	r.encode(b[:])
	if _, werr := nc.Write(b[:]); werr != nil && err == nil {
		err = fmt.Errorf("%w: send hello: %w", ErrHandshake, werr)
	}
	if err != nil {
		return 0, err
	}
	nc.SetDeadline(time.Time{})
	return h.from, nil
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
