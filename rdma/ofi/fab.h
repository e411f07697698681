// The C half of the ofi backend: a thin layer over libfabric that the Go
// side drives with one cgo call per batch, per poll and per control step.
// Every buffer these functions touch is C memory owned by the Go side's
// pools; nothing here retains a Go pointer.

#ifndef DSM_OFI_FAB_H
#define DSM_OFI_FAB_H

#include <stdint.h>
#include <stddef.h>
#include <rdma/fabric.h>

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

int dsm_mr_reg(dsm_fab *f, void *buf, size_t len, uint64_t access, uint64_t req_key,
	struct fid_mr **mr, uint64_t *key);
int dsm_mr_close(struct fid_mr *mr);

dsm_slot *dsm_slot_new(dsm_fab *f, uint32_t id);
void dsm_slot_free(dsm_slot *s);
int dsm_slot_grow(dsm_fab *f, dsm_slot *s, size_t n);
int dsm_slot_trim(dsm_fab *f, dsm_slot *s, size_t keep);

int dsm_post(dsm_fab *f, dsm_slot *s, fi_addr_t dest, int from, int to);
int dsm_send(dsm_fab *f, dsm_slot *s, fi_addr_t dest, size_t len);
int dsm_repost_recv(dsm_fab *f, uint32_t idx);
// How dsm_poll waits when no completion is ready.
enum {
	DSM_POLL_SLEEP = 1, // read, sleep 20 us, read again
	DSM_POLL_BLOCK = 2, // fi_cq_sread on the CQ's wait object
	DSM_POLL_SPIN = 3,  // read, sched_yield, read again
};

int dsm_poll(dsm_fab *f, dsm_cqe *out, int max, int timeout_ms, int spin, int mode);
void dsm_nap(int mode);
int dsm_wake(dsm_fab *f);

#endif
