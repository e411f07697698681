package tests

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSyncAcrossLanguages runs the Barrier and the Semaphore of the Go
// library, libdsm (C) and the Python package against the same region
// words on three nodes: parties in all three languages pass generations
// in step; holders in all three never exceed the semaphore's capacity;
// a C party that is killed breaks the barrier, and a Go and a Python
// waiter are told so, naming the C process's session; a Go party that is
// killed is found dead by a Python waiter (through libdsm); the units of
// a killed Go holder and of an exited C holder come back to C acquirers.
func TestSyncAcrossLanguages(t *testing.T) {
	longTest(t)
	t.Parallel()
	if testing.Short() {
		t.Skip("starts dsmd processes; skipped with -short")
	}
	lib := buildClib(t)
	py := python(t)
	const region = "xsync"
	c := syncCluster(t, region)
	sock := func(n int) string { return c.nodes[n-1].socket }
	cclient := filepath.Join(lib, "cclient")
	root := repoRoot(t)
	pyEnv := []string{"DSM_LIBRARY=" + filepath.Join(lib, "libdsm.so"), "PYTHONPATH=" + filepath.Join(root, "clients", "python"),
		"PYTHONDONTWRITEBYTECODE=1"}
	worker := filepath.Join(root, "tests", "internal", "pyclient", "worker.py")
	// all runs the workers at once and fails t unless each prints "ok".
	all := func(what string, workers ...func() (string, error)) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, len(workers))
		start := time.Now()
		for _, f := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if out, err := f(); err != nil || strings.TrimSpace(out) != "ok" {
					errs <- fmt.Errorf("%s: %q, %v", what, out, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		t.Logf("%s in %v", what, time.Since(start).Round(time.Millisecond))
	}

	// One barrier of four parties: Go on n1, C on n2 and on n1, Python on
	// n3. Each adds to a counter before every Wait and checks after it
	// that every party's addition is there.
	const gens = "10"
	goParty := func(node int, args ...string) func() (string, error) {
		return func() (string, error) { return c.client(node, region, args...) }
	}
	all("4 parties (Go, C, C, Python on three nodes) through "+gens+" generations of a barrier",
		goParty(1, "barrier-loop", "0", "4", gens, "8192"),
		clientTool(nil, cclient, sock(2), region, "barrier-loop", "0", "4", gens, "8192"),
		clientTool(nil, cclient, sock(1), region, "barrier-loop", "0", "4", gens, "8192"),
		clientTool(pyEnv, py, worker, sock(3), region, "barrier-loop", "0", "4", gens, "8192"))
	if got := c.mustClient(t, 2, region, "read-u64", "8192"); got != strconv.Itoa(4*10) {
		t.Fatalf("barrier counter %s after 4 parties x 10 generations", got)
	}

	// A semaphore of 2 used from Go, C and Python at once: a counter of
	// the holders inside never passes 2 (each checks it; the most any saw
	// is kept at 8208).
	const semOff, capacity, inside, most, rounds = "4096", "2", "8200", "8208", "15"
	all("4 holders (Go, C, C, Python) of a semaphore of 2, "+rounds+" rounds each",
		goParty(1, "sem-check", semOff, capacity, inside, rounds, most),
		clientTool(nil, cclient, sock(2), region, "sem-check", semOff, capacity, inside, rounds, most),
		clientTool(nil, cclient, sock(3), region, "sem-check", semOff, capacity, inside, rounds, most),
		clientTool(pyEnv, py, worker, sock(3), region, "sem-check", semOff, capacity, inside, rounds, most))
	if got := c.mustClient(t, 1, region, "read-u64", most); got != "1" && got != "2" {
		t.Fatalf("most holders seen inside the semaphore of 2: %s", got)
	}
	if got := c.mustClient(t, 2, region, "sem-available", semOff, capacity); got != "2" {
		t.Fatalf("semaphore units free at the end: %s, want 2", got)
	}

	barrierDeadCParty(t, c, region, cclient, clientTool(pyEnv, py, worker, sock(3), region, "barrier-twice", "16384", "3"))
	barrierDeadGoParty(t, c, region, clientTool(pyEnv, py, worker, sock(3), region, "barrier-twice", "24576", "2"))
	semaphoreDeadHolders(t, c, cclient)
}

// semaphoreDeadHolders: a Go process on n1 holds both units of a semaphore
// and is killed; a C acquirer waiting on n2 gets a unit (it found the Go
// holder dead) and exits holding it; a C TryAcquire of both units on n3
// takes them (it found the exited C holder dead).
func semaphoreDeadHolders(t *testing.T, c *dsmCluster, cclient string) {
	const region, off, capacity = "xsync", "20480", "2"
	holder := c.startClient(t, 1, region, "repl")
	if got := holder.call(t, "sem-acquire "+off+" "+capacity+" 2"); got != "ok" {
		t.Fatalf("Go Acquire of both units: %q", got)
	}
	acquired := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), clientHang)
		defer cancel()
		out, err := exec.CommandContext(ctx, cclient, c.nodes[1].socket, region, "sem-acquire", off, capacity, "1").CombinedOutput()
		acquired <- fmt.Sprintf("%s%v", out, err)
	}()
	// The C acquirer took the second ticket of the semaphore's queue.
	eventually(t, "the C acquirer on n2 joins the line", clientHang, func() error {
		if got := strings.TrimSpace(c.mustClient(t, 3, region, "read-u64", off)); got != "2" {
			return fmt.Errorf("ticket word %s", got)
		}
		return nil
	})
	holder.kill(t)
	killed := time.Now()
	if got := <-acquired; got != "ok\n<nil>" {
		t.Fatalf("C Acquire behind a killed Go holder: %q", got)
	}
	t.Logf("the C acquirer got a unit %v after the Go holder was killed", time.Since(killed).Round(10*time.Millisecond))
	if got := runTool(t, nil, cclient, c.nodes[2].socket, region, "sem-try", off, capacity, "2"); got != "true" {
		t.Fatalf("C TryAcquire of both units, one held by an exited C process: %q", got)
	}
}

// barrierDeadCParty: three parties (C on n1, Go on n2, Python on n3) pass
// generation 0; the C process is killed; the Go and Python parties, waiting
// in generation 1, are told the barrier is broken, naming the C session.
func barrierDeadCParty(t *testing.T, c *dsmCluster, region, cclient string, pyTwice func() (string, error)) {
	const off, parties = "16384", "3"
	holder := exec.Command(cclient, c.nodes[0].socket, region, "barrier-hold", off, parties)
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	lines := bufio.NewScanner(out)
	line := func() string {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("C party: no output: %v", lines.Err())
		}
		return lines.Text()
	}
	session, ok := strings.CutPrefix(line(), "session ")
	if !ok {
		t.Fatalf("C party: no session line")
	}
	type result struct {
		out string
		err error
	}
	pyDone := make(chan result, 1)
	go func() { o, err := pyTwice(); pyDone <- result{o, err} }()
	waiter := c.startClient(t, 2, region, "repl")
	if got := waiter.call(t, "barrier "+off+" "+parties); got != "passed 0" {
		t.Fatalf("Go party, generation 0: %q", got)
	}
	if got := line(); got != "passed 0" {
		t.Fatalf("C party, generation 0: %q", got)
	}
	holder.Process.Kill()
	holder.Wait()
	killed := time.Now()
	want := "broken session " + session
	if got := waiter.call(t, "barrier "+off+" "+parties); got != want {
		t.Fatalf("Go Wait with the C party killed: %q, want %q", got, want)
	}
	t.Logf("the Go waiter was told the barrier is broken %v after the C party was killed", time.Since(killed).Round(10*time.Millisecond))
	r := <-pyDone
	if r.err != nil || r.out != "passed 0\n"+want+"\n" {
		t.Fatalf("Python party: %q, %v; want passed 0, then %s", r.out, r.err, want)
	}
}

// barrierDeadGoParty: two parties (Go on n1, Python on n3) pass generation
// 0; the Go process is killed; the Python party, the only waiter, finds it
// dead through libdsm and is told the barrier is broken, naming it.
func barrierDeadGoParty(t *testing.T, c *dsmCluster, region string, pyTwice func() (string, error)) {
	const off, parties = "24576", "2"
	goParty := c.startClient(t, 1, region, "repl")
	session := goParty.call(t, "session")
	type result struct {
		out string
		err error
	}
	pyDone := make(chan result, 1)
	go func() { o, err := pyTwice(); pyDone <- result{o, err} }()
	if got := goParty.call(t, "barrier "+off+" "+parties); got != "passed 0" {
		t.Fatalf("Go party, generation 0: %q", got)
	}
	goParty.kill(t)
	if r := <-pyDone; r.err != nil || r.out != "passed 0\nbroken session "+session+"\n" {
		t.Fatalf("Python party with the Go party killed: %q, %v; want passed 0, then broken session %s", r.out, r.err, session)
	}
}
