package mem_test

import (
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/mem"
	"github.com/dsmkit/dsm/rdma/rdmatest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newCluster(t testing.TB, n int) []rdma.Transport {
	net := mem.NewNetwork()
	ts := make([]rdma.Transport, n)
	for i := range ts {
		ep, err := net.Endpoint(ids.NodeID(i + 1))
		if err != nil {
			t.Fatal(err)
		}
		ts[i] = ep
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
	rdmatest.Run(t, rdmatest.Backend{Name: "mem", New: newCluster})
}
