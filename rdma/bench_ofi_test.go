//go:build ofi

package rdma_test

// The ofi rows of the transport benchmarks (build tag ofi, libfabric):
//
//	go test -tags ofi ./rdma -run '^$' -bench . -benchmem
//
// adds BenchmarkRead/ofi-shm/4KiB, BenchmarkRead/ofi-tcp/4KiB (the
// tcp;ofi_rxm provider) and the same rows of every other benchmark beside
// the tcp and mem ones.

import (
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/ofi"
)

func init() {
	benchBackends = append(benchBackends,
		benchBackend{Name: "ofi-shm", New: newOFIPair("shm")},
		benchBackend{Name: "ofi-tcp", New: newOFIPair("tcp;ofi_rxm")},
	)
}

func newOFIPair(prov string) func(b *testing.B) (rdma.Transport, rdma.Transport) {
	return func(b *testing.B) (rdma.Transport, rdma.Transport) {
		b.Helper()
		var ts [2]rdma.Transport
		for i := range ts {
			tr, err := ofi.Listen(ids.NodeID(i+1), "127.0.0.1:0", ofi.Config{Provider: prov})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { tr.Close() })
			ts[i] = tr
		}
		connectPair(b, ts[0], ts[1])
		return ts[0], ts[1]
	}
}
