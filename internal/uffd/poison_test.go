//go:build linux

package uffd

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// poisonPage is the resolver that poisons page p.
func (c *client) poisonPage(p int) func(Msg) error {
	return func(Msg) error { return c.u.Poison(c.page(p), uint64(os.Getpagesize()), 0) }
}

// TestPoison is what dsmd does with a fault it gives up on, on this
// kernel: UFFDIO_POISON resolves the waiting fault with SIGBUS (a
// MADV_POPULATE_READ fails with EHWPOISON), every later access fails the
// same way without a fault message, and the client's MADV_DONTNEED of the
// page removes the marker, after which the page faults and is served as
// usual. Punching the file's page does not remove the marker.
func TestPoison(t *testing.T) {
	r := newRegion(t, 4)
	c := startClient(t, "client", r.mf, ModeMissing|ModeWP|ModeMinor)
	if c.feat&FeaturePoison == 0 {
		t.Skipf("the kernel offers no UFFDIO_POISON (features %s)", c.feat)
	}
	if !c.ioctls.Has(IoctlPoison) {
		t.Fatalf("FeaturePoison negotiated but the range supports %s", c.ioctls)
	}
	hwpoison := fmt.Sprintf("failed errno=%d", int(unix.EHWPOISON))

	// A missing page (a hole): the populate waiting on it fails.
	if got := c.do("trypop 0", want{FaultMissing, 0, false, c.poisonPage(0)}); got != hwpoison {
		t.Fatalf("populate of a poisoned page: %q, want %q (EHWPOISON)", got, hwpoison)
	}
	// A load waiting on a minor fault (the page is cached, not mapped) gets
	// SIGBUS.
	r.fill(1, 0x11)
	if got := c.do("tryread 1", want{FaultMinor, 1, false, c.poisonPage(1)}); got != "fault" {
		t.Fatalf("load of a poisoned page: %q, want a fault", got)
	}
	// Later accesses fail at once: no fault message reaches dsmd.
	if got := c.do("tryread 0"); got != "fault" {
		t.Fatalf("second load of a poisoned page: %q", got)
	}
	if got := c.do("trypop 1"); got != hwpoison {
		t.Fatalf("second populate of a poisoned page: %q", got)
	}
	// Poisoning a page already poisoned or mapped changes nothing and
	// says so.
	if err := c.u.Poison(c.page(0), uint64(r.ps), 0); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("poisoning a poisoned page: %v, want EEXIST", err)
	}

	// Punching the file's page leaves the marker.
	r.punch(1)
	if got := c.do("tryread 1"); got != "fault" {
		t.Fatalf("load of a poisoned page after the punch: %q, want a fault", got)
	}

	// The client's MADV_DONTNEED removes the markers: the next access
	// faults normally.
	c.do("droppage 0")
	c.do("droppage 1")
	r.fill(0, 0x5a)
	if got := c.do("read 0", want{FaultMinor, 0, false, c.continuePage(0, 0)}); got != answer(0x5a) {
		t.Fatalf("read after the marker was dropped: %q", got)
	}
	if got := c.do("trypop 1", want{FaultMissing, 1, false, c.copyPage(1, 0x22, 0)}); got != answer(0x22) {
		t.Fatalf("populate after the marker was dropped: %q", got)
	}
	// A mapped page cannot be poisoned.
	if err := c.u.Poison(c.page(0), uint64(r.ps), 0); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("poisoning a mapped page: %v, want EEXIST", err)
	}
	if got := c.do("read 0"); got != answer(0x5a) {
		t.Fatalf("read of the mapped page after a refused poison: %q", got)
	}
	// A write-protected page that the client drops leaves a write-protect
	// marker, which POISON refuses too; clearing the protection of the
	// unmapped page removes it.
	c.protect(0)
	c.do("droppage 0")
	if err := c.u.Poison(c.page(0), uint64(r.ps), 0); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("poisoning over a write-protect marker: %v, want EEXIST", err)
	}
	if err := c.u.WriteProtect(c.page(0), uint64(r.ps), false, DontWake); err != nil {
		t.Fatal(err)
	}
	if err := c.u.Poison(c.page(0), uint64(r.ps), 0); err != nil {
		t.Fatalf("poisoning after the marker was cleared: %v", err)
	}
	if got := c.do("tryread 0"); got != "fault" {
		t.Fatalf("load of the page poisoned after the drop: %q", got)
	}
}

// TestPoisonUnsupported: without FeaturePoison negotiated, Poison says so
// and touches nothing.
func TestPoisonUnsupported(t *testing.T) {
	u := openOrSkip(t, Options{})
	defer u.Close()
	if u.Features()&FeaturePoison != 0 {
		t.Skip("FeaturePoison negotiated by default")
	}
	mp := mapRegion(t, 1)
	if _, err := u.Register(mp.Addr(), uint64(mp.Len()), ModeMissing); err != nil {
		t.Fatal(err)
	}
	if err := u.Poison(mp.Addr(), uint64(mp.Len()), 0); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Poison without the feature: %v, want ErrUnsupported", err)
	}
}
