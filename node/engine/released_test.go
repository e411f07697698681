package engine

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/node/localcache"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/fault"
	"github.com/dsmkit/dsm/rdma/mem"
)

// faultCluster is a three-node cluster whose node 1 sends its one-sided
// operations through a fault wrapper.
func faultCluster(t *testing.T, mod func(*Config)) (map[ids.NodeID]*testNode, *fault.Transport) {
	net := mem.NewNetwork()
	var f1 *fault.Transport
	nodes := clusterOver(t, func(id ids.NodeID) (rdma.Transport, error) {
		ep, err := net.Endpoint(id)
		if id == 1 && err == nil {
			f1 = fault.Wrap(ep, 1)
			return f1, nil
		}
		return ep, err
	}, mod)
	return nodes, f1
}

// waitDowngraded polls until node n's cache holds page p Shared: the
// engine took the Modified copy for a recall, and its release is posted.
func waitDowngraded(t *testing.T, n *testNode, p ids.PageNo) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for n.pages.State(testRegion, p) != localcache.Shared {
		if time.Now().After(deadline) {
			t.Fatalf("page %v never downgraded: %v", p, n.pages.State(testRegion, p))
		}
		time.Sleep(time.Millisecond)
	}
}

// A Sync that comes while the page it must cover is being given up to a
// recall finds it Shared in the cache, not Modified: WaitReleases is what
// holds it back until the release reached the home (the lost synced write
// of chaos seed 660008, docs/reliability.md).
func TestWaitReleasesCoversRecalledPage(t *testing.T) {
	nodes, f1 := faultCluster(t, nil)
	ctx := testCtx(t)
	n1, n2, n3 := nodes[1], nodes[2], nodes[3]
	const p = ids.PageNo(1) // homed at n2
	data := bytes.Repeat([]byte{0x6b}, testPageSize)
	if err := n1.pages.Write(ctx, n1.e, testRegion, p, testPageSize, 0, data); err != nil {
		t.Fatal(err)
	}
	// Every batch of n1 to the home waits 400 ms: the release is in
	// flight for that long.
	if err := f1.SetRules(fault.Rule{Traffic: fault.Ops, Action: fault.Delay, Peer: 2, Prob: 1, Delay: 400 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	readDone := make(chan error, 1)
	go func() {
		got, err := n3.pages.Read(ctx, n3.e, testRegion, p, testPageSize)
		if err == nil && !bytes.Equal(got, data) {
			err = errors.New("n3 read other data than n1 wrote")
		}
		readDone <- err
	}()
	waitDowngraded(t, n1, p)
	reclaimed, err := n1.e.WaitReleases(ctx, 0, testPages)
	if err != nil || len(reclaimed) > 0 {
		t.Fatalf("WaitReleases: %v, %v; want none, nil", reclaimed, err)
	}
	if st := f1.Stats(); st.DelayedBatches == 0 {
		t.Fatal("no batch was delayed: the test did not hold a release back")
	}
	if _, got := slot(n2.e, p); !bytes.Equal(got, data) {
		t.Fatalf("WaitReleases returned before the release reached the home: its slot holds %x", got[:8])
	}
	if err := <-readDone; err != nil {
		t.Fatal(err)
	}
	// Nothing in a release: it returns at once.
	if r, err := n1.e.WaitReleases(ctx, 0, testPages); err != nil || len(r) > 0 {
		t.Fatalf("idle WaitReleases: %v, %v", r, err)
	}
}

// A release that cannot reach the home fails the wait after
// UnavailableAfter, naming the home, instead of blocking the Sync forever.
func TestWaitReleasesUnavailable(t *testing.T) {
	nodes, f1 := faultCluster(t, func(c *Config) { c.UnavailableAfter = 300 * time.Millisecond })
	ctx := testCtx(t)
	n1, n3 := nodes[1], nodes[3]
	const p = ids.PageNo(1) // homed at n2
	if err := n1.pages.Write(ctx, n1.e, testRegion, p, testPageSize, 0, []byte("lost?")); err != nil {
		t.Fatal(err)
	}
	if err := f1.SetRules(fault.Rule{Traffic: fault.Ops, Action: fault.Drop, Peer: 2, Prob: 1}); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = n3.pages.Read(ctx, n3.e, testRegion, p, testPageSize) }()
	waitDowngraded(t, n1, p)
	_, err := n1.e.WaitReleases(ctx, 0, testPages)
	var ue *UnavailableError
	if !errors.As(err, &ue) || ue.Node != 2 || ue.Role != "home" {
		t.Fatalf("WaitReleases with the home unreachable: %v, want unavailable naming home n2", err)
	}
	if err := f1.SetRules(); err != nil { // heal: the read completes
		t.Fatal(err)
	}
}
