package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/dsmkit/dsm/directory"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
	"github.com/dsmkit/dsm/node/engine"
	"github.com/dsmkit/dsm/node/localcache"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startOne starts a single-node cluster on free loopback ports.
func startOne(t *testing.T) (*Node, *grpc.ClientConn) {
	t.Helper()
	dir := t.TempDir()
	cfg := Default()
	cfg.ID, cfg.DataDir, cfg.BootstrapExpect = 1, dir, 1
	cfg.GossipAddr, cfg.RaftAddr, cfg.RPCAddr, cfg.VerbsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.MetricsAddr = "127.0.0.1:0"
	cfg.CacheSize = 8 << 20
	n, err := New(cfg, Options{})
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
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return n, conn
}

func waitHealthy(t testing.TB, adm dsmpb.AdminClient) *dsmpb.StatusResponse {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := adm.Status(ctx, &dsmpb.StatusRequest{})
		cancel()
		if err == nil && st.Health.Verdict == dsmpb.Health_VERDICT_HEALTHY {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("not healthy after 30 s: %v %v", st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func code(err error) codes.Code { return status.Code(err) }

func TestSingleNodeServices(t *testing.T) {
	n, conn := startOne(t)
	adm, cli := dsmpb.NewAdminClient(conn), dsmpb.NewClientClient(conn)
	st := waitHealthy(t, adm)
	if st.NodeId != 1 || st.LeaderId != 1 || len(st.Nodes) != 1 || st.Nodes[0].CacheCapacityBytes != 8<<20 || st.Version == "" {
		t.Fatalf("status = %v", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	cr, err := cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "r1", Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if cr.Region.Name != "r1" || cr.Region.Id == 0 || cr.Region.PageSize != 4096 ||
		cr.Region.Durability != dsmpb.Durability_DURABILITY_MEMORY || cr.Region.Shards != 4 {
		t.Fatalf("created %v", cr.Region)
	}
	if _, err := adm.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "r1", Size: 16 << 20}); code(err) != codes.AlreadyExists {
		t.Fatalf("same name, other size: %v", err)
	}
	for _, bad := range []*dsmpb.CreateRegionRequest{
		{Name: "", Size: 4096}, {Name: "z", Size: 0}, {Name: "z", Size: 4097},
		{Name: "z", Size: 1 << 20, PageSize: 3000}, {Name: "z", Size: 4096, Durability: 9},
	} {
		if _, err := cli.CreateRegion(ctx, bad); code(err) != codes.InvalidArgument {
			t.Errorf("CreateRegion(%v) = %v, want InvalidArgument", bad, err)
		}
	}
	ls, err := cli.ListRegions(ctx, &dsmpb.ListRegionsRequest{})
	if err != nil || len(ls.Regions) != 1 || ls.Regions[0].Name != "r1" {
		t.Fatalf("ListRegions = %v, %v", ls, err)
	}
	if _, err := cli.GetRegion(ctx, &dsmpb.GetRegionRequest{Name: "nope"}); code(err) != codes.NotFound {
		t.Fatalf("GetRegion(nope) = %v", err)
	}
	info, err := adm.RegionInfo(ctx, &dsmpb.RegionInfoRequest{Name: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	var pages uint64
	for i, sh := range info.Shards {
		if sh.Index != uint32(i) || sh.FirstPage != pages || sh.Home != 1 {
			t.Fatalf("shard %d = %v", i, sh)
		}
		pages += sh.PageCount
	}
	if pages != 2048 || len(info.Shards) != 4 {
		t.Fatalf("shards cover %d pages in %d shards", pages, len(info.Shards))
	}
	st, err = adm.Status(ctx, &dsmpb.StatusRequest{})
	if err != nil || st.RegionCount != 1 || st.Nodes[0].HomedShards != 4 {
		t.Fatalf("status after create = %v, %v", st, err)
	}
	// One node cannot hold the backup a region asks for: degraded, said why.
	if st.Health.Verdict != dsmpb.Health_VERDICT_DEGRADED || !strings.Contains(strings.Join(st.Health.Reasons, ";"), "backups") {
		t.Fatalf("health with a region and no room for backups = %v", st.Health)
	}
	rf, err := adm.Raft(ctx, &dsmpb.RaftRequest{})
	if err != nil || rf.Role != "leader" || len(rf.Configuration) != 1 || rf.Configuration[0].Addr != n.Addrs().Raft {
		t.Fatalf("Raft = %v, %v", rf, err)
	}
	ms, err := adm.Members(ctx, &dsmpb.MembersRequest{})
	if err != nil || len(ms.Members) != 1 || ms.Members[0].VerbsAddr != n.Addrs().Verbs ||
		ms.Members[0].State != dsmpb.MemberState_MEMBER_STATE_ALIVE {
		t.Fatalf("Members = %v, %v", ms, err)
	}

	// Memory calls go through the page cache and the region's engine
	// (this node homes every page). The engine starts when the region
	// reaches this node's view: wait for it.
	for {
		_, err := cli.Load(ctx, &dsmpb.LoadRequest{Region: "r1", Offset: 8})
		if err == nil {
			break
		}
		if code(err) != codes.NotFound || ctx.Err() != nil {
			t.Fatalf("Load before any store = %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i, want := range []uint64{5, 10} {
		if a, err := cli.Add(ctx, &dsmpb.AddRequest{Region: "r1", Offset: 8, Delta: 5}); err != nil || a.NewValue != want {
			t.Fatalf("Add #%d = %v, %v; want %d", i, a, err, want)
		}
	}
	if c, err := cli.CompareAndSwap(ctx, &dsmpb.CompareAndSwapRequest{Region: "r1", Offset: 8, Old: 10, New: 20}); err != nil || !c.Swapped || c.Current != 20 {
		t.Fatalf("CAS 10->20 = %v, %v", c, err)
	}
	if c, err := cli.CompareAndSwap(ctx, &dsmpb.CompareAndSwapRequest{Region: "r1", Offset: 8, Old: 10, New: 30}); err != nil || c.Swapped || c.Current != 20 {
		t.Fatalf("CAS 10->30 = %v, %v", c, err)
	}
	if _, err := cli.Store(ctx, &dsmpb.StoreRequest{Region: "r1", Offset: 16, Value: 7}); err != nil {
		t.Fatal(err)
	}
	if l, err := cli.Load(ctx, &dsmpb.LoadRequest{Region: "r1", Offset: 16}); err != nil || l.Value != 7 {
		t.Fatalf("Load = %v, %v", l, err)
	}
	for name, err := range map[string]error{
		"unaligned": func() error { _, err := cli.Add(ctx, &dsmpb.AddRequest{Region: "r1", Offset: 4}); return err }(),
		"past end":  func() error { _, err := cli.Load(ctx, &dsmpb.LoadRequest{Region: "r1", Offset: 1 << 40}); return err }(),
		"long read": func() error {
			_, err := adm.ReadMemory(ctx, &dsmpb.ReadMemoryRequest{Region: "r1", Length: MaxMemoryIO + 1})
			return err
		}(),
	} {
		if code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if _, err := cli.Load(ctx, &dsmpb.LoadRequest{Region: "nope"}); code(err) != codes.NotFound {
		t.Errorf("unknown region: %v", err)
	}
	if _, err := adm.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{Region: "r1", Offset: 4094, Data: []byte("spans")}); err != nil {
		t.Fatal(err)
	}
	if m, err := adm.ReadMemory(ctx, &dsmpb.ReadMemoryRequest{Region: "r1", Offset: 4094, Length: 5}); err != nil || string(m.Data) != "spans" {
		t.Fatalf("ReadMemory = %q, %v", m.GetData(), err)
	}
	pg, err := adm.Pages(ctx, &dsmpb.PagesRequest{Region: "r1", PageCount: 3, Cluster: true})
	if err != nil || len(pg.Cells) != 3 || pg.Cells[0].Modified != 1 || pg.Cells[1].Modified != 1 || pg.Cells[2].Invalid != 1 ||
		pg.Cells[0].LocalState != dsmpb.PageState_PAGE_STATE_MODIFIED || len(pg.Cells[0].Owners) != 1 || pg.Cells[0].Owners[0] != 1 {
		t.Fatalf("Pages = %v, %v", pg, err)
	}
	if sy, err := cli.Sync(ctx, &dsmpb.SyncRequest{Region: "r1"}); err != nil || sy.PagesWritten != 2 {
		t.Fatalf("Sync = %v, %v; want 2 pages written", sy, err)
	}
	if l, err := cli.Load(ctx, &dsmpb.LoadRequest{Region: "r1", Offset: 8}); err != nil || l.Value != 20 {
		t.Fatalf("Load after Sync = %v, %v; want the written-back 20", l, err)
	}
	sts, err := adm.Stats(ctx, &dsmpb.StatsRequest{AllNodes: true})
	if err != nil || len(sts.Nodes) != 1 || sts.Nodes[0].Misses == 0 || sts.Nodes[0].Evictions != 2 || sts.Nodes[0].MissLatency.GetCount() == 0 {
		t.Fatalf("Stats = %v, %v", sts, err)
	}

	resp, err := http.Get("http://" + n.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"dsm_directory_regions 1", "dsm_raft_is_leader 1", "dsm_cache_capacity_bytes 8.388608e+06", "go_goroutines",
		"dsm_engine_regions 1", "dsm_miss_latency_seconds_count", `dsm_bytes_total{dir="in"}`,
		"dsm_lease_remaining_seconds ", "dsm_lease_suspensions_total 0"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(string(body), "dsm_lease_remaining_seconds -") {
		t.Errorf("the node serves without a lease:\n%s", body)
	}

	if _, err := cli.DeleteRegion(ctx, &dsmpb.DeleteRegionRequest{Name: "r1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.DeleteRegion(ctx, &dsmpb.DeleteRegionRequest{Name: "r1"}); code(err) != codes.NotFound {
		t.Fatalf("second delete = %v", err)
	}
}

func TestSocketInUse(t *testing.T) {
	n, _ := startOne(t)
	cfg := n.cfg
	cfg.ID = 2
	cfg.DataDir = filepath.Join(t.TempDir(), "other")
	cfg.Socket = n.Addrs().Socket
	m, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second node on a live socket: %v", err)
	}
}

func TestStatusError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{&directory.SpecError{Field: "size", Reason: "zero"}, codes.InvalidArgument},
		{directory.ErrRegionExists, codes.AlreadyExists},
		{directory.ErrNoRegion, codes.NotFound},
		{directory.ErrNoLeader, codes.Unavailable},
		{directory.ErrClosed, codes.Unavailable},
		{directory.ErrTooManyRegions, codes.ResourceExhausted},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{directory.ErrBadCommand, codes.Internal},
		{&net.OpError{Op: "dial", Err: io.EOF}, codes.Unavailable},
	} {
		if got := code(statusError(tc.err)); got != tc.want {
			t.Errorf("statusError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	if statusError(nil) != nil {
		t.Error("statusError(nil) != nil")
	}
	// A page that waits for a dead node is UNAVAILABLE with a detail that
	// tells it from dsmd itself being unavailable.
	ue := &engine.UnavailableError{Region: 1, Name: "fo", Page: 3, Node: 3, Role: "home", Why: "failed in epoch 7"}
	st := status.Convert(statusError(fmt.Errorf("read: %w", ue)))
	if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "page p3 of region fo (r1) unavailable: its home n3 failed in epoch 7") {
		t.Fatalf("status of %v: %v", ue, st)
	}
	var reason string
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			reason = info.GetReason() + " " + info.GetMetadata()["node"] + " " + info.GetMetadata()["role"]
		}
	}
	if reason != PageUnavailableReason+" n3 home" {
		t.Fatalf("detail of %v: %q", ue, reason)
	}
}

// With a Coherence the node runs the page cache: it serves the mapping
// socket and follows the directory's regions into the cache.
func TestPageCacheFollowsRegions(t *testing.T) {
	dir := t.TempDir()
	cfg := Default()
	cfg.ID, cfg.DataDir, cfg.BootstrapExpect = 1, dir, 1
	cfg.GossipAddr, cfg.RaftAddr, cfg.RPCAddr, cfg.VerbsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	n, err := New(cfg, Options{Coherence: &localcache.MemHome{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if fi, err := os.Stat(n.Addrs().MapSocket); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("map socket %s: %v", n.Addrs().MapSocket, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := n.Directory().CreateRegion(ctx, directory.RegionSpec{Name: "c", Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if pages, err := n.cache.CachedPages(r.ID); err == nil {
			if pages != 0 {
				t.Fatalf("a new region holds %d pages", pages)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the cache never got the region")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// A new incarnation that cannot start (here its data directory is a file,
// as a full disk fails an open) is tried again with a backoff instead of
// ending the process, and starts once the cause is gone; the first
// incarnation's failure is returned at once.
func TestNewIncarnationRetries(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Default()
	cfg.ID, cfg.DataDir, cfg.BootstrapExpect = 1, dir, 1
	cfg.GossipAddr, cfg.RaftAddr, cfg.RPCAddr, cfg.VerbsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.CacheSize = 8 << 20
	var logs strings.Builder
	var mu sync.Mutex
	opts := Options{Logger: slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))}
	if n, err := startIncarnation(context.Background(), cfg, opts, false); err == nil || n != nil {
		t.Fatalf("the first incarnation started on a data directory that is a file: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		time.Sleep(1500 * time.Millisecond)
		os.Remove(dir)
	}()
	n, err := startIncarnation(ctx, cfg, opts, true)
	if err != nil || n == nil {
		t.Fatalf("a new incarnation did not start once the cause was gone: %v", err)
	}
	defer n.Close()
	mu.Lock()
	tries := strings.Count(logs.String(), "a new incarnation of this node could not start")
	mu.Unlock()
	if tries < 1 {
		t.Fatalf("no failed try was logged:\n%s", logs.String())
	}
	// A context that ends stops the tries: no error, no node.
	bad := cfg
	bad.DataDir = filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(bad.DataDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	if n, err := startIncarnation(short, bad, opts, true); n != nil || err != nil {
		t.Fatalf("tries after ctx ended: %v, %v", n, err)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
