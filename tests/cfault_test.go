package tests

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/mapclient/mapclienttest"
	"github.com/dsmkit/dsm/internal/mapproto"
	"github.com/dsmkit/dsm/internal/uffd"
)

// needPoison skips a test where this kernel's userfaultfd has no
// UFFDIO_POISON (Linux 6.6): dsmd then never poisons a fault.
func needPoison(t *testing.T) {
	t.Helper()
	f, err := uffd.Probe()
	if err != nil {
		t.Skipf("no userfaultfd: %v", err)
	}
	if f&uffd.FeaturePoison == 0 {
		t.Skipf("this kernel has no UFFDIO_POISON (features %s)", f)
	}
}

// waitUnavail asks the repl for its poisoned pages until it answers want.
func (p *replProc) waitUnavail(want string) {
	p.t.Helper()
	deadline := time.Now().Add(clientHang)
	for {
		got := p.call("unavail")
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("unavail: %q, want %q", got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sendLine writes a line to the repl without waiting for its answer.
func (p *replProc) sendLine(line string) {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		p.t.Fatal(err)
	}
}

// filled is the 8-byte word of a page the fake dsmd serves: every byte
// the page number plus one.
func filled(page int) string {
	return strconv.FormatUint(uint64(page+1)*0x0101010101010101, 10)
}

// TestCFaultFakeDaemon drives libdsm's fault timeouts (dsm_map_ex) through
// a fake dsmd (internal/mapclient/mapclienttest) that plays what dsmd does
// with a fault it gives up on, in a C process (cclient fault-repl). The
// Map carries the timeout. A plain load of a page whose fault the fake
// holds waits; once the fake sends Unavailable and poisons the page, the
// load gets SIGBUS (recovered with siglongjmp), dsm_unavailable lists the
// page with dsmd's reason, and the atomics and dsm_fault_err fail with
// -EHOSTUNREACH naming the page and the reason, while other pages work.
// Available removes the marker: the page is served again. A store to a
// page mapped read-only whose fault the fake holds is poisoned by the
// client itself when the fake sends Poison: the store gets SIGBUS, and so
// do loads, until Available; then the store goes through. dsm_unmap joins
// the session thread and closes its descriptors. dsm_map sends no
// timeout.
func TestCFaultFakeDaemon(t *testing.T) {
	needPoison(t)
	cclient := filepath.Join(buildClib(t), "cclient")
	const region = "ft"
	d := mapclienttest.New(t, mapclienttest.Region{Name: region, ID: 9, Pages: 6})
	ps := os.Getpagesize()
	off := func(page int) string { return strconv.Itoa(page * ps) }
	d.Hold(2)
	d.ReadOnly(3)

	p := startReplCmd(t, cclient, d.Path, region, "fault-repl", "2000")
	if l := p.next(clientHang); !strings.HasPrefix(l, "mapped 0 ") {
		t.Fatalf("cclient fault-repl: %q, want a mapping (without a watchdog: the fake gives no lease page): %s", l, p.stderr.string())
	}
	if s := d.Sessions(); len(s) != 1 || s[0].FaultTimeout != 2*time.Second {
		t.Fatalf("sessions %+v: want one whose Map asked for a fault timeout of 2s", s)
	}
	pid := p.cmd.Process.Pid
	if got := p.call("aload " + off(0)); got != "ok "+filled(0) {
		t.Fatalf("aload of page 0: %q", got)
	}
	if got := p.call("unavail"); got != "none" {
		t.Fatalf("unavail before any poison: %q", got)
	}

	// A plain load of a page whose fault dsmd holds waits; dsmd gives up:
	// Unavailable, then the poison, and the load gets SIGBUS.
	const why = "page p2 of region ft (r9) unavailable: home n3 failed in epoch 7"
	p.sendLine("load " + off(2))
	select {
	case pg := <-d.Faults():
		if pg != 2 {
			t.Fatalf("fault on page %d, want 2", pg)
		}
	case <-time.After(clientHang):
		t.Fatal("the load of page 2 did not fault into the fake dsmd")
	}
	if l := p.next(100 * time.Millisecond); l != "" {
		t.Fatalf("the load of a held page answered %q before dsmd gave up on it", l)
	}
	d.Send(0, mapproto.Msg{Type: mapproto.TypeUnavailable, Page: 2, Text: why})
	if err := d.Poison(0, 2); err != nil {
		t.Fatalf("poisoning page 2: %v", err)
	}
	if l := p.next(clientHang); l != "fault SIGBUS" {
		t.Fatalf("the load of the poisoned page: %q, want fault SIGBUS", l)
	}
	p.waitUnavail("2=" + why)
	wantErr := func(cmd, page, why string) {
		t.Helper()
		got := p.call(cmd)
		if !strings.HasPrefix(got, "err -113 ") || !strings.Contains(got, "page "+page+" ") || !strings.Contains(got, why) {
			t.Fatalf("%s: %q, want err -113 (EHOSTUNREACH) naming page %s and %q", cmd, got, page, why)
		}
	}
	wantErr("aload "+off(2), "2", why)
	wantErr("astore "+off(2)+" 1", "2", why)
	wantErr("faulterr "+off(2), "2", why)
	if got := p.call("load " + off(2)); got != "fault SIGBUS" {
		t.Fatalf("a second load of the poisoned page: %q, want fault SIGBUS", got)
	}
	// Other pages are served as usual meanwhile.
	if got := p.call("aload " + off(1)); got != "ok "+filled(1) {
		t.Fatalf("aload of page 1 while page 2 is poisoned: %q", got)
	}

	// Available: the client removes the marker; the next access faults
	// and is served.
	d.Release(2)
	d.Send(0, mapproto.Msg{Type: mapproto.TypeAvailable, Page: 2})
	p.waitUnavail("none")
	if got := p.call("load " + off(2)); got != "ok "+filled(2) {
		t.Fatalf("load of page 2 once available: %q", got)
	}

	// Poison: a store to a page mapped read-only (as dsmd maps a page held
	// Shared) whose upgrade dsmd gives up on.
	if got := p.call("aload " + off(3)); got != "ok "+filled(3) {
		t.Fatalf("aload of page 3: %q", got)
	}
	const why3 = "page p3 of region ft (r9) unavailable: home n2 is unreachable"
	p.sendLine("store " + off(3) + " 5")
	select {
	case pg := <-d.Faults():
		if pg != 3 {
			t.Fatalf("fault on page %d, want 3", pg)
		}
	case <-time.After(clientHang):
		t.Fatal("the store to the read-only page 3 did not fault into the fake dsmd")
	}
	if err := d.Poison(0, 3); err == nil {
		t.Fatal("the fake dsmd poisoned a page the client maps")
	}
	d.Send(0, mapproto.Msg{Type: mapproto.TypeUnavailable, Page: 3, Text: why3})
	d.Send(0, mapproto.Msg{Type: mapproto.TypePoison, Page: 3})
	if l := p.next(clientHang); l != "fault SIGBUS" {
		t.Fatalf("the store to the page dsmd asked the client to poison: %q, want fault SIGBUS", l)
	}
	p.waitUnavail("3=" + why3)
	if got := p.call("load " + off(3)); got != "fault SIGBUS" {
		t.Fatalf("a load of the page the client poisoned: %q, want fault SIGBUS", got)
	}
	wantErr("aload "+off(3), "3", why3)
	d.Release(3)
	d.Send(0, mapproto.Msg{Type: mapproto.TypeAvailable, Page: 3})
	p.waitUnavail("none")
	if got := p.call("store " + off(3) + " 5"); got != "ok" {
		t.Fatalf("store to page 3 once available: %q", got)
	}
	if got := p.call("load " + off(3)); got != "ok 5" {
		t.Fatalf("load of page 3 after the store: %q", got)
	}

	// dsm_unmap joins the session thread and closes the session, the
	// userfaultfd and the thread's eventfd.
	threads, fds := procCount(t, pid, "task"), procCount(t, pid, "fd")
	if got := p.call("unmap"); got != "ok" {
		t.Fatalf("unmap: %q", got)
	}
	if n := procCount(t, pid, "task"); n != threads-1 {
		t.Errorf("%d threads after dsm_unmap, %d before: want one fewer", n, threads)
	}
	if n := procCount(t, pid, "fd"); n != fds-3 {
		t.Errorf("%d descriptors after dsm_unmap, %d before: want 3 fewer", n, fds)
	}
	p.stdin.Close()
	for range p.lines {
	}
	if err := <-p.exited; err != nil {
		t.Errorf("cclient fault-repl exited with %v after dsm_unmap: %s", err, p.stderr.string())
	}

	// dsm_map asks for no fault timeout.
	q := startRepl(t, cclient, d.Path, region)
	if l := q.next(clientHang); !strings.HasPrefix(l, "mapped ") {
		t.Fatalf("cclient watch-repl: %q: %s", l, q.stderr.string())
	}
	if s := d.Sessions(); len(s) != 2 || s[1].FaultTimeout != 0 {
		t.Fatalf("sessions %+v: want a second one without a fault timeout", s)
	}
}

// TestCFaultTimeout is TestUnavailablePageFails for libdsm: the home and
// the backup of a shard are killed with kill -9 and restarted (new
// incarnations, with empty memory), so no copy of the shard is left. A C
// process on the third node maps the region with a fault timeout of 2 s
// (dsm_map_ex) and touches pages of that shard it never held: an atomic
// load fails with -EHOSTUNREACH naming the departed home instead of
// waiting forever, a plain load gets SIGBUS (recovered with siglongjmp)
// and dsm_fault_err says why, dsm_unavailable lists both pages with
// dsmd's reason, and a page homed at the survivor is read as usual. The
// only thing timed is that nothing hangs (clientHang).
func TestCFaultTimeout(t *testing.T) {
	longTest(t)
	needPoison(t)
	cclient := filepath.Join(buildClib(t), "cclient")
	const region = "cfault"
	c, homes := threeNodesWithRegion(t, region)
	offOf := func(page uint64) string { return strconv.FormatUint(page*4096, 10) }
	first, home, backup, s := c.firstShardCopies(t, region)
	names := func(s string) bool {
		return strings.Contains(s, fmt.Sprintf("n%d", home)) || strings.Contains(s, fmt.Sprintf("n%d", backup))
	}
	const data = "homed-at"
	c.mustCtl(t, s, "put", region, offOf(homes[uint32(s)]), data)

	c.killAndRestart(t, home, backup)
	probe := offOf(first + 3)
	eventually(t, fmt.Sprintf("n%d fails a page of the lost shard as unavailable", s), 60*time.Second, func() error {
		_, errs, code := c.ctl(s, "get", region, probe, "8")
		if code != 0 && strings.Contains(errs, "unavailable") && names(errs) {
			return nil
		}
		return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
	})

	p := startReplCmd(t, cclient, c.nodes[s-1].socket, region, "fault-repl", "2000")
	if l := p.next(clientHang); !strings.HasPrefix(l, "mapped ") {
		t.Fatalf("cclient fault-repl on n%d: %q: %s", s, l, p.stderr.string())
	}

	// An atomic load of a page of the lost shard that the survivor never
	// held fails, naming the home.
	start := time.Now()
	got := p.call("aload " + offOf(first+1))
	if !strings.HasPrefix(got, "err -113 ") || !names(got) || !strings.Contains(got, fmt.Sprintf("page %d ", first+1)) {
		t.Fatalf("dsm_load_u64 of a page of the lost shard: %q; want err -113 (EHOSTUNREACH) naming page %d and n%d or n%d",
			got, first+1, home, backup)
	}
	t.Logf("dsm_load_u64 failed after %v: %s", time.Since(start).Round(100*time.Millisecond), got)

	// A plain load of another such page gets SIGBUS, and the client can
	// say why.
	start = time.Now()
	if got := p.call("load " + offOf(first+2)); got != "fault SIGBUS" {
		t.Fatalf("plain load of a page of the lost shard: %q, want fault SIGBUS", got)
	}
	t.Logf("plain load faulted after %v", time.Since(start).Round(100*time.Millisecond))
	if got := p.call("faulterr " + offOf(first+2)); !strings.HasPrefix(got, "err -113 ") || !names(got) {
		t.Fatalf("dsm_fault_err after the fault: %q, want err -113 naming n%d or n%d", got, home, backup)
	}
	got = p.call("unavail")
	parts := strings.Split(got, ";")
	if len(parts) != 2 || !strings.HasPrefix(parts[0], fmt.Sprintf("%d=", first+1)) || !strings.HasPrefix(parts[1], fmt.Sprintf("%d=", first+2)) ||
		!names(parts[0]) || !names(parts[1]) {
		t.Fatalf("dsm_unavailable: %q, want pages %d and %d, each naming n%d or n%d", got, first+1, first+2, home, backup)
	}

	// The survivor's pages are served as usual.
	var want uint64
	for i := 7; i >= 0; i-- {
		want = want<<8 | uint64(data[i])
	}
	if got := p.call("aload " + offOf(homes[uint32(s)])); got != fmt.Sprintf("ok %d", want) {
		t.Fatalf("n%d reads %q at the page homed at itself, want ok %d", s, got, want)
	}
}
