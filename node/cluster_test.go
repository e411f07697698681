package node

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/mapproto"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

type testMember struct {
	n   *Node
	cli dsmpb.ClientClient
	adm dsmpb.AdminClient
}

// startCluster starts a cluster of k in-process nodes on loopback.
func startCluster(t testing.TB, k int) []testMember {
	t.Helper()
	return startClusterOpts(t, k, func(int, *Config) Options { return Options{} })
}

// startClusterOpts is startCluster with the Options of node i (1..k),
// which may also change its configuration.
func startClusterOpts(t testing.TB, k int, opts func(i int, cfg *Config) Options) []testMember {
	t.Helper()
	var ms []testMember
	var join []string
	for i := 1; i <= k; i++ {
		m := startMember(t, uint32(i), k, join, opts)
		if i == 1 {
			join = []string{m.n.Addrs().Gossip}
		}
		ms = append(ms, m)
	}
	for _, m := range ms {
		waitHealthy(t, m.adm)
	}
	return ms
}

// startMember starts in-process node id on loopback, joining join (none:
// it bootstraps a cluster of expect), with the Options of opts, which may
// also change its configuration; it is closed when t ends.
func startMember(t testing.TB, id uint32, expect int, join []string, opts func(i int, cfg *Config) Options) testMember {
	t.Helper()
	cfg := Default()
	cfg.ID, cfg.DataDir, cfg.BootstrapExpect = id, t.TempDir(), expect
	cfg.GossipAddr, cfg.RaftAddr, cfg.RPCAddr, cfg.VerbsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.CacheSize = 8 << 20
	cfg.Join = join
	o := opts(int(id), &cfg)
	n, err := New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+n.Addrs().Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		if err := n.Close(); err != nil {
			t.Errorf("n%d Close: %v", id, err)
		}
	})
	return testMember{n: n, cli: dsmpb.NewClientClient(conn), adm: dsmpb.NewAdminClient(conn)}
}

// TestClusterCoherence runs the coherence engines of three nodes: memory
// written at one node is read at the others, and atomics from all nodes
// at once add up exactly.
func TestClusterCoherence(t *testing.T) {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := ms[0].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "c", Size: 64 << 12}); err != nil {
		t.Fatal(err)
	}
	// Every node serves the region once its view has it.
	for _, m := range ms {
		for {
			_, err := m.cli.Load(ctx, &dsmpb.LoadRequest{Region: "c"})
			if err == nil {
				break
			}
			if code(err) != codes.NotFound || ctx.Err() != nil {
				t.Fatalf("n%d: Load = %v", m.n.cfg.ID, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Writes at one node are read at the others, page by page across
	// every home.
	for round, w := range []int{0, 2, 1} {
		for p := uint64(0); p < 8; p++ {
			data := []byte(fmt.Sprintf("round %d page %d from n%d", round, p, w+1))
			if _, err := ms[w].adm.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{Region: "c", Offset: p<<12 + 100, Data: data}); err != nil {
				t.Fatalf("n%d write: %v", w+1, err)
			}
			for r := range ms {
				got, err := ms[r].adm.ReadMemory(ctx, &dsmpb.ReadMemoryRequest{Region: "c", Offset: p<<12 + 100, Length: uint32(len(data))})
				if err != nil || string(got.Data) != string(data) {
					t.Fatalf("n%d reads %q, %v; n%d wrote %q", r+1, got.GetData(), err, w+1, data)
				}
			}
		}
	}
	// Atomics from every node on two words of one page.
	const per = 100
	var wg sync.WaitGroup
	for _, m := range ms {
		for g := 0; g < 2; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range per {
					if _, err := m.cli.Add(ctx, &dsmpb.AddRequest{Region: "c", Offset: 8 * uint64(g), Delta: 1}); err != nil {
						t.Errorf("n%d Add: %v", m.n.cfg.ID, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	for _, m := range ms {
		for g := uint64(0); g < 2; g++ {
			l, err := m.cli.Load(ctx, &dsmpb.LoadRequest{Region: "c", Offset: 8 * g})
			if err != nil || l.Value != 3*per {
				t.Fatalf("n%d: word %d = %v, %v; want %d", m.n.cfg.ID, g, l, err, 3*per)
			}
		}
	}
	// The cluster view of page 0: Shared at all three after the loads.
	pg, err := ms[1].adm.Pages(ctx, &dsmpb.PagesRequest{Region: "c", PageCount: 1, Cluster: true})
	if err != nil || len(pg.Cells) != 1 || pg.Cells[0].Shared != 1 || pg.Cells[0].MaxSharers != 3 {
		t.Fatalf("Pages = %v, %v", pg, err)
	}
	st, err := ms[0].adm.Stats(ctx, &dsmpb.StatsRequest{AllNodes: true})
	if err != nil || len(st.Nodes) != 3 {
		t.Fatalf("Stats = %v, %v", st, err)
	}
	var inv uint64
	for _, ns := range st.Nodes {
		inv += ns.InvalidationsSent
	}
	if inv == 0 {
		t.Fatalf("no invalidation sent by any node: %v", st)
	}
}

// TestLateNodeServesOldRegion: a node that joins after a region was
// created takes part in its protocol under its own protocol id: it reads
// what was written before it came, and its writes are seen by the others
// (the region's homes stay the members alive at its creation).
func TestLateNodeServesOldRegion(t *testing.T) {
	ms := startCluster(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := ms[0].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "early", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := ms[0].cli.Store(ctx, &dsmpb.StoreRequest{Region: "early", Offset: 4096, Value: 41}); err != nil {
		t.Fatal(err)
	}
	cfg := Default()
	cfg.ID, cfg.DataDir = 2, t.TempDir()
	cfg.GossipAddr, cfg.RaftAddr, cfg.RPCAddr, cfg.VerbsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Join = []string{ms[0].n.Addrs().Gossip}
	n2, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n2.Start(); err != nil {
		t.Fatal(err)
	}
	defer n2.Close()
	conn, err := grpc.NewClient("unix://"+n2.Addrs().Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cli := dsmpb.NewClientClient(conn)
	for {
		r, err := cli.Load(ctx, &dsmpb.LoadRequest{Region: "early", Offset: 4096})
		if err == nil {
			if r.Value != 41 {
				t.Fatalf("the late node loads %d, want 41", r.Value)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("Load on the late node: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := cli.Add(ctx, &dsmpb.AddRequest{Region: "early", Offset: 4096, Delta: 1}); err != nil {
		t.Fatal(err)
	}
	r, err := ms[0].cli.Load(ctx, &dsmpb.LoadRequest{Region: "early", Offset: 4096})
	if err != nil || r.Value != 42 {
		t.Fatalf("the early node loads %v, %v after the late node's add; want 42", r, err)
	}
}

// TestLeaseSuspendsAndResumes: a node cut off from the majority of the
// Raft voters (here: the two others stopped) suspends local access when
// its lease ends: a load waits instead of answering. When the others come
// back (restarted from their data directories, as new incarnations) it is
// granted a lease again and resumes, and the value it wrote, which it held
// Modified all along (never synced), is read from it.
func TestLeaseSuspendsAndResumes(t *testing.T) {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := ms[0].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "l", Size: 64 << 12}); err != nil {
		t.Fatal(err)
	}
	n3 := ms[2]
	for {
		if _, err := n3.cli.Store(ctx, &dsmpb.StoreRequest{Region: "l", Offset: 8, Value: 77}); err == nil {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("Store on n3: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The lease page follows the lease, watchdogMargin early.
	waitFor(ctx, t, "n3's lease page shows its lease", func() bool {
		lp, ok := n3.n.cache.Lease()
		until := n3.n.dir.Lease().Until
		return ok && lp.State == mapproto.LeaseServing && lp.Incarnation == n3.n.dir.Nonce() &&
			lp.Deadline > directory.LeaseClock() && lp.Deadline <= until-watchdogMargin(n3.n.dir.LeaseRevoke())
	})
	var cfgs []Config
	for _, m := range ms[:2] {
		cfg, a := m.n.cfg, m.n.Addrs()
		cfg.GossipAddr, cfg.RaftAddr, cfg.RPCAddr, cfg.VerbsAddr = a.Gossip, a.Raft, a.RPC, a.Verbs
		cfg.Join = []string{n3.n.Addrs().Gossip}
		cfgs = append(cfgs, cfg)
		if err := m.n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(ctx, t, "n3 suspends local access", func() bool { return n3.n.cache.Suspended() })
	if !enginesSuspended(n3.n, true) {
		t.Fatal("n3's lease is over and its page cache suspended, but its engines still post verbs")
	}
	// The page says revoked once the suspension has punched every page
	// (it says suspended from the suspension's start until then).
	waitFor(ctx, t, "n3's lease page to say revoked", func() bool {
		lp, _ := n3.n.cache.Lease()
		return lp.State == mapproto.LeaseRevoked && lp.Deadline == 0
	})
	lctx, lcancel := context.WithTimeout(ctx, time.Second)
	_, err := n3.cli.Load(lctx, &dsmpb.LoadRequest{Region: "l", Offset: 8})
	lcancel()
	if code(err) != codes.DeadlineExceeded {
		t.Fatalf("a load on n3 without a lease: %v, want it to wait (deadline exceeded)", err)
	}
	for _, cfg := range cfgs {
		n, err := New(cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
	}
	l, err := n3.cli.Load(ctx, &dsmpb.LoadRequest{Region: "l", Offset: 8})
	if err != nil || l.Value != 77 {
		t.Fatalf("load on n3 after the majority came back: %v, %v; want 77", l, err)
	}
	if lp, _ := n3.n.cache.Lease(); lp.State != mapproto.LeaseServing || lp.Deadline == 0 {
		t.Fatalf("n3's lease page after the lease came back: %v", lp)
	}
	if n3.n.cache.Suspended() || n3.n.stats.leaseSuspends.Load() == 0 || n3.n.stats.leaseResumes.Load() == 0 {
		t.Fatalf("n3: suspended %v, lease ends %d, returns %d", n3.n.cache.Suspended(), n3.n.stats.leaseSuspends.Load(), n3.n.stats.leaseResumes.Load())
	}
	if !enginesSuspended(n3.n, false) {
		t.Fatal("n3's lease came back, but an engine still holds its verbs back")
	}
}

// enginesSuspended says whether every engine of n (at least one) is
// suspended (on) or posting (off).
func enginesSuspended(n *Node, on bool) bool {
	n.eng.mu.RLock()
	defer n.eng.mu.RUnlock()
	if len(n.eng.byID) == 0 {
		return false
	}
	for _, re := range n.eng.byID {
		if re.e.Suspended() != on {
			return false
		}
	}
	return true
}
