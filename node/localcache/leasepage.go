//go:build linux

package localcache

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/mapproto"
)

// leasePage is the Cache's lease page (mapproto's lease.go,
// docs/failover.md §9): one memfd of one system page for every session,
// which dsmd writes through its own mapping and clients map read-only. It
// is sealed against growing, shrinking and any new writable mapping
// (F_SEAL_FUTURE_WRITE: a client's mmap with PROT_WRITE, a write(2) and
// an mprotect to writable all fail), so only dsmd's mapping, made before
// the seal, writes it.
type leasePage struct {
	fd  int
	mem []byte

	mu sync.Mutex
	// granted is what SetLease last said; state is written from it and
	// from the Cache's suspension.
	granted mapproto.Lease
	// closed: the page was unmapped; nothing is written any more.
	closed bool
}

func newLeasePage() (*leasePage, error) {
	fd, err := unix.MemfdCreate("dsm-lease", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_NOEXEC_SEAL)
	if errors.Is(err, unix.EINVAL) { // MFD_NOEXEC_SEAL is Linux 6.3
		fd, err = unix.MemfdCreate("dsm-lease", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, fmt.Errorf("localcache: lease page: %w", err)
	}
	size := os.Getpagesize()
	fail := func(what string, err error) (*leasePage, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("localcache: lease page: %s: %w", what, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("size", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	// A first record before any client can see the page: no lease yet.
	if err := mapproto.StoreLease(mem, mapproto.Lease{State: mapproto.LeaseSuspended}); err != nil {
		unix.Munmap(mem)
		return fail("write", err)
	}
	seals := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_FUTURE_WRITE | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		unix.Munmap(mem)
		return fail("seal", err)
	}
	return &leasePage{fd: fd, mem: mem, granted: mapproto.Lease{State: mapproto.LeaseServing}}, nil
}

// publish writes the record: what SetLease granted, unless the Cache is
// suspended or closed (state suspended, deadline 0: in the past) or
// draining (state draining, the deadline as granted). It reads the Cache's
// state under lp.mu, so that of two publishers the one that writes last
// writes the state that holds.
func (lp *leasePage) publish(c *Cache) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if lp.closed {
		return
	}
	c.mu.Lock()
	draining, closed := c.draining != "", c.closed
	c.mu.Unlock()
	l := lp.granted
	switch {
	case c.suspended.Load() && c.revoked.Load() && !closed:
		l.State, l.Deadline = mapproto.LeaseRevoked, 0
	case c.suspended.Load() || closed:
		l.State, l.Deadline = mapproto.LeaseSuspended, 0
	case draining:
		l.State = mapproto.LeaseDraining
	}
	mapproto.StoreLease(lp.mem, l) // the page is ours and aligned: no error
}

// close writes a last record (suspended: dsmd serves nobody any more) and
// unmaps and closes the page; clients keep their mappings of it.
func (lp *leasePage) close() error {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if lp.closed {
		return nil
	}
	lp.closed = true
	l := lp.granted
	l.State, l.Deadline = mapproto.LeaseSuspended, 0
	mapproto.StoreLease(lp.mem, l)
	return errors.Join(unix.Munmap(lp.mem), unix.Close(lp.fd))
}

// SetLease says until when this dsmd's clients may access their mappings:
// the lease page then reads serving until deadline (on CLOCK_BOOTTIME, as
// a duration since boot), with dsmd's incarnation and directory epoch,
// while the Cache is not suspended; while it is, the page reads suspended
// with a deadline in the past, whatever SetLease said. The caller (dsmd's
// lease guard) calls it at every grant, with a deadline early enough that
// a client's watchdog acts before the lease is over (docs/failover.md §9).
// Without Config.LeasePage it does nothing.
func (c *Cache) SetLease(incarnation uint64, deadline time.Duration, epoch uint64) {
	if c.lease == nil {
		return
	}
	c.lease.mu.Lock()
	c.lease.granted = mapproto.Lease{Incarnation: incarnation, Deadline: max(deadline, 0), State: mapproto.LeaseServing, Epoch: epoch}
	c.lease.mu.Unlock()
	c.publishLease()
}

// Lease is what the lease page reads now (for tests and status); ok is
// false without Config.LeasePage.
func (c *Cache) Lease() (l mapproto.Lease, ok bool) {
	if c.lease == nil {
		return mapproto.Lease{}, false
	}
	c.lease.mu.Lock()
	defer c.lease.mu.Unlock()
	if c.lease.closed {
		return mapproto.Lease{}, false
	}
	l, err := mapproto.LoadLease(c.lease.mem)
	return l, err == nil
}

// publishLease writes the lease page from the Cache's state.
func (c *Cache) publishLease() {
	if c.lease == nil {
		return
	}
	c.lease.publish(c)
}
