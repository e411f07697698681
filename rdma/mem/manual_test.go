package mem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/mem"
)

func manual(t *testing.T, n int) (*mem.Network, []*mem.Endpoint) {
	t.Helper()
	net := mem.NewNetwork(mem.Manual())
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
