//go:build linux

package localcache

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
)

// hold brings locked page pg up to what an access needs (Shared to read,
// Modified to write) through the Coherence engine, or, for a page that
// Suspend set aside, by putting its data back into the memfd. On error the
// page keeps its state. While the Cache is suspended it calls nothing and
// returns errSuspended; so it does when a suspension began during its
// Coherence call and the call failed (Suspend cancels it).
func (c *Cache) hold(ctx context.Context, pg *page, write bool) error {
	if err := c.endErr(); err != nil {
		return err
	}
	if c.suspended.Load() {
		return errSuspended
	}
	r, p := pg.r, pg.no
	switch st := pg.State(); {
	case st == Modified && pg.aside:
		// The tenure was never given up: no protocol action.
		if err := c.restore(pg); err != nil {
			return &missError{err}
		}
	case st == Invalid:
		bp := r.bufs.Get().(*[]byte)
		defer r.bufs.Put(bp)
		buf := *bp
		var err error
		next := Shared
		cctx, done := c.callCtx(ctx)
		if write {
			c.st.writeMisses.Add(1)
			err = c.coh.WriteMiss(cctx, r.id, p, buf)
			next = Modified
		} else {
			c.st.readMisses.Add(1)
			err = c.coh.ReadMiss(cctx, r.id, p, buf)
		}
		done()
		if err != nil && c.suspended.Load() {
			return errSuspended
		}
		if err != nil {
			c.st.missErrors.Add(1)
			return &missError{err}
		}
		r.fill(p, buf)
		c.setState(pg, next)
		c.st.installs.Add(1)
	case st == Shared && write:
		c.st.writeMisses.Add(1)
		c.st.upgrades.Add(1)
		cctx, done := c.callCtx(ctx)
		err := c.coh.WriteMiss(cctx, r.id, p, nil)
		done()
		if err != nil && c.suspended.Load() {
			return errSuspended
		}
		if err != nil {
			c.st.missErrors.Add(1)
			return &missError{err}
		}
		c.setState(pg, Modified)
	}
	return nil
}

// Access runs fn on page p of region rid in the daemon's own mapping, with
// the page held Shared (write false) or Modified (write true) and locked,
// so that the protocol cannot take it away during fn. A miss goes through
// the Coherence engine like a client's fault, and is retried with backoff
// when it fails (a remote request took the page meanwhile) until ctx ends.
// While the Cache is suspended it waits for Resume (or ctx, or Close), at
// most SuspendedCallWait; after End it fails at once with ErrEnded.
//
// While the page is Modified, client processes may map it writable and
// store into it concurrently with fn: fn must use atomic operations on the
// words it shares with them (dsmd's atomics do). fn must not keep the
// slice.
func (c *Cache) Access(ctx context.Context, rid ids.RegionID, p ids.PageNo, write bool, fn func(page []byte)) error {
	r, err := c.region(rid)
	if err != nil {
		return err
	}
	if err := r.checkPage(p); err != nil {
		return err
	}
	backoff := 200 * time.Microsecond
	for {
		pg, err := r.acquire(ctx, p)
		if err != nil {
			return err
		}
		err = c.hold(ctx, pg, write)
		if err == nil {
			fn(r.bytes(p))
		}
		r.release(pg)
		if err == nil {
			c.makeRoom(ctx)
			return nil
		}
		if errors.Is(err, errSuspended) {
			if werr := c.waitServingCall(ctx); werr != nil {
				return fmt.Errorf("localcache: %s/%s: %w", rid, p, werr)
			}
			continue
		}
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("localcache: %s/%s: %w (last miss: %v)", rid, p, cerr, err)
		}
		if errors.Is(err, ErrClosed) || c.ctx.Err() != nil {
			return ErrClosed
		}
		if errors.Is(err, ErrUnavailable) {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-c.ctx.Done():
			t.Stop()
		case <-t.C:
		}
		backoff = min(2*backoff, 50*time.Millisecond)
	}
}

// Flush writes back every page of region rid in [first, first+n) that this
// node holds Modified, as an eviction does (the page leaves the cache), and
// returns how many it wrote back. n 0 means to the end of the region.
// While the Cache is suspended it waits for Resume (or ctx, or Close), at
// most SuspendedCallWait; after End it fails at once with ErrEnded.
func (c *Cache) Flush(ctx context.Context, rid ids.RegionID, first ids.PageNo, n uint64) (int, error) {
	r, err := c.region(rid)
	if err != nil {
		return 0, err
	}
	end := r.npages
	if n != 0 && uint64(first)+n < end {
		end = uint64(first) + n
	}
	// While suspended, what is dirty here is not known for sure (a
	// removed incarnation's pages are discarded, and a Flush that found
	// none would report them written): wait until serving, and list the
	// pages only while serving.
	var dirty []ids.PageNo
	for {
		if err := c.waitServingCall(ctx); err != nil {
			return 0, fmt.Errorf("localcache: write-back of %s: %w", rid, err)
		}
		dirty = dirty[:0]
		r.mu.Lock()
		for no, pg := range r.pages {
			if uint64(no) >= uint64(first) && uint64(no) < end && pg.State() == Modified {
				dirty = append(dirty, no)
			}
		}
		r.mu.Unlock()
		if !c.suspended.Load() {
			break
		}
	}
	slices.Sort(dirty)
	return c.flushPages(ctx, r, dirty)
}

// flushParallel is how many write-backs one Flush keeps under way at once.
// A write-back waits for the home (and, for a durable region, the page
// stores of the home and its backups), so a Flush of many pages one after
// the other pays one round trip and one synced batch per page; with many
// in flight the engine posts them together and the page stores commit
// them in shared batches.
const flushParallel = 32

// flushPages writes back the pages of r in dirty that are still Modified,
// flushParallel at a time, and returns how many it wrote back. After the
// first error it starts no other write-back, waits for those under way,
// and returns that error.
func (c *Cache) flushPages(ctx context.Context, r *region, dirty []ids.PageNo) (int, error) {
	var (
		mu       sync.Mutex
		written  int
		firstErr error
		wg       sync.WaitGroup
	)
	slots := make(chan struct{}, flushParallel)
	for _, no := range dirty {
		slots <- struct{}{}
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed {
			<-slots
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			ok, err := c.flushPage(ctx, r, no, false)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil && firstErr == nil:
				firstErr = err
			case ok:
				written++
			}
		}()
	}
	wg.Wait()
	return written, firstErr
}

// flushPage writes page no back if it is still Modified here. When the
// engine is busy with a remote request for the page, the page's lock is
// released so that the request can proceed, and the write-back is tried
// again: the request either takes the page (its write-back carries this
// node's data, and nothing is left to flush) or leaves it Modified here.
// With always set, a page held Shared or not at all is given up too,
// through Coherence.Evict without data (see WriteBack).
func (c *Cache) flushPage(ctx context.Context, r *region, no ids.PageNo, always bool) (written bool, err error) {
	backoff := 200 * time.Microsecond
	for {
		if err := c.endErr(); err != nil {
			return false, fmt.Errorf("localcache: write-back of %s/%s: %w", r.id, no, err)
		}
		pg, err := r.acquire(ctx, no)
		if err != nil {
			return false, err
		}
		st := pg.State()
		switch {
		case st == Modified:
			err = c.evict(ctx, pg)
		case always:
			err = c.giveUp(ctx, pg)
		default:
			r.release(pg)
			return false, nil
		}
		r.release(pg)
		if errors.Is(err, errSuspended) {
			if werr := c.waitServingCall(ctx); werr != nil {
				return false, fmt.Errorf("localcache: write-back of %s/%s: %w", r.id, no, werr)
			}
			continue
		}
		if err == nil || !errors.Is(err, ErrBusy) {
			return err == nil, err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, fmt.Errorf("localcache: write-back of %s/%s: %w (last: %v)", r.id, no, ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, 20*time.Millisecond)
	}
}

// WriteBack gives page p of region rid up whatever this node's cache holds
// of it (Modified: written back as Flush does; Shared: dropped; nothing:
// nothing to drop) and always tells Coherence.Evict, so that the engine
// writes back a tenure it holds without the cache: the pages that
// engine.WaitReleases reports reclaimed, whose data the cache gave up to a
// release that a move interrupted. While the Cache is suspended it waits
// for Resume, as Flush does.
func (c *Cache) WriteBack(ctx context.Context, rid ids.RegionID, p ids.PageNo) error {
	r, err := c.region(rid)
	if err != nil {
		return err
	}
	if err := r.checkPage(p); err != nil {
		return err
	}
	_, err = c.flushPage(ctx, r, p, true) // waits while suspended
	return err
}

// giveUp drops a locked page that is not Modified here (a Shared copy is
// punched out of every mapping) and tells Coherence.Evict without data.
func (c *Cache) giveUp(ctx context.Context, pg *page) error {
	r, p := pg.r, pg.no
	if c.suspended.Load() {
		return errSuspended
	}
	if pg.State() == Shared {
		if err := r.punch(p); err != nil {
			return err
		}
		c.setState(pg, Invalid)
		c.st.evictions.Add(1)
	}
	cctx, done := c.callCtx(ctx)
	defer done()
	return c.coh.Evict(cctx, r.id, p, nil)
}

// Held lists the pages of region rid in [first, first+n) held here
// (Shared or Modified), with their state. n 0 means to the end.
func (c *Cache) Held(rid ids.RegionID, first ids.PageNo, n uint64) (map[ids.PageNo]State, error) {
	r, err := c.region(rid)
	if err != nil {
		return nil, err
	}
	end := r.npages
	if n != 0 && uint64(first)+n < end {
		end = uint64(first) + n
	}
	out := map[ids.PageNo]State{}
	r.mu.Lock()
	defer r.mu.Unlock()
	for no, pg := range r.pages {
		if st := pg.State(); st != Invalid && uint64(no) >= uint64(first) && uint64(no) < end {
			out[no] = st
		}
	}
	return out, nil
}
