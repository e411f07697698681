package rdma

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Alloc returns n bytes of zeroed memory off the Go heap (an anonymous
// private mapping), suitable for registration: it never moves and the
// garbage collector never scans it. Release it with Free after Deregister.
// Untouched pages cost nothing: the mapping reserves address space only
// (MAP_NORESERVE), so n may far exceed memory; a page is committed when it
// is first written.
func Alloc(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("rdma: alloc of %d bytes", n)
	}
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("rdma: mmap %d bytes: %w", n, err)
	}
	return b, nil
}

// Free releases memory from Alloc.
func Free(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("rdma: munmap: %w", err)
	}
	return nil
}

// word returns the aligned word at off. The caller has checked bounds and
// alignment (CheckOp); the backing memory of a registration is page
// aligned, so an aligned offset is an aligned address.
func word(mem []byte, off uint64) *uint64 {
	return (*uint64)(unsafe.Pointer(&mem[off]))
}

func checkWord(mem []byte, off uint64) {
	if off%WordSize != 0 || off+WordSize > uint64(len(mem)) || uintptr(unsafe.Pointer(&mem[0]))%WordSize != 0 {
		panic(fmt.Sprintf("rdma: word at %d of %d bytes is out of bounds or misaligned", off, len(mem)))
	}
}

// LoadWord atomically loads the word at off of registered memory. The local
// owner of memory that peers update with CAS or FAA must use these helpers
// so that its accesses are atomic with respect to theirs. A bad offset is a
// programming error and panics.
func LoadWord(mem []byte, off uint64) uint64 {
	checkWord(mem, off)
	return atomic.LoadUint64(word(mem, off))
}

// StoreWord atomically stores v at off.
func StoreWord(mem []byte, off uint64, v uint64) {
	checkWord(mem, off)
	atomic.StoreUint64(word(mem, off), v)
}

// CASWord atomically compares the word at off with old and, if equal,
// stores new. It returns the word as it was before.
func CASWord(mem []byte, off uint64, old, new uint64) uint64 {
	checkWord(mem, off)
	p := word(mem, off)
	for {
		cur := atomic.LoadUint64(p)
		if cur != old {
			return cur
		}
		if atomic.CompareAndSwapUint64(p, old, new) {
			return old
		}
	}
}

// AddWord atomically adds delta to the word at off and returns the word as
// it was before.
func AddWord(mem []byte, off uint64, delta uint64) uint64 {
	checkWord(mem, off)
	return atomic.AddUint64(word(mem, off), delta) - delta
}

// Execute performs op on mem, a registration of len(mem) bytes with rights
// acc, as a target does for a remote request: it validates the op with
// CheckOp, then copies or updates the memory (atomics with sync/atomic). It
// is the execution engine of the software backends.
func Execute(mem []byte, acc Access, op *Op) error {
	if err := CheckOp(op.Kind, op.Offset, op.Size(), uint64(len(mem)), acc); err != nil {
		return err
	}
	switch op.Kind {
	case OpRead:
		copy(op.Buf, mem[op.Offset:])
	case OpWrite:
		copy(mem[op.Offset:], op.Buf)
	case OpCAS:
		op.Result = CASWord(mem, op.Offset, op.Compare, op.Operand)
	case OpFAA:
		op.Result = AddWord(mem, op.Offset, op.Operand)
	}
	return nil
}
