package mapproto

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"
)

// The lease page (docs/failover.md §9, "The library's watchdog") is a
// small memfd that dsmd shares read-only with the clients that ask for it
// (FeatureLeasePage): dsmd writes in it until when its clients may touch
// their mappings, and a client's watchdog makes its mapping inaccessible
// when that time passes without dsmd moving it, as happens when dsmd is
// stopped (SIGSTOP, a long stall) and so cannot suspend its page cache
// itself.
//
// The record is LeaseRecordSize bytes at the start of the page: six
// 64-bit words in the machine's byte order (both sides run on the same
// machine), each read and written atomically; a reader's snapshot of them
// (LoadLease, DecodeLease, EncodeLease) is little endian:
//
//	0  magic     LeaseMagic: the layout and its version
//	1  sequence  even while the record is stable, odd while dsmd writes it
//	2  incarnation  dsmd's incarnation (the directory nonce); 0: none yet
//	3  deadline  CLOCK_BOOTTIME nanoseconds; access is allowed before it
//	4  state     LeaseState
//	5  epoch     the directory epoch dsmd had applied when it wrote
//
// dsmd is the only writer (StoreLease: sequence+1, the fields, sequence+1
// again); readers (LoadLease) retry until they read the same even sequence
// before and after the fields, so they never see a torn record. A writer
// stopped in the middle leaves the sequence odd: LoadLease then fails
// (ErrLeaseTorn), and a watchdog treats that as an expired lease.

// LeaseMagic is the first word of a lease page of this layout: "DSMLEAS"
// and the layout version 1.
const LeaseMagic uint64 = 0x01_53_41_45_4c_4d_53_44 // bytes D S M L E A S 1

// LeaseRecordSize is the size of the record at the start of a lease page.
const LeaseRecordSize = 6 * 8

// LeaseState is what dsmd says it does with its page cache. The zero value
// is invalid.
type LeaseState uint64

// Lease states.
const (
	// LeaseServing: dsmd serves its clients until the deadline.
	LeaseServing LeaseState = 1 + iota
	// LeaseSuspended: dsmd suspended its page cache (no lease); the
	// deadline is in the past.
	LeaseSuspended
	// LeaseDraining: dsmd is draining (shutting down); it still serves
	// until the deadline, and ends the sessions.
	LeaseDraining
	// LeaseRevoked: dsmd suspended its page cache and finished revoking
	// every local access (every page it held is punched out of the
	// mappings): an access faults into dsmd and waits there until it
	// serves again, so a client need not keep its mapping inaccessible.
	// The deadline is in the past.
	LeaseRevoked
	leaseStateEnd
)

func (s LeaseState) String() string {
	switch s {
	case LeaseServing:
		return "serving"
	case LeaseSuspended:
		return "suspended"
	case LeaseDraining:
		return "draining"
	case LeaseRevoked:
		return "revoked"
	}
	return fmt.Sprintf("lease-state(%d)", uint64(s))
}

// Lease is the record of a lease page.
type Lease struct {
	Incarnation uint64
	// Deadline is on CLOCK_BOOTTIME, as a duration since boot: a client
	// may access its mapping while the clock reads less.
	Deadline time.Duration
	State    LeaseState
	Epoch    uint64
}

func (l Lease) String() string {
	return fmt.Sprintf("lease %s until %v (incarnation %#x, epoch %d)", l.State, l.Deadline, l.Incarnation, l.Epoch)
}

// ErrLeaseTorn: a lease page whose writer did not finish a write (it is
// stopped in the middle of one, or writes faster than the reader reads).
var ErrLeaseTorn = fmt.Errorf("%w: lease page being written", ErrMalformed)

// EncodeLease returns the record of l with sequence seq, as a reader's
// snapshot holds it (for tests and fakes; dsmd writes with StoreLease).
func EncodeLease(l Lease, seq uint64) []byte {
	b := make([]byte, 0, LeaseRecordSize)
	le := binary.LittleEndian
	b = le.AppendUint64(b, LeaseMagic)
	b = le.AppendUint64(b, seq)
	b = le.AppendUint64(b, l.Incarnation)
	b = le.AppendUint64(b, uint64(l.Deadline))
	b = le.AppendUint64(b, uint64(l.State))
	b = le.AppendUint64(b, l.Epoch)
	return b
}

// DecodeLease parses a snapshot of a lease page's record (its first
// LeaseRecordSize bytes; more are ignored). It never panics; any defect is
// an error wrapping ErrMalformed: another layout, an odd sequence
// (ErrLeaseTorn), an unknown state, a negative deadline.
func DecodeLease(b []byte) (Lease, uint64, error) {
	if len(b) < LeaseRecordSize {
		return Lease{}, 0, fmt.Errorf("%w: lease record of %d bytes", ErrMalformed, len(b))
	}
	le := binary.LittleEndian
	if m := le.Uint64(b); m != LeaseMagic {
		return Lease{}, 0, fmt.Errorf("%w: lease page magic %#x (want %#x)", ErrMalformed, m, LeaseMagic)
	}
	seq := le.Uint64(b[8:])
	if seq&1 != 0 {
		return Lease{}, 0, ErrLeaseTorn
	}
	l := Lease{
		Incarnation: le.Uint64(b[16:]),
		Deadline:    time.Duration(le.Uint64(b[24:])),
		State:       LeaseState(le.Uint64(b[32:])),
		Epoch:       le.Uint64(b[40:]),
	}
	if l.State == 0 || l.State >= leaseStateEnd {
		return Lease{}, 0, fmt.Errorf("%w: lease state %d", ErrMalformed, uint64(l.State))
	}
	if l.Deadline < 0 {
		return Lease{}, 0, fmt.Errorf("%w: lease deadline %d", ErrMalformed, int64(l.Deadline))
	}
	return l, seq, nil
}

// leaseWords is the record in a mapped lease page.
func leaseWords(page []byte) (*[LeaseRecordSize / 8]uint64, error) {
	if len(page) < LeaseRecordSize {
		return nil, fmt.Errorf("%w: lease page of %d bytes", ErrMalformed, len(page))
	}
	if uintptr(unsafe.Pointer(&page[0]))%8 != 0 {
		return nil, fmt.Errorf("%w: lease page not aligned", ErrMalformed)
	}
	return (*[LeaseRecordSize / 8]uint64)(unsafe.Pointer(&page[0])), nil
}

// leaseReadTries bounds LoadLease's retries of a record being written; a
// write is six atomic stores, so a writer that runs finishes long before.
const leaseReadTries = 1000

// LoadLease reads the record of the lease page mapped at page (shared
// memory another process writes), with the sequence protocol above. A
// record still being written after many tries is ErrLeaseTorn.
func LoadLease(page []byte) (Lease, error) {
	w, err := leaseWords(page)
	if err != nil {
		return Lease{}, err
	}
	var snap [LeaseRecordSize]byte
	le := binary.LittleEndian
	for range leaseReadTries {
		s1 := atomic.LoadUint64(&w[1])
		if s1&1 != 0 {
			continue
		}
		for i := range w {
			le.PutUint64(snap[8*i:], atomic.LoadUint64(&w[i]))
		}
		if atomic.LoadUint64(&w[1]) != s1 {
			continue
		}
		l, _, err := DecodeLease(snap[:])
		return l, err
	}
	return Lease{}, ErrLeaseTorn
}

// StoreLease writes l into the lease page mapped writable at page. There
// must be only one writer at a time (dsmd serializes its writes).
func StoreLease(page []byte, l Lease) error {
	w, err := leaseWords(page)
	if err != nil {
		return err
	}
	seq := atomic.LoadUint64(&w[1])
	seq += seq & 1 // a write cut short (it cannot be, with one writer) ends now
	atomic.StoreUint64(&w[1], seq+1)
	atomic.StoreUint64(&w[0], LeaseMagic)
	atomic.StoreUint64(&w[2], l.Incarnation)
	atomic.StoreUint64(&w[3], uint64(l.Deadline))
	atomic.StoreUint64(&w[4], uint64(l.State))
	atomic.StoreUint64(&w[5], l.Epoch)
	atomic.StoreUint64(&w[1], seq+2)
	return nil
}
