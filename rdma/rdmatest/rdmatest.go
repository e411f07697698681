// Package rdmatest is the conformance suite that every backend of the verbs
// transport passes: the semantics of each operation, ordering within a
// batch, exact totals under concurrent atomics from many goroutines and
// peers, the error reported for each kind of bad request (with the target's
// memory left intact), messages, dead peers and closing, and that a failed
// batch executed only when its error wraps rdma.ErrOutcomeUnknown (or is a
// context error).
//
// A backend's test calls Run with a constructor of connected endpoints:
//
//	func TestConformance(t *testing.T) {
//		rdmatest.Run(t, rdmatest.Backend{Name: "tcp", New: newCluster})
//	}
package rdmatest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// Backend describes a backend under test.
type Backend struct {
	Name string
	// New returns n endpoints with node ids 1..n, each of which already
	// knows the address of every other (AddPeer). The suite closes them;
	// Close must be idempotent.
	New func(t testing.TB, n int) []rdma.Transport
}

// hang bounds every wait of the suite: an operation that has not completed
// by then is hung, which is a failure whatever the machine's load.
const hang = 30 * time.Second

// Run runs the whole suite as subtests of t.
func Run(t *testing.T, b Backend) {
	tests := []struct {
		name string
		fn   func(t *testing.T, b Backend)
	}{
		{"Register", testRegister},
		{"ReadWrite", testReadWrite},
		{"Atomics", testAtomics},
		{"Local", testLocal},
		{"BatchOrder", testBatchOrder},
		{"ConcurrentAtomics", testConcurrentAtomics},
		{"BadRequests", testBadRequests},
		{"Deregister", testDeregister},
		{"Messages", testMessages},
		{"UnknownPeer", testUnknownPeer},
		{"DeadPeer", testDeadPeer},
		{"DeadPeerMidBatch", testDeadPeerMidBatch},
		{"DeadPeerOutcome", testDeadPeerOutcome},
		{"Context", testContext},
		{"Closed", testClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, b) })
	}
}

func cluster(t *testing.T, b Backend, n int) []rdma.Transport {
	t.Helper()
	ts := b.New(t, n)
	if len(ts) != n {
		t.Fatalf("%s: New(%d) returned %d endpoints", b.Name, n, len(ts))
	}
	for i, tr := range ts {
		if got, want := tr.LocalID(), ids.NodeID(i+1); got != want {
			t.Fatalf("endpoint %d has id %v, want %v", i, got, want)
		}
	}
	t.Cleanup(func() {
		for _, tr := range ts {
			if err := tr.Close(); err != nil {
				t.Errorf("close %v: %v", tr.LocalID(), err)
			}
		}
	})
	return ts
}

// register exposes size bytes of fresh off-heap memory at tr.
func register(t *testing.T, tr rdma.Transport, size int, acc rdma.Access) rdma.Registration {
	t.Helper()
	mem, err := rdma.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := tr.Register(mem, acc)
	if err != nil {
		rdma.Free(mem)
		t.Fatalf("register %d bytes: %v", size, err)
	}
	t.Cleanup(func() {
		// A closed transport may already have dropped the registration.
		_ = reg.Deregister()
		rdma.Free(mem)
	})
	return reg
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	t.Cleanup(cancel)
	return ctx
}

func post(t *testing.T, tr rdma.Transport, peer ids.NodeID, ops ...rdma.Op) []rdma.Op {
	t.Helper()
	if err := tr.Post(ctxT(t), peer, ops); err != nil {
		t.Fatalf("post to %v: %v", peer, err)
	}
	return ops
}

func read(rk rdma.RKey, off uint64, n int) rdma.Op {
	return rdma.Op{Kind: rdma.OpRead, RKey: rk, Offset: off, Buf: make([]byte, n)}
}

func write(rk rdma.RKey, off uint64, data []byte) rdma.Op {
	return rdma.Op{Kind: rdma.OpWrite, RKey: rk, Offset: off, Buf: data}
}

func cas(rk rdma.RKey, off, cmp, nv uint64) rdma.Op {
	return rdma.Op{Kind: rdma.OpCAS, RKey: rk, Offset: off, Compare: cmp, Operand: nv}
}

func faa(rk rdma.RKey, off, add uint64) rdma.Op {
	return rdma.Op{Kind: rdma.OpFAA, RKey: rk, Offset: off, Operand: add}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func testRegister(t *testing.T, b Backend) {
	ts := cluster(t, b, 1)
	r1 := register(t, ts[0], 8192, rdma.AccessAll)
	r2 := register(t, ts[0], 4096, rdma.AccessRemoteRead)
	d1, d2 := r1.Descriptor(), r2.Descriptor()
	if d1.Node != ts[0].LocalID() || d1.Len != 8192 || d1.Access != rdma.AccessAll {
		t.Errorf("descriptor %v: want node %v, 8192 bytes, all rights", d1, ts[0].LocalID())
	}
	if d2.Len != 4096 || d2.Access != rdma.AccessRemoteRead {
		t.Errorf("descriptor %v: want 4096 bytes, read only", d2)
	}
	if d1.RKey == d2.RKey {
		t.Errorf("two registrations share the key %+v", d1.RKey)
	}
	if len(r1.Bytes()) != 8192 {
		t.Errorf("Bytes() has %d bytes, want 8192", len(r1.Bytes()))
	}
	if _, err := ts[0].Register(nil, rdma.AccessAll); err == nil {
		t.Error("registering empty memory succeeded")
	}
}

func testReadWrite(t *testing.T, b Backend) {
	ts := cluster(t, b, 2)
	const size = 3 << 20
	reg := register(t, ts[1], size, rdma.AccessAll)
	rk := reg.Descriptor().RKey
	for _, c := range []struct {
		off uint64
		n   int
	}{{0, 1}, {0, 4096}, {4096, 4096}, {123, 777}, {size - 5, 5}, {0, 2 << 20}, {size, 0}} {
		data := pattern(c.n, byte(c.off))
		post(t, ts[0], 2, write(rk, c.off, data))
		if got := reg.Bytes()[c.off : c.off+uint64(c.n)]; !bytes.Equal(got, data) {
			t.Fatalf("WRITE [%d,+%d): target memory differs", c.off, c.n)
		}
		ops := post(t, ts[0], 2, read(rk, c.off, c.n))
		if !bytes.Equal(ops[0].Buf, data) {
			t.Fatalf("READ [%d,+%d) returned other bytes than written", c.off, c.n)
		}
	}
	// The target's own stores are visible to remote reads.
	copy(reg.Bytes()[8192:], "written by the owner")
	ops := post(t, ts[0], 2, read(rk, 8192, 20))
	if string(ops[0].Buf) != "written by the owner" {
		t.Errorf("READ of owner's store = %q", ops[0].Buf)
	}
}

func testAtomics(t *testing.T, b Backend) {
	ts := cluster(t, b, 2)
	reg := register(t, ts[1], 4096, rdma.AccessAll)
	rk := reg.Descriptor().RKey
	mem := reg.Bytes()
	rdma.StoreWord(mem, 64, 41)

	ops := post(t, ts[0], 2, cas(rk, 64, 41, 42))
	if ops[0].Result != 41 || rdma.LoadWord(mem, 64) != 42 {
		t.Errorf("successful CAS: result %d word %d, want 41 and 42", ops[0].Result, rdma.LoadWord(mem, 64))
	}
	ops = post(t, ts[0], 2, cas(rk, 64, 41, 99))
	if ops[0].Result != 42 || rdma.LoadWord(mem, 64) != 42 {
		t.Errorf("failed CAS: result %d word %d, want 42 and 42", ops[0].Result, rdma.LoadWord(mem, 64))
	}
	ops = post(t, ts[0], 2, faa(rk, 64, 8))
	if ops[0].Result != 42 || rdma.LoadWord(mem, 64) != 50 {
		t.Errorf("FAA: result %d word %d, want 42 and 50", ops[0].Result, rdma.LoadWord(mem, 64))
	}
	ops = post(t, ts[0], 2, faa(rk, 64, ^uint64(0))) // add -1: wraps
	if ops[0].Result != 50 || rdma.LoadWord(mem, 64) != 49 {
		t.Errorf("FAA -1: result %d word %d, want 50 and 49", ops[0].Result, rdma.LoadWord(mem, 64))
	}
	// Word bytes are the host's order: a READ sees what LoadWord sees.
	ops = post(t, ts[0], 2, read(rk, 64, 8))
	if got := binary.NativeEndian.Uint64(ops[0].Buf); got != 49 {
		t.Errorf("READ of word = %d, want 49", got)
	}
	// Last word of the registration.
	post(t, ts[0], 2, faa(rk, 4088, 5))
	if rdma.LoadWord(mem, 4088) != 5 {
		t.Errorf("FAA on the last word: %d", rdma.LoadWord(mem, 4088))
	}
}

func testLocal(t *testing.T, b Backend) {
	ts := cluster(t, b, 1)
	reg := register(t, ts[0], 4096, rdma.AccessAll)
	rk := reg.Descriptor().RKey
	ops := post(t, ts[0], 1,
		write(rk, 0, []byte("self")),
		faa(rk, 8, 3),
		cas(rk, 8, 3, 4),
		read(rk, 0, 4))
	if string(ops[3].Buf) != "self" || ops[2].Result != 3 || rdma.LoadWord(reg.Bytes(), 8) != 4 {
		t.Errorf("local batch: read %q, CAS result %d, word %d", ops[3].Buf, ops[2].Result, rdma.LoadWord(reg.Bytes(), 8))
	}
}

func testBatchOrder(t *testing.T, b Backend) {
	ts := cluster(t, b, 2)
	reg := register(t, ts[1], 8192, rdma.AccessAll)
	rk := reg.Descriptor().RKey
	one := make([]byte, 8)
	binary.NativeEndian.PutUint64(one, 1)
	ops := post(t, ts[0], 2,
		write(rk, 0, one),
		read(rk, 0, 8),
		faa(rk, 0, 10),
		read(rk, 0, 8),
		cas(rk, 0, 11, 100),
		read(rk, 0, 8),
		write(rk, 4096, pattern(4096, 9)),
		read(rk, 4096, 4096),
	)
	steps := []uint64{
		binary.NativeEndian.Uint64(ops[1].Buf), ops[2].Result,
		binary.NativeEndian.Uint64(ops[3].Buf), ops[4].Result,
		binary.NativeEndian.Uint64(ops[5].Buf),
	}
	if fmt.Sprint(steps) != fmt.Sprint([]uint64{1, 1, 11, 11, 100}) {
		t.Errorf("batch executed out of order: observed %v, want [1 1 11 11 100]", steps)
	}
	if !bytes.Equal(ops[7].Buf, pattern(4096, 9)) {
		t.Error("READ after WRITE in one batch did not see the write")
	}
	for i := range ops {
		if ops[i].Err != nil {
			t.Errorf("op %d: %v", i, ops[i].Err)
		}
	}
}

func testConcurrentAtomics(t *testing.T, b Backend) {
	const peers, workers, iters = 3, 4, 200
	ts := cluster(t, b, peers+1)
	home := ts[peers]
	reg := register(t, home, 4096, rdma.AccessAll)
	rk := reg.Descriptor().RKey
	var wg sync.WaitGroup
	errs := make(chan error, peers*workers*2)
	for p := 0; p < peers+1; p++ { // the home takes part too
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(tr rdma.Transport) {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), hang)
				defer cancel()
				target := home.LocalID()
				for i := 0; i < iters; i++ {
					// One FAA increment of word 0.
					op := []rdma.Op{faa(rk, 0, 1)}
					if err := tr.Post(ctx, target, op); err != nil {
						errs <- err
						return
					}
					// One CAS-loop increment of word 8.
					old := uint64(0)
					for {
						op := []rdma.Op{cas(rk, 8, old, old+1)}
						if err := tr.Post(ctx, target, op); err != nil {
							errs <- err
							return
						}
						if op[0].Result == old {
							break
						}
						old = op[0].Result
					}
				}
			}(ts[p])
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := uint64((peers + 1) * workers * iters)
	if got := rdma.LoadWord(reg.Bytes(), 0); got != want {
		t.Errorf("FAA total %d, want %d", got, want)
	}
	if got := rdma.LoadWord(reg.Bytes(), 8); got != want {
		t.Errorf("CAS total %d, want %d", got, want)
	}
}

func testBadRequests(t *testing.T, b Backend) {
	ts := cluster(t, b, 2)
	const size = 8192
	full := register(t, ts[1], size, rdma.AccessAll)
	ro := register(t, ts[1], 4096, rdma.AccessRemoteRead)
	wo := register(t, ts[1], 4096, rdma.AccessRemoteWrite)
	rk := full.Descriptor().RKey
	bogus := rdma.RKey{Key: 0xdead_beef_0bad_cafe, Base: rk.Base}

	// Fill the memory so that any stray write shows.
	for _, r := range []rdma.Registration{full, ro, wo} {
		copy(r.Bytes(), pattern(len(r.Bytes()), 0x5a))
	}
	snapshot := func() [][]byte {
		return [][]byte{bytes.Clone(full.Bytes()), bytes.Clone(ro.Bytes()), bytes.Clone(wo.Bytes())}
	}
	before := snapshot()

	cases := []struct {
		name string
		op   rdma.Op
		want error
	}{
		{"unknown key", write(bogus, 0, []byte("x")), rdma.ErrUnknownKey},
		{"offset past end", write(rk, size+1, []byte("x")), rdma.ErrOutOfBounds},
		{"length past end", write(rk, size-3, []byte("abcd")), rdma.ErrOutOfBounds},
		{"read past end", read(rk, size-1, 2), rdma.ErrOutOfBounds},
		{"offset overflow", write(rk, ^uint64(0)-1, []byte("abcd")), rdma.ErrOutOfBounds},
		{"atomic past end", faa(rk, size, 1), rdma.ErrOutOfBounds},
		{"misaligned CAS", cas(rk, 4, 0, 1), rdma.ErrMisaligned},
		{"misaligned FAA", faa(rk, 9, 1), rdma.ErrMisaligned},
		{"write to read-only", write(ro.Descriptor().RKey, 0, []byte("x")), rdma.ErrAccessDenied},
		{"atomic on read-only", faa(ro.Descriptor().RKey, 0, 1), rdma.ErrAccessDenied},
		{"read of write-only", read(wo.Descriptor().RKey, 0, 1), rdma.ErrAccessDenied},
		{"oversized read", read(rk, 0, rdma.MaxTransfer+1), rdma.ErrTooLarge},
		{"bad opcode", rdma.Op{Kind: 99, RKey: rk}, rdma.ErrBadRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The bad op sits between two good ones: the first executes,
			// the last is flushed.
			ops := []rdma.Op{faa(rk, 0, 1), c.op, faa(rk, 8, 1)}
			before0 := rdma.LoadWord(full.Bytes(), 0)
			err := ts[0].Post(ctxT(t), 2, ops)
			if !errors.Is(err, c.want) {
				t.Fatalf("Post = %v, want %v", err, c.want)
			}
			if ops[0].Err == nil && ops[1].Err != nil {
				// The target executed the batch up to the bad op.
				if !errors.Is(ops[1].Err, c.want) {
					t.Errorf("op 1 Err = %v, want %v", ops[1].Err, c.want)
				}
				if !errors.Is(ops[2].Err, rdma.ErrFlushed) {
					t.Errorf("op 2 Err = %v, want ErrFlushed", ops[2].Err)
				}
				if rdma.LoadWord(full.Bytes(), 0) != before0+1 {
					t.Errorf("op 0 before the bad op did not execute")
				}
			} else if !errors.Is(ops[1].Err, c.want) && !errors.Is(ops[0].Err, c.want) {
				// Rejected before sending (batch shape): every op fails.
				t.Errorf("op errors %v / %v, want %v", ops[0].Err, ops[1].Err, c.want)
			}
		})
	}
	// Restore the two counters touched by the good ops and compare the rest.
	after := snapshot()
	copy(after[0][:16], before[0][:16])
	for i := range before {
		if !bytes.Equal(before[i], after[i]) {
			t.Errorf("registration %d changed by rejected requests", i)
		}
	}

	// Batch-shape errors.
	if err := ts[0].Post(ctxT(t), 2, nil); !errors.Is(err, rdma.ErrBadRequest) {
		t.Errorf("empty batch: %v, want ErrBadRequest", err)
	}
	big := make([]rdma.Op, rdma.MaxBatch+1)
	for i := range big {
		big[i] = faa(rk, 0, 1)
	}
	if err := ts[0].Post(ctxT(t), 2, big); !errors.Is(err, rdma.ErrTooLarge) {
		t.Errorf("%d-op batch: %v, want ErrTooLarge", len(big), err)
	}
	var heavy []rdma.Op
	for n := 0; n <= rdma.MaxBatchBytes; n += rdma.MaxTransfer {
		heavy = append(heavy, read(rk, 0, rdma.MaxTransfer))
	}
	if err := ts[0].Post(ctxT(t), 2, heavy); !errors.Is(err, rdma.ErrTooLarge) {
		t.Errorf("batch reading %d bytes: %v, want ErrTooLarge", len(heavy)*rdma.MaxTransfer, err)
	}
	if err := ts[0].Send(ctxT(t), 2, make([]byte, rdma.MaxMessage+1)); !errors.Is(err, rdma.ErrTooLarge) {
		t.Errorf("oversized message: %v, want ErrTooLarge", err)
	}
	// The endpoint still works after all that.
	ops := post(t, ts[0], 2, read(rk, 16, 4))
	if !bytes.Equal(ops[0].Buf, full.Bytes()[16:20]) {
		t.Error("READ after rejected requests returned wrong data")
	}
}

func testDeregister(t *testing.T, b Backend) {
	ts := cluster(t, b, 2)
	reg := register(t, ts[1], 4096, rdma.AccessAll)
	rk := reg.Descriptor().RKey
	post(t, ts[0], 2, write(rk, 0, []byte("before")))
	if err := reg.Deregister(); err != nil {
		t.Fatal(err)
	}
	copy(reg.Bytes(), "intact")
	for _, op := range []rdma.Op{read(rk, 0, 6), write(rk, 0, []byte("after!")), faa(rk, 8, 1), cas(rk, 8, 0, 1)} {
		err := ts[0].Post(ctxT(t), 2, []rdma.Op{op})
		if !errors.Is(err, rdma.ErrUnknownKey) {
			t.Errorf("%v on revoked registration: %v, want ErrUnknownKey", op.Kind, err)
		}
	}
	if string(reg.Bytes()[:6]) != "intact" || rdma.LoadWord(reg.Bytes(), 8) != 0 {
		t.Error("revoked registration was modified")
	}
	// A new registration does not inherit the revoked key.
	reg2 := register(t, ts[1], 4096, rdma.AccessAll)
	if reg2.Descriptor().RKey == rk {
		t.Error("a revoked key was reused")
	}
}

func testMessages(t *testing.T, b Backend) {
	ts := cluster(t, b, 3)
	type got struct {
		from ids.NodeID
		msg  string
	}
	recv := make(chan got, 1000)
	ts[2].SetHandler(func(from ids.NodeID, msg []byte) { recv <- got{from, string(msg)} })
	const n = 200
	var wg sync.WaitGroup
	for _, src := range ts[:2] {
		wg.Add(1)
		go func(src rdma.Transport) {
			defer wg.Done()
			for i := 0; i < n; i++ {
				if err := src.Send(ctxT(t), 3, []byte(fmt.Sprintf("%d", i))); err != nil {
					t.Errorf("send: %v", err)
					return
				}
			}
		}(src)
	}
	wg.Wait()
	next := map[ids.NodeID]int{}
	timeout := time.After(hang)
	for i := 0; i < 2*n; i++ {
		select {
		case g := <-recv:
			if want := fmt.Sprint(next[g.from]); g.msg != want {
				t.Fatalf("from %v: got message %q, want %q (per-peer order)", g.from, g.msg, want)
			}
			next[g.from]++
		case <-timeout:
			t.Fatalf("received %d of %d messages", i, 2*n)
		}
	}
	// A large message arrives whole.
	big := pattern(rdma.MaxMessage, 3)
	if err := ts[0].Send(ctxT(t), 3, big); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-recv:
		if g.from != 1 || g.msg != string(big) {
			t.Errorf("large message from %v differs", g.from)
		}
	case <-timeout:
		t.Fatal("large message not received")
	}
}

func testUnknownPeer(t *testing.T, b Backend) {
	ts := cluster(t, b, 1)
	err := ts[0].Post(ctxT(t), 999, []rdma.Op{faa(rdma.RKey{Key: 1}, 0, 1)})
	if !errors.Is(err, rdma.ErrUnknownPeer) {
		t.Errorf("Post to unknown peer: %v, want ErrUnknownPeer", err)
	}
	var pe *rdma.PeerError
	if !errors.As(err, &pe) || pe.Peer != 999 {
		t.Errorf("error %v does not name peer 999", err)
	}
	if err := ts[0].Send(ctxT(t), 999, []byte("x")); !errors.Is(err, rdma.ErrUnknownPeer) {
		t.Errorf("Send to unknown peer: %v, want ErrUnknownPeer", err)
	}
}

func testDeadPeer(t *testing.T, b Backend) {
	ts := cluster(t, b, 2)
	reg := register(t, ts[1], 4096, rdma.AccessAll)
	rk := reg.Descriptor().RKey
	post(t, ts[0], 2, faa(rk, 0, 1)) // connected
	if err := ts[1].Close(); err != nil {
		t.Fatal(err)
	}
	err := ts[0].Post(ctxT(t), 2, []rdma.Op{faa(rk, 0, 1)})
	if !errors.Is(err, rdma.ErrPeerUnreachable) {
		t.Errorf("Post to closed peer: %v, want ErrPeerUnreachable", err)
	}
	// The surviving endpoint still serves its own memory.
	local := register(t, ts[0], 4096, rdma.AccessAll)
	post(t, ts[0], 1, faa(local.Descriptor().RKey, 0, 1))
}

func testDeadPeerMidBatch(t *testing.T, b Backend) {
	ts := cluster(t, b, 2)
	const size = 4 << 20
	reg := register(t, ts[1], size, rdma.AccessAll)
	rk := reg.Descriptor().RKey
	post(t, ts[0], 2, faa(rk, 0, 1))

	// Several goroutines keep large batches in flight while the peer dies.
	// Each posts until a Post fails; a worker whose Post never fails within
	// the hang bound reports the deadline.
	const workers = 4
	var wg sync.WaitGroup
	results := make(chan error, workers)
	start := make(chan struct{})
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), hang)
			defer cancel()
			ops := make([]rdma.Op, 16)
			for i := range ops {
				ops[i] = read(rk, 0, 1<<20)
			}
			<-start
			for {
				if err := ts[0].Post(ctx, 2, ops); err != nil {
					results <- err
					return
				}
			}
		}()
	}
	close(start)
	time.Sleep(50 * time.Millisecond)
	if err := ts[1].Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(results)
	for err := range results {
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a batch in flight to a dead peer hung for %v", hang)
		}
		if !errors.Is(err, rdma.ErrPeerUnreachable) {
			t.Errorf("batch to dead peer: %v, want ErrPeerUnreachable", err)
		}
	}
}

func testContext(t *testing.T, b Backend) {
	ts := cluster(t, b, 2)
	reg := register(t, ts[1], 4096, rdma.AccessAll)
	rk := reg.Descriptor().RKey
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ts[0].Post(ctx, 2, []rdma.Op{faa(rk, 0, 1)}); !errors.Is(err, context.Canceled) {
		t.Errorf("Post with cancelled context: %v, want context.Canceled", err)
	}
	if err := ts[0].Send(ctx, 2, []byte("x")); !errors.Is(err, context.Canceled) {
		t.Errorf("Send with cancelled context: %v, want context.Canceled", err)
	}
}

func testClosed(t *testing.T, b Backend) {
	ts := cluster(t, b, 2)
	reg := register(t, ts[1], 4096, rdma.AccessAll)
	rk := reg.Descriptor().RKey
	if err := ts[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := ts[0].Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := ts[0].Post(ctxT(t), 2, []rdma.Op{faa(rk, 0, 1)}); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Post after Close: %v, want ErrClosed", err)
	}
	if err := ts[0].Send(ctxT(t), 2, []byte("x")); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Send after Close: %v, want ErrClosed", err)
	}
	if _, err := ts[0].Register(make([]byte, 64), rdma.AccessAll); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Register after Close: %v, want ErrClosed", err)
	}
}

// testDeadPeerOutcome checks what Post's errors say about execution when
// the peer dies with batches in flight: a batch whose error wraps neither
// rdma.ErrOutcomeUnknown nor a context error executed nothing. Workers add
// 1 to a counter until their first failure; the counter must end between
// the adds that succeeded and those plus the ones whose outcome is unknown.
func testDeadPeerOutcome(t *testing.T, b Backend) {
	ts := cluster(t, b, 2)
	reg := register(t, ts[1], 4096, rdma.AccessAll)
	rk := reg.Descriptor().RKey
	post(t, ts[0], 2, faa(rk, 0, 0)) // connected
	const workers = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	var done, unknown uint64
	var others []error
	start := make(chan struct{})
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), hang)
			defer cancel()
			<-start
			for {
				err := ts[0].Post(ctx, 2, []rdma.Op{faa(rk, 0, 1)})
				mu.Lock()
				switch {
				case err == nil:
					done++
				case errors.Is(err, rdma.ErrOutcomeUnknown), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
					unknown++
				default:
					others = append(others, err)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	close(start)
	time.Sleep(20 * time.Millisecond)
	if err := ts[1].Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	got := rdma.LoadWord(reg.Bytes(), 0)
	if got < done || got > done+unknown {
		t.Errorf("counter %d after %d adds that succeeded and %d of unknown outcome: a batch that failed without rdma.ErrOutcomeUnknown executed (other errors: %v)",
			got, done, unknown, others)
	}
}
