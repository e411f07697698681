//go:build linux

package mapclient

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Populate faults [off, off+length) in from a syscall (madvise
// MADV_POPULATE_WRITE if write, else MADV_POPULATE_READ) without copying
// anything, so that plain accesses through Bytes() that follow find the
// pages mapped, unless the coherence protocol takes them away again
// meanwhile. A miss waits in the syscall, not in a load. It fails with
// ErrOutOfRange for a range outside the region and with Err's error
// (ErrDaemonGone, ErrRegionDeleted or ErrClosed) when the mapping is no
// longer served.
func (m *Mapping) Populate(off, length int64, write bool) error {
	if err := m.rlockLive(); err != nil {
		return err
	}
	defer m.mu.RUnlock()
	size := int64(len(m.b))
	if off < 0 || length < 0 || off > size || length > size-off {
		return fmt.Errorf("%w: %d bytes at %d of %d", ErrOutOfRange, length, off, size)
	}
	if length == 0 {
		return nil
	}
	if err := m.populate(off, length, write); err != nil {
		return err
	}
	return m.Err()
}

// populate faults in the whole pages that cover [off, off+length).
func (m *Mapping) populate(off, length int64, write bool) error {
	sys := int64(os.Getpagesize())
	lo := off / sys * sys
	for {
		gen := m.watchGen()
		var err error
		if write {
			err = m.mp.PopulateWrite(lo, off+length-lo)
		} else {
			err = m.mp.PopulateRead(lo, off+length-lo)
		}
		if err == nil {
			return nil
		}
		if serr := m.Err(); serr != nil {
			return serr
		}
		if retry, werr := m.waitWatchdog(gen); werr != nil {
			return werr
		} else if retry {
			continue // EFAULT of a mapping the lease watchdog held
		}
		if errors.Is(err, unix.EHWPOISON) {
			// A poison marker: dsmd gave up on a page (FaultTimeout).
			return m.unavailable(lo, off+length)
		}
		return err
	}
}

// Word runs op on the aligned 8-byte word at off of the mapping, for
// atomic operations in this process (sync/atomic). The word's page is
// faulted in first from a syscall (for writing if write), so a miss waits
// there; if the page is taken away between that and op, op's instruction
// faults and blocks until dsmd serves the page again. The state is checked
// before and after: if the mapping stopped being served, Word returns
// Err's error and what op saw or did cannot be trusted.
// off must be a multiple of 8 with the word inside the region
// (ErrOutOfRange otherwise). op must only do one access to the word.
func (m *Mapping) Word(off int64, write bool, op func(w *uint64)) (err error) {
	if err := m.rlockLive(); err != nil {
		return err
	}
	defer m.mu.RUnlock()
	size := int64(len(m.b))
	if off < 0 || off%8 != 0 || off > size-8 {
		return fmt.Errorf("%w: 8-byte word at %d of %d (must be 8-byte aligned and inside)", ErrOutOfRange, off, size)
	}
	for {
		if err := m.populate(off, 8, write); err != nil {
			return err
		}
		if err := m.Err(); err != nil {
			return err
		}
		gen := m.watchGen()
		fault := m.wordOp(off, op)
		if fault == nil {
			return m.Err()
		}
		if serr := m.Err(); serr != nil {
			return serr
		}
		if perr := m.poisonedIn(off, off+8); perr != nil {
			return perr
		}
		if retry, werr := m.waitWatchdog(gen); werr != nil {
			return werr
		} else if retry {
			continue // op faulted on a mapping the lease watchdog held: it did nothing
		}
		return fmt.Errorf("mapclient: fault on the word at %d: %v", off, fault)
	}
}

// wordOp runs op on the word at off and returns the fault it raised, if
// any: the end of the session (or Close) and the lease watchdog make the
// mapping inaccessible while Word may run, and a fault of op then becomes
// a panic recovered here, not a crash.
func (m *Mapping) wordOp(off int64, op func(w *uint64)) (fault any) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() { fault = recover() }()
	op((*uint64)(unsafe.Pointer(&m.b[off])))
	return nil
}
