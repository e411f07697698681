package cli

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// Workload is the microbenchmark grid of DSM papers (GAM, SELCC): each
// thread issues Ops accesses of AccessSize bytes; what the accesses touch is
// set by four knobs.
//
// The region's pages are split into a shared area (the first half) that
// every thread uses and one private area per thread (the second half, in
// equal parts). For each access:
//   - with probability SharingRatio it goes to the shared area, else to the
//     thread's private area;
//   - with probability Locality it stays on the page the thread last used in
//     that area (at a new offset), else it draws a page of the area: uniform
//     when Skew is 0, Zipfian with exponent Skew otherwise (page 0 of the
//     area hottest; 0.99 is the usual YCSB setting);
//   - with probability ReadRatio it is a read, else a write.
//
// Offsets are multiples of AccessSize inside the page, so an access never
// straddles two pages.
type Workload struct {
	RegionSize   uint64
	PageSize     uint64
	AccessSize   uint64
	Threads      int
	OpsPerThread int
	ReadRatio    float64
	SharingRatio float64
	Locality     float64
	Skew         float64
	Seed         uint64
}

// ErrWorkload is wrapped by every error of Workload.Validate.
var ErrWorkload = errors.New("dsmctl: bad workload")

// Validate checks that the knobs make sense together.
func (w Workload) Validate() error {
	switch {
	case w.PageSize == 0 || w.PageSize&(w.PageSize-1) != 0:
		return fmt.Errorf("%w: page size %d is not a power of two", ErrWorkload, w.PageSize)
	case w.AccessSize == 0 || w.AccessSize > w.PageSize || w.PageSize%w.AccessSize != 0:
		return fmt.Errorf("%w: access size %d must divide the page size %d", ErrWorkload, w.AccessSize, w.PageSize)
	case w.Threads < 1 || w.Threads > 4096:
		return fmt.Errorf("%w: threads %d not in 1..4096", ErrWorkload, w.Threads)
	case w.OpsPerThread < 1:
		return fmt.Errorf("%w: ops per thread %d must be positive", ErrWorkload, w.OpsPerThread)
	case w.RegionSize/w.PageSize < 2*uint64(w.Threads):
		return fmt.Errorf("%w: %d pages cannot give a shared area and a private area to each of %d threads (need %d)",
			ErrWorkload, w.RegionSize/w.PageSize, w.Threads, 2*w.Threads)
	}
	for _, p := range []struct {
		name string
		v    float64
	}{{"read ratio", w.ReadRatio}, {"sharing ratio", w.SharingRatio}, {"locality", w.Locality}} {
		if !(p.v >= 0 && p.v <= 1) {
			return fmt.Errorf("%w: %s %v not in [0, 1]", ErrWorkload, p.name, p.v)
		}
	}
	if !(w.Skew >= 0 && w.Skew < 1) {
		return fmt.Errorf("%w: skew %v not in [0, 1)", ErrWorkload, w.Skew)
	}
	return nil
}

// Op is one access of a workload.
type Op struct {
	Write  bool
	Offset uint64
}

// area is a run of pages with the page sampler of the workload's skew.
type area struct {
	first, pages uint64
	zipf         *zipf // nil: uniform
}

// Generator yields one thread's accesses. It is deterministic: the same
// workload, thread and seed give the same sequence.
type Generator struct {
	w       Workload
	rng     *rand.Rand
	shared  area
	private area
	last    [2]uint64 // the page last used in the shared [0] and private [1] area
	used    [2]bool
}

// Generators returns one generator per thread; they share the Zipf tables.
func (w Workload) Generators() ([]*Generator, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	pages := w.RegionSize / w.PageSize
	sharedPages := pages / 2
	privPages := (pages - sharedPages) / uint64(w.Threads)
	var zs, zp *zipf
	if w.Skew > 0 {
		zs, zp = newZipf(sharedPages, w.Skew), newZipf(privPages, w.Skew)
	}
	gs := make([]*Generator, w.Threads)
	for t := range gs {
		gs[t] = &Generator{
			w:       w,
			rng:     rand.New(rand.NewPCG(w.Seed, uint64(t)+1)),
			shared:  area{0, sharedPages, zs},
			private: area{sharedPages + uint64(t)*privPages, privPages, zp},
		}
	}
	return gs, nil
}

// Next returns the thread's next access.
func (g *Generator) Next() Op {
	which, a := 1, g.private
	if g.rng.Float64() < g.w.SharingRatio {
		which, a = 0, g.shared
	}
	var page uint64
	if g.used[which] && g.rng.Float64() < g.w.Locality {
		page = g.last[which]
	} else {
		if a.zipf != nil {
			page = a.first + a.zipf.next(g.rng)
		} else {
			page = a.first + g.rng.Uint64N(a.pages)
		}
		g.last[which], g.used[which] = page, true
	}
	slots := g.w.PageSize / g.w.AccessSize
	off := page*g.w.PageSize + g.rng.Uint64N(slots)*g.w.AccessSize
	return Op{Write: g.rng.Float64() >= g.w.ReadRatio, Offset: off}
}

// zipf draws 0..n-1 with P(i) proportional to 1/(i+1)^theta, 0 < theta < 1,
// by the closed-form approximation of Gray et al. ("Quickly generating
// billion-record synthetic databases", 1994), as YCSB does: O(n) set-up, O(1)
// per draw, no table.
type zipf struct {
	n                   uint64
	theta, alpha, zetan float64
	eta, half           float64
}

func newZipf(n uint64, theta float64) *zipf {
	zeta := func(n uint64) float64 {
		s := 0.0
		for i := uint64(1); i <= n; i++ {
			s += 1 / math.Pow(float64(i), theta)
		}
		return s
	}
	z := &zipf{n: n, theta: theta, alpha: 1 / (1 - theta), zetan: zeta(n)}
	z.eta = (1 - math.Pow(2/float64(n), 1-theta)) / (1 - zeta(2)/z.zetan)
	z.half = 1 + math.Pow(0.5, theta)
	return z
}

func (z *zipf) next(rng *rand.Rand) uint64 {
	if z.n <= 1 {
		return 0
	}
	u := rng.Float64()
	uz := u * z.zetan
	if uz < 1 {
		return 0
	}
	if uz < z.half {
		return 1
	}
	v := uint64(float64(z.n) * math.Pow(z.eta*u-z.eta+1, z.alpha))
	return min(v, z.n-1)
}
