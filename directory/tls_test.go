package directory_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/tlsconf"
)

// TestTLSCluster runs three replicas with Raft and the forwarding RPC over
// mutual TLS: a follower's write reaches the leader, and the RPC and Raft
// ports serve nobody without a node certificate of the cluster CA.
func TestTLSCluster(t *testing.T) {
	c := newCluster(t)
	c.tls = t.TempDir()
	c.startN(3, 3, 3)
	l := c.leader()
	c.waitMembers(1, 2, 3)
	ctx := ctxT(t)
	var follower *directory.Directory
	for _, d := range c.live() {
		if d != l {
			follower = d
			break
		}
	}
	r, err := follower.CreateRegion(ctx, spec("over-tls"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := follower.LinearizableView(ctx); err != nil {
		t.Fatal(err)
	}

	rpc := l.Addrs().RPC
	member := tlsManager(t, c.tls, tlsconf.Request{Node: 2})
	v, err := directory.RemoteViewTLS(ctx, rpc, member.ClientConfig(tlsconf.AnyNode))
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := v.Region("over-tls"); !ok || got.ID != r.ID {
		t.Fatal("the view over TLS lacks the region")
	}

	client := tlsManager(t, c.tls, tlsconf.Request{Client: true})
	other := tlsManager(t, t.TempDir(), tlsconf.Request{Node: 2})
	for name, cfg := range map[string]*tls.Config{
		"no TLS":             nil,
		"client certificate": client.ClientConfig(tlsconf.AnyNode),
		"another CA":         rogue(other),
		"no certificate":     {MinVersion: tls.VersionTLS13, InsecureSkipVerify: true},
		"not a member":       tlsManager(t, c.tls, tlsconf.Request{Node: 9}).ClientConfig(tlsconf.AnyNode),
	} {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := directory.RemoteViewTLS(cctx, rpc, cfg)
		cancel()
		if err == nil {
			t.Errorf("%s: the forwarding RPC answered", name)
		}
		t.Logf("%s: %v", name, err)
	}

	// Node 4 holds a certificate of the cluster CA that names node 5: it
	// gossips (gossip is not encrypted here), but the leader records a
	// node only once its directory RPC proves the node id over mutual
	// TLS, so n4 is never a member nor in Raft, and never gets the log;
	// node 6, with its own certificate, joins after it and does.
	seed := c.config(1, 3, 3, nil).GossipAddr
	cfg4 := c.config(4, 0, 3, []string{seed})
	cfg4.TLS = tlsManager(t, c.tls, tlsconf.Request{Node: 5})
	n4 := c.start(cfg4)
	n6 := c.start(c.config(6, 0, 3, []string{seed}))
	if _, err := l.CreateRegion(ctx, spec("after-n4")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "n6 replicates the region", func() bool {
		_, ok := n6.Region("after-n4")
		return ok
	})
	if _, ok := l.View().Member(4); ok {
		t.Fatal("n4, whose certificate names n5, was recorded as a member")
	}
	if st := l.RaftStats(); slices.Contains(st.NonVoters, 4) || slices.Contains(st.Voters, 4) {
		t.Fatalf("n4, whose certificate names n5, is in the Raft configuration: %+v", st)
	}
	if _, ok := n4.Region("over-tls"); ok {
		t.Fatal("n4, whose certificate names n5, received the Raft log")
	}
	if st := n4.RaftStats(); st.LastIndex != 0 {
		t.Fatalf("n4, whose certificate names n5, has Raft entries: %+v", st)
	}

	// A plain TCP client on the Raft port gets no answer: its bytes are
	// not a TLS handshake, and the connection is closed.
	nc, err := net.Dial("tcp", l.Addrs().Raft)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var b [9]byte
	b[0] = 0 // rpcAppendEntries
	binary.BigEndian.PutUint64(b[1:], 1)
	nc.Write(b[:])
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := bufio.NewReader(nc).Read(b[:]); err == nil {
		t.Fatalf("raft answered a plain TCP client with %d bytes", n)
	}
}

// rogue presents m's certificate whatever the listener asks for and
// trusts any listener.
func rogue(m *tlsconf.Manager) *tls.Config {
	cfg := m.ClientConfig(nil)
	cfg.VerifyConnection = nil
	return cfg
}
