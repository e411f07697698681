package tests

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestFaultBoundedWithoutLease (docs/failover.md §10, must-hold 5): n2 and
// n3 are stopped, so n1 loses the majority that grants its lease and
// suspends its page cache; without a majority nobody can declare it
// failed, and the suspension lasts as long as the stop. A client of n1 with
// a 3 s fault timeout must not wait for all of it: a ReadAt of a page n1
// never held fails with ErrUnavailable saying that dsmd holds no lease,
// and a plain load of another such page faults with that reason. Before,
// a fault waiting in a suspension was bounded only by the suspension (a
// mapped LoadUint64 waited 55 s in a chaos schedule). Once n2 and n3 run
// again the pages read their data. Only hangs are timed.
func TestFaultBoundedWithoutLease(t *testing.T) {
	longTest(t)
	c := startClusterWith(t, 3, nil)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	const region = "nolease"
	c.createRegion(t, 1, region, 16*4096)
	const readPage, loadPage = 2, 3
	for _, pg := range []int{readPage, loadPage} {
		c.mustCtl(t, 2, "put", region, strconv.Itoa(pg*4096), "data-of-"+strconv.Itoa(pg))
	}
	p := c.startClient(t, 1, region, "-fault-timeout", "3s", "repl")
	if got := p.call(t, "add 0 1 1"); got != "1" {
		t.Fatalf("add: %q, want 1", got)
	}

	stopped := []int{2, 3}
	cont := func() {
		for _, i := range stopped {
			c.nodes[i-1].cmd.Process.Signal(syscall.SIGCONT)
		}
		stopped = nil
	}
	t.Cleanup(cont)
	for _, i := range stopped {
		if err := c.nodes[i-1].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "n1's lease ends", 20*time.Second, func() error {
		if strings.Contains(c.nodes[0].logString(), "lease over") {
			return nil
		}
		return errors.New("n1 has not logged the end of its lease")
	})

	start := time.Now()
	got := p.try(t, "read-at "+strconv.Itoa(readPage*4096)+" 8")
	t.Logf("ReadAt without a lease, after %v: %s", time.Since(start).Round(100*time.Millisecond), got)
	if !strings.HasPrefix(got, "ERR ") || !strings.Contains(got, "unavailable") || !strings.Contains(got, "lease") {
		t.Fatalf("ReadAt while n1 holds no lease: %q, want ErrUnavailable saying that dsmd holds no lease", got)
	}
	start = time.Now()
	got = p.try(t, "try-get-bytes "+strconv.Itoa(loadPage*4096)+" 8")
	t.Logf("plain load without a lease, after %v: %s", time.Since(start).Round(100*time.Millisecond), got)
	if !strings.HasPrefix(got, "fault: ") || !strings.Contains(got, "lease") {
		t.Fatalf("plain load while n1 holds no lease: %q, want a fault saying that dsmd holds no lease", got)
	}

	cont()
	want := hex.EncodeToString([]byte("data-of-" + strconv.Itoa(readPage)))
	eventually(t, "the page reads its data once n2 and n3 run again", 60*time.Second, func() error {
		got := p.try(t, "read-at "+strconv.Itoa(readPage*4096)+" "+strconv.Itoa(len(want)/2))
		if strings.Contains(got, "dsmd unavailable") {
			// The mapping ended with n1's incarnation (a failure verdict
			// after the stop): a new mapping must read the data.
			got = c.mustClient(t, 1, region, "read-at", strconv.Itoa(readPage*4096), strconv.Itoa(len(want)/2))
		}
		if got != want {
			return fmt.Errorf("reads %q", got)
		}
		return nil
	})
}
