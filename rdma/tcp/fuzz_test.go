package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/internal/target"
)

// seedRequests are well-formed request bodies (count, body) to start the
// fuzzers from.
func seedRequests() [][]byte {
	batches := [][]rdma.Op{
		{{Kind: rdma.OpRead, RKey: rdma.RKey{Key: 1}, Offset: 0, Buf: make([]byte, 16)}},
		{{Kind: rdma.OpWrite, RKey: rdma.RKey{Key: 1}, Offset: 8, Buf: []byte("hello")}},
		{{Kind: rdma.OpCAS, RKey: rdma.RKey{Key: 1}, Offset: 16, Compare: 0, Operand: 5},
			{Kind: rdma.OpFAA, RKey: rdma.RKey{Key: 1}, Offset: 16, Operand: 1},
			{Kind: rdma.OpRead, RKey: rdma.RKey{Key: 1}, Offset: 16, Buf: make([]byte, 8)}},
		{{Kind: rdma.OpWrite, RKey: rdma.RKey{Key: 2}, Offset: 4000, Buf: make([]byte, 200)}},
	}
	var out [][]byte
	for i, ops := range batches {
		reqLen, _, _ := requestSize(ops)
		b := make([]byte, hdrLen+reqLen)
		encodeRequest(b, uint64(i+1), 1, ops, reqLen)
		out = append(out, b)
	}
	return out
}

// FuzzDecodeRequest checks that the request decoder accepts exactly the
// well-framed bodies (the floor, then the ops), never panics, and never
// hands out data outside the body.
func FuzzDecodeRequest(f *testing.F) {
	for _, fr := range seedRequests() {
		h := decodeHeader(fr)
		f.Add(h.count, fr[hdrLen:])
	}
	f.Add(uint16(0), []byte{})
	f.Add(uint16(rdma.MaxBatch+1), make([]byte, 40))
	f.Fuzz(func(t *testing.T, count uint16, body []byte) {
		floor, ops, err := decodeRequest(int(count), body, nil)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v is not ErrProtocol", err)
			}
			return
		}
		if len(ops) != int(count) {
			t.Fatalf("%d ops decoded from a count of %d", len(ops), count)
		}
		if floor != binary.LittleEndian.Uint64(body) {
			t.Fatalf("floor %d decoded from %x", floor, body[:reqPrefix])
		}
		total := reqPrefix
		for _, op := range ops {
			total += opLen
			if op.kind == rdma.OpWrite {
				if len(op.data) != int(op.n) {
					t.Fatalf("WRITE of %d bytes carries %d", op.n, len(op.data))
				}
				total += len(op.data)
			} else if op.data != nil {
				t.Fatalf("%v carries data", op.kind)
			}
		}
		if total != len(body) {
			t.Fatalf("ops account for %d of %d bytes", total, len(body))
		}
	})
}

// streamConn is a net.Conn whose reads come from a byte slice and whose
// writes vanish.
type streamConn struct{ r *bytes.Reader }

func (s *streamConn) Read(b []byte) (int, error)       { return s.r.Read(b) }
func (s *streamConn) Write(b []byte) (int, error)      { return len(b), nil }
func (s *streamConn) Close() error                     { return nil }
func (s *streamConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (s *streamConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (s *streamConn) SetDeadline(time.Time) error      { return nil }
func (s *streamConn) SetReadDeadline(time.Time) error  { return nil }
func (s *streamConn) SetWriteDeadline(time.Time) error { return nil }

func fuzzTransport() *Transport {
	cfg := Config{}
	cfg.fill()
	return &Transport{
		id: 1, nonce: 0xf022, cfg: cfg, log: slog.New(slog.DiscardHandler), table: target.New(1),
		peers: map[ids.NodeID]*peer{}, inbound: map[net.Conn]*conn{},
		outs: map[ids.NodeID]*outSession{}, sessions: map[sessionKey]*inSession{},
	}
}

// FuzzResponseStream feeds arbitrary bytes to the response decoder of an
// outbound connection with calls pending. It must never panic, never
// write outside the calls' buffers, and complete every call it claims.
func FuzzResponseStream(f *testing.F) {
	good := func(id uint64, status uint8, count int, body []byte) []byte {
		b := responseHeader(id, count, len(body))
		b[5] = status
		return append(b, body...)
	}
	f.Add(good(1, 0, 1, make([]byte, 16)))
	f.Add(append(good(2, 0, 3, make([]byte, 24)), good(1, 0, 1, bytes.Repeat([]byte{7}, 16))...))
	f.Add(good(2, codeMisaligned, 1, append(make([]byte, 8), "rdma: misaligned"...)))
	f.Add(good(3, codeOutOfBounds, 0, []byte("rdma: out of bounds")))
	f.Add(good(9, 0, 1, make([]byte, 100)))
	f.Fuzz(func(t *testing.T, data []byte) {
		sc := &streamConn{r: bytes.NewReader(data)}
		c := newConn(fuzzTransport(), sc, sc, 2, true)
		guard := bytes.Repeat([]byte{0xa5}, 64)
		mem := make([]byte, 16+64)
		copy(mem[16:], guard)
		calls := []*call{
			{done: make(chan struct{}, 1), ops: []rdma.Op{{Kind: rdma.OpRead, Buf: mem[:16:16]}}},
			{done: make(chan struct{}, 1), ops: []rdma.Op{{Kind: rdma.OpFAA}, {Kind: rdma.OpCAS}, {Kind: rdma.OpFAA}}},
			{done: make(chan struct{}, 1), ops: []rdma.Op{{Kind: rdma.OpWrite, Buf: []byte("x")}, {Kind: rdma.OpRead, Buf: make([]byte, 4)}}},
		}
		for i, cl := range calls {
			cl.conn = c
			cl.id = uint64(i + 1)
			if _, err := c.register(cl); err != nil {
				t.Fatal(err)
			}
		}
		for {
			c.reading = true
			_, err := c.readStep(nil)
			c.reading = false
			if err != nil {
				c.readFailed(err)
				break
			}
		}
		if !bytes.Equal(mem[16:], guard) {
			t.Fatal("a READ response was written past the caller's buffer")
		}
		for i, cl := range calls {
			switch cl.state.Load() {
			case callDone:
				select {
				case <-cl.done:
				default:
					t.Fatalf("call %d done but not signalled", i)
				}
				if cl.err != nil && cl.err != errBroken && !errors.Is(cl.err, rdma.ErrOutcomeUnknown) && !errors.Is(cl.err, rdma.ErrFlushed) {
					var re *remoteError
					if !errors.As(cl.err, &re) {
						t.Fatalf("call %d failed with %v: neither an answer of the peer nor a broken connection", i, cl.err)
					}
				}
				if cl.err == nil {
					for j := range cl.ops {
						if cl.ops[j].Err != nil {
							t.Fatalf("call %d succeeded with op %d failing: %v", i, j, cl.ops[j].Err)
						}
					}
				}
			default:
				t.Fatalf("call %d left in state %d after the connection failed", i, cl.state.Load())
			}
		}
	})
}

// FuzzServe feeds arbitrary bytes to the responder of an inbound
// connection, then the same bytes again on a second connection of the same
// session, as a requester re-sending after a broken connection would. It
// must never panic, never touch memory outside the registration (guard
// bytes surround it), and the second pass must change nothing: every batch
// that changed memory is answered from the session's record, or is below
// the floor and ignored.
func FuzzServe(f *testing.F) {
	for _, fr := range seedRequests() {
		f.Add(fr)
	}
	msg := make([]byte, hdrLen)
	(&header{bodyLen: 3, typ: frameMessage}).encode(msg)
	f.Add(append(msg, "hi!"...))
	var all []byte
	for _, fr := range seedRequests() {
		all = append(all, fr...)
	}
	f.Add(append(all, all...)) // every request twice
	// A floor that passes the requests before it.
	late := seedRequests()[2]
	binary.LittleEndian.PutUint64(late[hdrLen:], 3)
	f.Add(append(append(bytes.Clone(all), late...), all...))
	f.Fuzz(func(t *testing.T, data []byte) {
		tr := fuzzTransport()
		var got int
		tr.SetHandler(func(from ids.NodeID, msg []byte) { got += len(msg) })
		backing := bytes.Repeat([]byte{0x5a}, 3*4096)
		reg, err := tr.table.Register(backing[4096:8192:8192], rdma.AccessAll)
		if err != nil {
			t.Fatal(err)
		}
		_ = reg
		sess, _ := tr.openSession(2, 0xabc)
		run := func() {
			sc := &streamConn{r: bytes.NewReader(data)}
			c := newConn(tr, sc, sc, 2, false)
			c.sess = sess
			var hb [hdrLen]byte
			for {
				if _, err := c.readFull(hb[:], nil); err != nil {
					break
				}
				h := decodeHeader(hb[:])
				if err := c.serveFrame(&h); err != nil {
					break
				}
			}
			c.shutdown(io.EOF)
		}
		run()
		once := bytes.Clone(backing)
		run()
		for i, b := range backing {
			if (i < 4096 || i >= 8192) && b != 0x5a {
				t.Fatalf("byte %d outside the registration changed", i)
			}
		}
		if !bytes.Equal(backing, once) {
			t.Fatal("the same requests sent again in the same session changed memory again")
		}
		sess.kill()
	})
}

// FuzzHandshake feeds arbitrary bytes as the peer's hello to both halves
// of the handshake: neither panics, and each accepts exactly a well-formed
// hello of this version meant for it.
func FuzzHandshake(f *testing.F) {
	good := func(h hello) []byte {
		b := make([]byte, helloLen)
		h.encode(b)
		return b
	}
	f.Add(good(hello{magic: magic, version: version, from: 2, to: 1, nonce: 7}))
	f.Add(good(hello{magic: magic, version: version, from: 2, to: 1, nonce: 7, session: 3}))
	f.Add(good(hello{magic: magic, version: 1, from: 2, to: 1})[:helloPrefix])
	f.Add(good(hello{magic: magic, version: version, status: helloWrongNode, from: 2, to: 1})[:helloPrefix])
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var in hello
		full := len(data) >= helloLen
		if full {
			in = decodeHello(data[:helloLen])
		}
		valid := full && in.magic == magic && in.version == version && in.status == helloOK && in.from != ids.None

		tr := fuzzTransport()
		from, sess, err := tr.handshakeAccept(&streamConn{r: bytes.NewReader(data)}, 0)
		wantAccept := valid && in.to == tr.id && in.nonce != 0 && in.session == 0
		if (err == nil) != wantAccept {
			t.Fatalf("acceptor: err %v for hello %+v (full %v)", err, in, full)
		}
		if err == nil && (from != in.from || sess == nil || sess.nonce != in.nonce || sess.id == 0) {
			t.Fatalf("acceptor: node %v session %+v for hello %+v", from, sess, in)
		}

		// With TLS, the certificate named node 2: a hello from another
		// node is refused.
		tr = fuzzTransport()
		tr.cfg.TLS = &TLS{}
		_, _, err = tr.handshakeAccept(&streamConn{r: bytes.NewReader(data)}, 2)
		if (err == nil) != (wantAccept && in.from == 2) {
			t.Fatalf("acceptor with TLS as node 2: err %v for hello %+v (full %v)", err, in, full)
		}

		tr = fuzzTransport()
		r, err := tr.handshakeDial(&streamConn{r: bytes.NewReader(data)}, 2)
		wantDial := valid && in.from == 2 && in.to == tr.id && in.nonce != 0 && in.session != 0
		if (err == nil) != wantDial {
			t.Fatalf("dialer: err %v for hello %+v (full %v)", err, in, full)
		}
		if err == nil && r != in {
			t.Fatalf("dialer: hello %+v, sent %+v", r, in)
		}
	})
}

// FuzzLiveResponder sends arbitrary bytes after a good handshake to a
// running transport over loopback: the transport answers or closes the
// connection, and never panics or writes outside its registration.
func FuzzLiveResponder(f *testing.F) {
	for _, fr := range seedRequests() {
		f.Add(fr)
	}
	tr, err := Listen(1, "127.0.0.1:0", Config{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { tr.Close() })
	backing := bytes.Repeat([]byte{0x5a}, 3*4096)
	if _, err := tr.Register(backing[4096:8192:8192], rdma.AccessAll); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		nc, err := net.Dial("tcp", tr.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		var b [helloLen]byte
		(&hello{magic: magic, version: version, from: 9, to: 1, nonce: testNonce}).encode(b[:])
		nc.SetDeadline(time.Now().Add(hang))
		if _, err := nc.Write(append(b[:], data...)); err != nil {
			return // closed early: fine
		}
		nc.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, nc)
		for i, b := range backing {
			if (i < 4096 || i >= 8192) && b != 0x5a {
				t.Fatalf("byte %d outside the registration changed", i)
			}
		}
	})
}
