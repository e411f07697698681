package tests

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
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
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
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
					t.Fatalf("cclient: unexpected %q (stderr %s)", l, stderr.String())
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
		t.Fatalf("cclient watch-loop did not start: %s", stderr.String())
	}
	if startedWatch != "1" {
		t.Fatalf("dsm_watchdog = %s, want 1: the mapping has no lease watchdog", startedWatch)
	}
	read(time.Now().Add(300*time.Millisecond), nil)
	if oks == 0 || fault != "" || closed {
		t.Fatalf("the client's loop does not run: %d accesses, fault %q, exited %v: %s", oks, fault, closed, stderr.String())
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
			cwatchdogStop, took, closed, stderr.String())
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
		t.Fatalf("cclient exited with %v after its fault: %s", err, stderr.String())
	}
	exited <- nil // for the cleanup
}
