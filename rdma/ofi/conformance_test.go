//go:build ofi

package ofi_test

import (
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/ofi"
	"github.com/dsmkit/dsm/rdma/rdmatest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cluster returns a constructor of n endpoints on provider prov, each of
// which knows every other.
func cluster(prov string) func(t testing.TB, n int) []rdma.Transport {
	return func(t testing.TB, n int) []rdma.Transport {
		ts := make([]rdma.Transport, 0, n)
		for i := 1; i <= n; i++ {
			tr, err := ofi.Listen(ids.NodeID(i), "127.0.0.1:0", ofi.Config{Provider: prov})
			if err != nil {
				for _, o := range ts {
					o.Close()
				}
				t.Fatalf("listen on %q: %v", prov, err)
			}
			ts = append(ts, tr)
		}
		for _, a := range ts {
			for _, b := range ts {
				if err := a.AddPeer(b.LocalID(), b.Addr()); err != nil {
					t.Fatal(err)
				}
			}
		}
		return ts
	}
}

func TestConformanceSockets(t *testing.T) {
	rdmatest.Run(t, rdmatest.Backend{Name: "ofi-sockets", New: cluster("sockets")})
}

func TestConformanceTCPRxM(t *testing.T) {
	rdmatest.Run(t, rdmatest.Backend{Name: "ofi-tcp", New: cluster("tcp;ofi_rxm")})
}

func TestConformanceShm(t *testing.T) {
	rdmatest.Run(t, rdmatest.Backend{Name: "ofi-shm", New: cluster("shm")})
}
