//go:build linux

package localcache

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
)

// BenchmarkFault measures one fault served across processes through the
// whole local path (client access, the Cache's reader and worker, MemHome,
// install and wake), per kind of access:
//
//	read-miss   ReadAt of a page not held (MISSING, ReadMiss, install S)
//	load-miss   plain load of a page not held (same, from a load)
//	store-miss  plain store to a page not held (MISSING, WriteMiss, install M)
//	minor       plain load of a page another client brought in (MINOR, no engine)
//	upgrade     plain store to a page held Shared (WP, WriteMiss upgrade)
//
// go test -run '^$' -bench Fault -benchtime 20000x ./node/localcache
func BenchmarkFault(b *testing.B) {
	for _, kind := range []string{"read-miss", "load-miss", "store-miss", "minor", "upgrade"} {
		b.Run(kind, func(b *testing.B) { benchFault(b, kind) })
	}
}

func benchFault(b *testing.B, kind string) {
	const pages = 4096
	const region ids.RegionID = 2
	d := newDaemon(b, 0)
	if err := d.c.AddRegion(RegionSpec{ID: region, Name: "bench", Size: pages * ps}); err != nil {
		b.Fatal(err)
	}
	a := d.client("A", "bench")
	other := d.client("B", "bench")
	ctx := context.Background()
	dst := make([]byte, ps)
	// Pages are used once per round; between rounds they are dropped.
	for done := 0; done < b.N; {
		n := min(b.N-done, pages)
		b.StopTimer()
		for p := 0; p < pages; p++ {
			if _, err := d.c.Invalidate(ctx, region, ids.PageNo(p), dst); err != nil {
				b.Fatal(err)
			}
		}
		switch kind {
		case "minor":
			other.ok("sweep read 0 %x %x", n, ps)
		case "upgrade":
			a.ok("sweep read 0 %x %x", n, ps)
		}
		b.StartTimer()
		switch kind {
		case "read-miss":
			a.ok("sweep read 0 %x %x", n, ps)
		case "load-miss", "minor":
			a.ok("sweep load 0 %x %x", n, ps)
		case "store-miss", "upgrade":
			a.ok("sweep store 0 %x %x", n, ps)
		}
		done += n
	}
}

// BenchmarkSuspend measures Suspend with 2048 Modified and 2048 Shared
// pages held, mapped in one or two clients, laid out in runs (the Modified
// pages consecutive, then the Shared ones), scattered (every other page:
// one copy per Modified page) or sparse (one page every 4 MiB: the worst
// case, one write protection per Modified page per client and one copy per
// Modified page; still one punch). Beside it, writeback is the per-page
// path of a write-back or downgrade over the same pages: Flush (each
// Modified page write-protected in every client, copied, punched and
// written back to MemHome) and an Invalidate of each Shared page. Both
// report ns/page over all the pages held.
//
// go test -run '^$' -bench Suspend -benchtime 10x ./node/localcache
func BenchmarkSuspend(b *testing.B) {
	for _, layout := range []string{"runs", "scattered", "sparse"} {
		for _, clients := range []int{1, 2} {
			for _, how := range []string{"suspend", "writeback"} {
				name := fmt.Sprintf("%s/clients=%d/%s", layout, clients, how)
				stride := map[string]int64{"runs": 1, "scattered": 2, "sparse": 1024}[layout]
				b.Run(name, func(b *testing.B) { benchSuspend(b, 2048, 2048, stride, clients, how) })
			}
		}
	}
}

func benchSuspend(b *testing.B, mod, shr int, stride int64, clients int, how string) {
	const region ids.RegionID = 2
	stride *= ps
	pages := int64(mod + shr)
	d := newDaemon(b, 0)
	if err := d.c.AddRegion(RegionSpec{ID: region, Name: "bench", Size: pages * stride}); err != nil {
		b.Fatal(err)
	}
	a := d.client("A", "bench")
	var other *proc
	if clients == 2 {
		other = d.client("B", "bench")
	}
	ctx := context.Background()
	var elapsed time.Duration
	var sum SuspendStats
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		a.ok("sweep store 0 %x %x", mod, stride)
		a.ok("sweep load %x %x %x", mod, shr, stride)
		if other != nil {
			other.ok("sweep load 0 %x %x", mod+shr, stride)
		}
		if s := d.c.Stats(); s.DirtyPages != int64(mod) || s.ResidentPages != pages {
			b.Fatalf("held %d pages, %d dirty; want %d, %d", s.ResidentPages, s.DirtyPages, pages, mod)
		}
		b.StartTimer()
		start := time.Now()
		switch how {
		case "suspend":
			st, err := d.c.Suspend(ctx)
			if err != nil || st.Punched != int(pages) || st.Aside != mod {
				b.Fatalf("Suspend: %+v, %v", st, err)
			}
			sum.WriteProtectTime += st.WriteProtectTime
			sum.CopyTime += st.CopyTime
			sum.PunchTime += st.PunchTime
		case "writeback":
			if n, err := d.c.Flush(ctx, region, 0, 0); err != nil || n != mod {
				b.Fatalf("Flush: %d, %v", n, err)
			}
			for j := int64(mod); j < pages; j++ {
				if _, err := d.c.Invalidate(ctx, region, ids.PageNo(j*stride/ps), nil); err != nil {
					b.Fatal(err)
				}
			}
		}
		elapsed += time.Since(start)
		b.StopTimer()
		if how == "suspend" {
			d.c.DiscardSuspended()
			d.c.Resume()
		}
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(int64(b.N)*pages) }
	b.ReportMetric(per(elapsed), "ns/page")
	if how == "suspend" {
		b.ReportMetric(per(sum.WriteProtectTime), "wp-ns/page")
		b.ReportMetric(per(sum.CopyTime), "copy-ns/page")
		b.ReportMetric(per(sum.PunchTime), "punch-ns/page")
	}
}

// BenchmarkEstimateSuspend measures EstimateSuspend itself, and reports
// its estimate per page.
func BenchmarkEstimateSuspend(b *testing.B) {
	var est time.Duration
	for b.Loop() {
		var err error
		if est, err = EstimateSuspend(estimateSample, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(est.Nanoseconds())/estimateSample, "est-ns/page")
}
