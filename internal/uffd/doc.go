// Package uffd wraps Linux userfaultfd(2): the kernel interface through which
// dsmd serves the page faults of client processes on their mappings of a
// region (design §4). golang.org/x/sys has the syscall number but no ioctls,
// so the ABI is transcribed in uapi.go and checked against the kernel header's
// values in uapi_test.go.
//
// # Roles
//
// The client process (the dsm library) calls Open, maps the region's memfd
// (package memfd), calls Register on the mapping with
// ModeMissing|ModeWP|ModeMinor, and sends Fd() to dsmd over its Unix socket
// (package fdpass). It never reads the descriptor: a Go program that resolves
// its own faults can deadlock its runtime. dsmd adopts the descriptor with
// FromFD, reads fault messages with Read, and resolves each with Copy,
// ZeroPage, Continue or WriteProtect. Addresses are always the client's.
//
// # Features
//
// Open probes the kernel, then requests Required and fails with a
// *FeatureError that names what is missing and the Linux release needed:
//
//   - MISSING_SHMEM (4.11): a load or store to a page absent from the memfd's
//     page cache is reported (first touch, and after an invalidation punched
//     the page out).
//   - PAGEFAULT_FLAG_WP (5.7): write-protect faults are reported.
//   - MINOR_SHMEM (5.14): access to a page that is in the page cache but not
//     mapped in this client is reported, so dsmd sees every client's first
//     touch even when another process brought the page in.
//   - WP_HUGETLBFS_SHMEM (5.19): write protection works on shmem, which is
//     how a Shared page is mapped read-only and how a downgrade is done.
//
// It also asks for THREAD_ID (diagnostics; and it lets a test signal the
// faulting thread) and WP_UNPOPULATED (6.4; only changes anonymous memory)
// where offered. It does not ask for EVENT_FORK: the library marks the
// mapping MADV_DONTFORK instead, so a child never inherits a registered range
// (a fork event would also block the forking process until dsmd reads it).
// EVENT_UNMAP/REMOVE/REMAP are optional (Options.Optional): with them munmap
// and madvise block in the client until dsmd reads the event, and resolutions
// may fail with ErrMappingChanging meanwhile.
//
// # Resolving, idempotently
//
// A fault message can be re-delivered: a signal to the blocked thread (Go
// preempts with SIGURG) makes it leave the wait and fault again, so the same
// fault may be read twice. Resolutions are therefore idempotent: EEXIST from
// COPY, ZEROPAGE or CONTINUE means the page is already there and counts as
// done, and the wrapper then wakes the range itself (the kernel wakes only
// after progress). EAGAIN with progress is continued internally; EAGAIN
// without progress is ErrMappingChanging: read the pending events, then retry
// the same call. ESRCH is ErrProcessGone (the client exited).
//
// # What this kernel does (Linux 6.18, measured by the tests)
//
// The kernel offers every feature bit up to MOVE (0x1ffff). Registering a
// shmem mapping MISSING|WP|MINOR succeeds and offers WAKE, COPY, ZEROPAGE,
// WRITEPROTECT and CONTINUE (and MOVE and POISON). With dsmd in one process and
// clients in others (shmem_test.go):
//
//   - MISSING fault (page not in the memfd's cache; flags read|missing or
//     write|missing). Two resolutions work: COPY (MapWP for a read-only
//     install) puts the page into the page cache, so dsmd's own mapping and
//     every other client see the bytes; or dsmd writes the page into the
//     memfd and then CONTINUEs, which also answers a MISSING message once the
//     page is cached. COPY onto a page that is already cached is EEXIST even
//     if this client has no PTE for it; the client then faults MINOR.
//   - MINOR fault (cached, not mapped here; read|minor): CONTINUE, with MapWP
//     for Shared or without for Modified. CONTINUE where nothing is cached is
//     EFAULT (ErrNotCached) and allocates nothing.
//   - WP fault (write|wp): WriteProtect(off) wakes the writer; the store lands
//     in the shared page, visible through dsmd's mapping at once (zero copy).
//     WriteProtect(on) on a mapped page (a downgrade) makes the next write
//     fault again; reads go on without faults.
//   - Invalidation: fallocate(PUNCH_HOLE) on the memfd removes the page from
//     every mapping of every process; the next access is a MISSING fault. Write
//     protection does not survive the punch: the mode of the next install
//     decides (installed without MapWP, the page is writable).
//   - ZEROPAGE on shmem allocates a zero-filled page-cache page.
//   - madvise(MADV_POPULATE_READ/WRITE) on a registered range raises the same
//     faults as loads and stores (read|missing, write|wp, write|missing) and
//     blocks in the syscall until dsmd resolves them.
//   - Two clients with the page writable in both share it with no fault and
//     no message: each sees the other's stores.
//   - POISON (Linux 6.6, FeaturePoison requested by the client) on a
//     waiting fault wakes it with SIGBUS; MADV_POPULATE_READ/WRITE fails
//     with EHWPOISON (errno 133). The marker stays in the client's page
//     table: later accesses fail the same way with no fault message, a
//     punch of the memfd's page does not remove it, and the client's
//     madvise(MADV_DONTNEED) of the page does (the next access faults as
//     usual). POISON on a page that is mapped or already poisoned is
//     EEXIST and changes nothing, and so is POISON over a write-protect
//     marker (what MADV_DONTNEED leaves of a write-protected page), which
//     clearing the protection of the unmapped page removes (TestPoison).
//
// These were measured with shmem transparent huge pages off
// (/sys/kernel/mm/transparent_hugepage/shmem_enabled = never); with huge
// shmem pages the page-granular punch and install need checking again.
//
// One fault served across processes (the client's load blocks, dsmd reads
// the message, resolves, the client goes on) costs about 17-43 us with COPY
// and 24-42 us with CONTINUE on the shared 2-core test machine
// (go test -run '^$' -bench FaultRoundTrip -benchtime 2000x -count 5
// ./internal/uffd).
//
// # Traps
//
//   - A read of a shmem hole through a shared mapping allocates a page (there
//     is no shared zero page). dsmd must never read its own mapping of a page
//     it punched out: that would re-fill the cache with zeros and turn the
//     clients' next MISSING fault into a MINOR one onto a zero page.
//   - When the last copy of a userfaultfd is closed (dsmd dies) with a client
//     blocked on a fault, the range is unregistered and the access completes
//     against the bare memfd: silently, on a zero page. The library must
//     watch its socket and fence the mapping itself.
//   - UFFDIO_API can be issued once per descriptor, hence the throwaway
//     descriptor in Probe. /proc/self/fdinfo shows the negotiated features
//     plus a private bit 31 (initialized), which FromFD masks.
//   - A blocking userfaultfd reports EPOLLERR to poll; FromFD sets
//     O_NONBLOCK (shared with the sender's copy) so Read parks in Go's poller.
package uffd
