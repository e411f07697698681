//go:build ofi

package ofi

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// TestNonceIsPerIncarnation: every endpoint draws its own non-zero nonce,
// and requested memory keys start at a point drawn from it.
func TestNonceIsPerIncarnation(t *testing.T) {
	a, b := pair(t, "sockets")
	if a.Nonce() == 0 || b.Nonce() == 0 || a.Nonce() == b.Nonce() {
		t.Errorf("nonces %#x and %#x: want two distinct non-zero ones", a.Nonce(), b.Nonce())
	}
	if k := firstKey(0xffff_ffff_ffff_ffff, 8); k >= 1<<61 || k&0xffff != 0 {
		t.Errorf("firstKey of an 8-byte key space: %#x", k)
	}
	if k := firstKey(0xffff_ffff, 4); k >= 1<<31 {
		t.Errorf("firstKey of a 4-byte key space: %#x", k)
	}
	if k := firstKey(0xffff, 2); k != 0 {
		t.Errorf("firstKey of a 2-byte key space: %#x, want 0", k)
	}
}

// TestExpectNonceFencesARestartedPeer restarts a peer at the same fabric
// address (the socket providers name an endpoint by its host and port):
// an initiator that still expects the old incarnation must not touch the
// new process's memory, neither with the old descriptor it cached nor
// after asking again, and learns of the restart from the first frame of
// the new process. Once the new nonce is expected, it is reached.
func TestExpectNonceFencesARestartedPeer(t *testing.T) {
	for _, prov := range []string{"sockets", "tcp;ofi_rxm"} {
		t.Run(prov, func(t *testing.T) { testExpectNonce(t, prov) })
	}
}

func testExpectNonce(t *testing.T, prov string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := Config{Provider: prov, OpTimeout: 2 * time.Second}
	a, err := Listen(1, "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	b, err := Listen(2, addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.AddPeer(2, b.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := b.AddPeer(1, a.Addr()); err != nil {
		t.Fatal(err)
	}
	a.ExpectNonce(2, b.Nonce())
	mem1, err := rdma.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer rdma.Free(mem1)
	reg1, err := b.Register(mem1, rdma.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	old := reg1.Descriptor()
	faa := func(rk rdma.RKey) error {
		return a.Post(ctx, 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}})
	}
	if err := faa(old.RKey); err != nil {
		t.Fatalf("FAA on the first incarnation: %v", err)
	}
	if got := rdma.LoadWord(mem1, 0); got != 1 {
		t.Fatalf("first incarnation's word %d, want 1", got)
	}
	a.peers[2].mu.RLock()
	oldGrant := a.peers[2].descs[old.RKey.Key].key // the key the old process granted a
	a.peers[2].mu.RUnlock()

	// The peer restarts at the same address and registers memory.
	b.Close()
	b2, err := Listen(2, addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if b2.Addr() != b.Addr() {
		t.Fatalf("the restarted endpoint has another address (%s, was %s): the test needs the same", b2.Addr(), b.Addr())
	}
	if err := b2.AddPeer(1, a.Addr()); err != nil {
		t.Fatal(err)
	}
	mem2, err := rdma.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer rdma.Free(mem2)
	reg2, err := b2.Register(mem2, rdma.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	if reg2.Descriptor().RKey.Key == old.RKey.Key {
		t.Errorf("the new incarnation registered under the old key %#x", old.RKey.Key)
	}

	// The old incarnation said bye; a frame of the new one makes the
	// peer reachable again, and shows its nonce.
	got := make(chan []byte, 1)
	a.SetHandler(func(_ ids.NodeID, msg []byte) { got <- msg })
	if err := b2.Send(ctx, 1, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-ctx.Done():
		t.Fatal("the new incarnation's message never arrived")
	}
	for _, rk := range []rdma.RKey{old.RKey, reg2.Descriptor().RKey} {
		if err := faa(rk); !errors.Is(err, rdma.ErrIncarnation) || errors.Is(err, rdma.ErrOutcomeUnknown) {
			t.Errorf("FAA with key %#x while the old incarnation is expected: %v, want ErrIncarnation, not sent", rk.Key, err)
		}
	}
	if err := a.Send(ctx, 2, []byte("x")); !errors.Is(err, rdma.ErrIncarnation) {
		t.Errorf("Send while the old incarnation is expected: %v, want ErrIncarnation", err)
	}
	if w := rdma.LoadWord(mem2, 0); w != 0 {
		t.Fatalf("the new incarnation's word is %d: an operation meant for the old one executed", w)
	}

	// An initiator that has not heard from the new process yet, and
	// still holds the old one's descriptor, reaches the new process with
	// the old key: the provider refuses it (keys differ per incarnation),
	// and the question that follows meets the new incarnation.
	p := a.peers[2]
	p.seen.Store(0)
	p.mu.Lock()
	p.descs[old.RKey.Key] = remoteDesc{len: old.Len, base: old.RKey.Base, acc: old.Access, key: oldGrant}
	p.mu.Unlock()
	if err := faa(old.RKey); !errors.Is(err, rdma.ErrIncarnation) {
		t.Errorf("FAA with the old incarnation's cached descriptor: %v, want ErrIncarnation", err)
	}
	if w := rdma.LoadWord(mem2, 0); w != 0 {
		t.Fatalf("the new incarnation's word is %d: the old key reached its memory", w)
	}

	// A message of an initiator that expects the old incarnation of this
	// node is dropped by the new one.
	b2got := make(chan []byte, 1)
	b2.SetHandler(func(_ ids.NodeID, msg []byte) { b2got <- msg })
	p.seen.Store(0) // as if a had not heard from the new process yet
	if err := a.Send(ctx, 2, []byte("stale")); err != nil {
		t.Fatalf("Send that the initiator cannot refuse: %v", err)
	}
	select {
	case m := <-b2got:
		t.Errorf("the new incarnation received %q, meant for the old one", m)
	case <-time.After(300 * time.Millisecond):
	}

	// Once the directory names the new incarnation, it is reached.
	a.ExpectNonce(2, b2.Nonce())
	if err := faa(reg2.Descriptor().RKey); err != nil {
		t.Fatalf("FAA once the new incarnation is expected: %v", err)
	}
	if w := rdma.LoadWord(mem2, 0); w != 1 {
		t.Errorf("new incarnation's word %d, want 1", w)
	}
	if err := a.Send(ctx, 2, []byte("now")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-b2got:
		if string(m) != "now" {
			t.Errorf("new incarnation received %q", m)
		}
	case <-ctx.Done():
		t.Fatal("message to the expected incarnation never arrived")
	}
	reg2.Deregister()
}
