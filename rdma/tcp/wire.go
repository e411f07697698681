package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// The wire format. Every integer is little-endian.
//
// A connection starts with a hello in each direction (helloLen bytes):
//
//	magic u32 | version u16 | status u16 | from u32 | to u32 | nonce u64 | session u64
//
// The dialer sends first, naming itself (from), the node it means to reach
// (to) and its incarnation (nonce, drawn at random when its transport
// started; never zero); its session field is zero. The acceptor answers
// with its own hello, status 0, its own incarnation nonce and the id of the
// session table it keeps for the dialer's incarnation (never zero, unique
// within the acceptor's incarnation), or with a refusal status and closes
// the connection. The first helloPrefix bytes have the same layout in every
// version, so a refusal of another version is understood.
//
// After the hellos the connection carries frames. A frame is a header
// (hdrLen bytes) and a body of bodyLen bytes:
//
//	bodyLen u32 | type u8 | status u8 | count u16 | id u64
//
// frameRequest (dialer to acceptor): id is the batch's sequence number in
// the dialer's session with the acceptor's node (from 1, never reused,
// kept across connections). The body is the dialer's floor (reqPrefix
// bytes: every sequence number below it is finished at the dialer and
// will never be sent again; floor <= id < floor+maxInFlight) and then
// count ops, each an op header (opLen bytes) followed, for a WRITE only, by
// its n bytes of data:
//
//	floor u64 | ops...
//	op: kind u8 | zero [3]u8 | n u32 | key u64 | offset u64 | a u64 | b u64
//
// n is the transfer size of a READ or WRITE and zero otherwise; a is the
// compare value of a CAS and the addend of a FAA, b the new value of a CAS;
// unused fields are zero. status is zero.
//
// frameResponse (acceptor to dialer): the answer to the request with the
// same id. count is the number of ops that executed; status is zero when all
// did, or the code of the error of op count, which ended the batch. The body
// is the results of the executed ops in order (a READ's bytes, a CAS's or
// FAA's old word, nothing for a WRITE) followed, when status is not zero, by
// the error's text (at most maxErrText bytes). A request below the
// session's floor gets no response.
//
// frameMessage (dialer to acceptor): a two-sided message; the body is the
// message, count, status and id are zero.
const (
	magic       = 0x544d5344 // "DSMT"
	version     = 2
	helloPrefix = 16
	helloLen    = 32
	hdrLen      = 16
	reqPrefix   = 8
	opLen       = 40
	resultLen   = rdma.WordSize
	maxErrText  = 256
)

// maxInFlight is the most batches of one session that can be unfinished
// at once: the requester waits for a slot beyond it, and the responder
// remembers the outcomes of at most that many.
const maxInFlight = 1024

// Frame types.
const (
	frameRequest = 1 + iota
	frameResponse
	frameMessage
)

// maxBody bounds the body of every frame, and so the bytes one batch moves
// in each direction. A batch whose READs or WRITEs add up to more fails with
// ErrTooLarge before it is sent.
const maxBody = 64 << 20

// Hello statuses.
const (
	helloOK           = 0
	helloBadVersion   = 1
	helloWrongNode    = 2
	helloBadNode      = 3
	helloShuttingDown = 4
	helloBadHello     = 5
	// The hello claims another node than the TLS certificate names.
	helloNotAuthenticated = 6
	// The dialer's incarnation departed the cluster (Transport.Fence).
	helloFenced = 7
)

// Errors of this package. Failures of a peer's connection reach callers of
// Post and Send as a *rdma.PeerError wrapping rdma.ErrPeerUnreachable and
// one of these.
var (
	// ErrHandshake is a refused or malformed connection handshake.
	ErrHandshake = errors.New("tcp: handshake failed")
	// ErrProtocol is a frame that breaks the wire format; the connection
	// that carried it is closed.
	ErrProtocol = errors.New("tcp: protocol violation")
)

type hello struct {
	magic   uint32
	version uint16
	status  uint16
	from    ids.NodeID
	to      ids.NodeID
	nonce   uint64 // the sender's incarnation
	session uint64 // acceptor: the id of the dialer's session table; dialer: zero
}

// encode writes the hello into b (helloLen bytes).
func (h *hello) encode(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], h.magic)
	binary.LittleEndian.PutUint16(b[4:], h.version)
	binary.LittleEndian.PutUint16(b[6:], h.status)
	binary.LittleEndian.PutUint32(b[8:], uint32(h.from))
	binary.LittleEndian.PutUint32(b[12:], uint32(h.to))
	binary.LittleEndian.PutUint64(b[16:], h.nonce)
	binary.LittleEndian.PutUint64(b[24:], h.session)
}

// decodeHello parses the first helloPrefix bytes of b and, when b holds
// helloLen bytes, the rest.
func decodeHello(b []byte) hello {
	h := hello{
		magic:   binary.LittleEndian.Uint32(b[0:]),
		version: binary.LittleEndian.Uint16(b[4:]),
		status:  binary.LittleEndian.Uint16(b[6:]),
		from:    ids.NodeID(binary.LittleEndian.Uint32(b[8:])),
		to:      ids.NodeID(binary.LittleEndian.Uint32(b[12:])),
	}
	if len(b) >= helloLen {
		h.nonce = binary.LittleEndian.Uint64(b[16:])
		h.session = binary.LittleEndian.Uint64(b[24:])
	}
	return h
}

func helloRefusal(status uint16) string {
	switch status {
	case helloBadVersion:
		return "unsupported protocol version"
	case helloWrongNode:
		return "the listener is another node"
	case helloBadNode:
		return "invalid node id"
	case helloShuttingDown:
		return "the listener is closing"
	case helloBadHello:
		return "malformed hello"
	case helloNotAuthenticated:
		return "the node id in the hello is not the one this node's certificate names"
	case helloFenced:
		return "this incarnation departed the cluster: the peer refuses its verbs (start dsmd again to rejoin as a new incarnation)"
	}
	return fmt.Sprintf("status %d", status)
}

type header struct {
	bodyLen uint32
	typ     uint8
	status  uint8
	count   uint16
	id      uint64
}

func (h *header) encode(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], h.bodyLen)
	b[4] = h.typ
	b[5] = h.status
	binary.LittleEndian.PutUint16(b[6:], h.count)
	binary.LittleEndian.PutUint64(b[8:], h.id)
}

func decodeHeader(b []byte) header {
	return header{
		bodyLen: binary.LittleEndian.Uint32(b[0:]),
		typ:     b[4],
		status:  b[5],
		count:   binary.LittleEndian.Uint16(b[6:]),
		id:      binary.LittleEndian.Uint64(b[8:]),
	}
}

// wireOp is one decoded operation of a request. data aliases the request
// body (the bytes of a WRITE).
type wireOp struct {
	kind rdma.OpKind
	n    uint32
	key  uint64
	off  uint64
	a, b uint64
	data []byte
}

// decodeRequest parses the body of a request frame of count ops: the
// sender's floor, and the ops into out (reused), which it returns. It
// checks only the framing: the floor present, every op header complete,
// padding zero, a payload only on WRITE and exactly as long as its n, no
// trailing bytes. Whether an op is acceptable to the target (kind, key,
// bounds, rights, sizes) is the executor's question, answered with an error
// reply; whether the floor fits the request's id is the session's.
func decodeRequest(count int, body []byte, out []wireOp) (floor uint64, ops []wireOp, err error) {
	out = out[:0]
	if count < 1 || count > rdma.MaxBatch {
		return 0, out, fmt.Errorf("%w: request of %d ops", ErrProtocol, count)
	}
	if len(body) < reqPrefix {
		return 0, out, fmt.Errorf("%w: request of %d bytes has no floor", ErrProtocol, len(body))
	}
	floor = binary.LittleEndian.Uint64(body)
	ops, err = decodeOps(count, body[reqPrefix:], out)
	return floor, ops, err
}

// decodeOps parses the ops of a request body.
func decodeOps(count int, body []byte, out []wireOp) ([]wireOp, error) {
	p := 0
	for i := 0; i < count; i++ {
		if len(body)-p < opLen {
			return out, fmt.Errorf("%w: op %d truncated", ErrProtocol, i)
		}
		h := body[p : p+opLen]
		p += opLen
		if h[1]|h[2]|h[3] != 0 {
			return out, fmt.Errorf("%w: op %d has non-zero padding", ErrProtocol, i)
		}
		op := wireOp{
			kind: rdma.OpKind(h[0]),
			n:    binary.LittleEndian.Uint32(h[4:]),
			key:  binary.LittleEndian.Uint64(h[8:]),
			off:  binary.LittleEndian.Uint64(h[16:]),
			a:    binary.LittleEndian.Uint64(h[24:]),
			b:    binary.LittleEndian.Uint64(h[32:]),
		}
		switch op.kind {
		case rdma.OpWrite:
			if uint64(op.n) > uint64(len(body)-p) {
				return out, fmt.Errorf("%w: op %d: %d-byte WRITE in %d remaining bytes", ErrProtocol, i, op.n, len(body)-p)
			}
			op.data = body[p : p+int(op.n) : p+int(op.n)]
			p += int(op.n)
		case rdma.OpRead:
		default:
			if op.n != 0 {
				return out, fmt.Errorf("%w: op %d: length %d on %v", ErrProtocol, i, op.n, op.kind)
			}
		}
		out = append(out, op)
	}
	if p != len(body) {
		return out, fmt.Errorf("%w: %d trailing bytes after %d ops", ErrProtocol, len(body)-p, count)
	}
	return out, nil
}

// requestSize returns the body length of the request for ops and the body
// length of its full response, or an error when either exceeds maxBody.
// ops passed rdma.CheckBatch.
func requestSize(ops []rdma.Op) (req, resp int, err error) {
	r, s := uint64(reqPrefix), uint64(0)
	for i := range ops {
		r += opLen
		switch ops[i].Kind {
		case rdma.OpWrite:
			r += uint64(len(ops[i].Buf))
		case rdma.OpRead:
			s += uint64(len(ops[i].Buf))
		default:
			s += resultLen
		}
	}
	if r > maxBody {
		return 0, 0, fmt.Errorf("%w: batch writes %d bytes (tcp backend max %d per batch)", rdma.ErrTooLarge, r, maxBody)
	}
	if s+maxErrText > maxBody {
		return 0, 0, fmt.Errorf("%w: batch reads %d bytes (tcp backend max %d per batch)", rdma.ErrTooLarge, s, maxBody-maxErrText)
	}
	return int(r), int(s), nil
}

// encodeRequest writes the request frame for ops with sequence number id
// and the sender's floor into b, which has room for hdrLen+reqLen bytes.
func encodeRequest(b []byte, id, floor uint64, ops []rdma.Op, reqLen int) {
	h := header{bodyLen: uint32(reqLen), typ: frameRequest, count: uint16(len(ops)), id: id}
	h.encode(b)
	binary.LittleEndian.PutUint64(b[hdrLen:], floor)
	p := hdrLen + reqPrefix
	for i := range ops {
		op := &ops[i]
		o := b[p : p+opLen]
		clear(o)
		o[0] = byte(op.Kind)
		binary.LittleEndian.PutUint64(o[8:], op.RKey.Key)
		binary.LittleEndian.PutUint64(o[16:], op.Offset)
		p += opLen
		switch op.Kind {
		case rdma.OpRead:
			binary.LittleEndian.PutUint32(o[4:], uint32(len(op.Buf)))
		case rdma.OpWrite:
			binary.LittleEndian.PutUint32(o[4:], uint32(len(op.Buf)))
			p += copy(b[p:], op.Buf)
		case rdma.OpCAS:
			binary.LittleEndian.PutUint64(o[24:], op.Compare)
			binary.LittleEndian.PutUint64(o[32:], op.Operand)
		case rdma.OpFAA:
			binary.LittleEndian.PutUint64(o[24:], op.Operand)
		}
	}
}

// Error codes carried in a response's status. Zero is success.
const (
	codeUnknownKey = 1 + iota
	codeOutOfBounds
	codeMisaligned
	codeAccessDenied
	codeTooLarge
	codeBadRequest
	maxCode = codeBadRequest
)

var codeErrs = [...]error{
	codeUnknownKey:   rdma.ErrUnknownKey,
	codeOutOfBounds:  rdma.ErrOutOfBounds,
	codeMisaligned:   rdma.ErrMisaligned,
	codeAccessDenied: rdma.ErrAccessDenied,
	codeTooLarge:     rdma.ErrTooLarge,
	codeBadRequest:   rdma.ErrBadRequest,
}

// errCode maps an error of the target's executor to its wire code.
// Anything that is not one of the sentinels is reported as a bad request.
func errCode(err error) uint8 {
	for c := 1; c <= maxCode; c++ {
		if errors.Is(err, codeErrs[c]) {
			return uint8(c)
		}
	}
	return codeBadRequest
}

// remoteError is an op failure reported by the target: its text is the
// target's message, and it unwraps to the sentinel the code names.
type remoteError struct {
	sentinel error
	text     string
}

func (e *remoteError) Error() string {
	if e.text == "" {
		return e.sentinel.Error()
	}
	return e.text
}

func (e *remoteError) Unwrap() error { return e.sentinel }

func newRemoteError(code uint8, text []byte) error {
	if code < 1 || code > maxCode {
		code = codeBadRequest
	}
	return &remoteError{sentinel: codeErrs[code], text: string(text)}
}
