//go:build ofi

package ofi

import (
	"context"
	"testing"

	"github.com/dsmkit/dsm/rdma"
)

// BenchmarkOp times one lone operation at a time from one endpoint to
// another of the same process, per provider and kind: the shm rows of
// docs/benchmarks.md ("The ofi rows") compare WRITE, CAS and FAA with
// READ, which needs nothing of the target's CPU. Compare ratios within one
// run (benchstat), never across machines or loads:
//
//	go test -tags ofi ./rdma/ofi -run '^$' -bench '^BenchmarkOp$' -count 5
func BenchmarkOp(b *testing.B) {
	for _, prov := range providers {
		b.Run(prov, func(b *testing.B) {
			a, tgt := benchPair(b, prov)
			mem, err := rdma.Alloc(4096)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { rdma.Free(mem) })
			reg, err := tgt.Register(mem, rdma.AccessAll)
			if err != nil {
				b.Fatal(err)
			}
			rk := reg.Descriptor().RKey
			buf := make([]byte, 4096)
			for _, k := range []struct {
				name string
				op   rdma.Op
			}{
				{"read-4KiB", rdma.Op{Kind: rdma.OpRead, RKey: rk, Buf: buf}},
				{"write-4KiB", rdma.Op{Kind: rdma.OpWrite, RKey: rk, Buf: buf}},
				{"cas", rdma.Op{Kind: rdma.OpCAS, RKey: rk, Offset: 8}},
				{"faa", rdma.Op{Kind: rdma.OpFAA, RKey: rk, Offset: 16, Operand: 1}},
			} {
				b.Run(k.name, func(b *testing.B) {
					ctx := context.Background()
					ops := []rdma.Op{k.op}
					b.ReportAllocs()
					for i := 0; i < b.N; i++ {
						ops[0] = k.op
						if err := a.Post(ctx, 2, ops); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}

// benchPair is pair for benchmarks.
func benchPair(b *testing.B, prov string) (*Transport, *Transport) {
	b.Helper()
	x, err := Listen(1, "127.0.0.1:0", Config{Provider: prov})
	if err != nil {
		b.Fatal(err)
	}
	y, err := Listen(2, "127.0.0.1:0", Config{Provider: prov})
	if err != nil {
		x.Close()
		b.Fatal(err)
	}
	b.Cleanup(func() { x.Close(); y.Close() })
	if err := x.AddPeer(2, y.Addr()); err != nil {
		b.Fatal(err)
	}
	if err := y.AddPeer(1, x.Addr()); err != nil {
		b.Fatal(err)
	}
	return x, y
}
