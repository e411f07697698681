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

// A holder whose dsmd is killed loses the lock once its node is declared
// failed (a verdict is a departure: the incarnation's sessions are dead,
// no restart needed), and the waiter gets the lock with ErrOwnerDied. The
// node then restarts, and a process on it takes the lock in turn.
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
	killed := time.Now()
	<-victim.done
	if got := waiter.next(t); got != "owner-died" {
		t.Fatalf("Lock after the holder's dsmd was killed: %q, want owner-died", got)
	}
	t.Logf("the waiter got the lock %v after the holder's dsmd was killed", time.Since(killed).Round(10*time.Millisecond))
	if got := waiter.call(t, "unlock "+lockOff); got != "ok" {
		t.Fatalf("Unlock: %q", got)
	}
	victim.log.Reset()
	victim.start(t)
	c.waitAllAlive(3)
	eventually(t, "a process on the restarted n3 takes the lock", 60*time.Second, func() error {
		out, err := c.client(3, region, "mutex-inc", lockOff, "1", strconv.FormatUint(homes[2]*4096, 10))
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) != "ok" {
			return fmt.Errorf("mutex-inc: %q", out)
		}
		return nil
	})
}
