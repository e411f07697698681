package tcp_test

import (
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/rdmatest"
	"github.com/dsmkit/dsm/rdma/tcp"
)

// newCluster starts n endpoints on loopback with node ids 1..n, each told
// the address of every other.
func newCluster(t testing.TB, n int) []rdma.Transport {
	t.Helper()
	return newClusterWith(t, n, func(ids.NodeID) tcp.Config { return tcp.Config{} })
}

// newClusterWith is newCluster with endpoint id configured by cfgOf.
func newClusterWith(t testing.TB, n int, cfgOf func(ids.NodeID) tcp.Config) []rdma.Transport {
	t.Helper()
	ts := make([]rdma.Transport, n)
	for i := range ts {
		id := ids.NodeID(i + 1)
		tr, err := tcp.Listen(id, "127.0.0.1:0", cfgOf(id))
		if err != nil {
			t.Fatal(err)
		}
		ts[i] = tr
		t.Cleanup(func() { tr.Close() })
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

func TestConformance(t *testing.T) {
	rdmatest.Run(t, rdmatest.Backend{Name: "tcp", New: newCluster})
}
