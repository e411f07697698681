package tests

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dsmkit/dsm/dsm"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// BenchmarkCluster measures the data path of a real three-node cluster
// on loopback from this process, a client of n1 (see docs/benchmarks.md):
//
//	go test ./tests -run '^$' -bench . -benchtime 2000x
//
// Each measurement comes with its baseline from the same run: a mapped
// hit against plain memory, a remote ReadAt miss against a Unix-socket
// plus a TCP round trip, the mapped ping-pong against a Unix socket.
func BenchmarkCluster(b *testing.B) {
	c := startCluster(b, 3)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	admin := func(i int) dsmpb.AdminClient {
		conn, err := grpc.NewClient("unix://"+c.nodes[i-1].socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		return dsmpb.NewAdminClient(conn)
	}
	adm := []dsmpb.AdminClient{nil, admin(1), admin(2), admin(3)}
	cl, err := dsm.Dial(ctx, c.nodes[0].socket)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cl.Close() })
	mapRegion := func(name string, size int64) *dsm.Region {
		if err := cl.CreateRegion(ctx, name, size); err != nil {
			b.Fatal(err)
		}
		r, err := cl.Map(ctx, name)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { r.Close() })
		return r
	}
	const ps = 4096

	b.Run("Load8/plain-memory", func(b *testing.B) {
		mem := make([]byte, ps)
		var sum uint64
		for i := 0; b.Loop(); i++ {
			sum += atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[(i*8)%ps])))
		}
		sink.Add(sum)
	})
	hit := mapRegion("bench-hit", 1<<20)
	b.Run("Load8/mapped-hit", func(b *testing.B) {
		if err := hit.Prefault(0, ps, false); err != nil {
			b.Fatal(err)
		}
		mem := hit.Bytes()
		var sum uint64
		for i := 0; b.Loop(); i++ {
			sum += atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[(i*8)%ps])))
		}
		sink.Add(sum)
	})

	// Misses go to pages whose home is another node, each page once.
	const missSize = 1 << 30
	miss := mapRegion("bench-miss", missSize)
	remote := remotePages(b, adm[1], "bench-miss", 1)
	var next atomic.Int64 // several goroutines take pages (remote-miss-threads)
	take := func(b *testing.B) int64 {
		i := next.Add(1) - 1
		if i >= int64(len(remote)) {
			b.Fatalf("ran out of untouched remote pages after %d", i)
		}
		return int64(remote[i]) * ps
	}
	b.Run("ReadAt4KiB/remote-miss", func(b *testing.B) {
		buf := make([]byte, ps)
		for b.Loop() {
			if _, err := miss.ReadAt(buf, take(b)); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The same misses from 16 goroutines at once, each on pages of its
	// own (issue 15: at least 5x the misses per second of one): ns/op is
	// the wall time per miss, so the ratio of remote-miss's to this one's
	// is the speed-up. ReadAt populates through madvise, a system call,
	// so the goroutines do not hold the process's Ps while they wait.
	b.Run("ReadAt4KiB/remote-miss-threads=16", func(b *testing.B) {
		b.SetParallelism((16 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		b.RunParallel(func(pb *testing.PB) {
			buf := make([]byte, ps)
			for pb.Next() {
				if _, err := miss.ReadAt(buf, take(b)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("ReadAt4KiB/baseline-unix+tcp-roundtrips", func(b *testing.B) {
		u, t := echoPair(b, "unix"), echoPair(b, "tcp")
		req, buf := make([]byte, 64), make([]byte, ps)
		for b.Loop() {
			roundTrip(b, u, req, buf)
			roundTrip(b, t, req, buf)
		}
	})
	b.Run("Load8/mapped-remote-miss", func(b *testing.B) {
		mem := miss.Bytes()
		var sum uint64
		for b.Loop() {
			sum += atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[take(b)])))
		}
		sink.Add(sum)
	})

	// A write to a page that k other nodes read: the upgrade invalidates k
	// sharers, in parallel.
	wr := mapRegion("bench-write", 1<<20)
	waitServed(b, ctx, adm[2:], "bench-write")
	for _, k := range []int{1, 2} {
		b.Run(fmt.Sprintf("Write8/sharers=%d", k), func(b *testing.B) {
			benchWriteSharers(b, ctx, adm[2:2+k], "bench-write", wr)
		})
	}

	// Same-host ping-pong of a 32-byte message with another process.
	ghz := cpuGHz()
	pp := mapRegion("bench-pingpong", 1<<20)
	b.Run("PingPong32B/mapped-region", func(b *testing.B) {
		stop, start := startPingPong(b, "-addr", c.nodes[0].socket, "-region", "bench-pingpong", "-off", "0")
		defer stop()
		pingRegion(b, ctx, pp, 0, start)
		reportCycles(b, ghz)
	})
	b.Run("PingPong32B/mapped-region-c-partner", func(b *testing.B) {
		// The far end is a C process (libdsm) instead of a Go one.
		cclient := filepath.Join(buildClib(b), "cclient")
		stop, start := startPartner(b, cclient, c.nodes[0].socket, "bench-pingpong", "pong", "512")
		defer stop()
		pingRegion(b, ctx, pp, 512, start)
		reportCycles(b, ghz)
	})
	b.Run("PingPong32B/unix-socket", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "pp.sock")
		stop, _ := startPingPong(b, "-unix", path)
		defer stop()
		conn, err := net.Dial("unix", path)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		msg, got := []byte("ping: a 32-byte message payload"), make([]byte, 32)
		msg = append(msg, 0)[:32]
		for b.Loop() {
			if _, err := conn.Write(msg); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(conn, got); err != nil {
				b.Fatal(err)
			}
		}
		reportCycles(b, ghz)
	})
}

var sink atomic.Uint64

// pingRegion is the pinger of a ping-pong through region r at off with a
// partner that announced start as the sequence word it holds for "no ping
// yet": it stores start+1, start+2, ... and waits for each to come back at
// off+128. Starting from the partner's word rather than from a load of its
// own leaves nothing to race: whatever the word held when the partner read
// it, the first ping differs from it.
func pingRegion(b *testing.B, ctx context.Context, r *dsm.Region, off int64, start uint64) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := r.Prefault(off, 256, true); err != nil {
		b.Fatal(err)
	}
	mem := r.Bytes()[off:]
	ping := (*uint64)(unsafe.Pointer(&mem[0]))
	pong := (*uint64)(unsafe.Pointer(&mem[128]))
	seq := start
	for b.Loop() {
		seq++
		copy(mem[8:32], "twenty-four byte payload")
		atomic.StoreUint64(ping, seq)
		for spins := 0; atomic.LoadUint64(pong) != seq; spins++ {
			if spins&0xfffff == 0xfffff && ctx.Err() != nil {
				b.Fatalf("no answer to ping %d (partner started at %d, ping word %d, pong word %d)",
					seq, start, atomic.LoadUint64(ping), atomic.LoadUint64(pong))
			}
		}
		if mem[128+8] != 't' {
			b.Fatalf("pong carries %q", mem[128+8:128+32])
		}
	}
}

// remotePages lists the pages of region whose home is not node self.
func remotePages(b *testing.B, adm dsmpb.AdminClient, region string, self uint32) []uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := adm.RegionInfo(ctx, &dsmpb.RegionInfoRequest{Name: region})
	if err != nil {
		b.Fatal(err)
	}
	var out []uint64
	for _, s := range info.Shards {
		if s.Home != self {
			for p := s.FirstPage; p < s.FirstPage+s.PageCount; p++ {
				out = append(out, p)
			}
		}
	}
	return out
}

// echoPair is one end of a connection to an echo server in this process
// that answers each 64-byte request with 4 KiB.
func echoPair(b *testing.B, network string) net.Conn {
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(b.TempDir(), "echo.sock")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		req, reply := make([]byte, 64), make([]byte, 4096)
		for {
			if _, err := io.ReadFull(c, req); err != nil {
				return
			}
			if _, err := c.Write(reply); err != nil {
				return
			}
		}
	}()
	conn, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close(); ln.Close(); wg.Wait() })
	return conn
}

func roundTrip(b *testing.B, c net.Conn, req, buf []byte) {
	if _, err := c.Write(req); err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		b.Fatal(err)
	}
}

var (
	pingpongOnce sync.Once
	pingpongBin  string
	pingpongErr  error
)

// startPingPong runs tests/internal/pingpong with args; see startPartner.
func startPingPong(b *testing.B, args ...string) (stop func(), start uint64) {
	pingpongOnce.Do(func() {
		pingpongBin = filepath.Join(filepath.Dir(dsmdBin), "pingpong")
		out, err := exec.Command("go", "build", "-o", pingpongBin, "github.com/dsmkit/dsm/tests/internal/pingpong").CombinedOutput()
		if err != nil {
			pingpongErr = fmt.Errorf("building pingpong: %v\n%s", err, out)
		}
	})
	if pingpongErr != nil {
		b.Fatal(pingpongErr)
	}
	return startPartner(b, pingpongBin, args...)
}

// startPartner runs the far end of a ping-pong, bin with args, waits until
// it prints "ready" and returns a function that stops it (by closing its
// stdin). A partner through a region prints "ready SEQ": SEQ is the
// sequence word it read before printing and takes for "no ping yet"; start
// is that word (0 for a bare "ready").
func startPartner(b *testing.B, bin string, args ...string) (stop func(), start uint64) {
	cmd := exec.Command(bin, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	word, seq, _ := strings.Cut(strings.TrimSpace(line), " ")
	if seq != "" && err == nil {
		start, err = strconv.ParseUint(seq, 10, 64)
	}
	if err != nil || word != "ready" {
		cmd.Process.Kill()
		cmd.Wait()
		b.Fatalf("pingpong did not get ready: %q %v", line, err)
	}
	return func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}, start
}

// cpuGHz is the clock of the first CPU as /proc/cpuinfo reports it (0 when
// unknown).
func cpuGHz() float64 {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return mhz / 1000
			}
		}
	}
	return 0
}

// reportCycles adds cycles per operation at the CPU's nominal clock.
func reportCycles(b *testing.B, ghz float64) {
	if ghz > 0 && b.N > 0 {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)*ghz, "cycles/op")
	}
}

// BenchmarkWriteSharers9 measures a write to a page that k of the other
// eight nodes of a nine-node cluster read: the upgrade invalidates k
// sharers in parallel, so 8 sharers should cost little more than 1.
func BenchmarkWriteSharers9(b *testing.B) {
	const nodes = 9
	c := startCluster(b, nodes)
	for i := 1; i <= nodes; i++ {
		c.waitHealthy(i)
	}
	// The region's homes are the members alive at its creation: wait for
	// all nine in the directory.
	eventually(b, "nine alive members", time.Minute, func() error {
		var ms struct {
			Members []struct {
				State string `json:"state"`
			} `json:"members"`
		}
		c.ctlJSON(1, &ms, "members")
		alive := 0
		for _, m := range ms.Members {
			if m.State == "alive" {
				alive++
			}
		}
		if alive != nodes {
			return fmt.Errorf("%d alive", alive)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	adm := make([]dsmpb.AdminClient, nodes+1)
	for i := 1; i <= nodes; i++ {
		conn, err := grpc.NewClient("unix://"+c.nodes[i-1].socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		adm[i] = dsmpb.NewAdminClient(conn)
	}
	cl, err := dsm.Dial(ctx, c.nodes[0].socket)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cl.Close() })
	if err := cl.CreateRegion(ctx, "bench-wide", 1<<20); err != nil {
		b.Fatal(err)
	}
	wr, err := cl.Map(ctx, "bench-wide")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { wr.Close() })
	waitServed(b, ctx, adm[2:], "bench-wide")
	for _, k := range []int{1, 8} {
		b.Run(fmt.Sprintf("sharers=%d", k), func(b *testing.B) {
			benchWriteSharers(b, ctx, adm[2:2+k], "bench-wide", wr)
		})
	}
}

// waitServed waits until every node of adm serves region (their views
// learn of a new region a moment after the node that created it).
func waitServed(b *testing.B, ctx context.Context, adm []dsmpb.AdminClient, region string) {
	for i, a := range adm {
		eventually(b, fmt.Sprintf("node %d of %d serves %s", i+1, len(adm), region), 30*time.Second, func() error {
			_, err := a.ReadMemory(ctx, &dsmpb.ReadMemoryRequest{Region: region, Length: 8})
			return err
		})
	}
}

// benchWriteSharers times WriteAt of the first word of region through wr
// while the nodes of sharers and this node hold the page Shared: each
// write is an upgrade that invalidates len(sharers) other copies. The
// sharers read in parallel, untimed, before each write.
func benchWriteSharers(b *testing.B, ctx context.Context, sharers []dsmpb.AdminClient, region string, wr *dsm.Region) {
	word := make([]byte, 8)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		var wg sync.WaitGroup
		for _, a := range sharers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := a.ReadMemory(ctx, &dsmpb.ReadMemoryRequest{Region: region, Length: 8}); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
		if _, err := wr.ReadAt(word, 0); err != nil { // this node shares it too
			b.Fatal(err)
		}
		b.StartTimer()
		binary.LittleEndian.PutUint64(word, uint64(i))
		if _, err := wr.WriteAt(word, 0); err != nil {
			b.Fatal(err)
		}
	}
}
