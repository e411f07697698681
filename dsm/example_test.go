package dsm_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dsmkit/dsm/dsm"
)

// This example needs a dsmd on this machine: it uses $DSM_ADDR or
// /run/dsm/dsmd.sock.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := dsm.Dial(ctx, "")
	if err != nil {
		log.Fatal(err) // says which address it tried
	}
	defer c.Close()

	// Creating a region that exists with the same spec succeeds.
	if err := c.CreateRegion(ctx, "counters", 1<<20, dsm.WithDurability(dsm.Durable)); err != nil {
		log.Fatal(err)
	}
	r, err := c.Map(ctx, "counters")
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()

	// A cluster-wide counter in the first word.
	hits, err := r.AddUint64(ctx, 0, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("hits so far:", hits)

	// A lock in the MutexSize bytes from offset 16 guards a record at
	// 4096: bytes read and written through the mapping.
	mu := r.Mutex(16)
	if err := mu.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := r.WriteAt([]byte("last visitor: example"), 4096); err != nil {
		log.Fatal(err)
	}
	if err := mu.Unlock(); err != nil {
		log.Fatal(err)
	}

	// Plain loads and stores: r.Bytes() is the region. Prefault first where
	// the pages may be absent, so a miss waits in a system call.
	if err := r.Prefault(4096, 64, false); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", r.Bytes()[4096:4096+21])

	// Make the writes durable.
	if err := r.Sync(ctx); err != nil {
		log.Fatal(err)
	}

	// Errors match sentinels.
	if _, err := c.Map(ctx, "no-such-region"); errors.Is(err, dsm.ErrUnknownRegion) {
		fmt.Println("no such region")
	}
}

// Workers on any machines run in phases: none starts phase k+1 before all
// have finished phase k. A worker that dies breaks the barrier.
func ExampleRegion_Barrier() {
	ctx := context.Background()
	c, err := dsm.Dial(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	r, err := c.Map(ctx, "grid")
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()

	const workers = 4
	b := r.Barrier(0, workers) // BarrierSize bytes from offset 0
	for phase := 0; phase < 10; phase++ {
		// ... compute this worker's part of the phase ...
		gen, err := b.Wait(ctx)
		var dead *dsm.DeadPartyError
		if errors.As(err, &dead) {
			log.Fatalf("phase %d: a worker died (session %#x)", phase, dead.Session)
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("all workers finished generation", gen)
	}
}

// At most 8 processes, cluster-wide, talk to a backend at a time; the
// units of a process that dies come back.
func ExampleRegion_Semaphore() {
	ctx := context.Background()
	c, err := dsm.Dial(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	r, err := c.Map(ctx, "limits")
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()

	s := r.Semaphore(4096, 8) // SemaphoreSize bytes from offset 4096
	if err := s.Acquire(ctx, 1); err != nil {
		log.Fatal(err)
	}
	defer s.Release(1)
	// ... talk to the backend ...
}
