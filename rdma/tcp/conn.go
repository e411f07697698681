package tcp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

const bufSize = 64 << 10

// errConnDown is returned by conn methods once the connection has failed;
// nothing of the refused frame was sent.
var errConnDown = errors.New("tcp: connection down")

// call states.
const (
	callPending   = iota // registered, no response yet
	callClaimed          // the reader is filling the caller's ops
	callDone             // completed; done has been signalled
	callAbandoned        // the caller gave up first; nobody touches ops
)

// call is one Post in flight on an outbound connection.
//
// The reader and the caller race for the call through state: the reader
// moves it from pending to claimed before it touches ops, the caller from
// pending to abandoned when its context ends. Whoever wins owns ops. A
// caller that loses to a claim asks the reader to stop (cancel, then an
// interrupting read deadline) and waits for done, so Post never returns
// while the reader may still write into the caller's buffers.
type call struct {
	state     atomic.Uint32
	cancel    atomic.Bool
	id        uint64 // the batch's sequence number in its session
	conn      *conn
	onCancel  func() // cancelFn, bound once: marks cancel and interrupts the reader
	ops       []rdma.Op
	err       error         // the batch's result, set before done; errBroken when the connection broke first
	cancelled bool          // the reader stopped at the caller's request
	done      chan struct{} // capacity 1; one signal per use
}

var callPool = sync.Pool{New: func() any {
	cl := &call{done: make(chan struct{}, 1)}
	cl.onCancel = cl.cancelFn
	return cl
}}

// cancelFn runs when the context of a caller that reads for itself ends:
// it makes the caller's blocked read return.
func (cl *call) cancelFn() {
	cl.cancel.Store(true)
	cl.conn.interrupt()
}

// conn is one TCP connection. An outbound conn carries this node's requests
// and messages to peer and their responses back; an inbound conn carries
// the peer's requests and messages to this node, served by the responder.
//
// Each conn has exactly two goroutines: a writer that drains wq, coalescing
// every queued frame into as few writes as possible, and a reader that
// decodes frames in arrival order.
type conn struct {
	t        *Transport
	nc       net.Conn // the connection: sock, or TLS over it
	sock     net.Conn // the TCP socket
	peer     ids.NodeID
	outbound bool
	br       *bufio.Reader
	bw       *bufio.Writer

	// Outbound: this node's session with the peer, and the peer's
	// incarnation and the id of the table it keeps for that session, from
	// its hello.
	out                 *outSession
	peerNonce, peerSess uint64
	// Inbound: the requester's session that the requests execute in.
	sess *inSession

	wmu     sync.Mutex
	wq      []*buffer // frames waiting for the writer; under wmu
	wspare  []*buffer // the writer's emptied queue, reused; under wmu
	wdown   bool      // no more frames accepted; under wmu
	writing bool      // someone owns the socket's write side; under wmu
	wake    chan struct{}

	// The non-blocking write of enqueue, used by whoever set writing.
	raw    syscall.RawConn // nil when the conn offers none
	rawFn  func(fd uintptr) bool
	rawBuf []byte
	rawOff int
	rawErr error

	// The idle check of closedByPeer; the probe fields belong to the
	// caller that set probing.
	lastUse   atomic.Int64 // monotonic ns since epoch of the last use
	probing   atomic.Bool
	probeFn   func(fd uintptr) bool
	probeBuf  [1]byte
	probeDead bool

	closing  chan struct{} // closed by shutdown
	downOnce sync.Once
	downErr  error // why it failed; set once in shutdown before closing

	pmu     sync.Mutex
	pending map[uint64]*call // outbound: calls awaiting a response, by sequence number; under pmu
	dead    bool             // under pmu

	// imu orders the read-deadline interrupts of cancelling callers with
	// the reader's clearing of the deadline.
	imu sync.Mutex

	// The read side: one holder at a time (reading), either the reader
	// goroutine or a caller reading its own response (see register).
	reading bool // under pmu
	rkick   chan struct{}
	rhdr    [hdrLen]byte // the frame header being read; holder only
	rhn     int          // bytes of rhdr read; holder only (others: under pmu while !reading)
	rskip   int          // body bytes still to skip; same rule as rhn

	// Reader state.
	deferred int // bytes of responses queued without waking the writer
	scratch  [maxErrText]byte
	wops     []wireOp
	execOp   rdma.Op
}

// newConn makes the connection over nc, which is sock itself or a TLS
// connection over it.
func newConn(t *Transport, nc, sock net.Conn, peer ids.NodeID, outbound bool) *conn {
	c := &conn{
		t:        t,
		nc:       nc,
		sock:     sock,
		peer:     peer,
		outbound: outbound,
		br:       bufio.NewReaderSize(nc, bufSize),
		bw:       bufio.NewWriterSize(nc, bufSize),
		wake:     make(chan struct{}, 1),
		rkick:    make(chan struct{}, 1),
		closing:  make(chan struct{}),
	}
	if outbound {
		c.pending = make(map[uint64]*call)
	}
	c.lastUse.Store(int64(time.Since(epoch)))
	if sc, ok := nc.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			c.raw = rc
			c.rawFn = c.doRawWrite
			c.probeFn = c.doProbe
		}
	}
	return c
}

// start runs the reader and the writer; t.wg counts them.
func (c *conn) start() {
	c.t.wg.Add(2)
	go c.writeLoop()
	if c.outbound {
		go c.readResponses()
	} else {
		go c.serve()
	}
}

func (c *conn) isDown() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

// shutdown closes the connection for reason (the first reason wins) and
// hands every call that no reader has claimed back to its Post with
// errBroken, to be sent again, or, when the peer broke the protocol, fails
// it. A claimed call is finished by the reader, whose next read fails.
func (c *conn) shutdown(reason error) {
	c.downOnce.Do(func() {
		c.downErr = reason
		c.wmu.Lock()
		c.wdown = true
		q := c.wq
		c.wq = nil
		c.wmu.Unlock()
		for _, fb := range q {
			putBuf(fb)
		}
		close(c.closing)
		// The socket, not the TLS connection: closing that could wait
		// for its close_notify to be sent to a peer that reads nothing.
		c.sock.Close()
		if !c.outbound {
			return
		}
		c.pmu.Lock()
		c.dead = true
		calls := c.pending
		c.pending = nil
		c.pmu.Unlock()
		// A peer that broke the protocol is not asked again: what it
		// answers cannot be trusted.
		var final error
		if errors.Is(reason, ErrProtocol) {
			final = outcomeUnknown(c.peer, reason)
		}
		for _, cl := range calls {
			if cl.state.CompareAndSwap(callPending, callClaimed) {
				cl.err = errBroken
				if final != nil {
					rdma.FailAll(cl.ops, final)
					cl.err = final
				}
				cl.state.Store(callDone)
				cl.done <- struct{}{}
			}
		}
	})
}

// failure is the error that calls on a failed connection report.
func (c *conn) failure() error {
	if c.t.isClosed() {
		return rdma.ErrClosed
	}
	return &rdma.PeerError{Peer: c.peer, Err: fmt.Errorf("%w: %w", rdma.ErrPeerUnreachable, c.downErr)}
}

// enqueue hands a frame to the connection, which returns fb to its pool.
//
// When inline is set (the caller expects no other frame to follow soon),
// nobody is writing and nothing is queued, the caller tries to write the
// frame itself, without blocking: a lone round trip then costs no hand-off
// to the writer goroutine. Under load frames are queued, and the writer
// coalesces them. Whatever the kernel does not take at
// once (a full send buffer) goes to the front of the queue, and the writer
// goroutine, which may block, sends it and everything queued behind it.
func (c *conn) enqueue(fb *buffer, inline bool) error {
	c.wmu.Lock()
	if c.wdown {
		c.wmu.Unlock()
		putBuf(fb)
		return errConnDown
	}
	if !inline || c.writing || len(c.wq) > 0 || c.raw == nil {
		c.wq = append(c.wq, fb)
		c.wmu.Unlock()
		c.kick()
		return nil
	}
	c.writing = true
	c.wmu.Unlock()

	c.rawBuf, c.rawOff, c.rawErr = fb.b, 0, nil
	if err := c.raw.Write(c.rawFn); err != nil && c.rawErr == nil {
		c.rawErr = err
	}
	n, err := c.rawOff, c.rawErr
	c.rawBuf = nil

	c.wmu.Lock()
	c.writing = false
	if n < len(fb.b) && err == nil && !c.wdown {
		// The rest goes first: nothing else was written meanwhile.
		fb.off = n
		c.wq = append(c.wq, nil)
		copy(c.wq[1:], c.wq)
		c.wq[0] = fb
		fb = nil
	}
	more := len(c.wq) > 0
	c.wmu.Unlock()
	if fb != nil {
		putBuf(fb)
	}
	if err != nil {
		c.shutdown(fmt.Errorf("write: %w", err))
		return nil // queued frames fail with the connection
	}
	if more {
		c.kick()
	}
	return nil
}

// idleProbeAfter is how long an outbound connection must have been unused
// before the next use first checks that the peer has not closed it.
var idleProbeAfter = time.Millisecond

// epoch is the origin of the connections' monotonic use stamps.
var epoch = time.Now()

// closedByPeer reports whether the peer has closed (or reset) this
// connection while nobody was reading it. An idle outbound connection has
// no reader, so a peer that restarted would otherwise cost the next
// operation a failure; a connection unused for idleProbeAfter is checked
// with one non-blocking peek before it is used again.
func (c *conn) closedByPeer() bool {
	now := int64(time.Since(epoch))
	last := c.lastUse.Load()
	if now-last < int64(idleProbeAfter) {
		c.lastUse.Store(now)
		return false
	}
	c.lastUse.Store(now)
	if c.raw == nil || !c.probing.CompareAndSwap(false, true) {
		return false // another caller is checking
	}
	defer c.probing.Store(false)
	c.pmu.Lock()
	quiet := !c.reading && len(c.pending) == 0
	c.pmu.Unlock()
	if !quiet {
		return false // a reader will see the end of the stream
	}
	c.probeDead = false
	if err := c.raw.Read(c.probeFn); err != nil {
		// Not probed: a pending interrupt's deadline, or the conn is
		// being closed; the operation finds out on its own.
		return false
	}
	return c.probeDead
}

// doProbe peeks at the socket without blocking or consuming: end of stream
// or an error means the peer is gone.
func (c *conn) doProbe(fd uintptr) bool {
	n, _, err := syscall.Recvfrom(int(fd), c.probeBuf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case err == nil:
		c.probeDead = n == 0
	case err == syscall.EAGAIN || err == syscall.EINTR:
	default:
		c.probeDead = true
	}
	return true
}

// enqueueHeld queues fb without waking the writer: the caller will queue
// another frame soon, with enqueue, which wakes it.
func (c *conn) enqueueHeld(fb *buffer) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wdown {
		putBuf(fb)
		return errConnDown
	}
	c.wq = append(c.wq, fb)
	return nil
}

// nextFrameBuffered reports whether a whole frame is waiting in the read
// buffer, so that reading it cannot block.
func (c *conn) nextFrameBuffered() bool {
	n := c.br.Buffered()
	if n < hdrLen {
		return false
	}
	hb, err := c.br.Peek(hdrLen)
	if err != nil {
		return false
	}
	return uint64(n-hdrLen) >= uint64(binary.LittleEndian.Uint32(hb))
}

func (c *conn) kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// doRawWrite is the body of the non-blocking write of enqueue: it writes
// rawBuf[rawOff:] until the kernel takes no more, and never waits.
func (c *conn) doRawWrite(fd uintptr) bool {
	for c.rawOff < len(c.rawBuf) {
		n, err := syscall.Write(int(fd), c.rawBuf[c.rawOff:])
		if n > 0 {
			c.rawOff += n
		}
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			if err != syscall.EAGAIN {
				c.rawErr = err
			}
			break
		}
		if n <= 0 {
			break
		}
	}
	return true
}

// writeLoop is the writer goroutine: it sends everything queued, as one
// buffered write per wake-up, blocking as long as the kernel needs.
func (c *conn) writeLoop() {
	defer c.t.wg.Done()
	for {
		select {
		case <-c.wake:
		case <-c.closing:
			return
		}
		// Let the other runnable goroutines queue their frames first:
		// under load this turns many small writes into one.
		runtime.Gosched()
		for {
			c.wmu.Lock()
			if c.writing || len(c.wq) == 0 {
				// An inline write is in progress; it kicks again when it
				// leaves frames behind.
				c.wmu.Unlock()
				break
			}
			q := c.wq
			c.wq, c.wspare = c.wspare[:0], nil
			c.writing = true
			c.wmu.Unlock()
			var err error
			for i, fb := range q {
				if err == nil {
					_, err = c.bw.Write(fb.b[fb.off:])
				}
				putBuf(fb)
				q[i] = nil
			}
			if err == nil {
				err = c.bw.Flush()
			}
			c.wmu.Lock()
			c.writing = false
			if c.wspare == nil {
				c.wspare = q[:0]
			}
			c.wmu.Unlock()
			if err != nil {
				c.shutdown(fmt.Errorf("write: %w", err))
				return
			}
		}
	}
}

// interrupt makes the reader's current or next read return at once with a
// deadline error; the reader clears the deadline and checks its call's
// cancel flag.
func (c *conn) interrupt() {
	c.imu.Lock()
	c.nc.SetReadDeadline(time.Unix(1, 0))
	c.imu.Unlock()
}

// readFull fills dst from the connection. A deadline error is an interrupt
// from a cancelling caller, not a failure: the deadline is cleared, and when
// cl (the call whose bytes these are, or nil) has been cancelled readFull
// returns errCancelled with the count of bytes read so far.
func (c *conn) readFull(dst []byte, cl *call) (int, error) {
	n := 0
	for n < len(dst) {
		if cl != nil && cl.cancel.Load() {
			return n, errCancelled
		}
		m, err := c.br.Read(dst[n:])
		n += m
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				c.imu.Lock()
				c.nc.SetReadDeadline(time.Time{})
				c.imu.Unlock()
				continue
			}
			if err == io.EOF && n > 0 {
				err = io.ErrUnexpectedEOF
			}
			return n, err
		}
	}
	return n, nil
}

var errCancelled = errors.New("tcp: call cancelled")

// register records cl under its sequence number. It also hands the caller
// the read side of the connection (own is true) when the connection is
// quiet: nothing else pending and nobody reading. The caller then reads its
// own response, as a plain request/response client would, and saves the
// hand-off from the reader goroutine.
func (c *conn) register(cl *call) (own bool, err error) {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if c.dead {
		return false, errConnDown
	}
	own = !c.reading && len(c.pending) == 0 && c.rhn == 0 && c.rskip == 0
	if own {
		c.reading = true
	}
	c.pending[cl.id] = cl
	return own, nil
}

func (c *conn) forget(id uint64) {
	c.pmu.Lock()
	delete(c.pending, id)
	c.pmu.Unlock()
}

func (c *conn) take(id uint64) *call {
	c.pmu.Lock()
	cl := c.pending[id]
	delete(c.pending, id)
	c.pmu.Unlock()
	return cl
}

// acquireRead takes the read side for the reader goroutine when there is
// something to read and nobody is reading.
func (c *conn) acquireRead() bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if c.reading || c.dead || (len(c.pending) == 0 && c.rhn == 0 && c.rskip == 0) {
		return false
	}
	c.reading = true
	return true
}

// releaseRead gives the read side back and, when responses are still
// expected, wakes the reader goroutine to take it.
func (c *conn) releaseRead() {
	c.pmu.Lock()
	c.reading = false
	more := !c.dead && (len(c.pending) > 0 || c.rhn > 0 || c.rskip > 0)
	c.pmu.Unlock()
	if more {
		select {
		case c.rkick <- struct{}{}:
		default:
		}
	}
}

// readResponses is the reader goroutine of an outbound connection. It
// reads whenever responses are expected and no caller is reading its own.
func (c *conn) readResponses() {
	defer c.t.wg.Done()
	for {
		select {
		case <-c.rkick:
		case <-c.closing:
			return
		}
		for c.acquireRead() {
			_, err := c.readStep(nil)
			c.releaseRead()
			if err != nil {
				c.readFailed(err)
				return
			}
		}
	}
}

// readOwn is the read loop of a caller that owns the read side (see
// register): it reads until its own call is done, or until the next frame
// is someone else's, or its context ends at a point where the stream can be
// handed over; then it releases the read side.
func (c *conn) readOwn(cl *call) {
	defer c.releaseRead()
	for cl.state.Load() != callDone {
		yield, err := c.readStep(cl)
		if err != nil {
			c.readFailed(err)
			return
		}
		if yield {
			return
		}
	}
}

func (c *conn) readFailed(err error) {
	if errors.Is(err, ErrProtocol) {
		c.protocolError(err)
		return
	}
	c.shutdown(fmt.Errorf("read: %w", err))
}

// readStep makes progress on the response stream for the holder of the
// read side: it skips what is left of a discarded body, completes the next
// header and, unless owner (a caller reading for itself) should not handle
// that frame, decodes it. The position in the stream (rhn header bytes
// read, rskip body bytes to skip) persists across holders, so a caller can
// hand over between any two reads. yield reports that owner should hand
// over now: the next frame is another call's, or owner was cancelled.
func (c *conn) readStep(owner *call) (yield bool, err error) {
	for c.rskip > 0 {
		m := min(c.rskip, len(c.scratch))
		n, err := c.readFull(c.scratch[:m], owner)
		c.rskip -= n
		if err == errCancelled {
			return true, nil
		}
		if err != nil {
			return false, err
		}
	}
	n, err := c.readFull(c.rhdr[c.rhn:], owner)
	c.rhn += n
	if err == errCancelled {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	h := decodeHeader(c.rhdr[:])
	if h.typ != frameResponse || h.bodyLen > maxBody {
		return false, fmt.Errorf("%w: frame type %d with %d bytes on a request connection", ErrProtocol, h.typ, h.bodyLen)
	}
	if owner != nil && h.id != owner.id {
		return true, nil
	}
	c.rhn = 0
	cl := c.take(h.id)
	if cl == nil || !cl.state.CompareAndSwap(callPending, callClaimed) {
		// Abandoned by its caller, or never ours: skip the body.
		c.rskip = int(h.bodyLen)
		return false, nil
	}
	left, err := c.fill(cl, &h)
	if err != nil {
		// The claimed call is ours to finish. A broken stream goes back
		// to its Post to be sent again; a response that breaks the format
		// is final: the peer may have executed the batch.
		cl.err = errBroken
		if errors.Is(err, ErrProtocol) {
			cl.err = outcomeUnknown(c.peer, err)
			rdma.FailAll(cl.ops, cl.err)
		}
		cl.state.Store(callDone)
		cl.done <- struct{}{}
		return false, err
	}
	c.rskip = left
	return false, nil
}

func (c *conn) protocolError(err error) {
	c.t.log.Warn("tcp: closing connection", "peer", c.peer, "err", err)
	c.shutdown(err)
}

// fill decodes the response body described by h into the claimed call cl
// and signals it. READ data goes straight from the stream into the
// caller's buffers (large ones bypass the read buffer entirely). When the
// caller cancels meanwhile, fill signals it at once and returns the count
// of body bytes left to skip. An error means the connection is unusable
// and cl has not been signalled.
func (c *conn) fill(cl *call, h *header) (left int, err error) {
	ops := cl.ops
	count := int(h.count)
	if count > len(ops) || h.status > maxCode || (h.status == 0) != (count == len(ops)) {
		return 0, fmt.Errorf("%w: response status %d for %d of %d ops", ErrProtocol, h.status, count, len(ops))
	}
	want := 0
	for i := range ops[:count] {
		switch ops[i].Kind {
		case rdma.OpRead:
			want += len(ops[i].Buf)
		case rdma.OpCAS, rdma.OpFAA:
			want += resultLen
		}
	}
	body := int(h.bodyLen)
	text := body - want
	if text < 0 || text > maxErrText || (h.status == 0 && text != 0) {
		return 0, fmt.Errorf("%w: %d-byte response body, want %d", ErrProtocol, body, want)
	}
	left = body
	for i := range ops[:count] {
		op := &ops[i]
		var n int
		var err error
		switch op.Kind {
		case rdma.OpRead:
			n, err = c.readFull(op.Buf, cl)
		case rdma.OpCAS, rdma.OpFAA:
			n, err = c.readFull(c.scratch[:resultLen], cl)
			if err == nil {
				op.Result = binary.LittleEndian.Uint64(c.scratch[:])
			} else if n > 0 && err == errCancelled {
				// A word read in part: finish it, it is not the caller's.
				m, err2 := c.readFull(c.scratch[n:resultLen], nil)
				n += m
				if err2 != nil {
					return 0, err2
				}
			}
		}
		left -= n
		if err == errCancelled {
			// The caller gave up: release it; the rest is skipped.
			cl.cancelled = true
			cl.state.Store(callDone)
			cl.done <- struct{}{}
			return left, nil
		}
		if err != nil {
			return 0, err
		}
		op.Err = nil
	}
	cl.err = nil
	if h.status != 0 {
		if _, err := c.readFull(c.scratch[:text], nil); err != nil {
			return 0, err
		}
		err := newRemoteError(h.status, c.scratch[:text])
		ops[count].Err = err
		rdma.FlushAfter(ops, count)
		cl.err = err
	}
	cl.state.Store(callDone)
	cl.done <- struct{}{}
	return 0, nil
}

// serve is the reader of an inbound connection: the responder. It executes
// each request on registered memory through the transport's table, in
// arrival order, and queues the response; it delivers messages to the
// handler. A frame that breaks the format closes the connection.
func (c *conn) serve() {
	defer c.t.wg.Done()
	defer c.t.forgetInbound(c)
	var hb [hdrLen]byte
	for {
		if c.deferred > 0 && !c.nextFrameBuffered() {
			// The next read may block: send what was held back.
			c.deferred = 0
			c.kick()
		}
		if _, err := c.readFull(hb[:], nil); err != nil {
			c.shutdown(fmt.Errorf("read: %w", err))
			return
		}
		h := decodeHeader(hb[:])
		if err := c.serveFrame(&h); err != nil {
			if errors.Is(err, ErrProtocol) {
				c.protocolError(err)
			} else {
				c.shutdown(fmt.Errorf("read: %w", err))
			}
			return
		}
	}
}

func (c *conn) serveFrame(h *header) error {
	if h.status != 0 {
		return fmt.Errorf("%w: status %d on a request", ErrProtocol, h.status)
	}
	switch h.typ {
	case frameRequest:
		if h.count < 1 || h.count > rdma.MaxBatch || h.bodyLen > maxBody {
			return fmt.Errorf("%w: request of %d ops in %d bytes", ErrProtocol, h.count, h.bodyLen)
		}
		body := getBuf(int(h.bodyLen))
		defer putBuf(body)
		if _, err := c.readFull(body.b, nil); err != nil {
			return err
		}
		floor, wops, err := decodeRequest(int(h.count), body.b, c.wops)
		c.wops = wops
		if err != nil {
			return err
		}
		resp, err := c.sess.serve(c, h.id, floor, wops)
		if err != nil {
			return err
		}
		if resp == nil {
			return nil // finished at the requester: not executed again
		}
		// While the next request is already complete in the read buffer,
		// hold the responses back (up to a buffer's worth) so that they go
		// out in one write; otherwise send now, inline when idle.
		if c.deferred+len(resp.b) <= bufSize && c.nextFrameBuffered() {
			c.deferred += len(resp.b)
			return c.enqueueHeld(resp)
		}
		c.deferred = 0
		return c.enqueue(resp, true)
	case frameMessage:
		if h.count != 0 || h.id != 0 || h.bodyLen > rdma.MaxMessage {
			return fmt.Errorf("%w: message of %d bytes", ErrProtocol, h.bodyLen)
		}
		msg := make([]byte, h.bodyLen)
		if _, err := c.readFull(msg, nil); err != nil {
			return err
		}
		c.t.deliver(c.peer, msg)
		return nil
	}
	return fmt.Errorf("%w: frame type %d on a serving connection", ErrProtocol, h.typ)
}

// execute runs the decoded ops in order on the table and returns the
// response frame, and whether an op that changes memory executed. A READ
// copies straight from registered memory into the response. Execution
// stops at the first failing op.
func (c *conn) execute(id uint64, wops []wireOp) (fb *buffer, effects bool) {
	size := 0
	for i := range wops {
		switch wops[i].kind {
		case rdma.OpRead:
			size += int(min(wops[i].n, rdma.MaxTransfer))
		case rdma.OpCAS, rdma.OpFAA:
			size += resultLen
		}
	}
	// A batch whose results would exceed a frame fails at the op that
	// does not fit.
	size = min(size, maxBody-maxErrText)
	fb = getBuf(hdrLen + size + maxErrText)
	b := fb.b
	room := hdrLen + size
	p := hdrLen
	op := &c.execOp
	var failed error
	count := 0
	for i := range wops {
		w := &wops[i]
		*op = rdma.Op{Kind: w.kind, RKey: rdma.RKey{Key: w.key}, Offset: w.off}
		switch w.kind {
		case rdma.OpRead:
			switch {
			case w.n > rdma.MaxTransfer:
				failed = fmt.Errorf("%w: %d-byte READ (max %d)", rdma.ErrTooLarge, w.n, rdma.MaxTransfer)
			case int(w.n) > room-p:
				failed = fmt.Errorf("%w: READs of more than %d bytes in one batch", rdma.ErrTooLarge, size)
			default:
				op.Buf = b[p : p+int(w.n)]
			}
		case rdma.OpWrite:
			op.Buf = w.data
		case rdma.OpCAS, rdma.OpFAA:
			if resultLen > room-p {
				failed = fmt.Errorf("%w: results of more than %d bytes in one batch", rdma.ErrTooLarge, size)
			}
			op.Compare, op.Operand = w.a, w.b
			if w.kind == rdma.OpFAA {
				op.Compare, op.Operand = 0, w.a
			}
		}
		if failed == nil {
			failed = c.t.table.Execute(op)
		}
		if failed != nil {
			break
		}
		switch w.kind {
		case rdma.OpRead:
			p += int(w.n)
		case rdma.OpWrite:
			effects = true
		case rdma.OpCAS, rdma.OpFAA:
			binary.LittleEndian.PutUint64(b[p:], op.Result)
			p += resultLen
			effects = true
		}
		count++
	}
	*op = rdma.Op{}
	h := header{typ: frameResponse, count: uint16(count), id: id}
	if failed != nil {
		h.status = errCode(failed)
		p += copy(b[p:p+maxErrText], failed.Error())
	}
	h.bodyLen = uint32(p - hdrLen)
	h.encode(b)
	fb.b = b[:p]
	return fb, effects
}
