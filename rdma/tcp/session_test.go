package tcp

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/dsmkit/dsm/rdma"
)

// dialSession connects to tr as node 9, incarnation nonce, and returns the
// connection and the session id the listener answered with.
func dialSession(t *testing.T, tr *Transport, nonce uint64) (net.Conn, uint64) {
	t.Helper()
	h := goodHello(tr.id)
	h.nonce = nonce
	nc, r, ok := rawDial(t, tr, h)
	if !ok || r.status != helloOK {
		t.Fatalf("handshake refused: %+v", r)
	}
	if r.nonce != tr.nonce || r.session == 0 {
		t.Fatalf("listener hello %+v: want its incarnation %#x and a session", r, tr.nonce)
	}
	return nc, r.session
}

func faaOp(key, off, add uint64) []byte { return wireOpBytes(rdma.OpFAA, 0, key, off, add, 0, nil) }

// The same request on two connections of one session executes once: the
// second copy gets the recorded answer. A request below the floor gets no
// answer and does not execute. Reads are not recorded; they execute again.
func TestSessionDeduplicates(t *testing.T) {
	tr := listen(t, 1)
	mem, _ := rdma.Alloc(4096)
	defer rdma.Free(mem)
	reg, _ := tr.Register(mem, rdma.AccessAll)
	key := reg.Descriptor().RKey.Key

	nc1, s1 := dialSession(t, tr, 0x1111)
	mustWrite(t, nc1, request(1, 1, faaOp(key, 0, 5)))
	h, body := readResponse(t, nc1)
	if h.id != 1 || h.status != 0 || binary.LittleEndian.Uint64(body) != 0 {
		t.Fatalf("first answer %+v %x", h, body)
	}

	nc2, s2 := dialSession(t, tr, 0x1111)
	if s2 != s1 {
		t.Fatalf("reconnecting incarnation got session %d, had %d", s2, s1)
	}
	expectClosed(t, nc1) // superseded
	mustWrite(t, nc2, request(1, 1, faaOp(key, 0, 5)))
	h, body = readResponse(t, nc2)
	if h.id != 1 || h.status != 0 || binary.LittleEndian.Uint64(body) != 0 {
		t.Fatalf("answer to the copy %+v %x, want the recorded old value 0", h, body)
	}
	if w := rdma.LoadWord(mem, 0); w != 5 {
		t.Fatalf("word %d: the copy executed again", w)
	}

	// A READ-only batch is not recorded: the copy reads again.
	mustWrite(t, nc2, request(2, 1, wireOpBytes(rdma.OpRead, 8, key, 0, 0, 0, nil)))
	readResponse(t, nc2)
	rdma.StoreWord(mem, 0, 77)
	mustWrite(t, nc2, request(2, 1, wireOpBytes(rdma.OpRead, 8, key, 0, 0, 0, nil)))
	if _, body := readResponse(t, nc2); binary.LittleEndian.Uint64(body) != 77 {
		t.Errorf("second READ = %d, want the current 77", binary.LittleEndian.Uint64(body))
	}

	// Floor 3 finishes 1 and 2: a late copy of 1 is ignored.
	mustWrite(t, nc2, requestFloor(3, 3, 1, faaOp(key, 8, 1)))
	if h, _ := readResponse(t, nc2); h.id != 3 {
		t.Fatalf("answer %+v, want id 3", h)
	}
	mustWrite(t, nc2, request(1, 1, faaOp(key, 0, 5)))
	mustWrite(t, nc2, requestFloor(4, 3, 1, faaOp(key, 8, 1)))
	if h, _ := readResponse(t, nc2); h.id != 4 {
		t.Fatalf("answer %+v, want id 4: the stale request was answered", h)
	}
	if w := rdma.LoadWord(mem, 0); w != 77 {
		t.Errorf("word %d: a request below the floor executed", w)
	}
	if w := rdma.LoadWord(mem, 8); w != 2 {
		t.Errorf("second word %d, want 2", w)
	}
}

// Requests outside the session's rules close the connection without
// executing.
func TestSessionRejects(t *testing.T) {
	tr := listen(t, 1)
	mem, _ := rdma.Alloc(4096)
	defer rdma.Free(mem)
	reg, _ := tr.Register(mem, rdma.AccessAll)
	key := reg.Descriptor().RKey.Key
	cases := []struct {
		name  string
		frame []byte
	}{
		{"id zero", requestFloor(0, 0, 1, faaOp(key, 0, 1))},
		{"floor above id", requestFloor(5, 6, 1, faaOp(key, 0, 1))},
		{"beyond the window", requestFloor(1+maxInFlight, 1, 1, faaOp(key, 0, 1))},
		{"no floor", func() []byte {
			b := make([]byte, hdrLen)
			(&header{bodyLen: 4, typ: frameRequest, count: 1, id: 1}).encode(b)
			return append(b, 1, 2, 3, 4)
		}()},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nc, _ := dialSession(t, tr, uint64(0x2000+i))
			mustWrite(t, nc, c.frame)
			expectClosed(t, nc)
		})
	}
	if w := rdma.LoadWord(mem, 0); w != 0 {
		t.Errorf("word %d: a rejected request executed", w)
	}
}

// Each node keeps tables for its two latest incarnations: a third evicts
// the oldest, whose next connection gets a new session id (so that its
// requester knows the outcomes it had in flight are lost), and nothing of
// an evicted session executes on its old connections.
func TestSessionEviction(t *testing.T) {
	tr := listen(t, 1)
	mem, _ := rdma.Alloc(4096)
	defer rdma.Free(mem)
	reg, _ := tr.Register(mem, rdma.AccessAll)
	key := reg.Descriptor().RKey.Key
	nc1, s1 := dialSession(t, tr, 0xa)
	_, s2 := dialSession(t, tr, 0xb)
	_, s3 := dialSession(t, tr, 0xc)
	if s1 == s2 || s2 == s3 || s1 == s3 {
		t.Fatalf("session ids %d %d %d not distinct", s1, s2, s3)
	}
	expectClosed(t, nc1)
	mustWrite(t, nc1, request(1, 1, faaOp(key, 0, 1))) // may fail: closed
	_, s1b := dialSession(t, tr, 0xa)
	if s1b == s1 {
		t.Fatalf("evicted incarnation got its old session %d back", s1)
	}
	if w := rdma.LoadWord(mem, 0); w != 0 {
		t.Errorf("word %d: a request of an evicted session executed", w)
	}
}

// The requester's window: sequence numbers are handed out in order, the
// floor follows the lowest unfinished one, and an acquirer waits while
// maxInFlight are unfinished.
func TestOutSessionWindow(t *testing.T) {
	s := newOutSession()
	ctx := context.Background()
	var seqs []uint64
	for i := 0; i < maxInFlight; i++ {
		q, err := s.acquire(ctx)
		if err != nil || q != uint64(i+1) {
			t.Fatalf("acquire %d = %d, %v", i, q, err)
		}
		seqs = append(seqs, q)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := s.acquire(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire beyond the window: %v, want to wait", err)
	}
	got := make(chan uint64)
	go func() {
		q, _ := s.acquire(ctx)
		got <- q
	}()
	s.release(seqs[5]) // out of order: the floor stays
	if f := s.floor.Load(); f != 1 {
		t.Fatalf("floor %d after releasing 6, want 1", f)
	}
	for _, q := range seqs[:5] {
		s.release(q)
	}
	if f := s.floor.Load(); f != 7 {
		t.Fatalf("floor %d after releasing 1..6, want 7", f)
	}
	select {
	case q := <-got:
		if q != maxInFlight+1 {
			t.Fatalf("waiting acquire got %d", q)
		}
	case <-time.After(hang):
		t.Fatal("acquire did not resume when the floor moved")
	}
}

// A Post whose connection broke is sent again with the same sequence
// number when the peer still holds the session, and fails with
// ErrOutcomeUnknown when it does not.
func TestPostResendsInSession(t *testing.T) {
	for _, keep := range []bool{true, false} {
		t.Run(map[bool]string{true: "session kept", false: "session lost"}[keep], func(t *testing.T) {
			tr := listen(t, 1)
			f := newFakePeer(t, 2)
			f.keep.Store(keep)
			tr.AddPeer(2, f.addr())
			errc := make(chan error, 1)
			op := []rdma.Op{{Kind: rdma.OpFAA, RKey: rdma.RKey{Key: 1}, Operand: 1}}
			go func() { errc <- tr.Post(ctxT(t), 2, op) }()
			nc := f.accept(t)
			h1, _ := readRequest(t, nc)
			nc.Close()
			if !keep {
				err := <-errc
				if !errors.Is(err, rdma.ErrOutcomeUnknown) || !errors.Is(err, rdma.ErrPeerUnreachable) {
					t.Fatalf("Post = %v, want ErrOutcomeUnknown and ErrPeerUnreachable", err)
				}
				return
			}
			nc = f.accept(t)
			h2, _ := readRequest(t, nc)
			if h2.id != h1.id {
				t.Fatalf("re-sent as %d, first sent as %d", h2.id, h1.id)
			}
			res := binary.LittleEndian.AppendUint64(nil, 41)
			mustWrite(t, nc, append(responseHeader(h2.id, 1, 8), res...))
			if err := <-errc; err != nil || op[0].Result != 41 {
				t.Fatalf("Post = %v, result %d", err, op[0].Result)
			}
		})
	}
}

// A context that ends after the request was queued: the error matches the
// context's and ErrOutcomeUnknown.
func TestContextAfterSendIsUnknown(t *testing.T) {
	tr := listen(t, 1)
	f := newFakePeer(t, 2)
	tr.AddPeer(2, f.addr())
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- tr.Post(ctx, 2, []rdma.Op{readOp(8)}) }()
	nc := f.accept(t)
	readRequest(t, nc)
	cancel()
	err := <-errc
	if !errors.Is(err, context.Canceled) || !errors.Is(err, rdma.ErrOutcomeUnknown) {
		t.Fatalf("Post = %v, want Canceled and ErrOutcomeUnknown", err)
	}
}

// Close while a broken batch waits to be sent again: ErrClosed, and the
// outcome is unknown.
func TestCloseDuringRetry(t *testing.T) {
	tr := listen(t, 1)
	g := newFakePeer(t, 2)
	tr.AddPeer(2, g.addr())
	// A listener that accepts and never answers a hello.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	errc := make(chan error, 1)
	go func() { errc <- tr.Post(context.Background(), 2, []rdma.Op{readOp(8)}) }()
	nc := g.accept(t)
	readRequest(t, nc)
	// The peer moves: the connection that carried the batch closes, and
	// the retry waits on a handshake that never completes.
	tr.AddPeer(2, silent.Addr().String())
	held, err := silent.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	tr.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, rdma.ErrClosed) || !errors.Is(err, rdma.ErrOutcomeUnknown) {
			t.Fatalf("Post = %v, want ErrClosed and ErrOutcomeUnknown", err)
		}
	case <-time.After(hang):
		t.Fatal("Post did not end when the transport closed")
	}
}
