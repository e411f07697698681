package uffd

import (
	"errors"
	"fmt"
	"syscall"
)

// Sentinel errors. Operations return them directly or inside an *OpError;
// test with errors.Is.
var (
	// ErrUnsupported: the kernel lacks userfaultfd or a required feature
	// (see *FeatureError for the details).
	ErrUnsupported = errors.New("uffd: not supported by this kernel")
	// ErrUnavailable: the kernel has userfaultfd but refuses this process
	// (neither the syscall nor /dev/userfaultfd is allowed).
	ErrUnavailable = errors.New("uffd: userfaultfd not permitted")
	// ErrClosed: the UFFD was closed (also returned to a Read blocked in
	// another goroutine).
	ErrClosed = errors.New("uffd: closed")
	// ErrNotUserfaultfd: a descriptor handed to FromFD is something else.
	ErrNotUserfaultfd = errors.New("uffd: file descriptor is not a userfaultfd")
	// ErrShortMsg: fewer than 32 bytes where a struct uffd_msg was expected.
	ErrShortMsg = errors.New("uffd: short message")
	// ErrUnknownEvent: a message with an event this package does not know.
	ErrUnknownEvent = errors.New("uffd: unknown event")
	// ErrMappingChanging: the kernel refused to resolve (EAGAIN, no progress)
	// because the faulting process is changing its mappings (fork, mremap,
	// munmap, madvise) and the event describing it has not been read yet.
	// Read the pending events, then retry. Only possible when the matching
	// Event* features were negotiated.
	ErrMappingChanging = errors.New("uffd: mappings are changing; read pending events, then retry")
	// ErrProcessGone: the process that owns the registered memory has exited
	// (ESRCH); its faults need no answer any more.
	ErrProcessGone = errors.New("uffd: the registered process has exited")
	// ErrNotCached: UFFDIO_CONTINUE found no page in the page cache at the
	// address (EFAULT on shmem): the page must be filled first, or the range
	// was punched out meanwhile.
	ErrNotCached = errors.New("uffd: no page in the page cache to map")
)

// OpError describes a failed operation on a range of the registered process.
// It unwraps to the sentinel that classifies it (if any) and to the raw errno.
type OpError struct {
	Op    string // "register", "copy", "continue", ...
	Start uint64 // first address of the range, in the registered process
	Len   uint64
	Errno syscall.Errno // what the kernel said
	Err   error         // a sentinel of this package, or nil
}

func (e *OpError) Error() string {
	msg := e.Errno.Error()
	if e.Err != nil {
		msg = e.Err.Error() + " (" + msg + ")"
	}
	return fmt.Sprintf("uffd: %s [%#x, +%#x): %s", e.Op, e.Start, e.Len, msg)
}

// Unwrap returns the sentinel and the errno, for errors.Is.
func (e *OpError) Unwrap() []error {
	if e.Err != nil {
		return []error{e.Err, e.Errno}
	}
	return []error{e.Errno}
}

func opError(op string, start, length uint64, errno syscall.Errno) error {
	e := &OpError{Op: op, Start: start, Len: length, Errno: errno}
	switch errno {
	case syscall.ESRCH:
		e.Err = ErrProcessGone
	case syscall.EAGAIN:
		e.Err = ErrMappingChanging
	case syscall.EBADF:
		e.Err = ErrClosed
	}
	return e
}
