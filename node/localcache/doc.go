// Package localcache is the local half of dsmd's fault path (design §4): one
// node's page cache and the fault service of the client processes that map
// it. The coherence engine sits behind the Coherence interface; MemHome is a
// single-node implementation (every page homed here, kept in memory).
//
// # What it holds
//
// Per region (AddRegion): a memfd the Cache owns and maps, sparse (a 1 TiB
// region costs only its touched pages), which every local client maps too,
// so co-located processes share physical pages; the local MSI state of each
// page (Invalid, Shared, Modified: what this machine's mappings may do);
// and the attached clients, each a client process's mapping of the whole
// region with the userfaultfd that registers it. Over all regions at most
// Config.CapacityPages pages are held; beyond it the oldest installed page is
// evicted (a Modified one written back through Coherence.Evict first).
//
// # Invariants
//
//   - A page is Invalid exactly when the memfd has a hole there (whenever
//     its lock is free), except a Modified page that Suspend set aside: a
//     hole in the memfd, its data at the same offset of the region's aside
//     memfd. Installing writes the hole full (pwrite); Invalidate and
//     eviction punch it out, which removes it from every mapping in every
//     process. The Cache reads a page (pread, or its own mapping in
//     Access) only while it is Shared or Modified and not set aside:
//     reading a hole through the mapping would allocate a zero page and
//     turn the clients' next MISSING fault into a MINOR one onto zeros.
//   - Write rule: a client maps a page writable only while it is Modified
//     here. Shared pages are installed read-only (UFFDIO_CONTINUE with WP);
//     Modified pages are installed writable, and a WP fault on a page that
//     is Modified (another client upgraded it) is answered locally by
//     clearing the protection in the faulting client only. So the upgrade
//     from Shared touches only the faulting client; the others fault once,
//     locally, on their next store. Downgrade and the write-back of a
//     Modified page write-protect the page in every attached client first,
//     so no store lands after the copy is taken.
//   - Each page has a lock held across a whole resolution, including the
//     Coherence call: faults of several clients (or re-deliveries) on one
//     page are resolved by one miss; the others find the page held and only
//     map it.
//
// # A fault, end to end
//
//  1. The client library maps the region's memfd (received over the session
//     socket), registers it MISSING|WP|MINOR with its own userfaultfd and
//     hands that descriptor over (package mapproto).
//  2. The client's reader goroutine reads the fault message and hands the
//     page to a worker (one per page in flight per client; a message for a
//     page already being resolved makes that worker resolve once more).
//  3. The worker takes the page lock. Invalid: ReadMiss (read) or WriteMiss
//     with a buffer (write) fetches the data, which is written into the
//     memfd hole; the page becomes Shared or Modified. Shared and a write:
//     WriteMiss without a buffer (an upgrade); the page becomes Modified.
//     Otherwise nothing is asked of the engine.
//  4. The page is mapped in the client with UFFDIO_CONTINUE (read-only if
//     Shared), plus clearing WP for a write; both wake the faulting threads.
//     EEXIST counts as done, so a re-delivered fault costs one ioctl.
//  5. After the lock is released, pages are evicted while over capacity.
//
// A miss that fails is retried with backoff while the faulting thread stays
// blocked; the worker gives up only when the client goes away or the Cache
// closes (its context is then cancelled: a Coherence implementation should
// honour it, or Close waits for the call), or when the fault is poisoned.
//
// # Poisoned faults (the no-hang bound)
//
// A client that set a FaultTimeout in its Map (the dsm library's default
// is 30 s) does not wait forever for a page the cluster cannot serve. When
// a miss for one of its faults fails with an error matching ErrUnavailable
// (the engine gave up: the home is down, or unreachable for its bound) and
// the fault has waited at least FaultTimeout, the worker
//
//  1. sends the session Unavailable{page, the engine's error text}
//     (package mapproto), then
//  2. resolves the fault with UFFDIO_POISON in that client only: its
//     faulting threads get SIGBUS, its MADV_POPULATE_* calls EHWPOISON, and
//     so does every later access of that client to the page, with no fault
//     message; other clients and the memfd are untouched;
//  3. retries the miss in the background every retryMax (100 ms) without
//     mapping anything, and once it succeeds sends Available{page}: the
//     client removes its marker (MADV_DONTNEED of the page in its own
//     mapping; a punch of the memfd would not), and its next access faults
//     and is served as usual.
//
// So a fault on an unavailable page ends within FaultTimeout, plus one
// retry interval (retryMax), plus the duration of the miss in flight at
// that moment (the engine bounds a miss on an unreachable home by its
// UnavailableAfter; one on a home known down fails at once). Misses that
// fail otherwise (ErrBusy and other contention) are never poisoned: the
// fault waits, as the fairness of the protocol bounds them. Where the
// client's userfaultfd lacks FeaturePoison (a kernel before 6.6) the
// fault keeps waiting and this is logged once per client. A write fault on
// a page the client maps read-only (an upgrade whose home is down) cannot
// be poisoned from here, as UFFDIO_POISON needs an empty page-table entry:
// dsmd sends Poison{page} after Unavailable, and the client drops its
// mapping of the page, clears the write-protect marker that leaves, and
// poisons the page with its own copy of the userfaultfd.
//
// # Lock order with the engine
//
// Invalidate, Downgrade and Install take the page lock too. The engine must
// therefore not wait for one of them on a page whose miss it holds in a
// ReadMiss or WriteMiss call: when a remote request conflicts with a local
// miss in flight, it fails the miss first (any error), and the Cache applies
// the remote action and retries the fault. An Invalidate or Downgrade of a
// page not held here returns Invalid and does nothing, so stale or
// duplicated remote requests are harmless.
//
// # Suspension (the lease's revocation)
//
// When dsmd's lease is about to run out, Suspend stops every local access
// within a budget (docs/failover.md §9). From its start no fault, Access
// or Flush is served (they wait, holding no lock, for Resume or Close), no
// Coherence call starts, and the calls in flight are cancelled through
// their contexts and waited for (bounded by Suspend's context; a second
// Suspend finishes what the first could not). Every operation that may
// call Coherence or map a page checks the suspension with the page's lock
// held; Suspend sets it before taking any page lock, then takes every
// page's lock, so after Suspend no such call is in flight. Then per region,
// in few calls: the Modified pages are write-protected in every client
// that may map them writable (one UFFDIO_WRITEPROTECT per run, merged
// across gaps under 2 MiB),
// copied aside (copy_file_range per run of Modified pages, into a second
// memfd at the same offset), and every held page is punched out of the
// memfd (one fallocate over the held pages and the holes between them,
// around pages busy with a call). Shared pages become Invalid (the engine
// still holds them Shared); Modified pages stay Modified, set aside.
//
// While suspended, Invalidate and Downgrade of a page set aside answer
// from its aside copy (the data goes to the engine, as for any Modified
// page) and leave the page Invalid; of any other page they find it
// Invalid. Install fails with ErrSuspended. Resume reopens the gate: a
// page set aside goes back into the memfd on its first fault or Access,
// Modified, with no Coherence call; its eviction or write-back takes its
// data from the aside copy. DiscardSuspended, for an incarnation removed
// while suspended, drops every page and aside copy and returns how many
// Modified pages were lost; the Cache stays suspended until Resume, the
// clients stay mapped, and their next faults go through Coherence afresh.
// A fault waits through a suspension for as long as its FaultTimeout
// allows, counted from the fault: a dsmd without a lease serves nothing, so
// to its clients every page is unavailable while the suspension lasts. One
// that outlasts the bound is poisoned as above, with the reason that dsmd
// has held no lease since a given time, and is served again (Available)
// once dsmd holds one.
//
// The cost is a write protection per run of Modified pages per client, a
// copy per run of Modified pages and a TLB flush per page table of
// written pages that the punch unmaps: a few microseconds per page when
// the held pages lie in runs, tens when each lies alone in its 2 MiB
// (BenchmarkSuspend). EstimateSuspend measures the worst case on the
// machine, for dsmd to check its CapacityPages against its budget.
//
// # Sessions and client death
//
// Listen serves sessions on a Unix SOCK_SEQPACKET socket: Map (the memfd
// goes back), Register (the userfaultfd comes in), then nothing from the
// client until the end of stream (dsmd may send Unavailable and Available,
// above). The client is detached when its socket reaches end of
// stream, when its process exits (pidfd, so a forked child holding the
// socket does not keep a dead client attached), or when reading its
// userfaultfd fails. Detaching removes it from the write-protect set, cancels
// its workers' context and closes the Cache's copy of its userfaultfd at
// once; a worker stuck in a Coherence call finishes in the background, and
// mapping into a dead process is ErrProcessGone, which ends it. Nothing a
// dead client held can block another client beyond the page it was
// faulting on.
//
// # Counters
//
// Stats reports faults by kind, misses and upgrades, local resolutions,
// installs, invalidations, downgrades, evictions and write-backs, pages held
// and dirty, clients attached and faults in flight: the raw material for
// dsmd's metrics.
package localcache
