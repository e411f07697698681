//go:build ofi

package ofi

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsmkit/dsm/rdma"
)

// forge makes the initiator believe a wrong descriptor, so that the
// request reaches the provider, which is what these tests examine: the
// target's provider must refuse it, and the error must be classified. The
// forged descriptor keeps the fabric key the target granted the initiator
// (asked for on the first forge of a key), so the request names the
// registration's memory.
func forge(t *testing.T, a *Transport, key uint64, d remoteDesc) {
	t.Helper()
	p := a.peers[2]
	if granted[key] == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cur, err := a.query(ctx, p, key)
		if err != nil || cur.revoked || cur.key == 0 {
			t.Fatalf("query of key %#x: %+v %v", key, cur, err)
		}
		granted[key] = cur.key
	}
	d.key = granted[key]
	p.mu.Lock()
	p.descs[key] = d
	p.mu.Unlock()
}

// granted is the fabric key of each registration forge was asked about.
var granted = map[uint64]uint64{}

// TestProviderEnforces checks the second line of defence of the providers
// that check requests at the target (sockets, tcp;ofi_rxm): a request that
// passed the initiator's checks on a wrong descriptor is refused there and
// reported with the right sentinel.
func TestProviderEnforces(t *testing.T) {
	for _, prov := range []string{"sockets", "tcp;ofi_rxm"} {
		t.Run(prov, func(t *testing.T) {
			a, b := pair(t, prov)
			mem, err := rdma.Alloc(8192)
			if err != nil {
				t.Fatal(err)
			}
			defer rdma.Free(mem)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			ro, err := b.Register(mem[:4096], rdma.AccessRemoteRead)
			if err != nil {
				t.Fatal(err)
			}
			d := ro.Descriptor()
			forge(t, a, d.RKey.Key, remoteDesc{len: 8192, base: d.RKey.Base, acc: rdma.AccessAll})
			oob := []rdma.Op{{Kind: rdma.OpRead, RKey: d.RKey, Offset: 4096, Buf: make([]byte, 64)}}
			err = a.Post(ctx, 2, oob)
			t.Logf("out of bounds read: %v", err)
			if !errors.Is(err, rdma.ErrOutOfBounds) {
				t.Errorf("out of bounds read: %v", err)
			}
			forge(t, a, d.RKey.Key, remoteDesc{len: 4096, base: d.RKey.Base, acc: rdma.AccessAll})
			mem[0] = 7
			w := []rdma.Op{{Kind: rdma.OpWrite, RKey: d.RKey, Offset: 0, Buf: []byte{1, 2, 3, 4, 5, 6, 7, 8}}}
			err = a.Post(ctx, 2, w)
			t.Logf("write to read-only: %v (byte now %d)", err, mem[0])
			if !errors.Is(err, rdma.ErrAccessDenied) || mem[0] != 7 {
				t.Errorf("write to read-only: %v, byte %d", err, mem[0])
			}
			if err := ro.Deregister(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
			forge(t, a, d.RKey.Key, remoteDesc{len: 4096, base: d.RKey.Base, acc: rdma.AccessAll})
			r := []rdma.Op{{Kind: rdma.OpRead, RKey: d.RKey, Offset: 0, Buf: make([]byte, 8)}}
			err = a.Post(ctx, 2, r)
			t.Logf("read of revoked key: %v", err)
			if !errors.Is(err, rdma.ErrUnknownKey) {
				t.Errorf("read of revoked key: %v", err)
			}
		})
	}
}

// TestShmRefusedRequest pins down how shm treats a request that names a
// registration without the right (a forged descriptor, past the
// initiator's checks). An atomic goes through the target's progress, which
// refuses it: the memory is left alone, but shm never completes the
// request, so it fails with ErrPeerUnreachable after OpTimeout. A WRITE is
// done by cross-memory attach from the initiator (libfabric 1.17, see the
// package documentation, "Checks"): nothing at the target checks it, and it
// lands. Closing both endpoints afterwards is safe.
func TestShmRefusedRequest(t *testing.T) {
	a, b := pairCfg(t, Config{Provider: "shm", OpTimeout: 300 * time.Millisecond})
	mem, err := rdma.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer rdma.Free(mem)
	ro, err := b.Register(mem, rdma.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	d := ro.Descriptor()
	forge(t, a, d.RKey.Key, remoteDesc{len: 4096, base: d.RKey.Base, acc: rdma.AccessAll})
	mem[0] = 7
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := []rdma.Op{{Kind: rdma.OpFAA, RKey: d.RKey, Offset: 0, Operand: 1}}
	err = a.Post(ctx, 2, f)
	if !errors.Is(err, rdma.ErrPeerUnreachable) || mem[0] != 7 {
		t.Errorf("refused FAA: %v, byte %d; want ErrPeerUnreachable and 7", err, mem[0])
	}
	w := []rdma.Op{{Kind: rdma.OpWrite, RKey: d.RKey, Offset: 64, Buf: []byte{1, 2, 3, 4, 5, 6, 7, 8}}}
	err = a.Post(ctx, 2, w)
	switch {
	case a.fastWrite && a.peers[2].dc == 0:
		if err != nil || mem[64] != 1 {
			t.Errorf("WRITE by cross-memory attach: %v, byte %d; want it done (the target checks nothing)", err, mem[64])
		}
	case !errors.Is(err, rdma.ErrPeerUnreachable) || mem[64] != 0:
		t.Errorf("refused delivery-complete WRITE: %v, byte %d; want ErrPeerUnreachable and 0", err, mem[64])
	}
	a.Close()
	b.Close()
}
