//go:build linux

package mapclienttest

import (
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/mapproto"
)

// LeasePage is a Daemon's lease page (mapproto's lease.go), which it
// gives to every later session that asks (FeatureLeasePage): a memfd
// sealed as dsmd seals its own, written by the test.
type LeasePage struct {
	fd  int
	mu  sync.Mutex
	mem []byte
}

// LeasePage gives the Daemon a lease page that reads l, for the sessions
// that ask from now on, and returns it. It is released at the end of the
// test.
func (d *Daemon) LeasePage(l mapproto.Lease) *LeasePage {
	d.t.Helper()
	fd, err := unix.MemfdCreate("fake-lease", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		d.t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(ps)); err != nil {
		d.t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		d.t.Fatal(err)
	}
	lp := &LeasePage{fd: fd, mem: mem}
	lp.Set(l)
	seals := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_FUTURE_WRITE | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() {
		lp.mu.Lock()
		defer lp.mu.Unlock()
		unix.Munmap(lp.mem)
		unix.Close(lp.fd)
		lp.mem = nil
	})
	d.mu.Lock()
	d.lease = lp
	d.mu.Unlock()
	return lp
}

// Set writes l into the page, as dsmd does at each grant.
func (lp *LeasePage) Set(l mapproto.Lease) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if lp.mem != nil {
		mapproto.StoreLease(lp.mem, l)
	}
}

// Serving is a lease that holds for d from now on (CLOCK_BOOTTIME).
func Serving(d time.Duration) mapproto.Lease {
	return mapproto.Lease{Incarnation: 1, Deadline: Boottime() + d, State: mapproto.LeaseServing, Epoch: 1}
}

// Boottime reads CLOCK_BOOTTIME, the clock of a lease's deadline.
func Boottime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}

// Renew writes a lease of length into the page every period, as dsmd does
// at each grant, until the returned function is called.
func (lp *LeasePage) Renew(length, period time.Duration) (stop func()) {
	done, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			lp.Set(Serving(length))
			select {
			case <-quit:
				return
			case <-time.After(period):
			}
		}
	}()
	return func() { close(quit); <-done }
}
