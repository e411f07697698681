// The C half of the ofi backend: a thin layer over libfabric that the Go
// side drives with one cgo call per batch, per poll and per control step.
// Every buffer these functions touch is C memory owned by the Go side's
// pools; nothing here retains a Go pointer.

#ifndef DSM_OFI_FAB_H
#define DSM_OFI_FAB_H

#include <stdint.h>
#include <stddef.h>
#include <rdma/fabric.h>
#include <sys/socket.h>

#define DSM_MAX_BATCH 256
#define DSM_RECV_TAG 0xffffffffu

enum {
	DSM_OP_READ = 1,
	DSM_OP_WRITE = 2,
	DSM_OP_CAS = 3,
	DSM_OP_FAA = 4,
	DSM_OP_SEND = 5,
};

// dsm_ctx is the operation context handed to libfabric: the provider's
// scratch space first (FI_CONTEXT2), then where the completion belongs.
typedef struct dsm_ctx {
	struct fi_context2 fctx;
	uint32_t slot;
	uint32_t idx;
} dsm_ctx;

// dsm_op is one operation of a batch as the Go side describes it.
typedef struct dsm_op {
	uint64_t raddr;
	uint64_t key;
	uint64_t len;
	uint64_t loff; // offset of the local buffer in the slot's arena
	uint32_t kind;
	uint32_t pad;
} dsm_op;

// dsm_slot is the C memory of one request in flight: contexts, operation
// descriptions, the atomic operand, compare and result words, and the
// staging arena of READ, WRITE and SEND payloads.
typedef struct dsm_slot {
	dsm_ctx ctx[DSM_MAX_BATCH];
	dsm_op ops[DSM_MAX_BATCH];
	uint64_t cmp[DSM_MAX_BATCH];
	uint64_t opnd[DSM_MAX_BATCH];
	uint64_t res[DSM_MAX_BATCH];
	struct fid_mr *words_mr; // only with FI_MR_LOCAL
	void *words_desc;
	char *arena;
	size_t arena_len;
	struct fid_mr *arena_mr; // only with FI_MR_LOCAL
	void *arena_desc;
	int posted; // how many ops the last dsm_post handed to the provider
} dsm_slot;

// dsm_cqe is one completion as the Go side sees it.
typedef struct dsm_cqe {
	uint32_t slot;
	uint32_t idx;
	uint64_t len;
	int32_t err;      // 0, or a positive FI_E* code
	int32_t prov_err; // provider-specific code of an error completion
} dsm_cqe;

typedef struct dsm_fab {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_ep *ep;
	struct fid_av *av;
	struct fid_cq *cq;
	uint64_t mr_mode;
	int waitable;     // the CQ has a wait object: fi_cq_sread blocks
	int bell_fd;      // the doorbell socket, or -1
	int bell_reqs;    // set by dsm_bell_serve
	int auto_progress;
	size_t inject_size;
	char name[256];
	size_t namelen;
	uint64_t next_local_key;
	// receive buffers
	int nrecv;
	size_t recv_size;
	char *recv_bufs;
	dsm_ctx *recv_ctx;
	struct fid_mr *recv_mr;
	void *recv_desc;
} dsm_fab;

int dsm_open(const char *prov, const char *node, const char *service, const char *src_str,
	int nrecv, size_t recv_size, dsm_fab **out, char *err, size_t errlen);
void dsm_close_ep(dsm_fab *f);
void dsm_close(dsm_fab *f);
const char *dsm_prov_name(dsm_fab *f);

int dsm_av_insert(dsm_fab *f, const void *name, fi_addr_t *out);
int dsm_av_remove(dsm_fab *f, fi_addr_t a);
// dsm_drop_conn closes the provider's connection to the endpoint name
// (ofi_rxm), if any; later traffic opens a new one.
int dsm_drop_conn(dsm_fab *f, const void *name);

int dsm_mr_reg(dsm_fab *f, void *buf, size_t len, uint64_t access, uint64_t req_key,
	struct fid_mr **mr, uint64_t *key);
int dsm_mr_close(struct fid_mr *mr);

dsm_slot *dsm_slot_new(dsm_fab *f, uint32_t id);
void dsm_slot_free(dsm_slot *s);
int dsm_slot_grow(dsm_fab *f, dsm_slot *s, size_t n);
int dsm_slot_trim(dsm_fab *f, dsm_slot *s, size_t keep);

// dsm_bell is the doorbell of a peer endpoint on the same host (shm): the
// address of its Unix datagram socket, empty (len 0) where it has none.
typedef struct dsm_bell {
	int len; // of the sockaddr_un in addr; 0: no doorbell
	char addr[112];
} dsm_bell;

// dsm_post posts ops[from:to] of the slot to dest. WRITEs carry
// FI_DELIVERY_COMPLETE when dc is set. When any op needs the target's
// progress (all but READ), or the provider answered FI_EAGAIN, it rings the
// target's doorbell, asking to be rung back.
int dsm_post(dsm_fab *f, struct fid_ep *ep, dsm_slot *s, fi_addr_t dest, int from, int to,
	int dc, const dsm_bell *bell);
int dsm_send(dsm_fab *f, struct fid_ep *ep, dsm_slot *s, fi_addr_t dest, size_t len,
	const dsm_bell *bell);

// dsm_tx_open opens an endpoint of its own (named name, with an address
// vector of its own holding only peer, its completions on f's queue) for
// the requests this endpoint initiates towards one shm peer; dest is the
// peer's address there. See the package documentation, "Dead peers".
int dsm_tx_open(dsm_fab *f, const char *name, const void *peer, struct fid_ep **ep,
	struct fid_av **av, fi_addr_t *dest);
void dsm_tx_close(struct fid_ep *ep, struct fid_av *av);
int dsm_repost_recv(dsm_fab *f, uint32_t idx);
// How dsm_poll waits when no completion is ready.
enum {
	DSM_POLL_SLEEP = 1, // read, sleep 20 us, read again
	DSM_POLL_BLOCK = 2, // fi_cq_sread on the CQ's wait object
	DSM_POLL_SPIN = 3,  // read, sched_yield, read again
	DSM_POLL_BELL = 4,  // the Go side waits for the doorbell (shm)
};

int dsm_poll(dsm_fab *f, dsm_cqe *out, int max, int timeout_ms, int spin, int mode);

// The doorbell (see the package documentation, "Progress"): a non-blocking
// Unix datagram socket bound at path; the Go side waits for it to be
// readable in the runtime's network poller.
int dsm_bell_open(const char *path, dsm_bell *self);
void dsm_bell_close(int fd);
// dsm_bell_pending reports whether a ring waits to be read.
int dsm_bell_pending(int fd);
int dsm_bell_ring(int fd, const dsm_bell *to, char kind);
// dsm_bell_serve drains the doorbell, reads up to max completions (which
// makes the provider progress) and then rings back every endpoint that
// asked; f->bell_reqs is how many requests to be rung back it drained.
int dsm_bell_serve(dsm_fab *f, dsm_cqe *out, int max);
// dsm_cma_probe reports whether this process may access pid's memory with
// process_vm_readv/writev (the shm provider's cross-memory attach).
int dsm_cma_probe(int pid);
void dsm_nap(int mode);
int dsm_wake(dsm_fab *f);

#endif
