package rdma_test

// Benchmarks of the verbs transport, one row per backend, in one run so
// that the ratios between rows hold (docs/benchmarks.md):
//
//	go test ./rdma -run '^$' -bench . -benchmem -count 5
//
// BenchmarkEcho is the floor: a bare Go TCP request/response on loopback
// with no framing, no registration table and no pooling;
// BenchmarkEchoPipelined64 is the same with 64 requests in flight. Every
// row reports ops/s and cpu-ns/op, the CPU time of both ends per op, which
// depends far less than ns/op on the load of a shared machine.
//
// The helpers below take any pair of rdma.Transport endpoints, so every
// backend gets the same rows by adding a benchBackend to benchBackends.

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/tlsconf"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/mem"
	"github.com/dsmkit/dsm/rdma/tcp"
)

// benchBackend makes two connected endpoints of one backend: node 1, the
// initiator, and node 2, the target; both know each other. The endpoints
// are closed by b.Cleanup.
type benchBackend struct {
	Name string
	New  func(b *testing.B) (initiator, target rdma.Transport)
}

// benchBackends lists the backends that every transport benchmark runs on.
//
// OFI ROWS: rdma/bench_ofi_test.go (build tag ofi) appends its providers
// here from an init function, e.g.
//
//	func init() {
//		benchBackends = append(benchBackends,
//			benchBackend{Name: "ofi-shm", New: newOFIPair("shm")},
//			benchBackend{Name: "ofi-tcp-rxm", New: newOFIPair("tcp;ofi_rxm")})
//	}
//
// and gets BenchmarkRead/ofi-shm/4KiB and the rest with no other change.
var benchBackends = []benchBackend{
	{Name: "tcp", New: newTCPPair},
	{Name: "tcp-tls", New: newTLSPair(false)},
	{Name: "tcp-tls-authonly", New: newTLSPair(true)},
	{Name: "mem", New: newMemPair},
}

func newTCPPair(b *testing.B) (rdma.Transport, rdma.Transport) {
	b.Helper()
	var ts [2]rdma.Transport
	for i := range ts {
		tr, err := tcp.Listen(ids.NodeID(i+1), "127.0.0.1:0", tcp.Config{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { tr.Close() })
		ts[i] = tr
	}
	connectPair(b, ts[0], ts[1])
	return ts[0], ts[1]
}

// newTLSPair is newTCPPair with mutual TLS 1.3: frames encrypted, or with
// authOnly, authenticated by the TLS handshake and then sent in plaintext
// (tcp.TLS.Plaintext).
func newTLSPair(authOnly bool) func(b *testing.B) (rdma.Transport, rdma.Transport) {
	return func(b *testing.B) (rdma.Transport, rdma.Transport) {
		b.Helper()
		dir := b.TempDir()
		ca, err := tlsconf.CreateCA(dir)
		if err != nil {
			b.Fatal(err)
		}
		var ts [2]rdma.Transport
		for i := range ts {
			id := ids.NodeID(i + 1)
			is, err := ca.Issue(tlsconf.Request{Node: id})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tlsconf.WriteIssued(dir, tlsconf.Request{Node: id}, is, false); err != nil {
				b.Fatal(err)
			}
			m, err := tlsconf.Load(tlsconf.FilesIn(dir, id))
			if err != nil {
				b.Fatal(err)
			}
			tr, err := tcp.Listen(id, "127.0.0.1:0", tcp.Config{TLS: &tcp.TLS{
				Server: m.ServerConfig(tlsconf.AnyNode), Client: m.ClientConfig(tlsconf.AnyNode),
				PeerNode: tlsconf.PeerNode, Plaintext: authOnly,
			}})
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

func newMemPair(b *testing.B) (rdma.Transport, rdma.Transport) {
	b.Helper()
	nw := mem.NewNetwork()
	var ts [2]rdma.Transport
	for i := range ts {
		ep, err := nw.Endpoint(ids.NodeID(i + 1))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ep.Close() })
		ts[i] = ep
	}
	connectPair(b, ts[0], ts[1])
	return ts[0], ts[1]
}

// connectPair tells each endpoint the other's address.
func connectPair(b *testing.B, x, y rdma.Transport) {
	b.Helper()
	if err := x.AddPeer(y.LocalID(), y.Addr()); err != nil {
		b.Fatal(err)
	}
	if err := y.AddPeer(x.LocalID(), x.Addr()); err != nil {
		b.Fatal(err)
	}
}

// benchRegion registers size bytes of off-heap memory at tr.
func benchRegion(b *testing.B, tr rdma.Transport, size int) rdma.RKey {
	b.Helper()
	m, err := rdma.Alloc(size)
	if err != nil {
		b.Fatal(err)
	}
	reg, err := tr.Register(m, rdma.AccessAll)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = reg.Deregister()
		_ = rdma.Free(m)
	})
	return reg.Descriptor().RKey
}

// benchOps measures one batch at a time, each waiting for its completion:
// the latency of a round trip. mk builds the batch once; it is reposted.
func benchOps(b *testing.B, be benchBackend, size int, mk func(rdma.RKey) []rdma.Op) {
	benchOpsCtx(b, context.Background(), be, size, mk)
}

// benchOpsCtx is benchOps with every Post under ctx.
func benchOpsCtx(b *testing.B, ctx context.Context, be benchBackend, size int, mk func(rdma.RKey) []rdma.Op) {
	init, tgt := be.New(b)
	rk := benchRegion(b, tgt, 1<<20)
	ops := mk(rk)
	peer := tgt.LocalID()
	// Connect and warm up outside the timing.
	if err := init.Post(ctx, peer, ops); err != nil {
		b.Fatal(err)
	}
	if size > 0 {
		b.SetBytes(int64(size))
	}
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	for range b.N {
		if err := init.Post(ctx, peer, ops); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	report(b, cpu0)
}

// benchPipelined keeps depth batches in flight at once (depth goroutines,
// each posting its own batch as soon as the previous one completed) and
// reports the throughput in ops/s.
func benchPipelined(b *testing.B, be benchBackend, depth, size int, mk func(rdma.RKey, int) []rdma.Op) {
	init, tgt := be.New(b)
	rk := benchRegion(b, tgt, 1<<20)
	ctx := context.Background()
	peer := tgt.LocalID()
	batches := make([][]rdma.Op, depth)
	for i := range batches {
		batches[i] = mk(rk, i)
		if err := init.Post(ctx, peer, batches[i]); err != nil {
			b.Fatal(err)
		}
	}
	if size > 0 {
		b.SetBytes(int64(size))
	}
	b.ReportAllocs()
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	errs := make(chan error, depth)
	start := make(chan struct{})
	for i := range depth {
		wg.Add(1)
		go func(ops []rdma.Op) {
			defer wg.Done()
			<-start
			for left.Add(-1) >= 0 {
				if err := init.Post(ctx, peer, ops); err != nil {
					errs <- err
					return
				}
			}
		}(batches[i])
	}
	cpu0 := cpuTime()
	b.ResetTimer()
	close(start)
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	report(b, cpu0)
}

// cpuTime is the CPU time (user and system) this process has used. Both
// ends of every benchmark run in this process, so CPU time per op counts
// the initiator's and the target's work, and unlike the wall time it
// hardly depends on what else the machine runs.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// report adds the throughput and the CPU cost per op, given the CPU time
// at the start of the timed loop.
func report(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

func readOp(n int) func(rdma.RKey) []rdma.Op {
	return func(rk rdma.RKey) []rdma.Op {
		return []rdma.Op{{Kind: rdma.OpRead, RKey: rk, Buf: make([]byte, n)}}
	}
}

func writeOp(n int) func(rdma.RKey) []rdma.Op {
	return func(rk rdma.RKey) []rdma.Op {
		return []rdma.Op{{Kind: rdma.OpWrite, RKey: rk, Buf: make([]byte, n)}}
	}
}

func casOp(rk rdma.RKey) []rdma.Op {
	// Compare never matches the word's value (0 plus FAAs of other rows
	// never run on this region), so the word stays put: a failing CAS costs
	// the same round trip as a successful one.
	return []rdma.Op{{Kind: rdma.OpCAS, RKey: rk, Compare: 1, Operand: 2}}
}

func faaOp(rk rdma.RKey) []rdma.Op {
	return []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}
}

func BenchmarkEcho(b *testing.B) {
	// The floor that BenchmarkRead/tcp/4KiB is held against: 4 KiB each
	// way, and the exact byte shape of a tcp READ of 4 KiB (a 56-byte
	// request, a 16-byte header and 4 KiB back).
	b.Run("4KiB", func(b *testing.B) { benchEcho(b, 4096, 4096) })
	b.Run("56B-4KiB", func(b *testing.B) { benchEcho(b, 56, 16+4096) })
}

// benchEcho measures a bare request/response over one loopback TCP
// connection: the client writes req bytes and reads resp bytes back, the
// server reads req bytes and writes resp bytes.
func benchEcho(b *testing.B, req, resp int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		in, out := make([]byte, req), make([]byte, resp)
		for {
			if _, err := io.ReadFull(c, in); err != nil {
				return
			}
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	out, in := make([]byte, req), make([]byte, resp)
	roundTrip := func() {
		if _, err := c.Write(out); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, in); err != nil {
			b.Fatal(err)
		}
	}
	roundTrip()
	b.SetBytes(int64(resp))
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	for range b.N {
		roundTrip()
	}
	b.StopTimer()
	report(b, cpu0)
	c.Close()
	wg.Wait()
}

func BenchmarkEchoPipelined64(b *testing.B) {
	// The ceiling for the pipelined rows: bare TCP with 64 requests in
	// flight, one goroutine writing requests and one reading responses.
	b.Run("56B-4KiB", func(b *testing.B) { benchEchoPipelined(b, 64, 56, 16+4096) })
}

func benchEchoPipelined(b *testing.B, depth, req, resp int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		in, out := make([]byte, req), make([]byte, resp)
		for {
			if _, err := io.ReadFull(c, in); err != nil {
				return
			}
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	credits := make(chan struct{}, depth)
	for range depth {
		credits <- struct{}{}
	}
	b.SetBytes(int64(resp))
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	wg.Add(1)
	go func() {
		defer wg.Done()
		out := make([]byte, req)
		for range b.N {
			<-credits
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	}()
	in := make([]byte, resp)
	for range b.N {
		if _, err := io.ReadFull(c, in); err != nil {
			b.Fatal(err)
		}
		credits <- struct{}{}
	}
	b.StopTimer()
	report(b, cpu0)
	c.Close()
	wg.Wait()
}

func BenchmarkRead(b *testing.B) {
	for _, be := range benchBackends {
		b.Run(be.Name+"/4KiB", func(b *testing.B) { benchOps(b, be, 4096, readOp(4096)) })
	}
}

// BenchmarkReadDeadline is BenchmarkRead with a context that can end, as
// callers with deadlines post: a backend may need to arm a cancellation.
func BenchmarkReadDeadline(b *testing.B) {
	for _, be := range benchBackends {
		b.Run(be.Name+"/4KiB", func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			benchOpsCtx(b, ctx, be, 4096, readOp(4096))
		})
	}
}

func BenchmarkWrite(b *testing.B) {
	for _, be := range benchBackends {
		b.Run(be.Name+"/4KiB", func(b *testing.B) { benchOps(b, be, 4096, writeOp(4096)) })
	}
}

func BenchmarkCAS(b *testing.B) {
	for _, be := range benchBackends {
		b.Run(be.Name, func(b *testing.B) { benchOps(b, be, 0, casOp) })
	}
}

func BenchmarkFAA(b *testing.B) {
	for _, be := range benchBackends {
		b.Run(be.Name, func(b *testing.B) { benchOps(b, be, 0, faaOp) })
	}
}

func BenchmarkReadPipelined64(b *testing.B) {
	for _, be := range benchBackends {
		b.Run(be.Name+"/4KiB", func(b *testing.B) {
			benchPipelined(b, be, 64, 4096, func(rk rdma.RKey, i int) []rdma.Op {
				return []rdma.Op{{Kind: rdma.OpRead, RKey: rk, Offset: uint64(i) * 4096, Buf: make([]byte, 4096)}}
			})
		})
	}
}

func BenchmarkWritePipelined64(b *testing.B) {
	for _, be := range benchBackends {
		b.Run(be.Name+"/4KiB", func(b *testing.B) {
			benchPipelined(b, be, 64, 4096, func(rk rdma.RKey, i int) []rdma.Op {
				return []rdma.Op{{Kind: rdma.OpWrite, RKey: rk, Offset: uint64(i) * 4096, Buf: make([]byte, 4096)}}
			})
		})
	}
}

func BenchmarkFAAPipelined64(b *testing.B) {
	for _, be := range benchBackends {
		b.Run(be.Name, func(b *testing.B) {
			benchPipelined(b, be, 64, 0, func(rk rdma.RKey, i int) []rdma.Op {
				return []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Offset: uint64(i) * 8, Operand: 1}}
			})
		})
	}
}
