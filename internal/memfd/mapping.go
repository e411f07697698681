//go:build linux

package memfd

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Mapping is one shared mapping of a memfd in this process.
type Mapping struct {
	mu sync.Mutex
	b  []byte // nil after Unmap
}

// Bytes returns the mapped memory. It must not be used after Unmap.
func (mp *Mapping) Bytes() []byte {
	mp.mu.Lock()
	defer mp.mu.Unlock()
	return mp.b
}

// Addr is the address of the first mapped byte (what a userfaultfd of this
// process registers and what its fault messages are relative to).
func (mp *Mapping) Addr() uint64 {
	b := mp.Bytes()
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&b[0])))
}

// Len is the mapping's length in bytes.
func (mp *Mapping) Len() int64 { return int64(len(mp.Bytes())) }

// Unmap removes the mapping; later calls are no-ops.
func (mp *Mapping) Unmap() error {
	mp.mu.Lock()
	defer mp.mu.Unlock()
	if mp.b == nil {
		return nil
	}
	err := unix.Munmap(mp.b)
	mp.b = nil
	if err != nil {
		return fmt.Errorf("memfd: munmap: %w", err)
	}
	return nil
}

func (mp *Mapping) sub(off, length int64) ([]byte, error) {
	b := mp.Bytes()
	if b == nil {
		return nil, ErrClosed
	}
	ps := int64(os.Getpagesize())
	if off < 0 || length <= 0 || off%ps != 0 || off > int64(len(b)) || length > int64(len(b))-off {
		return nil, fmt.Errorf("%w: [%d, +%d) of a %d-byte mapping", ErrRange, off, length, len(b))
	}
	return b[off : off+length], nil
}

// PopulateRead faults the pages of [off, off+length) in for reading from
// inside the madvise(MADV_POPULATE_READ) syscall, so the calling goroutine
// waits in a syscall (not in a load instruction) while a userfaultfd handler
// resolves the faults. Offsets are relative to the mapping; length is
// rounded up to whole pages.
func (mp *Mapping) PopulateRead(off, length int64) error {
	return mp.madvise("populate-read", off, length, unix.MADV_POPULATE_READ)
}

// PopulateWrite is PopulateRead for writing (MADV_POPULATE_WRITE): on return
// the pages are mapped writable (any write-protection fault resolved).
func (mp *Mapping) PopulateWrite(off, length int64) error {
	return mp.madvise("populate-write", off, length, unix.MADV_POPULATE_WRITE)
}

// DontFork keeps the mapping out of children created by fork
// (MADV_DONTFORK): a child never inherits a userfaultfd-registered range.
func (mp *Mapping) DontFork() error {
	return mp.madvise("dontfork", 0, mp.Len(), unix.MADV_DONTFORK)
}

func (mp *Mapping) madvise(op string, off, length int64, advice int) error {
	ps := int64(os.Getpagesize())
	length = (length + ps - 1) / ps * ps
	b, err := mp.sub(off, length)
	if err != nil {
		return err
	}
	for {
		err = unix.Madvise(b, advice)
		// EINTR: a signal (the Go runtime preempts with SIGURG) interrupted a
		// wait for a fault; populating is idempotent, so start again.
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("memfd: %s [%d, +%d): %w", op, off, length, err)
	}
	return nil
}

// Resident reports, per page of [off, off+length) of the mapping, whether
// mincore(2) finds it resident. For a shared file mapping that is the page
// cache's view (a page another process brought in counts even where this
// process has no PTE for it); it never faults anything in.
func (mp *Mapping) Resident(off, length int64) ([]bool, error) {
	b, err := mp.sub(off, length)
	if err != nil {
		return nil, err
	}
	ps := int64(os.Getpagesize())
	vec := make([]byte, (length+ps-1)/ps)
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0])))
	if errno != 0 {
		return nil, fmt.Errorf("memfd: mincore: %w", errno)
	}
	out := make([]bool, len(vec))
	for i, v := range vec {
		out[i] = v&1 != 0
	}
	return out, nil
}
