//go:build linux

package mapclient

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// noVMCopy makes every copy a plain memmove (for tests of that path).
var noVMCopy bool

// vmCopyWorks reports whether process_vm_readv on this process is allowed
// (a seccomp filter or an old kernel may refuse it).
var vmCopyWorks = sync.OnceValue(func() bool {
	src, dst := []byte{1}, []byte{0}
	liov := []unix.Iovec{{Base: &dst[0], Len: 1}}
	riov := []unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&src[0])), Len: 1}}
	n, err := unix.ProcessVMReadv(os.Getpid(), liov, riov, 0)
	return err == nil && n == 1 && dst[0] == 1
})

// useVMCopy reports whether copies between a buffer and the mapping go
// through process_vm_readv/writev on this process.
func useVMCopy() bool { return !noVMCopy && vmCopyWorks() }

// copyMapped moves len(p) bytes between p and the mapping at off: into the
// mapping if write. With process_vm_readv/writev the copy runs inside a
// syscall, so a page that faults meanwhile (taken away after the populate)
// is waited for in the kernel, and a mapping made inaccessible (the
// session ended, or Close) yields EFAULT. Otherwise it is a memmove whose
// fault on an inaccessible mapping is recovered and reported as EFAULT,
// with nothing counted as copied.
func copyMapped(mem []byte, p []byte, off int64, write bool) (n int, err error) {
	if !useVMCopy() {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if r := recover(); r != nil {
				n, err = 0, fmt.Errorf("%w (%v)", unix.EFAULT, r)
			}
		}()
		if write {
			return copy(mem[off:], p), nil
		}
		return copy(p, mem[off:]), nil
	}
	pid := os.Getpid()
	done := 0
	for done < len(p) {
		n := len(p) - done
		liov := []unix.Iovec{{Base: &p[done]}}
		liov[0].SetLen(n)
		riov := []unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&mem[off+int64(done)])), Len: n}}
		var got int
		var err error
		if write {
			got, err = unix.ProcessVMWritev(pid, liov, riov, 0)
		} else {
			got, err = unix.ProcessVMReadv(pid, liov, riov, 0)
		}
		if got > 0 {
			done += got
			continue
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err == nil {
			err = unix.EFAULT
		}
		return done, err
	}
	return done, nil
}
