package tests

import (
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"
)

// failedStop is how long TestFailedIncarnationEndsCalls keeps n1 stopped:
// past the leader's failure verdict on a member it has not granted a lease
// for three lease lengths and a period (4.75 s), an election included.
const failedStop = 8 * time.Second

// TestFailedIncarnationEndsCalls (docs/failover.md §10, must-hold 5): a
// client process on n1 calls AddUint64 through its mapping while n1's dsmd
// is stopped (SIGSTOP) for longer than the failure detector waits, so the
// call waits (the library's watchdog holds the mapping: dsmd has no lease).
// After SIGCONT, n1 learns that the cluster declared it failed and starts
// a new incarnation in the same process. The call, tied to a session of the
// old incarnation, must fail then, with dsmd unavailable and a message that
// says the incarnation was declared failed, not wait until the old
// incarnation's Close gets to the page cache (it stops the RPC server
// first, for up to 5 s) and end with a bare "dsmd unavailable", as it did
// in the chaos schedules of seeds 660007 and 660008. Only hangs are timed.
func TestFailedIncarnationEndsCalls(t *testing.T) {
	c := startClusterWith(t, 3, nil)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	const region = "failedinc"
	c.createRegion(t, 1, region, 16*4096)
	p := c.startClient(t, 1, region, "repl")
	if got := p.call(t, "add 0 1 1"); got != "1" {
		t.Fatalf("add: %q, want 1", got)
	}
	n1 := c.nodes[0]
	stopped := false
	t.Cleanup(func() {
		if stopped {
			n1.cmd.Process.Signal(syscall.SIGCONT)
		}
	})
	if err := n1.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped = true
	// Past the lease page's deadline: the watchdog holds the mapping, and
	// the call waits.
	time.Sleep(2 * time.Second)
	if _, err := io.WriteString(p.stdin, "add 0 1 1\n"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(failedStop - 2*time.Second)
	select {
	case l := <-p.lines:
		t.Fatalf("the add answered %q while n1's dsmd was stopped", l)
	default:
	}
	if err := n1.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	cont := time.Now()

	var answer string
	select {
	case l, ok := <-p.lines:
		if !ok {
			<-p.done
			t.Fatalf("dsmclient exited: %v: %s", p.err, p.stderrString())
		}
		answer = l
	case <-time.After(clientHang):
		t.Fatalf("the add still waits %v after SIGCONT\n%s", clientHang, tail(n1.logString(), 4000))
	}
	took := time.Since(cont)
	eventually(t, "n1 starts a new incarnation (the test needs a failure verdict during the stop)", 30*time.Second, func() error {
		if !strings.Contains(n1.logString(), "starting a new incarnation") {
			return fmt.Errorf("not yet; the add answered %q", answer)
		}
		return nil
	})
	t.Logf("the add answered %v after SIGCONT: %s", took.Round(10*time.Millisecond), answer)
	if !strings.HasPrefix(answer, "ERR ") || !strings.Contains(answer, "dsmd unavailable") || !strings.Contains(answer, "declared failed") {
		t.Fatalf("the add waiting on n1's failed incarnation: %q; want it to fail with dsmd unavailable, saying that the incarnation was declared failed", answer)
	}
}
