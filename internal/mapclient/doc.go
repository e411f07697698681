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
// # Unavailable pages
//
// With Options.FaultTimeout (MapWith), a fault that waits longer than that
// for a page the cluster cannot serve (its home is down or unreachable) is
// poisoned by dsmd in this process (UFFDIO_POISON; the userfaultfd is
// opened with FeaturePoison where the kernel has it, Linux 6.6): a plain
// load or store through Bytes() gets SIGBUS (a panic where the goroutine
// has debug.SetPanicOnFault, else a crash), and ReadAt, WriteAt, Populate
// and Word get EHWPOISON from their madvise and fail with a *PageError
// (ErrPageUnavailable) that names the page and dsmd's reason. dsmd tells
// the session first (mapproto Unavailable), so the reason is known when
// the access fails; Unavailable lists those pages (FaultErr waits for the
// reason after a recovered fault). The mapping stays alive. For a write
// fault on a page mapped read-only here, which dsmd cannot poison, dsmd
// asks (Poison) and the library poisons the page itself with its own
// copy of the userfaultfd. When dsmd serves the page again it says so (Available), and the
// monitor removes the marker with madvise(MADV_DONTNEED) of the page:
// the next access faults and is served as usual.
//
// # The lease watchdog
//
// dsmd may let its clients access pages only while it holds its lease from
// the directory majority; when the lease ends it suspends its page cache. A
// dsmd that is stopped (SIGSTOP, a long stall) cannot, so Map asks dsmd for
// its lease page (mapproto.FeatureLeasePage), a read-only shared page in
// which dsmd writes until when access is allowed (a deadline on
// CLOCK_BOOTTIME, a little before its lease ends), and starts a watchdog: a
// goroutine on its own locked OS thread (one thread per mapping) that
// sleeps until that deadline (a timerfd of CLOCK_BOOTTIME) and, if dsmd has
// not moved it by then or says it is suspended, makes the whole mapping
// PROT_NONE. Every access then faults, as on a dead mapping: a plain load
// or store through Bytes() raises SIGSEGV (a panic where the goroutine has
// debug.SetPanicOnFault, else a crash), while ReadAt, WriteAt, Populate and
// Word wait until the watchdog lets go (or the mapping dies). The watchdog
// reads the page every 10 ms while it holds the mapping, and gives it back
// its own protection once the deadline is ahead again; the pages' data and
// dsmd's write protection are untouched by the round trip (uffd
// TestWriteProtectSurvivesMprotect). A mapping that died is never opened
// again. Map hands out a mapping only once dsmd holds a lease (bounded by
// its ctx), so a new mapping is never inaccessible from the start. A dsmd
// that has no lease page, or predates it (it refuses the Map that asks: Map
// then maps again without), gives a mapping without a watchdog, as before;
// Options.NoWatchdog asks for none.
//
// # When the session ends
//
// The mapping watches its session socket. dsmd ends a session in two ways:
// it goes away (end of stream), and the mapping becomes dead with
// ErrDaemonGone; or the region is deleted, and dsmd sends one
// Error{CodeUnknownRegion} before it closes the session, and the mapping
// fails with ErrRegionDeleted. Either way Done is closed and Err and every
// ReadAt, WriteAt, Populate and Word fail with that error.
//
// No access ever completes on memory that dsmd no longer serves. The
// kernel would let a fault complete on its own once the last copy of the
// userfaultfd closes: a missing page filled with zeros, a page cached in
// the memfd (this node's data, stale once dsmd is gone, or punched out on
// delete) mapped as it is. So the mapping keeps its own copy of the
// userfaultfd for its whole life (never reading it): faults that dsmd left
// unanswered keep waiting. When the session ends the mapping first sets
// its state, then makes the whole range inaccessible (mprotect PROT_NONE),
// and only then wakes the waiting faults (UFFDIO_WAKE). The woken threads
// retry, and they and every later access fault: a plain load or store
// through Bytes() raises SIGSEGV, which crashes a Go program unless the
// goroutine has set debug.SetPanicOnFault(true) (then it is a panic to
// recover); a ReadAt, WriteAt or Populate gets EFAULT in its syscall (the
// memmove fallback recovers the fault the same way) and, as it checks the
// state after every copy, returns the error, never bytes it cannot vouch
// for. Pages that were mapped fault too. A new Map after dsmd is back
// works.
//
// Close detaches (closes the session), makes the mapping inaccessible and
// releases waiting faults as above (the ReadAt and WriteAt calls waiting
// return ErrClosed), unmaps, and only then closes its userfaultfd; plain
// accesses must have stopped.
package mapclient
