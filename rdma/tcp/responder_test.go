package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// rawDial connects to tr and sends h as the hello; it returns the
// connection and the listener's answer (ok false when it closed instead).
func rawDial(t *testing.T, tr *Transport, h hello) (net.Conn, hello, bool) {
	t.Helper()
	nc, err := net.Dial("tcp", tr.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	var b [helloLen]byte
	h.encode(b[:])
	mustWrite(t, nc, b[:])
	nc.SetReadDeadline(time.Now().Add(hang))
	if _, err := io.ReadFull(nc, b[:helloPrefix]); err != nil {
		return nc, hello{}, false
	}
	r := decodeHello(b[:helloPrefix])
	if r.status != helloOK || r.version != version {
		return nc, r, true
	}
	if _, err := io.ReadFull(nc, b[helloPrefix:]); err != nil {
		return nc, hello{}, false
	}
	return nc, decodeHello(b[:]), true
}

// testNonce is the incarnation of the raw dialers of these tests.
const testNonce = 0x7e57

func goodHello(to ids.NodeID) hello {
	return hello{magic: magic, version: version, from: 9, to: to, nonce: testNonce}
}

// expectClosed checks that the listener closes nc (after answering
// whatever it answers).
func expectClosed(t *testing.T, nc net.Conn) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(hang))
	if _, err := io.Copy(io.Discard, nc); err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("connection not closed: %v", err)
	}
}

func TestHandshakeRefusals(t *testing.T) {
	tr := listen(t, 1)
	cases := []struct {
		name   string
		h      hello
		status uint16 // expected refusal; 0: no answer at all
	}{
		{"bad magic", hello{magic: 0x12345678, version: version, from: 9, to: 1}, 0},
		{"bad version", hello{magic: magic, version: version + 1, from: 9, to: 1}, helloBadVersion},
		{"wrong node", hello{magic: magic, version: version, from: 9, to: 2, nonce: 1}, helloWrongNode},
		{"node zero", hello{magic: magic, version: version, from: 0, to: 1, nonce: 1}, helloBadNode},
		{"no incarnation", hello{magic: magic, version: version, from: 9, to: 1}, helloBadHello},
		{"session from the dialer", hello{magic: magic, version: version, from: 9, to: 1, nonce: 1, session: 1}, helloBadHello},
		{"version 1", hello{magic: magic, version: 1, from: 9, to: 1}, helloBadVersion},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nc, r, ok := rawDial(t, tr, c.h)
			if c.status == 0 {
				if ok {
					t.Fatalf("answered a hello with bad magic: %+v", r)
				}
				return
			}
			if !ok || r.status != c.status {
				t.Fatalf("answer %+v (ok %v), want status %d", r, ok, c.status)
			}
			expectClosed(t, nc)
		})
	}
}

// The dialer checks who answered: a listener that is another node is
// refused with a clear error.
func TestHandshakeWrongPeer(t *testing.T) {
	a := listen(t, 1)
	b := listen(t, 3)
	a.AddPeer(2, b.Addr()) // node 2's address, but node 3 listens there
	err := a.Post(ctxT(t), 2, []rdma.Op{readOp(8)})
	if !errors.Is(err, rdma.ErrPeerUnreachable) || !errors.Is(err, ErrHandshake) {
		t.Fatalf("Post = %v, want ErrPeerUnreachable and ErrHandshake", err)
	}
	if !strings.Contains(err.Error(), "another node") {
		t.Errorf("error %q does not say why", err)
	}
	// Something that is not a listener of this protocol at all.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		nc.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
		nc.Close()
	}()
	a.AddPeer(4, ln.Addr().String())
	if err := a.Post(ctxT(t), 4, []rdma.Op{readOp(8)}); !errors.Is(err, ErrHandshake) {
		t.Fatalf("Post to a non-peer = %v, want ErrHandshake", err)
	}
}

// request builds a request frame by hand, with floor 1.
func request(id uint64, count int, ops ...[]byte) []byte {
	return requestFloor(id, 1, count, ops...)
}

// requestFloor builds a request frame with the given floor.
func requestFloor(id, floor uint64, count int, ops ...[]byte) []byte {
	body := binary.LittleEndian.AppendUint64(nil, floor)
	for _, o := range ops {
		body = append(body, o...)
	}
	b := make([]byte, hdrLen)
	h := header{bodyLen: uint32(len(body)), typ: frameRequest, count: uint16(count), id: id}
	h.encode(b)
	return append(b, body...)
}

func wireOpBytes(kind rdma.OpKind, n uint32, key, off, a, b uint64, data []byte) []byte {
	o := make([]byte, opLen)
	o[0] = byte(kind)
	binary.LittleEndian.PutUint32(o[4:], n)
	binary.LittleEndian.PutUint64(o[8:], key)
	binary.LittleEndian.PutUint64(o[16:], off)
	binary.LittleEndian.PutUint64(o[24:], a)
	binary.LittleEndian.PutUint64(o[32:], b)
	return append(o, data...)
}

func readResponse(t *testing.T, nc net.Conn) (header, []byte) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(hang))
	var hb [hdrLen]byte
	if _, err := io.ReadFull(nc, hb[:]); err != nil {
		t.Fatalf("read response: %v", err)
	}
	h := decodeHeader(hb[:])
	body := make([]byte, h.bodyLen)
	if _, err := io.ReadFull(nc, body); err != nil {
		t.Fatalf("read response body: %v", err)
	}
	return h, body
}

// Bad ops get error replies and leave the connection and the memory as
// they were; good ops on the same connection still work.
func TestResponderErrorReplies(t *testing.T) {
	tr := listen(t, 1)
	mem, _ := rdma.Alloc(4096)
	defer rdma.Free(mem)
	reg, err := tr.Register(mem, rdma.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	key := reg.Descriptor().RKey.Key
	nc, _, ok := rawDial(t, tr, goodHello(1))
	if !ok {
		t.Fatal("handshake refused")
	}
	cases := []struct {
		name string
		op   []byte
		code uint8
	}{
		{"unknown key", wireOpBytes(rdma.OpRead, 8, key+100, 0, 0, 0, nil), codeUnknownKey},
		{"out of bounds", wireOpBytes(rdma.OpWrite, 2, key, 4095, 0, 0, []byte("xy")), codeOutOfBounds},
		{"misaligned", wireOpBytes(rdma.OpFAA, 0, key, 3, 1, 0, nil), codeMisaligned},
		{"oversized read", wireOpBytes(rdma.OpRead, rdma.MaxTransfer+1, key, 0, 0, 0, nil), codeTooLarge},
		{"bad opcode", wireOpBytes(77, 0, key, 0, 0, 0, nil), codeBadRequest},
		{"zero opcode", wireOpBytes(0, 0, key, 0, 0, 0, nil), codeBadRequest},
	}
	for i, c := range cases {
		good := wireOpBytes(rdma.OpFAA, 0, key, 8, 1, 0, nil)
		mustWrite(t, nc, request(uint64(i+1), 3, good, c.op, good))
		h, body := readResponse(t, nc)
		if h.id != uint64(i+1) || h.status != c.code || h.count != 1 {
			t.Errorf("%s: response id %d status %d count %d, want id %d status %d count 1", c.name, h.id, h.status, h.count, i+1, c.code)
		}
		if len(body) < 8 || binary.LittleEndian.Uint64(body) != uint64(i) {
			t.Errorf("%s: FAA before the bad op returned %x", c.name, body)
		}
		if !errors.Is(newRemoteError(h.status, body[8:]), codeErrs[c.code]) {
			t.Errorf("%s: error text %q", c.name, body[8:])
		}
	}
	if got := rdma.LoadWord(mem, 8); got != uint64(len(cases)) {
		t.Errorf("counter %d, want %d: flushed ops executed", got, len(cases))
	}
	for i, b := range mem {
		if i >= 8 && i < 16 {
			continue
		}
		if b != 0 {
			t.Fatalf("byte %d of the registration changed", i)
		}
	}
}

// Frames that break the format close the connection, without a panic
// and without touching memory; the transport keeps serving others.
func TestResponderMalformedFrames(t *testing.T) {
	tr := listen(t, 1)
	mem, _ := rdma.Alloc(4096)
	defer rdma.Free(mem)
	reg, _ := tr.Register(mem, rdma.AccessAll)
	key := reg.Descriptor().RKey.Key
	w := wireOpBytes(rdma.OpWrite, 4, key, 0, 0, 0, []byte("EVIL"))
	hdr := func(bodyLen uint32, typ, status uint8, count uint16, id uint64) []byte {
		b := make([]byte, hdrLen)
		h := header{bodyLen: bodyLen, typ: typ, status: status, count: count, id: id}
		h.encode(b)
		return b
	}
	padded := bytes.Clone(w)
	padded[2] = 1
	lenOnFAA := wireOpBytes(rdma.OpFAA, 4, key, 0, 1, 0, nil)
	cases := []struct {
		name  string
		frame []byte
	}{
		{"unknown type", hdr(0, 9, 0, 0, 1)},
		{"response type", append(hdr(8, frameResponse, 0, 1, 1), make([]byte, 8)...)},
		{"status set", append(hdr(uint32(len(w)), frameRequest, 1, 1, 1), w...)},
		{"zero ops", hdr(0, frameRequest, 0, 0, 1)},
		{"too many ops", hdr(0, frameRequest, 0, rdma.MaxBatch+1, 1)},
		{"oversized frame", hdr(maxBody+1, frameRequest, 0, 1, 1)},
		{"truncated op", request(1, 1, w[:30])},
		{"write data short", request(1, 1, w[:len(w)-1])},
		{"trailing bytes", request(1, 1, w, []byte{0})},
		{"count above ops", request(1, 2, w)},
		{"non-zero padding", request(1, 1, padded)},
		{"length on FAA", request(1, 1, lenOnFAA)},
		{"oversized message", hdr(rdma.MaxMessage+1, frameMessage, 0, 0, 0)},
		{"message with id", append(hdr(1, frameMessage, 0, 0, 5), 'x')},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nc, _, ok := rawDial(t, tr, goodHello(1))
			if !ok {
				t.Fatal("handshake refused")
			}
			mustWrite(t, nc, c.frame)
			expectClosed(t, nc)
		})
	}
	if !bytes.Equal(mem, make([]byte, 4096)) {
		t.Error("a malformed frame modified registered memory")
	}
	// Still serving.
	peer := listen(t, 2)
	peer.AddPeer(1, tr.Addr())
	op := []rdma.Op{{Kind: rdma.OpWrite, RKey: rdma.RKey{Key: key}, Buf: []byte("good")}}
	if err := peer.Post(ctxT(t), 1, op); err != nil {
		t.Fatal(err)
	}
	if string(mem[:4]) != "good" {
		t.Errorf("memory %q after a good WRITE", mem[:4])
	}
}

// A batch whose results would not fit in one frame fails with an error
// reply at the first op that does not fit, atomics included.
func TestResponderBatchLimit(t *testing.T) {
	tr := listen(t, 1)
	mem, _ := rdma.Alloc(rdma.MaxTransfer)
	defer rdma.Free(mem)
	reg, _ := tr.Register(mem, rdma.AccessAll)
	key := reg.Descriptor().RKey.Key
	nc, _, ok := rawDial(t, tr, goodHello(1))
	if !ok {
		t.Fatal("handshake refused")
	}
	const reads = maxBody / rdma.MaxTransfer // the last one does not fit
	var ops [][]byte
	for i := 0; i < reads-1; i++ {
		ops = append(ops, wireOpBytes(rdma.OpRead, rdma.MaxTransfer, key, 0, 0, 0, nil))
	}
	ops = append(ops, wireOpBytes(rdma.OpRead, rdma.MaxTransfer-maxErrText, key, 0, 0, 0, nil))
	ops = append(ops, wireOpBytes(rdma.OpFAA, 0, key, 0, 1, 0, nil))
	mustWrite(t, nc, request(1, len(ops), ops...))
	h, body := readResponse(t, nc)
	if h.status != codeTooLarge || int(h.count) != len(ops)-1 {
		t.Fatalf("status %d count %d, want %d and %d", h.status, h.count, codeTooLarge, len(ops)-1)
	}
	if !errors.Is(newRemoteError(h.status, body[maxBody-maxErrText:]), rdma.ErrTooLarge) {
		t.Errorf("error text %q", body[maxBody-maxErrText:])
	}
	if rdma.LoadWord(mem, 0) != 0 {
		t.Error("the FAA past the limit executed")
	}
}

// Responses held back while more requests were buffered go out before the
// responder blocks, also when the frame that followed was a message.
func TestResponderFlushesHeldResponses(t *testing.T) {
	tr := listen(t, 1)
	got := make(chan string, 2)
	tr.SetHandler(func(from ids.NodeID, msg []byte) { got <- string(msg) })
	mem, _ := rdma.Alloc(4096)
	defer rdma.Free(mem)
	reg, _ := tr.Register(mem, rdma.AccessAll)
	key := reg.Descriptor().RKey.Key
	nc, _, ok := rawDial(t, tr, goodHello(1))
	if !ok {
		t.Fatal("handshake refused")
	}
	msg := make([]byte, hdrLen)
	(&header{bodyLen: 2, typ: frameMessage}).encode(msg)
	msg = append(msg, "hi"...)
	frames := append(request(1, 1, wireOpBytes(rdma.OpFAA, 0, key, 0, 1, 0, nil)), msg...)
	frames = append(frames, request(2, 1, wireOpBytes(rdma.OpFAA, 0, key, 0, 1, 0, nil))...)
	frames = append(frames, msg...)
	mustWrite(t, nc, frames)
	for id := uint64(1); id <= 2; id++ {
		h, body := readResponse(t, nc)
		if h.id != id || h.status != 0 || binary.LittleEndian.Uint64(body) != id-1 {
			t.Fatalf("response %+v %x, want id %d with old value %d", h, body, id, id-1)
		}
	}
	for i := 0; i < 2; i++ {
		if m := <-got; m != "hi" {
			t.Errorf("message %q", m)
		}
	}
}
