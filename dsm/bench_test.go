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
