//go:build linux

package localcache

import (
	"context"
	"testing"

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
