package engine

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/node/localcache"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/fault"
	"github.com/dsmkit/dsm/rdma/mem"
)

// availCluster is cluster with a short UnavailableAfter.
func availCluster(t *testing.T, after time.Duration) map[ids.NodeID]*testNode {
	t.Helper()
	net := mem.NewNetwork()
	return clusterOver(t, func(id ids.NodeID) (rdma.Transport, error) { return net.Endpoint(id) },
		func(c *Config) { c.UnavailableAfter = after })
}

func wantUnavailable(t *testing.T, err error, node ids.NodeID, role, why string) *UnavailableError {
	t.Helper()
	var ue *UnavailableError
	if !errors.As(err, &ue) || !errors.Is(err, ErrUnavailable) || !errors.Is(err, localcache.ErrUnavailable) {
		t.Fatalf("err = %v, want an *UnavailableError", err)
	}
	if ue.Node != node || ue.Role != role || !strings.Contains(ue.Why, why) {
		t.Fatalf("err = %v (node %v, role %q, why %q), want node %v as %s, %q", err, ue.Node, ue.Role, ue.Why, node, role, why)
	}
	return ue
}

// A page whose home is down fails at once, by name; the other pages are
// served; SetUp serves it again.
func TestHomeDownFailsAtOnce(t *testing.T) {
	nodes := availCluster(t, time.Hour)
	ctx := testCtx(t)
	n1 := nodes[1]
	const p = ids.PageNo(2) // homed at n3
	n1.e.SetDown(3, "failed")
	start := time.Now()
	_, err := n1.pages.Read(ctx, n1.e, testRegion, p, testPageSize)
	ue := wantUnavailable(t, err, 3, "home", "failed")
	if ue.Page != p || ue.Region != testRegion {
		t.Fatalf("error names %v of %v, want %v of %v", ue.Page, ue.Region, p, testRegion)
	}
	if ue.Waited != 0 {
		t.Fatalf("waited %v: a call on a down home must fail before it waits", ue.Waited)
	}
	if _, err := n1.e.Add(ctx, p, 0, 1); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Add on the down home's page: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Logf("the failing calls took %v", d) // not a pass/fail timing: a loaded machine is slow
	}
	if got := n1.e.Down(); got[3] != "failed" || len(got) != 1 {
		t.Fatalf("Down() = %v", got)
	}
	// Pages homed elsewhere are served.
	if err := n1.pages.Write(ctx, n1.e, testRegion, 1, testPageSize, 0, []byte{7}); err != nil {
		t.Fatalf("write of a page homed at n2: %v", err)
	}
	n1.e.SetUp(3)
	if _, err := n1.e.Add(ctx, p, 0, 1); err != nil {
		t.Fatalf("Add after SetUp: %v", err)
	}
}

// A page whose departed home's pages are awaited (a durable region's
// shard, which a page store brings back) does not fail at once: the call
// waits, is served when the home is up again, and otherwise fails after
// UnavailableAfter, not as lost.
func TestAwaitedHomeWaits(t *testing.T) {
	nodes := availCluster(t, 500*time.Millisecond)
	ctx := testCtx(t)
	n1 := nodes[1]
	const p = ids.PageNo(2) // homed at n3
	n1.e.SetDownAwaited(3, "restarted: its pages come back")
	_, err := n1.pages.Read(ctx, n1.e, testRegion, p, testPageSize)
	ue := wantUnavailable(t, err, 3, "home", "come back")
	if ue.Lost || errors.Is(err, localcache.ErrLost) {
		t.Fatalf("an awaited page failed as lost: %v", err)
	}
	if ue.Waited < 500*time.Millisecond {
		t.Fatalf("gave up after %v, before the bound", ue.Waited)
	}
	// SetDown after SetDownAwaited: it fails at once again.
	n1.e.SetDown(3, "failed")
	_, err = n1.e.Add(ctx, p, 0, 1)
	if ue := wantUnavailable(t, err, 3, "home", "failed"); ue.Waited != 0 {
		t.Fatalf("a plainly down home's page waited %v", ue.Waited)
	}

	// Without a bound, a call waits until the home is up again.
	n1 = availCluster(t, time.Hour)[1]
	n1.e.SetDownAwaited(3, "restarted: its pages come back")
	res := make(chan error, 1)
	go func() {
		_, err := n1.e.Add(ctx, p, 0, 1)
		res <- err
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-res:
		t.Fatalf("Add on an awaited home's page returned before the home was up: %v", err)
	default:
	}
	n1.e.SetUp(3)
	if err := <-res; err != nil {
		t.Fatalf("Add that waited for an awaited home: %v", err)
	}
}

// A home that does not answer makes a waiting call fail after
// UnavailableAfter, naming the home and the transport's error.
func TestUnreachableHomeFailsAfterBound(t *testing.T) {
	nodes := availCluster(t, 300*time.Millisecond)
	ctx := testCtx(t)
	if err := nodes[3].ep.Close(); err != nil {
		t.Fatal(err)
	}
	n1 := nodes[1]
	_, err := n1.pages.Read(ctx, n1.e, testRegion, 2, testPageSize)
	ue := wantUnavailable(t, err, 3, "home", "unreachable")
	if ue.Waited < 300*time.Millisecond {
		t.Fatalf("gave up after %v, before the bound", ue.Waited)
	}
	if ctx.Err() != nil {
		t.Fatal("the call ran into the test's deadline instead of the bound")
	}
}

// A write that waits for a holder that died fails once the holder is set
// down and the bound passed; it names the holder.
func TestDownHolderFailsAfterBound(t *testing.T) {
	nodes := availCluster(t, 300*time.Millisecond)
	ctx := testCtx(t)
	n1, n2, n3 := nodes[1], nodes[2], nodes[3]
	const p = ids.PageNo(0) // homed at n1
	if err := n2.pages.Write(ctx, n2.e, testRegion, p, testPageSize, 0, []byte{1}); err != nil {
		t.Fatal(err)
	}
	// n2 dies holding p Modified: nothing answers its recalls.
	if err := n2.e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n2.ep.Close(); err != nil {
		t.Fatal(err)
	}
	n3.e.SetDown(2, "failed")
	err := n3.pages.Write(ctx, n3.e, testRegion, p, testPageSize, 0, []byte{2})
	wantUnavailable(t, err, 2, "holder", "failed")
	_ = n1
}

// An eviction on a page whose home is down at once is refused before the
// engine takes it: the cache keeps the page Modified. One that the engine
// took over and then gave up on is pending: the data stays with the engine
// (the cache must not take the page back), and the write-back lands when
// the home is reachable again.
func TestEvictPendingKeepsData(t *testing.T) {
	nodes, f1 := faultCluster(t, func(c *Config) { c.UnavailableAfter = 300 * time.Millisecond })
	ctx := testCtx(t)
	n1 := nodes[1]
	const p = ids.PageNo(1) // homed at n2
	data := bytes.Repeat([]byte{0x5a}, testPageSize)
	if err := n1.pages.Write(ctx, n1.e, testRegion, p, testPageSize, 0, data); err != nil {
		t.Fatal(err)
	}
	n1.e.SetDown(2, "failed")
	if err := n1.pages.Evict(ctx, n1.e, testRegion, p); !errors.Is(err, ErrUnavailable) || errors.Is(err, localcache.ErrEvictPending) {
		t.Fatalf("Evict with the home down: %v, want unavailable and not pending", err)
	}
	if st := n1.pages.State(testRegion, p); st != localcache.Modified {
		t.Fatalf("the page is %v after a refused eviction, want M", st)
	}
	n1.e.SetUp(2)
	// n2 cannot be reached: the write-back is posted, fails, is retried,
	// and the call gives up after the bound.
	f1.Partition(2)
	err := n1.pages.Evict(ctx, n1.e, testRegion, p)
	if !errors.Is(err, localcache.ErrEvictPending) {
		t.Fatalf("Evict while the home is unreachable: %v, want pending", err)
	}
	wantUnavailable(t, err, 2, "home", "unreachable")
	if st := n1.pages.State(testRegion, p); st != localcache.Invalid {
		t.Fatalf("the page is %v in the cache after a pending eviction", st)
	}
	// The home is back: the retried write-back lands, and another node
	// reads the data.
	f1.Heal(2)
	got, err := nodes[3].pages.Read(ctx, nodes[3].e, testRegion, p, testPageSize)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("after the pending write-back: %x, want %x", got, data)
	}
}

// Contention is not unavailability: a call that waits behind other nodes
// taking turns is never failed by the bound.
func TestContentionNeverUnavailable(t *testing.T) {
	nodes := availCluster(t, time.Millisecond)
	ctx := testCtx(t)
	const p = ids.PageNo(0)
	errc := make(chan error, 3)
	for id := ids.NodeID(1); id <= 3; id++ {
		go func() {
			for range 200 {
				if _, err := nodes[id].e.Add(ctx, p, 8, 1); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range 3 {
		if err := <-errc; err != nil {
			t.Fatalf("Add under contention with UnavailableAfter 1ms: %v", err)
		}
	}
	if v, err := nodes[2].e.Load(ctx, p, 8); err != nil || v != 600 {
		t.Fatalf("Load = %d, %v; want 600", v, err)
	}
}

// A home whose answers stall (a verbs connection that TCP keeps alive but
// that carries nothing: after a loss, its retransmissions back off for
// tens of seconds) makes a waiting call fail after the bound, naming the
// home, although every Post is still in flight without an error. Before,
// such a call waited as long as the stall (chaos seed 660007: 21 s).
func TestStalledHomeFailsAfterBound(t *testing.T) {
	nodes, f1 := faultCluster(t, func(c *Config) { c.UnavailableAfter = 300 * time.Millisecond })
	ctx := testCtx(t)
	n1 := nodes[1]
	const p = ids.PageNo(2) // homed at n3
	if err := f1.SetRules(fault.Rule{Traffic: fault.Ops, Action: fault.Delay, Peer: 3, Prob: 1, Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	_, err := n1.pages.Read(ctx, n1.e, testRegion, p, testPageSize)
	ue := wantUnavailable(t, err, 3, "home", "has not answered")
	if ue.Waited < unansweredFloor {
		t.Fatalf("gave up after %v, before the bound", ue.Waited)
	}
	if ctx.Err() != nil {
		t.Fatal("the call ran into the test's deadline instead of the bound")
	}
	// Pages homed elsewhere are served meanwhile.
	if err := n1.pages.Write(ctx, n1.e, testRegion, 1, testPageSize, 0, []byte{7}); err != nil {
		t.Fatalf("write of a page homed at n2: %v", err)
	}
}

// A call that waits long without being unavailable (here: a home whose
// answers stall, with no bound on unavailability) is logged once, with the
// page's state as this node sees it and the batches in flight, so that a
// call found stuck can be explained from the log.
func TestLongWaitLogged(t *testing.T) {
	defer func(d time.Duration) { longWait = d }(longWait)
	longWait = 200 * time.Millisecond
	var logs syncBuffer
	nodes, f1 := faultCluster(t, func(c *Config) {
		c.UnavailableAfter = -1
		if c.ID == 1 {
			c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		}
	})
	ctx, cancel := context.WithTimeout(testCtx(t), time.Second)
	defer cancel()
	const p = ids.PageNo(2) // homed at n3
	if err := f1.SetRules(fault.Rule{Traffic: fault.Ops, Action: fault.Delay, Peer: 3, Prob: 1, Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes[1].pages.Read(ctx, nodes[1].e, testRegion, p, testPageSize); err == nil {
		t.Fatal("the read of a page whose home stalls returned")
	}
	out := logs.String()
	if strings.Count(out, "a call has waited long") != 1 || !strings.Contains(out, "n1 p2: I") || !strings.Contains(out, "to n3 for") {
		t.Fatalf("log: %s", out)
	}
	t.Log(out)
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A live member that holds a page's tenure and never releases it (here:
// the recalls to it are lost; in a real cluster, a dsmd whose engine is
// stuck while its lease goes on) makes a waiting call fail after
// StallAfter, naming it as the holder, although it is never set down and
// the page's home answers every batch. Once it answers again the page is
// served, with its data.
func TestStalledHolderFailsAfterBound(t *testing.T) {
	nodes, f1 := faultCluster(t, func(c *Config) { c.StallAfter = 300 * time.Millisecond })
	ctx := testCtx(t)
	const p = ids.PageNo(2) // homed at n3
	data := []byte{1, 2, 3, 4}
	if err := nodes[2].pages.Write(ctx, nodes[2].e, testRegion, p, testPageSize, 0, data); err != nil {
		t.Fatal(err)
	}
	if err := f1.SetRules(fault.Rule{Traffic: fault.Messages, Action: fault.Drop, Peer: 2, Prob: 1}); err != nil {
		t.Fatal(err)
	}
	_, err := nodes[1].pages.Read(ctx, nodes[1].e, testRegion, p, testPageSize)
	ue := wantUnavailable(t, err, 2, "holder", "without releasing it")
	if ue.Waited < 300*time.Millisecond {
		t.Fatalf("gave up after %v, before the bound", ue.Waited)
	}
	if err := f1.SetRules(); err != nil {
		t.Fatal(err)
	}
	got, err := nodes[1].pages.Read(ctx, nodes[1].e, testRegion, p, testPageSize)
	if err != nil {
		t.Fatalf("read once the holder answers: %v", err)
	}
	if !bytes.Equal(got[:len(data)], data) {
		t.Fatalf("read %x, want the holder's %x", got[:len(data)], data)
	}
}

// countingTransport counts the batches an engine posts.
type countingTransport struct {
	rdma.Transport
	posts atomic.Int64
}

func (c *countingTransport) Post(ctx context.Context, peer ids.NodeID, ops []rdma.Op) error {
	c.posts.Add(1)
	return c.Transport.Post(ctx, peer, ops)
}

// A suspended engine (its node's lease is over) posts no verb, to any
// node: its calls wait, and after Resume they are served, with the data
// they wrote where it belongs.
func TestSuspendPostsNothing(t *testing.T) {
	net := mem.NewNetwork()
	counted := &countingTransport{}
	nodes := clusterOver(t, func(id ids.NodeID) (rdma.Transport, error) {
		ep, err := net.Endpoint(id)
		if id == 1 && err == nil {
			counted.Transport = ep
			return counted, nil
		}
		return ep, err
	}, nil)
	ctx := testCtx(t)
	n1 := nodes[1]
	n1.e.Suspend()
	if !n1.e.Suspended() {
		t.Fatal("Suspended() is false after Suspend")
	}
	before := counted.posts.Load()
	added := make(chan error, 1)
	go func() {
		_, err := n1.e.Add(ctx, 1, 0, 5) // homed at n2
		added <- err
	}()
	wrote := make(chan error, 1)
	go func() { wrote <- n1.pages.Write(ctx, n1.e, testRegion, 2, testPageSize, 0, []byte{9, 8, 7}) }() // homed at n3
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-added:
		t.Fatalf("Add returned while the engine was suspended: %v", err)
	case err := <-wrote:
		t.Fatalf("a write miss returned while the engine was suspended: %v", err)
	default:
	}
	if n := counted.posts.Load() - before; n != 0 {
		t.Fatalf("the suspended engine posted %d batches", n)
	}
	n1.e.Resume()
	if err := <-added; err != nil {
		t.Fatalf("Add after Resume: %v", err)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("write after Resume: %v", err)
	}
	if counted.posts.Load() == before {
		t.Fatal("nothing was posted after Resume")
	}
	n2 := nodes[2]
	got, err := n2.e.Add(ctx, 1, 0, 0)
	if err != nil || got != 5 {
		t.Fatalf("n2 reads the counter as %d (%v); want the 5 that n1 added", got, err)
	}
	data, err := n2.pages.Read(ctx, n2.e, testRegion, 2, testPageSize)
	if err != nil || !bytes.Equal(data[:3], []byte{9, 8, 7}) {
		t.Fatalf("n2 reads page 2 as %x (%v); want what n1 wrote", data[:3], err)
	}
}
