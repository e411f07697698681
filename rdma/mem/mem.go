// Package mem is the in-process backend of the verbs transport: every
// endpoint of a Network lives in one process and reaches the others'
// registered memory directly.
//
// A Network runs in one of two modes. In the default, immediate mode a Post
// executes at the target before it returns and messages are delivered in
// order by one goroutine per receiving endpoint: a fast, faithful transport
// for unit tests. In manual mode (Manual) nothing moves until the driver says
// so: batches and messages wait in a queue (Pending) and the driver delivers,
// drops or duplicates them one by one, in any order, from its own goroutine.
// That is how the coherence simulator explores interleavings
// deterministically: a batch's READ sees the target memory as it is at the
// moment of delivery, and handlers and completion callbacks run
// synchronously inside Deliver.
package mem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/internal/target"
)

// Option configures a Network.
type Option func(*Network)

// Manual makes the network hold every batch and message until the driver
// delivers it with Deliver (or Drop).
func Manual() Option { return func(n *Network) { n.manual = true } }

// Network connects in-process endpoints.
type Network struct {
	manual bool

	mu    sync.Mutex
	eps   map[ids.NodeID]*Endpoint
	queue []*Delivery // manual mode, in submission order
	seq   uint64
}

// NewNetwork returns an empty network.
func NewNetwork(opts ...Option) *Network {
	n := &Network{eps: map[ids.NodeID]*Endpoint{}}
	for _, o := range opts {
		o(n)
	}
	return n
}

// DeliveryKind tells a batch from a message. The zero value is invalid.
type DeliveryKind uint8

const (
	// BatchDelivery is a batch of one-sided operations.
	BatchDelivery DeliveryKind = 1 + iota
	// MessageDelivery is a two-sided message.
	MessageDelivery
)

func (k DeliveryKind) String() string {
	switch k {
	case BatchDelivery:
		return "batch"
	case MessageDelivery:
		return "message"
	}
	return "DeliveryKind(" + strconv.Itoa(int(k)) + ")"
}

// Delivery is one batch or message waiting in a manual network. Its fields
// are read-only for the driver.
type Delivery struct {
	Seq  uint64
	Kind DeliveryKind
	From ids.NodeID
	To   ids.NodeID
	Ops  []rdma.Op // BatchDelivery
	Msg  []byte    // MessageDelivery

	done func(error) // BatchDelivery: completion
}

func (d *Delivery) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d %v %v->%v", d.Seq, d.Kind, d.From, d.To)
	if d.Kind == BatchDelivery {
		for i := range d.Ops {
			b.WriteString(" [")
			b.WriteString(d.Ops[i].String())
			b.WriteString("]")
		}
	} else {
		fmt.Fprintf(&b, " %d bytes", len(d.Msg))
	}
	return b.String()
}

// Endpoint creates the endpoint of node id. An id can be reused once its
// previous endpoint was closed (a restart).
func (n *Network) Endpoint(id ids.NodeID) (*Endpoint, error) {
	if id == ids.None {
		return nil, errors.New("rdma/mem: node id 0 is reserved")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if old := n.eps[id]; old != nil && !old.isClosed() {
		return nil, fmt.Errorf("rdma/mem: node %v already has an endpoint", id)
	}
	e := &Endpoint{net: n, id: id, table: target.New(id), removed: map[ids.NodeID]bool{}}
	if !n.manual {
		e.inboxReady = make(chan struct{}, 1)
		e.stop = make(chan struct{})
		e.stopped = make(chan struct{})
		go e.deliverLoop()
	}
	n.eps[id] = e
	return e, nil
}

// Pending returns the deliveries waiting in a manual network, oldest first.
func (n *Network) Pending() []*Delivery {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.queue)
}

var errNotPending = errors.New("rdma/mem: delivery is not pending")

func (n *Network) take(d *Delivery) bool {
	i := slices.Index(n.queue, d)
	if i < 0 {
		return false
	}
	n.queue = slices.Delete(n.queue, i, i+1)
	return true
}

// Deliver executes a pending delivery now: a batch runs on the target's
// registered memory and its completion runs; a message is handed to the
// target's handler. Both run on the caller's goroutine before Deliver
// returns.
func (n *Network) Deliver(d *Delivery) error {
	n.mu.Lock()
	if !n.take(d) {
		n.mu.Unlock()
		return errNotPending
	}
	to := n.eps[d.To]
	n.mu.Unlock()
	alive := to != nil && !to.isClosed()
	switch d.Kind {
	case BatchDelivery:
		var err error
		if !alive {
			err = &rdma.PeerError{Peer: d.To, Err: rdma.ErrPeerUnreachable}
			rdma.FailAll(d.Ops, err)
		} else {
			err = to.table.ExecuteBatch(d.Ops)
		}
		d.done(err)
	case MessageDelivery:
		if alive {
			to.handle(d.From, d.Msg)
		}
	}
	return nil
}

// Drop discards a pending delivery: a batch fails as if the link had
// broken, a message is lost.
func (n *Network) Drop(d *Delivery) error {
	n.mu.Lock()
	if !n.take(d) {
		n.mu.Unlock()
		return errNotPending
	}
	n.mu.Unlock()
	if d.Kind == BatchDelivery {
		err := &rdma.PeerError{Peer: d.To, Err: rdma.ErrPeerUnreachable}
		rdma.FailAll(d.Ops, err)
		d.done(err)
	}
	return nil
}

// Duplicate queues a copy of a pending message (batches cannot be
// duplicated: a queue pair delivers each work request once).
func (n *Network) Duplicate(d *Delivery) error {
	if d.Kind != MessageDelivery {
		return errors.New("rdma/mem: only messages can be duplicated")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !slices.Contains(n.queue, d) {
		return errNotPending
	}
	n.seq++
	c := &Delivery{Seq: n.seq, Kind: d.Kind, From: d.From, To: d.To, Msg: slices.Clone(d.Msg)}
	n.queue = append(n.queue, c)
	return nil
}

// Crash kills the endpoint of id abruptly: its registrations vanish, the
// batches it posted and those addressed to it fail, and messages to or from
// it are lost.
func (n *Network) Crash(id ids.NodeID) {
	n.mu.Lock()
	e := n.eps[id]
	n.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// failQueued removes every queued delivery from or to id and fails its
// batches with err (for batches it posted) or unreachable (addressed to it).
func (n *Network) failQueued(id ids.NodeID, err error) {
	n.mu.Lock()
	var failed []*Delivery
	n.queue = slices.DeleteFunc(n.queue, func(d *Delivery) bool {
		if d.From != id && d.To != id {
			return false
		}
		if d.Kind == BatchDelivery {
			failed = append(failed, d)
		}
		return true
	})
	n.mu.Unlock()
	for _, d := range failed {
		e := err
		if d.From != id {
			e = &rdma.PeerError{Peer: d.To, Err: rdma.ErrPeerUnreachable}
		}
		rdma.FailAll(d.Ops, e)
		d.done(e)
	}
}

// Endpoint is one node's endpoint on a Network. It implements
// rdma.Transport.
type Endpoint struct {
	net     *Network
	id      ids.NodeID
	table   *target.Table
	handler atomic.Pointer[rdma.Handler]
	closed  atomic.Bool

	mu      sync.Mutex
	removed map[ids.NodeID]bool // peers forgotten with RemovePeer
	inbox   []inboxMsg          // immediate mode

	inboxReady chan struct{}
	stop       chan struct{}
	stopped    chan struct{}
}

type inboxMsg struct {
	from ids.NodeID
	msg  []byte
}

var _ rdma.Transport = (*Endpoint)(nil)

func (e *Endpoint) isClosed() bool { return e.closed.Load() }

// LocalID implements rdma.Transport.
func (e *Endpoint) LocalID() ids.NodeID { return e.id }

// Addr implements rdma.Transport: "mem:<id>".
func (e *Endpoint) Addr() string { return "mem:" + strconv.FormatUint(uint64(e.id), 10) }

// AddPeer implements rdma.Transport. Every endpoint of the network is
// reachable; AddPeer checks that addr names id and undoes RemovePeer.
func (e *Endpoint) AddPeer(id ids.NodeID, addr string) error {
	if want := "mem:" + strconv.FormatUint(uint64(id), 10); addr != want {
		return fmt.Errorf("rdma/mem: address %q does not name node %v (want %q)", addr, id, want)
	}
	e.mu.Lock()
	delete(e.removed, id)
	e.mu.Unlock()
	return nil
}

// RemovePeer implements rdma.Transport.
func (e *Endpoint) RemovePeer(id ids.NodeID) {
	e.mu.Lock()
	e.removed[id] = true
	e.mu.Unlock()
}

// Register implements rdma.Transport.
func (e *Endpoint) Register(mem []byte, access rdma.Access) (rdma.Registration, error) {
	if e.isClosed() {
		return nil, rdma.ErrClosed
	}
	return e.table.Register(mem, access)
}

// SetHandler implements rdma.Transport.
func (e *Endpoint) SetHandler(h rdma.Handler) { e.handler.Store(&h) }

func (e *Endpoint) handle(from ids.NodeID, msg []byte) {
	if h := e.handler.Load(); h != nil && *h != nil {
		(*h)(from, msg)
	}
}

// peer finds the live endpoint of id.
func (e *Endpoint) peer(id ids.NodeID) (*Endpoint, error) {
	if e.isClosed() {
		return nil, rdma.ErrClosed
	}
	e.mu.Lock()
	removed := e.removed[id]
	e.mu.Unlock()
	e.net.mu.Lock()
	p := e.net.eps[id]
	e.net.mu.Unlock()
	if p == nil || removed {
		return nil, &rdma.PeerError{Peer: id, Err: rdma.ErrUnknownPeer}
	}
	if p.isClosed() {
		return nil, &rdma.PeerError{Peer: id, Err: rdma.ErrPeerUnreachable}
	}
	return p, nil
}

// Post implements rdma.Transport.
func (e *Endpoint) Post(ctx context.Context, peer ids.NodeID, ops []rdma.Op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !e.net.manual {
		return e.postNow(peer, ops)
	}
	done := make(chan error, 1)
	d, err := e.enqueueBatch(peer, ops, func(err error) { done <- err })
	if err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		e.net.mu.Lock()
		taken := e.net.take(d)
		e.net.mu.Unlock()
		if taken {
			return ctx.Err()
		}
		// Delivered or failed concurrently: its completion is on its way.
		return <-done
	}
}

func (e *Endpoint) postNow(peer ids.NodeID, ops []rdma.Op) error {
	if err := rdma.CheckBatch(ops); err != nil {
		rdma.FailAll(ops, err)
		return err
	}
	p, err := e.peer(peer)
	if err != nil {
		rdma.FailAll(ops, err)
		return err
	}
	return p.table.ExecuteBatch(ops)
}

// PostAsync posts ops and calls done with Post's result when the batch
// completes. It never blocks: in immediate mode done runs before PostAsync
// returns; in manual mode it runs inside Network.Deliver or Drop (or when
// either endpoint crashes). ops must not be touched until done runs.
func (e *Endpoint) PostAsync(peer ids.NodeID, ops []rdma.Op, done func(error)) {
	if !e.net.manual {
		done(e.postNow(peer, ops))
		return
	}
	if _, err := e.enqueueBatch(peer, ops, done); err != nil {
		done(err)
	}
}

func (e *Endpoint) enqueueBatch(peer ids.NodeID, ops []rdma.Op, done func(error)) (*Delivery, error) {
	if err := rdma.CheckBatch(ops); err != nil {
		rdma.FailAll(ops, err)
		return nil, err
	}
	if _, err := e.peer(peer); err != nil {
		rdma.FailAll(ops, err)
		return nil, err
	}
	n := e.net
	n.mu.Lock()
	defer n.mu.Unlock()
	n.seq++
	d := &Delivery{Seq: n.seq, Kind: BatchDelivery, From: e.id, To: peer, Ops: ops, done: done}
	n.queue = append(n.queue, d)
	return d, nil
}

// Send implements rdma.Transport. In manual mode the message waits in the
// network's queue; Send returns at once.
func (e *Endpoint) Send(ctx context.Context, peer ids.NodeID, msg []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msg) > rdma.MaxMessage {
		return fmt.Errorf("%w: %d-byte message (max %d)", rdma.ErrTooLarge, len(msg), rdma.MaxMessage)
	}
	p, err := e.peer(peer)
	if err != nil {
		return err
	}
	m := slices.Clone(msg)
	if e.net.manual {
		n := e.net
		n.mu.Lock()
		n.seq++
		n.queue = append(n.queue, &Delivery{Seq: n.seq, Kind: MessageDelivery, From: e.id, To: peer, Msg: m})
		n.mu.Unlock()
		return nil
	}
	p.mu.Lock()
	p.inbox = append(p.inbox, inboxMsg{from: e.id, msg: m})
	p.mu.Unlock()
	select {
	case p.inboxReady <- struct{}{}:
	default:
	}
	return nil
}

// deliverLoop hands queued messages to the handler, in arrival order
// (immediate mode).
func (e *Endpoint) deliverLoop() {
	defer close(e.stopped)
	for {
		select {
		case <-e.stop:
			return
		case <-e.inboxReady:
		}
		for {
			e.mu.Lock()
			batch := e.inbox
			e.inbox = nil
			e.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			for _, m := range batch {
				if e.isClosed() {
					return
				}
				e.handle(m.from, m.msg)
			}
		}
	}
}

// Close implements rdma.Transport. It is idempotent. In immediate mode it
// waits for the delivery goroutine to stop, so a message handler must not
// call Close of its own endpoint.
func (e *Endpoint) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	if e.stop != nil {
		close(e.stop)
		<-e.stopped
	}
	e.net.failQueued(e.id, rdma.ErrClosed)
	return nil
}
