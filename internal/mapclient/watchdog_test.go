//go:build linux

package mapclient

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/dsmkit/dsm/internal/mapclient/mapclienttest"
	"github.com/dsmkit/dsm/internal/mapproto"
)

// waitHeld waits until the watchdog holds the mapping inaccessible (or
// lets go, !want).
func waitHeld(t *testing.T, m *Mapping, want bool) {
	t.Helper()
	deadline := time.Now().Add(hangDeadline)
	for {
		if _, held, _ := m.Watchdog(); held == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watchdog did not change to held=%v", want)
		}
		time.Sleep(time.Millisecond)
	}
}

// protOf is the protection of the mapping at addr in /proc/self/maps
// ("rw-s", "---s").
func protOf(t *testing.T, b []byte) string {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := fmt.Sprintf("%x-", uintptrOf(b))
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), want) {
			return strings.Fields(sc.Text())[1]
		}
	}
	t.Fatalf("no mapping at %s in /proc/self/maps", want)
	return ""
}

// TestWatchdog: a mapping whose lease page stops moving becomes
// inaccessible once its deadline passes (loads and stores through Bytes()
// fault, ReadAt waits), and gets its own protection (read-write) back,
// data intact, once the deadline moves ahead again.
func TestWatchdog(t *testing.T) {
	d := newFakeDaemon(t, 4)
	lp := d.LeasePage(mapclienttest.Serving(time.Hour))
	stop := lp.Renew(300*time.Millisecond, 20*time.Millisecond)
	defer func() { stop() }()
	_, m := mapRegion(t, d)
	if on, held, _ := m.Watchdog(); !on || held {
		t.Fatalf("Watchdog() = %v, %v; want a watchdog not holding the mapping", on, held)
	}
	data := bytes.Repeat([]byte("lease"), 4*ps/5)
	if _, err := m.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	b := m.Bytes()
	if r := mapclienttest.Touch(b, ps+1, false, hangDeadline); r.Err != nil || r.Faulted || r.V != data[ps+1] {
		t.Fatalf("load under a lease: %+v", r)
	}
	before := protOf(t, b)
	if !strings.HasPrefix(before, "rw") {
		t.Fatalf("the mapping is %s, want read-write", before)
	}

	stop() // dsmd stops moving the deadline
	stop = func() {}
	stopped := time.Now()
	waitHeld(t, m, true)
	t.Logf("held %v after the last grant (a lease of 300 ms)", time.Since(stopped).Round(time.Millisecond))
	for _, a := range []struct {
		off   int
		store bool
	}{{1, false}, {ps + 1, false}, {2*ps + 2, true}} {
		if r := mapclienttest.Touch(b, a.off, a.store, hangDeadline); r.Err != nil || !r.Faulted {
			t.Fatalf("access at %d (store %v) past the deadline: %+v, want a fault", a.off, a.store, r)
		}
	}
	if p := protOf(t, b); !strings.HasPrefix(p, "---") {
		t.Fatalf("the held mapping is %s, want ---", p)
	}
	if err := m.Err(); err != nil {
		t.Fatalf("a held mapping is not dead: Err = %v", err)
	}
	if err := m.FaultErr(1); !errors.Is(err, ErrPageUnavailable) {
		t.Fatalf("FaultErr of a held mapping: %v, want ErrPageUnavailable", err)
	}
	read := make(chan error, 1)
	got := make([]byte, len(data))
	go func() {
		_, err := m.ReadAt(got, 0)
		read <- err
	}()
	select {
	case err := <-read:
		t.Fatalf("ReadAt returned (%v) while the watchdog held the mapping; want it to wait", err)
	case <-time.After(100 * time.Millisecond):
	}

	lp.Set(mapclienttest.Serving(time.Hour)) // dsmd runs again and holds a lease
	waitHeld(t, m, false)
	if err := <-read; err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadAt after the lease came back: %v (data intact: %v)", err, bytes.Equal(got, data))
	}
	if p := protOf(t, b); p != before {
		t.Fatalf("the mapping is %s after the watchdog let go, want %s as before", p, before)
	}
	if r := mapclienttest.Touch(b, ps+1, false, hangDeadline); r.Err != nil || r.Faulted || r.V != data[ps+1] {
		t.Fatalf("load after the lease came back: %+v", r)
	}
	if r := mapclienttest.Touch(b, 3*ps+3, true, hangDeadline); r.Err != nil || r.Faulted {
		t.Fatalf("store after the lease came back: %+v", r)
	}
	if _, _, times := m.Watchdog(); times != 1 {
		t.Fatalf("the watchdog held the mapping %d times, want 1", times)
	}
}

// TestWatchdogSuspended: a page that says dsmd is suspended holds the
// mapping even before its deadline, and so does a page being written
// (dsmd stopped in the middle of a write).
func TestWatchdogSuspended(t *testing.T) {
	d := newFakeDaemon(t, 1)
	lp := d.LeasePage(mapclienttest.Serving(200 * time.Millisecond))
	_, m := mapRegion(t, d)
	suspended := mapclienttest.Serving(time.Hour)
	suspended.State = mapproto.LeaseSuspended
	lp.Set(suspended) // read at the latest at the old deadline
	waitHeld(t, m, true)
	lp.Set(mapclienttest.Serving(time.Hour))
	waitHeld(t, m, false)
}

// TestWatchdogRevoked: a dsmd that says it revoked every local access
// (its pages are out of the mapping, accesses fault into it and wait) has
// the mapping opened again; a serving page past its deadline closes it,
// and revoked opens it again.
func TestWatchdogRevoked(t *testing.T) {
	d := newFakeDaemon(t, 1)
	lp := d.LeasePage(mapclienttest.Serving(200 * time.Millisecond))
	_, m := mapRegion(t, d)
	waitHeld(t, m, true) // the deadline passed
	revoked := mapclienttest.Serving(0)
	revoked.State, revoked.Deadline = mapproto.LeaseRevoked, 0
	lp.Set(revoked)
	waitHeld(t, m, false)
	suspended := revoked
	suspended.State = mapproto.LeaseSuspended
	lp.Set(suspended)
	waitHeld(t, m, true)
	lp.Set(revoked)
	waitHeld(t, m, false)
}

// TestWatchdogNeverReopensADeadMapping: once the session ended, the
// mapping stays inaccessible whatever the lease page says, whether the
// watchdog held it then or not.
func TestWatchdogNeverReopensADeadMapping(t *testing.T) {
	for _, heldFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("held=%v", heldFirst), func(t *testing.T) {
			d := newFakeDaemon(t, 2)
			lp := d.LeasePage(mapclienttest.Serving(time.Hour))
			stop := lp.Renew(200*time.Millisecond, 20*time.Millisecond)
			_, m := mapRegion(t, d)
			if _, err := m.WriteAt([]byte("x"), int64(ps)); err != nil {
				t.Fatal(err)
			}
			if heldFirst {
				stop()
				waitHeld(t, m, true)
			}
			d.Die()
			<-m.Done()
			if !heldFirst {
				stop()
			}
			lp.Set(mapclienttest.Serving(time.Hour))
			time.Sleep(10 * watchdogPoll)
			if r := mapclienttest.Touch(m.Bytes(), ps, false, hangDeadline); r.Err != nil || !r.Faulted {
				t.Fatalf("load of a dead mapping after the lease moved: %+v, want a fault", r)
			}
		})
	}
}

// TestWatchdogOldDaemon: a dsmd that gives no lease page, or refuses the
// Map that asks for one, maps as before, without a watchdog.
func TestWatchdogOldDaemon(t *testing.T) {
	for _, refuses := range []bool{false, true} {
		d := newFakeDaemon(t, 1)
		if refuses {
			d.LeasePage(mapclienttest.Serving(0)) // would hold at once
			d.RefuseFeatures(mapproto.FeatureLeasePage)
		}
		_, m := mapRegion(t, d)
		if on, _, _ := m.Watchdog(); on {
			t.Fatalf("refuses %v: a watchdog without a lease page", refuses)
		}
		if _, err := m.WriteAt([]byte("x"), 0); err != nil {
			t.Fatalf("refuses %v: %v", refuses, err)
		}
	}
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// TestWatchdogMapWaitsForLease: Map returns a mapping only once dsmd holds
// a lease (a new mapping is not handed out inaccessible), and fails with
// ErrUnavailable when ctx ends first.
func TestWatchdogMapWaitsForLease(t *testing.T) {
	d := newFakeDaemon(t, 1)
	d.LeasePage(mapclienttest.Serving(time.Hour)) // for a first mapping, to get a Client
	c, _ := mapRegion(t, d)
	lp := d.LeasePage(mapproto.Lease{State: mapproto.LeaseSuspended}) // the next sessions get this one
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c.Map(ctx, "r"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Map while dsmd holds no lease: %v, want ErrUnavailable", err)
	}
	type result struct {
		m   *Mapping
		err error
	}
	res := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), hangDeadline)
		defer cancel()
		m, err := c.Map(ctx, "r")
		res <- result{m, err}
	}()
	select {
	case r := <-res:
		t.Fatalf("Map returned (%v) while dsmd holds no lease", r.err)
	case <-time.After(100 * time.Millisecond):
	}
	lp.Set(mapclienttest.Serving(time.Hour))
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	if on, held, _ := r.m.Watchdog(); !on || held {
		t.Fatalf("Map after the grant: watchdog %v, held %v", on, held)
	}
	r.m.Close()
}

// TestWatchdogWaitBounded: a dsmd that stops moving its lease page and
// does not come back (stopped, stuck) leaves the watchdog holding the
// mapping and the session open; ReadAt, WriteAt and Word, which wait for
// the watchdog to let go, fail after the mapping's FaultTimeout with
// ErrPageUnavailable instead of waiting for as long. The mapping stays
// alive: once the lease moves again, the same calls work.
func TestWatchdogWaitBounded(t *testing.T) {
	d := newFakeDaemon(t, 4)
	lp := d.LeasePage(mapclienttest.Serving(time.Hour))
	stop := lp.Renew(300*time.Millisecond, 20*time.Millisecond)
	defer func() { stop() }()
	c, _ := mapRegion(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), hangDeadline)
	defer cancel()
	const timeout = 300 * time.Millisecond
	m, err := c.MapWith(ctx, "r", Options{FaultTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.WriteAt([]byte("lease"), 0); err != nil {
		t.Fatal(err)
	}
	stop() // dsmd stops moving the deadline, for good
	stop = func() {}
	waitHeld(t, m, true)
	calls := map[string]func() error{
		"ReadAt":  func() error { _, err := m.ReadAt(make([]byte, 5), 0); return err },
		"WriteAt": func() error { _, err := m.WriteAt([]byte("again"), int64(ps)); return err },
		"Word":    func() error { return m.Word(0, true, func(w *uint64) { *w++ }) },
	}
	for name, call := range calls {
		start := time.Now()
		errc := make(chan error, 1)
		go func() { errc <- call() }()
		select {
		case err := <-errc:
			if !errors.Is(err, ErrPageUnavailable) || !strings.Contains(err.Error(), "no lease") {
				t.Fatalf("%s while dsmd shows no lease: %v, want ErrPageUnavailable saying so", name, err)
			}
			if waited := time.Since(start); waited < timeout {
				t.Fatalf("%s failed after %v, before the fault timeout %v", name, waited, timeout)
			}
		case <-time.After(hangDeadline):
			t.Fatalf("%s waits for good while dsmd shows no lease", name)
		}
	}
	if err := m.Err(); err != nil {
		t.Fatalf("the mapping died: %v", err)
	}
	lp.Set(mapclienttest.Serving(time.Hour)) // dsmd runs again
	waitHeld(t, m, false)
	got := make([]byte, 5)
	if _, err := m.ReadAt(got, 0); err != nil || string(got) != "lease" {
		t.Fatalf("ReadAt after the lease came back: %q, %v", got, err)
	}
}
