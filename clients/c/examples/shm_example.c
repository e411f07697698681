/*
 * shm_example: the classic shm_open + ftruncate + mmap program, with a
 * region of the cluster instead of a POSIX shared-memory object.
 *
 *   shm_example write NAME TEXT   # on one node: create, map, write, sync
 *   shm_example read NAME         # on another: map, print the text
 *
 * The node is $DSM_ADDR (its socket), else /run/dsm/dsmd.sock.
 */
#include <dsm.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#define SIZE 4096 /* ftruncate(fd, SIZE) */

int main(int argc, char **argv)
{
	if (argc < 3 || (strcmp(argv[1], "write") == 0 && argc != 4)) {
		fprintf(stderr, "usage: %s write NAME TEXT | read NAME\n", argv[0]);
		return 2;
	}
	const char *name = argv[2];
	dsm_client *c = dsm_connect(NULL); /* fd = shm_open(name, ...) */
	if (c == NULL) {
		perror("dsm_connect");
		return 1;
	}
	int e;
	if (strcmp(argv[1], "write") == 0 && (e = dsm_create(c, name, SIZE)) != 0) {
		fprintf(stderr, "dsm_create: %s %s\n", dsm_strerror(e), dsm_last_error());
		return 1;
	}
	dsm_region *r = dsm_map(c, name); /* p = mmap(NULL, SIZE, ..., fd, 0) */
	if (r == NULL) {
		fprintf(stderr, "dsm_map: %s %s\n", dsm_strerror(-errno), dsm_last_error());
		return 1;
	}
	char *p = dsm_addr(r);
	if (strcmp(argv[1], "write") == 0) {
		size_t n = strlen(argv[3]);
		if (n >= dsm_len(r))
			n = dsm_len(r) - 1;
		memcpy(p, argv[3], n); /* plain stores */
		p[n] = 0;
		if ((e = dsm_sync(r)) != 0) { /* msync */
			fprintf(stderr, "dsm_sync: %s\n", dsm_strerror(e));
			return 1;
		}
	} else {
		printf("%.*s\n", (int)strnlen(p, dsm_len(r)), p); /* plain loads */
	}
	dsm_unmap(r); /* munmap */
	dsm_close(c);
	return 0;
}
