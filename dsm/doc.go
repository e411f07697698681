// Package dsm is the client library of the distributed shared memory
// service: it talks to the local dsmd and maps a cluster-wide region into
// this process as a []byte.
//
//	c, err := dsm.Dial(ctx, "")               // $DSM_ADDR, else /run/dsm/dsmd.sock
//	err = c.CreateRegion(ctx, "feat", 1<<30)  // idempotent for the same spec
//	r, err := c.Map(ctx, "feat")
//	n, err := r.WriteAt(p, 4096)
//	v, err := r.AddUint64(ctx, 0, 1)
//	err = r.Sync(ctx)
//	r.Close(); c.Close()
//
// Dial speaks gRPC (the Client service) over dsmd's Unix socket and asks
// for its session: node id, version and the socket on which regions are
// mapped. Map opens a mapping session there: dsmd hands over the region's
// memfd, the library maps it and registers it with a userfaultfd that it
// gives to dsmd, and from then on dsmd resolves every fault on the mapping
// through the coherence protocol (MSI pages, one writer at a time).
//
// # Access
//
// Region.Bytes is the coherent mapping. Plain loads and stores on pages
// this machine holds hit the page cache at memory speed: no system call, no
// message. A miss (a page this machine does not hold, or a store to a page
// held only for reading) blocks the faulting OS thread in the kernel until
// dsmd has fetched or upgraded the page; the Go runtime cannot preempt that
// thread meanwhile, so a garbage collection that starts then waits for it.
// For bulk copies or ranges whose state is unknown prefer ReadAt and
// WriteAt (or call Prefault before plain accesses): they fault their pages
// in from a system call (madvise MADV_POPULATE_READ/WRITE), so a miss waits
// where the runtime can carry on.
//
// All processes on one machine that map a region share its physical pages
// (the memfd belongs to dsmd): a store by one is visible to the others at
// once, with no copy. Plain accesses are not atomic with respect to other
// processes or machines any more than with respect to other goroutines:
// coordinate them with the atomics or a Mutex.
//
// # Atomics
//
// LoadUint64, StoreUint64, AddUint64 and CompareAndSwapUint64 operate on
// an 8-byte aligned word of the region and are linearizable across the
// whole cluster. They run in this process, with the CPU's atomic
// instructions (sync/atomic) on the mapped word, after faulting the word's
// page in from a system call (for writing, except Load). This is correct
// because the coherence protocol keeps a single writer per page: a page is
// writable in a process only while this machine holds it Modified, and
// before another machine gets it, dsmd write-protects or removes it from
// every local mapping, which takes effect between two instructions. An
// atomic instruction therefore either completes while this machine is the
// page's only writer (every other copy invalid), or faults and waits for
// dsmd to bring the page back. Atomics on the same machine are ordinary
// shared-memory atomics on the same physical page. A Load reads a copy that
// is valid at that instant (Shared or Modified), which is the latest value.
// The operation checks that the mapping is still served before and after;
// if it died meanwhile (see Failures) the operation fails with its error
// rather than return a value read from a page nobody serves.
//
// # Mutex
//
// Region.Mutex is a ticket lock on MutexSize bytes of the region: fair
// (FIFO by ticket) across every process of every machine, with no state in
// any dsmd. A waiter polls the now-serving word with backoff; that read
// hits a Shared copy until the holder's Unlock invalidates it. A holder or
// waiter that dies does not block the others: each ticket's taker records
// its mapping session, the waiter next in line asks dsmd whether a stalled
// head is dead, and skips it; the Lock that acquires after a dead holder
// returns ErrOwnerDied with the lock held, because the data it protects
// may be half updated. A holder whose fate dsmd cannot tell (its node is
// cut off or failed, not yet left or restarted) keeps the lock: keep
// critical sections short and do not hold a lock across anything that can
// fail for long.
//
// # Barrier and Semaphore
//
// Region.Barrier is a reusable barrier for a fixed number of parties, with
// numbered generations, on BarrierSize bytes; Region.Semaphore a counting
// semaphore, FIFO like the Mutex (its line is a Mutex), on SemaphoreSize
// bytes. Like the Mutex they keep no state in any dsmd, and they record
// the session of each process that takes part, so that dsmd can be asked
// whether it is dead (they need a dsmd that hands out session tokens,
// ErrUnsupported otherwise). A party that dies breaks a barrier: after a
// second without progress the waiters ask dsmd, and every Wait fails with
// ErrBarrierBroken, naming the dead party's session (DeadPartyError),
// until Reset. The units of a semaphore holder that dies come back: the
// acquirer at the head of the line, after a second without enough units
// free, clears the holder words of dead sessions. The layouts and
// algorithms, for implementations in other languages, are in
// docs/synchronization.md.
//
// # Failures
//
// Every error is an *Error that says the operation, region and offset,
// and matches one of the Err sentinels (or context.Canceled or
// context.DeadlineExceeded) with errors.Is; ReadAt's io.EOF is the bare
// io.EOF of io.ReaderAt. Sync is the durability point: writes not yet
// synced are lost when the machine holding them dies, as unsynced writes
// to a file are.
//
// A mapped Region dies when its dsmd goes away (Err matches
// ErrDaemonUnavailable) or when its region is deleted (DeleteRegion with
// Force, through any node; Err matches ErrRegionDeleted, and so
// ErrUnknownRegion): Done is closed, and Err, ReadAt, WriteAt, Prefault,
// the atomics and Sync fail with that error. A dead Region never hands out
// wrong data: its memory becomes inaccessible, so every plain access
// through Bytes(), including one that was waiting for dsmd at that moment,
// raises SIGSEGV instead of reading zeros, stale or deleted data, or
// storing into memory nobody serves. Accesses between dsmd's death and the
// library seeing it (the end of its session socket) still see the pages
// this machine held, as they were.
//
// Go crashes the program on such a fault ("unexpected fault address")
// unless the faulting goroutine has called debug.SetPanicOnFault(true):
// then the fault is a run-time error panic (its Addr method says where)
// that the goroutine can recover. By then Err already says why, and so
// does FaultErr, which also explains a fault on an unavailable page of a
// live Region (below):
//
//	func load(r *dsm.Region, off int) (v byte, err error) {
//		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
//		defer func() {
//			if p := recover(); p != nil {
//				err = fmt.Errorf("%v: %w", p, r.FaultErr(int64(off)))
//			}
//		}()
//		return r.Bytes()[off], nil
//	}
//
// A live Region is inaccessible in the same way while its dsmd holds no
// lease from the directory majority (docs/failover.md §9): dsmd writes
// until when its clients may access their mappings into a lease page it
// shares with them, and the library's watchdog makes the mapping
// PROT_NONE once that time passes unmoved, which covers a dsmd that is
// stopped (SIGSTOP, a long stall) and so cannot suspend its page cache
// itself. A plain access then faults as above (FaultErr matches
// ErrUnavailable and says that dsmd holds no lease), while ReadAt,
// WriteAt, Prefault and the atomics wait; the mapping comes back, with
// its data, when dsmd is granted a lease again, or dies. A dsmd that runs
// revokes the pages itself within a fraction of a second and then says
// so: the mapping is accessible again, and plain accesses wait in dsmd
// (as faults do) until it is granted again.
//
// Close a dead Region as a live one; Map the region again (with this
// Client or a new one) once dsmd is back, or once a region of that name
// exists again (a region created under a deleted one's name is a new,
// empty region).
//
// When another node fails, the Region stays alive, but the pages that node
// was home of cannot be served until it is back, restarts or is removed
// (dsmctl members remove): then they move to their backups, which hold
// every page written back before (docs/failover.md). Meanwhile Sync and
// dsmd's memory RPCs (dsmctl get, put and the atomics there) fail with
// ErrUnavailable at once for such a page, naming it and the node; a call
// that waits for a node that holds the page and stopped answering fails
// after 10 s. A page whose home departed with no backup left is lost: it
// fails at once, and a fault on it through the mapping too.
//
// An access through the mapping to such a page waits at most the fault
// timeout given to Map (WithFaultTimeout, default DefaultFaultTimeout, 30
// s; zero waits as long as it takes), plus about 100 ms, plus the engine's
// own bound when the node is unreachable rather than known down (10 s).
// Then dsmd gives up on it for this mapping, never with data the region
// does not hold: ReadAt, WriteAt, Prefault and the atomics fail with
// ErrUnavailable, whose message names the page and why ("page p513 of
// region fo (r1) unavailable: its home n3 failed in epoch 7"), and a plain
// load or store through Bytes() raises SIGBUS, which crashes the program
// unless the goroutine has called debug.SetPanicOnFault(true): then it is
// a run-time error panic to recover, as in the example above (FaultErr
// then returns ErrUnavailable naming the page and why). Every access to
// that page then fails the same way at once, until dsmd serves the page
// again (it keeps trying in the background); Region.Unavailable lists the
// pages in that state and why. This needs Linux 6.6 (UFFDIO_POISON); on an
// older kernel such an access waits as long as it takes, and dsmd logs
// that once per mapping. The same holds for a store to a page this
// process has mapped read-only (its home died after it was read here):
// the store fails, and so do reads of that page from then on. Waiting for
// a page that other nodes are using is contention, not unavailability, and
// never fails this way.
package dsm
