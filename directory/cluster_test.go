package directory_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/testports"
	"github.com/dsmkit/dsm/internal/tlsconf"
)

// testTiming is LANTiming with faster reconciliation, so tests converge
// quickly; Raft and gossip keep the production values.
func testTiming() directory.Timing {
	t := directory.LANTiming()
	t.ReconcileInterval = 200 * time.Millisecond
	t.ReapAfter = 10 * time.Second
	return t
}

// freeAddr returns a loopback address whose port is free for TCP and UDP
// (gossip binds both) and given to no other test process.
func freeAddr(t testing.TB) string { return testports.Addr(t) }

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("DIRECTORY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

type cluster struct {
	t testing.TB
	// base holds the nodes' data directories. It is made before the
	// cleanup that closes the nodes is registered, so it is removed after
	// they are closed (cleanups run last registered first): a node still
	// running must not find its Raft log deleted under it.
	base  string
	mu    sync.Mutex
	cfgs  map[ids.NodeID]directory.Config
	nodes map[ids.NodeID]*directory.Directory
	// tls, when set, is the directory of a cluster CA: every node gets a
	// certificate from it and runs Raft and the RPC over mutual TLS.
	tls string
}

func newCluster(t testing.TB) *cluster {
	c := &cluster{t: t, base: t.TempDir(), cfgs: map[ids.NodeID]directory.Config{}, nodes: map[ids.NodeID]*directory.Directory{}}
	t.Cleanup(func() {
		for _, d := range c.live() {
			d.Close()
		}
	})
	return c
}

// config makes (once) the configuration of node id; later calls return the
// same addresses and data directory, so a restart finds its state.
func (c *cluster) config(id ids.NodeID, expect, maxVoters int, join []string) directory.Config {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cfg, ok := c.cfgs[id]; ok {
		return cfg
	}
	cfg := directory.Config{
		NodeID: id, DataDir: filepath.Join(c.base, id.String()),
		GossipAddr: freeAddr(c.t), RaftAddr: freeAddr(c.t), RPCAddr: freeAddr(c.t),
		GRPCAddr: fmt.Sprintf("127.0.0.1:%d", 7000+id), VerbsAddr: fmt.Sprintf("127.0.0.1:%d", 8000+id),
		Join: join, BootstrapExpect: expect, MaxVoters: maxVoters,
		Timing: testTiming(), Logger: testLogger(c.t),
	}
	if c.tls != "" {
		cfg.TLS = tlsManager(c.t, c.tls, tlsconf.Request{Node: id})
	}
	c.cfgs[id] = cfg
	return cfg
}

func (c *cluster) start(cfg directory.Config) *directory.Directory {
	c.t.Helper()
	d, err := directory.Open(cfg)
	if err != nil {
		c.t.Fatalf("open %v: %v", cfg.NodeID, err)
	}
	c.mu.Lock()
	c.nodes[cfg.NodeID] = d
	c.mu.Unlock()
	return d
}

// startN starts nodes 1..n, the first `expect` of them bootstrapping.
func (c *cluster) startN(n, expect, maxVoters int) { c.startNWith(n, expect, maxVoters, nil) }

// startNWith is startN with mod applied to every node's configuration
// first (when not nil); later calls of config return the modified one, so
// a restart keeps it.
func (c *cluster) startNWith(n, expect, maxVoters int, mod func(*directory.Config)) {
	c.t.Helper()
	seed := c.config(1, expect, maxVoters, nil).GossipAddr
	for i := 1; i <= n; i++ {
		e := expect
		if i > expect {
			e = 0
		}
		var join []string
		if i > 1 {
			join = []string{seed}
		}
		cfg := c.config(ids.NodeID(i), e, maxVoters, join)
		if mod != nil {
			mod(&cfg)
			c.mu.Lock()
			c.cfgs[cfg.NodeID] = cfg
			c.mu.Unlock()
		}
		c.start(cfg)
	}
}

func (c *cluster) stop(id ids.NodeID) {
	c.t.Helper()
	c.mu.Lock()
	d := c.nodes[id]
	delete(c.nodes, id)
	c.mu.Unlock()
	if err := d.Close(); err != nil {
		c.t.Errorf("close %v: %v", id, err)
	}
}

func (c *cluster) node(id ids.NodeID) *directory.Directory {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

func (c *cluster) live() []*directory.Directory {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*directory.Directory, 0, len(c.nodes))
	for _, d := range c.nodes {
		out = append(out, d)
	}
	return out
}

// waitFor polls cond until it holds or a generous deadline passes. The
// deadline only catches hangs; nothing is asserted about how long it took.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// leader waits until every live node agrees on one leader and returns it.
func (c *cluster) leader() *directory.Directory {
	c.t.Helper()
	var l *directory.Directory
	waitFor(c.t, "a leader all live nodes agree on", func() bool {
		l = nil
		var id ids.NodeID
		for _, d := range c.live() {
			s := d.RaftStats()
			if s.Leader == ids.None || (id != ids.None && s.Leader != id) {
				return false
			}
			id = s.Leader
		}
		l = c.node(id)
		return l != nil
	})
	return l
}

// waitMembers waits until every live node's replica lists exactly the given
// nodes as alive.
func (c *cluster) waitMembers(alive ...ids.NodeID) {
	c.t.Helper()
	want := fmt.Sprint(alive)
	waitFor(c.t, "alive members "+want+" everywhere", func() bool {
		for _, d := range c.live() {
			if got := fmt.Sprint(d.View().Alive()); got != want {
				return false
			}
		}
		return true
	})
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func spec(name string) directory.RegionSpec {
	return directory.RegionSpec{Name: name, Size: 1 << 30}
}

func idsUpTo(n int) []ids.NodeID {
	out := make([]ids.NodeID, n)
	for i := range out {
		out[i] = ids.NodeID(i + 1)
	}
	return out
}

// tlsManager issues a certificate for r with the CA in caDir (made on
// first use) and loads it.
func tlsManager(t testing.TB, caDir string, r tlsconf.Request) *tlsconf.Manager {
	t.Helper()
	ca, err := tlsconf.LoadCA(caDir)
	if err != nil {
		if ca, err = tlsconf.CreateCA(caDir); err != nil {
			t.Fatal(err)
		}
	}
	is, err := ca.Issue(r)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f, err := tlsconf.WriteIssued(dir, r, is, false)
	if err != nil {
		t.Fatal(err)
	}
	f.CA = filepath.Join(caDir, tlsconf.CAFile)
	m, err := tlsconf.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
