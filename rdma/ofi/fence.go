//go:build ofi

package ofi

/*
#include <stdlib.h>
#include <rdma/fabric.h>
#include "fab.h"
*/
import "C"

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// maxFencedPerNode bounds the incarnations of one node that Fence keeps
// refusing; older ones are forgotten (their grants are closed for good).
const maxFencedPerNode = 64

// incarnation names one process of a node: the requester a grant is for.
type incarnation struct {
	id    ids.NodeID
	nonce uint64
}

// grant is one registration's memory registered again for one requester
// incarnation: the fabric key that incarnation's operations name.
type grant struct {
	mr  *C.struct_fid_mr
	key uint64
}

// Fence refuses, from now on, every operation of requester incarnation
// nonce of node id on this node's memory, whatever connection it comes
// on: the keys granted to that incarnation are closed (a provider that
// checks keys at the target, sockets and tcp;ofi_rxm, refuses them), its
// later descriptor queries are answered "not found", and on ofi_rxm the
// connection to the node's address is closed (unless a newer incarnation
// of the node is known there), which drops an operation whose key was
// checked but whose payload had not all arrived. What the
// incarnation posted and the provider executed before Fence returned has
// executed; nothing of it executes after.
//
// A departed incarnation keeps the registrations' published keys (the
// directory holds them), but those name no fabric key: an initiator
// learns its own key for each registration from the target's answer to
// its first query (a grant), and only the target's own operations use the
// published key. So fencing one incarnation leaves every other
// incarnation's keys, and its operations in flight, untouched.
//
// shm's one-sided operations are copied by the initiator's process with
// cross-memory attach, or served by the target without a key check: on
// shm the fence is the initiator's (its engines post nothing once
// suspended), and a process on the same host is inside the trust boundary
// (see the package documentation).
func (t *Transport) Fence(id ids.NodeID, nonce uint64) {
	if id == ids.None || nonce == 0 || (id == t.id && nonce == t.nonce) {
		return
	}
	k := incarnation{id, nonce}
	t.regMu.Lock()
	f := t.fenced[id]
	for _, n := range f {
		if n == nonce {
			t.regMu.Unlock()
			return
		}
	}
	f = append(f, nonce)
	if len(f) > maxFencedPerNode {
		f = f[len(f)-maxFencedPerNode:]
	}
	t.fenced[id] = f
	var mrs []*C.struct_fid_mr
	for _, r := range t.regs {
		if g, ok := r.grants[k]; ok {
			mrs = append(mrs, g.mr)
			delete(r.grants, k)
		}
	}
	name := t.names[id]
	t.regMu.Unlock()
	// The connection to the address is closed only while it is the
	// fenced incarnation's: once a newer incarnation of the node is
	// expected there, or has spoken from it, the connection may carry the
	// new process's requests, which a close would leave to be delivered
	// after their error completions (a graceful close sends what is
	// queued).
	t.peerMu.RLock()
	p := t.peers[id]
	t.peerMu.RUnlock()
	if p != nil {
		if w, sn := p.want.Load(), p.seen.Load(); (w != 0 && w != nonce) || (sn != 0 && sn != nonce) {
			name = nil
		}
	}

	drop := len(name) > 0 && strings.Contains(t.prov, "ofi_rxm")
	if drop && p != nil {
		// This node's requests to the fenced incarnation go on the
		// connection about to close, whose provider completes none of
		// them afterwards: the peer goes (as RemovePeer), and no request
		// is posted on it from here on (its senders hold txMu shared).
		t.peerMu.Lock()
		if t.peers[id] == p {
			delete(t.peers, id)
		}
		p.markGone()
		t.peerMu.Unlock()
		p.txMu.Lock()
		p.txClosed = true
	}
	t.life.RLock()
	if t.closed {
		t.life.RUnlock()
		if drop && p != nil {
			p.txMu.Unlock()
		}
		return
	}
	for _, mr := range mrs {
		if rc := C.dsm_mr_close(mr); rc != 0 {
			t.log.Warn("ofi: close a fenced incarnation's key", "peer", id, "err", fabricErr("fi_close(mr)", int(-rc), 0))
		}
	}
	if drop {
		cname := (*[maxNameLen + 1]byte)(C.calloc(maxNameLen+1, 1))
		copy(cname[:], name)
		rc := C.dsm_drop_conn(t.c, unsafe.Pointer(cname))
		C.free(unsafe.Pointer(cname))
		if rc != 0 {
			t.log.Warn("ofi: close the connection of a fenced incarnation", "peer", id, "err", fabricErr("fi_av_remove", int(-rc), 0))
		}
	}
	t.life.RUnlock()
	if drop && p != nil {
		p.txMu.Unlock()
		// What was pending on the closed connection never completes
		// (ofi_rxm writes the completions it gives for it while it
		// closes the connection, in dsm_drop_conn, and reclaim reads
		// them first): fail it, and free the slots (nothing writes
		// their C memory any more), as for a retired shm endpoint.
		t.kickPeer(id, kickPeerGone)
		t.pollMu.Lock()
		t.reclaim(p)
		t.pollMu.Unlock()
	}
	t.log.Debug("ofi: incarnation fenced", "peer", id, "nonce", fmt.Sprintf("%#x", nonce), "keys", len(mrs))
}

// fencedLocked reports whether Fence refused the incarnation. The caller
// holds regMu.
func (t *Transport) fencedLocked(k incarnation) bool {
	for _, n := range t.fenced[k.id] {
		if n == k.nonce {
			return true
		}
	}
	return false
}

// grantLocked returns the fabric key of r for requester incarnation k,
// registering r's memory once more for it on first use: ok is false when
// k was fenced or the provider refused the registration. The caller holds
// life shared (and checked closed), then regMu.
func (t *Transport) grantLocked(r *registration, k incarnation) (key uint64, ok bool) {
	if k.nonce == 0 || t.fencedLocked(k) || r.dead || r.mr == nil {
		return 0, false
	}
	if g, ok := r.grants[k]; ok {
		return g.key, true
	}
	if t.closing.Load() {
		return 0, false
	}
	var g grant
	var ckey C.uint64_t
	rc := C.dsm_mr_reg(t.c, unsafe.Pointer(&r.mem[0]), C.size_t(len(r.mem)), r.flags, C.uint64_t(t.nextKey.Add(1)), &g.mr, &ckey)
	if rc != 0 {
		t.log.Warn("ofi: register memory for a peer", "peer", k.id, "bytes", len(r.mem), "err", fabricErr("fi_mr_reg", int(-rc), 0))
		return 0, false
	}
	g.key = uint64(ckey)
	if r.grants == nil {
		r.grants = map[incarnation]grant{}
	}
	r.grants[k] = g
	return g.key, true
}

// closeGrantsLocked closes every key granted for r. The caller holds
// regMu and, unless the transport is closing, life shared.
func closeGrantsLocked(r *registration) {
	for k, g := range r.grants {
		C.dsm_mr_close(g.mr)
		delete(r.grants, k)
	}
}

// Grants is how many keys this node has granted to peers' incarnations
// and not closed: one per registration and incarnation that used it.
func (t *Transport) Grants() int {
	t.regMu.Lock()
	defer t.regMu.Unlock()
	n := 0
	for _, r := range t.regs {
		n += len(r.grants)
	}
	return n
}

// doubtOf is the in-doubt count of peer p's expected incarnation (see
// inDoubt): requests abandoned on an earlier incarnation name keys the
// later one never had, so they do not hold it back.
func (t *Transport) doubtOf(p *peer) *atomic.Int32 {
	k := incarnation{p.id, p.want.Load()}
	t.peerMu.RLock()
	c := t.doubts[k]
	t.peerMu.RUnlock()
	if c != nil {
		return c
	}
	t.peerMu.Lock()
	defer t.peerMu.Unlock()
	if c = t.doubts[k]; c == nil {
		c = new(atomic.Int32)
		t.doubts[k] = c
	}
	return c
}

// maxDoubt bounds how long a Post waits for a peer's abandoned requests
// (six times OpTimeout: 30 s by default): a provider that never completes
// a request (shm's refused ones) would otherwise stop every later Post to
// the peer. A peer cut off for that long has been declared failed.
func (t *Transport) maxDoubt() time.Duration { return 6 * t.timeout }

// inDoubt waits until no Post slot abandoned on peer p has requests the
// provider may still execute, and returns the in-doubt count a new Post
// to p counts in if it is abandoned too. A Post that failed with ErrOutcomeUnknown
// (overdue, its context ended, the peer was removed while it waited) left
// its requests with the provider, which may execute them later: held in a
// TCP connection through a partition, or behind a paused target. The
// protocol settles such an outcome by reading the state back with a later
// Post, and trusts that the unknown batch has then executed or never will
// (docs/failover.md §8). The providers do not order a later request after
// an earlier one on their own (tcp;ofi_rxm serves a READ as it arrives
// and an atomic through its message path, and a request held in the
// network arrives when it does), so the later Post waits here until every
// abandoned request of the peer node completed: executed, or failed where
// the provider knows it did not. Without it a FAA abandoned during a
// one-way loss landed after the reader had settled it as not executed,
// and its sharer unit counted twice (chaos seeds 680008 and 680009 on
// tcp;ofi_rxm; TestLaterPostAfterUnknown). It returns an error, and nothing was posted, when ctx
// ends, the peer is removed, its process is found gone (shm) or the
// transport closes first; after maxDoubt it logs and goes on.
func (t *Transport) inDoubt(ctx context.Context, p *peer) (*atomic.Int32, error) {
	c := t.doubtOf(p)
	if c.Load() == 0 {
		return c, nil
	}
	start := time.Now()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for c.Load() > 0 {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.removed:
			return nil, &rdma.PeerError{Peer: p.id, Err: fmt.Errorf("%w: peer removed or replaced", rdma.ErrPeerUnreachable)}
		case <-t.stop:
			return nil, rdma.ErrClosed
		case now := <-tick.C:
			if p.dead.Load() {
				// The peer's process is gone (shm): nothing it was
				// sent executes any more.
				return nil, &rdma.PeerError{Peer: p.id, Err: fmt.Errorf("%w: its process (pid %d) is gone", rdma.ErrPeerUnreachable, p.pid)}
			}
			if now.Sub(start) > t.maxDoubt() {
				t.log.Warn("ofi: operations abandoned on a peer have not completed; posting anyway", "peer", p.id,
					"abandoned", c.Load(), "waited", now.Sub(start).Round(time.Millisecond))
				return c, nil
			}
		}
	}
	return c, nil
}
