//go:build ofi

package ofi

/*
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include "fab.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// Post implements rdma.Transport. See the package documentation for how a
// batch is split into segments and which errors come from where.
func (t *Transport) Post(ctx context.Context, peer ids.NodeID, ops []rdma.Op) error {
	if err := rdma.CheckBatch(ops); err != nil {
		rdma.FailAll(ops, err)
		return err
	}
	p, err := t.lookup(peer)
	if err != nil {
		rdma.FailAll(ops, err)
		return err
	}
	if err := ctx.Err(); err != nil {
		rdma.FailAll(ops, err)
		return err
	}
	gate, err := t.inDoubt(ctx, p)
	if err != nil {
		rdma.FailAll(ops, err) // nothing posted
		return err
	}
	// Learn the descriptors the batch names before taking a slot: a query
	// needs a slot of its own.
	for i := range ops {
		if _, err := t.descOf(ctx, p, ops[i].RKey.Key); err != nil {
			if errors.Is(err, rdma.ErrUnknownKey) {
				break // reported in batch order by segment
			}
			rdma.FailAll(ops, err) // the peer did not answer
			return err
		}
	}
	s, gen, err := t.acquire(ctx, peer)
	if err != nil {
		rdma.FailAll(ops, err)
		return err
	}
	s.gate.Store(gate)
	for i := 0; i < len(ops); {
		j, verr := t.segment(ctx, p, s, ops, i)
		if j > i {
			var abandoned bool
			abandoned, err = t.execSegment(ctx, p, s, gen, ops, i, j)
			if abandoned {
				for k := i; k < len(ops); k++ {
					ops[k].Err = err
				}
				return err
			}
			if err != nil {
				t.release(s)
				return err
			}
		}
		if verr != nil {
			t.release(s)
			ops[j].Err = verr
			rdma.FlushAfter(ops, j)
			return verr
		}
		i = j
	}
	t.release(s)
	return nil
}

// segment describes ops[i:j] in the slot's C memory and returns j: the
// longest run that starts at i, passes the initiator's checks, fits the
// staging arena and has no hazard (an op on a registration that an earlier
// op of the run accesses). The ops of a segment are posted together;
// segments run one after another, which keeps the batch's order on
// providers that do not order RMA. When ops[j] fails the checks,
// the error is returned with j.
func (t *Transport) segment(ctx context.Context, p *peer, s *slot, ops []rdma.Op, i int) (int, error) {
	var bytes uint64
	j := i
	k := 0
	for ; j < len(ops); j++ {
		op := &ops[j]
		d, err := t.descOf(ctx, p, op.RKey.Key)
		if err == nil {
			err = rdma.CheckOp(op.Kind, op.Offset, op.Size(), d.len, d.acc)
		}
		if err != nil {
			return j, err
		}
		size := op.Size()
		if j > i && (bytes+size > arenaMax || hazard(ops[i:j], op)) {
			return j, nil
		}
		if size == 0 {
			continue // an empty READ or WRITE succeeds without a request
		}
		raddr := op.Offset
		if t.virtAddr {
			raddr += d.base
		}
		c := &s.c.ops[k]
		c.raddr = C.uint64_t(raddr)
		c.key = C.uint64_t(d.key)
		c.len = C.uint64_t(size)
		c.loff = C.uint64_t(bytes)
		switch op.Kind {
		case rdma.OpRead:
			c.kind = C.DSM_OP_READ
			bytes += size
		case rdma.OpWrite:
			c.kind = C.DSM_OP_WRITE
			bytes += size
		case rdma.OpCAS:
			c.kind = C.DSM_OP_CAS
			s.c.cmp[k] = C.uint64_t(op.Compare)
			s.c.opnd[k] = C.uint64_t(op.Operand)
		case rdma.OpFAA:
			c.kind = C.DSM_OP_FAA
			s.c.opnd[k] = C.uint64_t(op.Operand)
		}
		s.opIdx[k] = uint16(j)
		k++
	}
	return j, nil
}

// hazard reports whether op must wait for the ops before it.
func hazard(before []rdma.Op, op *rdma.Op) bool {
	for i := range before {
		if before[i].RKey.Key == op.RKey.Key {
			return true
		}
	}
	return false
}

// execSegment posts ops[i:j] (described by segment) with one cgo call,
// waits for them and fills their results. abandoned means the slot was
// handed to the poller and err says why.
func (t *Transport) execSegment(ctx context.Context, p *peer, s *slot, gen uint64, ops []rdma.Op, i, j int) (abandoned bool, err error) {
	// Count the requests and stage the WRITE payloads.
	n := 0
	var bytes int
	for k := i; k < j; k++ {
		if ops[k].Size() != 0 {
			n++
			if ops[k].Kind == rdma.OpRead || ops[k].Kind == rdma.OpWrite {
				bytes += len(ops[k].Buf)
			}
		}
	}
	if n == 0 {
		for k := i; k < j; k++ {
			ops[k].Err = nil
		}
		return false, nil
	}
	t.life.RLock()
	if t.closed {
		t.life.RUnlock()
		rdma.FailAll(ops[i:], rdma.ErrClosed)
		return false, rdma.ErrClosed
	}
	if rc := t.grow(s, bytes); rc != 0 {
		t.life.RUnlock()
		err := fabricErr("grow staging buffer", int(-rc), 0)
		rdma.FailAll(ops[i:], err)
		return false, err
	}
	arena := unsafe.Slice((*byte)(unsafe.Pointer(s.c.arena)), int(s.c.arena_len))
	for k := 0; k < n; k++ {
		if c := &s.c.ops[k]; c.kind == C.DSM_OP_WRITE {
			copy(arena[c.loff:c.loff+c.len], ops[s.opIdx[k]].Buf)
		}
	}
	t.life.RUnlock()

	// start before state: the reaper reads them in the other order.
	s.start.Store(time.Now().UnixNano())
	s.owner.Store(p)
	s.state.Store(slotActive)
	s.pending.Store(int32(n + 1))
	posted := 0
	var postErr error
	var wait time.Duration
	for posted < n {
		t.life.RLock()
		if t.closed {
			t.life.RUnlock()
			postErr = rdma.ErrClosed
			break
		}
		if !p.enter() {
			t.life.RUnlock()
			postErr = &rdma.PeerError{Peer: p.id, Err: fmt.Errorf("%w: endpoint closed", rdma.ErrPeerUnreachable)}
			break
		}
		rc := C.dsm_post(t.c, p.ep, s.c, p.fi, C.int(posted), C.int(n), p.dc, &p.bell)
		p.leave()
		posted += int(s.c.posted)
		t.inflight.Add(int32(s.c.posted))
		t.life.RUnlock()
		if rc == 0 {
			break
		}
		if rc != -C.FI_EAGAIN {
			postErr = t.mapPostErr(p, int(-rc))
			break
		}
		if err := t.backoff(ctx, p, s.start.Load(), &wait); err != nil {
			postErr = err
			break
		}
	}
	if finishPost(s, n, posted) {
		if err := t.await(ctx, s, gen, p.id); err != nil {
			t.inflight.Add(int32(-posted))
			return true, err
		}
	}
	t.inflight.Add(int32(-posted))
	// Every posted request completed; the slot is ours again.
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		rdma.FailAll(ops[i:], rdma.ErrClosed)
		return false, rdma.ErrClosed
	}
	arena = unsafe.Slice((*byte)(unsafe.Pointer(s.c.arena)), int(s.c.arena_len))
	first := -1
	for k := 0; k < n; k++ {
		op := &ops[s.opIdx[k]]
		if k >= posted || s.errs[k] != 0 {
			if first < 0 {
				first = k
			}
			continue
		}
		op.Err = nil
		switch c := &s.c.ops[k]; c.kind {
		case C.DSM_OP_READ:
			copy(op.Buf, arena[c.loff:c.loff+c.len])
		case C.DSM_OP_CAS, C.DSM_OP_FAA:
			op.Result = uint64(s.c.res[k])
		}
	}
	if first < 0 && s.c.ops[0].kind >= C.DSM_OP_CAS {
		// The target ran an atomic of ours: it has read the connection
		// request of our endpoint for it (see closeTx).
		p.txSafe.Store(true)
	}
	// Empty ops of the segment succeeded.
	for k := i; k < j; k++ {
		if ops[k].Size() == 0 {
			ops[k].Err = nil
		}
	}
	t.trim(s)
	if first < 0 {
		return false, nil
	}
	fi := int(s.opIdx[first])
	if first >= posted {
		err = postErr
	} else {
		err = t.classify(ctx, p, &ops[fi], int(s.errs[first]), int(s.prov[first]))
	}
	ops[fi].Err = err
	// The ops after the first failure report ErrFlushed, as on a queue
	// pair; inside a segment they ran concurrently and may have executed.
	rdma.FlushAfter(ops, fi)
	return false, err
}

// Staging arenas grow to the largest segment a slot carried and are kept,
// until all of them together pass arenaBudget: then a slot that grew past
// arenaKeep gives its arena back after use.
const (
	arenaBudget = 64 << 20
	arenaKeep   = 64 << 10
)

// grow makes the slot's arena at least n bytes long. The caller owns the
// slot and holds t.life shared.
func (t *Transport) grow(s *slot, n int) C.int {
	before := int64(s.c.arena_len)
	rc := C.dsm_slot_grow(t.c, s.c, C.size_t(n))
	t.arenaBytes.Add(int64(s.c.arena_len) - before)
	return rc
}

// trim gives a large arena back when the arenas use too much memory. The
// caller owns the slot and holds t.life shared.
func (t *Transport) trim(s *slot) {
	if t.arenaBytes.Load() <= arenaBudget || s.c.arena_len <= arenaKeep {
		return
	}
	before := int64(s.c.arena_len)
	C.dsm_slot_trim(t.c, s.c, arenaKeep)
	t.arenaBytes.Add(int64(s.c.arena_len) - before)
}

func (t *Transport) mapPostErr(p *peer, code int) error {
	return &rdma.PeerError{Peer: p.id, Err: fmt.Errorf("%w: %w", rdma.ErrPeerUnreachable, fabricErr("post", code, 0))}
}

// classify turns an error completion into the rdma sentinel it stands for.
// Providers report remote access violations with a few generic codes, so an
// access error is explained by asking the target for the registration as
// it is now: gone means ErrUnknownKey, else rdma.CheckOp names the
// violation. Transport failures are ErrPeerUnreachable and, as the op was
// posted and the target may have executed it before the failure,
// ErrOutcomeUnknown.
func (t *Transport) classify(ctx context.Context, p *peer, op *rdma.Op, code, prov int) error {
	ferr := fabricErr(fmt.Sprintf("%v completion", op.Kind), code, prov)
	unknown := func(err error) error {
		return &rdma.PeerError{Peer: p.id, Err: fmt.Errorf("%w: %w: %w", rdma.ErrPeerUnreachable, rdma.ErrOutcomeUnknown, err)}
	}
	switch code {
	case C.FI_ECONNREFUSED, C.FI_EHOSTUNREACH, C.FI_ENETUNREACH, C.FI_ETIMEDOUT:
		return unknown(ferr)
	}
	if p.down.Load() {
		return unknown(ferr)
	}
	// tcp;ofi_rxm answers a bad request by dropping the connection
	// (FI_ECANCELED, FI_ENOTCONN at the initiator), so even those codes are
	// worth one short question to the target.
	qctx, cancel := context.WithTimeout(ctx, min(t.timeout, time.Second))
	defer cancel()
	var d remoteDesc
	var err error
	for try := 0; try < 3; try++ {
		// The first question may meet the connection the provider has
		// just dropped; it is re-made on the next use.
		if d, err = t.query(qctx, p, op.RKey.Key); err == nil || qctx.Err() != nil || p.gone.Load() {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		if errors.Is(err, rdma.ErrIncarnation) {
			// Another process listens at the address (a restart the
			// caller has not heard of): the provider refused the key of
			// the process the caller meant, which names nothing there.
			return fmt.Errorf("%w (%v)", err, ferr)
		}
		return unknown(fmt.Errorf("%w (and the registration could not be queried: %v)", ferr, err))
	}
	if d.revoked {
		return fmt.Errorf("%w: %#x (%v)", rdma.ErrUnknownKey, op.RKey.Key, ferr)
	}
	if err := rdma.CheckOp(op.Kind, op.Offset, op.Size(), d.len, d.acc); err != nil {
		return err
	}
	switch code {
	case C.FI_EACCES, C.FI_EPERM:
		return fmt.Errorf("%w: %v", rdma.ErrAccessDenied, ferr)
	case C.FI_EKEYREJECTED, C.FI_ENOKEY:
		return fmt.Errorf("%w: %v", rdma.ErrUnknownKey, ferr)
	case C.FI_EINVAL:
		return fmt.Errorf("%w: %v", rdma.ErrBadRequest, ferr)
	}
	return unknown(ferr)
}

// descOf returns what the initiator knows of a peer's registration, asking
// the peer on first use of a key.
func (t *Transport) descOf(ctx context.Context, p *peer, key uint64) (remoteDesc, error) {
	if p.self {
		t.regMu.Lock()
		r := t.regs[key]
		t.regMu.Unlock()
		if r == nil {
			return remoteDesc{}, fmt.Errorf("%w: %#x", rdma.ErrUnknownKey, key)
		}
		return remoteDesc{len: r.desc.Len, base: r.desc.RKey.Base, acc: r.desc.Access, key: r.desc.RKey.Key}, nil
	}
	p.mu.RLock()
	d, ok := p.descs[key]
	p.mu.RUnlock()
	if !ok {
		var err error
		if d, err = t.query(ctx, p, key); err != nil {
			return d, err
		}
	}
	if d.revoked {
		return d, fmt.Errorf("%w: %#x", rdma.ErrUnknownKey, key)
	}
	return d, nil
}

// query asks the peer for its registration under key and caches the answer.
func (t *Transport) query(ctx context.Context, p *peer, key uint64) (remoteDesc, error) {
	if p.self {
		return t.descOf(ctx, p, key)
	}
	f, err := t.rpc(ctx, p, t.timeout, func(b []byte, id uint64) int { return encodeQuery(b, t.id, id, key) })
	if err != nil {
		return remoteDesc{}, err
	}
	if want := p.want.Load(); want != 0 && f.FromNonce != want {
		// Another process answers at the address: its registration
		// under this key is not the one the caller was told of.
		return remoteDesc{}, &rdma.PeerError{Peer: p.id, Err: fmt.Errorf("%w: incarnation %#x answers, %#x expected", rdma.ErrIncarnation, f.FromNonce, want)}
	}
	d := remoteDesc{len: f.Len, base: f.Base, acc: f.Access, key: f.AccessKey, revoked: !f.Found}
	p.mu.Lock()
	p.descs[key] = d
	p.mu.Unlock()
	return d, nil
}

// rpc sends the control frame that enc writes (given a fresh request id)
// and waits up to wait for the frameReply with that id.
func (t *Transport) rpc(ctx context.Context, p *peer, wait time.Duration, enc func(b []byte, id uint64) int) (frame, error) {
	id := t.nextReq.Add(1)
	ch := make(chan frame, 1)
	t.qmu.Lock()
	t.queries[id] = ch
	t.qmu.Unlock()
	defer func() {
		t.qmu.Lock()
		delete(t.queries, id)
		t.qmu.Unlock()
	}()
	var b [hdrLen + replyLen]byte
	n := enc(b[:], id)
	if err := t.send(ctx, p, b[:n], nil); err != nil {
		return frame{}, err
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case f := <-ch:
		return f, nil
	case <-ctx.Done():
		return frame{}, ctx.Err()
	case <-t.stop:
		return frame{}, rdma.ErrClosed
	case <-p.removed:
		return frame{}, &rdma.PeerError{Peer: p.id, Err: fmt.Errorf("%w: peer removed or replaced", rdma.ErrPeerUnreachable)}
	case <-timer.C:
		return frame{}, &rdma.PeerError{Peer: p.id, Err: fmt.Errorf("%w: no answer to a control request in %v", rdma.ErrPeerUnreachable, wait)}
	}
}

// revokeAll tells every peer that key is gone and waits (briefly, in
// parallel) until each has acknowledged: from then on no peer starts an
// operation on the key. This is what makes Deregister final on providers
// that do not check keys at the target themselves (shm).
func (t *Transport) revokeAll(key uint64) {
	t.peerMu.RLock()
	ps := make([]*peer, 0, len(t.peers))
	for _, p := range t.peers {
		if !p.self && !p.down.Load() {
			ps = append(ps, p)
		}
	}
	t.peerMu.RUnlock()
	wait := min(t.timeout, time.Second)
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			if _, err := t.rpc(ctx, p, wait, func(b []byte, id uint64) int { return encodeRevoke(b, t.id, id, key) }); err != nil {
				t.log.Debug("ofi: revocation not acknowledged", "peer", p.id, "key", key, "err", err)
			}
		}()
	}
	wg.Wait()
}

// registration is memory registered with the provider.
type registration struct {
	t *Transport
	// mr is the registration under its published key, which only this
	// node's own operations name; nil once closed.
	mr    *C.struct_fid_mr
	flags C.uint64_t // the access mr was registered with
	mem   []byte
	pin   runtime.Pinner
	desc  rdma.Descriptor
	dead  bool // under t.regMu
	// grants are the keys of the peers' incarnations (see Fence), under
	// t.regMu.
	grants map[incarnation]grant
}

// Descriptor implements rdma.Registration.
func (r *registration) Descriptor() rdma.Descriptor { return r.desc }

// Bytes implements rdma.Registration.
func (r *registration) Bytes() []byte { return r.mem }

// Deregister implements rdma.Registration: it closes the memory region, so
// that the provider refuses later remote accesses, and tells the peers.
func (r *registration) Deregister() error {
	t := r.t
	// life before regMu, as Register takes them.
	t.life.RLock()
	t.regMu.Lock()
	if r.dead {
		t.regMu.Unlock()
		t.life.RUnlock()
		return errors.New("ofi: registration already deregistered")
	}
	r.dead = true
	delete(t.regs, r.desc.RKey.Key)
	mr := r.mr
	r.mr = nil
	var err error
	if !t.closed {
		closeGrantsLocked(r)
		if mr != nil {
			if rc := C.dsm_mr_close(mr); rc != 0 {
				err = fabricErr("fi_close(mr)", int(-rc), 0)
			}
		}
	}
	t.regMu.Unlock()
	t.life.RUnlock()
	t.regMu.Lock()
	r.pin.Unpin()
	t.regMu.Unlock()
	if !t.closing.Load() {
		t.revokeAll(r.desc.RKey.Key)
	}
	return err
}

// Register implements rdma.Transport. mem should come from rdma.Alloc; Go
// memory is pinned for the life of the registration.
func (t *Transport) Register(mem []byte, access rdma.Access) (rdma.Registration, error) {
	if len(mem) == 0 {
		return nil, errors.New("ofi: register of empty memory")
	}
	if access&^rdma.AccessAll != 0 {
		return nil, fmt.Errorf("ofi: unknown access bits %#x", uint8(access))
	}
	var flags C.uint64_t
	if access&(rdma.AccessRemoteRead|rdma.AccessRemoteAtomic) != 0 {
		flags |= C.FI_REMOTE_READ
	}
	if access&(rdma.AccessRemoteWrite|rdma.AccessRemoteAtomic) != 0 {
		flags |= C.FI_REMOTE_WRITE
	}
	if flags == 0 {
		flags = C.FI_READ | C.FI_WRITE
	}
	r := &registration{t: t, mem: mem, flags: flags}
	r.pin.Pin(&mem[0])
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed || t.closing.Load() {
		r.pin.Unpin()
		return nil, rdma.ErrClosed
	}
	// Keys are never reused: an operation that names a revoked key fails
	// instead of reaching newer memory. Providers with FI_MR_PROV_KEY pick
	// their own.
	req := t.nextKey.Add(1)
	var key C.uint64_t
	rc := C.dsm_mr_reg(t.c, unsafe.Pointer(&mem[0]), C.size_t(len(mem)), flags, C.uint64_t(req), &r.mr, &key)
	if rc != 0 {
		r.pin.Unpin()
		return nil, fmt.Errorf("ofi: register %d bytes: %w", len(mem), fabricErr("fi_mr_reg", int(-rc), 0))
	}
	r.desc = rdma.Descriptor{Node: t.id, RKey: rdma.RKey{Key: uint64(key)}, Len: uint64(len(mem)), Access: access}
	if t.virtAddr {
		r.desc.RKey.Base = uint64(uintptr(unsafe.Pointer(&mem[0])))
	}
	t.regMu.Lock()
	t.regs[uint64(key)] = r
	t.regMu.Unlock()
	return r, nil
}
