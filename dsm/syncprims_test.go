package dsm

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/uffd"
	"github.com/dsmkit/dsm/node"
)

// setupEngine is setup with a dsmd that runs its coherence engine, which
// hands out the session tokens the Barrier and the Semaphore need.
func setupEngine(t testing.TB) (*Client, *Region) {
	t.Helper()
	if _, err := uffd.Probe(); err != nil {
		t.Skipf("no userfaultfd: %v", err)
	}
	n, err := node.New(testConfig(t.TempDir()), node.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	ctx := ctxT(t)
	// A region created before the node is an alive member has no homes.
	for len(n.Directory().View().Alive()) == 0 {
		if ctx.Err() != nil {
			t.Fatal("the node never became an alive member")
		}
		time.Sleep(5 * time.Millisecond)
	}
	c := dial(t, ctx, n.Addrs().Socket)
	if err := c.CreateRegion(ctx, "r", 64<<10); err != nil {
		t.Fatal(err)
	}
	r, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if r.m.Session() == 0 {
		t.Fatal("the mapping has no session token")
	}
	return c, r
}

// Without a session token (a dsmd without its engine), the Barrier and
// the Semaphore refuse to work: they could not tell their users apart.
func TestSyncPrimitivesNeedASession(t *testing.T) {
	_, _, r := setup(t, 16<<10)
	ctx := ctxT(t)
	if err := r.Semaphore(0, 1).Acquire(ctx, 1); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Semaphore without a session: %v, want ErrUnsupported", err)
	}
	if _, err := r.Barrier(0, 1).Wait(ctx); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Barrier without a session: %v, want ErrUnsupported", err)
	}
}

// Goroutines on two mappings take 1 or 2 units of a semaphore of 3 and
// give them back, many times: the units held never exceed 3 (counted in
// this process) and all come back.
func TestSemaphore(t *testing.T) {
	c, r1 := setupEngine(t)
	ctx := ctxT(t)
	r2, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()

	const off, capacity = 64, 3
	var inUse, most atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i, r := range []*Region{r1, r2, r1, r2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := r.Semaphore(off, capacity)
			n := uint64(1 + i%2)
			for range 100 {
				if err := s.Acquire(ctx, n); err != nil {
					errs <- err
					return
				}
				v := inUse.Add(int64(n))
				for m := most.Load(); v > m && !most.CompareAndSwap(m, v); m = most.Load() {
				}
				inUse.Add(-int64(n))
				if err := s.Release(n); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if m := most.Load(); m > capacity {
		t.Fatalf("%d units held at once, capacity %d", m, capacity)
	}
	s := r1.Semaphore(off, capacity)
	if n, err := s.Available(ctx); err != nil || n != capacity {
		t.Fatalf("Available after = %d %v, want %d", n, err, capacity)
	}

	// TryAcquire, Release, and the refusals.
	if ok, err := s.TryAcquire(ctx, 2); err != nil || !ok {
		t.Fatalf("TryAcquire(2) = %v %v", ok, err)
	}
	if ok, err := r2.Semaphore(off, capacity).TryAcquire(ctx, 2); err != nil || ok {
		t.Fatalf("TryAcquire(2) with 1 free = %v %v", ok, err)
	}
	if err := r2.Semaphore(off, capacity).Release(1); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Release by a mapping that holds nothing: %v, want ErrNotHeld", err)
	}
	if err := s.Release(3); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Release(3) of 2 held: %v, want ErrNotHeld", err)
	}
	// Units belong to the mapping: another value of the same Region
	// releases them.
	if err := r1.Semaphore(off, capacity).Release(2); err != nil {
		t.Fatal(err)
	}
	if err := s.Acquire(ctx, 4); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Acquire(4) of 3: %v, want ErrInvalidArgument", err)
	}
	if err := r1.Semaphore(off, 5).Acquire(ctx, 1); !errors.Is(err, ErrCountMismatch) {
		t.Fatalf("a capacity of 5 on a semaphore of 3: %v, want ErrCountMismatch", err)
	}
	if err := r1.Semaphore(off, 0).Acquire(ctx, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("capacity 0: %v, want ErrInvalidArgument", err)
	}
	if err := r1.Semaphore(4, 1).Acquire(ctx, 1); !errors.Is(err, ErrUnaligned) {
		t.Fatalf("Semaphore at 4: %v, want ErrUnaligned", err)
	}
	if err := r1.Semaphore(r1.Len()-SemaphoreSize+8, 1).Acquire(ctx, 1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("Semaphore past the end: %v, want ErrOutOfRange", err)
	}
	if err := s.Acquire(ctx, 0); err != nil {
		t.Fatalf("Acquire(0): %v", err)
	}
}

// waitWord polls the word at off until it reads want.
func waitWord(t *testing.T, r *Region, off int64, want uint64) {
	t.Helper()
	deadline := time.Now().Add(hang)
	for mustLoad(t, r, off) != want {
		if time.Now().After(deadline) {
			t.Fatalf("word at %d is %d, want %d", off, mustLoad(t, r, off), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// Acquirers are served in order: a request for 2 units at the head of the
// line is not passed by a request for 1 behind it when 1 unit is free. An
// Acquire whose ctx ends in the line holds nothing after.
func TestSemaphoreFIFO(t *testing.T) {
	_, r := setupEngine(t)
	ctx := ctxT(t)
	const off = 0
	s := r.Semaphore(off, 3)
	if err := s.Acquire(ctx, 3); err != nil { // ticket 0
		t.Fatal(err)
	}
	big, small := make(chan error, 1), make(chan error, 1)
	go func() { big <- r.Semaphore(off, 3).Acquire(ctx, 2) }() // ticket 1
	waitWord(t, r, off, 2)
	go func() { small <- r.Semaphore(off, 3).Acquire(ctx, 1) }() // ticket 2
	waitWord(t, r, off, 3)
	if err := s.Release(1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-small:
		t.Fatalf("the Acquire of 1 behind one of 2 returned first: %v", err)
	case err := <-big:
		t.Fatalf("the Acquire of 2 returned with 1 unit free: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := s.Release(2); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []chan error{big, small} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(hang):
			t.Fatal("an Acquire did not return once its units were free")
		}
	}
	if n, err := s.Available(ctx); err != nil || n != 0 {
		t.Fatalf("Available = %d %v, want 0", n, err)
	}

	// Cancelled while at the head of the line, and while behind it.
	cctx, cancel := context.WithCancel(ctx)
	head, behind := make(chan error, 1), make(chan error, 1)
	go func() { head <- r.Semaphore(off, 3).Acquire(cctx, 1) }() // ticket 3
	waitWord(t, r, off, 4)
	go func() { behind <- r.Semaphore(off, 3).Acquire(cctx, 1) }() // ticket 4
	waitWord(t, r, off, 5)
	cancel()
	for _, ch := range []chan error{head, behind} {
		if err := <-ch; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Acquire: %v, want context.Canceled", err)
		}
	}
	if err := s.Release(3); err != nil { // all this mapping's units
		t.Fatal(err)
	}
	if ok, err := s.TryAcquire(ctx, 3); err != nil || !ok {
		t.Fatalf("TryAcquire(3) after the cancelled Acquires = %v %v", ok, err)
	}
	if err := s.Release(3); err != nil {
		t.Fatal(err)
	}
}

// The units of a mapping that is closed while it holds them come back: to
// the Acquire waiting at the head of the line, and to a TryAcquire.
func TestSemaphoreDeadHolder(t *testing.T) {
	shortLockWaits(t)
	c, r := setupEngine(t)
	ctx := ctxT(t)
	const off = 128
	s := r.Semaphore(off, 2)
	for _, try := range []bool{false, true} {
		dead, err := c.Map(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		if err := dead.Semaphore(off, 2).Acquire(ctx, 2); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.TryAcquire(ctx, 1); err != nil || ok {
			t.Fatalf("TryAcquire with every unit held = %v %v", ok, err)
		}
		if err := dead.Close(); err != nil {
			t.Fatal(err)
		}
		if try {
			deadline := time.Now().Add(hang)
			for {
				ok, err := s.TryAcquire(ctx, 2)
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("TryAcquire never got the units of a closed mapping")
				}
				time.Sleep(5 * time.Millisecond)
			}
		} else if err := s.Acquire(ctx, 2); err != nil {
			t.Fatalf("Acquire behind a closed holder: %v", err)
		}
		if err := s.Release(2); err != nil {
			t.Fatal(err)
		}
	}
}

// Parties on two mappings pass a barrier of 3 many times: none starts a
// generation before every party has finished the one before, and Wait
// numbers the generations in order.
func TestBarrier(t *testing.T) {
	c, r1 := setupEngine(t)
	ctx := ctxT(t)
	r2, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()

	const off, parties, rounds = 512, 3, 100
	var arrived [rounds]atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, parties)
	for _, r := range []*Region{r1, r2, r1} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := r.Barrier(off, parties)
			for round := range rounds {
				arrived[round].Add(1)
				gen, err := b.Wait(ctx)
				if err != nil {
					errs <- err
					return
				}
				if gen != uint64(round) {
					errs <- errors.New("generation out of order")
					return
				}
				if n := arrived[round].Load(); n != parties {
					errs <- errors.New("released before every party arrived")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if gen, broken, err := r1.Barrier(off, parties).Generation(ctx); err != nil || gen != rounds || broken {
		t.Fatalf("Generation = %d %v %v, want %d", gen, broken, err, rounds)
	}
	if _, err := r1.Barrier(off, 2).Wait(ctx); !errors.Is(err, ErrCountMismatch) {
		t.Fatalf("2 parties on a barrier of 3: %v, want ErrCountMismatch", err)
	}
	for _, n := range []int{0, MaxBarrierParties + 1} {
		if _, err := r1.Barrier(4096, n).Wait(ctx); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%d parties: %v, want ErrInvalidArgument", n, err)
		}
	}
	if _, err := r1.Barrier(4100, 2).Wait(ctx); !errors.Is(err, ErrUnaligned) {
		t.Fatalf("Barrier at 4100: %v, want ErrUnaligned", err)
	}
	// The party word of a barrier of 1 names a live session: another
	// session cannot take part; another value of the same one shares it.
	if _, err := r1.Barrier(8192, 1).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Barrier(8192, 1).Wait(ctx); !errors.Is(err, ErrTooManyParties) {
		t.Fatalf("a second session on a barrier of 1: %v, want ErrTooManyParties", err)
	}
	if gen, err := r1.Barrier(8192, 1).Wait(ctx); err != nil || gen != 1 {
		t.Fatalf("another value of the recorded session: %d %v, want generation 1", gen, err)
	}
}

// A Wait whose ctx ends withdraws its arrival; a Reset while a party waits
// fails that Wait with ErrBarrierBroken.
func TestBarrierCancelAndReset(t *testing.T) {
	_, r := setupEngine(t)
	ctx := ctxT(t)
	const off = 0
	a, b := r.Barrier(off, 2), r.Barrier(off, 2)
	cctx, cancel := context.WithCancel(ctx)
	res := make(chan error, 1)
	go func() { _, err := a.Wait(cctx); res <- err }()
	waitWord(t, r, off, 1) // generation 0, one arrival
	cancel()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Wait: %v, want context.Canceled", err)
	}
	if v := mustLoad(t, r, off); v != 0 {
		t.Fatalf("state word after the withdrawal %#x, want 0", v)
	}
	done := make(chan error, 1)
	go func() { _, err := a.Wait(ctx); done <- err }()
	if gen, err := b.Wait(ctx); err != nil || gen != 0 {
		t.Fatalf("Wait = %d %v, want generation 0", gen, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	go func() { _, err := a.Wait(ctx); done <- err }()
	waitWord(t, r, off, 1<<32|1) // generation 1, one arrival
	if err := b.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrBarrierBroken) {
		t.Fatalf("Wait across a Reset: %v, want ErrBarrierBroken", err)
	}
	go func() { _, err := a.Wait(ctx); done <- err }()
	if gen, err := b.Wait(ctx); err != nil || gen != 3 {
		t.Fatalf("Wait after the Reset = %d %v, want generation 3", gen, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A party whose mapping is closed breaks the barrier for the others, who
// are told its session; after Reset a new mapping takes the dead party's
// place and the barrier works again.
func TestBarrierDeadParty(t *testing.T) {
	shortLockWaits(t)
	c, r := setupEngine(t)
	ctx := ctxT(t)
	const off = 1024
	gone, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	session := gone.m.Session()
	a, b := r.Barrier(off, 3), r.Barrier(off, 3)
	round := func(parties ...*Barrier) []error {
		errs := make([]error, len(parties))
		var wg sync.WaitGroup
		for i, p := range parties {
			wg.Add(1)
			go func() { defer wg.Done(); _, errs[i] = p.Wait(ctx) }()
		}
		wg.Wait()
		return errs
	}
	for _, err := range round(a, b, gone.Barrier(off, 3)) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	for _, err := range round(a, b) {
		var dp *DeadPartyError
		if !errors.Is(err, ErrBarrierBroken) || !errors.As(err, &dp) || dp.Session != session {
			t.Fatalf("Wait with a dead party: %v, want ErrBarrierBroken naming session %#x", err, session)
		}
	}
	if _, err := a.Wait(ctx); !errors.Is(err, ErrBarrierBroken) {
		t.Fatalf("Wait on a broken barrier: %v, want ErrBarrierBroken", err)
	}
	if _, broken, err := a.Generation(ctx); err != nil || !broken {
		t.Fatalf("Generation says broken %v (%v), want true", broken, err)
	}
	if err := a.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if w := mustLoad(t, r, off+8*barrierBrokenBy); w != 0 {
		t.Fatalf("the broken-by word after Reset: %#x", w)
	}
	fresh, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	for _, err := range round(a, b, fresh.Barrier(off, 3)) {
		if err != nil {
			t.Fatalf("a round after Reset with a new party: %v", err)
		}
	}
}

// A Release whose wake-up of the head of the line is lost (its process
// died between its two steps) delays the head by at most the check
// interval: it reads the holder words on its own then.
func TestSemaphoreLostWake(t *testing.T) {
	shortLockWaits(t)
	_, r := setupEngine(t)
	ctx := ctxT(t)
	const off = 256
	s := r.Semaphore(off, 1)
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() { res <- r.Semaphore(off, 1).Acquire(ctx, 1) }()
	waitWord(t, r, off, 2) // the second ticket is taken
	holder := off + 8*int64(semHolderWord)
	w := mustLoad(t, r, holder)
	if ok, err := r.CompareAndSwapUint64(ctx, holder, w, 0); err != nil || !ok {
		t.Fatalf("clearing the holder word: %v %v", ok, err)
	}
	if err := <-res; err != nil {
		t.Fatalf("Acquire after a release without a wake: %v", err)
	}
	if err := s.Release(1); err != nil {
		t.Fatal(err)
	}
}

// The sizes are part of the layout other languages follow
// (docs/synchronization.md).
func TestSyncLayout(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"MutexSize", MutexSize, 80},
		{"SemaphoreSize", SemaphoreSize, 224},
		{"BarrierSize", BarrierSize, 544},
		{"SemaphoreHolders", SemaphoreHolders, 16},
		{"MaxBarrierParties", MaxBarrierParties, 64},
		{"MaxSemaphoreCapacity", MaxSemaphoreCapacity, 1<<22 - 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if w := partyWord(0x3ff_0000_0001, 5); w != 0x3ff_0000_0001<<22|1<<21|5 {
		t.Errorf("party word %#x", w)
	}
	if w := holderWord(0x3ff_0000_0001, 7); w != 0x3ff_0000_0001<<22|7 {
		t.Errorf("holder word %#x", w)
	}
}

// The acquirer at the head of the line dies waiting for units (its
// mapping is closed): the one behind it takes its place and gets the
// units when they are released.
func TestSemaphoreDeadHeadOfLine(t *testing.T) {
	shortLockWaits(t)
	c, r := setupEngine(t)
	ctx := ctxT(t)
	const off = 2048
	s := r.Semaphore(off, 1)
	if err := s.Acquire(ctx, 1); err != nil { // ticket 0
		t.Fatal(err)
	}
	gone, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	head := make(chan error, 1)
	go func() { head <- gone.Semaphore(off, 1).Acquire(ctx, 1) }() // ticket 1
	waitWord(t, r, off, 2)
	// The head holds the line's Mutex once its owner word says so.
	for {
		if _, st, _ := ownerOf(mustLoad(t, r, off+8*(2+1))); st == ownerHolding {
			break
		}
		time.Sleep(time.Millisecond)
	}
	r2, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	behind := make(chan error, 1)
	go func() { behind <- r2.Semaphore(off, 1).Acquire(ctx, 1) }() // ticket 2
	waitWord(t, r, off, 3)
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-head; !errors.Is(err, ErrClosed) {
		t.Fatalf("Acquire of a closed mapping: %v, want ErrClosed", err)
	}
	if err := s.Release(1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-behind:
		if err != nil {
			t.Fatalf("Acquire behind a dead head of the line: %v", err)
		}
	case <-time.After(hang):
		t.Fatal("the Acquire behind a dead head of the line never returned")
	}
	if err := r2.Semaphore(off, 1).Release(1); err != nil {
		t.Fatal(err)
	}
}
