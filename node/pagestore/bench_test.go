package pagestore

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble"
)

// benchDir is a fresh directory under $DSM_PAGESTORE_BENCH_DIR (so that
// make bench-pagestore measures the disk dd measures), else a test
// temporary directory.
func benchDir(b *testing.B) string {
	b.Helper()
	parent := os.Getenv("DSM_PAGESTORE_BENCH_DIR")
	if parent == "" {
		return b.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "bench")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// writers=N settles at about N/2 pages a batch (one batch is committed
// while the next fills), so the raw batch sizes include those.
var (
	benchWriters = []int{1, 16, 64}
	benchBatches = []int{1, 8, 16, 32, 64}
)

// BenchmarkWrite is group commit: writers concurrent callers of Write, one
// 4 KiB page each call. pages/batch is the batching the committer found.
func BenchmarkWrite(b *testing.B) {
	for _, writers := range benchWriters {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			s, err := Open(Options{Dir: benchDir(b)})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			data := pageData(1, 0, 1, 4096)
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			var next atomic.Int64
			var wg sync.WaitGroup
			for range writers {
				wg.Go(func() {
					for {
						i := next.Add(1) - 1
						if i >= int64(b.N) {
							return
						}
						if err := s.Write(context.Background(), []Page{{Region: 1, No: uint64(i), Version: 1, Data: data}}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			st := s.Stats()
			b.ReportMetric(float64(st.Pages)/float64(st.Batches), "pages/batch")
		})
	}
}

// BenchmarkRawPebble writes the same keys and values as BenchmarkWrite
// straight to pebble, batch records to one batch committed with Sync, one
// batch after the other: the floor under the store's overhead at that
// batch size.
func BenchmarkRawPebble(b *testing.B) {
	for _, batch := range benchBatches {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			db, err := pebble.Open(benchDir(b), &pebble.Options{MemTableSize: memTableSize})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			data := pageData(1, 0, 1, 4096)
			val := appendRecord(nil, 1, data)
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				bt := db.NewBatch()
				for j := i; j < min(i+batch, b.N); j++ {
					if err := bt.Set(pageKey(1, uint64(j)), val, nil); err != nil {
						b.Fatal(err)
					}
				}
				if err := bt.Commit(pebble.Sync); err != nil {
					b.Fatal(err)
				}
				bt.Close()
			}
		})
	}
}
