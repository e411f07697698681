package dsm

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dsmkit/dsm/internal/mapclient"
)

// Sentinel errors. Every error of this package (except the io.EOF of
// ReadAt) is an *Error that matches one of them, or a context error, with
// errors.Is, and keeps its cause (a gRPC status for instance) reachable
// with errors.As.
var (
	// ErrUnknownRegion: no region of that name exists.
	ErrUnknownRegion = errors.New("dsm: unknown region")
	// ErrRegionDeleted: the region of a mapped Region was deleted
	// (DeleteRegion with Force, through any node). The Region is dead:
	// Done is closed, Err, ReadAt, WriteAt, the atomics and Sync fail with
	// it, and plain accesses through Bytes() fault. It also matches
	// ErrUnknownRegion. A region created again under the same name is a
	// new, empty region: Map it anew.
	ErrRegionDeleted error = &narrowError{"dsm: region deleted", ErrUnknownRegion}
	// ErrExists: CreateRegion with a name that is taken by a region of
	// another size, page size or durability. Creating a region that exists
	// with the same spec succeeds.
	ErrExists = errors.New("dsm: region exists with a different spec")
	// ErrOutOfRange: an offset or a range outside the region.
	ErrOutOfRange = errors.New("dsm: out of range")
	// ErrUnaligned: an atomic operation or a Mutex on an offset that is not
	// a multiple of 8.
	ErrUnaligned = errors.New("dsm: offset not 8-byte aligned")
	// ErrClosed: the Region or the Client was closed.
	ErrClosed = errors.New("dsm: closed")
	// ErrDaemonUnavailable: dsmd cannot be reached, or went away. A Region
	// whose dsmd went away is dead: every access fails with this error; Map
	// the region again once dsmd is back.
	ErrDaemonUnavailable = errors.New("dsm: dsmd unavailable")
	// ErrNoMappings: the dsmd reached serves region calls but no mappings
	// (it runs without a page cache), so Map is impossible there.
	ErrNoMappings = errors.New("dsm: this dsmd serves no mappings")
	// ErrInvalidArgument: a request dsmd refuses as malformed (a bad region
	// name, a size that is not a multiple of the page size, a page size
	// that is not a power of two, ...). Retrying cannot help.
	ErrInvalidArgument = errors.New("dsm: invalid argument")
	// ErrInUse: the request is well formed but the state forbids it, such
	// as deleting a region that processes still map without Force.
	ErrInUse = errors.New("dsm: in use")
	// ErrNotLocked: Unlock of a Mutex that is not locked, or whose holder
	// was found dead and the lock taken over.
	ErrNotLocked = errors.New("dsm: mutex not locked")
	// ErrOwnerDied: Lock or TryLock acquired the Mutex, and the holder
	// before it died holding it (its process, Region or dsmd went away):
	// the data the lock protects may be half updated. The caller holds the
	// lock and must Unlock it.
	ErrOwnerDied = errors.New("dsm: mutex acquired; its previous holder died holding it")
	// ErrBarrierBroken: Barrier.Wait cannot complete: a party of the
	// barrier died (dsmd says its mapping session is over) while the
	// others waited, or Reset was called while this party waited. The
	// barrier stays broken, and every Wait fails at once with this error,
	// until Reset. When a dead party broke it, the error's cause is a
	// *DeadPartyError that names the party's session.
	ErrBarrierBroken = errors.New("dsm: barrier broken")
	// ErrTooManyParties: a Barrier's party words are all taken by live
	// parties, so one more process cannot wait on it.
	ErrTooManyParties = errors.New("dsm: barrier has all its parties")
	// ErrNotHeld: Semaphore.Release of more units than this mapping holds
	// (none, or fewer, or its units were taken back because dsmd judged
	// its session dead).
	ErrNotHeld = errors.New("dsm: semaphore units not held")
	// ErrCountMismatch: a Barrier or Semaphore used with another count
	// (parties, capacity) than the one its memory was first used with.
	ErrCountMismatch = errors.New("dsm: barrier or semaphore in use with another count")
	// ErrUnsupported: this dsmd does not implement the request (an older or
	// partial build).
	ErrUnsupported = errors.New("dsm: not supported by this dsmd")
	// ErrUnavailable: a page of the region waits for a node that is down
	// (failed, left) or has been unreachable for the engine's bound (10 s
	// by default): its home, or the node holding it. The message names the
	// page, the node and its role. Sync fails with it when a page it must
	// write back cannot reach its home (the write-back stays pending in
	// dsmd and completes if the home comes back). ReadAt, WriteAt,
	// Prefault and the atomics of a mapped Region fail with it once a
	// fault on such a page has waited the mapping's fault timeout
	// (WithFaultTimeout), and on that page until it is served again
	// (Region.Unavailable); a plain access through Bytes() gets SIGBUS
	// instead. See the package documentation, "Failures". Map fails with
	// it when the dsmd reached does not serve the region (it restarted
	// since the region was created, or joined later): map through another
	// node.
	ErrUnavailable = errors.New("dsm: page unavailable")
	// ErrPermissionDenied: dsmd refused this process: it is not allowed on
	// dsmd's socket (root, dsmd's user and dsmd's --socket-group are), or
	// the region's access list does not let its user do what it asked (map
	// and write need write access; Load and ReadMemory read access).
	ErrPermissionDenied = errors.New("dsm: permission denied")
	// ErrDataLost: Sync of a durable region found that a write it had to
	// persist was lost before: the nodes that held it (the page's home and
	// its backups, more than the region's Backups of them) failed before a
	// Sync made it durable. The message names the pages and versions. The
	// rest of the range is persisted; each loss is reported once, and the
	// next Sync of the range does not fail for it.
	ErrDataLost = errors.New("dsm: data lost")
)

// DeadPartyError is the cause of an ErrBarrierBroken error when a party
// of the barrier was found dead: Session is that party's mapping-session
// token (the protocol id of the dsmd incarnation that served it in the
// high 32 bits, the session's number there in the low ones).
type DeadPartyError struct {
	Session uint64
}

func (e *DeadPartyError) Error() string {
	return fmt.Sprintf("party with session %#x (protocol id %d of its dsmd, session %d) died", e.Session, e.Session>>32, e.Session&(1<<32-1))
}

// pageUnavailableReason is the google.rpc.ErrorInfo reason dsmd attaches
// to an UNAVAILABLE status for a page (types.proto).
const pageUnavailableReason = "PAGE_UNAVAILABLE"

// narrowError is a sentinel that is a special case of a broader one: it
// matches that one too with errors.Is.
type narrowError struct {
	text  string
	broad error
}

func (e *narrowError) Error() string { return e.text }
func (e *narrowError) Unwrap() error { return e.broad }

// noOffset is Error.Offset when the operation has none.
const noOffset = -1

// Error is a failed operation. It matches Kind (one of the sentinels, or
// nil) and Err (the cause) with errors.Is and errors.As.
type Error struct {
	// Op is the operation: "dial", "create region", "map", "read", "add"...
	Op string
	// Region is the region's name, or "".
	Region string
	// Offset is the byte offset the operation was at, or -1.
	Offset int64
	// Kind is the sentinel the error matches, or nil.
	Kind error
	// Err is the cause (a gRPC status, a mapclient error, a context error),
	// or nil.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("dsm: ")
	b.WriteString(e.Op)
	if e.Region != "" {
		fmt.Fprintf(&b, " %q", e.Region)
	}
	if e.Offset != noOffset {
		fmt.Fprintf(&b, " at offset %d", e.Offset)
	}
	if e.Kind != nil {
		b.WriteString(": ")
		b.WriteString(strings.TrimPrefix(e.Kind.Error(), "dsm: "))
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(causeText(e.Err))
	}
	return b.String()
}

// causeText is the cause without the wrapping of gRPC ("rpc error: code =
// ... desc = "), which the Kind already says in words.
func causeText(err error) string {
	if st, ok := status.FromError(err); ok && st.Code() != codes.OK && st.Code() != codes.Unknown {
		return st.Message()
	}
	return err.Error()
}

// Unwrap returns Kind and Err.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

func newErr(op, region string, off int64, kind, cause error) *Error {
	return &Error{Op: op, Region: region, Offset: off, Kind: kind, Err: cause}
}

// rpcErr wraps the error of an RPC with the sentinel its code means
// (types.proto). Context errors stay matchable with errors.Is.
func rpcErr(op, region string, err error) error {
	if err == nil {
		return nil
	}
	var kind error
	switch status.Code(err) {
	case codes.NotFound:
		kind = ErrUnknownRegion
	case codes.AlreadyExists:
		kind = ErrExists
	case codes.InvalidArgument:
		kind = ErrInvalidArgument
	case codes.FailedPrecondition:
		kind = ErrInUse
	case codes.Unavailable:
		kind = ErrDaemonUnavailable
		if pageUnavailable(err) {
			kind = ErrUnavailable
		}
	case codes.Unimplemented:
		kind = ErrUnsupported
	case codes.PermissionDenied:
		kind = ErrPermissionDenied
	case codes.DataLoss:
		kind = ErrDataLost
	case codes.DeadlineExceeded:
		kind = context.DeadlineExceeded
	case codes.Canceled:
		kind = context.Canceled
	}
	return newErr(op, region, noOffset, kind, err)
}

// pageUnavailable reports whether an UNAVAILABLE status is about a page
// (its ErrorInfo detail says PAGE_UNAVAILABLE) rather than dsmd itself.
func pageUnavailable(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == pageUnavailableReason {
			return true
		}
	}
	return false
}

// mapErr wraps an error of the mapping with this package's sentinels.
func mapErr(op, region string, off int64, err error) error {
	if err == nil {
		return nil
	}
	for _, k := range []struct{ from, to error }{
		{mapclient.ErrDaemonGone, ErrDaemonUnavailable},
		{mapclient.ErrUnavailable, ErrDaemonUnavailable},
		{mapclient.ErrClosed, ErrClosed},
		{mapclient.ErrRegionDeleted, ErrRegionDeleted},
		{mapclient.ErrUnknownRegion, ErrUnknownRegion},
		{mapclient.ErrOutOfRange, ErrOutOfRange},
		{mapclient.ErrPageUnavailable, ErrUnavailable},
		{mapclient.ErrPermissionDenied, ErrPermissionDenied},
	} {
		if !errors.Is(err, k.from) {
			continue
		}
		// dsmd's refusal says why in its text; its code is the Kind.
		var se *mapclient.ServerError
		if errors.As(err, &se) && k.to == ErrPermissionDenied {
			return newErr(op, region, off, k.to, errors.New(se.Text))
		}
		// The internal sentinel says what Kind says: keep only the detail.
		if err == k.from {
			return newErr(op, region, off, k.to, nil)
		}
		if rest, ok := strings.CutPrefix(err.Error(), k.from.Error()+": "); ok {
			return newErr(op, region, off, k.to, errors.New(rest))
		}
		return newErr(op, region, off, k.to, err)
	}
	return newErr(op, region, off, nil, err)
}
