package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// hang bounds every wait of these tests: something that has not happened by
// then is hung, whatever the machine's load. No test asserts a duration.
const hang = 30 * time.Second

func listen(t *testing.T, id ids.NodeID) *Transport {
	t.Helper()
	tr, err := Listen(id, "127.0.0.1:0", Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	t.Cleanup(cancel)
	return ctx
}

// fakePeer is a scripted peer: a listener whose single accepted connection
// has completed the acceptor's handshake as node id; the test then reads
// requests from it and writes whatever frames it likes.
type fakePeer struct {
	ln      net.Listener
	conns   chan net.Conn
	session atomic.Uint64 // the session id of the last connection
	keep    atomic.Bool   // every connection continues session 1
}

// fakeNonce is the incarnation of every fake peer.
const fakeNonce = 0xfa4e

func newFakePeer(t *testing.T, id ids.NodeID) *fakePeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakePeer{ln: ln, conns: make(chan net.Conn, 4)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			var b [helloLen]byte
			if _, err := io.ReadFull(nc, b[:]); err != nil {
				nc.Close()
				continue
			}
			h := decodeHello(b[:])
			// Every connection is a new session of one incarnation,
			// unless the test keeps the session.
			sess := f.session.Add(1)
			if f.keep.Load() {
				sess = 1
			}
			r := hello{magic: magic, version: version, from: id, to: h.from, nonce: fakeNonce, session: sess}
			r.encode(b[:])
			nc.Write(b[:])
			f.conns <- nc
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		close(f.conns)
		for nc := range f.conns {
			nc.Close()
		}
	})
	return f
}

func (f *fakePeer) addr() string { return f.ln.Addr().String() }

func (f *fakePeer) accept(t *testing.T) net.Conn {
	t.Helper()
	select {
	case nc := <-f.conns:
		t.Cleanup(func() { nc.Close() })
		return nc
	case <-time.After(hang):
		t.Fatal("no connection to the fake peer")
		return nil
	}
}

// readRequest reads one request frame from nc and returns its header and
// decoded ops.
func readRequest(t *testing.T, nc net.Conn) (header, []wireOp) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(hang))
	var hb [hdrLen]byte
	if _, err := io.ReadFull(nc, hb[:]); err != nil {
		t.Fatalf("fake peer: read header: %v", err)
	}
	h := decodeHeader(hb[:])
	body := make([]byte, h.bodyLen)
	if _, err := io.ReadFull(nc, body); err != nil {
		t.Fatalf("fake peer: read body: %v", err)
	}
	if h.typ != frameRequest {
		return h, nil
	}
	_, ops, err := decodeRequest(int(h.count), body, nil)
	if err != nil {
		t.Fatalf("fake peer: %v", err)
	}
	return h, ops
}

func responseHeader(id uint64, count int, bodyLen int) []byte {
	b := make([]byte, hdrLen)
	h := header{bodyLen: uint32(bodyLen), typ: frameResponse, count: uint16(count), id: id}
	h.encode(b)
	return b
}

func mustWrite(t *testing.T, nc net.Conn, b []byte) {
	t.Helper()
	if _, err := nc.Write(b); err != nil {
		t.Fatalf("fake peer: write: %v", err)
	}
}

func readOp(n int) rdma.Op {
	return rdma.Op{Kind: rdma.OpRead, RKey: rdma.RKey{Key: 1}, Buf: make([]byte, n)}
}

// A peer that never answers: the context bounds the wait, also for the
// caller that reads its own response.
func TestDeadlineOnSilentPeer(t *testing.T) {
	tr := listen(t, 1)
	f := newFakePeer(t, 2)
	if err := tr.AddPeer(2, f.addr()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		op := []rdma.Op{readOp(64)}
		err := tr.Post(ctx, 2, op)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Post to a silent peer: %v, want DeadlineExceeded", err)
		}
		if !errors.Is(op[0].Err, context.DeadlineExceeded) {
			t.Errorf("op error %v, want DeadlineExceeded", op[0].Err)
		}
	}
}

// A response that arrives after its caller gave up is discarded without
// touching the caller's buffer, and the stream stays in step: the next
// response reaches the right caller.
func TestLateResponseDiscarded(t *testing.T) {
	tr := listen(t, 1)
	f := newFakePeer(t, 2)
	tr.AddPeer(2, f.addr())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	late := []rdma.Op{readOp(4096)}
	errc := make(chan error, 1)
	go func() { errc <- tr.Post(ctx, 2, late) }()
	nc := f.accept(t)
	h1, _ := readRequest(t, nc)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Post = %v, want Canceled", err)
	}
	mustWrite(t, nc, append(responseHeader(h1.id, 1, 4096), bytes.Repeat([]byte{0xee}, 4096)...))

	next := []rdma.Op{readOp(8)}
	go func() { errc <- tr.Post(ctxT(t), 2, next) }()
	h2, _ := readRequest(t, nc)
	if h2.id == h1.id {
		t.Fatalf("request id %d reused", h2.id)
	}
	mustWrite(t, nc, append(responseHeader(h2.id, 1, 8), []byte("12345678")...))
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if string(next[0].Buf) != "12345678" {
		t.Errorf("second READ = %q", next[0].Buf)
	}
	if !bytes.Equal(late[0].Buf, make([]byte, 4096)) {
		t.Error("a late response was written into the buffer of a cancelled Post")
	}
}

// A caller that gives up while its response is arriving is released at
// once; the rest of that response is skipped and the stream stays in step.
func TestCancelMidResponse(t *testing.T) {
	for _, own := range []bool{true, false} {
		name := map[bool]string{true: "caller reads", false: "reader goroutine reads"}[own]
		t.Run(name, func(t *testing.T) {
			tr := listen(t, 1)
			f := newFakePeer(t, 2)
			tr.AddPeer(2, f.addr())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			const n = 256 << 10
			big := []rdma.Op{readOp(n)}
			errc := make(chan error, 2)
			var other []rdma.Op
			go func() { errc <- tr.Post(ctx, 2, big) }()
			nc := f.accept(t)
			h1, _ := readRequest(t, nc)
			var h0 header
			if !own {
				// A second call in flight first: the first caller then
				// owns the read side, and hands the big response over.
				other = []rdma.Op{readOp(8)}
				go func() { errc <- tr.Post(ctxT(t), 2, other) }()
				h0, _ = readRequest(t, nc)
				mustWrite(t, nc, append(responseHeader(h0.id, 1, 8), []byte("abcdefgh")...))
			}
			mustWrite(t, nc, append(responseHeader(h1.id, 1, n), bytes.Repeat([]byte{1}, n/2)...))
			if !own {
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
				if string(other[0].Buf) != "abcdefgh" {
					t.Fatalf("other READ = %q", other[0].Buf)
				}
			}
			waitTaken(t, tr, 2)
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Fatalf("Post = %v, want Canceled", err)
			}
			snapshot := bytes.Clone(big[0].Buf)
			mustWrite(t, nc, bytes.Repeat([]byte{2}, n/2))

			next := []rdma.Op{readOp(8)}
			go func() { errc <- tr.Post(ctxT(t), 2, next) }()
			h2, _ := readRequest(t, nc)
			mustWrite(t, nc, append(responseHeader(h2.id, 1, 8), []byte("in  step")...))
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if string(next[0].Buf) != "in  step" {
				t.Errorf("READ after a cancelled response = %q", next[0].Buf)
			}
			if !bytes.Equal(big[0].Buf, snapshot) {
				t.Error("the buffer of a cancelled Post changed after Post returned")
			}
		})
	}
}

// A peer that dies in the middle of a response, and comes back without
// the session, fails the call with ErrPeerUnreachable and
// ErrOutcomeUnknown (the batch reached it); the next call connects again.
func TestPeerDiesMidResponse(t *testing.T) {
	tr := listen(t, 1)
	f := newFakePeer(t, 2)
	tr.AddPeer(2, f.addr())
	errc := make(chan error, 1)
	op := []rdma.Op{readOp(1 << 20)}
	go func() { errc <- tr.Post(ctxT(t), 2, op) }()
	nc := f.accept(t)
	h, _ := readRequest(t, nc)
	mustWrite(t, nc, append(responseHeader(h.id, 1, 1<<20), make([]byte, 1000)...))
	nc.Close()
	err := <-errc
	var pe *rdma.PeerError
	if !errors.Is(err, rdma.ErrPeerUnreachable) || !errors.Is(err, rdma.ErrOutcomeUnknown) || !errors.As(err, &pe) || pe.Peer != 2 {
		t.Fatalf("Post = %v, want a PeerError for n2 wrapping ErrPeerUnreachable and ErrOutcomeUnknown", err)
	}

	go func() { errc <- tr.Post(ctxT(t), 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rdma.RKey{Key: 1}}}) }()
	nc = f.accept(t)
	h, _ = readRequest(t, nc)
	res := make([]byte, 8)
	binary.LittleEndian.PutUint64(res, 77)
	mustWrite(t, nc, append(responseHeader(h.id, 1, 8), res...))
	if err := <-errc; err != nil {
		t.Fatalf("Post after reconnecting: %v", err)
	}
}

// A response that breaks the format closes the connection and fails the
// call; it never panics or writes past the caller's buffers.
func TestMalformedResponses(t *testing.T) {
	cases := []struct {
		name  string
		frame func(id uint64) []byte
	}{
		{"wrong type", func(id uint64) []byte {
			b := responseHeader(id, 1, 8)
			b[4] = frameRequest
			return append(b, make([]byte, 8)...)
		}},
		{"too long", func(id uint64) []byte { return append(responseHeader(id, 1, 9), make([]byte, 9)...) }},
		{"too short", func(id uint64) []byte { return append(responseHeader(id, 1, 4), make([]byte, 4)...) }},
		{"count past batch", func(id uint64) []byte { return append(responseHeader(id, 2, 8), make([]byte, 8)...) }},
		{"huge body", func(id uint64) []byte { return responseHeader(id, 1, maxBody+1) }},
		{"unknown status", func(id uint64) []byte {
			b := responseHeader(id, 0, 0)
			b[5] = maxCode + 1
			return b
		}},
		{"error text too long", func(id uint64) []byte {
			b := responseHeader(id, 0, maxErrText+1)
			b[5] = codeUnknownKey
			return append(b, make([]byte, maxErrText+1)...)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := listen(t, 1)
			f := newFakePeer(t, 2)
			tr.AddPeer(2, f.addr())
			errc := make(chan error, 1)
			op := []rdma.Op{readOp(8)}
			go func() { errc <- tr.Post(ctxT(t), 2, op) }()
			nc := f.accept(t)
			h, _ := readRequest(t, nc)
			mustWrite(t, nc, c.frame(h.id))
			if err := <-errc; !errors.Is(err, rdma.ErrPeerUnreachable) || !errors.Is(err, ErrProtocol) {
				t.Fatalf("Post = %v, want ErrPeerUnreachable and ErrProtocol", err)
			}
			nc.SetReadDeadline(time.Now().Add(hang))
			if _, err := io.ReadAll(nc); err != nil {
				t.Errorf("connection not closed cleanly: %v", err)
			}
		})
	}
}

// An error reply maps back to the sentinel the target reported.
func TestErrorCodes(t *testing.T) {
	for code := 1; code <= maxCode; code++ {
		err := newRemoteError(uint8(code), []byte("remote text"))
		if !errors.Is(err, codeErrs[code]) || err.Error() != "remote text" {
			t.Errorf("code %d: %v does not unwrap to %v", code, err, codeErrs[code])
		}
		if got := errCode(codeErrs[code]); got != uint8(code) {
			t.Errorf("errCode(%v) = %d, want %d", codeErrs[code], got, code)
		}
	}
	if !errors.Is(newRemoteError(200, nil), rdma.ErrBadRequest) {
		t.Error("an unknown code does not map to ErrBadRequest")
	}
}

// Close fails the operations waiting on a peer with ErrClosed, whether a
// caller or the reader goroutine is reading their responses, and stops
// every goroutine (the package's TestMain checks for leaks).
func TestCloseFailsPending(t *testing.T) {
	tr := listen(t, 1)
	f := newFakePeer(t, 2)
	tr.AddPeer(2, f.addr())
	const n = 5
	errc := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			errc <- tr.Post(context.Background(), 2, []rdma.Op{readOp(8)})
		}()
	}
	nc := f.accept(t)
	for i := 0; i < n; i++ {
		readRequest(t, nc)
	}
	tr.Close()
	for i := 0; i < n; i++ {
		if err := <-errc; !errors.Is(err, rdma.ErrClosed) {
			t.Errorf("pending Post after Close: %v, want ErrClosed", err)
		}
	}
}

// waitTaken waits until a reader has taken every call pending on the
// connection to peer from the table, that is, is decoding its response.
// It only makes the interesting interleaving likely: the tests that use it
// hold whichever way the race goes.
func waitTaken(t *testing.T, tr *Transport, peer ids.NodeID) {
	t.Helper()
	deadline := time.Now().Add(hang)
	for time.Now().Before(deadline) {
		tr.mu.Lock()
		c := tr.peers[peer].conn
		tr.mu.Unlock()
		if c != nil {
			c.pmu.Lock()
			n := len(c.pending)
			c.pmu.Unlock()
			if n == 0 {
				time.Sleep(10 * time.Millisecond)
				return
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("the response was never taken")
}

// An idle connection that the peer closed (it restarted) is noticed
// before use: the first operation after the restart reaches the new peer.
func TestIdleConnectionClosedByPeer(t *testing.T) {
	defer func(d time.Duration) { idleProbeAfter = d }(idleProbeAfter)
	idleProbeAfter = 0
	a := listen(t, 1)
	b, err := Listen(2, "127.0.0.1:0", Config{})
	if err != nil {
		t.Fatal(err)
	}
	addr := b.Addr()
	a.AddPeer(2, addr)
	reg, _ := b.Register(make([]byte, 64), rdma.AccessAll)
	op := []rdma.Op{{Kind: rdma.OpFAA, RKey: reg.Descriptor().RKey, Operand: 1}}
	if err := a.Post(ctxT(t), 2, op); err != nil {
		t.Fatal(err)
	}
	b.Close()
	b2, err := Listen(2, addr, Config{})
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", addr, err)
	}
	defer b2.Close()
	reg2, _ := b2.Register(make([]byte, 64), rdma.AccessAll)
	op = []rdma.Op{{Kind: rdma.OpFAA, RKey: reg2.Descriptor().RKey, Operand: 1}}
	if err := a.Post(ctxT(t), 2, op); err != nil {
		t.Fatalf("first Post after the peer restarted: %v", err)
	}
}
