package tcp

import (
	"bytes"
	"testing"

	"github.com/dsmkit/dsm/rdma"
)

// BenchmarkSessionCost measures, without the network, the work that
// exactly-once execution adds to a batch (docs/benchmarks.md):
//
//	go test ./rdma/tcp -run '^$' -bench SessionCost -cpu 1 -count 8
//
// execute-FAA is the responder executing one FAA and building its
// response, serve-FAA the same through the session (its lock, the floor,
// the record of the response); number is the requester's side: handing
// out a sequence number and finishing it.
func BenchmarkSessionCost(b *testing.B) {
	setup := func(b *testing.B) (*conn, []wireOp) {
		tr := fuzzTransport()
		reg, err := tr.table.Register(make([]byte, 4096), rdma.AccessAll)
		if err != nil {
			b.Fatal(err)
		}
		sc := &streamConn{r: bytes.NewReader(nil)}
		c := newConn(tr, sc, sc, 2, false)
		c.sess, _ = tr.openSession(2, 1)
		return c, []wireOp{{kind: rdma.OpFAA, key: reg.Descriptor().RKey.Key, a: 1}}
	}
	b.Run("execute-FAA", func(b *testing.B) {
		c, w := setup(b)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			fb, _ := c.execute(uint64(i+1), w)
			putBuf(fb)
		}
	})
	b.Run("serve-FAA", func(b *testing.B) {
		c, w := setup(b)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			id := uint64(i + 1)
			fb, err := c.sess.serve(c, id, id, w)
			if err != nil {
				b.Fatal(err)
			}
			putBuf(fb)
		}
	})
	b.Run("number", func(b *testing.B) {
		s := newOutSession()
		ctx := b.Context()
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			q, err := s.acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			s.release(q)
		}
	})
}
