package node

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
	"github.com/dsmkit/dsm/node/pagestore"
)

// BenchmarkSync measures a Sync of 64 dirty 4 KiB pages on an in-process
// three-node cluster (one backup), written from the node that is neither
// their home nor their backup: memory (the write-back), durable (the
// write-back and the persist requests) and, for scale, one synced pagestore
// Write of the same 64 pages. Each op writes the pages and syncs them, so
// durable minus memory is the cost of persisting.
//
//	go test ./node -run '^$' -bench BenchmarkSync -benchtime 50x
func BenchmarkSync(b *testing.B) {
	const pages = 64
	data := bytes.Repeat([]byte{0xa5}, pages*4096)
	for _, d := range []dsmpb.Durability{dsmpb.Durability_DURABILITY_MEMORY, dsmpb.Durability_DURABILITY_DURABLE} {
		b.Run(map[dsmpb.Durability]string{dsmpb.Durability_DURABILITY_MEMORY: "memory", dsmpb.Durability_DURABILITY_DURABLE: "durable"}[d], func(b *testing.B) {
			ms := startCluster(b, 3)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			cr, err := ms[0].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "bench", Size: 1 << 20, Durability: d})
			if err != nil {
				b.Fatal(err)
			}
			waitServed(ctx, b, ms, "bench")
			es := ms[0].n.eng
			re, err := es.get(ids.RegionID(cr.Region.Id))
			if err != nil {
				b.Fatal(err)
			}
			es.mu.RLock()
			pm := re.last
			home, _ := pm.nodeOf(re.chains.homeOf(pm)(0))
			backup, _ := pm.nodeOf(re.chains.backupsOf(pm)(0)[0])
			es.mu.RUnlock()
			w := ms[0]
			for _, m := range ms {
				if id := ids.NodeID(m.n.cfg.ID); id != home && id != backup {
					w = m
				}
			}
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			for i := range b.N {
				data[0] = byte(i)
				if _, err := w.adm.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{Region: "bench", Data: data}); err != nil {
					b.Fatal(err)
				}
				if _, err := w.cli.Sync(ctx, &dsmpb.SyncRequest{Region: "bench"}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("pagestore", func(b *testing.B) {
		s, err := pagestore.Open(pagestore.Options{Dir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		ps := make([]pagestore.Page, pages)
		for i := range ps {
			ps[i] = pagestore.Page{Region: 1, No: uint64(i), Version: 1, Data: data[i*4096 : (i+1)*4096]}
		}
		b.SetBytes(int64(len(data)))
		b.ResetTimer()
		for range b.N {
			if err := s.Write(context.Background(), ps); err != nil {
				b.Fatal(err)
			}
		}
	})
}
