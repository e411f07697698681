package cli

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
)

func testWorkload() Workload {
	return Workload{RegionSize: 64 << 20, PageSize: 4096, AccessSize: 64, Threads: 4, OpsPerThread: 20000,
		ReadRatio: 0.7, SharingRatio: 0.4, Locality: 0.25, Seed: 42}
}

func TestWorkloadValidate(t *testing.T) {
	bad := []func(*Workload){
		func(w *Workload) { w.PageSize = 3000 },
		func(w *Workload) { w.AccessSize = 96 },
		func(w *Workload) { w.AccessSize = 8192 },
		func(w *Workload) { w.Threads = 0 },
		func(w *Workload) { w.OpsPerThread = 0 },
		func(w *Workload) { w.RegionSize = 7 * 4096 },
		func(w *Workload) { w.ReadRatio = 1.5 },
		func(w *Workload) { w.SharingRatio = -0.1 },
		func(w *Workload) { w.Locality = math.NaN() },
		func(w *Workload) { w.Skew = 1 },
	}
	for i, f := range bad {
		w := testWorkload()
		f(&w)
		if err := w.Validate(); !errors.Is(err, ErrWorkload) {
			t.Errorf("case %d: Validate() = %v, want an ErrWorkload", i, err)
		}
	}
	if err := testWorkload().Validate(); err != nil {
		t.Errorf("a good workload: %v", err)
	}
}

// TestGenerator checks the generated accesses against the knobs: ratios
// within a few standard deviations (the sequence is seeded, so the test is
// deterministic), areas respected, accesses aligned and inside one page.
func TestGenerator(t *testing.T) {
	w := testWorkload()
	gens, err := w.Generators()
	if err != nil {
		t.Fatal(err)
	}
	pages := w.RegionSize / w.PageSize
	shared := pages / 2
	priv := (pages - shared) / uint64(w.Threads)
	var writes, sharedN, samePage, n int
	for th, g := range gens {
		var last [2]int64
		last[0], last[1] = -1, -1
		for range w.OpsPerThread {
			op := g.Next()
			n++
			page := op.Offset / w.PageSize
			if op.Offset%w.AccessSize != 0 || (op.Offset+w.AccessSize-1)/w.PageSize != page {
				t.Fatalf("access at %#x is not aligned to %d inside one page", op.Offset, w.AccessSize)
			}
			which := 1
			if page < shared {
				which = 0
				sharedN++
			} else if lo := shared + uint64(th)*priv; page < lo || page >= lo+priv {
				t.Fatalf("thread %d touched page %d outside its private area [%d, %d)", th, page, lo, lo+priv)
			}
			if last[which] == int64(page) {
				samePage++
			}
			last[which] = int64(page)
			if op.Write {
				writes++
			}
		}
	}
	near := func(name string, got int, p float64) {
		sd := math.Sqrt(float64(n) * p * (1 - p))
		if math.Abs(float64(got)-p*float64(n)) > 5*sd+1 {
			t.Errorf("%s: %d of %d, want about %.0f", name, got, n, p*float64(n))
		}
	}
	near("writes", writes, 1-w.ReadRatio)
	near("shared accesses", sharedN, w.SharingRatio)
	// Staying on the last page happens by locality, plus rarely by chance.
	if lo, hi := int(0.9*w.Locality*float64(n)), int(1.1*w.Locality*float64(n))+n/100; samePage < lo || samePage > hi {
		t.Errorf("accesses on the area's last page: %d of %d, want about %.0f", samePage, n, w.Locality*float64(n))
	}

	// Same seed, same sequence; another seed, another.
	a, _ := w.Generators()
	b, _ := w.Generators()
	w.Seed++
	c, _ := w.Generators()
	same, differ := true, false
	for range 1000 {
		x, y, z := a[1].Next(), b[1].Next(), c[1].Next()
		same = same && x == y
		differ = differ || x != z
	}
	if !same || !differ {
		t.Errorf("seeding: same seed equal %v, other seed differs %v", same, differ)
	}
}

func TestZipfSkew(t *testing.T) {
	w := testWorkload()
	w.Skew, w.Locality, w.SharingRatio, w.Threads = 0.99, 0, 1, 1
	gens, err := w.Generators()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[uint64]int{}
	const n = 100000
	for range n {
		counts[gens[0].Next().Offset/w.PageSize]++
	}
	// Under Zipf(0.99) over 4096 pages the hottest page takes about 11% and
	// the first ten about a third; uniform would give 0.02% and 0.2%.
	if counts[0] < n/20 || counts[0] < counts[1] || counts[1] < counts[10] {
		t.Errorf("not skewed: page 0 %d, page 1 %d, page 10 %d of %d", counts[0], counts[1], counts[10], n)
	}
	top := 0
	for p := range uint64(10) {
		top += counts[p]
	}
	if top < n/5 {
		t.Errorf("the ten hottest pages took %d of %d", top, n)
	}
	for p := range counts {
		if p >= w.RegionSize/w.PageSize/2 {
			t.Fatalf("page %d outside the shared area", p)
		}
	}
}

func TestProgressBar(t *testing.T) {
	for _, c := range []struct {
		done, total int64
		want        string
	}{
		{0, 100, "[          ]   0% 0/100 ops"},
		{50, 100, "[=====     ]  50% 50/100 ops"},
		{100, 100, "[==========] 100% 100/100 ops"},
		{150, 100, "[==========] 100% 100/100 ops"},
	} {
		if got := progressBar(c.done, c.total, 10); got != c.want {
			t.Errorf("progressBar(%d, %d) = %q, want %q", c.done, c.total, got, c.want)
		}
	}
}

// failingTarget fails the n-th access.
type failingTarget struct {
	n     atomic.Int64
	after int64
}

func (f *failingTarget) Read(ctx context.Context, off uint64, n int) error { return f.step(ctx) }
func (f *failingTarget) Write(ctx context.Context, off uint64, p []byte) error {
	return f.step(ctx)
}
func (f *failingTarget) step(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if f.n.Add(1) == f.after {
		return errors.New("injected failure")
	}
	return nil
}

func TestRunBenchStopsOnError(t *testing.T) {
	w := testWorkload()
	var done atomic.Int64
	_, err := runBench(context.Background(), w, []benchTarget{&failingTarget{after: 500}}, &done)
	if err == nil || !strings.Contains(err.Error(), "injected failure") {
		t.Fatalf("runBench = %v, want the injected failure", err)
	}
	if d := done.Load(); d >= int64(w.Threads*w.OpsPerThread) {
		t.Errorf("all %d accesses done despite the failure", d)
	}
}
