// Package mapclient is the client side of a local mapping: how an
// application process (through the dsm library) maps a region that dsmd
// serves, and uses it as memory.
//
// Connect checks that dsmd listens on its socket; Map opens a session for
// one region (package mapproto): it receives the region's memfd, maps it
// shared, marks the mapping MADV_DONTFORK (a forked child never inherits a
// registered range), registers it with a new userfaultfd in MISSING, WP and
// MINOR modes, and sends that userfaultfd to dsmd. From then on dsmd
// resolves every fault on the mapping; this process never reads its
// userfaultfd (a Go program resolving its own faults can deadlock its
// runtime).
//
// # Access
//
//   - Bytes() is the coherent mapping. Hits run at memory speed; a miss
//     taken by a plain load or store blocks that OS thread in the kernel
//     until dsmd answers, and the Go runtime cannot preempt it meanwhile (a
//     garbage collection waits for it).
//   - ReadAt and WriteAt fault their range in from a syscall first
//     (madvise MADV_POPULATE_READ / MADV_POPULATE_WRITE), so a miss waits
//     in a syscall, then copy with process_vm_readv / process_vm_writev on
//     this process: a page taken away between the two (an invalidation)
//     is faulted in again from inside that syscall too. Where the kernel or
//     a seccomp filter refuses those calls, the copy is a memmove, and such
//     a page then blocks the thread in a load, as a plain access does.
//
// # When dsmd goes away
//
// The mapping watches its session socket. On end of stream it becomes dead:
// Done is closed, Err and every ReadAt and WriteAt return ErrDaemonGone.
// The kernel would let an access that was waiting on a fault complete on a
// zero page when the last copy of the userfaultfd closes; to prevent that
// being read as data, the mapping keeps its own copy of the userfaultfd
// (never reading it), so waiting faults stay blocked until the state is
// already dead, and only then releases them (unregister and close). A
// ReadAt or WriteAt checks the state after its copy, so it never returns
// bytes from a page dsmd did not serve. Plain loads and stores through
// Bytes() after that point are undefined (zeros, stale data, or a wait);
// a new Map after dsmd is back works.
//
// Close detaches (closes the session), releases waiting faults (the
// ReadAt and WriteAt calls waiting return ErrClosed) and unmaps; plain
// accesses must have stopped. Before releasing the faults it makes the
// mapping inaccessible (where the copy runs in a syscall), so that a
// ReadAt or WriteAt cut short never touches the shared memfd unserved: an
// unserved write would land in a page other processes read coherently.
package mapclient
