package dsm

import (
	"context"
	"testing"
)

// BenchmarkAddUint64 is the hit path of an atomic: the page is held
// Modified here, so each operation is a populate syscall that finds the
// page mapped plus one atomic instruction.
func BenchmarkAddUint64(b *testing.B) {
	_, _, r := setup(b, 64<<10)
	ctx := context.Background()
	if _, err := r.AddUint64(ctx, 0, 1); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.AddUint64(ctx, 0, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadAt reads one resident 4 KiB page.
func BenchmarkReadAt(b *testing.B) {
	_, _, r := setup(b, 64<<10)
	p := make([]byte, 4096)
	if _, err := r.WriteAt(p, 4096); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.ReadAt(p, 4096); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMutexUncontended is a Lock and Unlock of a free Mutex in one
// process: the baseline of the Semaphore's, which is a Mutex around one
// compare-and-swap.
func BenchmarkMutexUncontended(b *testing.B) {
	_, r := setupEngine(b)
	ctx := context.Background()
	mu := r.Mutex(0)
	b.ReportAllocs()
	for b.Loop() {
		if err := mu.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := mu.Unlock(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSemaphoreUncontended is an Acquire and Release of one unit of
// a semaphore with units free, in one process.
func BenchmarkSemaphoreUncontended(b *testing.B) {
	_, r := setupEngine(b)
	ctx := context.Background()
	s := r.Semaphore(0, 4)
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Acquire(ctx, 1); err != nil {
			b.Fatal(err)
		}
		if err := s.Release(1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBarrierTwoParties is one generation of a barrier of two
// parties, goroutines of one process.
func BenchmarkBarrierTwoParties(b *testing.B) {
	_, r := setupEngine(b)
	ctx := context.Background()
	other := make(chan error, 1)
	n := b.N
	go func() {
		p := r.Barrier(0, 2)
		for range n {
			if _, err := p.Wait(ctx); err != nil {
				other <- err
				return
			}
		}
		other <- nil
	}()
	p := r.Barrier(0, 2)
	b.ResetTimer()
	for range n {
		if _, err := p.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-other; err != nil {
		b.Fatal(err)
	}
}
