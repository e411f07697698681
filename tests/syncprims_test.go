package tests

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncCluster starts three dsmd processes with a region of 1 MiB.
func syncCluster(t *testing.T, region string) *dsmCluster {
	t.Helper()
	c := startClusterWith(t, 3, nil)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	c.createRegion(t, 1, region, 1<<20)
	return c
}

// concurrently runs one dsmclient command per node at the same time and
// fails t unless each prints want.
func (c *dsmCluster) concurrently(t *testing.T, region, want string, args func(node int) []string) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(c.nodes))
	for i := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := c.client(i+1, region, args(i+1)...)
			if err == nil && strings.TrimSpace(out) != want {
				err = fmt.Errorf("dsmclient on n%d %v: %q, want %q", i+1, args(i+1), out, want)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			c.alive(t)
			t.Fatal(err)
		}
	}
}

// A dsm Barrier shared by processes on three nodes: no process passes a
// generation before all have arrived; when a party is killed, the others
// are told the barrier is broken, naming its session; after a Reset a new
// process takes its place.
func TestBarrierAcrossProcesses(t *testing.T) {
	longTest(t)
	t.Parallel()
	const region = "bar"
	c := syncCluster(t, region)
	// Each process adds to a counter before every Wait, and checks after
	// it that every party's addition is there.
	c.concurrently(t, region, "ok", func(int) []string {
		return []string{"barrier-loop", "0", "3", "15", "8192"}
	})

	// A fresh set of parties on another barrier, one of which is killed.
	const off, parties = "4096", "3"
	var ps []*clientProc
	for i := 1; i <= 3; i++ {
		ps = append(ps, c.startClient(t, i, region, "repl"))
	}
	send := func(p *clientProc, line string) {
		t.Helper()
		if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
			t.Fatalf("dsmclient on n%d: %v", p.node, err)
		}
	}
	for _, p := range ps {
		send(p, "barrier "+off+" "+parties)
	}
	for _, p := range ps {
		if got := p.next(t); got != "passed 0" {
			t.Fatalf("first generation on n%d: %q", p.node, got)
		}
	}
	victim := ps[2].call(t, "session")
	ps[2].kill(t)
	killed := time.Now()
	for _, p := range ps[:2] {
		send(p, "barrier "+off+" "+parties)
	}
	for _, p := range ps[:2] {
		if got, want := p.next(t), "broken session "+victim; got != want {
			t.Fatalf("Wait on n%d with a killed party: %q, want %q", p.node, got, want)
		}
	}
	t.Logf("the waiters were told the barrier is broken %v after the party was killed", time.Since(killed).Round(10*time.Millisecond))
	if got := ps[0].call(t, "barrier "+off+" "+parties); got != "broken session "+victim {
		t.Fatalf("Wait on a broken barrier: %q", got)
	}
	if got := ps[1].call(t, "barrier-reset "+off+" "+parties); got != "ok" {
		t.Fatalf("Reset: %q", got)
	}
	// A new process on n3 takes the dead party's place.
	ps[2] = c.startClient(t, 3, region, "repl")
	for _, p := range ps {
		send(p, "barrier "+off+" "+parties)
	}
	for _, p := range ps {
		// Generation 1 broke; Reset starts generation 3.
		if got := p.next(t); got != "passed 3" {
			t.Fatalf("the generation after Reset on n%d: %q, want passed 3", p.node, got)
		}
	}
}

// A dsm Semaphore shared by processes on three nodes: never more holders
// than its capacity; the units of a killed holder come back to the
// process waiting for them, and those of a process that exits come back
// to the next Acquire that lacks them.
func TestSemaphoreAcrossProcesses(t *testing.T) {
	longTest(t)
	t.Parallel()
	const region = "sem"
	c := syncCluster(t, region)
	c.concurrently(t, region, "ok", func(int) []string {
		return []string{"sem-check", "0", "2", "8192", "15"}
	})

	const off, capacity = "4096", "2"
	holder := c.startClient(t, 1, region, "repl")
	if got := holder.call(t, "sem-acquire "+off+" "+capacity+" 2"); got != "ok" {
		t.Fatalf("Acquire of every unit: %q", got)
	}
	waiter := c.startClient(t, 2, region, "repl")
	if _, err := io.WriteString(waiter.stdin, "sem-acquire "+off+" "+capacity+" 1\n"); err != nil {
		t.Fatal(err)
	}
	// The waiter took the second ticket of the semaphore's queue.
	eventually(t, "the waiter on n2 joins the line", clientHang, func() error {
		if got := strings.TrimSpace(c.mustClient(t, 3, region, "read-u64", off)); got != "2" {
			return fmt.Errorf("ticket word %s", got)
		}
		return nil
	})
	holder.kill(t)
	killed := time.Now()
	if got := waiter.next(t); got != "ok" {
		t.Fatalf("Acquire behind a killed holder: %q", got)
	}
	t.Logf("the waiter got a unit %v after the holder was killed", time.Since(killed).Round(10*time.Millisecond))
	// A process on n3 takes the last unit and exits holding it.
	if got := c.mustClient(t, 3, region, "sem-try", off, capacity, "1"); got != "true" {
		t.Fatalf("TryAcquire of the last unit: %q", got)
	}
	if got := waiter.call(t, "sem-available "+off+" "+capacity); got != "0" {
		t.Fatalf("Available with the exited process's unit not yet taken back: %q", got)
	}
	if got := waiter.call(t, "sem-acquire "+off+" "+capacity+" 1"); got != "ok" {
		t.Fatalf("Acquire of the unit of an exited process: %q", got)
	}
	if got := waiter.call(t, "sem-release "+off+" "+capacity+" 2"); got != "ok" {
		t.Fatalf("Release: %q", got)
	}
	if got := c.mustClient(t, 1, region, "sem-available", off, capacity); got != "2" {
		t.Fatalf("Available at the end: %q, want 2", got)
	}
}
