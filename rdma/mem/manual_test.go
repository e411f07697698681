package mem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/mem"
)

func manual(t *testing.T, n int, opts ...mem.Option) (*mem.Network, []*mem.Endpoint) {
	t.Helper()
	net := mem.NewNetwork(append([]mem.Option{mem.Manual()}, opts...)...)
	eps := make([]*mem.Endpoint, n)
	for i := range eps {
		ep, err := net.Endpoint(ids.NodeID(i + 1))
		if err != nil {
			t.Fatal(err)
		}
		eps[i] = ep
		t.Cleanup(func() { ep.Close() })
	}
	return net, eps
}

func registerWords(t *testing.T, ep *mem.Endpoint) rdma.Registration {
	t.Helper()
	b, err := rdma.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := ep.Register(b, rdma.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Deregister(); rdma.Free(b) })
	return reg
}

// A manual network executes nothing until the driver delivers, and a READ
// sees the target memory as it is at delivery time.
func TestManualHoldAndReorder(t *testing.T) {
	net, eps := manual(t, 3)
	reg := registerWords(t, eps[2])
	rk := reg.Descriptor().RKey
	var order []string
	readOp := []rdma.Op{{Kind: rdma.OpRead, RKey: rk, Offset: 0, Buf: make([]byte, 8)}}
	faaOp := []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Offset: 0, Operand: 5}}
	eps[0].PostAsync(3, readOp, func(err error) { order = append(order, "read") })
	eps[1].PostAsync(3, faaOp, func(err error) { order = append(order, "faa") })
	if len(order) != 0 || rdma.LoadWord(reg.Bytes(), 0) != 0 {
		t.Fatal("manual network executed before delivery")
	}
	p := net.Pending()
	if len(p) != 2 || p[0].From != 1 || p[1].From != 2 || p[0].Kind != mem.BatchDelivery {
		t.Fatalf("pending = %v", p)
	}
	// Deliver in reverse order.
	if err := net.Deliver(p[1]); err != nil {
		t.Fatal(err)
	}
	if err := net.Deliver(p[0]); err != nil {
		t.Fatal(err)
	}
	if got := rdma.LoadWord(readOp[0].Buf, 0); got != 5 {
		t.Errorf("READ delivered after FAA saw %d, want 5", got)
	}
	if len(order) != 2 || order[0] != "faa" || order[1] != "read" {
		t.Errorf("completions ran in order %v", order)
	}
	if err := net.Deliver(p[0]); err == nil {
		t.Error("delivering twice succeeded")
	}
}

func TestManualDropDuplicateCrash(t *testing.T) {
	net, eps := manual(t, 3)
	reg := registerWords(t, eps[1])
	rk := reg.Descriptor().RKey
	var got []string
	eps[1].SetHandler(func(from ids.NodeID, msg []byte) { got = append(got, from.String()+":"+string(msg)) })

	ctx := context.Background()
	if err := eps[0].Send(ctx, 2, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if err := eps[2].Send(ctx, 2, []byte("b")); err != nil {
		t.Fatal(err)
	}
	p := net.Pending()
	if err := net.Duplicate(p[0]); err != nil {
		t.Fatal(err)
	}
	if err := net.Drop(p[1]); err != nil {
		t.Fatal(err)
	}
	for _, d := range net.Pending() {
		net.Deliver(d)
	}
	if len(got) != 2 || got[0] != "n1:a" || got[1] != "n1:a" {
		t.Errorf("handler saw %v, want the duplicated message twice and the dropped one never", got)
	}

	var dropErr, crashErr error
	eps[0].PostAsync(2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}, func(err error) { dropErr = err })
	net.Drop(net.Pending()[0])
	if !errors.Is(dropErr, rdma.ErrPeerUnreachable) || rdma.LoadWord(reg.Bytes(), 0) != 0 {
		t.Errorf("dropped batch: err %v, word %d", dropErr, rdma.LoadWord(reg.Bytes(), 0))
	}
	eps[0].PostAsync(2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}, func(err error) { crashErr = err })
	net.Crash(2)
	if !errors.Is(crashErr, rdma.ErrPeerUnreachable) || len(net.Pending()) != 0 {
		t.Errorf("batch to crashed node: err %v, %d pending", crashErr, len(net.Pending()))
	}
	// A restarted node gets a fresh endpoint without the old registrations.
	ep2, err := net.Endpoint(2)
	if err != nil {
		t.Fatal(err)
	}
	defer ep2.Close()
	var restartErr error
	eps[0].PostAsync(2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}, func(err error) { restartErr = err })
	net.Deliver(net.Pending()[0])
	if !errors.Is(restartErr, rdma.ErrUnknownKey) {
		t.Errorf("old key after restart: %v, want ErrUnknownKey", restartErr)
	}
}

// A fenced peer's batches fail unexecuted and its messages are dropped,
// those queued before the fence included; other peers are served.
func TestManualFence(t *testing.T) {
	net, eps := manual(t, 3)
	reg := registerWords(t, eps[1])
	rk := reg.Descriptor().RKey
	var got []string
	eps[1].SetHandler(func(from ids.NodeID, msg []byte) { got = append(got, from.String()+":"+string(msg)) })
	var before, after, other error
	eps[0].PostAsync(2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}, func(err error) { before = err })
	if err := net.Deliver(net.Pending()[0]); err != nil || before != nil {
		t.Fatalf("before the fence: %v, %v", err, before)
	}
	eps[0].PostAsync(2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 10}}, func(err error) { after = err })
	if err := eps[0].Send(context.Background(), 2, []byte("late")); err != nil {
		t.Fatal(err)
	}
	eps[2].PostAsync(2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 100}}, func(err error) { other = err })
	eps[1].Fence(1)
	if !eps[1].Fences(1) || eps[1].Fences(3) {
		t.Fatalf("Fences(1)=%t Fences(3)=%t", eps[1].Fences(1), eps[1].Fences(3))
	}
	for _, d := range net.Pending() {
		if err := net.Deliver(d); err != nil {
			t.Fatal(err)
		}
	}
	if !errors.Is(after, rdma.ErrPeerUnreachable) || other != nil {
		t.Errorf("after the fence: fenced peer's batch %v, other peer's %v", after, other)
	}
	if w := rdma.LoadWord(reg.Bytes(), 0); w != 101 {
		t.Errorf("word %d, want 101 (the fenced batch unexecuted)", w)
	}
	if len(got) != 0 {
		t.Errorf("the fenced peer's message was handled: %v", got)
	}
}

// In immediate mode too, a fenced peer's batches fail unexecuted and its
// messages are dropped.
func TestImmediateFence(t *testing.T) {
	net := mem.NewNetwork()
	var eps []*mem.Endpoint
	for id := ids.NodeID(1); id <= 3; id++ {
		ep, err := net.Endpoint(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ep.Close() })
		eps = append(eps, ep)
	}
	reg := registerWords(t, eps[1])
	got := make(chan string, 4)
	eps[1].SetHandler(func(from ids.NodeID, msg []byte) { got <- string(msg) })
	ctx := context.Background()
	faa := func() error {
		return eps[0].Post(ctx, 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: reg.Descriptor().RKey, Operand: 1}})
	}
	if err := faa(); err != nil {
		t.Fatal(err)
	}
	if err := eps[0].Send(ctx, 2, []byte("before")); err != nil {
		t.Fatal(err)
	}
	if m := <-got; m != "before" {
		t.Fatalf("got %q", m)
	}
	eps[1].Fence(1)
	if err := faa(); !errors.Is(err, rdma.ErrPeerUnreachable) {
		t.Errorf("a fenced peer's batch: %v, want ErrPeerUnreachable", err)
	}
	if err := eps[0].Send(ctx, 2, []byte("after")); err != nil {
		t.Fatal(err)
	}
	// A message of another peer, handled in order after it.
	if err := eps[2].Send(ctx, 2, []byte("mark")); err != nil {
		t.Fatal(err)
	}
	if m := <-got; m != "mark" {
		t.Errorf("the fenced peer's message %q was handled", m)
	}
	if w := rdma.LoadWord(reg.Bytes(), 0); w != 1 {
		t.Errorf("word %d, want 1 (the fenced batch unexecuted)", w)
	}
}

// A blocking Post in manual mode waits for delivery and honours its
// context; a cancelled batch is never executed.
func TestManualPostContext(t *testing.T) {
	net, eps := manual(t, 2)
	reg := registerWords(t, eps[1])
	rk := reg.Descriptor().RKey
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := eps[0].Post(ctx, 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("undelivered Post: %v, want deadline exceeded", err)
	}
	if len(net.Pending()) != 0 {
		t.Error("cancelled batch is still queued")
	}
	done := make(chan error, 1)
	ops := []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 7}}
	go func() { done <- eps[0].Post(context.Background(), 2, ops) }()
	for len(net.Pending()) == 0 {
		time.Sleep(time.Millisecond)
	}
	net.Deliver(net.Pending()[0])
	if err := <-done; err != nil || rdma.LoadWord(reg.Bytes(), 0) != 7 {
		t.Errorf("delivered Post: err %v, word %d", err, rdma.LoadWord(reg.Bytes(), 0))
	}
}

func splitNet(t *testing.T, n int) (*mem.Network, []*mem.Endpoint) {
	t.Helper()
	return manual(t, n, mem.SplitReads())
}

func fill(b []byte, v byte) []byte {
	for i := range b {
		b[i] = v
	}
	return b
}

// With SplitReads a long READ sees the memory at two moments: its last 128
// bytes when its batch is delivered, the rest when the rest is, and a WRITE
// delivered between the two shows in the first part only. The results land
// in the ops as posted, and the completion runs once, after the rest.
func TestSplitReadsTwoMoments(t *testing.T) {
	net, eps := splitNet(t, 3)
	reg := registerWords(t, eps[1])
	rk := reg.Descriptor().RKey
	fill(reg.Bytes()[8:1024], 'a')
	rdma.StoreWord(reg.Bytes(), 0, 40)

	ops := []rdma.Op{
		{Kind: rdma.OpFAA, RKey: rk, Offset: 0, Operand: 2},
		{Kind: rdma.OpRead, RKey: rk, Offset: 0, Buf: make([]byte, 1024)},
		{Kind: rdma.OpRead, RKey: rk, Offset: 0, Buf: make([]byte, 8)},
	}
	calls := 0
	var got error
	eps[0].PostAsync(2, ops, func(err error) { calls++; got = err })
	first := net.Pending()[0]
	if err := net.Deliver(first); err != nil {
		t.Fatal(err)
	}
	p := net.Pending()
	if calls != 0 || len(p) != 1 {
		t.Fatalf("after the first part: %d completions, pending %v", calls, p)
	}
	r := p[0]
	if r.Continues != first.Seq || r.Seq == first.Seq || r.From != 1 || r.To != 2 || r.Kind != mem.BatchDelivery {
		t.Errorf("rest = %v, want the rest of #%d from n1 to n2", r, first.Seq)
	}
	if want := fmt.Sprintf("(rest of #%d)", first.Seq); !strings.Contains(r.String(), want) {
		t.Errorf("rest prints as %q, want it to say %q", r, want)
	}
	if len(r.Ops) != 2 || r.Ops[0].Kind != rdma.OpRead || r.Ops[0].Offset != 0 || len(r.Ops[0].Buf) != 1024-128 || len(r.Ops[1].Buf) != 8 {
		t.Errorf("rest ops = %v, want the first 896 bytes of the READ, then the word READ", r.Ops)
	}

	w := []rdma.Op{{Kind: rdma.OpWrite, RKey: rk, Offset: 8, Buf: fill(make([]byte, 1016), 'b')}}
	eps[2].PostAsync(2, w, func(error) {})
	for _, d := range net.Pending() {
		if d.From == 3 {
			net.Deliver(d)
		}
	}
	if err := net.Deliver(r); err != nil {
		t.Fatal(err)
	}
	if calls != 1 || got != nil || len(net.Pending()) != 0 {
		t.Fatalf("after the rest: %d completions, err %v, pending %v", calls, got, net.Pending())
	}
	if ops[0].Result != 40 || ops[0].Err != nil || ops[1].Err != nil || ops[2].Err != nil {
		t.Errorf("results in the posted ops: FAA %d err %v, READ errs %v, %v", ops[0].Result, ops[0].Err, ops[1].Err, ops[2].Err)
	}
	page := ops[1].Buf
	if rdma.LoadWord(page, 0) != 42 || !bytes.Equal(page[8:896], fill(make([]byte, 888), 'b')) || !bytes.Equal(page[896:], fill(make([]byte, 128), 'a')) {
		t.Errorf("READ = word %d, head %q..., tail %q..., want 42, the WRITE's bytes before 896, the old bytes after",
			rdma.LoadWord(page, 0), page[8:16], page[896:904])
	}
	if rdma.LoadWord(ops[2].Buf, 0) != 42 {
		t.Errorf("word READ = %d, want 42", rdma.LoadWord(ops[2].Buf, 0))
	}
}

// Every long READ of a batch is split, each rest naming the batch; a READ
// of one word (8 bytes) or less is not; a plain manual network splits only with
// DeliverSplit, and delivers a rest whole.
func TestSplitReadsEveryLongRead(t *testing.T) {
	net, eps := splitNet(t, 2)
	rk := registerWords(t, eps[1]).Descriptor().RKey
	ops := []rdma.Op{
		{Kind: rdma.OpRead, RKey: rk, Offset: 0, Buf: make([]byte, 8)},
		{Kind: rdma.OpRead, RKey: rk, Offset: 0, Buf: make([]byte, 17)},
		{Kind: rdma.OpRead, RKey: rk, Offset: 0, Buf: make([]byte, 300)},
	}
	done := false
	eps[0].PostAsync(2, ops, func(error) { done = true })
	first := net.Pending()[0].Seq
	var lens [][]int
	for i := 0; i < 5 && len(net.Pending()) > 0; i++ {
		d := net.Pending()[0]
		if i > 0 && d.Continues != first {
			t.Errorf("delivery %d is %v, want a rest of #%d", i, d, first)
		}
		var l []int
		for _, op := range d.Ops {
			l = append(l, len(op.Buf))
		}
		lens = append(lens, l)
		net.Deliver(d)
	}
	if want := [][]int{{8, 17, 300}, {9, 300}, {172}}; !done || fmt.Sprint(lens) != fmt.Sprint(want) {
		t.Errorf("deliveries had ops of %v bytes (done %t), want %v", lens, done, want)
	}

	net, eps = manual(t, 2)
	rk = registerWords(t, eps[1]).Descriptor().RKey
	ops = []rdma.Op{{Kind: rdma.OpRead, RKey: rk, Buf: make([]byte, 64)}, {Kind: rdma.OpRead, RKey: rk, Buf: make([]byte, 64)}}
	done = false
	eps[0].PostAsync(2, ops, func(error) { done = true })
	net.DeliverSplit(net.Pending()[0])
	if p := net.Pending(); done || len(p) != 1 || len(p[0].Ops) != 2 || len(p[0].Ops[0].Buf) != 32 {
		t.Fatalf("DeliverSplit left %v (done %t), want the rest of the first READ and the second", p, done)
	}
	net.Deliver(net.Pending()[0])
	if !done || len(net.Pending()) != 0 {
		t.Errorf("Deliver of a rest on a plain network: done %t, pending %v", done, net.Pending())
	}
}

// A READ that fails fails whole, at once, with an error that names it.
func TestSplitReadsFailingRead(t *testing.T) {
	net, eps := splitNet(t, 2)
	rk := registerWords(t, eps[1]).Descriptor().RKey
	ops := []rdma.Op{
		{Kind: rdma.OpRead, RKey: rk, Offset: 4000, Buf: make([]byte, 200)},
		{Kind: rdma.OpFAA, RKey: rk, Operand: 1},
	}
	var got error
	eps[0].PostAsync(2, ops, func(err error) { got = err })
	net.Deliver(net.Pending()[0])
	if !errors.Is(got, rdma.ErrOutOfBounds) || !strings.Contains(got.Error(), "[4000, +200)") || len(net.Pending()) != 0 ||
		!errors.Is(ops[1].Err, rdma.ErrFlushed) {
		t.Errorf("out-of-bounds READ: err %v, FAA err %v, pending %v", got, ops[1].Err, net.Pending())
	}
}

// A rest that is dropped or whose endpoint crashes fails the batch, of
// unknown outcome when an op other than a READ executed before it.
func TestSplitReadsRestFails(t *testing.T) {
	for _, tc := range []struct {
		name    string
		atomic  bool // a CAS before the READ
		fail    func(net *mem.Network, r *mem.Delivery)
		want    error
		unknown bool
	}{
		{"drop", false, func(net *mem.Network, r *mem.Delivery) { net.Drop(r) }, rdma.ErrPeerUnreachable, false},
		{"drop after CAS", true, func(net *mem.Network, r *mem.Delivery) { net.Drop(r) }, rdma.ErrPeerUnreachable, true},
		{"target crash", false, func(net *mem.Network, r *mem.Delivery) { net.Crash(2) }, rdma.ErrPeerUnreachable, false},
		{"target crash after CAS", true, func(net *mem.Network, r *mem.Delivery) { net.Crash(2) }, rdma.ErrPeerUnreachable, true},
		{"poster crash after CAS", true, func(net *mem.Network, r *mem.Delivery) { net.Crash(1) }, rdma.ErrClosed, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			net, eps := splitNet(t, 2)
			reg := registerWords(t, eps[1])
			rk := reg.Descriptor().RKey
			var ops []rdma.Op
			if tc.atomic {
				ops = append(ops, rdma.Op{Kind: rdma.OpCAS, RKey: rk, Offset: 8, Compare: 0, Operand: 9})
			}
			ops = append(ops, rdma.Op{Kind: rdma.OpRead, RKey: rk, Buf: make([]byte, 256)})
			calls := 0
			var got error
			eps[0].PostAsync(2, ops, func(err error) { calls++; got = err })
			net.Deliver(net.Pending()[0])
			if calls != 0 || len(net.Pending()) != 1 {
				t.Fatalf("first part: %d completions, pending %v", calls, net.Pending())
			}
			tc.fail(net, net.Pending()[0])
			if calls != 1 || !errors.Is(got, tc.want) || errors.Is(got, rdma.ErrOutcomeUnknown) != tc.unknown {
				t.Fatalf("%d completions, err %v; want %v, outcome unknown %t", calls, got, tc.want, tc.unknown)
			}
			if last := ops[len(ops)-1]; last.Err != got {
				t.Errorf("READ err %v, want the batch's", last.Err)
			}
			if tc.atomic && (ops[0].Err != nil || ops[0].Result != 0 || rdma.LoadWord(reg.Bytes(), 8) != 9) {
				t.Errorf("CAS executed before the rest: err %v, result %d, word %d", ops[0].Err, ops[0].Result, rdma.LoadWord(reg.Bytes(), 8))
			}
		})
	}
}

// An abandoned batch is reported unknown at once and executes later: not
// before it is delivered (another requester still sees the memory without
// it), and before any later batch of its requester to the same target; its
// READs land in copies, never in the requester's buffers. A dropped
// abandoned batch never executes.
func TestAbandonSettlesLate(t *testing.T) {
	net, eps := manual(t, 3)
	reg := registerWords(t, eps[2])
	rk := reg.Descriptor().RKey
	mine := make([]byte, 8)
	abandoned := []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Offset: 0, Operand: 5}, {Kind: rdma.OpRead, RKey: rk, Offset: 0, Buf: mine}}
	var got error
	calls := 0
	eps[0].PostAsync(3, abandoned, func(err error) { calls++; got = err })
	d := net.Pending()[0]
	if err := net.Abandon(d); err != nil {
		t.Fatal(err)
	}
	if calls != 1 || !errors.Is(got, rdma.ErrOutcomeUnknown) || !errors.Is(abandoned[0].Err, rdma.ErrOutcomeUnknown) {
		t.Fatalf("abandoned: %d completions, err %v, op err %v", calls, got, abandoned[0].Err)
	}
	if p := net.Pending(); len(p) != 1 || !p[0].Abandoned || rdma.LoadWord(reg.Bytes(), 0) != 0 {
		t.Fatalf("after Abandon: pending %v, word %d", p, rdma.LoadWord(reg.Bytes(), 0))
	}
	if err := net.Abandon(d); err == nil {
		t.Fatal("a batch abandoned twice")
	}

	// Another requester's READ delivered first sees the word without it.
	other := []rdma.Op{{Kind: rdma.OpRead, RKey: rk, Offset: 0, Buf: make([]byte, 8)}}
	eps[1].PostAsync(3, other, func(error) {})
	later := []rdma.Op{{Kind: rdma.OpRead, RKey: rk, Offset: 0, Buf: make([]byte, 8)}}
	eps[0].PostAsync(3, later, func(error) {})
	p := net.Pending()
	if err := net.Deliver(p[1]); err != nil {
		t.Fatal(err)
	}
	if v := rdma.LoadWord(other[0].Buf, 0); v != 0 {
		t.Fatalf("another requester saw %d before the abandoned FAA was delivered", v)
	}
	// The requester's own later READ executes the abandoned batch first.
	if err := net.Deliver(p[2]); err != nil {
		t.Fatal(err)
	}
	if v := rdma.LoadWord(later[0].Buf, 0); v != 5 || len(net.Pending()) != 0 || calls != 1 {
		t.Fatalf("the requester's later READ saw %d (pending %v, %d completions); want 5, the abandoned FAA first", v, net.Pending(), calls)
	}
	if !bytes.Equal(mine, make([]byte, 8)) {
		t.Fatalf("the abandoned READ wrote the requester's buffer: %x", mine)
	}

	// Dropped: never executes.
	eps[0].PostAsync(3, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Offset: 8, Operand: 1}}, func(error) {})
	d = net.Pending()[0]
	net.Abandon(d)
	net.Drop(d)
	eps[0].PostAsync(3, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Offset: 16, Operand: 1}}, func(error) {})
	net.Deliver(net.Pending()[0])
	if w := rdma.LoadWord(reg.Bytes(), 8); w != 0 || rdma.LoadWord(reg.Bytes(), 16) != 1 {
		t.Fatalf("a dropped abandoned FAA executed: word %d", w)
	}
}
