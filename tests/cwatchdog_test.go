package tests

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/mapclient/mapclienttest"
	"github.com/dsmkit/dsm/internal/mapproto"
)

// cwatchdogStop is the longest TestCWatchdogStoppedDaemon keeps the dsmd
// stopped: past watchdogBound with room to spare; it continues it as soon
// as the client faulted.
const cwatchdogStop = watchdogBound + 1500*time.Millisecond

// TestCWatchdogStoppedDaemon is TestWatchdogStoppedDaemon for libdsm: a C
// process (cclient watch-loop) maps a region and stores and loads a word
// through the mapping every millisecond, reporting each access that
// succeeded. Its dsmd is then stopped (SIGSTOP), so it cannot take its
// pages back when its lease runs out: libdsm's watchdog must make the
// mapping PROT_NONE, so that no access succeeds later than watchdogBound
// after the stop and the next one raises SIGSEGV, whose handler reports
// that the watchdog held the mapping and exits.
func TestCWatchdogStoppedDaemon(t *testing.T) {
	cclient := filepath.Join(buildClib(t), "cclient")
	c := startCluster(t, 1)
	c.waitHealthy(1)
	n1 := c.nodes[0]
	const region = "cwatchdog"
	if got := runTool(t, nil, cclient, n1.socket, region, "create", "65536"); got != "ok" {
		t.Fatalf("cclient create: %q", got)
	}

	cmd := exec.Command(cclient, n1.socket, region, "watch-loop", "64")
	stderr := &syncWriter{w: &bytes.Buffer{}}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1<<16)
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	stopped := false
	t.Cleanup(func() {
		if stopped {
			n1.cmd.Process.Signal(syscall.SIGCONT)
		}
	})

	var (
		lastOK       time.Duration // CLOCK_BOOTTIME of the last access that succeeded
		oks          int
		fault        string
		afterFault   int // lines after the fault report
		closed       bool
		faultAt      time.Duration
		held, times  uint64
		startedWatch string
	)
	// read takes the client's lines until until, its fault report, its
	// exit, or enough (when not nil) says so after a line.
	read := func(until time.Time, enough func() bool) {
		t.Helper()
		timer := time.NewTimer(time.Until(until))
		defer timer.Stop()
		for !closed {
			select {
			case l, ok := <-lines:
				if !ok {
					closed = true
					return
				}
				switch {
				case fault != "":
					afterFault++
				case strings.HasPrefix(l, "started "):
					startedWatch = strings.TrimPrefix(l, "started ")
				case strings.HasPrefix(l, "ok "):
					var at, v int64
					if _, err := fmt.Sscanf(l, "ok %d %d", &at, &v); err != nil {
						t.Fatalf("cclient: %q: %v", l, err)
					}
					lastOK = time.Duration(at)
					oks++
				case strings.HasPrefix(l, "fault "):
					var at int64
					if _, err := fmt.Sscanf(l, "fault %d %d %d", &at, &held, &times); err != nil {
						t.Fatalf("cclient: %q: %v", l, err)
					}
					fault, faultAt = l, time.Duration(at)
					return
				default:
					t.Fatalf("cclient: unexpected %q (stderr %s)", l, stderr.string())
				}
			case <-timer.C:
				return
			}
			if enough != nil && enough() {
				return
			}
		}
	}

	// The loop runs: accesses succeed under the lease (a dsmd that starts
	// has none for a while, and its faults wait until it has).
	read(time.Now().Add(clientHang), func() bool { return oks > 0 })
	if startedWatch == "" {
		t.Fatalf("cclient watch-loop did not start: %s", stderr.string())
	}
	if startedWatch != "1" {
		t.Fatalf("dsm_watchdog = %s, want 1: the mapping has no lease watchdog", startedWatch)
	}
	read(time.Now().Add(300*time.Millisecond), nil)
	if oks == 0 || fault != "" || closed {
		t.Fatalf("the client's loop does not run: %d accesses, fault %q, exited %v: %s", oks, fault, closed, stderr.string())
	}
	before := oks

	stopAt := boottimeNow()
	if err := n1.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped = true
	read(time.Now().Add(cwatchdogStop), nil)
	if err := n1.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	// The process exits at its fault: nothing may follow the report.
	if fault != "" {
		read(time.Now().Add(clientHang), nil)
	}

	took := lastOK - stopAt
	t.Logf("the last access succeeded %v after SIGSTOP (bound %v), the fault came %v after it; %d accesses before the stop, %d during it",
		took.Round(time.Millisecond), watchdogBound, (faultAt - stopAt).Round(time.Millisecond), before, oks-before)
	if fault == "" {
		t.Fatalf("no fault within %v of SIGSTOP: the client accessed its mapping up to %v after it (exited %v: %s)",
			cwatchdogStop, took, closed, stderr.string())
	}
	if took > watchdogBound {
		t.Fatalf("an access succeeded %v after dsmd was stopped, past its lease (bound %v): the watchdog did not cut the mapping off in time", took, watchdogBound)
	}
	if faultAt < stopAt {
		t.Fatalf("the client faulted before dsmd was stopped: %s", fault)
	}
	if held != 1 || times == 0 {
		t.Fatalf("%s: the fault was not the watchdog's (held %d, times %d)", fault, held, times)
	}
	if afterFault != 0 || !closed {
		t.Fatalf("the client went on after its fault: %d more lines, exited %v", afterFault, closed)
	}
	if err := <-exited; err != nil {
		t.Fatalf("cclient exited with %v after its fault: %s", err, stderr.string())
	}
	exited <- nil // for the cleanup
}

// replProc is a cclient watch-repl process.
type replProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *syncWriter
	exited chan error // its exit status, once
}

// startRepl starts cclient watch-repl against the socket path; it is
// killed at the end of the test.
func startRepl(t *testing.T, cclient, path, region string) *replProc {
	t.Helper()
	return startReplCmd(t, cclient, path, region, "watch-repl")
}

// startReplCmd starts cclient with the command and arguments given (a
// repl: watch-repl or fault-repl) against the socket path; it is killed at
// the end of the test.
func startReplCmd(t *testing.T, cclient, path, region string, args ...string) *replProc {
	t.Helper()
	p := &replProc{t: t, cmd: exec.Command(cclient, append([]string{path, region}, args...)...), lines: make(chan string, 64),
		stderr: &syncWriter{w: &bytes.Buffer{}}, exited: make(chan error, 1)}
	p.cmd.Stderr = p.stderr
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.exited <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		for range p.lines {
		}
	})
	return p
}

// next is the process's next line, waiting at most d; "" when none came.
func (p *replProc) next(d time.Duration) string {
	p.t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("cclient watch-repl exited: %s", p.stderr.string())
		}
		return l
	case <-time.After(d):
		return ""
	}
}

// call sends a command and returns its answer.
func (p *replProc) call(line string) string {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		p.t.Fatal(err)
	}
	l := p.next(clientHang)
	if l == "" {
		p.t.Fatalf("cclient watch-repl: no answer to %q within %v", line, clientHang)
	}
	return l
}

// waitWatchdog waits until the watchdog line reads want.
func (p *replProc) waitWatchdog(want string) {
	p.t.Helper()
	deadline := time.Now().Add(clientHang)
	for {
		got := p.call("watchdog")
		if strings.HasPrefix(got+" ", want+" ") || got == want {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("watchdog %q, want %q", got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// procCount is the number of entries of /proc/PID/dir.
func procCount(t *testing.T, pid int, dir string) int {
	t.Helper()
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/%s", pid, dir))
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// procMaps is /proc/PID/maps.
func procMaps(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// protAt is the protection of the mapping that starts at addr (hex).
func protAt(t *testing.T, pid int, addr string) string {
	t.Helper()
	for _, l := range strings.Split(procMaps(t, pid), "\n") {
		if strings.HasPrefix(l, addr+"-") {
			return strings.Fields(l)[1]
		}
	}
	t.Fatalf("no mapping at %s in the process", addr)
	return ""
}

// TestCWatchdogFakeDaemon drives libdsm's watchdog through a fake dsmd
// whose lease page the test writes (internal/mapclient/mapclienttest), in
// a C process (cclient watch-repl): dsm_map waits for the first lease;
// when the page stops moving, plain loads and stores fault (recovered with
// siglongjmp), the mapping is ---s and an atomic waits, until the lease
// moves again: then the atomic returns, the mapping is rw-s again and the
// data is intact. Suspended holds the mapping, revoked opens it. dsm_unmap
// ends the thread and releases the lease page and its descriptors. A dsmd
// that refuses the lease page feature gives a mapping without a watchdog.
func TestCWatchdogFakeDaemon(t *testing.T) {
	cclient := filepath.Join(buildClib(t), "cclient")
	const region = "wd"
	d := mapclienttest.New(t, mapclienttest.Region{Name: region, ID: 7, Pages: 4})
	lp := d.LeasePage(mapproto.Lease{State: mapproto.LeaseSuspended})

	// dsm_map waits while the page says suspended, and returns once it
	// shows a lease.
	p := startRepl(t, cclient, d.Path, region)
	if l := p.next(300 * time.Millisecond); l != "" {
		t.Fatalf("dsm_map returned without a lease: %q", l)
	}
	stop := lp.Renew(300*time.Millisecond, 20*time.Millisecond)
	defer func() { stop() }()
	var on int
	var addr string
	if l := p.next(clientHang); l == "" {
		t.Fatalf("dsm_map did not return once dsmd held a lease: %s", p.stderr.string())
	} else if _, err := fmt.Sscanf(l, "mapped %d %s", &on, &addr); err != nil || on != 1 {
		t.Fatalf("cclient: %q (%v), want a mapping with a watchdog", l, err)
	}
	pid := p.cmd.Process.Pid
	if got := p.call("store 8 42"); got != "ok" {
		t.Fatalf("store under a lease: %q", got)
	}
	if got := p.call("load 8"); got != "ok 42" {
		t.Fatalf("load under a lease: %q", got)
	}
	// The watchdog held the mapping once already if it looked at the page
	// before the first lease.
	var wdOn, wdHeld, times0 int
	if got := p.call("watchdog"); !scan(got, "%d %d %d", &wdOn, &wdHeld, &times0) || wdOn != 1 || wdHeld != 0 || times0 > 1 {
		t.Fatalf("watchdog under a lease: %q, want 1 0 and 0 or 1 times", got)
	}
	held := func(h, times int) string { return fmt.Sprintf("1 %d %d", h, times0+times) }
	if prot := protAt(t, pid, addr); !strings.HasPrefix(prot, "rw") {
		t.Fatalf("the mapping is %s under a lease", prot)
	}

	// dsmd stops moving the deadline: the watchdog holds the mapping.
	stop()
	stop = func() {}
	p.waitWatchdog(held(1, 1))
	for _, c := range []string{"load 8", "store 8 43", "load 4096"} {
		if got := p.call(c); got != "fault" {
			t.Fatalf("%s past the deadline: %q, want fault", c, got)
		}
	}
	if prot := protAt(t, pid, addr); !strings.HasPrefix(prot, "---") {
		t.Fatalf("the held mapping is %s, want ---", prot)
	}
	// An atomic waits for the lease instead of faulting.
	if _, err := io.WriteString(p.stdin, "aload 8\n"); err != nil {
		t.Fatal(err)
	}
	if l := p.next(200 * time.Millisecond); l != "" {
		t.Fatalf("dsm_load_u64 on a held mapping answered %q, want it to wait", l)
	}
	stop = lp.Renew(300*time.Millisecond, 20*time.Millisecond)
	if l := p.next(clientHang); l != "ok 42" {
		t.Fatalf("dsm_load_u64 once the lease moved: %q, want ok 42 (the faulted store did nothing)", l)
	}
	if got := p.call("watchdog"); got != held(0, 1) {
		t.Fatalf("watchdog once the lease moved: %q, want %s", got, held(0, 1))
	}
	if got := p.call("load 8"); got != "ok 42" {
		t.Fatalf("load once the lease moved: %q", got)
	}
	if prot := protAt(t, pid, addr); !strings.HasPrefix(prot, "rw") {
		t.Fatalf("the mapping is %s once the lease moved, want rw", prot)
	}

	// Suspended holds it; revoked (dsmd took its pages out itself) opens it.
	stop()
	stop = func() {}
	lp.Set(mapproto.Lease{Incarnation: 1, State: mapproto.LeaseSuspended, Epoch: 1})
	p.waitWatchdog(held(1, 2))
	lp.Set(mapproto.Lease{Incarnation: 1, State: mapproto.LeaseRevoked, Epoch: 1})
	p.waitWatchdog(held(0, 2))
	stop = lp.Renew(300*time.Millisecond, 20*time.Millisecond)

	// Atomics in a loop while the watchdog holds and lets go of the mapping
	// three times: each waits or completes, none faults, none is lost.
	var v0 uint64
	if got := p.call("aload 24"); !scan(got, "ok %d", &v0) {
		t.Fatalf("aload: %q", got)
	}
	if _, err := io.WriteString(p.stdin, fmt.Sprintf("aadd-loop 24 %d\n", times0+5)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		time.Sleep(100 * time.Millisecond)
		stop()
		time.Sleep(400 * time.Millisecond) // past the 300 ms lease
		stop = lp.Renew(300*time.Millisecond, 20*time.Millisecond)
	}
	var adds, v uint64
	if got := p.next(clientHang); !scan(got, "ok %d %d", &adds, &v) || adds == 0 || v != v0+adds {
		t.Fatalf("aadd-loop: %q, want ok ADDS %d+ADDS", got, v0)
	}
	t.Logf("%d atomic adds across three holds of the mapping", adds)

	// dsm_unmap ends the thread and releases the page and the descriptors
	// (the session, the userfaultfd, the timerfd and the eventfd).
	threads, fds := procCount(t, pid, "task"), procCount(t, pid, "fd")
	if !strings.Contains(procMaps(t, pid), "fake-lease") {
		t.Fatal("the lease page is not mapped in the client")
	}
	if got := p.call("unmap"); got != "ok" {
		t.Fatalf("unmap: %q", got)
	}
	if n := procCount(t, pid, "task"); n != threads-1 {
		t.Errorf("%d threads after dsm_unmap, %d before: want one fewer", n, threads)
	}
	if n := procCount(t, pid, "fd"); n != fds-4 {
		t.Errorf("%d descriptors after dsm_unmap, %d before: want 4 fewer", n, fds)
	}
	if strings.Contains(procMaps(t, pid), "fake-lease") {
		t.Error("the lease page is still mapped after dsm_unmap")
	}
	// It exits cleanly once its stdin closes (built with a sanitizer, a
	// leak or a race would fail it here).
	p.stdin.Close()
	for range p.lines {
	}
	if err := <-p.exited; err != nil {
		t.Errorf("cclient watch-repl exited with %v after dsm_unmap: %s", err, p.stderr.string())
	}

	// A dsmd that does not know the feature: a mapping without a watchdog.
	d.RefuseFeatures(mapproto.FeatureLeasePage)
	old := startRepl(t, cclient, d.Path, region)
	if l := old.next(clientHang); !strings.HasPrefix(l, "mapped 0 ") {
		t.Fatalf("cclient against a dsmd without the lease page: %q, want mapped 0 (%s)", l, old.stderr.string())
	}
	if got := old.call("store 16 7"); got != "ok" {
		t.Fatalf("store without a watchdog: %q", got)
	}
	if got := old.call("watchdog"); got != "0 0 0" {
		t.Fatalf("watchdog without one: %q", got)
	}
}

// string is what was written so far.
func (s *syncWriter) string() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

// scan is fmt.Sscanf that reports whether every value was read.
func scan(s, format string, v ...any) bool {
	n, err := fmt.Sscanf(s, format, v...)
	return err == nil && n == len(v)
}
