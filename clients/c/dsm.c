/*
 * libdsm: the C client of the DSM service. It speaks dsmd's mapping-socket
 * protocol (internal/mapproto in the Go tree; docs/clients.md): mapping
 * sessions that hand dsmd a userfaultfd, and control sessions for region
 * calls. The mutex, the semaphore and the barrier mirror dsm/mutex.go,
 * dsm/semaphore.go and dsm/barrier.go word for word
 * (docs/synchronization.md).
 */
#define _GNU_SOURCE
#include "dsm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef F_GET_SEALS
#define F_GET_SEALS 1034
#endif
#ifndef F_SEAL_SHRINK
#define F_SEAL_SHRINK 0x0002
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif
#ifndef EHWPOISON
#define EHWPOISON 133
#endif

/* UFFDIO_POISON (Linux 6.6), named here so that older headers do. */
struct dsm_uffdio_poison {
	struct uffdio_range range;
	uint64_t mode;
	int64_t updated;
};
#define DSM_UFFDIO_POISON _IOWR(0xAA, 0x08, struct dsm_uffdio_poison)

#define DEFAULT_SOCKET "/run/dsm/dsmd.sock"

/* ---- the wire (mapproto) ---- */

enum {
	PROTO_VERSION = 1,
	MAX_MSG = 4096,
	MAX_NAME = 255,
	MAX_TOKENS = 256,

	T_MAP = 1,
	T_MAPPED = 2,
	T_REGISTER = 3,
	T_REGISTERED = 4,
	T_ERROR = 5,
	T_UNAVAILABLE = 6,
	T_AVAILABLE = 7,
	T_POISON = 8,
	T_CREATE = 32,
	T_LOOKUP = 33,
	T_DELETE = 34,
	T_SYNC = 35,
	T_SESSIONS_ALIVE = 36,
	T_REGION = 48,
	T_DONE = 49,
	T_STATES = 50,

	FEATURE_SESSION = 1,
	FEATURE_LEASE_PAGE = 2,
	SESSION_DEAD = 3,
};

/* Error codes of dsmd (mapproto.Code) as errno values. */
static int code_errno(unsigned code)
{
	switch (code) {
	case 1: return ENOENT;  /* unknown region */
	case 2: return EINVAL;  /* size mismatch */
	case 3: return EINVAL;  /* bad request */
	case 4: return EAGAIN;  /* unavailable */
	case 6: return EACCES;  /* permission denied */
	case 7: return EEXIST;  /* exists with another spec */
	case 8: return EBUSY;   /* mapped */
	case 9: return ENOSPC;  /* no space */
	default: return EIO;    /* internal */
	}
}

static __thread char last_err[1100];

static void set_last(const char *s, size_t n)
{
	if (n >= sizeof last_err)
		n = sizeof last_err - 1;
	memcpy(last_err, s, n);
	last_err[n] = 0;
}

static void set_text(const char *s) { set_last(s, strlen(s)); }

const char *dsm_last_error(void) { return last_err; }

struct buf {
	unsigned char b[MAX_MSG];
	size_t n;
	int bad;
};

static void put(struct buf *w, const void *p, size_t n)
{
	if (w->n + n > sizeof w->b) {
		w->bad = 1;
		return;
	}
	memcpy(w->b + w->n, p, n);
	w->n += n;
}

static void put_le(struct buf *w, uint64_t v, int bytes)
{
	unsigned char t[8];
	for (int i = 0; i < bytes; i++)
		t[i] = (unsigned char)(v >> (8 * i));
	put(w, t, (size_t)bytes);
}

static int put_name(struct buf *w, const char *name)
{
	if (name == NULL)
		return -EINVAL;
	size_t n = strlen(name);
	if (n == 0 || n > MAX_NAME)
		return -EINVAL;
	put_le(w, n, 2);
	put(w, name, n);
	return 0;
}

static void start(struct buf *w, int type)
{
	w->n = 0;
	w->bad = 0;
	unsigned char h[2] = {PROTO_VERSION, (unsigned char)type};
	put(w, h, 2);
}

struct rd {
	const unsigned char *b;
	size_t n, at;
	int bad;
};

static uint64_t get_le(struct rd *r, int bytes)
{
	if (r->bad || r->n - r->at < (size_t)bytes) {
		r->bad = 1;
		return 0;
	}
	uint64_t v = 0;
	for (int i = 0; i < bytes; i++)
		v |= (uint64_t)r->b[r->at + i] << (8 * i);
	r->at += (size_t)bytes;
	return v;
}

/* error_reply decodes an Error message into an errno value and records
 * its text; -EPROTO when it is malformed. */
static int error_reply(const unsigned char *b, size_t n)
{
	struct rd r = {b, n, 2, 0};
	unsigned code = (unsigned)get_le(&r, 2);
	size_t tl = (size_t)get_le(&r, 2);
	if (r.bad || n - r.at != tl) {
		set_text("malformed error message from dsmd");
		return -EPROTO;
	}
	set_last((const char *)b + r.at, tl);
	return -code_errno(code);
}

/* ---- sockets ---- */

static int seq_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof sa.sun_path)
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

static int send_msg(int fd, const struct buf *w, int pass_fd)
{
	if (w->bad)
		return -EINVAL;
	struct iovec iov = {(void *)w->b, w->n};
	union {
		struct cmsghdr h;
		char c[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (pass_fd >= 0) {
		memset(&u, 0, sizeof u);
		mh.msg_control = u.c;
		mh.msg_controllen = sizeof u.c;
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
	}
	for (;;) {
		ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (n >= 0)
			return 0;
		if (errno != EINTR)
			return -errno;
	}
}

/* recv_msg reads one datagram into b (MAX_MSG bytes) and up to nfds
 * descriptors into fds (-1 where none came; more are closed). It returns
 * the length, or -ENOTCONN at end of stream, or another negative errno
 * value. */
static ssize_t recv_msg(int fd, unsigned char *b, int *fds, int nfds, int flags)
{
	struct iovec iov = {b, MAX_MSG};
	union {
		struct cmsghdr h;
		char c[CMSG_SPACE(4 * sizeof(int))];
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.c, .msg_controllen = sizeof u.c};
	ssize_t n;
	do
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | flags);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	int got = 0;
	for (int i = 0; i < nfds; i++)
		fds[i] = -1;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int d;
			memcpy(&d, CMSG_DATA(c) + i * sizeof(int), sizeof d);
			if (got < nfds)
				fds[got++] = d;
			else
				close(d);
		}
	}
	if (n == 0)
		return -ENOTCONN;
	if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		for (int i = 0; i < got; i++) {
			close(fds[i]);
			fds[i] = -1;
		}
		return -EPROTO;
	}
	return n;
}

/* ---- the client ---- */

struct dsm_client {
	char *path; /* the mapping socket */
	atomic_int refs;
	pthread_mutex_t mu; /* guards ctl */
	int ctl;            /* control session, -1 when none */
};

static void client_unref(dsm_client *c)
{
	if (atomic_fetch_sub(&c->refs, 1) != 1)
		return;
	if (c->ctl >= 0)
		close(c->ctl);
	pthread_mutex_destroy(&c->mu);
	free(c->path);
	free(c);
}

dsm_client *dsm_connect(const char *addr)
{
	const char *path = addr;
	if (path == NULL || *path == 0) {
		path = getenv("DSM_MAP_SOCKET");
		if (path == NULL || *path == 0)
			path = getenv("DSM_ADDR");
		if (path == NULL || *path == 0)
			path = DEFAULT_SOCKET;
	}
	if (strncmp(path, "unix://", 7) == 0)
		path += 7;
	char *p = strdup(path);
	if (p == NULL)
		return NULL;
	int fd = seq_connect(p);
	if (fd == -EPROTOTYPE) {
		/* The gRPC socket: the mapping socket is map.sock beside it. */
		char *slash = strrchr(p, '/');
		size_t dir = slash ? (size_t)(slash - p + 1) : 0;
		char *q = malloc(dir + sizeof "map.sock");
		if (q == NULL) {
			free(p);
			return NULL;
		}
		memcpy(q, p, dir);
		strcpy(q + dir, "map.sock");
		free(p);
		p = q;
		fd = seq_connect(p);
	}
	if (fd < 0) {
		free(p);
		errno = -fd;
		return NULL;
	}
	dsm_client *c = calloc(1, sizeof *c);
	if (c == NULL) {
		close(fd);
		free(p);
		return NULL;
	}
	/* The probe is closed at once (dsmd drops a connection that says
	 * nothing for long); the control session opens with the first call. */
	close(fd);
	c->path = p;
	c->ctl = -1;
	atomic_init(&c->refs, 1);
	pthread_mutex_init(&c->mu, NULL);
	return c;
}

void dsm_close(dsm_client *c)
{
	if (c)
		client_unref(c);
}

/* call sends a control request and reads its reply into rep (MAX_MSG),
 * reconnecting once if the control session is gone. It returns the
 * reply's length, or a negative errno value (dsmd's refusals included). */
static ssize_t call(dsm_client *c, const struct buf *req, unsigned char *rep, int want)
{
	last_err[0] = 0;
	pthread_mutex_lock(&c->mu);
	ssize_t n = -ENOTCONN;
	for (int try = 0; try < 2; try++) {
		if (c->ctl < 0) {
			int fd = seq_connect(c->path);
			if (fd < 0) {
				n = fd;
				break;
			}
			c->ctl = fd;
		}
		int e = send_msg(c->ctl, req, -1);
		if (e == 0)
			n = recv_msg(c->ctl, rep, NULL, 0, 0);
		else
			n = e;
		if (n >= 0)
			break;
		close(c->ctl);
		c->ctl = -1;
		if (n != -ENOTCONN && n != -EPIPE && n != -ECONNRESET)
			break;
	}
	if (n >= 2 && rep[1] == T_ERROR) {
		n = error_reply(rep, (size_t)n);
		if (n == -EINVAL && strstr(last_err, "unknown type")) {
			/* A dsmd that predates control sessions closed the socket. */
			close(c->ctl);
			c->ctl = -1;
			n = -EPROTONOSUPPORT;
		}
	} else if (n >= 0 && (n < 2 || rep[0] != PROTO_VERSION || rep[1] != want)) {
		set_text("unexpected reply from dsmd");
		close(c->ctl);
		c->ctl = -1;
		n = -EPROTO;
	}
	pthread_mutex_unlock(&c->mu);
	return n;
}

struct region_info {
	uint32_t id;
	uint64_t size;
	uint32_t page_size;
};

static int region_reply(const unsigned char *b, ssize_t n, struct region_info *ri)
{
	struct rd r = {b, (size_t)n, 2, 0};
	ri->id = (uint32_t)get_le(&r, 4);
	ri->size = get_le(&r, 8);
	ri->page_size = (uint32_t)get_le(&r, 4);
	get_le(&r, 1);
	get_le(&r, 1);
	if (r.bad || r.at != r.n)
		return -EPROTO;
	return 0;
}

int dsm_create_ex(dsm_client *c, const char *name, uint64_t size, uint32_t page_size, int durable)
{
	if (c == NULL || size == 0)
		return -EINVAL;
	struct buf w;
	start(&w, T_CREATE);
	if (put_name(&w, name))
		return -EINVAL;
	put_le(&w, size, 8);
	put_le(&w, page_size, 4);
	put_le(&w, durable ? 2 : 0, 1);
	unsigned char rep[MAX_MSG];
	ssize_t n = call(c, &w, rep, T_REGION);
	if (n < 0)
		return (int)n;
	struct region_info ri;
	int e = region_reply(rep, n, &ri);
	if (e)
		return e;
	if (ri.size != size)
		return -EEXIST; /* dsmd refuses another spec; belt and braces */
	return 0;
}

int dsm_create(dsm_client *c, const char *name, uint64_t size)
{
	return dsm_create_ex(c, name, size, 0, 0);
}

int dsm_delete_ex(dsm_client *c, const char *name, int force)
{
	if (c == NULL)
		return -EINVAL;
	struct buf w;
	start(&w, T_DELETE);
	if (put_name(&w, name))
		return -EINVAL;
	put_le(&w, force ? 1 : 0, 1);
	unsigned char rep[MAX_MSG];
	ssize_t n = call(c, &w, rep, T_DONE);
	return n < 0 ? (int)n : 0;
}

int dsm_delete(dsm_client *c, const char *name) { return dsm_delete_ex(c, name, 0); }

static int lookup(dsm_client *c, const char *name, struct region_info *ri);

int dsm_region_size(dsm_client *c, const char *name, uint64_t *size)
{
	if (c == NULL || size == NULL)
		return -EINVAL;
	struct region_info ri;
	int e = lookup(c, name, &ri);
	if (e == 0)
		*size = ri.size;
	return e;
}

enum { MAX_ASK = 64 };

/* sessions_dead asks dsmd, in one call, which of the n sessions in tokens
 * (0: none) are over for good, setting dead[i]. A session it cannot judge,
 * or every session when the call fails, is not dead. */
static void sessions_dead(dsm_client *c, const uint64_t *tokens, int n, int *dead)
{
	int at[MAX_ASK], k = 0;
	struct buf w;
	start(&w, T_SESSIONS_ALIVE);
	for (int i = 0; i < n && i < MAX_ASK; i++) {
		dead[i] = 0;
		if (tokens[i] != 0)
			at[k++] = i;
	}
	if (k == 0)
		return;
	put_le(&w, (uint64_t)k, 2);
	for (int j = 0; j < k; j++)
		put_le(&w, tokens[at[j]], 8);
	unsigned char rep[MAX_MSG];
	ssize_t got = call(c, &w, rep, T_STATES);
	if (got != 4 + k || (rep[2] | rep[3] << 8) != k)
		return;
	for (int j = 0; j < k; j++)
		dead[at[j]] = rep[4 + j] == SESSION_DEAD;
}

/* ---- a mapping ---- */

enum { LIVE, GONE, DELETED, DENIED };

struct watchdog;

/* A page dsmd poisoned in a mapping, and why (mapproto Unavailable). */
struct poisoned {
	uint64_t page;
	char *why;
};

struct dsm_region {
	dsm_client *c;
	char *name;
	unsigned char *base;
	uint64_t len;
	uint64_t page_size;
	uint64_t session;
	int conn; /* the mapping session */
	int uffd; /* this process's copy of the userfaultfd, never read */
	pthread_mutex_t mu; /* guards reading conn */
	atomic_int state;
	_Atomic int64_t swept; /* a semaphore try-acquire last looked for dead holders (ns) */
	int prot;              /* the mapping's own protection, which the watchdog gives back */
	struct watchdog *wd;   /* the lease watchdog; NULL when dsmd gave no lease page */
	uint32_t fault_timeout_ms; /* asked in Map; 0: faults wait for the cluster */
	/* The pages dsmd poisoned in this mapping, until it says they are
	 * available again: guarded by pmu, each change broadcast on
	 * pchanged. */
	pthread_mutex_t pmu;
	pthread_cond_t pchanged;
	struct poisoned *pz;
	size_t npz, cappz;
	/* The session thread (fault timeouts): sefd stops it; -1 when none. */
	int sefd;
	pthread_t sthread;
	int sstarted;
};

/* userfaultfd features (linux/userfaultfd.h), named here so that older
 * headers do. */
#define F_PAGEFAULT_FLAG_WP (1ULL << 0)
#define F_MISSING_SHMEM (1ULL << 5)
#define F_THREAD_ID (1ULL << 8)
#define F_MINOR_SHMEM (1ULL << 10)
#define F_WP_HUGETLBFS_SHMEM (1ULL << 12)
#define F_WP_UNPOPULATED (1ULL << 13)
#define F_POISON (1ULL << 14)
#define F_REQUIRED (F_MISSING_SHMEM | F_PAGEFAULT_FLAG_WP | F_MINOR_SHMEM | F_WP_HUGETLBFS_SHMEM)
/* F_POISON, where the kernel has it (Linux 6.6), lets dsmd fail a fault
 * that waits longer than the mapping's fault timeout (dsm_map_ex). */
#define F_OPTIONAL (F_THREAD_ID | F_WP_UNPOPULATED | F_POISON)

static int uffd_new(void)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (fd >= 0)
		return fd;
	int e = errno;
	int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (dev < 0)
		return -e;
	fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
	close(dev);
	return fd >= 0 ? fd : -e;
}

static int uffd_open(void)
{
	int fd = uffd_new();
	if (fd < 0)
		return fd;
	struct uffdio_api api = {.api = UFFD_API};
	if (ioctl(fd, UFFDIO_API, &api) != 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	close(fd);
	uint64_t offered = api.features;
	if ((offered & F_REQUIRED) != F_REQUIRED) {
		set_text("the kernel's userfaultfd lacks features the service requires (Linux 5.19 or later)");
		return -EOPNOTSUPP;
	}
	fd = uffd_new();
	if (fd < 0)
		return fd;
	struct uffdio_api want = {.api = UFFD_API, .features = F_REQUIRED | (F_OPTIONAL & offered)};
	if (ioctl(fd, UFFDIO_API, &want) != 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}


/* ---- the lease watchdog: internal/mapclient/watchdog_linux.go, in C ---- */

/*
 * dsmd may let its clients touch their mappings only while it holds its
 * lease from the directory majority (docs/failover.md §9). A dsmd that is
 * stopped or stuck cannot take the pages back itself, so each mapping
 * asks for dsmd's lease page (FEATURE_LEASE_PAGE: a sealed memfd, mapped
 * read-only here) in which dsmd writes until when access is allowed, and
 * runs a watchdog thread of its own. The thread sleeps until that
 * deadline (a timerfd of CLOCK_BOOTTIME, the lease's clock) and, if dsmd
 * has not moved it by then or says it is suspended, makes the whole
 * mapping PROT_NONE: every plain load or store then raises SIGSEGV. It
 * reads the page every WATCHDOG_POLL_NS while it holds the mapping so,
 * and gives the mapping its own protection back once the page shows a
 * deadline ahead again, or says revoked (dsmd took every page out of the
 * mapping itself: accesses fault into dsmd and wait there). A mapping
 * whose session is known to have ended is never opened again.
 *
 * One thread per mapping, as in the Go library: each mapping's session
 * has its own lease page (from the dsmd it was mapped through), the
 * thread lives exactly as long as its mapping (dsm_map starts it,
 * dsm_unmap stops and joins it before anything it uses is freed or
 * unmapped), and no list of mappings shared between threads is needed.
 *
 * The atomics (dsm_load_u64 and the others, hence the mutex, semaphore
 * and barrier) wait while the watchdog holds the mapping instead of
 * faulting: a call counts itself busy between its check of held and the
 * end of its one access, and the watchdog, which sets held before it
 * looks at busy (both sequentially consistent), waits for those calls,
 * at most WATCHDOG_DRAIN_NS, before it changes the protection.
 */

/* The lease record (internal/mapproto/lease.go): six 64-bit words in the
 * machine's byte order, written by dsmd under a sequence word (odd while
 * it writes). */
#define LEASE_MAGIC 0x015341454c4d5344ULL /* bytes D S M L E A S 1 */
enum {
	LEASE_WORDS = 6,
	LEASE_W_MAGIC = 0,
	LEASE_W_SEQ = 1,
	LEASE_W_DEADLINE = 3,
	LEASE_W_STATE = 4,
	LEASE_SERVING = 1,
	LEASE_SUSPENDED = 2,
	LEASE_DRAINING = 3,
	LEASE_REVOKED = 4,
	LEASE_READ_TRIES = 1000,
};

/* How often the watchdog reads the lease page while it holds the mapping:
 * how late, at most, access comes back once dsmd moves the deadline. */
#define WATCHDOG_POLL_NS (10 * 1000000LL)
/* How long the watchdog waits for an atomic of this library in flight
 * before it makes the mapping inaccessible anyway. */
#define WATCHDOG_DRAIN_NS (1000000LL)
/* How long dsm_map waits for dsmd to hold a lease (the Go library's
 * DefaultTimeout). */
#define LEASE_WAIT_NS (30 * 1000000000LL)

struct watchdog {
	const uint64_t *page; /* the lease page, mapped read-only */
	size_t page_len;
	int tfd;              /* timerfd, CLOCK_BOOTTIME */
	int efd;              /* eventfd: written once to stop the thread */
	pthread_t thread;
	int started;          /* thread runs, and dsm_unmap joins it */
	/* mu and changed let callers wait for the changes of held and for
	 * the thread's first look at the page (looked, under mu). held is
	 * changed under mu; it is read without it too. */
	pthread_mutex_t mu;
	pthread_cond_t changed;
	int looked;
	atomic_int held;        /* the watchdog holds the mapping PROT_NONE (or is about to) */
	atomic_int busy;        /* atomics between their check of held and their access */
	_Atomic uint64_t times; /* how many times it made the mapping PROT_NONE */
};

static int64_t mono_ns(void);

/* boottime reads CLOCK_BOOTTIME in ns, the clock of the lease page's
 * deadline; without the clock every deadline is over. */
static int64_t boottime(void)
{
	struct timespec ts;
	if (clock_gettime(CLOCK_BOOTTIME, &ts) != 0)
		return INT64_MAX;
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* next_poll is CLOCK_BOOTTIME a poll from now. */
static int64_t next_poll(void)
{
	int64_t now = boottime();
	return now > INT64_MAX - WATCHDOG_POLL_NS ? INT64_MAX : now + WATCHDOG_POLL_NS;
}

/* lease_load reads the lease record at w (shared memory dsmd writes) with
 * the sequence protocol of mapproto.LoadLease: -EAGAIN for a record still
 * being written after many tries (a writer stopped in the middle of a
 * write), -EPROTO for one of another layout or with an unknown state. */
static int lease_load(const uint64_t *w, uint64_t *deadline, uint64_t *state)
{
	for (int i = 0; i < LEASE_READ_TRIES; i++) {
		uint64_t s1 = __atomic_load_n(&w[LEASE_W_SEQ], __ATOMIC_ACQUIRE);
		if (s1 & 1)
			continue;
		uint64_t v[LEASE_WORDS];
		for (int k = 0; k < LEASE_WORDS; k++)
			v[k] = __atomic_load_n(&w[k], __ATOMIC_ACQUIRE);
		if (__atomic_load_n(&w[LEASE_W_SEQ], __ATOMIC_ACQUIRE) != s1 || v[LEASE_W_SEQ] != s1)
			continue;
		if (v[LEASE_W_MAGIC] != LEASE_MAGIC || v[LEASE_W_STATE] < LEASE_SERVING ||
		    v[LEASE_W_STATE] > LEASE_REVOKED || v[LEASE_W_DEADLINE] > (uint64_t)INT64_MAX)
			return -EPROTO;
		*deadline = v[LEASE_W_DEADLINE];
		*state = v[LEASE_W_STATE];
		return 0;
	}
	return -EAGAIN;
}

/* lease_open reports whether the lease page allows access now, and until
 * when (CLOCK_BOOTTIME ns). A page that cannot be read allows nothing; a
 * revoked lease (dsmd took every page out of the mapping: accesses fault
 * into dsmd and wait there) lets the mapping be, for a poll. Draining is
 * serving (the sessions end anyway). */
static int lease_open(const uint64_t *page, int64_t *until)
{
	uint64_t deadline, state;
	if (lease_load(page, &deadline, &state) != 0 || state == LEASE_SUSPENDED) {
		*until = 0;
		return 0;
	}
	if (state == LEASE_REVOKED) {
		*until = next_poll();
		return 1;
	}
	*until = (int64_t)deadline;
	return boottime() < (int64_t)deadline;
}

static void wd_free(struct watchdog *wd)
{
	if (wd->page != NULL)
		munmap((void *)wd->page, wd->page_len);
	if (wd->tfd >= 0)
		close(wd->tfd);
	if (wd->efd >= 0)
		close(wd->efd);
	pthread_cond_destroy(&wd->changed);
	pthread_mutex_destroy(&wd->mu);
	free(wd);
}

/* wd_new maps the lease page fd (taking it) and checks that it holds a
 * lease record; the thread starts later (wd_start). */
static int wd_new(int fd, struct watchdog **out)
{
	*out = NULL;
	struct stat st;
	long sys = sysconf(_SC_PAGESIZE);
	int seals = fcntl(fd, F_GET_SEALS);
	if (fstat(fd, &st) != 0 || seals < 0 || !(seals & F_SEAL_SHRINK) || st.st_size < LEASE_WORDS * 8 ||
	    st.st_size > sys) {
		/* Shrunk under the mapping, it would SIGBUS the watchdog. */
		close(fd);
		set_text("dsmd's lease page is not a sealed page holding a lease record");
		return -EPROTO;
	}
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	int e = p == MAP_FAILED ? -errno : 0;
	close(fd);
	if (e)
		return e;
	struct watchdog *wd = calloc(1, sizeof *wd);
	if (wd == NULL) {
		munmap(p, (size_t)st.st_size);
		return -ENOMEM;
	}
	wd->page = p;
	wd->page_len = (size_t)st.st_size;
	wd->tfd = timerfd_create(CLOCK_BOOTTIME, TFD_CLOEXEC);
	wd->efd = eventfd(0, EFD_CLOEXEC);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&wd->changed, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&wd->mu, NULL);
	atomic_init(&wd->held, 0);
	atomic_init(&wd->busy, 0);
	atomic_init(&wd->times, 0);
	uint64_t deadline, state;
	if (wd->tfd < 0 || wd->efd < 0) {
		e = -errno;
	} else if (lease_load(wd->page, &deadline, &state) != 0) {
		set_text("dsmd's lease page holds no lease record");
		e = -EPROTO;
	}
	if (e) {
		wd_free(wd);
		return e;
	}
	*out = wd;
	return 0;
}

/* set_held changes held under mu and wakes the waiters. */
static void set_held(struct watchdog *wd, int held)
{
	pthread_mutex_lock(&wd->mu);
	atomic_store(&wd->held, held);
	pthread_cond_broadcast(&wd->changed);
	pthread_mutex_unlock(&wd->mu);
}

/* lease_fence makes the mapping PROT_NONE (on) or gives it back its own
 * protection (off, only while its session is not known to have ended). A
 * refused mprotect changes nothing: the thread tries again at its next
 * wake. */
static void lease_fence(dsm_region *r, int on)
{
	struct watchdog *wd = r->wd;
	if (on == atomic_load(&wd->held))
		return;
	if (!on) {
		if (atomic_load(&r->state) != LIVE || mprotect(r->base, r->len, r->prot) != 0)
			return;
		set_held(wd, 0);
		return;
	}
	set_held(wd, 1);
	/* The atomics that checked held before it was set finish their one
	 * access first (a few ns), unless a fault holds one up. */
	int64_t until = mono_ns() + WATCHDOG_DRAIN_NS;
	while (atomic_load(&wd->busy) > 0 && mono_ns() < until)
		sched_yield();
	if (mprotect(r->base, r->len, PROT_NONE) != 0) {
		set_held(wd, 0);
		return;
	}
	atomic_fetch_add(&wd->times, 1);
}

/* sleep_until waits until CLOCK_BOOTTIME reads t or the watchdog is told
 * to stop: 0 means stop. */
static int sleep_until(struct watchdog *wd, int64_t t)
{
	if (t < 1)
		t = 1;
	struct itimerspec its = {.it_value = {t / 1000000000LL, t % 1000000000LL}};
	struct timespec poll_ts = {0, WATCHDOG_POLL_NS};
	if (timerfd_settime(wd->tfd, TFD_TIMER_ABSTIME, &its, NULL) != 0) {
		/* Cannot happen with a valid timerfd; sleep a poll instead. */
		nanosleep(&poll_ts, NULL);
		return 1;
	}
	for (;;) {
		struct pollfd p[2] = {{.fd = wd->tfd, .events = POLLIN}, {.fd = wd->efd, .events = POLLIN}};
		int n = poll(p, 2, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			nanosleep(&poll_ts, NULL);
			return 1;
		}
		if (p[1].revents)
			return 0;
		if (p[0].revents) {
			uint64_t expirations;
			ssize_t k = read(wd->tfd, &expirations, sizeof expirations);
			(void)k;
			return 1;
		}
	}
}

/* watch is the watchdog thread (see above). */
static void *watch(void *arg)
{
	dsm_region *r = arg;
	struct watchdog *wd = r->wd;
	for (int first = 1;; first = 0) {
		int64_t until;
		int open = lease_open(wd->page, &until);
		lease_fence(r, !open);
		if (first) {
			pthread_mutex_lock(&wd->mu);
			wd->looked = 1;
			pthread_cond_broadcast(&wd->changed);
			pthread_mutex_unlock(&wd->mu);
		}
		if (!open)
			until = next_poll();
		if (!sleep_until(wd, until))
			return NULL;
	}
}

/* wd_start starts r's watchdog thread, with every signal blocked (the
 * program's handlers never run on it). */
static int wd_start(dsm_region *r)
{
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int e = pthread_create(&r->wd->thread, NULL, watch, r);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (e)
		return -e;
	r->wd->started = 1;
	return 0;
}

/* wd_stop stops and joins r's watchdog thread, if any, and frees it; after
 * it nothing changes the mapping's protection. */
static void wd_stop(dsm_region *r)
{
	struct watchdog *wd = r->wd;
	if (wd == NULL)
		return;
	if (wd->started) {
		uint64_t one = 1;
		while (write(wd->efd, &one, sizeof one) < 0 && errno == EINTR)
			;
		pthread_join(wd->thread, NULL);
	}
	r->wd = NULL;
	wd_free(wd);
}

/* wait_changed waits on wd->changed (mu held) until at most deadline
 * (CLOCK_MONOTONIC ns). */
static void wait_changed(struct watchdog *wd, int64_t deadline)
{
	struct timespec ts = {deadline / 1000000000LL, deadline % 1000000000LL};
	pthread_cond_timedwait(&wd->changed, &wd->mu, &ts);
}

/* lease_wait waits while the watchdog holds the mapping inaccessible: 0
 * once it lets go, or the mapping's error if its session ends first, or,
 * with a fault timeout, -EHOSTUNREACH once it has waited that long. */
static int lease_wait(dsm_region *r)
{
	struct watchdog *wd = r->wd;
	if (wd == NULL || !atomic_load(&wd->held))
		return 0;
	int64_t end = r->fault_timeout_ms ? mono_ns() + (int64_t)r->fault_timeout_ms * 1000000LL : 0;
	for (;;) {
		int e = dsm_region_err(r);
		if (e)
			return e;
		if (end && mono_ns() >= end) {
			char t[200];
			snprintf(t, sizeof t, "page unavailable: dsmd has shown no lease for %u ms (the lease watchdog holds the mapping: dsmd is stopped, stuck or cut off)",
				 r->fault_timeout_ms);
			set_text(t);
			return -EHOSTUNREACH;
		}
		pthread_mutex_lock(&wd->mu);
		if (atomic_load(&wd->held))
			wait_changed(wd, mono_ns() + 100 * 1000000LL);
		int held = atomic_load(&wd->held);
		pthread_mutex_unlock(&wd->mu);
		if (!held)
			return 0;
	}
}

/* lease_first waits, for dsm_map, until the watchdog lets the new mapping
 * be accessible (dsmd holds a lease), at most LEASE_WAIT_NS: -EAGAIN
 * after that, or the mapping's error if its session ends first. Without
 * a watchdog it returns at once. */
static int lease_first(dsm_region *r)
{
	struct watchdog *wd = r->wd;
	if (wd == NULL)
		return 0;
	int64_t end = mono_ns() + LEASE_WAIT_NS;
	for (;;) {
		pthread_mutex_lock(&wd->mu);
		if (!wd->looked || atomic_load(&wd->held)) {
			int64_t t = mono_ns() + 100 * 1000000LL;
			wait_changed(wd, t < end ? t : end);
		}
		int ok = wd->looked && !atomic_load(&wd->held);
		pthread_mutex_unlock(&wd->mu);
		if (ok)
			return 0;
		int e = dsm_region_err(r);
		if (e)
			return e;
		if (mono_ns() >= end) {
			set_text("dsmd holds no lease");
			return -EAGAIN;
		}
	}
}

/* lease_times is how many times the watchdog held the mapping so far, for
 * lease_changed after an access that may fail. */
static uint64_t lease_times(dsm_region *r) { return r->wd ? atomic_load(&r->wd->times) : 0; }

/* lease_changed reports whether a failed access may be the watchdog's:
 * it holds the mapping now, or did at some point since times. */
static int lease_changed(dsm_region *r, uint64_t times)
{
	return r->wd && (atomic_load(&r->wd->held) || atomic_load(&r->wd->times) != times);
}

/* lease_enter counts the calling atomic busy unless the watchdog holds
 * the mapping (0: it does, and nothing is counted); lease_leave ends it. */
static int lease_enter(dsm_region *r)
{
	struct watchdog *wd = r->wd;
	if (wd == NULL)
		return 1;
	atomic_fetch_add(&wd->busy, 1);
	if (!atomic_load(&wd->held))
		return 1;
	atomic_fetch_sub(&wd->busy, 1);
	return 0;
}

static void lease_leave(dsm_region *r)
{
	if (r->wd)
		atomic_fetch_sub(&r->wd->busy, 1);
}

int dsm_watchdog(dsm_region *r, int *held, uint64_t *times)
{
	if (r == NULL)
		return -EINVAL;
	struct watchdog *wd = r->wd;
	if (held)
		*held = wd ? atomic_load(&wd->held) : 0;
	if (times)
		*times = wd ? atomic_load(&wd->times) : 0;
	return wd != NULL;
}

/* ---- fault timeouts: internal/mapclient/client.go's poison handling, in C ---- */

/*
 * A mapping made with a fault timeout (dsm_map_ex) carries it in its Map:
 * dsmd then gives up on a fault that has waited longer than that for a
 * page the cluster cannot serve (its home is down or unreachable, or dsmd
 * holds no lease). It sends the session Unavailable{page, why}, then
 * poisons the page in this process with UFFDIO_POISON on the userfaultfd
 * it was given: the faulting thread gets SIGBUS (a MADV_POPULATE_*
 * EHWPOISON), and so does every later access of this process to the page,
 * until dsmd serves the page again and sends Available{page}: then
 * MADV_DONTNEED of the page in this mapping removes the marker and the
 * next access faults as usual. A write fault on a page mapped read-only
 * here (held Shared; the upgrade needs the dead home) cannot be poisoned
 * from dsmd, since UFFDIO_POISON needs an empty page-table entry: dsmd
 * sends Poison{page}, and this process drops its mapping of the page,
 * clears the write-protect marker that leaves and poisons the page itself
 * with its own copy of the userfaultfd.
 *
 * The session thread reads these messages as they come (a thread blocked
 * in the fault cannot, and an Available must be acted on even when no
 * call of this library runs): one per mapping with a fault timeout, every
 * signal blocked, stopped and joined by dsm_unmap before anything it uses
 * goes. dsm_region_err reads them too, under the same mutex (mu).
 */

/* How long an access that hit a poison marker waits for dsmd's message
 * saying why (dsmd sends it before it poisons, so it is normally there
 * already): Go's notifyWait. */
#define NOTIFY_WAIT_NS (5 * 1000000000LL)

/* page_at is the first byte of region page p, NULL past the end. */
static unsigned char *page_at(dsm_region *r, uint64_t p)
{
	if (p >= r->len / r->page_size)
		return NULL;
	return r->base + p * r->page_size;
}

/* pz_find is the index of page p among the poisoned pages, or -1 (pmu
 * held). */
static ssize_t pz_find(dsm_region *r, uint64_t p)
{
	for (size_t i = 0; i < r->npz; i++)
		if (r->pz[i].page == p)
			return (ssize_t)i;
	return -1;
}

/* poison_record records that dsmd poisoned page p (it is about to, or
 * did), and why: accesses to it fail until unpoison. */
static void poison_record(dsm_region *r, uint64_t p, const char *why, size_t n)
{
	if (page_at(r, p) == NULL)
		return;
	if (n == 0) {
		why = "dsmd gave no reason";
		n = strlen(why);
	}
	char *w = malloc(n + 1);
	if (w == NULL)
		return; /* page_err then says that dsmd gave no reason */
	memcpy(w, why, n);
	w[n] = 0;
	pthread_mutex_lock(&r->pmu);
	ssize_t i = pz_find(r, p);
	if (i >= 0) {
		free(r->pz[i].why);
		r->pz[i].why = w;
	} else {
		if (r->npz == r->cappz) {
			size_t c = r->cappz ? 2 * r->cappz : 8;
			struct poisoned *q = realloc(r->pz, c * sizeof *q);
			if (q == NULL) {
				pthread_mutex_unlock(&r->pmu);
				free(w);
				return;
			}
			r->pz = q;
			r->cappz = c;
		}
		r->pz[r->npz++] = (struct poisoned){p, w};
	}
	pthread_cond_broadcast(&r->pchanged);
	pthread_mutex_unlock(&r->pmu);
}

/* unpoison removes the poison marker of page p, which dsmd serves again:
 * MADV_DONTNEED of the page in this mapping drops it (and the page's
 * mapping, which the next access faults back in from dsmd; a punch of the
 * memfd would not), then the record goes. An error leaves the marker: the
 * page stays poisoned for this mapping, as nothing better can be done. */
static void unpoison(dsm_region *r, uint64_t p)
{
	unsigned char *a = page_at(r, p);
	if (a == NULL)
		return;
	(void)madvise(a, r->page_size, MADV_DONTNEED);
	pthread_mutex_lock(&r->pmu);
	ssize_t i = pz_find(r, p);
	if (i >= 0) {
		free(r->pz[i].why);
		r->pz[i] = r->pz[--r->npz];
		pthread_cond_broadcast(&r->pchanged);
	}
	pthread_mutex_unlock(&r->pmu);
}

/* poison_mapped poisons page p of this mapping itself, as dsmd asks when it
 * cannot (Poison: a write fault on a page mapped read-only here).
 * MADV_DONTNEED drops the mapping of the page but leaves a write-protect
 * marker, which UFFDIO_POISON refuses too; clearing the protection of the
 * unmapped page (without waking) removes it; then UFFDIO_POISON, on this
 * process's own copy of the userfaultfd, installs the marker and wakes
 * the faulting thread, which gets SIGBUS. A write-protect marker that
 * dsmd sets again in between (a remote request on the page) is cleared
 * again, a few times; if the poison does not take, the faulting thread
 * waits until the page is available again. */
static void poison_mapped(dsm_region *r, uint64_t p)
{
	unsigned char *a = page_at(r, p);
	if (a == NULL || madvise(a, r->page_size, MADV_DONTNEED) != 0)
		return;
	for (int i = 0; i < 10; i++) {
		struct uffdio_writeprotect wp = {
			.range = {.start = (uintptr_t)a, .len = r->page_size},
			.mode = UFFDIO_WRITEPROTECT_MODE_DONTWAKE,
		};
		if (ioctl(r->uffd, UFFDIO_WRITEPROTECT, &wp) != 0)
			return;
		struct dsm_uffdio_poison po = {.range = {.start = (uintptr_t)a, .len = r->page_size}};
		if (ioctl(r->uffd, DSM_UFFDIO_POISON, &po) == 0 || errno != EEXIST)
			return;
	}
}

/* session_msg acts on one message that dsmd sent after Registered (n: its
 * length, or recv_msg's error) and returns the state it leaves the
 * mapping in: an Error ends the session with its reason, anything
 * malformed or unknown (or the end of the stream) as dsmd gone. */
static int session_msg(dsm_region *r, const unsigned char *b, ssize_t n)
{
	if (n < 2 || b[0] != PROTO_VERSION)
		return GONE;
	struct rd d = {b, (size_t)n, 2, 0};
	uint64_t p;
	switch (b[1]) {
	case T_UNAVAILABLE: {
		p = get_le(&d, 8);
		size_t tl = (size_t)get_le(&d, 2);
		if (d.bad || d.n - d.at != tl)
			return GONE;
		poison_record(r, p, (const char *)b + d.at, tl);
		return LIVE;
	}
	case T_AVAILABLE:
	case T_POISON:
		p = get_le(&d, 8);
		if (d.bad || d.at != d.n)
			return GONE;
		if (b[1] == T_AVAILABLE)
			unpoison(r, p);
		else
			poison_mapped(r, p);
		return LIVE;
	case T_ERROR:
		if (n >= 6) {
			int e = error_reply(b, (size_t)n);
			return e == -ENOENT ? DELETED : e == -EACCES ? DENIED : GONE;
		}
	}
	return GONE;
}

/* session_drain reads and acts on everything dsmd has sent on the session
 * so far, without waiting (mu held), and returns the mapping's state. */
static int session_drain(dsm_region *r)
{
	unsigned char b[MAX_MSG];
	int st;
	while ((st = atomic_load(&r->state)) == LIVE) {
		ssize_t n = recv_msg(r->conn, b, NULL, 0, MSG_DONTWAIT);
		if (n == -EAGAIN)
			break;
		st = session_msg(r, b, n);
		if (st != LIVE) {
			atomic_store(&r->state, st);
			/* Wake the accesses waiting for a reason: the session's
			 * end is theirs. */
			pthread_mutex_lock(&r->pmu);
			pthread_cond_broadcast(&r->pchanged);
			pthread_mutex_unlock(&r->pmu);
		}
	}
	return st;
}

/* session_watch is the session thread (see above): it acts on dsmd's
 * messages as they come until dsm_unmap stops it, and only waits for that
 * once the session has ended. */
static void *session_watch(void *arg)
{
	dsm_region *r = arg;
	int live = 1;
	for (;;) {
		struct pollfd p[2] = {{.fd = r->sefd, .events = POLLIN}, {.fd = r->conn, .events = POLLIN}};
		int n = poll(p, live ? 2 : 1, -1);
		if (n < 0) {
			if (errno != EINTR) {
				struct timespec ts = {0, 10 * 1000000L}; /* cannot happen */
				nanosleep(&ts, NULL);
			}
			continue;
		}
		if (p[0].revents)
			return NULL;
		if (live && p[1].revents) {
			pthread_mutex_lock(&r->mu);
			live = session_drain(r) == LIVE;
			pthread_mutex_unlock(&r->mu);
		}
	}
}

/* session_start starts r's session thread, with every signal blocked. */
static int session_start(dsm_region *r)
{
	r->sefd = eventfd(0, EFD_CLOEXEC);
	if (r->sefd < 0)
		return -errno;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int e = pthread_create(&r->sthread, NULL, session_watch, r);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (e)
		return -e;
	r->sstarted = 1;
	return 0;
}

/* session_stop stops and joins r's session thread, if any. */
static void session_stop(dsm_region *r)
{
	if (r->sstarted) {
		uint64_t one = 1;
		while (write(r->sefd, &one, sizeof one) < 0 && errno == EINTR)
			;
		pthread_join(r->sthread, NULL);
		r->sstarted = 0;
	}
	if (r->sefd >= 0)
		close(r->sefd);
	r->sefd = -1;
}

/* page_err is the error of an access to the region page holding off that
 * hit a poison marker: -EHOSTUNREACH with dsm_last_error naming the page
 * and dsmd's reason, waiting up to NOTIFY_WAIT_NS for dsmd's message if it
 * has not been read yet; or the mapping's error if its session ends
 * first. */
static int page_err(dsm_region *r, uint64_t off)
{
	uint64_t p = off / r->page_size;
	int64_t end = mono_ns() + NOTIFY_WAIT_NS;
	char t[sizeof last_err];
	for (;;) {
		/* Reads what dsmd sent, where no session thread does. */
		int e = dsm_region_err(r);
		if (e)
			return e;
		pthread_mutex_lock(&r->pmu);
		ssize_t i = pz_find(r, p);
		int64_t now = mono_ns();
		if (i >= 0 || now >= end) {
			if (i >= 0)
				snprintf(t, sizeof t, "page unavailable: page %llu at offset %#llx: %s", (unsigned long long)p,
					 (unsigned long long)(p * r->page_size), r->pz[i].why);
			else
				snprintf(t, sizeof t, "page unavailable: page %llu at offset %#llx is poisoned and dsmd did not say why",
					 (unsigned long long)p, (unsigned long long)(p * r->page_size));
			pthread_mutex_unlock(&r->pmu);
			set_text(t);
			return -EHOSTUNREACH;
		}
		int64_t until = now + 50 * 1000000LL < end ? now + 50 * 1000000LL : end;
		struct timespec ts = {until / 1000000000LL, until % 1000000000LL};
		pthread_cond_timedwait(&r->pchanged, &r->pmu, &ts);
		pthread_mutex_unlock(&r->pmu);
	}
}

int dsm_fault_err(dsm_region *r, uint64_t off)
{
	if (r == NULL || off >= r->len)
		return -EINVAL;
	last_err[0] = 0;
	int e = dsm_region_err(r);
	if (e)
		return e;
	if (r->wd != NULL && atomic_load(&r->wd->held)) {
		set_text("dsmd holds no lease: the watchdog keeps the mapping inaccessible until it does");
		return -EAGAIN;
	}
	return page_err(r, off);
}

static int pz_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct poisoned *)a)->page, y = ((const struct poisoned *)b)->page;
	return x < y ? -1 : x > y;
}

int dsm_unavailable(dsm_region *r, uint64_t *pages, int max)
{
	if (r == NULL || max < 0 || (max > 0 && pages == NULL))
		return -EINVAL;
	(void)dsm_region_err(r); /* reads what dsmd sent, where no session thread does */
	pthread_mutex_lock(&r->pmu);
	qsort(r->pz, r->npz, sizeof *r->pz, pz_cmp);
	int n = r->npz > INT_MAX ? INT_MAX : (int)r->npz;
	for (int i = 0; i < n && i < max; i++)
		pages[i] = r->pz[i].page;
	pthread_mutex_unlock(&r->pmu);
	return n;
}

int dsm_unavailable_why(dsm_region *r, uint64_t page, char *why, size_t len)
{
	if (r == NULL)
		return -EINVAL;
	pthread_mutex_lock(&r->pmu);
	ssize_t i = pz_find(r, page);
	if (why != NULL && len > 0)
		snprintf(why, len, "%s", i >= 0 ? r->pz[i].why : "");
	pthread_mutex_unlock(&r->pmu);
	return i >= 0;
}

/* map_once runs one mapping session's handshake asking for features and
 * a fault timeout (0: none); *id is the region id dsmd's page cache maps. */
static dsm_region *map_once(dsm_client *c, const char *name, uint32_t *id, uint64_t features, uint32_t timeout_ms)
{
	last_err[0] = 0;
	int e = 0, memfd = -1, leasefd = -1, uffd = -1;
	unsigned char *base = MAP_FAILED;
	dsm_region *r = NULL;
	struct watchdog *wd = NULL;
	if (c == NULL) {
		errno = EINVAL;
		return NULL;
	}
	struct buf w;
	start(&w, T_MAP);
	if (put_name(&w, name)) {
		errno = EINVAL;
		return NULL;
	}
	put_le(&w, 0, 8);               /* size: any */
	put_le(&w, timeout_ms, 8);      /* fault timeout in ms; 0: none */
	put_le(&w, features, 8);
	int conn = seq_connect(c->path);
	if (conn < 0) {
		errno = -conn;
		return NULL;
	}
	unsigned char rep[MAX_MSG];
	if ((e = send_msg(conn, &w, -1)))
		goto fail;
	int fds[2];
	ssize_t n = recv_msg(conn, rep, fds, features & FEATURE_LEASE_PAGE ? 2 : 1, 0);
	if (n >= 0) {
		memfd = fds[0];
		leasefd = features & FEATURE_LEASE_PAGE ? fds[1] : -1;
	}
	if (n < 0) {
		e = (int)n;
		goto fail;
	}
	if (n >= 2 && rep[1] == T_ERROR) {
		e = error_reply(rep, (size_t)n);
		goto fail;
	}
	struct rd rr = {rep, (size_t)n, 2, 0};
	if (n < 2 || rep[0] != PROTO_VERSION || rep[1] != T_MAPPED || memfd < 0) {
		e = -EPROTO;
		goto fail;
	}
	if (leasefd >= 0) {
		e = wd_new(leasefd, &wd);
		leasefd = -1;
		if (e)
			goto fail;
	}
	*id = (uint32_t)get_le(&rr, 4);
	uint64_t size = get_le(&rr, 8);
	uint64_t ps = get_le(&rr, 4);
	long sys = sysconf(_SC_PAGESIZE);
	struct stat st;
	if (rr.bad || rr.at != rr.n || ps == 0 || ps % (uint64_t)sys || size == 0 || size % ps ||
	    fstat(memfd, &st) != 0 || (uint64_t)st.st_size != size) {
		e = -EPROTO;
		goto fail;
	}
	base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (base == MAP_FAILED) {
		e = -errno;
		goto fail;
	}
	close(memfd);
	memfd = -1;
	if (madvise(base, size, MADV_DONTFORK) != 0) {
		e = -errno;
		goto fail;
	}
	uffd = uffd_open();
	if (uffd < 0) {
		e = uffd;
		uffd = -1;
		goto fail;
	}
	struct uffdio_register reg = {
		.range = {.start = (uintptr_t)base, .len = size},
		.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP | UFFDIO_REGISTER_MODE_MINOR,
	};
	if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0) {
		e = -errno;
		goto fail;
	}
	start(&w, T_REGISTER);
	put_le(&w, (uintptr_t)base, 8);
	put_le(&w, size, 8);
	if ((e = send_msg(conn, &w, uffd)))
		goto fail;
	n = recv_msg(conn, rep, NULL, 0, 0);
	if (n < 0) {
		e = (int)n;
		goto fail;
	}
	if (n >= 2 && rep[1] == T_ERROR) {
		e = error_reply(rep, (size_t)n);
		goto fail;
	}
	uint64_t session = 0;
	if (n == 10 && rep[0] == PROTO_VERSION && rep[1] == T_REGISTERED) {
		struct rd s = {rep, (size_t)n, 2, 0};
		session = get_le(&s, 8);
	} else if (!(n == 2 && rep[0] == PROTO_VERSION && rep[1] == T_REGISTERED)) {
		e = -EPROTO;
		goto fail;
	}
	r = calloc(1, sizeof *r);
	if (r == NULL || (r->name = strdup(name)) == NULL) {
		free(r);
		r = NULL;
		e = -ENOMEM;
		goto fail;
	}
	atomic_fetch_add(&c->refs, 1);
	r->c = c;
	r->base = base;
	r->len = size;
	r->page_size = ps;
	r->session = session;
	r->conn = conn;
	r->uffd = uffd;
	pthread_mutex_init(&r->mu, NULL);
	atomic_init(&r->state, LIVE);
	r->prot = PROT_READ | PROT_WRITE;
	r->wd = wd;
	r->fault_timeout_ms = timeout_ms;
	r->sefd = -1;
	pthread_mutex_init(&r->pmu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&r->pchanged, &ca);
	pthread_condattr_destroy(&ca);
	if ((wd != NULL && (e = wd_start(r)) != 0) || (timeout_ms > 0 && (e = session_start(r)) != 0)) {
		dsm_unmap(r);
		errno = -e;
		return NULL;
	}
	return r;
fail:
	if (wd != NULL)
		wd_free(wd);
	if (base != MAP_FAILED)
		munmap(base, size);
	if (uffd >= 0)
		close(uffd);
	if (memfd >= 0)
		close(memfd);
	if (leasefd >= 0)
		close(leasefd);
	close(conn);
	errno = -e;
	return NULL;
}

static int lookup(dsm_client *c, const char *name, struct region_info *ri)
{
	struct buf w;
	start(&w, T_LOOKUP);
	if (put_name(&w, name))
		return -EINVAL;
	unsigned char rep[MAX_MSG];
	ssize_t n = call(c, &w, rep, T_REGION);
	if (n < 0)
		return (int)n;
	return region_reply(rep, n, ri);
}

/* The page cache may lag behind the directory (a region created a moment
 * ago through another node): dsm_map waits this long for it, like the Go
 * library. */
#define MAP_LAG_NS (10 * 1000000000LL)

static int64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* map_session is map_once asking for the session's token and the lease
 * page, and again without the lease page when dsmd predates it (it
 * refuses the Map: unknown features); that mapping has no watchdog. */
static dsm_region *map_session(dsm_client *c, const char *name, uint32_t *id, uint32_t timeout_ms)
{
	dsm_region *r = map_once(c, name, id, FEATURE_SESSION | FEATURE_LEASE_PAGE, timeout_ms);
	if (r == NULL && errno == EINVAL && strstr(last_err, "unknown features"))
		r = map_once(c, name, id, FEATURE_SESSION, timeout_ms);
	return r;
}

/* leased hands out r once dsmd holds a lease (lease_first), or unmaps it. */
static dsm_region *leased(dsm_region *r)
{
	int e = lease_first(r);
	if (e == 0)
		return r;
	dsm_unmap(r);
	errno = -e;
	return NULL;
}

dsm_region *dsm_map(dsm_client *c, const char *name) { return dsm_map_ex(c, name, 0); }

dsm_region *dsm_map_ex(dsm_client *c, const char *name, uint32_t fault_timeout_ms)
{
	if (c == NULL) {
		errno = EINVAL;
		return NULL;
	}
	/* The directory is the authority on which regions exist and on their
	 * ids; never hand out a mapping of another region of that name. */
	struct region_info ri;
	uint32_t id;
	int e = lookup(c, name, &ri);
	if (e == -EPROTONOSUPPORT) {
		dsm_region *r = map_session(c, name, &id, fault_timeout_ms); /* a dsmd without control requests */
		return r ? leased(r) : NULL;
	}
	if (e) {
		errno = -e;
		return NULL;
	}
	int64_t start_ns = mono_ns(), wait = 5000000;
	for (;;) {
		id = 0;
		dsm_region *r = map_session(c, name, &id, fault_timeout_ms);
		if (r != NULL && id == ri.id)
			return leased(r);
		if (r != NULL)
			dsm_unmap(r); /* the page cache serves another region of that name */
		else if (errno != ENOENT)
			return NULL;
		if ((e = lookup(c, name, &ri)) != 0) {
			errno = -e;
			return NULL;
		}
		if (mono_ns() - start_ns > MAP_LAG_NS) {
			set_text("the directory has the region but this node's page cache still does not serve it");
			errno = EAGAIN;
			return NULL;
		}
		struct timespec ts = {0, wait};
		nanosleep(&ts, NULL);
		wait = wait * 2 < 100000000 ? wait * 2 : 100000000;
	}
}

void *dsm_addr(dsm_region *r) { return r ? r->base : NULL; }
uint64_t dsm_len(dsm_region *r) { return r ? r->len : 0; }
uint64_t dsm_page_size(dsm_region *r) { return r ? r->page_size : 0; }
uint64_t dsm_session(dsm_region *r) { return r ? r->session : 0; }

static int state_errno(int st)
{
	switch (st) {
	case LIVE: return 0;
	case DELETED: return -EIDRM;
	case DENIED: return -EACCES;
	default: return -ENOTCONN;
	}
}

int dsm_region_err(dsm_region *r)
{
	if (r == NULL)
		return -EINVAL;
	int st = atomic_load(&r->state);
	if (st != LIVE)
		return state_errno(st);
	struct pollfd p = {.fd = r->conn, .events = POLLIN};
	if (poll(&p, 1, 0) <= 0)
		return 0;
	/* dsmd said something: after Registered, the end of the session, or
	 * (fault timeouts) a page unavailable or available again. */
	pthread_mutex_lock(&r->mu);
	st = session_drain(r);
	pthread_mutex_unlock(&r->mu);
	return state_errno(st);
}

/* word checks the word at off and faults its page in from a syscall; on
 * success the caller does its one access to the word, then calls
 * lease_leave. While the lease watchdog holds the mapping it waits (and
 * the watchdog waits for the access between word and lease_leave). */
static int word(dsm_region *r, uint64_t off, int write)
{
	if (r == NULL || off % 8 || r->len < 8 || off > r->len - 8)
		return -EINVAL;
	int e = dsm_region_err(r);
	if (e)
		return e;
	uint64_t sys = (uint64_t)sysconf(_SC_PAGESIZE);
	unsigned char *lo = r->base + off / sys * sys;
	for (;;) {
		if ((e = lease_wait(r)))
			return e;
		uint64_t times = lease_times(r);
		if (madvise(lo, sys, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) != 0) {
			if (errno == EINTR)
				continue;
			e = -errno;
			int s = dsm_region_err(r);
			if (s)
				return s;
			if (lease_changed(r, times))
				continue; /* refused on a mapping the watchdog held */
			if (e == -EHWPOISON)
				return page_err(r, off); /* dsmd gave up on the page (fault timeout) */
			return e;
		}
		if (lease_enter(r))
			return 0;
	}
}

#define WORD(r, off) ((_Atomic uint64_t *)((r)->base + (off)))

int dsm_load_u64(dsm_region *r, uint64_t off, uint64_t *value)
{
	int e = word(r, off, 0);
	if (e)
		return e;
	uint64_t v = atomic_load(WORD(r, off));
	lease_leave(r);
	if ((e = dsm_region_err(r)))
		return e;
	if (value)
		*value = v;
	return 0;
}

int dsm_store_u64(dsm_region *r, uint64_t off, uint64_t value)
{
	int e = word(r, off, 1);
	if (e)
		return e;
	atomic_store(WORD(r, off), value);
	lease_leave(r);
	return dsm_region_err(r);
}

int dsm_add_u64(dsm_region *r, uint64_t off, uint64_t delta, uint64_t *new_value)
{
	int e = word(r, off, 1);
	if (e)
		return e;
	uint64_t v = atomic_fetch_add(WORD(r, off), delta) + delta;
	lease_leave(r);
	if ((e = dsm_region_err(r)))
		return e;
	if (new_value)
		*new_value = v;
	return 0;
}

int dsm_cas_u64(dsm_region *r, uint64_t off, uint64_t expected, uint64_t desired)
{
	int e = word(r, off, 1);
	if (e)
		return e;
	int ok = atomic_compare_exchange_strong(WORD(r, off), &expected, desired);
	lease_leave(r);
	if ((e = dsm_region_err(r)))
		return e;
	return ok;
}

int dsm_sync(dsm_region *r)
{
	if (r == NULL)
		return -EINVAL;
	int e = dsm_region_err(r);
	if (e)
		return e;
	struct buf w;
	start(&w, T_SYNC);
	put_name(&w, r->name);
	put_le(&w, 0, 8);
	put_le(&w, 0, 8);
	unsigned char rep[MAX_MSG];
	ssize_t n = call(r->c, &w, rep, T_DONE);
	if ((e = dsm_region_err(r)))
		return e;
	return n < 0 ? (int)n : 0;
}

int dsm_unmap(dsm_region *r)
{
	if (r == NULL)
		return -EINVAL;
	/* The threads first: they must not change the protection or the
	 * page tables of an address range that is no longer this mapping. */
	wd_stop(r);
	session_stop(r);
	close(r->conn);
	/* Unmap before closing the userfaultfd: that wakes any thread still
	 * waiting on a fault, which must then find no mapping. */
	int e = munmap(r->base, r->len) ? -errno : 0;
	close(r->uffd);
	pthread_mutex_destroy(&r->mu);
	for (size_t i = 0; i < r->npz; i++)
		free(r->pz[i].why);
	free(r->pz);
	pthread_cond_destroy(&r->pchanged);
	pthread_mutex_destroy(&r->pmu);
	client_unref(r->c);
	free(r->name);
	free(r);
	return e;
}

/* ---- the mutex: dsm/mutex.go, in C ---- */

enum {
	OWNER_SLOTS = 8,
	MUTEX_WORDS = 2 + OWNER_SLOTS,
	TICKET_BITS = 19,
	STATE_BITS = 3,
	SESSION_SHIFT = TICKET_BITS + STATE_BITS,
	LOCK_SPINS = 16,
};
#define TICKET_MASK ((1ULL << TICKET_BITS) - 1)
#define DIED_BIT (1ULL << 63)
#define NS 1000000000LL

enum { OWNER_WAITING = 1, OWNER_HOLDING, OWNER_SKIPPED, OWNER_DIED };

static const int64_t lock_min_sleep = 2000;          /* ns */
static const int64_t lock_max_sleep = 1000000;       /* ns */
static const int64_t lock_check_after = 1 * NS;      /* a stall this long makes a waiter look ahead */
static const int64_t lock_unrecorded = 5 * NS;       /* a ticket that could record itself and did not */

struct dsm_mutex {
	dsm_region *r;
	uint64_t off;
	uint64_t ticket;
	int held;
};

static uint64_t owner_word(uint64_t ticket, unsigned st, uint64_t session)
{
	return (ticket & TICKET_MASK) | (uint64_t)st << TICKET_BITS | session << SESSION_SHIFT;
}

static unsigned owner_state(uint64_t w) { return (unsigned)(w >> TICKET_BITS & ((1u << STATE_BITS) - 1)); }

static int names(uint64_t w, uint64_t t) { return owner_state(w) != 0 && (w & TICKET_MASK) == (t & TICKET_MASK); }

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * NS + ts.tv_nsec;
}

static uint64_t mw(dsm_mutex *m, int i) { return m->off + 8 * (uint64_t)i; }
static uint64_t slot_of(dsm_mutex *m, uint64_t ticket) { return mw(m, 2 + (int)(ticket % OWNER_SLOTS)); }

static int load(dsm_mutex *m, uint64_t off, uint64_t *v) { return dsm_load_u64(m->r, off, v); }
static int cas(dsm_mutex *m, uint64_t off, uint64_t old, uint64_t new_) { return dsm_cas_u64(m->r, off, old, new_); }

dsm_mutex *dsm_mutex_new(dsm_region *r, uint64_t off)
{
	if (r == NULL || off % 8 || r->len < DSM_MUTEX_SIZE || off > r->len - DSM_MUTEX_SIZE) {
		errno = EINVAL;
		return NULL;
	}
	dsm_mutex *m = calloc(1, sizeof *m);
	if (m == NULL)
		return NULL;
	m->r = r;
	m->off = off;
	return m;
}

void dsm_mutex_free(dsm_mutex *m) { free(m); }

/* pass_given_up moves the now-serving word past the tickets given up or
 * skipped at the head of the line, from sw on (a holder found dead sets
 * the died bit for the next acquirer), so that the next live ticket need
 * not wait for a waiter's look. */
static int pass_given_up(dsm_mutex *m, uint64_t sw)
{
	for (int i = 0; i < OWNER_SLOTS; i++) {
		uint64_t head = sw & ~DIED_BIT, w;
		int e = load(m, slot_of(m, head), &w);
		if (e)
			return e;
		unsigned st = owner_state(w);
		if (!names(w, head) || (st != OWNER_SKIPPED && st != OWNER_DIED))
			return 0;
		uint64_t next = (head + 1) | (sw & DIED_BIT);
		if (st == OWNER_DIED)
			next |= DIED_BIT;
		int ok = cas(m, mw(m, 1), sw, next);
		if (ok <= 0)
			return ok;
		sw = next;
	}
	return 0;
}

/* line_watch is what a waiter remembers of the tickets ahead of it between
 * looks: since when each has been recordable (its owner word free) without
 * being recorded. The tickets it looks at lie in [head, head + OWNER_SLOTS)
 * and the head only moves on, so one entry per owner word, keyed by the
 * ticket, holds them all: an entry of another ticket is an older one's. */
struct line_watch {
	uint64_t ticket[OWNER_SLOTS];
	int64_t since[OWNER_SLOTS];
	unsigned char seen[OWNER_SLOTS];
};

/* check_line looks at the tickets from the head of the line (sw's, which
 * has not moved for lock_check_after) up to ticket, at most OWNER_SLOTS of
 * them: it skips each whose taker has left it unrecorded for
 * lock_unrecorded since it could record it, and, when ask, each whose
 * taker dsmd says is dead (one question for them all); then it passes the
 * tickets skipped or given up at the head. */
static int check_line(dsm_mutex *m, uint64_t sw, uint64_t ticket, struct line_watch *line, int ask)
{
	uint64_t head = sw & ~DIED_BIT, ws[OWNER_SLOTS], tokens[OWNER_SLOTS];
	int at[OWNER_SLOTS], dead[OWNER_SLOTS], n = 0, k = 0, e;
	for (; n < OWNER_SLOTS && head + (uint64_t)n < ticket; n++)
		if ((e = load(m, slot_of(m, head + (uint64_t)n), &ws[n])))
			return e;
	int64_t now = now_ns();
	for (int i = 0; i < n; i++) {
		uint64_t t = head + (uint64_t)i, w = ws[i];
		unsigned st = owner_state(w), j = (unsigned)(t % OWNER_SLOTS);
		if (!names(w, t)) {
			if (!line->seen[j] || line->ticket[j] != t) {
				line->seen[j] = 1;
				line->ticket[j] = t;
				line->since[j] = now;
				continue;
			}
			if (now - line->since[j] < lock_unrecorded)
				continue;
			int ok = cas(m, slot_of(m, t), w, owner_word(t, OWNER_SKIPPED, 0));
			if (ok < 0)
				return ok;
		} else if (ask && (st == OWNER_WAITING || st == OWNER_HOLDING)) {
			tokens[k] = w >> SESSION_SHIFT;
			at[k++] = i;
		}
	}
	if (k > 0) {
		sessions_dead(m->r->c, tokens, k, dead);
		for (int j = 0; j < k; j++) {
			if (!dead[j])
				continue;
			uint64_t t = head + (uint64_t)at[j], w = ws[at[j]];
			unsigned st = owner_state(w) == OWNER_HOLDING ? OWNER_DIED : OWNER_SKIPPED;
			int ok = cas(m, slot_of(m, t), w, owner_word(t, st, w >> SESSION_SHIFT));
			if (ok < 0)
				return ok;
		}
	}
	return pass_given_up(m, sw);
}

/* wait_turn records the taker of ticket and waits for its turn: 1 got the
 * lock (*died: the previous holder died holding it), 0 skipped, or a
 * negative errno value. */
static int wait_turn(dsm_mutex *m, uint64_t ticket, int *died, int64_t deadline)
{
	uint64_t me = m->r->session, slot = slot_of(m, ticket), last = 0;
	int recorded = 0, e;
	int64_t sleep = lock_min_sleep, since = now_ns(), checked = 0;
	struct line_watch line = {0};
	for (int i = 0;; i++) {
		uint64_t sw;
		if ((e = load(m, mw(m, 1), &sw)))
			return e;
		uint64_t serving = sw & ~DIED_BIT;
		if (serving > ticket)
			return 0;
		if (sw != last) {
			last = sw;
			since = now_ns();
		}
		if (!recorded && ticket - serving < OWNER_SLOTS) {
			uint64_t cur;
			if ((e = load(m, slot, &cur)))
				return e;
			if (names(cur, ticket))
				return 0;
			int ok = cas(m, slot, cur, owner_word(ticket, OWNER_WAITING, me));
			if (ok < 0)
				return ok;
			recorded = ok;
			continue;
		}
		if (recorded && serving == ticket) {
			int ok = cas(m, slot, owner_word(ticket, OWNER_WAITING, me), owner_word(ticket, OWNER_HOLDING, me));
			if (ok <= 0)
				return ok;
			if (sw & DIED_BIT)
				(void)cas(m, mw(m, 1), sw, serving); /* else Unlock clears it */
			*died = (sw & DIED_BIT) != 0;
			return 1;
		}
		int64_t t = now_ns();
		if (deadline && t >= deadline && !recorded) {
			/* Too far back to record itself: its owner word still
			 * belongs to an earlier ticket. Return at once; the
			 * waiters behind skip the ticket as unrecorded once it
			 * could have been recorded for lock_unrecorded (the Go
			 * library also records it given up from a goroutine;
			 * libdsm starts no thread for that). */
			return -ETIMEDOUT;
		}
		if (deadline && t >= deadline) {
			/* Give the ticket up; the waiter after it skips it. */
			int ok = cas(m, slot, owner_word(ticket, OWNER_WAITING, me), owner_word(ticket, OWNER_SKIPPED, me));
			if (ok < 0)
				return ok;
			if (ok)
				return -ETIMEDOUT;
			continue; /* its turn came: take the lock */
		}
		/* Every waiter, recorded or not, looks at the line ahead of it
		 * when the head has not moved for lock_check_after: a waiter too
		 * far back to record itself may be the only live one. It asks
		 * dsmd after lock_check_after right behind the head, after twice
		 * that further back (so that one question usually suffices). */
		int64_t stalled = t - since;
		if (stalled >= lock_check_after && t - checked >= lock_check_after) {
			uint64_t ahead = ticket - serving;
			int ask = stalled >= lock_check_after * (ahead < 2 ? (int64_t)ahead : 2);
			if ((e = check_line(m, sw, ticket, &line, ask)))
				return e;
			checked = now_ns();
			continue;
		}
		if (i < LOCK_SPINS) {
			sched_yield();
			continue;
		}
		struct timespec ts = {sleep / NS, sleep % NS};
		nanosleep(&ts, NULL);
		sleep = sleep * 2 < lock_max_sleep ? sleep * 2 : lock_max_sleep;
	}
}

/* mutex_lock_until is dsm_mutex_lock that gives up, -ETIMEDOUT, at
 * deadline (CLOCK_MONOTONIC ns; 0: never) while it waits in the line. */
static int mutex_lock_until(dsm_mutex *m, int64_t deadline)
{
	for (;;) {
		uint64_t next;
		int e = dsm_add_u64(m->r, m->off, 1, &next);
		if (e)
			return e;
		uint64_t ticket = next - 1;
		int died = 0;
		int got = wait_turn(m, ticket, &died, deadline);
		if (got < 0) {
			/* Give the ticket up, so that the next waiter skips it
			 * (a ticket not recorded needs nothing: it is skipped as
			 * such, and this fails). */
			uint64_t me = m->r->session;
			(void)cas(m, slot_of(m, ticket), owner_word(ticket, OWNER_WAITING, me), owner_word(ticket, OWNER_SKIPPED, me));
			return got;
		}
		if (got == 0)
			continue; /* skipped: take a new ticket */
		m->ticket = ticket;
		m->held = 1;
		return died ? -EOWNERDEAD : 0;
	}
}

int dsm_mutex_lock(dsm_mutex *m)
{
	if (m == NULL)
		return -EINVAL;
	return mutex_lock_until(m, 0);
}

int dsm_mutex_trylock(dsm_mutex *m)
{
	if (m == NULL)
		return -EINVAL;
	uint64_t sw;
	int e = load(m, mw(m, 1), &sw);
	if (e)
		return e;
	if ((e = pass_given_up(m, sw)))
		return e;
	if ((e = load(m, mw(m, 1), &sw)))
		return e;
	uint64_t serving = sw & ~DIED_BIT;
	int ok = cas(m, m->off, serving, serving + 1);
	if (ok <= 0)
		return ok;
	uint64_t me = m->r->session, slot = slot_of(m, serving);
	for (;;) {
		uint64_t cur;
		if ((e = load(m, slot, &cur)))
			return e;
		if (names(cur, serving))
			return 0; /* skipped as never recorded */
		ok = cas(m, slot, cur, owner_word(serving, OWNER_HOLDING, me));
		if (ok < 0)
			return ok;
		if (ok)
			break;
	}
	m->ticket = serving;
	m->held = 1;
	if (sw & DIED_BIT) {
		(void)cas(m, mw(m, 1), sw, serving);
		return -EOWNERDEAD;
	}
	return 1;
}

int dsm_mutex_unlock(dsm_mutex *m)
{
	if (m == NULL)
		return -EINVAL;
	uint64_t sw, w;
	int e = load(m, mw(m, 1), &sw);
	if (e)
		return e;
	uint64_t serving = sw & ~DIED_BIT, ticket = m->ticket;
	int held = m->held;
	m->held = 0;
	if (!held) {
		uint64_t next;
		ticket = serving;
		if ((e = load(m, m->off, &next)))
			return e;
		if (next == serving)
			return -EPERM;
	}
	if ((e = load(m, slot_of(m, ticket), &w)))
		return e;
	if (serving != ticket || !names(w, ticket) || owner_state(w) != OWNER_HOLDING) {
		set_text("the lock was taken over: its holder was found dead");
		return -EPERM;
	}
	int ok = cas(m, mw(m, 1), sw, serving + 1);
	if (ok < 0)
		return ok;
	if (!ok)
		return -EPERM;
	return pass_given_up(m, serving + 1);
}

/* ---- liveness and pacing, shared by the barrier and the semaphore ---- */

/* A session token as the barrier's and the semaphore's words record it
 * (docs/synchronization.md: 42 bits hold every token whole). */
#define SESSION_FIELD(t) ((t) & ((1ULL << 42) - 1))

/* pace paces the poll of a word like the mutex: a few yields, then sleeps
 * doubling from lock_min_sleep to lock_max_sleep. */
struct pace {
	int i;
	int64_t sleep;
};

static void pace_wait(struct pace *p)
{
	if (p->i < LOCK_SPINS) {
		p->i++;
		sched_yield();
		return;
	}
	if (p->sleep == 0)
		p->sleep = lock_min_sleep;
	struct timespec ts = {p->sleep / NS, p->sleep % NS};
	nanosleep(&ts, NULL);
	p->sleep = p->sleep * 2 < lock_max_sleep ? p->sleep * 2 : lock_max_sleep;
}

/* deadline_of turns a timeout in ns (negative: none) into a deadline for
 * mutex_lock_until and the waits below (0: none). */
static int64_t deadline_of(int64_t timeout_ns)
{
	if (timeout_ns < 0)
		return 0;
	int64_t d = now_ns() + timeout_ns;
	return d == 0 ? 1 : d;
}

int dsm_mutex_timedlock(dsm_mutex *m, int64_t timeout_ns)
{
	if (m == NULL)
		return -EINVAL;
	return mutex_lock_until(m, deadline_of(timeout_ns));
}

/* init_count records count in the word at off if it is zero, and fails
 * with -EINVAL if it holds another (the object was made with another
 * capacity or number of parties). */
static int init_count(dsm_region *r, uint64_t off, uint64_t count)
{
	int e = dsm_cas_u64(r, off, 0, count);
	if (e < 0)
		return e;
	uint64_t got;
	if ((e = dsm_load_u64(r, off, &got)))
		return e;
	if (got != count) {
		char t[128];
		snprintf(t, sizeof t, "made with %llu, in use with %llu", (unsigned long long)count, (unsigned long long)got);
		set_text(t);
		return -EINVAL;
	}
	return 0;
}

/* place checks that size bytes at off are 8-byte aligned words inside r. */
static int place(dsm_region *r, uint64_t off, uint64_t size)
{
	if (r == NULL || off % 8 || r->len < size || off > r->len - size)
		return -EINVAL;
	if (r->session == 0) {
		set_text("dsmd gave this mapping no session token");
		return -EOPNOTSUPP;
	}
	return 0;
}

/* ---- the semaphore (dsm/semaphore.go) ---- */

enum {
	SEM_CAPACITY = MUTEX_WORDS,
	SEM_RELEASES,
	SEM_HOLDER,
	SEM_HOLDERS = 16,
	SEM_WORDS = SEM_HOLDER + SEM_HOLDERS,
	UNIT_BITS = 22,
};
#define UNIT_MASK ((1ULL << UNIT_BITS) - 1)

_Static_assert(8 * SEM_WORDS == DSM_SEMAPHORE_SIZE, "semaphore layout");
_Static_assert(SEM_HOLDERS == DSM_SEMAPHORE_HOLDERS, "semaphore holders");
_Static_assert(UNIT_MASK == DSM_SEMAPHORE_MAX, "semaphore units");

static uint64_t holder_word(uint64_t session, uint64_t units)
{
	return units == 0 ? 0 : SESSION_FIELD(session) << UNIT_BITS | units;
}

static uint64_t holder_session(uint64_t w) { return w >> UNIT_BITS; }

static uint64_t sem_word(uint64_t off, int i) { return off + 8 * (uint64_t)i; }

/* sem_check validates a semaphore call and records or compares its
 * capacity. */
static int sem_check(dsm_region *r, uint64_t off, uint64_t capacity, uint64_t n)
{
	int e = place(r, off, DSM_SEMAPHORE_SIZE);
	if (e)
		return e;
	if (capacity == 0 || capacity > DSM_SEMAPHORE_MAX || n > capacity)
		return -EINVAL;
	return init_count(r, sem_word(off, SEM_CAPACITY), capacity);
}

static int sem_holders(dsm_region *r, uint64_t off, uint64_t *h)
{
	for (int i = 0; i < SEM_HOLDERS; i++) {
		int e = dsm_load_u64(r, sem_word(off, SEM_HOLDER + i), &h[i]);
		if (e)
			return e;
	}
	return 0;
}

/* sem_take takes n units if they are free, in the holder word of this
 * session or a free one: 1 taken, 0 not there now, or a negative errno
 * value; h is left with the holder words it read last. Only the head of
 * the queue calls it. */
static int sem_take(dsm_region *r, uint64_t off, uint64_t capacity, uint64_t n, uint64_t *h)
{
	uint64_t me = SESSION_FIELD(r->session);
	for (;;) {
		int e = sem_holders(r, off, h);
		if (e)
			return e;
		uint64_t used = 0;
		int mine = -1, free_ = -1;
		for (int i = 0; i < SEM_HOLDERS; i++) {
			used += h[i] & UNIT_MASK;
			if (h[i] != 0 && holder_session(h[i]) == me)
				mine = i;
			else if (h[i] == 0 && free_ < 0)
				free_ = i;
		}
		int i = mine >= 0 ? mine : free_;
		if (used > capacity || capacity - used < n || i < 0)
			return 0;
		int ok = dsm_cas_u64(r, sem_word(off, SEM_HOLDER + i), h[i], holder_word(me, (h[i] & UNIT_MASK) + n));
		if (ok)
			return ok;
	}
}

/* sem_sweep clears the holder words of sessions dsmd says are dead: 1 if
 * it cleared one, 0 if not, or a negative errno value. */
static int sem_sweep(dsm_region *r, uint64_t off)
{
	uint64_t h[SEM_HOLDERS], tokens[SEM_HOLDERS], me = SESSION_FIELD(r->session);
	int dead[SEM_HOLDERS], cleared = 0;
	int e = sem_holders(r, off, h);
	if (e)
		return e;
	for (int i = 0; i < SEM_HOLDERS; i++)
		tokens[i] = h[i] != 0 && holder_session(h[i]) != me ? holder_session(h[i]) : 0;
	sessions_dead(r->c, tokens, SEM_HOLDERS, dead);
	for (int i = 0; i < SEM_HOLDERS; i++) {
		if (!dead[i])
			continue;
		int ok = dsm_cas_u64(r, sem_word(off, SEM_HOLDER + i), h[i], 0);
		if (ok < 0)
			return ok;
		cleared |= ok;
	}
	return cleared;
}

/* sem_leave unlocks the queue; should that fail, the took units taken are
 * given back, so that a caller told of an error holds nothing. */
static int sem_leave(dsm_mutex *q, uint64_t capacity, uint64_t took)
{
	int e = dsm_mutex_unlock(q);
	if (e && took)
		(void)dsm_sem_release(q->r, q->off, capacity, took);
	return e;
}

static int sem_acquire(dsm_region *r, uint64_t off, uint64_t capacity, uint64_t n, int64_t deadline)
{
	int e = sem_check(r, off, capacity, n);
	if (e || n == 0)
		return e;
	dsm_mutex q = {.r = r, .off = off};
	/* A head before that died waiting leaves nothing to repair. */
	if ((e = mutex_lock_until(&q, deadline)) && e != -EOWNERDEAD)
		return e;
	uint64_t h[SEM_HOLDERS], last[SEM_HOLDERS] = {0}, releases = 0;
	int64_t read = 0, since = now_ns(), checked = 0;
	int first = 1;
	struct pace p = {0};
	for (;;) {
		uint64_t rel;
		if ((e = dsm_load_u64(r, sem_word(off, SEM_RELEASES), &rel))) {
			(void)sem_leave(&q, capacity, 0);
			return e;
		}
		/* One word to poll: the holder words are read again when a
		 * release says so, and once a second all the same (a releaser
		 * may die between its two steps). */
		if (first || rel != releases || now_ns() - read >= lock_check_after) {
			first = 0;
			releases = rel;
			read = now_ns();
			int ok = sem_take(r, off, capacity, n, h);
			if (ok < 0) {
				(void)sem_leave(&q, capacity, 0);
				return ok;
			}
			if (ok)
				return sem_leave(&q, capacity, n);
			if (memcmp(h, last, sizeof h) != 0) {
				memcpy(last, h, sizeof h);
				since = now_ns();
				p = (struct pace){0};
			}
		}
		int64_t t = now_ns();
		if (deadline && t >= deadline) {
			if ((e = sem_leave(&q, capacity, 0)))
				return e;
			return -ETIMEDOUT;
		}
		if (t - since >= lock_check_after && (checked == 0 || t - checked >= lock_check_after)) {
			int cleared = sem_sweep(r, off);
			if (cleared < 0) {
				(void)sem_leave(&q, capacity, 0);
				return cleared;
			}
			checked = now_ns();
			if (cleared)
				first = 1;
			continue;
		}
		pace_wait(&p);
	}
}

int dsm_sem_acquire(dsm_region *r, uint64_t off, uint64_t capacity, uint64_t n)
{
	return sem_acquire(r, off, capacity, n, 0);
}

int dsm_sem_timedacquire(dsm_region *r, uint64_t off, uint64_t capacity, uint64_t n, int64_t timeout_ns)
{
	return sem_acquire(r, off, capacity, n, deadline_of(timeout_ns));
}

int dsm_sem_tryacquire(dsm_region *r, uint64_t off, uint64_t capacity, uint64_t n)
{
	int e = sem_check(r, off, capacity, n);
	if (e)
		return e;
	if (n == 0)
		return 1;
	dsm_mutex q = {.r = r, .off = off};
	int ok = dsm_mutex_trylock(&q);
	if (ok == 0 || (ok < 0 && ok != -EOWNERDEAD))
		return ok;
	uint64_t h[SEM_HOLDERS];
	int took = sem_take(r, off, capacity, n, h);
	if (took == 0) {
		int64_t t = now_ns(), swept = atomic_load(&r->swept);
		if ((swept == 0 || t - swept >= lock_check_after) && atomic_compare_exchange_strong(&r->swept, &swept, t)) {
			int cleared = sem_sweep(r, off);
			took = cleared > 0 ? sem_take(r, off, capacity, n, h) : cleared;
		}
	}
	if (took < 0) {
		(void)sem_leave(&q, capacity, 0);
		return took;
	}
	if ((e = sem_leave(&q, capacity, took ? n : 0)))
		return e;
	return took;
}

int dsm_sem_release(dsm_region *r, uint64_t off, uint64_t capacity, uint64_t n)
{
	int e = sem_check(r, off, capacity, n);
	if (e || n == 0)
		return e;
	uint64_t me = SESSION_FIELD(r->session), h[SEM_HOLDERS];
	for (;;) {
		if ((e = sem_holders(r, off, h)))
			return e;
		int i = 0;
		while (i < SEM_HOLDERS && !(h[i] != 0 && holder_session(h[i]) == me))
			i++;
		uint64_t held = i < SEM_HOLDERS ? h[i] & UNIT_MASK : 0;
		if (held < n) {
			char t[96];
			snprintf(t, sizeof t, "this mapping holds %llu units, releases %llu", (unsigned long long)held, (unsigned long long)n);
			set_text(t);
			return -EPERM;
		}
		int ok = dsm_cas_u64(r, sem_word(off, SEM_HOLDER + i), h[i], holder_word(me, held - n));
		if (ok < 0)
			return ok;
		if (ok) {
			/* Wake the head of the line; the units are back even if
			 * this fails (it reads the holder words once a second). */
			(void)dsm_add_u64(r, sem_word(off, SEM_RELEASES), 1, NULL);
			return 0;
		}
	}
}

int dsm_sem_available(dsm_region *r, uint64_t off, uint64_t capacity, uint64_t *units)
{
	int e = sem_check(r, off, capacity, 0);
	if (e)
		return e;
	uint64_t h[SEM_HOLDERS], used = 0;
	if ((e = sem_holders(r, off, h)))
		return e;
	for (int i = 0; i < SEM_HOLDERS; i++)
		used += h[i] & UNIT_MASK;
	*units = used > capacity ? 0 : capacity - used;
	return 0;
}

/* ---- the barrier (dsm/barrier.go) ---- */

enum {
	BAR_STATE = 0,
	BAR_PARTIES = 1,
	BAR_BROKEN_BY = 2,
	BAR_PARTY = 4,
	BAR_WORDS = BAR_PARTY + DSM_BARRIER_MAX_PARTIES,
	PARTY_GEN_BITS = 21,
	PARTY_SESSION_SHIFT = PARTY_GEN_BITS + 1,
};
#define BAR_BROKEN (1ULL << 63)
#define BAR_GEN_MASK ((1ULL << 31) - 1)
#define BAR_COUNT_MASK ((1ULL << 32) - 1)
#define BAR_GEN(s) ((s) >> 32 & BAR_GEN_MASK)
#define PARTY_RECORDED (1ULL << PARTY_GEN_BITS)

_Static_assert(8 * BAR_WORDS == DSM_BARRIER_SIZE, "barrier layout");

struct dsm_barrier {
	dsm_region *r;
	uint64_t off;
	unsigned parties;
	int slot;	    /* the word of this party's session at its last wait, or -1 */
	int checked;	    /* the parties word holds parties */
	uint64_t broken_by; /* the dead party of the last -EPIPE, or 0 */
};

static uint64_t party_word(uint64_t session, uint64_t gen)
{
	return SESSION_FIELD(session) << PARTY_SESSION_SHIFT | PARTY_RECORDED | (gen & (PARTY_RECORDED - 1));
}

static uint64_t party_session(uint64_t w) { return w >> PARTY_SESSION_SHIFT; }

static uint64_t bw(dsm_barrier *b, int i) { return b->off + 8 * (uint64_t)i; }

dsm_barrier *dsm_barrier_new(dsm_region *r, uint64_t off, unsigned parties)
{
	int e = place(r, off, DSM_BARRIER_SIZE);
	if (e == 0 && (parties < 1 || parties > DSM_BARRIER_MAX_PARTIES))
		e = -EINVAL;
	if (e) {
		errno = -e;
		return NULL;
	}
	dsm_barrier *b = calloc(1, sizeof *b);
	if (b == NULL)
		return NULL;
	b->r = r;
	b->off = off;
	b->parties = parties;
	b->slot = -1;
	return b;
}

void dsm_barrier_free(dsm_barrier *b) { free(b); }

uint64_t dsm_barrier_broken_by(dsm_barrier *b) { return b ? b->broken_by : 0; }

static int bar_check(dsm_barrier *b)
{
	if (b == NULL)
		return -EINVAL;
	if (b->checked)
		return 0;
	int e = init_count(b->r, bw(b, BAR_PARTIES), b->parties);
	if (e == 0)
		b->checked = 1;
	return e;
}

/* bar_broken is the result of a wait on a broken barrier. */
static int bar_broken(dsm_barrier *b)
{
	int e = dsm_load_u64(b->r, bw(b, BAR_BROKEN_BY), &b->broken_by);
	if (e)
		return e;
	char t[96];
	if (b->broken_by)
		snprintf(t, sizeof t, "the barrier is broken: party session %#llx died", (unsigned long long)b->broken_by);
	else
		snprintf(t, sizeof t, "the barrier is broken");
	set_text(t);
	return -EPIPE;
}

/* party_words reads the party words into words, and into tokens the
 * sessions recorded there, 0 for free words and for this session. */
static int party_words(dsm_barrier *b, uint64_t *words, uint64_t *tokens)
{
	uint64_t me = SESSION_FIELD(b->r->session);
	for (unsigned i = 0; i < b->parties; i++) {
		int e = dsm_load_u64(b->r, bw(b, BAR_PARTY + (int)i), &words[i]);
		if (e)
			return e;
		if (tokens)
			tokens[i] = words[i] != 0 && party_session(words[i]) != me ? party_session(words[i]) : 0;
	}
	return 0;
}

/* bar_register makes sure this party's session has a party word, and
 * records gen in it. Parties of one session share its word. */
static int bar_register(dsm_barrier *b, uint64_t gen)
{
	uint64_t me = SESSION_FIELD(b->r->session), words[DSM_BARRIER_MAX_PARTIES], tokens[DSM_BARRIER_MAX_PARTIES] = {0};
	uint64_t pw = party_word(me, gen);
	int n = (int)b->parties, slot = b->slot, dead[DSM_BARRIER_MAX_PARTIES], e, ok;
	for (;;) {
		int mine = -1;
		if (slot >= 0 && slot < n) {
			/* Usually the word used last still names this session. */
			if ((e = dsm_load_u64(b->r, bw(b, BAR_PARTY + slot), &words[slot])))
				return e;
			if (words[slot] != 0 && party_session(words[slot]) == me)
				mine = slot;
		}
		if (mine < 0) {
			if ((e = party_words(b, words, NULL)))
				return e;
			for (int i = 0; i < n && mine < 0; i++)
				if (words[i] != 0 && party_session(words[i]) == me)
					mine = i;
		}
		if (mine >= 0) {
			if ((ok = dsm_cas_u64(b->r, bw(b, BAR_PARTY + mine), words[mine], pw)) < 0)
				return ok;
			if (ok) {
				b->slot = mine;
				return 0;
			}
			slot = -1;
			continue; /* a party of this session arrived meanwhile */
		}
		for (int i = 0; i < n; i++) {
			if (words[i] != 0)
				continue;
			if ((ok = dsm_cas_u64(b->r, bw(b, BAR_PARTY + i), 0, pw)) < 0)
				return ok;
			if (ok) {
				b->slot = i;
				return 0;
			}
		}
		for (int i = 0; i < n; i++)
			tokens[i] = party_session(words[i]);
		sessions_dead(b->r->c, tokens, n, dead);
		for (int i = 0; i < n; i++) {
			if (!dead[i])
				continue;
			if ((ok = dsm_cas_u64(b->r, bw(b, BAR_PARTY + i), words[i], pw)) < 0)
				return ok;
			if (ok) {
				b->slot = i;
				return 0;
			}
		}
		set_text("every party word names a live session");
		return -EUSERS;
	}
}

/* bar_break_if_dead asks dsmd about the recorded parties of a generation
 * stalled at state s, and breaks the barrier if one of them is dead. */
static int bar_break_if_dead(dsm_barrier *b, uint64_t s)
{
	uint64_t words[DSM_BARRIER_MAX_PARTIES], tokens[DSM_BARRIER_MAX_PARTIES];
	int dead[DSM_BARRIER_MAX_PARTIES], e;
	if ((e = party_words(b, words, tokens)))
		return e;
	sessions_dead(b->r->c, tokens, (int)b->parties, dead);
	for (unsigned i = 0; i < b->parties; i++) {
		if (!dead[i])
			continue;
		/* The session first, so that whoever sees the broken bit can
		 * name it. */
		if ((e = dsm_cas_u64(b->r, bw(b, BAR_BROKEN_BY), 0, tokens[i])) < 0)
			return e;
		e = dsm_cas_u64(b->r, bw(b, BAR_STATE), s, s | BAR_BROKEN);
		return e < 0 ? e : 0;
	}
	return 0;
}

static int bar_wait(dsm_barrier *b, int64_t deadline)
{
	int e = bar_check(b), ok;
	if (e)
		return e;
	b->broken_by = 0;
	uint64_t n = b->parties, s, gen;
	for (;;) {
		if ((e = dsm_load_u64(b->r, bw(b, BAR_STATE), &s)))
			return e;
		if (s & BAR_BROKEN)
			return bar_broken(b);
		gen = BAR_GEN(s);
		if ((e = bar_register(b, gen)))
			return e;
		uint64_t arrived = s & BAR_COUNT_MASK, next = s + 1;
		if (arrived + 1 >= n)
			next = ((gen + 1) & BAR_GEN_MASK) << 32; /* all arrived: the next generation */
		if ((ok = dsm_cas_u64(b->r, bw(b, BAR_STATE), s, next)) < 0)
			return ok;
		if (!ok)
			continue;
		if (arrived + 1 >= n)
			return (int)gen;
		s = next;
		break;
	}
	uint64_t last = s;
	int64_t since = now_ns(), checked = 0;
	struct pace p = {0};
	for (;;) {
		uint64_t cur;
		if ((e = dsm_load_u64(b->r, bw(b, BAR_STATE), &cur)))
			return e;
		uint64_t d = (BAR_GEN(cur) - gen) & BAR_GEN_MASK;
		if (d == 1)
			return (int)gen;
		if (d >= 2) {
			/* Reset while this party waited: its arrival is void. */
			set_text("the barrier was reset while this party waited");
			return -EPIPE;
		}
		if (cur & BAR_BROKEN)
			return bar_broken(b);
		if (cur != last) {
			last = cur;
			since = now_ns();
			p = (struct pace){0};
		}
		int64_t t = now_ns();
		if (deadline && t >= deadline) {
			/* Withdraw: one arrival fewer in this generation. */
			if ((ok = dsm_cas_u64(b->r, bw(b, BAR_STATE), cur, cur - 1)) < 0)
				return ok;
			if (ok)
				return -ETIMEDOUT;
			continue;
		}
		if (t - since >= lock_check_after && (checked == 0 || t - checked >= lock_check_after)) {
			if ((e = bar_break_if_dead(b, cur)))
				return e;
			checked = now_ns();
			continue;
		}
		pace_wait(&p);
	}
}

int dsm_barrier_wait(dsm_barrier *b) { return bar_wait(b, 0); }

int dsm_barrier_timedwait(dsm_barrier *b, int64_t timeout_ns) { return bar_wait(b, deadline_of(timeout_ns)); }

int dsm_barrier_reset(dsm_barrier *b)
{
	int e = bar_check(b), ok;
	if (e)
		return e;
	uint64_t tok, s;
	if ((e = dsm_load_u64(b->r, bw(b, BAR_BROKEN_BY), &tok)))
		return e;
	do {
		if ((e = dsm_load_u64(b->r, bw(b, BAR_STATE), &s)))
			return e;
		/* Two generations on: a waiter of this one tells a reset from
		 * its release. */
		ok = dsm_cas_u64(b->r, bw(b, BAR_STATE), s, ((BAR_GEN(s) + 2) & BAR_GEN_MASK) << 32);
		if (ok < 0)
			return ok;
	} while (!ok);
	if (tok != 0 && (e = dsm_cas_u64(b->r, bw(b, BAR_BROKEN_BY), tok, 0)) < 0)
		return e;
	uint64_t words[DSM_BARRIER_MAX_PARTIES], tokens[DSM_BARRIER_MAX_PARTIES];
	int dead[DSM_BARRIER_MAX_PARTIES];
	if ((e = party_words(b, words, tokens)))
		return e;
	sessions_dead(b->r->c, tokens, (int)b->parties, dead);
	for (unsigned i = 0; i < b->parties; i++)
		if (dead[i] && (e = dsm_cas_u64(b->r, bw(b, BAR_PARTY + (int)i), words[i], 0)) < 0)
			return e;
	return 0;
}

int dsm_barrier_generation(dsm_barrier *b, uint64_t *gen)
{
	int e = bar_check(b);
	if (e)
		return e;
	uint64_t s;
	if ((e = dsm_load_u64(b->r, bw(b, BAR_STATE), &s)))
		return e;
	if (gen)
		*gen = BAR_GEN(s);
	return (s & BAR_BROKEN) != 0;
}

const char *dsm_strerror(int err)
{
	if (err < 0)
		err = -err;
	switch (err) {
	case 0: return "success";
	case EIDRM: return "dsm: the region was deleted";
	case ENOTCONN: return "dsm: dsmd went away (the mapping is no longer served)";
	case EOWNERDEAD: return "dsm: the previous holder of the mutex died holding it";
	case EPROTO: return "dsm: dsmd sent a malformed or unexpected message";
	case EPROTONOSUPPORT: return "dsm: this dsmd does not serve control requests (too old)";
	case ENOENT: return "dsm: no such region (or no dsmd socket)";
	case EEXIST: return "dsm: a region of that name exists with another spec";
	case EBUSY: return "dsm: the region is mapped";
	case EPERM: return "dsm: the mutex is not held through this value";
	case EACCES: return "dsm: permission denied";
	case EPIPE: return "dsm: the barrier is broken (a party died, or it was reset)";
	case EUSERS: return "dsm: more sessions than the barrier's parties take part";
	case EHOSTUNREACH: return "dsm: page unavailable: the cluster could not serve it within the fault timeout";
	}
	return strerror(err);
}
