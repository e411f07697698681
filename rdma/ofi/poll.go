//go:build ofi

package ofi

/*
#include "fab.h"
*/
import "C"

import (
	"context"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// progress is the poller: it reads the completion queue (which also drives
// the providers that make progress only when polled, at the initiator and
// at the target), completes slots, receives frames, and fails slots whose
// completions are overdue.
func (t *Transport) progress() {
	defer t.wg.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	lastReap := time.Now()
	var busyUntil time.Time
	block := t.pollMode == C.DSM_POLL_BLOCK
	for {
		select {
		case <-t.stop:
			return
		default:
		}
		// After a completion, keep reading without a pause for a while
		// (not in blocking mode: a provider's read is a system call there,
		// and the wait object wakes the poller promptly anyway).
		spin := 0
		if !block && time.Now().Before(busyUntil) {
			spin = 200
		}
		// In blocking mode the poller waits inside fi_cq_sread; otherwise
		// it reads without waiting and naps between reads.
		timeout := 0
		if block {
			// 10 ms while requests are in flight (the reaper's period
			// needs it), 100 ms idle: fewer wake-ups of an idle endpoint.
			timeout = 100
			if t.inflight.Load() > 0 {
				timeout = 10
			}
		}
		t.pollMu.Lock()
		n := t.pollLocked(timeout, spin)
		t.pollMu.Unlock()
		if n < 0 {
			t.log.Warn("ofi: completion queue", "err", fabricErr("fi_cq_read", -n, 0))
			time.Sleep(time.Millisecond)
			continue
		}
		now := time.Now()
		if n > 0 {
			busyUntil = now.Add(200 * time.Microsecond)
		} else if !block {
			C.dsm_nap(t.pollMode)
		}
		if now.Sub(lastReap) > 50*time.Millisecond {
			lastReap = now
			t.reap(now)
			t.checkPeers()
		}
	}
}

// Doorbell poller timings (see the package documentation, "Progress").
const (
	// bellIdle is the longest wait for the doorbell with nothing in
	// flight, bellBusy with requests in flight: the fallback for a ring
	// that was dropped (a full socket queue) or never sent (an endpoint
	// that is not of this package).
	bellIdle = 100 * time.Millisecond
	bellBusy = time.Millisecond
)

// progressBell is the poller of a PollDoorbell endpoint: it waits for the
// doorbell in the runtime's network poller (holding no OS thread), then
// drains it, reads the queue (which serves the requests of the peers that
// rang) and rings back those that asked.
func (t *Transport) progressBell() {
	defer t.wg.Done()
	lastReap := time.Now()
	waited := false
	// wait is called by the runtime first after it cleared the socket's
	// readiness, then after each wake-up: a ring that arrived between the
	// last drain and the clearing is found by the peek.
	wait := func(fd uintptr) bool {
		if waited || C.dsm_bell_pending(C.int(fd)) != 0 {
			return true
		}
		waited = true
		return false
	}
	for {
		select {
		case <-t.stop:
			return
		default:
		}
		t.pollMu.Lock()
		n := int(C.dsm_bell_serve(t.c, t.cqe, C.int(t.cqeN)))
		rings := t.c.bell_reqs
		entries := unsafe.Slice(t.cqe, t.cqeN)
		for i := 0; i < n; i++ {
			t.complete(&entries[i])
		}
		t.pollMu.Unlock()
		if n < 0 {
			t.log.Warn("ofi: completion queue", "err", fabricErr("fi_cq_read", -n, 0))
			time.Sleep(time.Millisecond)
			continue
		}
		now := time.Now()
		if now.Sub(lastReap) > 50*time.Millisecond {
			lastReap = now
			t.reap(now)
			t.checkPeers()
		}
		if rings > 0 {
			// Served peers' requests: look once more before waiting,
			// for the provider's own retries (a command it could not
			// finish yet) and a request posted meanwhile.
			continue
		}
		d := bellIdle
		if t.inflight.Load() > 0 {
			d = bellBusy
		}
		t.bell.SetReadDeadline(now.Add(d))
		waited = false
		t.bellRaw.Read(wait) // returns when rung, or with the deadline
	}
}

// pollLocked reads and completes what the completion queue holds; the
// caller holds pollMu, which keeps completions (and so received frames) in
// queue order.
func (t *Transport) pollLocked(timeout, spin int) int {
	n := int(C.dsm_poll(t.c, t.cqe, C.int(t.cqeN), C.int(timeout), C.int(spin), t.pollMode))
	entries := unsafe.Slice(t.cqe, t.cqeN)
	for i := 0; i < n; i++ {
		t.complete(&entries[i])
	}
	return n
}

// callerPolls is how many times a caller that waits for its completions
// reads the queue itself before it parks (see the package documentation).
const callerPolls = 16

// callerSpin bounds how long a caller reads the queue itself before it
// parks: about the round trip of an atomic on shm (the target's wake-up
// included), so that the caller usually finds its own completion instead
// of being woken for it.
const callerSpin = 100 * time.Microsecond

// pollOnce reads the queue from a caller's goroutine if nobody else does.
func (t *Transport) pollOnce() bool {
	if !t.pollMu.TryLock() {
		return false
	}
	defer t.pollMu.Unlock()
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return false
	}
	t.pollLocked(0, 0)
	return true
}

// reap fails the slots whose completions are overdue.
func (t *Transport) reap(now time.Time) {
	limit := now.Add(-t.timeout).UnixNano()
	for _, s := range t.slots {
		gen := s.gen.Load()
		if s.state.Load() == slotActive && s.start.Load() < limit {
			t.kickSlot(s, gen, kickTimeout)
		}
	}
}

func (t *Transport) complete(e *C.dsm_cqe) {
	if uint32(e.slot) == C.DSM_RECV_TAG {
		t.receive(e)
		return
	}
	if int(e.slot) >= len(t.slots) || int(e.idx) >= C.DSM_MAX_BATCH {
		t.log.Warn("ofi: completion without a known context", "err", int(e.err))
		return
	}
	s := t.slots[e.slot]
	s.errs[e.idx] = int32(e.err)
	s.prov[e.idx] = int32(e.prov_err)
	if s.pending.Add(-1) != 0 {
		return
	}
	if s.state.CompareAndSwap(slotActive, slotDone) {
		s.done <- struct{}{}
		return
	}
	if s.state.Load() == slotAbandoned {
		t.release(s)
	}
}

// receive handles a completed receive buffer and posts it again.
func (t *Transport) receive(e *C.dsm_cqe) {
	idx := int(e.idx)
	if e.err != 0 {
		if !t.closing.Load() {
			t.log.Debug("ofi: receive failed", "err", fabricErr("recv completion", int(e.err), int(e.prov_err)))
			C.dsm_repost_recv(t.c, C.uint32_t(idx))
		}
		return
	}
	n := int(e.len)
	if n > t.recvSize {
		n = t.recvSize
	}
	buf := unsafe.Slice((*byte)(unsafe.Pointer(uintptr(unsafe.Pointer(t.c.recv_bufs))+uintptr(idx*t.recvSize))), n)
	var f frame
	if err := decodeFrame(buf, &f); err != nil {
		t.log.Debug("ofi: dropped frame", "err", err)
	} else {
		t.handleFrame(&f)
	}
	rc := C.dsm_repost_recv(t.c, C.uint32_t(idx))
	if rc != 0 && !t.closing.Load() {
		t.log.Warn("ofi: repost receive", "err", fabricErr("fi_recv", int(-rc), 0))
	}
}

func (t *Transport) handleFrame(f *frame) {
	t.peerMu.RLock()
	p := t.peers[f.From]
	t.peerMu.RUnlock()
	if p != nil && !p.self && f.FromNonce != 0 {
		if old := p.seen.Swap(f.FromNonce); old != 0 && old != f.FromNonce {
			// The peer's process restarted at the same address: what
			// it registered is gone, and what was posted to the old
			// one will never complete.
			t.log.Debug("ofi: peer restarted", "peer", f.From, "old", old, "new", f.FromNonce)
			p.mu.Lock()
			clear(p.descs)
			p.mu.Unlock()
			t.kickPeer(f.From, kickPeerGone)
		}
	}
	if f.ToNonce != 0 && f.ToNonce != t.nonce {
		// Meant for an earlier process of this node.
		t.log.Debug("ofi: dropped a frame meant for another incarnation", "from", f.From, "kind", f.Kind, "to", f.ToNonce)
		return
	}
	if p != nil && f.Kind != frameBye && p.down.Load() {
		p.down.Store(false)
	}
	switch f.Kind {
	case frameUser:
		h := t.handler.Load()
		if h == nil {
			return
		}
		msg := make([]byte, len(f.Payload))
		copy(msg, f.Payload)
		t.inbox.push(inMsg{from: f.From, msg: msg, h: *h})
	case frameQuery:
		select {
		case t.ctl <- ctlReq{f: *f}:
		default:
			t.log.Debug("ofi: control queue full, dropped query", "from", f.From)
		}
	case frameReply:
		if p != nil {
			p.txSafe.Store(true) // it read our request, so tx's first
		}
		t.qmu.Lock()
		ch := t.queries[f.ReqID]
		t.qmu.Unlock()
		if ch != nil {
			select {
			case ch <- *f:
			default:
			}
		}
	case frameRevoke:
		if p == nil {
			return
		}
		p.mu.Lock()
		p.descs[f.Key] = remoteDesc{revoked: true}
		p.mu.Unlock()
		select {
		case t.ctl <- ctlReq{f: *f, ack: true}:
		default:
			t.log.Debug("ofi: control queue full, dropped revoke acknowledgement", "from", f.From)
		}
	case frameBye:
		if p == nil || p.self {
			return
		}
		p.down.Store(true)
		t.kickPeer(f.From, kickPeerGone)
		select {
		case t.ctl <- ctlReq{f: *f, ack: true}:
		default:
			t.log.Debug("ofi: control queue full, dropped bye acknowledgement", "from", f.From)
		}
	}
}

// control answers descriptor queries and sends revocations, off the poller
// (which must never wait for a completion it would have to read itself).
func (t *Transport) control() {
	defer t.wg.Done()
	for {
		select {
		case <-t.stop:
			return
		case r := <-t.ctl:
			t.serveCtl(r)
		}
	}
}

func (t *Transport) serveCtl(r ctlReq) {
	ctx, cancel := context.WithTimeout(context.Background(), t.timeout)
	defer cancel()
	var b [hdrLen + replyLen]byte
	t.peerMu.RLock()
	p := t.peers[r.f.From]
	t.peerMu.RUnlock()
	if p == nil || (p.down.Load() && r.f.Kind != frameBye) {
		t.log.Debug("ofi: control request from a node that is not a live peer", "from", r.f.From)
		return
	}
	reply := frame{ReqID: r.f.ReqID, Key: r.f.Key, ToNonce: r.f.FromNonce}
	t.life.RLock() // before regMu, as Register takes them
	t.regMu.Lock()
	if reg := t.regs[r.f.Key]; reg != nil && !r.ack && !t.closed {
		// The requester's incarnation gets a key of its own, which Fence
		// closes once it departs.
		if key, ok := t.grantLocked(reg, incarnation{r.f.From, r.f.FromNonce}); ok {
			reply.Found = true
			reply.Len = reg.desc.Len
			reply.Base = reg.desc.RKey.Base
			reply.Access = reg.desc.Access
			reply.AccessKey = key
		}
	}
	t.regMu.Unlock()
	t.life.RUnlock()
	n := encodeReply(b[:], t.id, &reply)
	if err := t.send(ctx, p, b[:n], nil); err != nil {
		t.log.Debug("ofi: query reply", "peer", p.id, "err", err)
	}
}

// inbox queues received messages for the dispatcher, in arrival order.
type inbox struct {
	mu   sync.Mutex
	q    []inMsg
	wake chan struct{}
}

type inMsg struct {
	from ids.NodeID
	msg  []byte
	h    rdma.Handler
}

func (in *inbox) push(m inMsg) {
	in.mu.Lock()
	in.q = append(in.q, m)
	in.mu.Unlock()
	select {
	case in.wake <- struct{}{}:
	default:
	}
}

// dispatch runs the handler on received messages, one at a time, so that a
// handler may call Send or Post without stalling the poller.
func (t *Transport) dispatch() {
	defer t.wg.Done()
	var batch []inMsg
	for {
		select {
		case <-t.stop:
			return
		case <-t.inbox.wake:
		}
		t.inbox.mu.Lock()
		batch, t.inbox.q = t.inbox.q, batch[:0]
		t.inbox.mu.Unlock()
		for i := range batch {
			batch[i].h(batch[i].from, batch[i].msg)
			batch[i] = inMsg{}
		}
	}
}
