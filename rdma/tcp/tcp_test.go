package tcp_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/tcp"
)

const hang = 30 * time.Second

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	t.Cleanup(cancel)
	return ctx
}

func listen(t *testing.T, id ids.NodeID, addr string) *tcp.Transport {
	t.Helper()
	tr, err := tcp.Listen(id, addr, tcp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func register(t *testing.T, tr rdma.Transport, size int) rdma.Registration {
	t.Helper()
	mem, err := rdma.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := tr.Register(mem, rdma.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		reg.Deregister()
		rdma.Free(mem)
	})
	return reg
}

func TestListenAndAddPeerValidate(t *testing.T) {
	if _, err := tcp.Listen(ids.None, "127.0.0.1:0", tcp.Config{}); err == nil {
		t.Error("Listen with node id 0 succeeded")
	}
	if _, err := tcp.Listen(1, "127.0.0.1:notaport", tcp.Config{}); err == nil {
		t.Error("Listen on a bad address succeeded")
	}
	tr := listen(t, 1, "127.0.0.1:0")
	if err := tr.AddPeer(2, "no port"); err == nil {
		t.Error("AddPeer with a bad address succeeded")
	}
	if err := tr.AddPeer(0, "127.0.0.1:1"); err == nil {
		t.Error("AddPeer of node 0 succeeded")
	}
}

// Each transport is its own incarnation: a non-zero nonce, another one for
// another Listen of the same node id.
func TestNonceIsPerIncarnation(t *testing.T) {
	a := listen(t, 1, "127.0.0.1:0")
	b := listen(t, 1, "127.0.0.1:0")
	if a.Nonce() == 0 || b.Nonce() == 0 || a.Nonce() == b.Nonce() {
		t.Errorf("nonces %#x and %#x: want two distinct non-zero ones", a.Nonce(), b.Nonce())
	}
}

// A peer that restarts on the same address is reached again: the broken
// connection fails what was on it, and a later operation connects anew.
func TestReconnectAfterRestart(t *testing.T) {
	a := listen(t, 1, "127.0.0.1:0")
	b := listen(t, 2, "127.0.0.1:0")
	addr := b.Addr()
	a.AddPeer(2, addr)
	reg := register(t, b, 4096)
	op := []rdma.Op{{Kind: rdma.OpFAA, RKey: reg.Descriptor().RKey, Operand: 1}}
	if err := a.Post(ctxT(t), 2, op); err != nil {
		t.Fatal(err)
	}
	b.Close()

	b2 := listen(t, 2, addr)
	reg2 := register(t, b2, 4096)
	copy(reg2.Bytes(), "restarted")
	// The first Post may still meet the old connection and fail; a
	// following one must reach the new listener.
	var err error
	for i := 0; i < 2; i++ {
		op := []rdma.Op{{Kind: rdma.OpRead, RKey: reg2.Descriptor().RKey, Buf: make([]byte, 9)}}
		if err = a.Post(ctxT(t), 2, op); err == nil {
			if string(op[0].Buf) != "restarted" {
				t.Fatalf("READ after restart = %q", op[0].Buf)
			}
			break
		}
		if !errors.Is(err, rdma.ErrPeerUnreachable) {
			t.Fatalf("Post across a restart: %v, want ErrPeerUnreachable or success", err)
		}
	}
	if err != nil {
		t.Fatalf("no Post reached the restarted peer: %v", err)
	}
}

// A peer restarted on the same address, with the same registration key as
// its previous process, is not reached while this node expects the
// previous incarnation: the old descriptor cannot touch the new process's
// memory. Once the new nonce is expected, it is reached.
func TestExpectNonceFencesARestartedPeer(t *testing.T) {
	a := listen(t, 1, "127.0.0.1:0")
	b := listen(t, 2, "127.0.0.1:0")
	addr := b.Addr()
	a.AddPeer(2, addr)
	a.ExpectNonce(2, b.Nonce())
	reg := register(t, b, 4096)
	old := reg.Descriptor().RKey
	if err := a.Post(ctxT(t), 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: old, Operand: 1}}); err != nil {
		t.Fatal(err)
	}
	b.Close()

	b2 := listen(t, 2, addr)
	reg2 := register(t, b2, 4096)
	if reg2.Descriptor().RKey != old {
		t.Logf("the new process's key %v differs from the old %v; the check holds either way", reg2.Descriptor().RKey, old)
	}
	for i := 0; i < 3; i++ {
		op := []rdma.Op{{Kind: rdma.OpFAA, RKey: old, Operand: 1}}
		err := a.Post(ctxT(t), 2, op)
		if err == nil {
			t.Fatalf("a FAA with the old incarnation's key executed on the restarted peer")
		}
		// The first may have been written to the old process's dying
		// connection (outcome unknown); the next ones are refused unsent.
		if i > 0 && (!errors.Is(err, rdma.ErrIncarnation) || errors.Is(err, rdma.ErrOutcomeUnknown)) {
			t.Fatalf("Post to the restarted peer: %v, want ErrIncarnation, not sent", err)
		}
		if err := a.Send(ctxT(t), 2, []byte("x")); err == nil || i > 0 && !errors.Is(err, rdma.ErrIncarnation) {
			t.Fatalf("Send to the restarted peer: %v, want ErrIncarnation", err)
		}
	}
	if got := binary.LittleEndian.Uint64(reg2.Bytes()); got != 0 {
		t.Fatalf("the restarted peer's word is %d: an operation meant for the old process executed", got)
	}
	a.ExpectNonce(2, b2.Nonce())
	if err := a.Post(ctxT(t), 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: reg2.Descriptor().RKey, Operand: 5}}); err != nil {
		t.Fatalf("Post once the new incarnation is expected: %v", err)
	}
	if got := binary.LittleEndian.Uint64(reg2.Bytes()); got != 5 {
		t.Fatalf("word = %d, want 5", got)
	}
}

// An address where nobody listens fails promptly with ErrPeerUnreachable.
func TestUnreachableAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	a := listen(t, 1, "127.0.0.1:0")
	a.AddPeer(2, addr)
	err = a.Post(ctxT(t), 2, []rdma.Op{{Kind: rdma.OpFAA}})
	var pe *rdma.PeerError
	if !errors.Is(err, rdma.ErrPeerUnreachable) || !errors.As(err, &pe) || pe.Peer != 2 {
		t.Fatalf("Post = %v, want PeerError(n2, ErrPeerUnreachable)", err)
	}
	if err := a.Send(ctxT(t), 2, []byte("x")); !errors.Is(err, rdma.ErrPeerUnreachable) {
		t.Fatalf("Send = %v, want ErrPeerUnreachable", err)
	}
}

func TestRemovePeer(t *testing.T) {
	a := listen(t, 1, "127.0.0.1:0")
	b := listen(t, 2, "127.0.0.1:0")
	a.AddPeer(2, b.Addr())
	reg := register(t, b, 4096)
	op := []rdma.Op{{Kind: rdma.OpFAA, RKey: reg.Descriptor().RKey, Operand: 1}}
	if err := a.Post(ctxT(t), 2, op); err != nil {
		t.Fatal(err)
	}
	a.RemovePeer(2)
	if err := a.Post(ctxT(t), 2, op); !errors.Is(err, rdma.ErrUnknownPeer) {
		t.Errorf("Post after RemovePeer: %v, want ErrUnknownPeer", err)
	}
	a.AddPeer(2, b.Addr())
	if err := a.Post(ctxT(t), 2, op); err != nil {
		t.Errorf("Post after AddPeer again: %v", err)
	}
	if got := rdma.LoadWord(reg.Bytes(), 0); got != 2 {
		t.Errorf("counter %d, want 2", got)
	}
}

// Messages to the local node reach the local handler; messages follow the
// operations posted before them on the same connection.
func TestSendOrderWithPosts(t *testing.T) {
	a := listen(t, 1, "127.0.0.1:0")
	b := listen(t, 2, "127.0.0.1:0")
	a.AddPeer(2, b.Addr())
	reg := register(t, b, 4096)
	got := make(chan string, 100)
	b.SetHandler(func(from ids.NodeID, msg []byte) {
		// The WRITE posted before the message has executed.
		got <- fmt.Sprintf("%v %s %s", from, msg, reg.Bytes()[:len(msg)])
	})
	for i := 0; i < 20; i++ {
		m := []byte(fmt.Sprintf("m%02d", i))
		if err := a.Post(ctxT(t), 2, []rdma.Op{{Kind: rdma.OpWrite, RKey: reg.Descriptor().RKey, Buf: m}}); err != nil {
			t.Fatal(err)
		}
		if err := a.Send(ctxT(t), 2, m); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 20; i++ {
		select {
		case g := <-got:
			if want := fmt.Sprintf("n1 m%02d m%02d", i, i); g != want {
				t.Fatalf("message %d: %q, want %q", i, g, want)
			}
		case <-time.After(hang):
			t.Fatal("message lost")
		}
	}
	self := make(chan string, 1)
	a.SetHandler(func(from ids.NodeID, msg []byte) { self <- fmt.Sprintf("%v %s", from, msg) })
	buf := []byte("to myself")
	if err := a.Send(ctxT(t), 1, buf); err != nil {
		t.Fatal(err)
	}
	copy(buf, "XXXXXXXXX") // the handler owns its own copy
	if g := <-self; g != "n1 to myself" {
		t.Errorf("local message %q", g)
	}
}

// Batches that move more than the per-batch limit are refused before
// sending with ErrTooLarge.
func TestBatchByteLimit(t *testing.T) {
	a := listen(t, 1, "127.0.0.1:0")
	b := listen(t, 2, "127.0.0.1:0")
	a.AddPeer(2, b.Addr())
	big := make([]byte, rdma.MaxTransfer)
	ops := make([]rdma.Op, 17)
	for i := range ops {
		ops[i] = rdma.Op{Kind: rdma.OpWrite, RKey: rdma.RKey{Key: 1}, Buf: big}
	}
	if err := a.Post(ctxT(t), 2, ops); !errors.Is(err, rdma.ErrTooLarge) {
		t.Errorf("%d x 4 MiB WRITE: %v, want ErrTooLarge", len(ops), err)
	}
	for i := range ops {
		ops[i].Kind = rdma.OpRead
	}
	if err := a.Post(ctxT(t), 2, ops); !errors.Is(err, rdma.ErrTooLarge) {
		t.Errorf("%d x 4 MiB READ: %v, want ErrTooLarge", len(ops), err)
	}
}

// Many goroutines share one connection; every READ gets its own data.
func TestConcurrentReadsDistinct(t *testing.T) {
	a := listen(t, 1, "127.0.0.1:0")
	b := listen(t, 2, "127.0.0.1:0")
	a.AddPeer(2, b.Addr())
	const workers, iters, size = 16, 50, 1 << 12
	reg := register(t, b, workers*size)
	for w := 0; w < workers; w++ {
		for i := 0; i < size; i++ {
			reg.Bytes()[w*size+i] = byte(w*31 + i)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < iters; i++ {
				n := 1 + (i*97+w)%size
				op := []rdma.Op{{Kind: rdma.OpRead, RKey: reg.Descriptor().RKey, Offset: uint64(w * size), Buf: make([]byte, n)}}
				if err := a.Post(ctxT(t), 2, op); err != nil {
					errs <- err
					return
				}
				for j, c := range op[0].Buf {
					if c != byte(w*31+j) {
						errs <- fmt.Errorf("worker %d: byte %d of a %d-byte READ is %d", w, j, n, c)
						return
					}
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestFenceRefusesADepartedIncarnation: once b fences a's incarnation, no
// batch of it executes at b, on the connection it had or on a new one, and
// the refusal says so; another incarnation of the same node is served.
func TestFenceRefusesADepartedIncarnation(t *testing.T) {
	a := listen(t, 1, "127.0.0.1:0")
	b := listen(t, 2, "127.0.0.1:0")
	a.AddPeer(2, b.Addr())
	reg := register(t, b, 4096)
	op := []rdma.Op{{Kind: rdma.OpFAA, RKey: reg.Descriptor().RKey, Operand: 1}}
	if err := a.Post(ctxT(t), 2, op); err != nil {
		t.Fatal(err)
	}
	b.Fence(1, a.Nonce())
	for i := 0; i < 3; i++ {
		err := a.Post(ctxT(t), 2, op)
		if err == nil {
			t.Fatal("a batch of a fenced incarnation executed")
		}
		if i > 0 && (errors.Is(err, rdma.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "departed the cluster")) {
			t.Fatalf("Post of a fenced incarnation: %v, want a refused handshake that says why", err)
		}
	}
	if got := rdma.LoadWord(reg.Bytes(), 0); got != 1 {
		t.Fatalf("counter %d, want 1: a batch of the fenced incarnation executed", got)
	}
	a2 := listen(t, 1, "127.0.0.1:0")
	a2.AddPeer(2, b.Addr())
	if err := a2.Post(ctxT(t), 2, op); err != nil {
		t.Fatalf("another incarnation of node 1: %v", err)
	}
	if got := rdma.LoadWord(reg.Bytes(), 0); got != 2 {
		t.Fatalf("counter %d, want 2", got)
	}
}
