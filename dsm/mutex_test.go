package dsm

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// waitTicketsTaken waits until n tickets of the Mutex at 0 are taken.
func waitTicketsTaken(t *testing.T, r *Region, n uint64) {
	t.Helper()
	deadline := time.Now().Add(hang)
	for mustLoad(t, r, 0) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d tickets taken, want %d", mustLoad(t, r, 0), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A Lock more than ownerSlots tickets back in the line, which cannot record
// itself yet, returns when its ctx ends, and its ticket does not hold up
// the line: once the ticket comes within reach of its owner word the Lock's
// process records it given up, and passes it when it is at the head. No
// other waiter is left to skip it, so the lock being free at the end shows
// that it was given up.
func TestMutexCancelFarBackInLine(t *testing.T) {
	_, _, r := setup(t, 16<<10)
	ctx := ctxT(t)
	holder := r.Mutex(0)
	if err := holder.Lock(ctx); err != nil { // ticket 0
		t.Fatal(err)
	}
	// Tickets 1 to ownerSlots: live waiters, held up by the holder.
	var wg sync.WaitGroup
	errs := make(chan error, ownerSlots)
	for i := 1; i <= ownerSlots; i++ {
		wg.Go(func() {
			mu := r.Mutex(0)
			if err := mu.Lock(ctx); err != nil {
				errs <- err
				return
			}
			if err := mu.Unlock(); err != nil {
				errs <- err
			}
		})
		waitTicketsTaken(t, r, uint64(i)+1)
	}
	wctx, cancel := context.WithCancel(ctx)
	res := make(chan error, 1)
	go func() { res <- r.Mutex(0).Lock(wctx) }()
	far := uint64(ownerSlots + 1)
	waitTicketsTaken(t, r, far+1)
	cancel()
	select {
	case err := <-res:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Lock %d tickets back: %v, want context.Canceled", far, err)
		}
	case <-time.After(hang):
		t.Fatalf("a Lock %d tickets back did not return when its ctx ended", far)
	}
	if err := holder.Unlock(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	deadline := time.Now().Add(hang)
	for mustLoad(t, r, 8) != far+1 {
		if time.Now().After(deadline) {
			t.Fatalf("now serving %#x: the ticket %d given up was never passed", mustLoad(t, r, 8), far)
		}
		time.Sleep(time.Millisecond)
	}
	if tk, st, _ := ownerOf(mustLoad(t, r, 16+8*int64(far%ownerSlots))); tk != far || st != ownerSkipped {
		t.Fatalf("owner word of ticket %d: ticket %d state %d, want given up", far, tk, st)
	}
	if ok, err := holder.TryLock(ctx); err != nil || !ok {
		t.Fatalf("TryLock after the line drained = %v %v", ok, err)
	}
	if err := holder.Unlock(); err != nil {
		t.Fatal(err)
	}
}

// A Lock behind a line whose every recordable ticket belongs to a dead
// process (a dead holder, dead waiters, a taker that died before it
// recorded itself) skips them all itself, though it is too far back to
// record its own ticket, and gets the lock with ErrOwnerDied.
func TestMutexDeadTicketsFillTheLine(t *testing.T) {
	shortLockWaits(t)
	c, r := setupEngine(t)
	ctx := ctxT(t)
	dead, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	token := dead.Session()
	if err := dead.Close(); err != nil {
		t.Fatal(err)
	}
	const off = 256
	words := func(i int) int64 { return off + 8*int64(i) }
	// Tickets 0 to ownerSlots are taken: 0 holds the lock, 1 to
	// ownerSlots-1 wait, ownerSlots never recorded itself.
	if err := r.StoreUint64(ctx, words(0), ownerSlots+1); err != nil {
		t.Fatal(err)
	}
	for tk := uint64(0); tk < ownerSlots; tk++ {
		st := ownerWaiting
		if tk == 0 {
			st = ownerHolding
		}
		if err := r.StoreUint64(ctx, words(2+int(tk)), ownerWord(tk, st, token)); err != nil {
			t.Fatal(err)
		}
	}
	mu := r.Mutex(off)
	res := make(chan error, 1)
	go func() { res <- mu.Lock(ctx) }()
	select {
	case err := <-res:
		if !errors.Is(err, ErrOwnerDied) {
			t.Fatalf("Lock behind dead tickets: %v, want ErrOwnerDied", err)
		}
	case <-time.After(hang):
		t.Fatalf("a Lock behind %d dead tickets never got the lock", ownerSlots+1)
	}
	if sw := mustLoad(t, r, words(1)); sw != ownerSlots+1 {
		t.Fatalf("now serving %#x, want %d", sw, ownerSlots+1)
	}
	if err := mu.Unlock(); err != nil {
		t.Fatal(err)
	}
	// Ticket 1's owner word is the Lock's own now (ticket ownerSlots+1).
	for tk := uint64(2); tk <= ownerSlots; tk++ {
		w := mustLoad(t, r, words(2+int(tk%ownerSlots)))
		if got, st, _ := ownerOf(w); got != tk || st != ownerSkipped {
			t.Fatalf("owner word of ticket %d: ticket %d state %d, want skipped", tk, got, st)
		}
	}
}
