package node

import (
	"math"
	"sync/atomic"
	"time"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// histogram is a lock-free latency histogram with exponential buckets
// (1 us to about 17 s, doubling), for miss latencies.
type histogram struct {
	bounds []uint64 // inclusive upper bounds, ns
	counts []atomic.Uint64
	count  atomic.Uint64
	sum    atomic.Uint64
	max    atomic.Uint64
}

func newHistogram() *histogram {
	var bounds []uint64
	for b := uint64(1000); b <= 1<<34; b *= 2 {
		bounds = append(bounds, b)
	}
	bounds = append(bounds, math.MaxUint64)
	return &histogram{bounds: bounds, counts: make([]atomic.Uint64, len(bounds))}
}

func (h *histogram) observe(d time.Duration) {
	ns := uint64(max(d, 0))
	i := 0
	for i < len(h.bounds)-1 && ns > h.bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.count.Add(1)
	h.sum.Add(ns)
	for {
		m := h.max.Load()
		if ns <= m || h.max.CompareAndSwap(m, ns) {
			break
		}
	}
}

// snapshot returns the cumulative buckets and interpolated percentiles.
func (h *histogram) snapshot() *dsmpb.Histogram {
	out := &dsmpb.Histogram{Count: h.count.Load(), SumNs: h.sum.Load(), MaxNs: h.max.Load()}
	raw := make([]uint64, len(h.counts))
	var total uint64
	for i := range h.counts {
		raw[i] = h.counts[i].Load()
		total += raw[i]
	}
	var cum uint64
	for i, c := range raw {
		cum += c
		if i == len(raw)-1 {
			break // the +Inf bucket is implied by count
		}
		out.Buckets = append(out.Buckets, &dsmpb.Histogram_Bucket{UpperBoundNs: h.bounds[i], Count: cum})
	}
	q := func(p float64) uint64 {
		if total == 0 {
			return 0
		}
		rank := p * float64(total)
		var cum float64
		lo := uint64(0)
		for i, c := range raw {
			if c > 0 && cum+float64(c) >= rank {
				hi := h.bounds[i]
				if i == len(raw)-1 {
					return out.MaxNs
				}
				v := float64(lo) + (rank-cum)/float64(c)*float64(hi-lo)
				return min(uint64(v), out.MaxNs)
			}
			cum += float64(c)
			lo = h.bounds[i]
		}
		return out.MaxNs
	}
	out.P50Ns, out.P90Ns, out.P99Ns, out.P999Ns = q(0.5), q(0.9), q(0.99), q(0.999)
	return out
}
