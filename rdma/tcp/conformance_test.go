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
	ts := make([]rdma.Transport, n)
	for i := range ts {
		tr, err := tcp.Listen(ids.NodeID(i+1), "127.0.0.1:0", tcp.Config{})
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
