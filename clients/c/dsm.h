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
 * threads at once; a dsm_mutex value by one thread at a time.
 */
#ifndef DSM_H
#define DSM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DSM_VERSION "0.1.0"

/* The bytes of region memory a mutex uses, from its offset. */
#define DSM_MUTEX_SIZE 80

typedef struct dsm_client dsm_client;
typedef struct dsm_region dsm_region;
typedef struct dsm_mutex dsm_mutex;

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

/* dsm_map maps the whole region name, read-write. */
dsm_region *dsm_map(dsm_client *c, const char *name);

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

/* dsm_unmap detaches the mapping from dsmd and unmaps it. Plain accesses
 * must have stopped. */
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
 * dsm_mutex_trylock returns 1 (locked; or -EOWNERDEAD, locked) or 0
 * (busy). dsm_mutex_unlock returns -EPERM when the lock is not held
 * through this value (or was taken over because its holder was found
 * dead).
 */
dsm_mutex *dsm_mutex_new(dsm_region *r, uint64_t off);
int dsm_mutex_lock(dsm_mutex *m);
int dsm_mutex_trylock(dsm_mutex *m);
int dsm_mutex_unlock(dsm_mutex *m);
void dsm_mutex_free(dsm_mutex *m);

/* dsm_strerror names an error code (negative or positive errno). */
const char *dsm_strerror(int err);

/* dsm_last_error is dsmd's text for this thread's last refused request,
 * or "" when the last failure had none. */
const char *dsm_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* DSM_H */
