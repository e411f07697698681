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
 *   cclient ADDR REGION pong OFF                     (the C end of the same-host ping-pong
 *                                                     benchmark, as tests/internal/pingpong:
 *                                                     prints "ready SEQ", then answers)
 */
#include <dsm.h>
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void die(const char *what, int e)
{
	fprintf(stderr, "cclient: %s: %s %s\n", what, dsm_strerror(e), dsm_last_error());
	exit(1);
}

static uint64_t num(const char *s) { return strtoull(s, NULL, 0); }

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
		puts("ok");
		return 0;
	}
	if (strcmp(cmd, "delete") == 0 && argc == 4) {
		if ((e = dsm_delete(c, region)))
			die("delete", e);
		puts("ok");
		return 0;
	}
	dsm_region *r = dsm_map(c, region);
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
