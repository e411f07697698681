package tests

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The dsm Mutex does not stay locked for good when a process that holds it
// or waits for it dies: the waiter next in line asks dsmd whether the head
// of the line is dead and skips it. A dead holder is reported to the next
// acquirer (ErrOwnerDied), a dead waiter is skipped silently. The
// processes run on three different nodes.
func TestMutexSurvivesDeadProcesses(t *testing.T) {
	t.Parallel()
	c := startClusterWith(t, 3, nil)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	const region = "mx"
	c.createRegion(t, 1, region, 1<<20)

	// tickets waits until the ticket word reads n (n tickets taken).
	tickets := func(n int) {
		t.Helper()
		deadline := time.Now().Add(clientHang)
		for {
			got := strings.TrimSpace(c.mustClient(t, 2, region, "read-u64", "0"))
			if v, err := strconv.Atoi(got); err == nil && v >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("ticket word %s, want %d", got, n)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	send := func(p *clientProc, line string) {
		t.Helper()
		if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
			t.Fatalf("dsmclient on n%d: %v", p.node, err)
		}
	}

	// A holder on n1 dies holding the lock while a process on n2 waits.
	holder := c.startClient(t, 1, region, "repl")
	if got := holder.call(t, "lock 0"); got != "ok" {
		t.Fatalf("first Lock: %q", got)
	}
	waiter := c.startClient(t, 2, region, "repl")
	send(waiter, "lock 0")
	tickets(2)
	killed := time.Now()
	holder.kill(t)
	if got := waiter.next(t); got != "owner-died" {
		t.Fatalf("Lock after the holder was killed: %q, want owner-died", got)
	}
	t.Logf("the waiter got the lock %v after the holder was killed, with ErrOwnerDied", time.Since(killed).Round(10*time.Millisecond))
	if got := waiter.call(t, "unlock 0"); got != "ok" {
		t.Fatalf("Unlock after ErrOwnerDied: %q", got)
	}

	// A waiter on n1 dies in line behind a holder on n3; the process on
	// n2 behind it gets the lock once the holder unlocks, plainly.
	holder3 := c.startClient(t, 3, region, "repl")
	if got := holder3.call(t, "lock 0"); got != "ok" {
		t.Fatalf("Lock on n3: %q", got)
	}
	doomed := c.startClient(t, 1, region, "repl")
	send(doomed, "lock 0")
	tickets(4)
	send(waiter, "lock 0")
	tickets(5)
	doomed.kill(t)
	unlocked := time.Now()
	if got := holder3.call(t, "unlock 0"); got != "ok" {
		t.Fatalf("Unlock on n3: %q", got)
	}
	if got := waiter.next(t); got != "ok" {
		t.Fatalf("Lock behind a killed waiter: %q, want ok", got)
	}
	t.Logf("the lock passed over the killed waiter in %v", time.Since(unlocked).Round(10*time.Millisecond))
	if got := waiter.call(t, "unlock 0"); got != "ok" {
		t.Fatalf("Unlock: %q", got)
	}
	// The lock is free: a fresh process takes it at once.
	if got := c.mustClient(t, 3, region, "mutex-inc", "0", "1", "4096"); got != "ok" {
		t.Fatalf("mutex-inc after: %q", got)
	}
}

// A holder whose dsmd is killed keeps the lock while its node is only
// failed (it may be alive behind a partition), and loses it once its dsmd
// restarts: the old incarnation's sessions are dead, and the waiter gets
// the lock with ErrOwnerDied.
func TestMutexHolderOfARestartedNode(t *testing.T) {
	t.Parallel()
	const region = "mxr"
	c, homes := threeNodesWithRegion(t, region)
	lockOff := fmt.Sprint(homes[1] * 4096) // a page homed at n1, which stays up

	holder := c.startClient(t, 3, region, "repl")
	if got := holder.call(t, "lock "+lockOff); got != "ok" {
		t.Fatalf("Lock on n3: %q", got)
	}
	waiter := c.startClient(t, 2, region, "repl")
	if _, err := io.WriteString(waiter.stdin, "lock "+lockOff+"\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the waiter on n2 takes a ticket", clientHang, func() error {
		if got := strings.TrimSpace(c.mustClient(t, 1, region, "read-u64", lockOff)); got != "2" {
			return fmt.Errorf("ticket word %s", got)
		}
		return nil
	})

	victim := c.nodes[2]
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	// Failed is not dead: the lock stays with the holder.
	select {
	case l := <-waiter.lines:
		t.Fatalf("the waiter got %q while the holder's node was only failed", l)
	case <-time.After(5 * time.Second):
	}
	victim.log.Reset()
	victim.start(t)
	restarted := time.Now()
	c.waitAllAlive(3)
	if got := waiter.next(t); got != "owner-died" {
		t.Fatalf("Lock after the holder's dsmd restarted: %q, want owner-died", got)
	}
	t.Logf("the waiter got the lock %v after the holder's dsmd was started again", time.Since(restarted).Round(10*time.Millisecond))
	if got := waiter.call(t, "unlock "+lockOff); got != "ok" {
		t.Fatalf("Unlock: %q", got)
	}
}
