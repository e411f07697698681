//go:build linux

package localcache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/uffd"
)

// client is one attached mapping: a client process's mapping of a whole
// region, registered with that process's userfaultfd, which the Cache reads.
type client struct {
	id     uint64
	c      *Cache
	r      *region
	u      *uffd.UFFD
	conn   *net.UnixConn // the session; nil for clients attached without one
	base   uint64        // the client's address of the region's first byte
	pid    int           // the peer process, for logs (0 if unknown)
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	inflight map[ids.PageNo]*pending // pages being resolved for this client
	detached bool
}

// pending is a page with a worker resolving it for one client. A fault
// message for it that arrives meanwhile sets again, and the worker resolves
// once more after it is done: every message is answered by a resolution
// that began after the message was read.
type pending struct {
	again bool
	write bool
}

var clientIDs atomic.Uint64

func (cl *client) addr(p ids.PageNo) uint64 { return cl.base + uint64(p)*uint64(cl.r.pageSize) }

// clientGone reports errors that mean the client process or its
// userfaultfd is gone: nothing left to answer.
func clientGone(err error) bool {
	return errors.Is(err, uffd.ErrProcessGone) || errors.Is(err, uffd.ErrClosed)
}

// attach starts serving the faults of a client's mapping [base,
// base+r.size), registered with u. The Cache owns u from here on.
func (c *Cache) attach(r *region, u *uffd.UFFD, conn *net.UnixConn, base uint64, pid int) (*client, error) {
	ctx, cancel := context.WithCancel(c.ctx)
	cl := &client{
		id: clientIDs.Add(1), c: c, r: r, u: u, conn: conn, base: base, pid: pid,
		ctx: ctx, cancel: cancel, inflight: make(map[ids.PageNo]*pending),
	}
	c.mu.Lock()
	if c.closed || c.draining != "" {
		c.mu.Unlock()
		cancel()
		u.Close()
		return nil, ErrClosed
	}
	r.mu.Lock() // lock order: Cache.mu, then region.mu
	if r.removed {
		r.mu.Unlock()
		c.mu.Unlock()
		cancel()
		u.Close()
		return nil, fmt.Errorf("%w: %s %q", ErrRegionRemoved, r.id, r.name)
	}
	r.clients[cl] = struct{}{}
	r.mu.Unlock()
	c.clients[cl] = struct{}{}
	c.st.clients.Add(1)
	c.wg.Add(1)
	c.mu.Unlock()
	go cl.read()
	c.log.Debug("client attached", "client", cl.id, "pid", pid, "region", r.id, "base", base)
	return cl, nil
}

// detach stops serving a client: it leaves the region's set (no more write
// protection is sent to it), its context is cancelled and its userfaultfd
// closed, which ends the reader; workers stop at their next step (a worker
// blocked in a Coherence call that ignores ctx finishes that call first).
// Safe to call more than once.
func (c *Cache) detach(cl *client) {
	cl.mu.Lock()
	if cl.detached {
		cl.mu.Unlock()
		return
	}
	cl.detached = true
	cl.mu.Unlock()
	cl.r.mu.Lock()
	delete(cl.r.clients, cl)
	cl.r.mu.Unlock()
	c.mu.Lock()
	delete(c.clients, cl)
	c.mu.Unlock()
	cl.cancel()
	cl.u.Close()
	c.st.clients.Add(-1)
	c.log.Debug("client detached", "client", cl.id, "pid", cl.pid)
}

// read is the client's reader: it takes fault messages off the userfaultfd
// and hands each page to a worker.
func (cl *client) read() {
	defer cl.c.wg.Done()
	msgs := make([]uffd.Msg, 16)
	for {
		n, err := cl.u.Read(msgs)
		for _, m := range msgs[:n] {
			cl.dispatch(m)
		}
		switch {
		case err == nil:
		case errors.Is(err, uffd.ErrUnknownEvent):
			cl.c.log.Warn("unknown userfaultfd event", "client", cl.id, "err", err)
		default:
			if cl.ctx.Err() == nil && !errors.Is(err, uffd.ErrClosed) {
				cl.c.log.Warn("reading faults failed; detaching", "client", cl.id, "err", err)
				cl.c.detach(cl)
			}
			return
		}
	}
}

func (cl *client) dispatch(m uffd.Msg) {
	if m.Event != uffd.EventPagefault {
		return // no optional events are requested by the client library
	}
	st := &cl.c.st
	switch m.Kind() {
	case uffd.FaultMissing:
		st.missing.Add(1)
	case uffd.FaultMinor:
		st.minor.Add(1)
	case uffd.FaultWP:
		st.wp.Add(1)
	}
	if m.Write() {
		st.writes.Add(1)
	}
	if m.Address < cl.base || m.Address-cl.base >= uint64(cl.r.size) {
		cl.c.log.Warn("fault outside the registered region", "client", cl.id, "addr", m.Address)
		return
	}
	p := ids.PageNo((m.Address - cl.base) / uint64(cl.r.pageSize))
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.detached {
		return
	}
	if pd := cl.inflight[p]; pd != nil {
		pd.again = true
		pd.write = pd.write || m.Write()
		return
	}
	cl.inflight[p] = &pending{}
	st.faultsInFlight.Add(1)
	cl.c.wg.Add(1)
	go cl.work(p, m.Write())
}

// Retry pacing for failed misses: the faulting thread stays blocked.
const (
	retryMin = time.Millisecond
	retryMax = 100 * time.Millisecond
)

// work resolves page p for the client until no message for it is left.
func (cl *client) work(p ids.PageNo, write bool) {
	defer cl.c.wg.Done()
	defer cl.c.st.faultsInFlight.Add(-1)
	wait := retryMin
	for {
		err := cl.c.resolve(cl.ctx, cl, p, write)
		var missErr *missError
		switch {
		case err == nil:
			wait = retryMin
			cl.c.makeRoom(cl.c.ctx)
		case cl.ctx.Err() != nil || clientGone(err):
			cl.finish(p)
			return
		case errors.As(err, &missErr):
			// The engine refused or failed: wait, then try again; the
			// faulting thread stays blocked meanwhile.
			cl.c.log.Debug("miss failed; retrying", "client", cl.id, "page", p, "err", err)
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-cl.ctx.Done():
				t.Stop()
				cl.finish(p)
				return
			}
			wait = min(2*wait, retryMax)
			continue
		default:
			cl.c.log.Warn("fault not resolved", "client", cl.id, "region", cl.r.id, "page", p, "err", err)
		}
		cl.mu.Lock()
		pd := cl.inflight[p]
		if !pd.again {
			delete(cl.inflight, p)
			cl.mu.Unlock()
			return
		}
		write = pd.write
		pd.again, pd.write = false, false
		cl.mu.Unlock()
	}
}

func (cl *client) finish(p ids.PageNo) {
	cl.mu.Lock()
	delete(cl.inflight, p)
	cl.mu.Unlock()
}

// missError marks a failed Coherence miss: worth retrying.
type missError struct{ err error }

func (e *missError) Error() string { return "localcache: miss: " + e.err.Error() }
func (e *missError) Unwrap() error { return e.err }

// resolve serves one fault of cl on page p: it brings the local state up to
// what the access needs (Shared for a read, Modified for a write) through
// the Coherence engine, then maps the page in the client with the matching
// protection and wakes the faulting threads. It is idempotent.
func (c *Cache) resolve(ctx context.Context, cl *client, p ids.PageNo, write bool) error {
	r := cl.r
	pg, err := r.acquire(ctx, p)
	if err != nil {
		return err
	}
	defer r.release(pg)
	for attempt := 0; ; attempt++ {
		st := pg.State()
		if st == Invalid || st == Shared && write {
			if err := c.hold(ctx, pg, write); err != nil {
				return err
			}
		} else {
			c.st.localResolves.Add(1)
		}
		err := c.mapInto(cl, pg, write)
		if errors.Is(err, uffd.ErrNotCached) && attempt == 0 {
			// The memfd lost a page held here: a broken invariant (someone
			// punched it behind the Cache). Drop it and fetch again.
			c.log.Error("held page missing from the memfd", "region", r.id, "page", p, "state", st)
			c.setState(pg, Invalid)
			continue
		}
		return err
	}
}

// mapInto maps a held page in the client: read-only when Shared; writable
// when Modified. A write fault on a page already mapped read-only is
// answered by clearing its write protection.
func (c *Cache) mapInto(cl *client, pg *page, write bool) error {
	addr, n := cl.addr(pg.no), uint64(cl.r.pageSize)
	if pg.State() == Shared {
		return cl.u.Continue(addr, n, uffd.MapWP)
	}
	if !write {
		return cl.u.Continue(addr, n, 0)
	}
	if err := cl.u.Continue(addr, n, uffd.DontWake); err != nil {
		return err
	}
	if err := cl.u.WriteProtect(addr, n, false, 0); err != nil {
		return fmt.Errorf("localcache: unprotect: %w", err)
	}
	return nil
}
