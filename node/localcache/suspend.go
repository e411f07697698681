//go:build linux

package localcache

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/ids"
)

// errSuspended: an operation found the Cache suspended with a page's lock
// held; it lets the lock go, waits for Resume and starts again.
var errSuspended = errors.New("localcache: suspended")

// SuspendStats says what a Suspend did.
type SuspendStats struct {
	// Punched: pages punched out of the regions' memfds (every page held,
	// Shared and Modified).
	Punched int
	// Aside: Modified pages copied aside; BytesCopied their bytes.
	Aside       int
	BytesCopied int64
	// WriteProtects: UFFDIO_WRITEPROTECT calls (one per run of Modified
	// pages per attached client); Punches: fallocate calls (one per run of
	// held pages); Copies: copy_file_range calls.
	WriteProtects, Punches, Copies int
	// Waited: pages whose lock was held by a call in flight when Suspend
	// came to them; they were revoked once it ended.
	Waited int
	// Duration: from the call to its return; of which WriteProtectTime,
	// CopyTime and PunchTime in those calls.
	Duration, WriteProtectTime, CopyTime, PunchTime time.Duration
}

// waitServing returns at once while the Cache is not suspended, else when
// Resume is called; it fails when ctx ends, the Cache closes or End is
// called (then also while not suspended).
func (c *Cache) waitServing(ctx context.Context) error {
	_, err := c.waitGate(ctx, nil)
	return err
}

// waitGate is waitServing that also gives up, expired, when expire fires
// first (nil: never). While the Cache serves it returns at once, whatever
// expire holds.
func (c *Cache) waitGate(ctx context.Context, expire <-chan time.Time) (expired bool, err error) {
	c.gateMu.Lock()
	ch := c.resumed
	c.gateMu.Unlock()
	select {
	case <-ch:
		return false, c.endErr()
	default:
	}
	select {
	case <-ch:
		return false, c.endErr()
	case <-c.ended:
		return false, c.endErr()
	case <-expire:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	case <-c.ctx.Done():
		return false, ErrClosed
	}
}

// waitServingUntil is waitServing for a client's fault that may wait until
// deadline (zero: for as long as the suspension lasts). A suspension that
// outlasts it fails the wait with a *missError that matches ErrUnavailable
// and ErrSuspended and says since when dsmd holds no lease, so the fault is
// poisoned like one whose page's home is down (fault.go, work).
func (c *Cache) waitServingUntil(ctx context.Context, deadline time.Time) error {
	if deadline.IsZero() {
		return c.waitServing(ctx)
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	expired, err := c.waitGate(ctx, t.C)
	if !expired {
		return err
	}
	since := time.Unix(0, c.suspendedAt.Load())
	return &missError{fmt.Errorf("%w: %w: dsmd has held no lease since %s (%v): cut off from the directory's majority, or stalled; the page is served again once it holds one",
		ErrUnavailable, ErrSuspended, since.Format("15:04:05.000"), time.Since(since).Round(time.Millisecond))}
}

// SuspendedCallWait bounds how long a call of dsmd's (Access, Flush: a
// ReadAt, WriteAt, atomic or Sync of a client) waits for a suspended Cache
// to serve again. A dsmd cut off from the directory's majority stays
// suspended until the cut heals or, after its failure verdict, until its
// next incarnation, which ends every session: without a bound such a call
// waited for all of it (22.6 s in a chaos schedule under a one-way
// partition). After the bound it fails with ErrUnavailable (and
// ErrSuspended), as a call on a page whose home is down fails after the
// engine's UnavailableAfter, which it matches. A client's fault is not
// bounded by it but by its FaultTimeout, suspension included
// (waitServingUntil).
var SuspendedCallWait = 10 * time.Second

// waitServingCall is waitServing for a call of dsmd's, bounded by
// SuspendedCallWait.
func (c *Cache) waitServingCall(ctx context.Context) error {
	t := time.NewTimer(SuspendedCallWait)
	defer t.Stop()
	expired, err := c.waitGate(ctx, t.C)
	if !expired {
		return err
	}
	return fmt.Errorf("%w: %w: dsmd has held no lease for %v (cut off from the directory's majority, or stalled)", ErrUnavailable, ErrSuspended, SuspendedCallWait)
}

// callCtx is the context of one Coherence call: ctx, also cancelled when a
// suspension begins. done releases it.
func (c *Cache) callCtx(ctx context.Context) (context.Context, func()) {
	c.gateMu.Lock()
	fl := c.flight
	c.gateMu.Unlock()
	cctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(fl, cancel)
	return cctx, func() { stop(); cancel() }
}

// Suspended reports whether the Cache is suspended (Suspend was called and
// Resume was not, since).
func (c *Cache) Suspended() bool { return c.suspended.Load() }

// Suspend stops every local access to every page, as dsmd does when its
// lease is about to run out (docs/failover.md §9), losing no Modified data:
//
//  1. From its start no fault is resolved: the workers of new and pending
//     faults wait, holding no lock, until Resume or Close, or until the
//     client's FaultTimeout, counted from the fault, is over: then the
//     fault is poisoned (fault.go, work). No Coherence call (miss,
//     upgrade, eviction, write-back) is started; the calls in flight are
//     cancelled (their contexts end) and waited for: a Coherence
//     implementation must honour ctx, or Suspend waits for the call to end
//     (bounded by ctx). Access and Flush wait too; Install fails with
//     ErrSuspended.
//  2. Then, region by region, over every page held: every Modified page is
//     write-protected in every attached client that may map it writable
//     (in the others a store faults anyway; one UFFDIO_WRITEPROTECT per
//     run of such pages per client, runs merged across gaps under 2 MiB),
//     so no store lands after the copy; its bytes are copied into
//     the region's aside memfd at the same offset (copy_file_range, one
//     call per run); and every page held, Shared and Modified, is punched
//     out of the region's memfd (one fallocate over the held pages and the
//     holes between them), so every mapping in every process loses it and
//     every access faults and waits. See revoke.
//
// A miss that the engine took before its cancellation goes on inside the
// engine, as when a faulting client dies: the page stays Invalid here and
// the next fault asks again. A write-back the engine took returns
// ErrEvictPending: the data is the engine's.
//
// Shared pages become Invalid here (the engine still holds them Shared:
// after Resume their faults are misses that the engine can serve from its
// copy). Modified pages stay Modified, set aside: the tenure is kept.
//
// Invalidate and Downgrade go on working while suspended: a page set aside
// is answered from its aside copy (the data goes to the engine, as for any
// Modified page) and becomes Invalid here. So the cluster never sees two
// writers, and no Modified data is lost: it is either aside or handed to
// the engine.
//
// Pages whose lock is free are revoked at once, in runs; those held by a
// call in flight are revoked one by one once it ends. If ctx ends first,
// Suspend returns with an error naming how many pages it could not revoke;
// the Cache stays suspended and a second Suspend finishes the work.
// Calling Suspend while suspended is harmless.
func (c *Cache) Suspend(ctx context.Context) (SuspendStats, error) {
	start := time.Now()
	c.suspendMu.Lock()
	defer c.suspendMu.Unlock()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return SuspendStats{}, ErrClosed
	}
	regions := make([]*region, 0, len(c.regions))
	for _, r := range c.regions {
		regions = append(regions, r)
	}
	c.mu.Unlock()
	slices.SortFunc(regions, func(a, b *region) int { return cmp.Compare(a.id, b.id) })

	c.gateMu.Lock()
	c.revoked.Store(false)
	if !c.suspended.Load() {
		c.suspended.Store(true)
		c.suspendedAt.Store(time.Now().UnixNano())
		c.resumed = make(chan struct{})
		c.flightEnd() // cancels the Coherence calls in flight
		c.st.suspends.Add(1)
	}
	c.gateMu.Unlock()
	// The lease page says so before any page is revoked: a client's
	// watchdog that reads it from now on keeps its mapping inaccessible.
	c.publishLease()

	var st SuspendStats
	var errs []error
	for _, r := range regions {
		if err := c.suspendRegion(ctx, r, &st); err != nil {
			errs = append(errs, fmt.Errorf("region %s: %w", r.id, err))
		}
	}
	st.Duration = time.Since(start)
	if len(errs) > 0 {
		return st, fmt.Errorf("localcache: suspend: %w", errors.Join(errs...))
	}
	// Every page held is out of every mapping: the clients' accesses fault
	// into this Cache and wait, and their watchdogs may open the mappings
	// again (a plain access then waits instead of faulting in the client).
	c.revoked.Store(true)
	c.publishLease()
	c.log.Info("suspended", "punched", st.Punched, "aside", st.Aside, "waited", st.Waited, "took", st.Duration)
	return st, nil
}

// suspendRegion revokes every page of r held here: first those whose lock
// is free, together, then the others one by one as their calls end.
func (c *Cache) suspendRegion(ctx context.Context, r *region, st *SuspendStats) error {
	r.mu.Lock()
	if r.removed {
		r.mu.Unlock()
		return nil
	}
	pgs := make([]*page, 0, len(r.pages))
	for _, pg := range r.pages {
		pgs = append(pgs, pg)
	}
	r.mu.Unlock()
	slices.SortFunc(pgs, func(a, b *page) int { return cmp.Compare(a.no, b.no) })

	locked := pgs[:0:0]
	var busy []ids.PageNo
	for _, pg := range pgs {
		if r.tryAcquire(pg) {
			locked = append(locked, pg)
		} else {
			busy = append(busy, pg.no)
		}
	}
	err := c.revoke(r, locked, busy, st)
	for _, pg := range locked {
		r.release(pg)
	}
	if err != nil {
		return err
	}
	// Pages locked by a call in flight (cancelled above) or by a remote
	// action: wait for each, holding no other lock.
	for i, no := range busy {
		pg, err := r.acquire(ctx, no)
		if errors.Is(err, ErrRegionRemoved) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%d pages still busy: %w", len(busy)-i, err)
		}
		st.Waited++
		err = c.revoke(r, []*page{pg}, nil, st)
		r.release(pg)
		if err != nil {
			return err
		}
	}
	return nil
}

// wpMergeGap bounds the gap, in bytes, across which revoke merges two runs
// of Modified pages into one write protection. A gap shorter than 2 MiB
// spans at most the page tables that hold the runs on either side, so the
// write-protect markers it leaves on pages not mapped cost no new page
// table (on shmem the kernel allocates page tables to hold markers).
const wpMergeGap = 2 << 20

// revoke write-protects, copies aside and punches the pages of pgs (locked,
// sorted) that are held and not set aside already. busy (sorted) are the
// pages of the region whose lock others hold: no punch covers them.
//
// Few calls: a client is write-protected only over the Modified pages it may
// map writable (client.writable: the others it maps read-only, or not at
// all, and a store faults anyway); a write protection covers consecutive
// such pages, and also the gaps between them shorter than wpMergeGap (the
// pages there are Shared or not writable in this client, so write-protected
// already or not mapped, or holes, where the protection leaves a marker that
// the next fault clears: all harmless, and so is protecting a busy page, as
// whoever resolves it clears the protection where a write needs it). A punch
// covers the held pages and every gap between them that holds no busy page
// and no page left unrevoked: each other page there is a hole already
// (Invalid), and stays one while suspended, as nothing fills a page without
// its lock and a Coherence call, which nothing starts; punching a hole again
// costs a walk of the file's index and of the page tables. So the pages of a
// region take one punch unless calls are in flight. (Each punch and each
// write protection of a mapped page flushes TLBs on every CPU the client
// runs on: tens of microseconds on a virtual machine; BenchmarkSuspend.)
// Only the copy is per run of Modified pages, so that no hole is copied (it
// would allocate zeros in the aside file).
func (c *Cache) revoke(r *region, pgs []*page, busy []ids.PageNo, st *SuspendStats) error {
	var mod, held []*page
	for _, pg := range pgs {
		switch s := pg.State(); {
		case s == Modified && !pg.aside:
			mod = append(mod, pg)
			held = append(held, pg)
		case s == Shared:
			held = append(held, pg)
		}
	}
	if len(held) == 0 {
		return nil
	}
	wpGap := max(1, wpMergeGap/int(r.pageSize))
	var errs []error
	var kept []ids.PageNo // Modified pages that could not be copied aside
	if len(mod) > 0 {
		aside, err := r.asideFile()
		if err != nil {
			return err
		}
		t := time.Now()
		for _, cl := range r.clientList() {
			wpgs := cl.writablePages(mod)
			for _, wr := range merge(runsOf(wpgs), wpGap, nil) {
				st.WriteProtects++
				err := cl.u.WriteProtect(cl.addr(wr.first), uint64(wr.n)*uint64(r.pageSize), true, 0)
				if err != nil && !clientGone(err) {
					c.log.Warn("write-protect failed", "region", r.id, "page", wr.first, "pages", wr.n, "client", cl.id, "err", err)
					continue
				}
				for _, pg := range wpgs[wr.at : wr.at+wr.held] {
					cl.setWritable(pg.no, false)
				}
			}
		}
		st.WriteProtectTime += time.Since(t)
		t = time.Now()
		for _, run := range runsOf(mod) {
			off, n := int64(run.first)*r.pageSize, int64(run.n)*r.pageSize
			calls, err := copyRange(int(aside.Fd()), r.mf.Fd(), off, n)
			st.Copies += calls
			if err != nil {
				// Not copied: these pages stay in the memfd, Modified
				// and write-protected.
				errs = append(errs, fmt.Errorf("copy aside of %d pages at %s: %w", run.n, run.first, err))
				for _, pg := range mod[run.at : run.at+run.n] {
					kept = append(kept, pg.no)
				}
				continue
			}
			for _, pg := range mod[run.at : run.at+run.n] {
				pg.aside = true
				c.st.aside.Add(1)
			}
			st.Aside += run.n
			st.BytesCopied += n
		}
		st.CopyTime += time.Since(t)
	}
	if len(kept) > 0 {
		held = slices.DeleteFunc(held, func(pg *page) bool { _, ok := slices.BinarySearch(kept, pg.no); return ok })
		busy = slices.Concat(busy, kept)
		slices.Sort(busy)
	}
	blocked := func(from, to ids.PageNo) bool { // a busy page in [from, to)
		i, _ := slices.BinarySearch(busy, from)
		return i < len(busy) && busy[i] < to
	}
	for _, pr := range merge(runsOf(held), math.MaxInt, blocked) {
		st.Punches++
		t := time.Now()
		err := r.mf.PunchHole(int64(pr.first)*r.pageSize, int64(pr.n)*r.pageSize)
		st.PunchTime += time.Since(t)
		if err != nil {
			errs = append(errs, err)
			for _, pg := range held[pr.at : pr.at+pr.held] {
				if pg.aside { // its data is aside and in the memfd: keep the latter
					c.dropAside(pg)
				}
			}
			continue
		}
		st.Punched += pr.held
		for _, pg := range held[pr.at : pr.at+pr.held] {
			if pg.State() == Shared {
				c.setState(pg, Invalid)
			}
		}
	}
	return errors.Join(errs...)
}

// run is a range of pages, first to first+n-1, that covers the pages
// pgs[at:at+held] of the list it was made from (held == n for a run of
// consecutive pages; fewer for runs merged across a gap).
type run struct {
	first ids.PageNo
	at, n int
	held  int
}

// runsOf splits sorted pages into runs of consecutive page numbers.
func runsOf(pgs []*page) []run {
	var out []run
	for i, pg := range pgs {
		if k := len(out) - 1; k >= 0 && out[k].first+ids.PageNo(out[k].n) == pg.no {
			out[k].n++
			out[k].held++
			continue
		}
		out = append(out, run{first: pg.no, at: i, n: 1, held: 1})
	}
	return out
}

// merge joins consecutive runs whose gap is shorter than gap pages and,
// if blocked is set, holds no page it names.
func merge(runs []run, gap int, blocked func(from, to ids.PageNo) bool) []run {
	var out []run
	for _, rn := range runs {
		if k := len(out) - 1; k >= 0 {
			end := out[k].first + ids.PageNo(out[k].n)
			if int(rn.first-end) < gap && (blocked == nil || !blocked(end, rn.first)) {
				out[k].n = int(rn.first-out[k].first) + rn.n
				out[k].held += rn.held
				continue
			}
		}
		out = append(out, rn)
	}
	return out
}

// clientList is a snapshot of r's attached clients.
func (r *region) clientList() []*client {
	r.mu.Lock()
	defer r.mu.Unlock()
	cls := make([]*client, 0, len(r.clients))
	for cl := range r.clients {
		cls = append(cls, cl)
	}
	return cls
}

// Resume ends a suspension: the faults waiting are served, and so are new
// ones. A page set aside is put back into the memfd on its first fault (or
// Access), Modified, with no Coherence call (the tenure was never given
// up); a page that was Shared is a miss through Coherence like any other.
// Evictions and write-backs of pages set aside work as for any Modified
// page (their data comes from the aside copy). Resume while not suspended
// does nothing.
func (c *Cache) Resume() {
	c.suspendMu.Lock()
	defer c.suspendMu.Unlock()
	c.gateMu.Lock()
	defer c.gateMu.Unlock()
	if !c.suspended.Load() {
		return
	}
	c.flight, c.flightEnd = context.WithCancel(c.ctx)
	c.suspended.Store(false)
	c.revoked.Store(false)
	close(c.resumed)
	c.log.Info("resumed")
	// The deadline the page shows again is the last SetLease's: the
	// caller grants a new one before or right after Resume.
	c.publishLease()
}

// DiscardSuspended forgets every page this node holds, as dsmd does when
// its incarnation was removed from the cluster while it was suspended: the
// aside copies are dropped (their data is lost: the tenure that wrote it is
// over) and every page becomes Invalid. It returns how many Modified pages
// were lost, for the caller to log and count (Stats.LostPages counts them
// too). The Cache stays suspended and usable: the clients stay mapped, and
// their memfds are all holes; once a new incarnation serves, Resume, and
// their next faults go through Coherence afresh. Outside a suspension it
// does nothing and returns 0.
func (c *Cache) DiscardSuspended() (lost int) {
	c.suspendMu.Lock()
	defer c.suspendMu.Unlock()
	if !c.suspended.Load() {
		return 0
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0
	}
	regions := make([]*region, 0, len(c.regions))
	for _, r := range c.regions {
		regions = append(regions, r)
	}
	c.mu.Unlock()
	for _, r := range regions {
		lost += c.discardRegion(r)
	}
	c.st.lost.Add(uint64(lost))
	if lost > 0 {
		c.log.Warn("Modified pages discarded with the removed incarnation", "pages", lost)
	}
	return lost
}

func (c *Cache) discardRegion(r *region) (lost int) {
	r.mu.Lock()
	nos := make([]ids.PageNo, 0, len(r.pages))
	for no := range r.pages {
		nos = append(nos, no)
	}
	r.mu.Unlock()
	slices.Sort(nos)
	for _, no := range nos {
		// While suspended a page's lock is held only briefly (a remote
		// action), or by a call that Suspend cancelled and could not wait
		// for.
		pg, err := r.acquire(c.ctx, no)
		if err != nil {
			return lost
		}
		switch pg.State() {
		case Modified:
			lost++
			if !pg.aside {
				// Not revoked (a failed Suspend): drop it from the memfd.
				c.protectAll(r, no)
			}
			fallthrough
		case Shared:
			if err := r.punch(no); err != nil {
				c.log.Warn("discard: punch failed", "region", r.id, "page", no, "err", err)
			}
		}
		if pg.aside {
			pg.aside = false
			c.st.aside.Add(-1)
		}
		c.setState(pg, Invalid)
		r.release(pg)
	}
	// Every aside copy is gone with its page: free the file.
	r.mu.Lock()
	f := r.aside
	r.aside = nil
	r.mu.Unlock()
	if f != nil {
		f.Close()
	}
	return lost
}

// asideFile is r's aside memfd, created on first use: sparse, of the
// region's size, never mapped and never handed to a client.
func (r *region) asideFile() (*os.File, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.aside != nil {
		return r.aside, nil
	}
	fd, err := unix.MemfdCreate("dsm-aside-"+r.name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("aside memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:dsm-aside-"+r.name)
	if err := f.Truncate(r.size); err != nil {
		f.Close()
		return nil, fmt.Errorf("aside memfd: %w", err)
	}
	r.aside = f
	return f, nil
}

func (r *region) asideNow() *os.File {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.aside
}

func (r *region) closeAside() error {
	r.mu.Lock()
	f := r.aside
	r.aside = nil
	r.mu.Unlock()
	if f == nil {
		return nil
	}
	return f.Close()
}

// takeData copies the current contents of locked Modified page pg into dst
// for a caller about to give the page up: from its aside copy, which is
// dropped, if it is set aside; else from the memfd, with every client
// write-protected first so that no store lands after the copy.
func (c *Cache) takeData(pg *page, dst []byte) error {
	r, p := pg.r, pg.no
	if !pg.aside {
		c.protectAll(r, p)
		r.read(p, dst)
		return nil
	}
	if _, err := r.asideNow().ReadAt(dst[:r.pageSize], int64(p)*r.pageSize); err != nil {
		return fmt.Errorf("read aside copy: %w", err)
	}
	c.dropAside(pg)
	return nil
}

// dropAside frees the aside copy of locked page pg, set aside, and
// clears its mark.
func (c *Cache) dropAside(pg *page) {
	r, p := pg.r, pg.no
	f := r.asideNow()
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(p)*r.pageSize, r.pageSize); err != nil {
		c.log.Warn("dropping an aside copy failed", "region", r.id, "page", p, "err", err)
	}
	pg.aside = false
	c.st.aside.Add(-1)
}

// restore puts locked page pg, set aside, back into the memfd (it stays
// Modified) and drops its aside copy.
func (c *Cache) restore(pg *page) error {
	r, p := pg.r, pg.no
	f := r.asideNow()
	off := int64(p) * r.pageSize
	if _, err := copyRange(r.mf.Fd(), int(f.Fd()), off, r.pageSize); err != nil {
		return fmt.Errorf("restore %s/%s from its aside copy: %w", r.id, p, err)
	}
	c.dropAside(pg)
	c.st.restores.Add(1)
	return nil
}

// copyRange copies [off, off+n) of the file src into dst at the same
// offset, and returns how many system calls it took. It uses
// copy_file_range: the kernel copies page by page from one memfd's page
// cache into the other's, with no buffer in user space and no page fault
// in a mapping (pread/pwrite would take two calls and a buffer, and a copy
// through mappings one page fault per page written); where the kernel
// refuses (EXDEV, ENOSYS, EINVAL, EOPNOTSUPP) it falls back to pread and
// pwrite.
func copyRange(dfd, src int, off, n int64) (int, error) {
	calls := 0
	for done := int64(0); done < n; {
		roff, woff := off+done, off+done
		calls++
		k, err := unix.CopyFileRange(src, &roff, dfd, &woff, int(n-done), 0)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EXDEV || err == unix.ENOSYS || err == unix.EINVAL || err == unix.EOPNOTSUPP:
			c, err := copyRangeSlow(dfd, src, off+done, n-done)
			return calls + c, err
		case err != nil:
			return calls, fmt.Errorf("copy_file_range: %w", err)
		case k == 0:
			return calls, fmt.Errorf("copy_file_range: %w", io.ErrUnexpectedEOF)
		}
		done += int64(k)
	}
	return calls, nil
}

func copyRangeSlow(dst, src int, off, n int64) (int, error) {
	buf := make([]byte, min(n, 1<<20))
	calls := 0
	for done := int64(0); done < n; {
		b := buf[:min(int64(len(buf)), n-done)]
		calls += 2
		k, err := unix.Pread(src, b, off+done)
		if err == unix.EINTR {
			continue
		}
		if err != nil || k == 0 {
			return calls, fmt.Errorf("pread: %v (%d bytes)", err, k)
		}
		if _, err := unix.Pwrite(dst, b[:k], off+done); err != nil {
			return calls, fmt.Errorf("pwrite: %w", err)
		}
		done += int64(k)
	}
	return calls, nil
}
