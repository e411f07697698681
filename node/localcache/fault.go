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

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/localsock"
	"github.com/dsmkit/dsm/internal/mapproto"
	"github.com/dsmkit/dsm/internal/uffd"
)

// client is one attached mapping: a client process's mapping of a whole
// region, registered with that process's userfaultfd, which the Cache reads.
type client struct {
	id   uint64
	c    *Cache
	r    *region
	u    *uffd.UFFD
	conn *net.UnixConn // the session; nil for clients attached without one
	base uint64        // the client's address of the region's first byte
	pid  int           // the peer process, for logs (0 if unknown)
	// peer is who the process is, as Config.Admit judged it (nil without
	// Admit); Revoke ends the sessions of peers no longer allowed.
	peer   *localsock.Addr
	ctx    context.Context
	cancel context.CancelFunc
	// faultTimeout is how long a fault may wait for an unavailable page
	// before it is poisoned (see poison); 0 waits forever. It is the
	// session's Map.FaultTimeout, so it is set only for a client that
	// understands Unavailable and Available.
	faultTimeout time.Duration
	// sendMu serializes the messages sent on conn after the handshake.
	sendMu sync.Mutex
	// noPoisonLogged: the kernel's lack of UFFDIO_POISON was logged.
	noPoisonLogged atomic.Bool

	mu       sync.Mutex
	inflight map[ids.PageNo]*pending // pages being resolved for this client
	detached bool
	// writable holds the pages this client may map writable: those
	// mapInto mapped writable and no write protection covered since (a
	// superset: an entry is added before the mapping and removed after a
	// protection). Written with the page's lock held; Suspend
	// write-protects a page only in the clients that hold it here.
	writable map[ids.PageNo]struct{}
}

func (cl *client) setWritable(p ids.PageNo, on bool) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if on {
		cl.writable[p] = struct{}{}
	} else {
		delete(cl.writable, p)
	}
}

// writablePages returns the pages of pgs (sorted) that cl may map
// writable.
func (cl *client) writablePages(pgs []*page) []*page {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var out []*page
	for _, pg := range pgs {
		if _, ok := cl.writable[pg.no]; ok {
			out = append(out, pg)
		}
	}
	return out
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
// base+r.size), registered with u. The Cache owns u from here on. A fault
// that waits longer than faultTimeout (0: forever) for an unavailable page
// is poisoned; that needs conn.
func (c *Cache) attach(r *region, u *uffd.UFFD, conn *net.UnixConn, base uint64, pid int, peer *localsock.Addr, faultTimeout time.Duration) (*client, error) {
	ctx, cancel := context.WithCancel(c.ctx)
	if conn == nil {
		faultTimeout = 0
	}
	cl := &client{
		id: clientIDs.Add(1), c: c, r: r, u: u, conn: conn, base: base, pid: pid, peer: peer,
		ctx: ctx, cancel: cancel, inflight: make(map[ids.PageNo]*pending),
		writable:     make(map[ids.PageNo]struct{}),
		faultTimeout: max(faultTimeout, 0),
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
	since := time.Now() // when the oldest fault not answered yet was read
	reported := false   // the wait was logged (longFault)
	var lastMiss error  // the last failed miss's error, for a suspension's
	for {
		// A fault waits through a suspension for as long as its
		// FaultTimeout allows, counted from since: a dsmd without a lease
		// serves nothing, so its pages are unavailable to this client as
		// much as a page whose home is down (a suspension that ends within
		// the bound costs nothing).
		var until time.Time
		if cl.faultTimeout > 0 {
			until = since.Add(cl.faultTimeout)
		}
		err := cl.c.resolve(cl.ctx, cl, p, write, true, until)
		var missErr *missError
		switch {
		case err == nil:
			cl.c.makeRoom(cl.c.ctx)
		case cl.ctx.Err() != nil || clientGone(err):
			cl.finish(p)
			return
		case errors.As(err, &missErr):
			if errors.Is(err, ErrSuspended) && lastMiss != nil {
				// Say what the misses found before the suspension too:
				// the page may be unavailable for both reasons.
				err = &missError{fmt.Errorf("%w (before that, a miss: %v)", err, lastMiss)}
			} else if !errors.Is(err, ErrSuspended) {
				lastMiss = missErr.err
			}
			poisoned := poisonNot
			if cl.faultTimeout > 0 && errors.Is(err, ErrUnavailable) && (errors.Is(err, ErrLost) || time.Since(since) >= cl.faultTimeout) {
				poisoned = cl.poison(p, err)
			}
			if poisoned == poisonGone {
				cl.finish(p)
				return
			}
			if poisoned == poisonDone {
				// The faulting threads have their SIGBUS. The miss goes
				// on in the background until the page is served again.
				if !cl.unpoison(p, write) {
					cl.finish(p)
					return
				}
				break
			}
			// The engine refused or failed: wait, then try again; the
			// faulting thread stays blocked meanwhile.
			cl.c.log.Debug("miss failed; retrying", "client", cl.id, "page", p, "err", err)
			if !reported && time.Since(since) >= longFault {
				reported = true
				cl.c.log.Warn("a fault has waited long; its misses keep failing, not as unavailable", "client", cl.id, "pid", cl.pid,
					"region", cl.r.id, "page", p, "waited", time.Since(since).Round(time.Millisecond), "err", err)
			}
			if !cl.sleep(wait) {
				cl.finish(p)
				return
			}
			wait = min(2*wait, retryMax)
			continue
		default:
			cl.c.log.Warn("fault not resolved", "client", cl.id, "region", cl.r.id, "page", p, "err", err)
		}
		wait = retryMin
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
		since, reported, lastMiss = time.Now(), false, nil
	}
}

// longFault is how long a fault whose misses keep failing (not as
// unavailable: those are poisoned after the client's FaultTimeout) waits
// before it is logged, once.
const longFault = 20 * time.Second

// sleep waits d, or less if the client goes away (then it is false).
func (cl *client) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-cl.ctx.Done():
		return false
	}
}

// Outcomes of poison.
const (
	poisonDone = 1 + iota // the page is poisoned in the client
	poisonNot             // it is not: the fault keeps waiting
	poisonGone            // the client is gone
)

// poison gives up on a fault of the client on page p that has waited longer
// than the client's FaultTimeout and whose last miss failed with
// ErrUnavailable (why): it tells the client which page and why
// (mapproto Unavailable), then resolves the fault with UFFDIO_POISON, so the
// faulting threads get SIGBUS (a MADV_POPULATE_* gets EHWPOISON) and so
// does every later access of the client to the page until it removes the
// marker. The message goes first so that the client knows why by the time
// a thread fails.
//
// Where the client's userfaultfd lacks FeaturePoison (a kernel before 6.6)
// the fault keeps waiting; that is logged once per client. A page mapped in
// the client (a write to a page held Shared here, whose upgrade needs the
// home) cannot be poisoned from here (EEXIST): the client is asked to
// poison it itself (mapproto Poison). If the poison fails otherwise, the
// client is told that the page is available after all, and the fault
// keeps waiting.
func (cl *client) poison(p ids.PageNo, why error) int {
	c := cl.c
	if cl.u.Features()&uffd.FeaturePoison == 0 {
		if cl.noPoisonLogged.CompareAndSwap(false, true) {
			c.log.Warn("a fault waits past its timeout for an unavailable page, and this kernel cannot poison it (UFFDIO_POISON needs Linux 6.6); it keeps waiting",
				"client", cl.id, "pid", cl.pid, "region", cl.r.id, "page", p, "err", why)
		}
		return poisonNot
	}
	text := why.Error()
	var missErr *missError
	if errors.As(why, &missErr) {
		text = missErr.err.Error()
	}
	if err := cl.send(mapproto.Msg{Type: mapproto.TypeUnavailable, Page: p, Text: text}); err != nil {
		c.log.Warn("telling a client that a page is unavailable failed", "client", cl.id, "page", p, "err", err)
	}
	err := cl.u.Poison(cl.addr(p), uint64(cl.r.pageSize), 0)
	if errors.Is(err, unix.EEXIST) {
		// The client maps the page (read-only: this is a write fault on a
		// page held Shared, whose upgrade needs the home). Only an empty
		// page-table entry can be poisoned, and only the client can empty
		// it: it poisons the page itself when asked (mapproto Poison).
		// Nothing maps the page in it meanwhile (that is this worker's
		// job).
		err = cl.send(mapproto.Msg{Type: mapproto.TypePoison, Page: p})
	}
	switch {
	case err == nil:
		c.st.poisoned.Add(1)
		c.log.Info("fault poisoned: page unavailable", "client", cl.id, "pid", cl.pid, "region", cl.r.id, "page", p,
			"timeout", cl.faultTimeout, "err", why)
		return poisonDone
	case clientGone(err):
		return poisonGone
	}
	c.log.Warn("poisoning a fault failed; it keeps waiting", "client", cl.id, "region", cl.r.id, "page", p, "err", err)
	cl.send(mapproto.Msg{Type: mapproto.TypeAvailable, Page: p})
	return poisonNot
}

// unpoison retries the miss of a page poisoned in the client, every
// retryMax, until it succeeds; then it tells the client that the page is
// available again (mapproto Available), and the client removes its poison
// marker. It is false if the client went away first.
func (cl *client) unpoison(p ids.PageNo, write bool) bool {
	for {
		if !cl.sleep(retryMax) {
			return false
		}
		err := cl.c.resolve(cl.ctx, cl, p, write, false, time.Time{})
		switch {
		case err == nil:
			cl.c.st.unpoisoned.Add(1)
			cl.c.log.Info("poisoned page available again", "client", cl.id, "region", cl.r.id, "page", p)
			if err := cl.send(mapproto.Msg{Type: mapproto.TypeAvailable, Page: p}); err != nil {
				cl.c.log.Warn("telling a client that a page is available failed", "client", cl.id, "page", p, "err", err)
			}
			// A thread whose fault was not poisoned after all (the client
			// could not poison a page it mapped) retries; it faults again
			// once the client has dropped the marker (or finds it).
			if err := cl.u.Wake(cl.addr(p), uint64(cl.r.pageSize)); err != nil && clientGone(err) {
				return false
			}
			return true
		case cl.ctx.Err() != nil || clientGone(err):
			return false
		}
		cl.c.log.Debug("miss of a poisoned page failed; retrying", "client", cl.id, "page", p, "err", err)
	}
}

// send writes one message on the client's session.
func (cl *client) send(m mapproto.Msg) error {
	if cl.conn == nil {
		return errors.New("localcache: client without a session")
	}
	b, err := mapproto.Encode(m)
	if err != nil {
		return err
	}
	cl.sendMu.Lock()
	defer cl.sendMu.Unlock()
	cl.conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, err = cl.conn.Write(b)
	return err
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
// the Coherence engine, then, if mapIt, maps the page in the client with
// the matching protection and wakes the faulting threads. It is
// idempotent. While the Cache is suspended it waits, holding no lock, until
// Resume (or until ctx ends or the Cache closes); past until, if not zero,
// it fails with a *missError that matches ErrUnavailable.
func (c *Cache) resolve(ctx context.Context, cl *client, p ids.PageNo, write, mapIt bool, until time.Time) error {
	r := cl.r
	for {
		if err := c.waitServingUntil(ctx, until); err != nil {
			return err
		}
		pg, err := r.acquire(ctx, p)
		if err != nil {
			return err
		}
		err = c.resolveLocked(ctx, cl, pg, write, mapIt)
		r.release(pg)
		if !errors.Is(err, errSuspended) {
			return err
		}
	}
}

// resolveLocked is resolve with the page's lock held; errSuspended means
// that a suspension began: nothing was mapped.
func (c *Cache) resolveLocked(ctx context.Context, cl *client, pg *page, write, mapIt bool) error {
	r := cl.r
	for attempt := 0; ; attempt++ {
		st := pg.State()
		if st == Invalid || st == Shared && write || pg.aside {
			if err := c.hold(ctx, pg, write); err != nil {
				return err
			}
		} else {
			c.st.localResolves.Add(1)
		}
		if !mapIt {
			return nil
		}
		if c.suspended.Load() {
			return errSuspended // held, but not to be mapped until Resume
		}
		err := c.mapInto(cl, pg, write)
		if errors.Is(err, uffd.ErrNotCached) && attempt == 0 {
			// The memfd lost a page held here: a broken invariant (someone
			// punched it behind the Cache). Drop it and fetch again.
			c.log.Error("held page missing from the memfd", "region", r.id, "page", pg.no, "state", st)
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
	cl.setWritable(pg.no, true)
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
