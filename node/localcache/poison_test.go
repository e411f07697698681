//go:build linux

package localcache

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/uffd"
)

// poisonTimeout is the clients' FaultTimeout in these tests, in ms (hex
// for the child's command line: 0xc8 = 200 ms).
const poisonTimeout = "c8"

func skipWithoutPoison(t *testing.T) {
	t.Helper()
	f, err := uffd.Probe()
	if err != nil {
		t.Skipf("no userfaultfd: %v", err)
	}
	if f&uffd.FeaturePoison == 0 {
		t.Skipf("this kernel has no UFFDIO_POISON (features %s)", f)
	}
}

// TestFaultPoisonedWhileUnavailable: a client's fault on a page whose
// misses fail with ErrUnavailable is poisoned once it has waited the
// client's FaultTimeout: the client is told which page and why, its ReadAt
// fails with ErrPageUnavailable and a plain load with a fault (SIGBUS),
// not a hang. The miss goes on in the background; once it succeeds the
// client is told, removes its marker, and the page reads normally.
func TestFaultPoisonedWhileUnavailable(t *testing.T) {
	skipWithoutPoison(t)
	d := newDaemon(t, 0)
	d.home.Put(regionR, 5, le64(0x5555))
	const why = "home n3 failed in epoch 7"
	d.home.setFail(5, fmt.Errorf("test home: page p5 of region r (r1) unavailable: %s: %w", why, ErrUnavailable))

	a := startProc(t, "A", d.sock)
	a.ok("mapt r %s", poisonTimeout)
	got := a.do("readat %x 8", off(5))
	if !strings.HasPrefix(got, "err unavail: ") || !strings.Contains(got, "p5") || !strings.Contains(got, why) {
		t.Fatalf("ReadAt of an unavailable page: %q, want ErrPageUnavailable naming p5 and %q", got, why)
	}
	t.Logf("ReadAt: %s", got)
	if u := a.ok("unavail"); !strings.HasPrefix(u, "5=") || !strings.Contains(u, why) {
		t.Fatalf("Unavailable() = %q, want page 5 and why", u)
	}
	if got := a.do("tryload %x", off(5)); got != "fault" {
		t.Fatalf("plain load of a poisoned page: %q, want a fault", got)
	}
	if s := d.c.Stats(); s.Poisoned != 1 {
		t.Fatalf("Stats.Poisoned = %d, want 1", s.Poisoned)
	}
	// Other pages are served as usual meanwhile.
	a.store(off(6), 66)
	if v := a.load(off(6)); v != 66 {
		t.Fatalf("page 6 reads %d", v)
	}

	// The home is back: the background miss succeeds, the client is told
	// and drops its marker; the page reads with its data.
	d.home.setFail(5, nil)
	eventually(t, "the poisoned page is served again", func() bool { return d.c.Stats().Unpoisoned == 1 })
	eventually(t, "the client forgets the poisoned page", func() bool { return a.ok("unavail") == "" })
	if v := a.load(off(5)); v != 0x5555 {
		t.Fatalf("page 5 reads %#x after it came back, want 0x5555", v)
	}
	if got := a.ok("readat %x 8", off(5)); got != hexOf(le64(0x5555)[:8]) {
		t.Fatalf("ReadAt of page 5 after it came back: %s", got)
	}
	d.quiesce(regionR)
}

// TestFaultPoisonedWhileSuspended: a fault that waits in a suspension
// (dsmd without a lease) longer than the client's FaultTimeout is poisoned
// like one whose home is down, with the reason that dsmd holds no lease;
// a client with a longer FaultTimeout keeps waiting. Once the Cache
// resumes, the poisoned page is served again and reads its data, and the
// waiting fault is served.
func TestFaultPoisonedWhileSuspended(t *testing.T) {
	skipWithoutPoison(t)
	d := newDaemon(t, 0)
	d.home.Put(regionR, 5, le64(0x5555))
	a := startProc(t, "A", d.sock)
	a.ok("mapt r %s", poisonTimeout)
	b := startProc(t, "B", d.sock)
	b.ok("mapt r %s", "2710") // 10 s: longer than the suspension
	d.suspend()

	b.send("readat %x 8", off(5))
	got := a.do("readat %x 8", off(5))
	if !strings.HasPrefix(got, "err unavail: ") || !strings.Contains(got, "p5") || !strings.Contains(got, "no lease") {
		t.Fatalf("ReadAt of a page while suspended past the FaultTimeout: %q, want ErrPageUnavailable naming p5 and the lease", got)
	}
	t.Logf("ReadAt: %s", got)
	if got := a.do("tryload %x", off(5)); got != "fault" {
		t.Fatalf("plain load of the poisoned page: %q, want a fault", got)
	}
	// The count follows the poison, which the client may see first.
	eventually(t, "A's fault poisoned, B's waiting", func() bool {
		s := d.c.Stats()
		return s.Poisoned == 1 && s.FaultsInFlight == 2 // A's retry, B's wait
	})
	unanswered(t, b, "B's ReadAt, within its FaultTimeout")

	d.c.Resume()
	if got := b.reply(); got != "ok "+hexOf(le64(0x5555)[:8]) {
		t.Fatalf("B's ReadAt after Resume: %q", got)
	}
	eventually(t, "the poisoned page is served again", func() bool { return d.c.Stats().Unpoisoned == 1 })
	eventually(t, "the client forgets the poisoned page", func() bool { return a.ok("unavail") == "" })
	if v := a.load(off(5)); v != 0x5555 {
		t.Fatalf("page 5 reads %#x after Resume, want 0x5555", v)
	}
	d.quiesce(regionR)
}

// TestFaultNotPoisonedOnContention: misses that fail for any reason but
// ErrUnavailable (a remote request taking the page: contention) are never
// poisoned, however long they take; nor is the fault of a client that set
// no FaultTimeout.
func TestFaultNotPoisonedOnContention(t *testing.T) {
	skipWithoutPoison(t)
	d := newDaemon(t, 0)
	d.home.Put(regionR, 7, le64(0x77))
	d.home.Put(regionR, 8, le64(0x88))
	d.home.setFail(7, errBusy)
	d.home.setFail(8, fmt.Errorf("test home: down: %w", ErrUnavailable))

	a := startProc(t, "A", d.sock)
	a.ok("mapt r %s", poisonTimeout)
	a.send("readat %x 8", off(7))
	b := startProc(t, "B", d.sock)
	b.ok("map r")
	b.send("readat %x 8", off(8))
	eventually(t, "both misses retried", func() bool { return d.c.Stats().MissErrors >= 20 })
	// Several times the timeout: neither fault is poisoned. (A correct
	// Cache never poisons them; the wait only gives a wrong one the chance.)
	time.Sleep(5 * 200 * time.Millisecond)
	if s := d.c.Stats(); s.Poisoned != 0 || s.FaultsInFlight != 2 {
		t.Fatalf("Poisoned %d, FaultsInFlight %d; want 0 and 2", s.Poisoned, s.FaultsInFlight)
	}
	d.home.setFail(7, nil)
	d.home.setFail(8, nil)
	if got := a.reply(); got != "ok "+hexOf(le64(0x77)[:8]) {
		t.Fatalf("A's ReadAt after the contention: %q", got)
	}
	if got := b.reply(); got != "ok "+hexOf(le64(0x88)[:8]) {
		t.Fatalf("B's ReadAt after the outage: %q", got)
	}
	d.quiesce(regionR)
}

// TestWriteToSharedPagePoisoned: a store to a page the client maps
// read-only (held Shared here) whose upgrade fails with ErrUnavailable is
// poisoned too: dsmd has the client drop its mapping of the page (Unmap),
// then poisons it. The store faults, WriteAt fails with
// ErrPageUnavailable, and once the upgrade succeeds the store goes through.
func TestWriteToSharedPagePoisoned(t *testing.T) {
	skipWithoutPoison(t)
	d := newDaemon(t, 0)
	d.home.Put(regionR, 9, le64(0x99))
	a := startProc(t, "A", d.sock)
	a.ok("mapt r %s", poisonTimeout)
	if v := a.load(off(9)); v != 0x99 {
		t.Fatalf("page 9 reads %#x", v)
	}
	if st := d.state(9); st != Shared {
		t.Fatalf("page 9 is %s after a read, want Shared", st)
	}
	d.home.setFail(9, fmt.Errorf("test home: home n3 failed: %w", ErrUnavailable))
	if got := a.do("trystore %x 1", off(9)); got != "fault" {
		t.Fatalf("store to a Shared page whose home is down: %q, want a fault", got)
	}
	if got := a.do("writeat %x 02", off(9)); !strings.HasPrefix(got, "err unavail: ") || !strings.Contains(got, "n3") {
		t.Fatalf("WriteAt to the poisoned page: %q", got)
	}
	if s := d.c.Stats(); s.Poisoned != 1 {
		t.Fatalf("Stats.Poisoned = %d, want 1", s.Poisoned)
	}
	d.home.setFail(9, nil)
	eventually(t, "the client forgets the poisoned page", func() bool { return a.ok("unavail") == "" })
	a.store(off(9), 3)
	if v := a.load(off(9)); v != 3 || d.state(9) != Modified {
		t.Fatalf("page 9 reads %#x (%s) after the store", v, d.state(9))
	}
	d.quiesce(regionR)
}
