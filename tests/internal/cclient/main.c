/*
 * cclient drives libdsm for the tests in tests/: one command against one
 * region of the dsmd at ADDR, printing its result on stdout.
 *
 *   cclient ADDR REGION create SIZE
 *   cclient ADDR REGION delete
 *   cclient ADDR REGION mutex-inc LOCKOFF N CNTOFF   (plain increments under the mutex)
 *   cclient ADDR REGION add OFF DELTA N              (prints the last new value)
 *   cclient ADDR REGION hex OFF LEN                  (plain loads, as hex)
 *   cclient ADDR REGION lock LOCKOFF                 (lock, print ok or owner-died, unlock)
 *   cclient ADDR REGION lock-hold LOCKOFF            (lock, print locked, hold until killed)
 *   cclient ADDR REGION lock-timed LOCKOFF MS        (timed lock of MS ms: print timeout, or ok
 *                                                     or owner-died, then unlock)
 *   cclient ADDR REGION barrier OFF PARTIES          (wait once: "passed GEN", or "broken session 0x..")
 *   cclient ADDR REGION barrier-hold OFF PARTIES     (print "session 0x..", wait once, print
 *                                                     "passed GEN", hold until killed)
 *   cclient ADDR REGION barrier-loop OFF PARTIES N CNTOFF
 *                                                    (N times: add 1 at CNTOFF, wait, check that
 *                                                     every party's addition is there)
 *   cclient ADDR REGION sem-acquire OFF CAP N        (acquire N units, print ok, exit holding them)
 *   cclient ADDR REGION sem-try OFF CAP N            (try-acquire: print true or false, exit)
 *   cclient ADDR REGION sem-check OFF CAP CNTOFF N [MAXOFF]
 *                                                    (N times: acquire 1, count the holders
 *                                                     inside at CNTOFF, fail above CAP, keep
 *                                                     the most seen at MAXOFF, release)
 *   cclient ADDR REGION pong OFF                     (the C end of the same-host ping-pong
 *                                                     benchmark, as tests/internal/pingpong:
 *                                                     prints "ready SEQ", then answers)
 *   cclient ADDR REGION watch-loop OFF               (prints "started W", W: dsm_watchdog; then,
 *                                                     every millisecond, a plain store and load of
 *                                                     the word at OFF, and "ok T N" after each that
 *                                                     succeeded (T: CLOCK_BOOTTIME ns, N: the value);
 *                                                     "wrong GOT WANT" and exit 1 on another value;
 *                                                     on SIGSEGV "fault T HELD TIMES" (dsm_watchdog)
 *                                                     and exit 0)
 *   cclient ADDR REGION watch-repl                   (prints "mapped W ADDR", W: dsm_watchdog, ADDR:
 *                                                     dsm_addr in hex; then answers lines of stdin:
 *                                                     "load OFF" / "store OFF V" (plain, 8 bytes):
 *                                                     "ok [V]" or "fault", a SIGSEGV recovered with
 *                                                     siglongjmp; "aload OFF" (dsm_load_u64): "ok V"
 *                                                     or "err E"; "aadd-loop OFF T": dsm_add_u64 of 1
 *                                                     until the watchdog has held the mapping T
 *                                                     times and let go, then "ok ADDS VALUE";
 *                                                     "watchdog": "W HELD TIMES"; "unmap": "ok")
 *   cclient ADDR REGION fault-repl MS                (watch-repl on a mapping made with dsm_map_ex,
 *                                                     a fault timeout of MS ms; a plain access that
 *                                                     gets SIGBUS answers "fault SIGBUS"; and more
 *                                                     lines: "astore OFF V" (dsm_store_u64): "ok" or
 *                                                     "err E TEXT"; "unavail" (dsm_unavailable and
 *                                                     dsm_unavailable_why): "none" or "P=WHY;P=WHY...";
 *                                                     "faulterr OFF" (dsm_fault_err): "err E TEXT")
 *
 * The atomics of watch-repl and fault-repl answer "err E TEXT" on failure
 * (E: the negative errno value, TEXT: dsm_last_error).
 */
#include <dsm.h>
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what, int e)
{
	fprintf(stderr, "cclient: %s: %s %s\n", what, dsm_strerror(e), dsm_last_error());
	exit(1);
}

static uint64_t num(const char *s) { return strtoull(s, NULL, 0); }

static uint64_t boottime(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_BOOTTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* The mapping watch-loop accesses, for its SIGSEGV handler. */
static dsm_region *watched;

/* put_num appends v in decimal at p; async-signal-safe. */
static char *put_num(char *p, uint64_t v)
{
	char t[20];
	int n = 0;
	do
		t[n++] = (char)('0' + v % 10);
	while ((v /= 10) != 0);
	while (n > 0)
		*p++ = t[--n];
	return p;
}

/* on_fault reports a fault of watch-loop's access and exits. */
static void on_fault(int sig)
{
	char line[80], *p = line;
	int held = 0;
	uint64_t times = 0;
	dsm_watchdog(watched, &held, &times);
	memcpy(p, "fault ", 6);
	p = put_num(p + 6, boottime());
	*p++ = ' ';
	p = put_num(p, (uint64_t)held);
	*p++ = ' ';
	p = put_num(p, times);
	*p++ = '\n';
	ssize_t k = write(1, line, (size_t)(p - line));
	(void)k;
	_exit(0);
}

static sigjmp_buf recover_env;

static void on_fault_recover(int sig) { siglongjmp(recover_env, sig); }

/* watch_repl is the watch-repl command (above); it unmaps r on "unmap". */
static void watch_repl(dsm_region *r)
{
	unsigned char *b = dsm_addr(r);
	struct sigaction sa = {.sa_handler = on_fault_recover};
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSEGV, &sa, NULL) != 0 || sigaction(SIGBUS, &sa, NULL) != 0)
		die("sigaction", errno);
	printf("mapped %d %llx\n", dsm_watchdog(r, NULL, NULL), (unsigned long long)(uintptr_t)b);
	fflush(stdout);
	char line[256];
	while (fgets(line, sizeof line, stdin) != NULL) {
		unsigned long long off, v;
		int held, e;
		uint64_t times, got;
		if (sscanf(line, "load %llu", &off) == 1 || sscanf(line, "store %llu %llu", &off, &v) == 2) {
			volatile uint64_t *w = (volatile uint64_t *)(b + off);
			int store = line[0] == 's', sig;
			if ((sig = sigsetjmp(recover_env, 1)) != 0) {
				puts(sig == SIGBUS ? "fault SIGBUS" : "fault");
			} else if (store) {
				*w = v;
				puts("ok");
			} else {
				got = *w;
				printf("ok %llu\n", (unsigned long long)got);
			}
		} else if (sscanf(line, "aload %llu", &off) == 1) {
			if ((e = dsm_load_u64(r, off, &got)))
				printf("err %d %s\n", e, dsm_last_error());
			else
				printf("ok %llu\n", (unsigned long long)got);
		} else if (sscanf(line, "astore %llu %llu", &off, &v) == 2) {
			if ((e = dsm_store_u64(r, off, v)))
				printf("err %d %s\n", e, dsm_last_error());
			else
				puts("ok");
		} else if (sscanf(line, "faulterr %llu", &off) == 1) {
			e = dsm_fault_err(r, off);
			printf("err %d %s\n", e, dsm_last_error());
		} else if (strcmp(line, "unavail\n") == 0) {
			uint64_t pages[64];
			char why[1100];
			int n = dsm_unavailable(r, pages, 64);
			if (n < 0)
				printf("err %d\n", n);
			else if (n == 0)
				puts("none");
			for (int i = 0; i < n && i < 64; i++) {
				dsm_unavailable_why(r, pages[i], why, sizeof why);
				printf("%s%llu=%s", i ? ";" : "", (unsigned long long)pages[i], why);
			}
			if (n > 0)
				putchar('\n');
		} else if (sscanf(line, "aadd-loop %llu %llu", &off, &v) == 2) {
			uint64_t adds = 0;
			for (;;) {
				if ((e = dsm_add_u64(r, off, 1, &got)))
					break;
				adds++;
				dsm_watchdog(r, &held, &times);
				if (times >= v && !held)
					break;
			}
			if (e)
				printf("err %d %s\n", e, dsm_last_error());
			else
				printf("ok %llu %llu\n", (unsigned long long)adds, (unsigned long long)got);
		} else if (strcmp(line, "watchdog\n") == 0) {
			e = dsm_watchdog(r, &held, &times);
			printf("%d %d %llu\n", e, held, (unsigned long long)times);
		} else if (strcmp(line, "unmap\n") == 0) {
			if ((e = dsm_unmap(r)))
				die("unmap", e);
			puts("ok");
			fflush(stdout);
			break;
		} else {
			printf("unknown %s", line);
		}
		fflush(stdout);
	}
	/* Stay until stdin closes, for the test to look at the process. */
	while (fgets(line, sizeof line, stdin) != NULL)
		;
	exit(0);
}

/* watch_loop is the watch-loop command (above). */
static void watch_loop(dsm_region *r, uint64_t off)
{
	char line[80];
	if (off % 8 || off + 8 > dsm_len(r))
		die("watch-loop", EINVAL);
	watched = r;
	struct sigaction sa = {.sa_handler = on_fault};
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSEGV, &sa, NULL) != 0)
		die("sigaction", errno);
	int n = snprintf(line, sizeof line, "started %d\n", dsm_watchdog(r, NULL, NULL));
	if (write(1, line, (size_t)n) != n)
		exit(1);
	volatile uint64_t *w = (volatile uint64_t *)((unsigned char *)dsm_addr(r) + off);
	for (uint64_t v = 1;; v++) {
		*w = v;
		uint64_t got = *w;
		uint64_t t = boottime();
		if (got != v) {
			printf("wrong %llu %llu\n", (unsigned long long)got, (unsigned long long)v);
			exit(1);
		}
		n = snprintf(line, sizeof line, "ok %llu %llu\n", (unsigned long long)t, (unsigned long long)v);
		if (write(1, line, (size_t)n) != n)
			exit(1);
		struct timespec ms = {0, 1000000};
		nanosleep(&ms, NULL);
	}
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: cclient ADDR REGION CMD ARGS...\n");
		return 2;
	}
	const char *region = argv[2], *cmd = argv[3];
	dsm_client *c = dsm_connect(argv[1]);
	if (c == NULL)
		die("connect", errno);
	int e;
	if (strcmp(cmd, "create") == 0 && argc == 5) {
		if ((e = dsm_create(c, region, num(argv[4]))))
			die("create", e);
		dsm_close(c);
		puts("ok");
		return 0;
	}
	if (strcmp(cmd, "delete") == 0 && argc == 4) {
		if ((e = dsm_delete(c, region)))
			die("delete", e);
		dsm_close(c);
		puts("ok");
		return 0;
	}
	dsm_region *r = strcmp(cmd, "fault-repl") == 0 && argc == 5 ? dsm_map_ex(c, region, (uint32_t)num(argv[4]))
									 : dsm_map(c, region);
	if (r == NULL)
		die("map", errno);
	unsigned char *b = dsm_addr(r);
	if (strcmp(cmd, "mutex-inc") == 0 && argc == 7) {
		dsm_mutex *m = dsm_mutex_new(r, num(argv[4]));
		uint64_t n = num(argv[5]), off = num(argv[6]);
		if (m == NULL)
			die("mutex", errno);
		for (uint64_t i = 0; i < n; i++) {
			if ((e = dsm_mutex_lock(m)))
				die("lock", e);
			uint64_t v;
			memcpy(&v, b + off, 8);
			v++;
			memcpy(b + off, &v, 8);
			if ((e = dsm_mutex_unlock(m)))
				die("unlock", e);
		}
		dsm_mutex_free(m);
		puts("ok");
	} else if ((strcmp(cmd, "lock") == 0 || strcmp(cmd, "lock-hold") == 0) && argc == 5) {
		dsm_mutex *m = dsm_mutex_new(r, num(argv[4]));
		if (m == NULL)
			die("mutex", errno);
		e = dsm_mutex_lock(m);
		if (e != 0 && e != -EOWNERDEAD)
			die("lock", e);
		if (strcmp(cmd, "lock-hold") == 0) {
			puts("locked");
			fflush(stdout);
			for (;;)
				pause();
		}
		puts(e == -EOWNERDEAD ? "owner-died" : "ok");
		if ((e = dsm_mutex_unlock(m)))
			die("unlock", e);
		dsm_mutex_free(m);
	} else if (strcmp(cmd, "lock-timed") == 0 && argc == 6) {
		dsm_mutex *m = dsm_mutex_new(r, num(argv[4]));
		if (m == NULL)
			die("mutex", errno);
		e = dsm_mutex_timedlock(m, (int64_t)num(argv[5]) * 1000000);
		if (e == -ETIMEDOUT) {
			puts("timeout");
		} else if (e != 0 && e != -EOWNERDEAD) {
			die("timedlock", e);
		} else {
			puts(e == -EOWNERDEAD ? "owner-died" : "ok");
			if ((e = dsm_mutex_unlock(m)))
				die("unlock", e);
		}
		dsm_mutex_free(m);
	} else if ((strcmp(cmd, "barrier") == 0 || strcmp(cmd, "barrier-hold") == 0) && argc == 6) {
		dsm_barrier *bar = dsm_barrier_new(r, num(argv[4]), (unsigned)num(argv[5]));
		if (bar == NULL)
			die("barrier", errno);
		int hold = strcmp(cmd, "barrier-hold") == 0;
		if (hold) {
			printf("session %#llx\n", (unsigned long long)dsm_session(r));
			fflush(stdout);
		}
		int gen = dsm_barrier_wait(bar);
		if (gen == -EPIPE && dsm_barrier_broken_by(bar))
			printf("broken session %#llx\n", (unsigned long long)dsm_barrier_broken_by(bar));
		else if (gen == -EPIPE)
			puts("broken");
		else if (gen < 0)
			die("barrier wait", gen);
		else
			printf("passed %d\n", gen);
		fflush(stdout);
		if (hold)
			for (;;)
				pause();
		dsm_barrier_free(bar);
	} else if (strcmp(cmd, "barrier-loop") == 0 && argc == 8) {
		uint64_t parties = num(argv[5]), n = num(argv[6]), cnt = num(argv[7]), got;
		dsm_barrier *bar = dsm_barrier_new(r, num(argv[4]), (unsigned)parties);
		if (bar == NULL)
			die("barrier", errno);
		for (uint64_t i = 0; i < n; i++) {
			if ((e = dsm_add_u64(r, cnt, 1, NULL)))
				die("add", e);
			int gen = dsm_barrier_wait(bar);
			if (gen < 0)
				die("barrier wait", gen);
			if ((e = dsm_load_u64(r, cnt, &got)))
				die("load", e);
			if (got < parties * ((uint64_t)gen + 1)) {
				fprintf(stderr, "cclient: generation %d passed with %llu arrivals counted\n", gen, (unsigned long long)got);
				return 1;
			}
		}
		dsm_barrier_free(bar);
		puts("ok");
	} else if (strcmp(cmd, "sem-acquire") == 0 && argc == 7) {
		if ((e = dsm_sem_acquire(r, num(argv[4]), num(argv[5]), num(argv[6]))))
			die("acquire", e);
		puts("ok");
	} else if (strcmp(cmd, "sem-try") == 0 && argc == 7) {
		if ((e = dsm_sem_tryacquire(r, num(argv[4]), num(argv[5]), num(argv[6]))) < 0)
			die("try-acquire", e);
		puts(e ? "true" : "false");
	} else if (strcmp(cmd, "sem-check") == 0 && (argc == 8 || argc == 9)) {
		uint64_t off = num(argv[4]), cap = num(argv[5]), cnt = num(argv[6]), n = num(argv[7]), in, most;
		for (uint64_t i = 0; i < n; i++) {
			if ((e = dsm_sem_acquire(r, off, cap, 1)))
				die("acquire", e);
			if ((e = dsm_add_u64(r, cnt, 1, &in)))
				die("add", e);
			if (in > cap) {
				fprintf(stderr, "cclient: %llu holders inside a semaphore of %llu\n", (unsigned long long)in, (unsigned long long)cap);
				return 1;
			}
			while (argc == 9 && (e = dsm_load_u64(r, num(argv[8]), &most)) == 0 && most < in)
				if ((e = dsm_cas_u64(r, num(argv[8]), most, in)) < 0)
					break;
			if (e < 0)
				die("max", e);
			if ((e = dsm_add_u64(r, cnt, ~0ULL, NULL)))
				die("add", e);
			if ((e = dsm_sem_release(r, off, cap, 1)))
				die("release", e);
		}
		puts("ok");
	} else if (strcmp(cmd, "pong") == 0 && argc == 5) {
		/* A 32-byte message at off (a sequence word, then 24 bytes);
		 * the answer at off+128, its sequence word stored last. */
		uint64_t off = num(argv[4]), v;
		if (off % 64 || off + 256 > dsm_len(r))
			die("pong", EINVAL);
		if ((e = dsm_load_u64(r, off, &v)) || (e = dsm_store_u64(r, off + 128, 0)))
			die("pong", e);
		_Atomic uint64_t *ping = (_Atomic uint64_t *)(b + off), *pong = (_Atomic uint64_t *)(b + off + 128);
		/* The word before "ready", announced with it: the pinger counts
		 * on from it, so a first ping stored at any time after this load
		 * differs from last and is answered. */
		uint64_t last = atomic_load_explicit(ping, memory_order_acquire);
		printf("ready %llu\n", (unsigned long long)last);
		fflush(stdout);
		for (unsigned long spins = 0;; spins++) {
			uint64_t seq = atomic_load_explicit(ping, memory_order_acquire);
			if (seq == last) {
				if ((spins & 0xffff) == 0) {
					struct pollfd p = {.fd = 0, .events = POLLIN};
					if (poll(&p, 1, 0) > 0)
						break; /* stdin closed (or written): done */
				}
				continue;
			}
			memcpy(b + off + 128 + 8, b + off + 8, 24);
			atomic_store_explicit(pong, seq, memory_order_release);
			last = seq;
		}
	} else if ((strcmp(cmd, "watch-repl") == 0 && argc == 4) || (strcmp(cmd, "fault-repl") == 0 && argc == 5)) {
		watch_repl(r);
	} else if (strcmp(cmd, "watch-loop") == 0 && argc == 5) {
		watch_loop(r, num(argv[4]));
	} else if (strcmp(cmd, "add") == 0 && argc == 7) {
		uint64_t v = 0, n = num(argv[6]);
		for (uint64_t i = 0; i < n; i++)
			if ((e = dsm_add_u64(r, num(argv[4]), num(argv[5]), &v)))
				die("add", e);
		printf("%llu\n", (unsigned long long)v);
	} else if (strcmp(cmd, "hex") == 0 && argc == 6) {
		uint64_t off = num(argv[4]), n = num(argv[5]);
		if (off > dsm_len(r) || n > dsm_len(r) - off)
			die("hex", EINVAL);
		for (uint64_t i = 0; i < n; i++)
			printf("%02x", b[off + i]);
		putchar('\n');
		if ((e = dsm_region_err(r)))
			die("hex", e);
	} else {
		fprintf(stderr, "cclient: unknown command %s with %d arguments\n", cmd, argc - 4);
		return 2;
	}
	if ((e = dsm_unmap(r)))
		die("unmap", e);
	dsm_close(c);
	return 0;
}
