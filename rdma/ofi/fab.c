//go:build ofi
#define _GNU_SOURCE

#include "fab.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#define LOCAL_KEY_BIT (1ULL << 62)

static int fail(char *err, size_t errlen, const char *what, int ret) {
	snprintf(err, errlen, "%s: %s (%d)", what, fi_strerror(ret < 0 ? -ret : ret), ret);
	return ret < 0 ? ret : -ret;
}

static int local_mr(dsm_fab *f, void *buf, size_t len, struct fid_mr **mr, void **desc) {
	*mr = NULL;
	*desc = NULL;
	if (!(f->mr_mode & FI_MR_LOCAL))
		return 0;
	uint64_t key = 0;
	return dsm_mr_reg(f, buf, len, FI_READ | FI_WRITE | FI_SEND | FI_RECV,
		LOCAL_KEY_BIT | f->next_local_key++, mr, &key) ?: (*desc = fi_mr_desc(*mr), 0);
}

int dsm_open(const char *prov, const char *node, const char *service, const char *src_str,
	int nrecv, size_t recv_size, dsm_fab **out, char *err, size_t errlen) {
	int ret;
	struct fi_info *hints = fi_allocinfo();
	if (!hints)
		return fail(err, errlen, "fi_allocinfo", -FI_ENOMEM);
	dsm_fab *f = calloc(1, sizeof(*f));
	if (!f) {
		fi_freeinfo(hints);
		return fail(err, errlen, "calloc", -FI_ENOMEM);
	}
	f->next_local_key = 1;
	f->bell_fd = -1;
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG | FI_RMA | FI_ATOMIC;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
		FI_MR_PROV_KEY | FI_MR_ENDPOINT;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	hints->tx_attr->msg_order = FI_ORDER_SAS;
	hints->rx_attr->msg_order = FI_ORDER_SAS;
	if (prov && prov[0])
		hints->fabric_attr->prov_name = strdup(prov);
	uint64_t flags = 0;
	if (src_str && src_str[0]) {
		hints->addr_format = FI_ADDR_STR;
		hints->src_addr = strdup(src_str);
		hints->src_addrlen = strlen(src_str) + 1;
	} else if (node || service) {
		flags = FI_SOURCE;
	}
	ret = fi_getinfo(FI_VERSION(1, 17), node, service, flags, hints, &f->info);
	fi_freeinfo(hints);
	if (ret) {
		free(f);
		return fail(err, errlen, "fi_getinfo", ret);
	}
	f->mr_mode = f->info->domain_attr->mr_mode;
	f->auto_progress = f->info->domain_attr->data_progress == FI_PROGRESS_AUTO;
	f->inject_size = f->info->tx_attr->inject_size;

	if ((ret = fi_fabric(f->info->fabric_attr, &f->fabric, NULL))) {
		dsm_close(f);
		return fail(err, errlen, "fi_fabric", ret);
	}
	if ((ret = fi_domain(f->fabric, f->info, &f->domain, NULL))) {
		dsm_close(f);
		return fail(err, errlen, "fi_domain", ret);
	}
	struct fi_atomic_attr aattr;
	if ((ret = fi_query_atomic(f->domain, FI_UINT64, FI_CSWAP, &aattr, FI_COMPARE_ATOMIC))) {
		dsm_close(f);
		return fail(err, errlen, "fi_query_atomic(FI_UINT64, FI_CSWAP)", ret);
	}
	if ((ret = fi_query_atomic(f->domain, FI_UINT64, FI_SUM, &aattr, FI_FETCH_ATOMIC))) {
		dsm_close(f);
		return fail(err, errlen, "fi_query_atomic(FI_UINT64, FI_SUM)", ret);
	}
	struct fi_cq_attr cq_attr = {0};
	cq_attr.format = FI_CQ_FORMAT_MSG;
	cq_attr.size = 4096;
	cq_attr.wait_obj = FI_WAIT_UNSPEC;
	ret = fi_cq_open(f->domain, &cq_attr, &f->cq, NULL);
	if (ret == 0) {
		f->waitable = 1;
	} else {
		cq_attr.wait_obj = FI_WAIT_NONE;
		if ((ret = fi_cq_open(f->domain, &cq_attr, &f->cq, NULL))) {
			dsm_close(f);
			return fail(err, errlen, "fi_cq_open", ret);
		}
	}
	struct fi_av_attr av_attr = {0};
	av_attr.type = FI_AV_UNSPEC;
	if ((ret = fi_av_open(f->domain, &av_attr, &f->av, NULL))) {
		dsm_close(f);
		return fail(err, errlen, "fi_av_open", ret);
	}
	if ((ret = fi_endpoint(f->domain, f->info, &f->ep, NULL))) {
		dsm_close(f);
		return fail(err, errlen, "fi_endpoint", ret);
	}
	if ((ret = fi_ep_bind(f->ep, &f->av->fid, 0))) {
		dsm_close(f);
		return fail(err, errlen, "fi_ep_bind(av)", ret);
	}
	if ((ret = fi_ep_bind(f->ep, &f->cq->fid, FI_TRANSMIT | FI_RECV))) {
		dsm_close(f);
		return fail(err, errlen, "fi_ep_bind(cq)", ret);
	}
	if ((ret = fi_enable(f->ep))) {
		dsm_close(f);
		return fail(err, errlen, "fi_enable", ret);
	}
	f->namelen = sizeof(f->name);
	if ((ret = fi_getname(&f->ep->fid, f->name, &f->namelen))) {
		dsm_close(f);
		return fail(err, errlen, "fi_getname", ret);
	}
	f->nrecv = nrecv;
	f->recv_size = recv_size;
	f->recv_bufs = calloc((size_t)nrecv, recv_size);
	f->recv_ctx = calloc((size_t)nrecv, sizeof(dsm_ctx));
	if (!f->recv_bufs || !f->recv_ctx) {
		dsm_close(f);
		return fail(err, errlen, "calloc", -FI_ENOMEM);
	}
	if ((ret = local_mr(f, f->recv_bufs, (size_t)nrecv * recv_size, &f->recv_mr, &f->recv_desc))) {
		dsm_close(f);
		return fail(err, errlen, "fi_mr_reg(receive buffers)", ret);
	}
	for (int i = 0; i < nrecv; i++) {
		f->recv_ctx[i].slot = DSM_RECV_TAG;
		f->recv_ctx[i].idx = (uint32_t)i;
		if ((ret = dsm_repost_recv(f, (uint32_t)i))) {
			dsm_close(f);
			return fail(err, errlen, "fi_recv", ret);
		}
	}
	*out = f;
	return 0;
}

const char *dsm_prov_name(dsm_fab *f) { return f->info->fabric_attr->prov_name; }

void dsm_close_ep(dsm_fab *f) {
	if (f->ep) {
		fi_close(&f->ep->fid);
		f->ep = NULL;
	}
}

void dsm_close(dsm_fab *f) {
	dsm_close_ep(f);
	if (f->recv_mr)
		fi_close(&f->recv_mr->fid);
	if (f->av)
		fi_close(&f->av->fid);
	if (f->cq)
		fi_close(&f->cq->fid);
	if (f->domain)
		fi_close(&f->domain->fid);
	if (f->fabric)
		fi_close(&f->fabric->fid);
	if (f->info)
		fi_freeinfo(f->info);
	free(f->recv_bufs);
	free(f->recv_ctx);
	free(f);
}

int dsm_av_insert(dsm_fab *f, const void *name, fi_addr_t *out) {
	int n = fi_av_insert(f->av, name, 1, out, 0, NULL);
	if (n == 1)
		return 0;
	return n < 0 ? n : -FI_EINVAL;
}

int dsm_av_remove(dsm_fab *f, fi_addr_t a) { return fi_av_remove(f->av, &a, 1, 0); }

// libfabric reads FI_AV_REMOVE_CLEANUP once, when it initializes (the
// first fi_getinfo); only with it does ofi_rxm close the connection to an
// address removed from the address vector, which dsm_drop_conn needs. Set
// here, before any code runs, unless the environment says otherwise.
__attribute__((constructor)) static void dsm_av_cleanup_default(void) {
	setenv("FI_AV_REMOVE_CLEANUP", "1", 0);
}

int dsm_drop_conn(dsm_fab *f, const void *name) {
	// Inserting an address already in the vector returns its entry and
	// counts one more use, so the remove that follows closes the
	// connection (the provider's remove handler runs on every remove)
	// and leaves the entry, and the fi_addr_t peers hold, as it was.
	fi_addr_t a;
	int n = fi_av_insert(f->av, name, 1, &a, 0, NULL);
	if (n != 1)
		return n < 0 ? n : -FI_EINVAL;
	return fi_av_remove(f->av, &a, 1, 0);
}

int dsm_mr_reg(dsm_fab *f, void *buf, size_t len, uint64_t access, uint64_t req_key,
	struct fid_mr **mr, uint64_t *key) {
	int ret = fi_mr_reg(f->domain, buf, len, access, 0, req_key, 0, mr, NULL);
	if (ret)
		return ret;
	if (f->mr_mode & FI_MR_ENDPOINT) {
		if ((ret = fi_mr_bind(*mr, &f->ep->fid, 0)) || (ret = fi_mr_enable(*mr))) {
			fi_close(&(*mr)->fid);
			*mr = NULL;
			return ret;
		}
	}
	*key = fi_mr_key(*mr);
	return 0;
}

int dsm_tx_open(dsm_fab *f, const char *name, const void *peer, struct fid_ep **ep,
	struct fid_av **av, fi_addr_t *dest) {
	int ret;
	*ep = NULL;
	*av = NULL;
	struct fi_info *info = fi_dupinfo(f->info);
	if (!info)
		return -FI_ENOMEM;
	free(info->src_addr);
	info->src_addr = strdup(name);
	info->src_addrlen = strlen(name) + 1;
	struct fi_av_attr av_attr = {0};
	av_attr.type = FI_AV_UNSPEC;
	if ((ret = fi_av_open(f->domain, &av_attr, av, NULL)))
		goto fail;
	if ((ret = fi_endpoint(f->domain, info, ep, NULL)))
		goto fail;
	if ((ret = fi_ep_bind(*ep, &(*av)->fid, 0)) ||
	    (ret = fi_ep_bind(*ep, &f->cq->fid, FI_TRANSMIT | FI_RECV)) ||
	    (ret = fi_enable(*ep)))
		goto fail;
	int n = fi_av_insert(*av, peer, 1, dest, 0, NULL);
	if (n != 1) {
		ret = n < 0 ? n : -FI_EINVAL;
		goto fail;
	}
	fi_freeinfo(info);
	return 0;
fail:
	dsm_tx_close(*ep, *av);
	*ep = NULL;
	*av = NULL;
	fi_freeinfo(info);
	return ret;
}

void dsm_tx_close(struct fid_ep *ep, struct fid_av *av) {
	if (ep)
		fi_close(&ep->fid);
	if (av)
		fi_close(&av->fid);
}

int dsm_mr_close(struct fid_mr *mr) { return fi_close(&mr->fid); }

dsm_slot *dsm_slot_new(dsm_fab *f, uint32_t id) {
	dsm_slot *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	for (int i = 0; i < DSM_MAX_BATCH; i++) {
		s->ctx[i].slot = id;
		s->ctx[i].idx = (uint32_t)i;
	}
	if (local_mr(f, s->cmp, sizeof(s->cmp) + sizeof(s->opnd) + sizeof(s->res), &s->words_mr,
		&s->words_desc)) {
		free(s);
		return NULL;
	}
	return s;
}

void dsm_slot_free(dsm_slot *s) {
	if (s->words_mr)
		fi_close(&s->words_mr->fid);
	if (s->arena_mr)
		fi_close(&s->arena_mr->fid);
	free(s->arena);
	free(s);
}

// dsm_slot_grow makes the arena at least n bytes long. The slot must be idle.
int dsm_slot_grow(dsm_fab *f, dsm_slot *s, size_t n) {
	if (s->arena_len >= n)
		return 0;
	size_t len = s->arena_len ? s->arena_len : 4096;
	while (len < n)
		len *= 2;
	char *a = malloc(len);
	if (!a)
		return -FI_ENOMEM;
	struct fid_mr *mr = NULL;
	void *desc = NULL;
	int ret = local_mr(f, a, len, &mr, &desc);
	if (ret) {
		free(a);
		return ret;
	}
	if (s->arena_mr)
		fi_close(&s->arena_mr->fid);
	free(s->arena);
	s->arena = a;
	s->arena_len = len;
	s->arena_mr = mr;
	s->arena_desc = desc;
	return 0;
}

// dsm_slot_trim gives a large arena back and replaces it with a small one.
// The slot must be idle.
int dsm_slot_trim(dsm_fab *f, dsm_slot *s, size_t keep) {
	if (s->arena_len <= keep)
		return 0;
	if (s->arena_mr)
		fi_close(&s->arena_mr->fid);
	free(s->arena);
	s->arena = NULL;
	s->arena_len = 0;
	s->arena_mr = NULL;
	s->arena_desc = NULL;
	return dsm_slot_grow(f, s, keep);
}

static int post_one(struct fid_ep *ep, dsm_slot *s, fi_addr_t dest, int i, int dc) {
	dsm_op *op = &s->ops[i];
	void *ctx = &s->ctx[i];
	switch (op->kind) {
	case DSM_OP_READ:
	case DSM_OP_WRITE: {
		struct iovec iov = {.iov_base = s->arena + op->loff, .iov_len = op->len};
		void *desc = s->arena_desc;
		struct fi_rma_iov rma = {.addr = op->raddr, .len = op->len, .key = op->key};
		struct fi_msg_rma m = {
			.msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = dest,
			.rma_iov = &rma, .rma_iov_count = 1, .context = ctx,
		};
		if (op->kind == DSM_OP_READ)
			return (int)fi_readmsg(ep, &m, FI_COMPLETION);
		return (int)fi_writemsg(ep, &m, FI_COMPLETION | (dc ? FI_DELIVERY_COMPLETE : 0));
	}
	case DSM_OP_CAS:
	case DSM_OP_FAA: {
		struct fi_ioc ioc = {.addr = &s->opnd[i], .count = 1};
		struct fi_ioc res = {.addr = &s->res[i], .count = 1};
		struct fi_rma_ioc rioc = {.addr = op->raddr, .count = 1, .key = op->key};
		void *desc = s->words_desc;
		struct fi_msg_atomic m = {
			.msg_iov = &ioc, .desc = &desc, .iov_count = 1, .addr = dest,
			.rma_iov = &rioc, .rma_iov_count = 1, .datatype = FI_UINT64,
			.op = op->kind == DSM_OP_CAS ? FI_CSWAP : FI_SUM, .context = ctx,
		};
		if (op->kind == DSM_OP_CAS) {
			struct fi_ioc cmp = {.addr = &s->cmp[i], .count = 1};
			return (int)fi_compare_atomicmsg(ep, &m, &cmp, &desc, 1, &res, &desc, 1,
				FI_COMPLETION);
		}
		return (int)fi_fetch_atomicmsg(ep, &m, &res, &desc, 1, FI_COMPLETION);
	}
	}
	return -FI_EINVAL;
}

// Doorbell kinds: a request that asks to be rung back once the target has
// made progress, and that answer.
#define BELL_REQ 'R'
#define BELL_ANS 'A'

int dsm_post(dsm_fab *f, struct fid_ep *ep, dsm_slot *s, fi_addr_t dest, int from, int to,
	int dc, const dsm_bell *bell) {
	int i, ret = 0, ring = 0;
	for (i = from; i < to; i++) {
		ret = post_one(ep, s, dest, i, dc);
		if (ret)
			break;
		// A READ, and a WRITE without delivery-complete on shm, are done
		// by cross-memory attach before they complete and leave the target
		// only a notice to read whenever it next makes progress.
		ring |= s->ops[i].kind != DSM_OP_READ && (dc || s->ops[i].kind != DSM_OP_WRITE);
	}
	s->posted = i - from;
	if (bell->len && (ring || ret == -FI_EAGAIN))
		dsm_bell_ring(f->bell_fd, bell, BELL_REQ);
	return ret;
}

int dsm_send(dsm_fab *f, struct fid_ep *ep, dsm_slot *s, fi_addr_t dest, size_t len,
	const dsm_bell *bell) {
	int ret = (int)fi_send(ep, s->arena, len, s->arena_desc, dest, &s->ctx[0]);
	if (bell->len && (ret == 0 || ret == -FI_EAGAIN))
		dsm_bell_ring(f->bell_fd, bell, BELL_REQ);
	return ret;
}

int dsm_bell_open(const char *path, dsm_bell *self) {
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(sun.sun_path))
		return -ENAMETOOLONG;
	strcpy(sun.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	unlink(path);
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path) + 1);
	if (bind(fd, (struct sockaddr *)&sun, len)) {
		int e = errno;
		close(fd);
		return -e;
	}
	memset(self, 0, sizeof(*self));
	memcpy(self->addr, &sun, len);
	self->len = (int)len;
	return fd;
}

void dsm_bell_close(int fd) { close(fd); }

int dsm_bell_pending(int fd) {
	char b;
	return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) >= 0;
}

// dsm_bell_ring sends one byte to a doorbell without waiting: a full queue
// means the target has rings to read already, a gone socket a gone target.
int dsm_bell_ring(int fd, const dsm_bell *to, char kind) {
	if (fd < 0 || !to->len)
		return 0;
	ssize_t n = sendto(fd, &kind, 1, MSG_DONTWAIT | MSG_NOSIGNAL,
		(const struct sockaddr *)to->addr, (socklen_t)to->len);
	return n == 1 ? 0 : -errno;
}

#define BELL_BACK_MAX 16

int dsm_bell_serve(dsm_fab *f, dsm_cqe *out, int max) {
	int *rings = &f->bell_reqs;
	dsm_bell back[BELL_BACK_MAX];
	int nback = 0;
	*rings = 0;
	for (;;) {
		char kind;
		struct sockaddr_un from;
		socklen_t len = sizeof(from);
		ssize_t n = recvfrom(f->bell_fd, &kind, 1, MSG_DONTWAIT, (struct sockaddr *)&from, &len);
		if (n < 0)
			break;
		if (n == 1 && kind == BELL_REQ)
			(*rings)++;
		if (n != 1 || kind != BELL_REQ || len <= offsetof(struct sockaddr_un, sun_path))
			continue;
		int dup = 0;
		for (int i = 0; i < nback && !dup; i++)
			dup = back[i].len == (int)len && !memcmp(back[i].addr, &from, len);
		if (!dup && nback < BELL_BACK_MAX) {
			back[nback].len = (int)len;
			memcpy(back[nback].addr, &from, len);
			nback++;
		}
	}
	// Reading the queue makes the provider progress: the requests that
	// were posted before their rings are served now.
	int n = dsm_poll(f, out, max, 0, 0, DSM_POLL_SLEEP);
	for (int i = 0; i < nback; i++)
		dsm_bell_ring(f->bell_fd, &back[i], BELL_ANS);
	return n;
}

int dsm_cma_probe(int pid) {
	char b;
	struct iovec local = {.iov_base = &b, .iov_len = 1};
	// An address nobody maps: allowed access fails with EFAULT, a refused
	// one with EPERM.
	struct iovec remote = {.iov_base = (void *)8, .iov_len = 1};
	if (process_vm_readv(pid, &local, 1, &remote, 1, 0) >= 0)
		return 1;
	return errno == EFAULT;
}

int dsm_repost_recv(dsm_fab *f, uint32_t idx) {
	for (;;) {
		int ret = (int)fi_recv(f->ep, f->recv_bufs + (size_t)idx * f->recv_size, f->recv_size,
			f->recv_desc, FI_ADDR_UNSPEC, &f->recv_ctx[idx]);
		if (ret != -FI_EAGAIN)
			return ret;
		// The receive queue is full only while completions wait to be read;
		// the caller is the poller, so yield and try again.
		struct timespec ts = {0, 1000};
		nanosleep(&ts, NULL);
	}
}

static long now_us(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

static void fill(dsm_cqe *out, void *ctx, size_t len, int err, int prov_err) {
	dsm_ctx *c = ctx;
	out->slot = c ? c->slot : DSM_RECV_TAG - 1;
	out->idx = c ? c->idx : 0;
	out->len = len;
	out->err = err;
	out->prov_err = prov_err;
}

// dsm_poll reads up to max completions. When none is ready it retries spin
// times, then waits up to timeout_ms: in fi_cq_sread where the CQ has a wait
// object, else in short sleeps between reads (which also drive the progress
// of providers that need the target to poll).
int dsm_poll(dsm_fab *f, dsm_cqe *out, int max, int timeout_ms, int spin, int mode) {
	struct fi_cq_msg_entry ent[64];
	if (max > 64)
		max = 64;
	ssize_t n = fi_cq_read(f->cq, ent, (size_t)max);
	for (int i = 0; n == -FI_EAGAIN && i < spin; i++)
		n = fi_cq_read(f->cq, ent, (size_t)max);
	if (n == -FI_EAGAIN && timeout_ms > 0) {
		long deadline = now_us() + timeout_ms * 1000L;
		switch (mode) {
		case DSM_POLL_BLOCK:
			n = fi_cq_sread(f->cq, ent, (size_t)max, NULL, timeout_ms);
			break;
		case DSM_POLL_SPIN:
			while (n == -FI_EAGAIN && now_us() < deadline) {
				sched_yield();
				n = fi_cq_read(f->cq, ent, (size_t)max);
			}
			break;
		default: {
			prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
			struct timespec ts = {0, 20000};
			while (n == -FI_EAGAIN && now_us() < deadline) {
				nanosleep(&ts, NULL);
				n = fi_cq_read(f->cq, ent, (size_t)max);
			}
		}
		}
	}
	if (n > 0) {
		for (ssize_t i = 0; i < n; i++)
			fill(&out[i], ent[i].op_context, ent[i].len, 0, 0);
		return (int)n;
	}
	if (n == -FI_EAVAIL) {
		struct fi_cq_err_entry e = {0};
		ssize_t r = fi_cq_readerr(f->cq, &e, 0);
		if (r == 1 || r == 0) {
			fill(&out[0], e.op_context, e.len, e.err ? e.err : FI_EOTHER, e.prov_errno);
			return 1;
		}
		return (int)r;
	}
	if (n == -FI_EAGAIN || n == -FI_ETIMEDOUT || n == -FI_EINTR)
		return 0;
	return (int)n;
}

void dsm_nap(int mode) {
	if (mode == DSM_POLL_SPIN) {
		sched_yield();
		return;
	}
	static __thread int slack_set;
	if (!slack_set) {
		prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
		slack_set = 1;
	}
	struct timespec ts = {0, 20000};
	nanosleep(&ts, NULL);
}

int dsm_wake(dsm_fab *f) {
	if (f->waitable)
		return fi_cq_signal(f->cq);
	return 0;
}
