/*
 * dsm.h: the C client of the DSM service (libdsm).
 *
 * A region is a named, cluster-wide block of memory. dsm_map maps it into
 * this process like shm_open + mmap: plain loads and stores through
 * dsm_addr are coherent across the cluster, and processes on one machine
 * share the same physical pages. The local dsmd resolves the page faults;
 * no Go runtime and no gRPC run in this process. See docs/clients.md.
 *
 * Errors: functions that return int return 0 (or a documented positive
 * value) on success and a negative errno value on failure; those that
 * return a pointer return NULL and set errno. dsm_strerror names a code;
 * dsm_last_error gives dsmd's own explanation of this thread's last
 * refused request, when there was one.
 *
 * Thread safety: a dsm_client and a dsm_region may be used by several
 * threads at once; a dsm_mutex or dsm_barrier value by one thread at a
 * time.
 */
#ifndef DSM_H
#define DSM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DSM_VERSION "0.1.0"

/* The bytes of region memory a mutex uses, from its offset. */
#define DSM_MUTEX_SIZE 80
/* The bytes a semaphore uses; its largest capacity; how many sessions
 * (mappings) can hold units of one semaphore at a time. */
#define DSM_SEMAPHORE_SIZE 224
#define DSM_SEMAPHORE_MAX 4194303
#define DSM_SEMAPHORE_HOLDERS 16
/* The bytes a barrier uses; its largest number of parties. */
#define DSM_BARRIER_SIZE 544
#define DSM_BARRIER_MAX_PARTIES 64

typedef struct dsm_client dsm_client;
typedef struct dsm_region dsm_region;
typedef struct dsm_mutex dsm_mutex;
typedef struct dsm_barrier dsm_barrier;

/*
 * dsm_connect returns a client of the local dsmd. addr is dsmd's mapping
 * socket or its gRPC socket (then the mapping socket is map.sock beside
 * it); NULL means $DSM_MAP_SOCKET, else $DSM_ADDR, else /run/dsm/dsmd.sock.
 */
dsm_client *dsm_connect(const char *addr);

/* dsm_close closes the client. Regions it mapped stay mapped until
 * dsm_unmap, which every region still needs. */
void dsm_close(dsm_client *c);

/*
 * dsm_create creates region name of size bytes (memory durability, the
 * default page size). It is idempotent: a region of that name and spec is
 * not an error; one of another size is -EEXIST.
 */
int dsm_create(dsm_client *c, const char *name, uint64_t size);

/* dsm_create_ex is dsm_create with a page size (0: the default) and
 * durability (nonzero: durable). */
int dsm_create_ex(dsm_client *c, const char *name, uint64_t size, uint32_t page_size, int durable);

/* dsm_delete deletes region name; -EBUSY while a process maps it. */
int dsm_delete(dsm_client *c, const char *name);

/* dsm_delete_ex is dsm_delete that, with force, cuts the mappings. */
int dsm_delete_ex(dsm_client *c, const char *name, int force);

/* dsm_region_size stores the size of region name in *size. */
int dsm_region_size(dsm_client *c, const char *name, uint64_t *size);

/*
 * dsm_map maps the whole region name, read-write.
 *
 * The lease watchdog: dsmd may let this process touch the mapping only
 * while it holds its lease from the cluster (docs/failover.md §9). So that
 * this holds even when dsmd is stopped (SIGSTOP) or stuck and cannot take
 * the pages back itself, dsm_map asks dsmd for its lease page and starts
 * a watchdog thread for the mapping (all signals blocked on it), which
 * makes the whole mapping PROT_NONE once dsmd's deadline passes without
 * dsmd moving it (or dsmd says it is suspended). The deadline is on
 * CLOCK_BOOTTIME, 100 ms before the end of dsmd's lease (default timings:
 * 1.085 s after dsmd's last lease request, and dsmd asks every 250 ms),
 * so that a dsmd stopped at any moment leaves no access succeeding later
 * than 1.485 s after the stop (tests/TestCWatchdogStoppedDaemon measured
 * about 1.03 s). From then on:
 *
 *   - a plain load or store through dsm_addr raises SIGSEGV. Without a
 *     handler the process dies. A program that wants to survive installs
 *     a SIGSEGV handler (sigaction) that siglongjmps back to a sigsetjmp
 *     taken before the access, to give up or retry later; dsm_watchdog
 *     (async-signal-safe) tells it whether the watchdog holds the mapping
 *     and so caused the fault. Exiting (_exit) is the simple answer.
 *   - the atomics (dsm_load_u64 and the rest, hence the mutex, semaphore
 *     and barrier) wait until the watchdog lets go, or return the
 *     mapping's error if dsmd ends the session meanwhile (one caught in a
 *     page fault that dsmd does not answer for over 1 ms when the
 *     watchdog acts faults like a plain access; docs/clients.md).
 *
 * The watchdog reads the lease page every 10 ms while it holds the
 * mapping and gives back read-write access, data intact, once dsmd holds
 * a lease again (or says it took every page out of the mapping itself:
 * accesses then fault into dsmd and wait there). dsm_map returns only
 * once dsmd holds a lease: it waits up to 30 s (a dsmd that starts, or
 * lost its lease, has none for a while), then fails with EAGAIN
 * (dsm_last_error: "dsmd holds no lease"). A dsmd that has no lease page,
 * or predates it, gives a mapping without a watchdog. dsm_unmap stops and
 * joins the thread.
 */
dsm_region *dsm_map(dsm_client *c, const char *name);

/*
 * dsm_map_ex is dsm_map with a fault timeout (the Go library's
 * WithFaultTimeout); dsm_map is dsm_map_ex with 0, which waits forever.
 *
 * With fault_timeout_ms > 0, dsmd gives up on a fault of this mapping that
 * has waited longer than that for a page the cluster cannot serve now (its
 * home is down or unreachable, or dsmd holds no lease): it tells this
 * process which page and why, then poisons the page here (UFFDIO_POISON,
 * Linux 6.6; on older kernels the fault keeps waiting). From then on,
 * until dsmd serves the page again (it says so, and libdsm removes the
 * marker: the next access faults as usual):
 *
 *   - a plain load or store of the page through dsm_addr raises SIGBUS
 *     (with the faulting thread's pending access not done). Without a
 *     handler the process dies. To survive it, catch SIGBUS as the
 *     watchdog's SIGSEGV above (sigaction, sigsetjmp before the access,
 *     siglongjmp from the handler), then, out of the handler, call
 *     dsm_fault_err for the reason.
 *   - the atomics (and so the mutex, semaphore and barrier) return
 *     -EHOSTUNREACH, with dsm_last_error naming the page, its offset and
 *     dsmd's reason (for example which node was its home). The mapping
 *     stays alive; other pages work as usual.
 *
 * The timeout also bounds how long an atomic waits for the lease watchdog
 * to give the mapping back (-EHOSTUNREACH after it). A session thread per
 * such mapping (all signals blocked, joined by dsm_unmap) reads dsmd's
 * messages. A fault ends within the timeout plus about 100 ms plus the
 * miss in flight (docs/failover.md §10). It needs a dsmd that knows fault
 * timeouts (every dsmd that knows session tokens does).
 */
dsm_region *dsm_map_ex(dsm_client *c, const char *name, uint32_t fault_timeout_ms);

/*
 * dsm_unavailable stores in pages (up to max of them, ascending) the
 * region page numbers (offset / dsm_page_size) dsmd has poisoned in this
 * mapping now, and returns how many there are (may exceed max), or
 * -EINVAL. dsm_unavailable_why copies dsmd's reason for page into why
 * (len bytes, NUL-terminated; "" when the page is not poisoned) and
 * returns 1 if it is poisoned, 0 if not. They list what libdsm has read
 * of dsmd's messages: a thread may fault on a page shortly before it is
 * listed. Neither may be called from a signal handler (they lock).
 */
int dsm_unavailable(dsm_region *r, uint64_t *pages, int max);
int dsm_unavailable_why(dsm_region *r, uint64_t page, char *why, size_t len);

/*
 * dsm_fault_err explains a fault of a plain access at off through dsm_addr
 * (after the signal handler returned or jumped out, not in it): the
 * mapping's error (dsm_region_err) if dsmd no longer serves it; -EAGAIN
 * if the lease watchdog holds it inaccessible; else -EHOSTUNREACH with
 * dsm_last_error naming the page and dsmd's reason if dsmd poisoned it,
 * waiting up to 5 s for dsmd's message if libdsm has not read it yet
 * (after which the text says that dsmd gave no reason). Call it only for a
 * fault: on a page that is not poisoned it waits those seconds.
 */
int dsm_fault_err(dsm_region *r, uint64_t off);

/*
 * dsm_watchdog returns 1 if the mapping has a lease watchdog, 0 if not (a
 * dsmd without a lease page), -EINVAL for NULL. It stores in *held (may be
 * NULL) 1 while the watchdog holds the mapping inaccessible (or is about
 * to), and in *times (may be NULL) how many times it has made it so. It
 * takes no lock (lock-free atomics, as on x86-64 and arm64): a signal
 * handler may call it.
 */
int dsm_watchdog(dsm_region *r, int *held, uint64_t *times);

/* dsm_addr is the start of the mapping, dsm_len its length in bytes. */
void *dsm_addr(dsm_region *r);
uint64_t dsm_len(dsm_region *r);

/* dsm_page_size is the region's coherence unit in bytes. */
uint64_t dsm_page_size(dsm_region *r);

/* dsm_session is dsmd's token of this mapping (0: none given). */
uint64_t dsm_session(dsm_region *r);

/*
 * dsm_region_err is 0 while dsmd serves the mapping, else why not: -EIDRM
 * (the region was deleted), -EACCES (its access list no longer admits this
 * process) or -ENOTCONN (dsmd went away). Plain accesses to a mapping that
 * is no longer served may block; the calls below check first.
 */
int dsm_region_err(dsm_region *r);

/*
 * Atomics on the aligned 8-byte word at off (a multiple of 8, inside the
 * region: -EINVAL otherwise), linearizable across the cluster and
 * compatible with the Go library's: the word's page is faulted in from a
 * syscall, then a C11 atomic does the access.
 */
int dsm_load_u64(dsm_region *r, uint64_t off, uint64_t *value);
int dsm_store_u64(dsm_region *r, uint64_t off, uint64_t value);
/* dsm_add_u64 adds delta and stores the new value in *new_value (may be NULL). */
int dsm_add_u64(dsm_region *r, uint64_t off, uint64_t delta, uint64_t *new_value);
/* dsm_cas_u64 sets the word to desired if it holds expected: it returns 1
 * if it did, 0 if not, or a negative errno value. */
int dsm_cas_u64(dsm_region *r, uint64_t off, uint64_t expected, uint64_t desired);

/*
 * dsm_sync writes back the pages this node holds modified, like msync:
 * after it returns they survive the loss of this node's cache.
 */
int dsm_sync(dsm_region *r);

/* dsm_unmap stops the mapping's watchdog, detaches the mapping from dsmd
 * and unmaps it. Plain accesses, and calls on r in other threads, must
 * have stopped. */
int dsm_unmap(dsm_region *r);

/*
 * A mutex in region memory, the same lock as the Go library's dsm.Mutex
 * at the same offset (a fair ticket lock that survives the death of its
 * holder): DSM_MUTEX_SIZE bytes at off, 8-byte aligned, zero to start
 * with, used for nothing else.
 *
 * dsm_mutex_lock waits for the lock. It returns 0, or -EOWNERDEAD with
 * the lock held when the previous holder died holding it (the data it
 * protects may be half updated), or another negative errno value.
 * dsm_mutex_timedlock gives up after timeout_ns (negative: never) with
 * -ETIMEDOUT, leaving its place in the line (like a Go Lock whose context
 * ends; a waiter 8 places back or more, too far back to record itself,
 * returns at once too, and the waiters behind skip its place).
 * dsm_mutex_trylock returns 1 (locked; or -EOWNERDEAD, locked) or 0
 * (busy). dsm_mutex_unlock returns -EPERM when the lock is not held
 * through this value (or was taken over because its holder was found
 * dead).
 */
dsm_mutex *dsm_mutex_new(dsm_region *r, uint64_t off);
int dsm_mutex_lock(dsm_mutex *m);
int dsm_mutex_timedlock(dsm_mutex *m, int64_t timeout_ns);
int dsm_mutex_trylock(dsm_mutex *m);
int dsm_mutex_unlock(dsm_mutex *m);
void dsm_mutex_free(dsm_mutex *m);

/*
 * A counting semaphore in region memory, the same as the Go library's
 * dsm.Semaphore at the same offset with the same capacity: fair (FIFO
 * among acquirers), DSM_SEMAPHORE_SIZE bytes at off, 8-byte aligned, zero
 * to start with, used for nothing else; the first use records capacity
 * (1..DSM_SEMAPHORE_MAX) there. The units belong to the mapping (r), not
 * to a thread: any thread may release them. The units of a process that
 * dies (or unmaps, or whose dsmd restarts or leaves the cluster) come
 * back without an error: the acquirer at the head of the line asks dsmd
 * about the holders after a second without units, and a try-acquire that
 * lacks units asks too (at most once a second per mapping). At most
 * DSM_SEMAPHORE_HOLDERS mappings hold units at a time.
 *
 * Every call returns -EINVAL for a bad place, a capacity out of range or
 * n > capacity, or when the memory was first used with another capacity
 * (dsm_last_error says which), and -EOPNOTSUPP when dsmd gave the mapping
 * no session token (a dsmd without its coherence engine).
 *
 * dsm_sem_acquire waits for n units and returns 0 (n == 0: at once).
 * dsm_sem_timedacquire gives up after timeout_ns (negative: never) with
 * -ETIMEDOUT, holding nothing. dsm_sem_tryacquire takes them if they are
 * free now and nobody waits ahead: 1 taken, 0 not. dsm_sem_release gives
 * back n units this mapping holds: -EPERM, changing nothing, if it holds
 * fewer. dsm_sem_available stores the units free now in *units (those of
 * dead holders not yet taken back count as held).
 */
int dsm_sem_acquire(dsm_region *r, uint64_t off, uint64_t capacity, uint64_t n);
int dsm_sem_timedacquire(dsm_region *r, uint64_t off, uint64_t capacity, uint64_t n, int64_t timeout_ns);
int dsm_sem_tryacquire(dsm_region *r, uint64_t off, uint64_t capacity, uint64_t n);
int dsm_sem_release(dsm_region *r, uint64_t off, uint64_t capacity, uint64_t n);
int dsm_sem_available(dsm_region *r, uint64_t off, uint64_t capacity, uint64_t *units);

/*
 * A reusable barrier in region memory for parties processes, the same as
 * the Go library's dsm.Barrier at the same offset with the same number of
 * parties: DSM_BARRIER_SIZE bytes at off, 8-byte aligned, zero to start
 * with, used for nothing else; the first use records parties
 * (1..DSM_BARRIER_MAX_PARTIES) there. Each dsm_barrier value is one
 * party. dsm_barrier_new returns NULL with errno EINVAL (bad place or
 * parties) or EOPNOTSUPP (dsmd gave the mapping no session token).
 *
 * dsm_barrier_wait arrives and waits until every party has arrived in
 * this generation; it returns the generation's number (0, 1, ...;
 * modulo 2^31), or a negative errno value: -EPIPE when the barrier is
 * broken (at once if it already was), -EUSERS when more sessions than
 * parties take part, -EINVAL when the memory was first used with another
 * number of parties. When a party dies the barrier breaks: a waiter
 * that sees no progress for a second asks dsmd about the recorded
 * parties, and a dead one is recorded as the breaker; dsm_barrier_broken_by
 * then returns its session token (0: the barrier was reset while this
 * party waited, or nobody was named). Every wait fails with -EPIPE until
 * dsm_barrier_reset. dsm_barrier_timedwait gives up after timeout_ns
 * (negative: never) with -ETIMEDOUT, withdrawing its arrival (unless the
 * generation completed first: then it returns its number).
 *
 * dsm_barrier_reset starts a new generation (two on from the current one)
 * with no arrival, not broken, and frees the words of parties dsmd says
 * are dead; call it once every live party has seen the barrier broken.
 * dsm_barrier_generation stores the generation now waited for in *gen
 * and returns 1 if the barrier is broken, 0 if not.
 */
dsm_barrier *dsm_barrier_new(dsm_region *r, uint64_t off, unsigned parties);
int dsm_barrier_wait(dsm_barrier *b);
int dsm_barrier_timedwait(dsm_barrier *b, int64_t timeout_ns);
uint64_t dsm_barrier_broken_by(dsm_barrier *b);
int dsm_barrier_reset(dsm_barrier *b);
int dsm_barrier_generation(dsm_barrier *b, uint64_t *gen);
void dsm_barrier_free(dsm_barrier *b);

/* dsm_strerror names an error code (negative or positive errno). */
const char *dsm_strerror(int err);

/* dsm_last_error is dsmd's text for this thread's last refused request,
 * or "" when the last failure had none. */
const char *dsm_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* DSM_H */
