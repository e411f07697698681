package tests

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsmkit/dsm/dsm"
)

// TestCMutexFarBackInLine: libdsm's mutex does what the Go library's does
// for a waiter too far back in the line to record itself (eight tickets or
// more behind the head). A C timed lock nine tickets back, behind a live Go
// holder and eight Go waiters, returns a timeout once its deadline passes
// instead of waiting until it can record itself; the ticket it leaves is
// skipped by a C lock behind it once the line moves. And a C lock behind
// nine dead tickets (a holder and seven waiters of a closed Go mapping,
// and a ticket never recorded), where no recorded waiter is alive to look
// at the head, skips them and gets the lock, told that its holder died.
func TestCMutexFarBackInLine(t *testing.T) {
	longTest(t)
	t.Parallel()
	if testing.Short() {
		t.Skip("starts dsmd processes; skipped with -short")
	}
	lib := buildClib(t)
	cclient := filepath.Join(lib, "cclient")
	const region = "cmx"
	c := syncCluster(t, region)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, err := dsm.Dial(ctx, c.nodes[0].socket)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	r, err := cl.Map(ctx, region)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	cTimedLockFarBack(ctx, t, r, clientTool(nil, cclient, c.nodes[1].socket, region, "lock-timed", "0", "2000"),
		clientTool(nil, cclient, c.nodes[2].socket, region, "lock", "0"))

	// A token dsmd says is dead: the session of a Go mapping, closed.
	gone, err := cl.Map(ctx, region)
	if err != nil {
		t.Fatal(err)
	}
	dead := gone.Session()
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	if dead == 0 {
		t.Fatal("dsmd gave the mapping no session token")
	}
	cLockBehindDeadTickets(ctx, t, r, dead, clientTool(nil, cclient, c.nodes[1].socket, region, "lock", "4096"))
}

// cTimedLockFarBack: a Go holder of the mutex at 0 and eight Go waiters
// (seven recorded, one too far back) ahead; the C timed lock of 2 s
// (timed) must print "timeout" well before it could record itself, which
// it never can while the holder holds. Then the waiters give up, the
// holder unlocks, and a C lock (lock) gets the mutex past the ticket the
// timed lock left unrecorded.
func cTimedLockFarBack(ctx context.Context, t *testing.T, r *dsm.Region, timed, lock func() (string, error)) {
	holder := r.Mutex(0)
	if err := holder.Lock(ctx); err != nil {
		t.Fatalf("Go Lock of ticket 0: %v", err)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	const waiters = 8
	errs := make(chan error, waiters)
	for range waiters {
		go func() { errs <- r.Mutex(0).Lock(wctx) }()
	}
	eventually(t, "8 Go waiters take tickets 1..8", clientHang, func() error {
		if v, err := r.LoadUint64(ctx, 0); err != nil || v != 1+waiters {
			return fmt.Errorf("ticket word %d, %v", v, err)
		}
		return nil
	})
	start := time.Now()
	out, err := timed()
	took := time.Since(start)
	if err != nil || out != "timeout\n" {
		t.Fatalf("C timed lock of 2 s nine tickets back: %q, %v after %v; want timeout", out, err, took.Round(time.Millisecond))
	}
	if took > 30*time.Second {
		t.Fatalf("C timed lock of 2 s nine tickets back returned after %v", took.Round(time.Millisecond))
	}
	t.Logf("the C timed lock of 2 s nine tickets back timed out after %v", took.Round(time.Millisecond))

	stop()
	for range waiters {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("Go waiter given up: %v", err)
		}
	}
	if err := holder.Unlock(); err != nil {
		t.Fatalf("Go Unlock: %v", err)
	}
	start = time.Now()
	if out, err := lock(); err != nil || out != "ok\n" {
		t.Fatalf("C lock behind the ticket the timed lock left: %q, %v", out, err)
	}
	t.Logf("a C lock got the mutex past the ticket left unrecorded in %v", time.Since(start).Round(time.Millisecond))
}

// cLockBehindDeadTickets writes the words of the mutex at 4096 as if a
// process of session dead held ticket 0 and waited with tickets 1..7 when
// it went away, and a process took ticket 8 and died before it recorded
// itself; the C lock (lock, ticket 9) must get the mutex and print
// owner-died.
func cLockBehindDeadTickets(ctx context.Context, t *testing.T, r *dsm.Region, dead uint64, lock func() (string, error)) {
	const off = 4096
	// An owner word (docs/synchronization.md): session << 22 | state << 19
	// | ticket; states 1 WAITING, 2 HOLDING.
	owner := func(ticket, state uint64) uint64 { return dead<<22 | state<<19 | ticket }
	words := map[int64]uint64{off + 16: owner(0, 2)}
	for i := range int64(7) {
		words[off+16+8*(i+1)] = owner(uint64(i+1), 1)
	}
	for w, v := range words {
		if err := r.StoreUint64(ctx, w, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.StoreUint64(ctx, off, 9); err != nil { // tickets 0..8 taken
		t.Fatal(err)
	}
	start := time.Now()
	out, err := lock()
	if err != nil || strings.TrimSpace(out) != "owner-died" {
		t.Fatalf("C lock behind 9 dead tickets: %q, %v after %v; want owner-died", out, err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("the C lock behind 9 dead tickets got the mutex (owner-died) in %v", time.Since(start).Round(time.Millisecond))
	// It held ticket 9 and unlocked it.
	if got, err := r.LoadUint64(ctx, off+8); err != nil || got != 10 {
		t.Fatalf("now-serving word after the C lock and unlock: %d, %v; want 10", got, err)
	}
}
