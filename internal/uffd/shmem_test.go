//go:build linux

package uffd

import (
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/memfd"
)

const allModes = ModeMissing | ModeWP | ModeMinor

// region is the parent's side of a test region: the memfd ("dsmd's page
// cache") and the parent's own mapping of it.
type region struct {
	t  testing.TB
	mf *memfd.File
	mp *memfd.Mapping
	ps int
}

func newRegion(t testing.TB, pages int) *region {
	t.Helper()
	if _, err := Probe(); err != nil {
		t.Skipf("no userfaultfd here: %v", err)
	}
	ps := os.Getpagesize()
	mf, err := memfd.Create("uffd-test", int64(pages*ps))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mf.Close() })
	mp, err := mf.Map(0, mf.Size(), memfd.ReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mp.Unmap() })
	return &region{t: t, mf: mf, mp: mp, ps: ps}
}

// fill writes page p of the memfd through the parent's mapping (this puts
// the page into the page cache).
func (r *region) fill(p int, v byte) { copy(r.mp.Bytes()[p*r.ps:(p+1)*r.ps], filled(v)) }

// byteAt reads the first byte of page p through the parent's mapping. Only
// use it on pages known to be cached: on a hole it would allocate a page.
func (r *region) byteAt(p int) byte { return r.mp.Bytes()[p*r.ps] }

func (r *region) cached(p int) bool {
	r.t.Helper()
	n, err := r.mf.CachedPages(int64(p*r.ps), int64(r.ps))
	if err != nil {
		r.t.Fatal(err)
	}
	return n == 1
}

func (r *region) punch(p int) {
	r.t.Helper()
	if err := r.mf.PunchHole(int64(p*r.ps), int64(r.ps)); err != nil {
		r.t.Fatal(err)
	}
	if r.cached(p) {
		r.t.Fatalf("page %d still cached after punching it", p)
	}
}

// Resolvers: each is what dsmd does for one kind of fault.
func (c *client) copyPage(p int, v byte, opt Opt) func(Msg) error {
	return func(Msg) error { return c.u.Copy(c.page(p), filled(v), opt) }
}

func (c *client) continuePage(p int, opt Opt) func(Msg) error {
	return func(Msg) error { return c.u.Continue(c.page(p), uint64(os.Getpagesize()), opt) }
}

func (c *client) fillThenContinue(r *region, p int, v byte, opt Opt) func(Msg) error {
	return func(Msg) error {
		if !r.cached(p) {
			r.fill(p, v)
		}
		return c.u.Continue(c.page(p), uint64(r.ps), opt)
	}
}

func (c *client) unprotect(p int) func(Msg) error {
	return func(Msg) error { return c.u.WriteProtect(c.page(p), uint64(os.Getpagesize()), false, 0) }
}

func (c *client) protect(p int) {
	c.t.Helper()
	if err := c.u.WriteProtect(c.page(p), uint64(os.Getpagesize()), true, 0); err != nil {
		c.t.Fatal(err)
	}
}

// TestFaultServiceCrossProcess is the fault service of the design, end to end
// on this kernel: a client process maps dsmd's memfd and hands over its
// userfaultfd; this process (as dsmd) resolves every fault.
func TestFaultServiceCrossProcess(t *testing.T) {
	r := newRegion(t, 16)
	c := startClient(t, "client", r.mf, allModes)
	for _, nr := range []uint{IoctlCopy, IoctlZeroPage, IoctlWriteProtect, IoctlContinue, IoctlWake} {
		if !c.ioctls.Has(nr) {
			t.Fatalf("register MISSING|WP|MINOR on shmem offers %s, lacking request %#x", c.ioctls, nr)
		}
	}
	t.Logf("register on shmem offers %s; child negotiated %s", c.ioctls, c.feat)
	if c.u.Features() != c.feat {
		t.Fatalf("FromFD read features %s from fdinfo, the child negotiated %s", c.u.Features(), c.feat)
	}

	t.Run("read absent page: COPY with WP", func(t *testing.T) {
		c.t = t
		if got := c.do("read 0", want{FaultMissing, 0, false, c.copyPage(0, 0xa1, MapWP)}); got != answer(0xa1) {
			t.Fatalf("child read %q", got)
		}
		if !r.cached(0) || r.byteAt(0) != 0xa1 {
			t.Fatalf("UFFDIO_COPY into the client did not fill the memfd's page cache")
		}
		// A second resolution of the same fault (a re-delivered message) is
		// done already: the kernel says EEXIST, Copy reports success.
		if errno := c.rawCopy(0, 0xff); errno != unix.EEXIST {
			t.Fatalf("copy over a present page: errno %v, want EEXIST", errno)
		}
		if err := c.u.Copy(c.page(0), filled(0xff), MapWP); err != nil {
			t.Fatalf("idempotent copy: %v", err)
		}
		if r.byteAt(0) != 0xa1 {
			t.Fatalf("a refused copy changed the page")
		}
	})

	t.Run("write to read-only page: WP fault, unprotect, zero copy", func(t *testing.T) {
		c.t = t
		c.do("write 0 b2", want{FaultWP, 0, true, c.unprotect(0)})
		if r.byteAt(0) != 0xb2 {
			t.Fatalf("parent sees %#x through its mapping, want the child's store b2", r.byteAt(0))
		}
		c.do("write 0 b3") // writable now: no fault
		if r.byteAt(0) != 0xb3 {
			t.Fatalf("parent sees %#x, want b3", r.byteAt(0))
		}
	})

	t.Run("downgrade: WP on again, next write faults", func(t *testing.T) {
		c.t = t
		c.protect(0)
		if got := c.do("read 0"); got != answer(0xb3) {
			t.Fatalf("read after downgrade: %q", got)
		}
		c.do("write 0 b4", want{FaultWP, 0, true, c.unprotect(0)})
		if r.byteAt(0) != 0xb4 {
			t.Fatalf("parent sees %#x, want b4", r.byteAt(0))
		}
	})

	t.Run("punch out: next access is MISSING and gets new content", func(t *testing.T) {
		c.t = t
		r.punch(0)
		if got := c.do("read 0", want{FaultMissing, 0, false, c.fillThenContinue(r, 0, 0xc5, MapWP)}); got != answer(0xc5) {
			t.Fatalf("child read %q after punch and refill", got)
		}
		c.do("write 0 c6", want{FaultWP, 0, true, c.unprotect(0)})
		if r.byteAt(0) != 0xc6 {
			t.Fatalf("parent sees %#x, want c6", r.byteAt(0))
		}
	})

	t.Run("punch out a write-protected page", func(t *testing.T) {
		c.t = t
		c.protect(0)
		r.punch(0)
		c.do("write 0 c7",
			want{FaultMissing, 0, true, c.copyPage(0, 0xc0, MapWP)},
			want{FaultWP, 0, true, c.unprotect(0)})
		if r.byteAt(0) != 0xc7 {
			t.Fatalf("parent sees %#x, want c7", r.byteAt(0))
		}
	})

	t.Run("punch out a write-protected page: the install mode decides", func(t *testing.T) {
		// Write protection does not outlive the page: installed again
		// without MapWP, the page is writable and the store needs no WP fault.
		c.t = t
		c.protect(0)
		r.punch(0)
		c.do("write 0 c8", want{FaultMissing, 0, true, c.copyPage(0, 0xc0, 0)})
		if r.byteAt(0) != 0xc8 {
			t.Fatalf("parent sees %#x, want c8", r.byteAt(0))
		}
		c.protect(0)
		r.punch(0)
		if got := c.do("read 0", want{FaultMissing, 0, false, c.fillThenContinue(r, 0, 0x99, 0)}); got != answer(0x99) {
			t.Fatalf("child read %q", got)
		}
		c.do("write 0 c9")
		if r.byteAt(0) != 0xc9 {
			t.Fatalf("parent sees %#x, want c9", r.byteAt(0))
		}
	})

	t.Run("cached page: MINOR fault, CONTINUE with WP", func(t *testing.T) {
		c.t = t
		r.fill(1, 0xd1)
		if got := c.do("read 1", want{FaultMinor, 1, false, c.continuePage(1, MapWP)}); got != answer(0xd1) {
			t.Fatalf("child read %q", got)
		}
		if errno := c.rawContinue(1); errno != unix.EEXIST {
			t.Fatalf("continue over a mapped page: errno %v, want EEXIST", errno)
		}
		c.do("write 1 d2", want{FaultWP, 1, true, c.unprotect(1)})
		if r.byteAt(1) != 0xd2 {
			t.Fatalf("parent sees %#x, want d2", r.byteAt(1))
		}
	})

	t.Run("copy onto a cached page the client has not mapped", func(t *testing.T) {
		// UFFDIO_COPY on shmem adds a page to the page cache; if the cache
		// has one already it refuses with EEXIST, even though this client
		// has no PTE for it. The client's access then faults as MINOR.
		c.t = t
		r.fill(6, 0x66)
		if errno := c.rawCopy(6, 0xff); errno != unix.EEXIST {
			t.Fatalf("copy onto a cached page: errno %v, want EEXIST", errno)
		}
		if got := c.do("read 6", want{FaultMinor, 6, false, c.continuePage(6, MapWP)}); got != answer(0x66) {
			t.Fatalf("child read %q", got)
		}
	})

	t.Run("continue without a cached page", func(t *testing.T) {
		c.t = t
		err := c.u.Continue(c.page(2), uint64(r.ps), 0)
		if !errors.Is(err, ErrNotCached) {
			t.Fatalf("continue on a hole: %v, want ErrNotCached", err)
		}
		if r.cached(2) {
			t.Fatal("a failed continue allocated a page")
		}
	})

	t.Run("populate read and write from a syscall", func(t *testing.T) {
		c.t = t
		if got := c.do("popread 3", want{FaultMissing, 3, false, c.copyPage(3, 0xe3, MapWP)}); got != answer(0xe3) {
			t.Fatalf("child read %q", got)
		}
		c.do("popwrite 3 e4", want{FaultWP, 3, true, c.unprotect(3)})
		if r.byteAt(3) != 0xe4 {
			t.Fatalf("parent sees %#x, want e4", r.byteAt(3))
		}
		c.do("popwrite 4 e5", want{FaultMissing, 4, true, c.copyPage(4, 0, 0)})
		if r.byteAt(4) != 0xe5 {
			t.Fatalf("parent sees %#x, want e5", r.byteAt(4))
		}
	})

	t.Run("zeropage", func(t *testing.T) {
		c.t = t
		zero := func(Msg) error { return c.u.ZeroPage(c.page(5), uint64(r.ps), 0) }
		if got := c.do("read 5", want{FaultMissing, 5, false, zero}); got != answer(0) {
			t.Fatalf("child read %q", got)
		}
		if !r.cached(5) {
			t.Fatal("UFFDIO_ZEROPAGE on shmem did not allocate a page-cache page")
		}
	})

	t.Run("client exit", func(t *testing.T) {
		c.t = t
		c.exit()
		err := c.u.Copy(c.page(7), filled(1), 0)
		if !errors.Is(err, ErrProcessGone) {
			t.Fatalf("copy into an exited client: %v, want ErrProcessGone", err)
		}
	})
}

// TestTwoClientsShareWithoutFaults: two client processes map the same memfd;
// once the page is writable in both, their stores are seen by each other (and
// by dsmd's mapping) with no fault at all: the page is one physical page.
func TestTwoClientsShareWithoutFaults(t *testing.T) {
	r := newRegion(t, 8)
	a := startClient(t, "A", r.mf, allModes)
	b := startClient(t, "B", r.mf, allModes)
	const p = 5

	// A reads the absent page; dsmd writes the content into the memfd and
	// maps it read-only in A (fill, then CONTINUE, for a MISSING fault).
	if got := a.do("read 5", want{FaultMissing, p, false, a.fillThenContinue(r, p, 0x11, MapWP)}); got != answer(0x11) {
		t.Fatalf("A read %q", got)
	}
	a.do("write 5 22", want{FaultWP, p, true, a.unprotect(p)})
	// B finds the page cached: a MINOR fault, mapped writable at once.
	if got := b.do("read 5", want{FaultMinor, p, false, b.continuePage(p, 0)}); got != answer(0x22) {
		t.Fatalf("B read %q", got)
	}
	faultsBefore := len(a.faults) + len(b.faults)
	b.do("write 5 33")
	if got := a.do("read 5"); got != answer(0x33) {
		t.Fatalf("A read %q after B's store", got)
	}
	a.do("write 5 44")
	if got := b.do("read 5"); got != answer(0x44) {
		t.Fatalf("B read %q after A's store", got)
	}
	if r.byteAt(p) != 0x44 {
		t.Fatalf("dsmd's mapping sees %#x, want 44", r.byteAt(p))
	}
	if n := len(a.faults) + len(b.faults) - faultsBefore; n != 0 {
		t.Fatalf("%d faults while sharing a writable page", n)
	}

	// Invalidation: punching the page out of the memfd takes it from both.
	r.punch(p)
	if got := a.do("read 5", want{FaultMissing, p, false, a.copyPage(p, 0x55, MapWP)}); got != answer(0x55) {
		t.Fatalf("A read %q after the punch", got)
	}
	if got := b.do("read 5", want{FaultMinor, p, false, b.continuePage(p, MapWP)}); got != answer(0x55) {
		t.Fatalf("B read %q after the punch", got)
	}
	// Both read-only now: a write in either faults.
	b.do("write 5 66", want{FaultWP, p, true, b.unprotect(p)})
	if got := a.do("read 5"); got != answer(0x66) {
		t.Fatalf("A read %q", got)
	}
}

// TestReleaseWhileBlocked records what a client sees when the fault service
// goes away with a fault pending: closing the last copy of the userfaultfd
// unregisters the range and the blocked access completes against the bare
// memfd (a fresh zero page), silently. The client library must therefore
// notice dsmd's death on its socket and stop using the mapping itself.
func TestReleaseWhileBlocked(t *testing.T) {
	r := newRegion(t, 4)
	c := startClient(t, "client", r.mf, allModes)
	if _, err := c.conn.Write([]byte("read 2")); err != nil {
		t.Fatal(err)
	}
	msgs := make([]Msg, 1)
	c.u.SetReadDeadline(time.Now().Add(hangDeadline))
	n, err := c.u.Read(msgs)
	if err != nil || n != 1 || msgs[0].Kind() != FaultMissing || msgs[0].Address != c.page(2) {
		t.Fatalf("read fault: %v %v", msgs[:n], err)
	}
	if err := c.u.Close(); err != nil {
		t.Fatal(err)
	}
	c.u = nil
	select {
	case got := <-c.replies:
		if got != answer(0) {
			t.Fatalf("blocked read completed with %q after the release, want zeros", got)
		}
	case <-time.After(hangDeadline):
		t.Fatal("the blocked client was not released")
	}
	if !r.cached(2) {
		t.Fatal("the released fault did not allocate the page in the memfd")
	}
}

// TestRedeliveredFault: a signal to the thread blocked on a fault makes it
// leave the wait, run the handler and fault again, so the same fault is
// reported twice. Resolving one resolves both; resolving the second again
// is a no-op (EEXIST counts as done).
func TestRedeliveredFault(t *testing.T) {
	r := newRegion(t, 4)
	c := startClient(t, "client", r.mf, allModes)
	if c.feat&FeatureThreadID == 0 {
		t.Skip("no thread ids in fault messages on this kernel")
	}
	if _, err := c.conn.Write([]byte("read 1")); err != nil {
		t.Fatal(err)
	}
	c.u.SetReadDeadline(time.Now().Add(hangDeadline))
	var seen []Msg
	msgs := make([]Msg, 4)
	for len(seen) < 2 {
		n, err := c.u.Read(msgs)
		if err != nil {
			t.Fatalf("read faults: %v (have %v)", err, seen)
		}
		for _, m := range msgs[:n] {
			if m.Kind() != FaultMissing || m.Address != c.page(1) {
				t.Fatalf("unexpected %s", m)
			}
			seen = append(seen, m)
		}
		if len(seen) == 1 {
			// SIGURG is Go's preemption signal: the child ignores a stray one.
			if err := unix.Tgkill(c.cmd.Process.Pid, int(seen[0].TID), unix.SIGURG); err != nil {
				t.Fatal(err)
			}
		}
	}
	if seen[0].TID != seen[1].TID {
		t.Fatalf("re-delivered fault from another thread: %v", seen)
	}
	for _, m := range seen {
		if err := c.u.Copy(m.Address, filled(0x42), MapWP); err != nil {
			t.Fatalf("resolving %s: %v", m, err)
		}
	}
	select {
	case got := <-c.replies:
		if got != answer(0x42) {
			t.Fatalf("child read %q", got)
		}
	case <-time.After(hangDeadline):
		t.Fatal("child not woken")
	}
}

// TestWriteProtectSurvivesMprotect is the check that mapclient's lease
// watchdog relies on (docs/failover.md §9): the watchdog makes a client's
// whole mapping PROT_NONE when dsmd's lease runs out and restores it
// (PROT_READ|PROT_WRITE) when the lease moves again, and neither step may
// lose uffd write protection. A page dsmd write-protected (Shared here,
// or Modified being suspended) must still raise a WP fault on the first
// store after the round trip, or that store would land without dsmd
// knowing; a page mapped writable stays writable with its data. It also
// checks that every access faults while the mapping is PROT_NONE.
func TestWriteProtectSurvivesMprotect(t *testing.T) {
	r := newRegion(t, 4)
	c := startClient(t, "client", r.mf, allModes)
	// Pages 0 and 1 mapped writable in the client with its data.
	c.do("write 0 a0", want{FaultMissing, 0, true, c.copyPage(0, 0, 0)})
	c.do("write 1 a1", want{FaultMissing, 1, true, c.copyPage(1, 0, 0)})
	// Page 0 write-protected, as dsmd does on a downgrade or a suspension.
	c.protect(0)

	for _, prot := range []string{"rw", "r"} {
		t.Run("round trip to "+prot, func(t *testing.T) {
			c.t = t
			c.do("prot none")
			if got := c.do("tryread 0"); got != "fault" {
				t.Fatalf("load of a mapped page under PROT_NONE: %q, want a fault", got)
			}
			if got := c.do("tryread 1"); got != "fault" {
				t.Fatalf("load of a writable page under PROT_NONE: %q, want a fault", got)
			}
			c.do("prot " + prot)
			if got := c.do("read 0"); got != answer(0xa0) {
				t.Fatalf("page 0 after the round trip: %q", got)
			}
			if got := c.do("read 1"); got != answer(0xa1) {
				t.Fatalf("page 1 after the round trip: %q", got)
			}
		})
	}
	c.t = t
	c.do("prot rw")
	// The write protection survived both round trips: the first store to
	// page 0 is a WP fault, and only after it is resolved does it land.
	c.do("write 0 b0", want{FaultWP, 0, true, c.unprotect(0)})
	if r.byteAt(0) != 0xb0 {
		t.Fatalf("parent sees %#x on page 0, want the client's store b0", r.byteAt(0))
	}
	// Page 1 was never write-protected: it stores without a fault.
	c.do("write 1 b1")
	if r.byteAt(1) != 0xb1 {
		t.Fatalf("parent sees %#x on page 1, want b1", r.byteAt(1))
	}
	// And a WP set while the mapping is PROT_NONE holds after it too.
	c.do("prot none")
	c.protect(1)
	c.do("prot rw")
	c.do("write 1 c1", want{FaultWP, 1, true, c.unprotect(1)})
	if r.byteAt(1) != 0xc1 {
		t.Fatalf("parent sees %#x on page 1, want c1", r.byteAt(1))
	}
}
