package rdma

import (
	"context"
	"errors"
	"fmt"

	"github.com/dsmkit/dsm/internal/ids"
)

// Access is the set of rights a registration grants to remote peers.
type Access uint8

const (
	// AccessRemoteRead lets peers READ the memory.
	AccessRemoteRead Access = 1 << iota
	// AccessRemoteWrite lets peers WRITE the memory.
	AccessRemoteWrite
	// AccessRemoteAtomic lets peers CAS and FAA aligned words of the memory.
	AccessRemoteAtomic

	// AccessAll grants every remote right.
	AccessAll = AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic
)

func (a Access) String() string {
	s := []byte("---")
	if a&AccessRemoteRead != 0 {
		s[0] = 'r'
	}
	if a&AccessRemoteWrite != 0 {
		s[1] = 'w'
	}
	if a&AccessRemoteAtomic != 0 {
		s[2] = 'a'
	}
	return string(s)
}

// RKey is what a peer needs to name registered memory in an operation: the
// registration's key and, on fabrics that address remote memory by virtual
// address, the target's address of the registration's first byte. Backends
// that address by offset leave Base zero. Callers treat an RKey as opaque and
// copy it from the target's Descriptor.
type RKey struct {
	Key  uint64
	Base uint64
}

// Descriptor is the public description of one registration: everything a
// peer needs to address it. Nodes publish their descriptors (the directory
// carries them) so that peers can reach their memory.
type Descriptor struct {
	Node   ids.NodeID
	RKey   RKey
	Len    uint64
	Access Access
}

func (d Descriptor) String() string {
	return fmt.Sprintf("%v/key=%#x len=%d %v", d.Node, d.RKey.Key, d.Len, d.Access)
}

// OpKind is the kind of a one-sided operation. The zero value is invalid.
type OpKind uint8

const (
	// OpRead copies len(Buf) bytes of remote memory into Buf.
	OpRead OpKind = 1 + iota
	// OpWrite copies Buf into remote memory.
	OpWrite
	// OpCAS compares the aligned remote word with Compare and, if equal,
	// replaces it with Operand. Result receives the word as it was before.
	OpCAS
	// OpFAA adds Operand to the aligned remote word (wrapping). Result
	// receives the word as it was before.
	OpFAA
)

func (k OpKind) String() string {
	switch k {
	case OpRead:
		return "READ"
	case OpWrite:
		return "WRITE"
	case OpCAS:
		return "CAS"
	case OpFAA:
		return "FAA"
	}
	return fmt.Sprintf("OpKind(%d)", uint8(k))
}

// WordSize is the size of the words that CAS and FAA act on. Words in
// registered memory are stored in the host's byte order (little-endian on
// every platform the service supports), so READ of a word returns the same
// bytes that a local atomic load would see.
const WordSize = 8

// Limits every backend enforces.
const (
	// MaxTransfer is the largest READ or WRITE: the largest page (2 MiB)
	// with room to spare.
	MaxTransfer = 4 << 20
	// MaxBatch is the most operations one Post may carry.
	MaxBatch = 256
	// MaxBatchBytes is the most that the READs of one batch may fetch, and
	// the most that its WRITEs may carry.
	MaxBatchBytes = 32 << 20
	// MaxMessage is the largest two-sided message.
	MaxMessage = 64 << 10
)

// Op is one one-sided operation on a peer's registered memory. The caller
// fills Kind, RKey, Offset and the operands; Post fills Result and Err.
//
// An Op is addressed by (peer, RKey, Offset): the peer is named by Post, the
// registration by RKey and the first byte by Offset from its start.
type Op struct {
	Kind   OpKind
	RKey   RKey
	Offset uint64
	// Buf is the destination of a READ and the source of a WRITE; its length
	// is the transfer size. Unused by atomics.
	Buf []byte
	// Compare is the expected value of a CAS.
	Compare uint64
	// Operand is the new value of a CAS and the addend of an FAA.
	Operand uint64
	// Result is the word before a CAS or FAA, set when the operation
	// succeeded.
	Result uint64
	// Err is nil when the operation executed at the target.
	Err error
}

// Size is the number of bytes the operation touches at the target.
func (op *Op) Size() uint64 {
	switch op.Kind {
	case OpCAS, OpFAA:
		return WordSize
	}
	return uint64(len(op.Buf))
}

func (op *Op) String() string {
	switch op.Kind {
	case OpCAS:
		return fmt.Sprintf("CAS key=%#x off=%d cmp=%#x new=%#x", op.RKey.Key, op.Offset, op.Compare, op.Operand)
	case OpFAA:
		return fmt.Sprintf("FAA key=%#x off=%d add=%#x", op.RKey.Key, op.Offset, op.Operand)
	}
	return fmt.Sprintf("%v key=%#x off=%d len=%d", op.Kind, op.RKey.Key, op.Offset, len(op.Buf))
}

// Handler receives a two-sided message. It runs on a transport goroutine and
// must not block for long; it owns msg.
type Handler func(from ids.NodeID, msg []byte)

// Registration is memory that a node exposes to its peers.
type Registration interface {
	// Descriptor is what peers need to address this memory.
	Descriptor() Descriptor
	// Bytes is the registered memory itself. The owner may read and write
	// it; words that peers touch with atomics must be accessed with the
	// atomic helpers of this package (LoadWord, CASWord, ...).
	Bytes() []byte
	// Deregister revokes remote access: operations that arrive afterwards
	// fail with ErrUnknownKey. The memory itself stays the caller's.
	Deregister() error
}

// Transport is one node's endpoint on the fabric: it exposes registered
// memory to peers and issues one-sided operations and small messages to
// them. All methods are safe for concurrent use.
type Transport interface {
	// LocalID is this endpoint's node id.
	LocalID() ids.NodeID
	// Addr is the address peers use to reach this endpoint.
	Addr() string
	// AddPeer records (or changes) the address of a peer. Connections are
	// made on first use and re-made after a failure.
	AddPeer(id ids.NodeID, addr string) error
	// RemovePeer forgets a peer: its connection is closed and operations
	// pending on it fail with ErrPeerUnreachable.
	RemovePeer(id ids.NodeID)
	// Register exposes mem (which must stay valid and unmoved until
	// Deregister; use Alloc for memory off the Go heap) with the given
	// rights.
	Register(mem []byte, access Access) (Registration, error)
	// Post executes ops at peer as one batch, in order, like work requests
	// posted to one queue pair with a single doorbell: the batch costs one
	// round trip. It returns when every op has completed (Result and Err
	// filled) or when ctx ends. The first failing op ends the batch: the
	// ops after it are not executed and report ErrFlushed, and Post returns
	// that first error. A batch that fails CheckBatch (empty, too many
	// ops or bytes, an oversized transfer, an unknown kind) is not sent: every op
	// reports that error. When ctx ends first, Post returns ctx.Err(); the
	// ops may or may not have executed at the target, but Post never
	// touches ops or their buffers after it returned. Posting to the local
	// node executes the ops on local registered memory.
	//
	// What an error says about execution: a batch executes at most once.
	// An error that wraps ErrOutcomeUnknown means the batch may have
	// executed (a prefix of it, as far as the target got) or not, and
	// nothing more will be learnt of it: the caller must not assume
	// either, and must not simply post it again if executing it twice
	// would be wrong. A context error means the same unless the backend
	// documents otherwise (some wrap ErrOutcomeUnknown in it when the
	// batch may have reached the target, and return the context error
	// alone when it cannot have). Any other error means that no op
	// executed except those whose Err is nil: an op the target refused
	// (ErrUnknownKey, ErrOutOfBounds, ...) and the ErrFlushed ops after
	// it did not execute, and a failure to reach the peer at all
	// (ErrPeerUnreachable without ErrOutcomeUnknown, ErrUnknownPeer,
	// ErrClosed alone) executed nothing.
	Post(ctx context.Context, peer ids.NodeID, ops []Op) error
	// Send delivers msg (at most MaxMessage bytes) to the handler of peer.
	// It returns once the message is queued for the peer: messages are not
	// acknowledged. Messages to one peer arrive in the order they were
	// sent; a message can be lost when the connection fails, and Send then
	// reports it if it still can.
	Send(ctx context.Context, peer ids.NodeID, msg []byte) error
	// SetHandler installs the receiver of messages. Messages that arrive
	// before a handler is set are dropped.
	SetHandler(h Handler)
	// Close releases the endpoint: pending operations fail with ErrClosed.
	Close() error
}

// Errors reported by operations. Remote failures are reported with these
// sentinels (test with errors.Is); failures of the connection are wrapped in
// a *PeerError that names the peer.
var (
	ErrUnknownKey      = errors.New("rdma: unknown or deregistered memory key")
	ErrOutOfBounds     = errors.New("rdma: access out of the registered bounds")
	ErrMisaligned      = errors.New("rdma: atomic on a word that is not 8-byte aligned")
	ErrAccessDenied    = errors.New("rdma: access not permitted by the registration")
	ErrTooLarge        = errors.New("rdma: request too large")
	ErrBadRequest      = errors.New("rdma: malformed request")
	ErrFlushed         = errors.New("rdma: not executed: an earlier operation of its batch failed")
	ErrUnknownPeer     = errors.New("rdma: unknown peer")
	ErrPeerUnreachable = errors.New("rdma: peer unreachable")
	ErrClosed          = errors.New("rdma: transport closed")
	// ErrIncarnation refuses an operation or message to a peer whose
	// process is not the incarnation this node was told to reach (a
	// restarted peer, before the directory says so): nothing was sent.
	ErrIncarnation = errors.New("rdma: the peer is another incarnation than expected")
	// ErrOutcomeUnknown marks a batch that may or may not have executed at
	// the target: its request may have reached the peer, and its answer
	// never came back (see Transport.Post). It comes wrapped with the
	// reason, usually ErrPeerUnreachable or ErrClosed.
	ErrOutcomeUnknown = errors.New("rdma: outcome unknown: the batch may have executed")
)

// PeerError is a failure that concerns one peer as a whole (an unknown peer,
// a refused or broken connection).
type PeerError struct {
	Peer ids.NodeID
	Err  error
}

func (e *PeerError) Error() string { return fmt.Sprintf("peer %v: %v", e.Peer, e.Err) }

// Unwrap returns the cause.
func (e *PeerError) Unwrap() error { return e.Err }

// CheckBatch validates the shape of a batch before it is sent: count, kinds
// and sizes. Per-registration checks (key, bounds, rights, alignment) happen
// at the target with CheckOp.
func CheckBatch(ops []Op) error {
	if len(ops) == 0 {
		return fmt.Errorf("%w: empty batch", ErrBadRequest)
	}
	if len(ops) > MaxBatch {
		return fmt.Errorf("%w: %d operations in one batch (max %d)", ErrTooLarge, len(ops), MaxBatch)
	}
	var reads, writes int
	for i := range ops {
		switch ops[i].Kind {
		case OpRead, OpWrite:
			n := len(ops[i].Buf)
			if n > MaxTransfer {
				return fmt.Errorf("%w: %d-byte %v (max %d)", ErrTooLarge, n, ops[i].Kind, MaxTransfer)
			}
			if ops[i].Kind == OpRead {
				reads += n
			} else {
				writes += n
			}
		case OpCAS, OpFAA:
		default:
			return fmt.Errorf("%w: %v", ErrBadRequest, ops[i].Kind)
		}
	}
	if reads > MaxBatchBytes || writes > MaxBatchBytes {
		return fmt.Errorf("%w: batch reads %d and writes %d bytes (max %d each)", ErrTooLarge, reads, writes, MaxBatchBytes)
	}
	return nil
}

// CheckOp validates one operation of kind k on n bytes at off against a
// registration of size regLen with rights acc. It is the single definition
// of what a target accepts, shared by every backend.
func CheckOp(k OpKind, off, n, regLen uint64, acc Access) error {
	var need Access
	switch k {
	case OpRead:
		need = AccessRemoteRead
	case OpWrite:
		need = AccessRemoteWrite
	case OpCAS, OpFAA:
		need = AccessRemoteAtomic
		if n != WordSize {
			return fmt.Errorf("%w: %d-byte atomic", ErrBadRequest, n)
		}
		if off%WordSize != 0 {
			return fmt.Errorf("%w: offset %d", ErrMisaligned, off)
		}
	default:
		return fmt.Errorf("%w: opcode %d", ErrBadRequest, uint8(k))
	}
	if n > MaxTransfer {
		return fmt.Errorf("%w: %d bytes", ErrTooLarge, n)
	}
	if off > regLen || n > regLen-off {
		return fmt.Errorf("%w: [%d, +%d) of %d bytes", ErrOutOfBounds, off, n, regLen)
	}
	if acc&need != need {
		return fmt.Errorf("%w: %v on %v memory", ErrAccessDenied, k, acc)
	}
	return nil
}

// FlushAfter marks every op after index i as not executed.
func FlushAfter(ops []Op, i int) {
	for j := i + 1; j < len(ops); j++ {
		ops[j].Err = ErrFlushed
	}
}

// FailAll marks every op with err.
func FailAll(ops []Op, err error) {
	for j := range ops {
		ops[j].Err = err
	}
}
