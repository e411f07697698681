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
//
// # Reads that are not atomic
//
// By default a delivered batch executes whole, at one moment: a READ
// returns the target memory as it was at that moment. Real transports give
// no such promise: a NIC may fetch a READ's bytes in any order, and Go's
// copy of 256 bytes or more loads the last 128 bytes of the source first,
// then the head, then the body. With SplitReads (or, for one delivery,
// DeliverSplit) a batch stops in the middle of its first READ longer than
// 8 bytes: the delivery executes the ops before that READ and the READ's
// last min(128, len/2) bytes, and queues the rest of the batch as a new
// Delivery (a new Seq, the same From, To and Kind, Continues naming the
// batch, its Ops what is left: the READ's first bytes, then the ops after
// it). Delivering the rest executes them, splitting the next long READ
// again the same way when it is delivered with SplitReads or DeliverSplit,
// and only the last part calls the batch's completion, with every result
// in the ops as posted.
// Other deliveries may run between the parts, so that one READ sees the
// memory at two moments. A rest that is dropped, or fails because an
// endpoint crashed, completes the batch with the usual error, wrapped in
// rdma.ErrOutcomeUnknown when an op other than a READ of the batch has
// executed (it may have had effects).
//
// # Outcomes that settle late
//
// A transport that reports a batch's outcome unknown (it timed out, its
// context ended) may still execute that batch later: the requests were in
// the network or queued at the target. The ofi transport bounds how late:
// a later Post of the same requester to the same peer waits until the
// requests it abandoned have completed (rdma/ofi, "Unknown outcomes"), so
// an abandoned batch executes, if ever, before any later batch of its
// requester to that target. Abandon models that: it completes a pending
// batch with rdma.ErrOutcomeUnknown now and leaves it pending (Abandoned),
// to be delivered (executed: its READs land in copies of the buffers, as
// in the transport's own staging memory) or dropped later; a later batch
// From the same requester To the same target executes the abandoned ones
// first when it is delivered. Messages are not held back.
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

// SplitReads makes Deliver execute every batch with a READ of more than 8
// bytes in parts, at the moments their deliveries come (see the package
// documentation, "Reads that are not atomic"). Manual mode only: it has no
// effect in immediate mode.
func SplitReads() Option { return func(n *Network) { n.splitReads = true } }

// AbandonedUnordered lets a requester's later batch execute before the
// batches it abandoned (Abandon) to the same target, as a transport
// without the ofi transport's in-doubt wait would: for tests that show
// what that wait is for.
func AbandonedUnordered() Option { return func(n *Network) { n.unordered = true } }

// Network connects in-process endpoints.
type Network struct {
	manual     bool
	splitReads bool
	unordered  bool // AbandonedUnordered

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
	Ops  []rdma.Op // BatchDelivery; the ops left to execute in a rest
	Msg  []byte    // MessageDelivery
	// Continues is, for the rest of a batch whose delivery stopped in the
	// middle of a READ (SplitReads, DeliverSplit), the Seq of that batch;
	// 0 otherwise.
	Continues uint64
	// Abandoned: the batch's requester was told its outcome is unknown
	// (Abandon); it executes when delivered, and before any later batch
	// From the same requester To the same target.
	Abandoned bool

	done func(error) // BatchDelivery: completion
	rest *rest       // the rest of a batch: where it resumes
}

// rest is where a batch split in the middle of a READ resumes.
type rest struct {
	ops  []rdma.Op // the batch as posted, where every result lands
	next int       // the first op not executed in full
	// head is how many of the first bytes of ops[next] (a READ whose
	// last bytes were read) are still to read.
	head int
	// effects: an op other than a READ executed.
	effects bool
}

// splitMin is the longest READ that DeliverSplit executes at one moment.
const splitMin = 8

// tailLen is how many of the last bytes of an n-byte READ (n > splitMin)
// the first part reads: what a memmove loads first, at most half.
func tailLen(n int) int { return min(128, n/2) }

func (d *Delivery) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d %v %v->%v", d.Seq, d.Kind, d.From, d.To)
	if d.Continues != 0 {
		fmt.Fprintf(&b, " (rest of #%d)", d.Continues)
	}
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
// returns. With SplitReads, a batch with a READ of more than 8 bytes runs
// only up to the middle of that READ and its rest is queued (then the
// completion waits for the rest).
func (n *Network) Deliver(d *Delivery) error { return n.deliver(d, n.splitReads) }

// DeliverSplit delivers d as Deliver does with SplitReads, whether the
// network has that option or not: a batch stops in the middle of its first
// READ of more than 8 bytes, and its rest is queued. A batch without such
// a READ, or a message, is delivered as by Deliver.
func (n *Network) DeliverSplit(d *Delivery) error { return n.deliver(d, true) }

func (n *Network) deliver(d *Delivery, split bool) error {
	n.mu.Lock()
	if d.Kind == BatchDelivery && !d.Abandoned && !n.unordered && slices.Contains(n.queue, d) {
		// The requester's abandoned batches to this target go first.
		var first []*Delivery
		for _, a := range n.queue {
			if a.Abandoned && a.From == d.From && a.To == d.To && a.Seq < d.Seq {
				first = append(first, a)
			}
		}
		n.mu.Unlock()
		for _, a := range first {
			if err := n.deliver(a, false); err != nil {
				return err
			}
		}
		n.mu.Lock()
	}
	if !n.take(d) {
		n.mu.Unlock()
		return errNotPending
	}
	to := n.eps[d.To]
	n.mu.Unlock()
	alive := to != nil && !to.isClosed()
	fenced := alive && to.Fences(d.From)
	switch d.Kind {
	case BatchDelivery:
		switch {
		case !alive || fenced:
			d.fail(&rdma.PeerError{Peer: d.To, Err: rdma.ErrPeerUnreachable})
		case split || d.rest != nil:
			n.executeSplit(d, to, split)
		default:
			d.done(to.table.ExecuteBatch(d.Ops))
		}
	case MessageDelivery:
		if alive && !fenced {
			to.handle(d.From, d.Msg)
		}
	}
	return nil
}

var errNotAbandonable = errors.New("rdma/mem: only a pending batch not begun and not abandoned can be abandoned")

// Abandon completes the pending batch d with an error wrapping
// rdma.ErrOutcomeUnknown, as a transport does when the batch is overdue,
// and leaves it pending, to execute when it is delivered (see the package
// documentation, "Outcomes that settle late"). The batch must not have
// begun (no rest of a split READ).
func (n *Network) Abandon(d *Delivery) error {
	n.mu.Lock()
	if d.Kind != BatchDelivery || d.rest != nil || d.Abandoned || !slices.Contains(n.queue, d) {
		n.mu.Unlock()
		return errNotAbandonable
	}
	ops, done := d.Ops, d.done
	// The requester owns its buffers again: the batch executes on copies.
	own := slices.Clone(ops)
	for i := range own {
		own[i].Buf = slices.Clone(own[i].Buf)
	}
	d.Ops, d.done, d.Abandoned = own, func(error) {}, true
	n.mu.Unlock()
	err := &rdma.PeerError{Peer: d.To, Err: fmt.Errorf("%w: %w: abandoned by the driver", rdma.ErrPeerUnreachable, rdma.ErrOutcomeUnknown)}
	rdma.FailAll(ops, err)
	done(err)
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
		d.fail(&rdma.PeerError{Peer: d.To, Err: rdma.ErrPeerUnreachable})
	}
	return nil
}

// executeSplit executes the batch (or rest of a batch) d at to. split: a
// READ of more than splitMin bytes stops the delivery in its middle, after
// its last bytes, and the rest is queued.
func (n *Network) executeSplit(d *Delivery, to *Endpoint, split bool) {
	r := d.rest
	if r == nil {
		r = &rest{ops: d.Ops}
	}
	ops, i := r.ops, r.next
	finish := func(i int, err error) {
		ops[i].Err = err
		rdma.FlushAfter(ops, i)
		d.done(err)
	}
	if r.head > 0 {
		head := ops[i]
		head.Buf = head.Buf[:r.head]
		if err := to.table.Execute(&head); err != nil {
			finish(i, err)
			return
		}
		ops[i].Err = nil
		i++
	}
	for ; i < len(ops); i++ {
		op := &ops[i]
		if split && op.Kind == rdma.OpRead && len(op.Buf) > splitMin {
			k := len(op.Buf) - tailLen(len(op.Buf))
			tail := *op
			tail.Offset += uint64(k)
			tail.Buf = op.Buf[k:]
			if to.table.Execute(&tail) == nil {
				n.queueRest(d, &rest{ops: ops, next: i, head: k, effects: r.effects})
				return
			}
			// The tail failed; so does the whole READ, whose error
			// names all of it.
		}
		if err := to.table.Execute(op); err != nil {
			finish(i, err)
			return
		}
		op.Err = nil
		if op.Kind != rdma.OpRead {
			r.effects = true
		}
	}
	d.done(nil)
}

// queueRest queues the rest r of the batch d.
func (n *Network) queueRest(d *Delivery, r *rest) {
	orig := d.Seq
	if d.Continues != 0 {
		orig = d.Continues
	}
	head := r.ops[r.next]
	head.Buf = head.Buf[:r.head]
	left := append([]rdma.Op{head}, r.ops[r.next+1:]...)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.seq++
	n.queue = append(n.queue, &Delivery{Seq: n.seq, Kind: BatchDelivery, From: d.From, To: d.To, Ops: left, Continues: orig, done: d.done, rest: r})
}

// fail completes the batch d with err, which every op not executed in full
// reports. When d is the rest of a batch that executed an op other than a
// READ, err is wrapped in rdma.ErrOutcomeUnknown: those ops may have had
// effects.
func (d *Delivery) fail(err error) {
	ops := d.Ops
	if r := d.rest; r != nil {
		ops = r.ops[r.next:]
		if r.effects {
			err = outcomeUnknown(err)
		}
	}
	rdma.FailAll(ops, err)
	d.done(err)
}

// outcomeUnknown wraps err in rdma.ErrOutcomeUnknown, inside the
// PeerError when err is one.
func outcomeUnknown(err error) error {
	if pe, ok := err.(*rdma.PeerError); ok {
		return &rdma.PeerError{Peer: pe.Peer, Err: fmt.Errorf("%w: %w", rdma.ErrOutcomeUnknown, pe.Err)}
	}
	return fmt.Errorf("%w: %w", err, rdma.ErrOutcomeUnknown)
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
		d.fail(e)
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
	fenced  map[ids.NodeID]bool // peers whose batches and messages are refused (Fence)
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

// Fence refuses, from now on, every batch and message from peer at this
// endpoint, as the tcp transport's Fence does for a departed incarnation:
// a batch delivered later fails unexecuted (rdma.ErrPeerUnreachable at its
// poster), a message is dropped. Deliveries executed before stay.
func (e *Endpoint) Fence(peer ids.NodeID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.fenced == nil {
		e.fenced = map[ids.NodeID]bool{}
	}
	e.fenced[peer] = true
}

// Fences reports whether this endpoint refuses peer (Fence).
func (e *Endpoint) Fences(peer ids.NodeID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.fenced[peer]
}

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
	if err == nil && p.Fences(e.id) {
		err = &rdma.PeerError{Peer: peer, Err: rdma.ErrPeerUnreachable}
	}
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
				if !e.Fences(m.from) {
					e.handle(m.from, m.msg)
				}
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
