//go:build linux

package mapclient

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/mapproto"
)

// The watchdog (docs/failover.md §9, "The library's watchdog") keeps this
// process's accesses to a mapping within dsmd's lease even when dsmd
// cannot revoke them itself (it is stopped, or stuck). dsmd shares its
// lease page (mapproto's lease.go) with the session; the watchdog reads
// until when access is allowed, sleeps until then, and if dsmd has not
// moved the deadline by that time (or says it is suspended) makes the
// whole mapping PROT_NONE, so that every access faults. It checks the page
// again every watchdogPoll while it holds the mapping so, and restores the
// mapping's own protection once the page shows a deadline ahead again
// (dsmd runs and holds a lease). A mapping that died (end) is never
// opened again: end fences it under wmu, after which the watchdog changes
// nothing.
//
// It runs on its own goroutine, locked to its OS thread, which sleeps in
// poll(2) on a timerfd of CLOCK_BOOTTIME (the clock of dsmd's lease, which
// keeps counting through a system suspend, unlike Go's timers) and on an
// eventfd that stops it.

// watchdogPoll is how often the watchdog reads the lease page while it
// holds the mapping inaccessible: how late, at most, access comes back
// once dsmd moves the deadline again.
const watchdogPoll = 10 * time.Millisecond

// watchdog is a mapping's watchdog: the lease page, mapped read-only, and
// the descriptors its thread sleeps on.
type watchdog struct {
	page []byte
	tfd  int // timerfd, CLOCK_BOOTTIME
	efd  int // eventfd: written once to stop the watchdog
	done chan struct{}
}

// newWatchdog maps the lease page fd (taking ownership of fd) and checks
// that it holds a lease record.
func newWatchdog(fd int) (*watchdog, error) {
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("%w: lease page: %v", ErrProtocol, err)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		// Shrunk under the mapping, it would SIGBUS the watchdog.
		return nil, fmt.Errorf("%w: lease page not sealed against shrinking (seals %#x, %v)", ErrProtocol, seals, err)
	}
	size := os.Getpagesize()
	if st.Size < mapproto.LeaseRecordSize || st.Size > int64(size) {
		return nil, fmt.Errorf("%w: lease page of %d bytes", ErrProtocol, st.Size)
	}
	page, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapclient: map the lease page: %w", err)
	}
	if _, err := mapproto.LoadLease(page); err != nil {
		unix.Munmap(page)
		return nil, fmt.Errorf("%w: lease page: %v", ErrProtocol, err)
	}
	w := &watchdog{page: page, tfd: -1, efd: -1, done: make(chan struct{})}
	if w.tfd, err = unix.TimerfdCreate(unix.CLOCK_BOOTTIME, unix.TFD_CLOEXEC); err == nil {
		w.efd, err = unix.Eventfd(0, unix.EFD_CLOEXEC)
	}
	if err != nil {
		w.release()
		return nil, fmt.Errorf("mapclient: watchdog: %w", err)
	}
	return w, nil
}

// release frees what newWatchdog took.
func (w *watchdog) release() {
	unix.Munmap(w.page)
	for _, fd := range []int{w.tfd, w.efd} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// stop tells the watchdog to return; call it once.
func (w *watchdog) stop() {
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	for {
		if _, err := unix.Write(w.efd, one); !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// sleepUntil waits until CLOCK_BOOTTIME reads t or stop is called; false
// means stop.
func (w *watchdog) sleepUntil(t time.Duration) bool {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(int64(t), 1))}
	if err := unix.TimerfdSettime(w.tfd, unix.TFD_TIMER_ABSTIME, &spec, nil); err != nil {
		// Cannot happen with a valid timerfd; sleep on Go's clock instead.
		time.Sleep(watchdogPoll)
		return true
	}
	buf := make([]byte, 8)
	for {
		pfd := []unix.PollFd{{Fd: int32(w.tfd), Events: unix.POLLIN}, {Fd: int32(w.efd), Events: unix.POLLIN}}
		_, err := unix.Poll(pfd, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			time.Sleep(watchdogPoll)
			return true
		}
		if pfd[1].Revents != 0 {
			return false
		}
		if pfd[0].Revents != 0 {
			unix.Read(w.tfd, buf)
			return true
		}
	}
}

// boottime reads CLOCK_BOOTTIME, the clock of the lease page's deadline.
func boottime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 1<<63 - 1 // no clock: every deadline is over
	}
	return time.Duration(ts.Nano())
}

// leaseOpen reports whether the lease page allows access now, and until
// when. A page that cannot be read (dsmd stopped in the middle of a
// write) allows nothing. A dsmd that revoked every local access (state
// revoked) has punched its pages out of the mapping: accesses fault into
// it and wait there, so the mapping may stay open; the watchdog reads
// the page again a poll later.
func leaseOpen(page []byte) (open bool, until time.Duration) {
	l, err := mapproto.LoadLease(page)
	switch {
	case err != nil || l.State == mapproto.LeaseSuspended:
		return false, 0
	case l.State == mapproto.LeaseRevoked:
		return true, boottime() + watchdogPoll
	}
	return boottime() < l.Deadline, l.Deadline
}

// watch is the watchdog's loop (see above).
func (m *Mapping) watch() {
	w := m.wd
	defer close(w.done)
	defer w.release()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for first := true; ; first = false {
		open, until := leaseOpen(w.page)
		m.leaseFence(!open)
		if first {
			close(m.wfirst)
		}
		if !open {
			until = boottime() + watchdogPoll
		}
		if !w.sleepUntil(until) {
			return
		}
	}
}

// leaseFence makes the mapping PROT_NONE (on) or gives it back its own
// protection, while it is live. A refused mprotect changes nothing: the
// watchdog tries again at its next wake.
func (m *Mapping) leaseFence(on bool) {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	if on == m.held || m.state.Load() != live {
		return
	}
	prot := m.prot
	if on {
		prot = unix.PROT_NONE
	}
	if err := unix.Mprotect(m.b, prot); err != nil {
		return
	}
	m.held = on
	m.wgen++
	if on {
		m.heldCount++
	}
	close(m.wchanged)
	m.wchanged = make(chan struct{})
}

// watchGen is the count of the watchdog's changes, to pass to
// waitWatchdog after an access that may fail.
func (m *Mapping) watchGen() uint64 {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	return m.wgen
}

// waitWatchdog is for an access of the mapping from a syscall or a
// recovered fault that failed, gen being watchGen before it: it reports
// whether the failure may be the watchdog's (the mapping is held
// inaccessible now, or was at some point since gen), in which case it
// first waits until the watchdog lets go or the mapping ends, and the
// caller retries. The caller checks Err first: a dead mapping stays held.
//
// The wait is bounded by the mapping's FaultTimeout (none when it is not
// positive): a dsmd that stays stopped or stuck never moves its lease
// page, and its session does not end either, so the access would wait for
// as long (docs/failover.md §10). Past it, err matches ErrPageUnavailable.
func (m *Mapping) waitWatchdog(gen uint64) (retry bool, err error) {
	m.wmu.Lock()
	held, ch, g := m.held, m.wchanged, m.wgen
	m.wmu.Unlock()
	if !held {
		return g != gen, nil
	}
	var timeout <-chan time.Time
	if m.faultTimeout > 0 {
		t := time.NewTimer(m.faultTimeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-ch:
	case <-m.done:
	case <-timeout:
		return false, fmt.Errorf("%w: dsmd has shown no lease for %v (the lease watchdog holds the mapping: dsmd is stopped, stuck or cut off)", ErrPageUnavailable, m.faultTimeout)
	}
	return true, nil
}

// Watchdog reports whether the mapping has a lease watchdog (dsmd gave a
// lease page), whether it holds the mapping inaccessible now, and how
// many times it has made it so.
func (m *Mapping) Watchdog() (on, held bool, times uint64) {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	return m.wd != nil, m.held, m.heldCount
}

// waitLease waits, for Map, until the watchdog lets the new mapping be
// accessible (dsmd holds a lease), bounded by ctx or, without a deadline,
// DefaultTimeout. Without a watchdog it returns at once.
func (m *Mapping) waitLease(ctx context.Context) error {
	if m.wd == nil {
		return nil
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultTimeout)
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	first := m.wfirst
	for {
		m.wmu.Lock()
		held, ch := m.held, m.wchanged
		m.wmu.Unlock()
		if first == nil && !held {
			return nil
		}
		if first != nil {
			ch = first
		}
		select {
		case <-ch:
			if ch == first {
				first = nil
			}
		case <-m.done:
			return m.Err()
		case <-ctx.Done():
			return fmt.Errorf("%w: dsmd holds no lease: %v", ErrUnavailable, ctx.Err())
		case <-t.C:
			return fmt.Errorf("%w: dsmd holds no lease", ErrUnavailable)
		}
	}
}
