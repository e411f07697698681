package node

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/mapclient"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// BenchmarkRegionCycle runs region lives on an in-process three-node
// cluster (create, pages written on one node and read on another, a
// mapping cut off by a forced delete) and reports the live heap they leave
// behind: retained-B/cycle is the growth of the heap's live bytes (after
// two collections) divided by the cycles, after 20 cycles of warm-up. A
// region's life that leaks shows here in bytes, where make soak sees it in
// the resident memory of real processes.
//
//	go test ./node -run '^$' -bench RegionCycle -benchtime 200x
func BenchmarkRegionCycle(b *testing.B) {
	ms := startCluster(b, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	n := 0
	cycle := func() {
		n++
		name := fmt.Sprintf("cycle-%d", n)
		if _, err := ms[n%3].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: name, Size: 16 << 20}); err != nil {
			b.Fatal(err)
		}
		waitServed(ctx, b, ms, name)
		for p := uint64(0); p < 16; p++ {
			if _, err := ms[0].adm.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{Region: name, Offset: p * 4096, Data: []byte("cycle")}); err != nil {
				b.Fatal(err)
			}
			if _, err := ms[1].adm.ReadMemory(ctx, &dsmpb.ReadMemoryRequest{Region: name, Offset: p * 4096, Length: 5}); err != nil {
				b.Fatal(err)
			}
		}
		mc, err := mapclient.Connect(ctx, ms[2].n.Addrs().MapSocket)
		if err != nil {
			b.Fatal(err)
		}
		m, err := mc.Map(ctx, name)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ms[0].cli.DeleteRegion(ctx, &dsmpb.DeleteRegionRequest{Name: name, Force: true}); err != nil {
			b.Fatal(err)
		}
		<-m.Done()
		m.Close()
		mc.Close()
	}
	live := func() uint64 {
		runtime.GC()
		runtime.GC()
		var st runtime.MemStats
		runtime.ReadMemStats(&st)
		return st.HeapAlloc
	}
	for range 20 {
		cycle()
	}
	before := live()
	b.ResetTimer()
	for range b.N {
		cycle()
	}
	b.StopTimer()
	after := live()
	b.ReportMetric((float64(after)-float64(before))/float64(b.N), "retained-B/cycle")
}
