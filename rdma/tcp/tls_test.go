package tcp_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/tlsconf"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/rdmatest"
	"github.com/dsmkit/dsm/rdma/tcp"
)

// pki is a cluster CA in a directory, with certificates issued on demand.
type pki struct {
	dir string
	ca  *tlsconf.CA
}

func newPKI(t testing.TB) *pki {
	t.Helper()
	dir := t.TempDir()
	ca, err := tlsconf.CreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	return &pki{dir: dir, ca: ca}
}

// manager issues a certificate for r into a directory of its own (with
// the CA's certificate) and loads it.
func (p *pki) manager(t testing.TB, r tlsconf.Request) *tlsconf.Manager {
	t.Helper()
	dir := t.TempDir()
	is, err := p.ca.Issue(r)
	if err != nil {
		t.Fatal(err)
	}
	f, err := tlsconf.WriteIssued(dir, r, is, false)
	if err != nil {
		t.Fatal(err)
	}
	f.CA = filepath.Join(p.dir, tlsconf.CAFile)
	m, err := tlsconf.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func tlsOf(m *tlsconf.Manager, plaintext bool) *tcp.TLS {
	return &tcp.TLS{
		Server:    m.ServerConfig(tlsconf.AnyNode),
		Client:    m.ClientConfig(tlsconf.AnyNode),
		PeerNode:  tlsconf.PeerNode,
		Plaintext: plaintext,
	}
}

// tlsCluster is newCluster with mutual TLS, encrypted or, with plaintext,
// authenticated only.
func tlsCluster(plaintext bool) func(t testing.TB, n int) []rdma.Transport {
	return func(t testing.TB, n int) []rdma.Transport {
		t.Helper()
		p := newPKI(t)
		return newClusterWith(t, n, func(id ids.NodeID) tcp.Config {
			return tcp.Config{TLS: tlsOf(p.manager(t, tlsconf.Request{Node: id}), plaintext)}
		})
	}
}

func TestConformanceTLS(t *testing.T) {
	rdmatest.Run(t, rdmatest.Backend{Name: "tcp-tls", New: tlsCluster(false)})
}

func TestConformanceTLSPlaintext(t *testing.T) {
	rdmatest.Run(t, rdmatest.Backend{Name: "tcp-tls-plaintext", New: tlsCluster(true)})
}

// TestTLSRefusesUnauthenticated: node 1 serves a secret; dialers without a
// valid certificate for the node they claim to be read nothing of it, and
// node 1 reaches no listener that is not the node it dialed.
func TestTLSRefusesUnauthenticated(t *testing.T) {
	p := newPKI(t)
	n1, err := tcp.Listen(1, "127.0.0.1:0", tcp.Config{TLS: tlsOf(p.manager(t, tlsconf.Request{Node: 1}), false)})
	if err != nil {
		t.Fatal(err)
	}
	defer n1.Close()
	secret := []byte("TOP-SECRET-PAYLOAD")
	reg := register(t, n1, 4096)
	copy(reg.Bytes(), secret)

	other := newPKI(t)
	past := time.Now().Add(-48 * time.Hour)
	expiredDir := t.TempDir()
	is, err := p.ca.Issue(tlsconf.Request{Node: 2, NotBefore: past, NotAfter: past.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	f, _ := tlsconf.WriteIssued(expiredDir, tlsconf.Request{Node: 2}, is, false)
	_ = f

	// A rogue dialer presents its certificate whatever the listener asks
	// for and trusts any listener.
	rogue := func(ca *tlsconf.CA) tcp.Config {
		is, err := ca.Issue(tlsconf.Request{Node: 2})
		if err != nil {
			t.Fatal(err)
		}
		cert, err := tls.X509KeyPair(is.CertPEM, is.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }}
		return tcp.Config{TLS: &tcp.TLS{Server: cfg, Client: cfg, PeerNode: func(tls.ConnectionState) (ids.NodeID, error) { return 1, nil }}}
	}
	selfSigned, err := tlsconf.NewCA("self", time.Hour)
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name string
		cfg  tcp.Config
	}{
		{"no TLS", tcp.Config{}},
		{"another CA", tcp.Config{TLS: tlsOf(other.manager(t, tlsconf.Request{Node: 2}), false)}},
		{"another CA, rogue dialer", rogue(other.ca)},
		{"self-signed, rogue dialer", rogue(selfSigned)},
		{"wrong node id", tcp.Config{TLS: tlsOf(p.manager(t, tlsconf.Request{Node: 3}), false)}},
		{"client certificate", tcp.Config{TLS: tlsOf(p.manager(t, tlsconf.Request{Client: true}), false)}},
		{"plaintext against encrypted", tcp.Config{TLS: tlsOf(p.manager(t, tlsconf.Request{Node: 2}), true)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.RetryWindow = -1
			c.cfg.DialTimeout = 5 * time.Second
			thief, err := tcp.Listen(2, "127.0.0.1:0", c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer thief.Close()
			thief.AddPeer(1, n1.Addr())
			buf := make([]byte, len(secret))
			err = thief.Post(context.Background(), 1, []rdma.Op{{Kind: rdma.OpRead, RKey: reg.Descriptor().RKey, Buf: buf}})
			if err == nil || bytes.Contains(buf, secret[:4]) {
				t.Fatalf("READ by an unauthenticated node: err %v, read %q", err, buf)
			}
			if !errors.Is(err, rdma.ErrPeerUnreachable) {
				t.Fatalf("READ failed with %v, want a connection failure", err)
			}
			t.Logf("refused: %v", err)

			// Node 1 does not take the thief for node 2 either.
			n1.AddPeer(2, thief.Addr())
			defer n1.RemovePeer(2)
			if err := n1.Send(context.Background(), 2, []byte("hi")); err == nil {
				t.Fatal("node 1 reached a listener that is not node 2")
			}
		})
	}
	// An expired certificate: Load refuses it, so nobody can even start
	// with it; the handshake refusal is tested in tlsconf.
	if _, err := tlsconf.Load(tlsconf.Files{CA: filepath.Join(p.dir, tlsconf.CAFile), Cert: f.Cert, Key: f.Key}); err == nil {
		t.Fatal("an expired certificate loaded")
	}

	// A valid node 2 reads the secret.
	good, err := tcp.Listen(2, "127.0.0.1:0", tcp.Config{TLS: tlsOf(p.manager(t, tlsconf.Request{Node: 2}), false)})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	good.AddPeer(1, n1.Addr())
	buf := make([]byte, len(secret))
	if err := good.Post(context.Background(), 1, []rdma.Op{{Kind: rdma.OpRead, RKey: reg.Descriptor().RKey, Buf: buf}}); err != nil || !bytes.Equal(buf, secret) {
		t.Fatalf("READ by node 2: %v, %q", err, buf)
	}
}

// TestTLSReload: after a certificate is replaced and reloaded, new
// connections present the new one, and the transport keeps working.
func TestTLSReload(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	issue := func(replace bool) {
		is, err := p.ca.Issue(tlsconf.Request{Node: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tlsconf.WriteIssued(dir, tlsconf.Request{Node: 1}, is, replace); err != nil {
			t.Fatal(err)
		}
	}
	issue(false)
	f := tlsconf.FilesIn(dir, 1)
	f.CA = filepath.Join(p.dir, tlsconf.CAFile)
	m1, err := tlsconf.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	n1, err := tcp.Listen(1, "127.0.0.1:0", tcp.Config{TLS: tlsOf(m1, false)})
	if err != nil {
		t.Fatal(err)
	}
	defer n1.Close()
	reg := register(t, n1, 4096)
	copy(reg.Bytes(), "before")

	read := func(tr *tcp.Transport) string {
		buf := make([]byte, 6)
		if err := tr.Post(context.Background(), 1, []rdma.Op{{Kind: rdma.OpRead, RKey: reg.Descriptor().RKey, Buf: buf}}); err != nil {
			t.Fatal(err)
		}
		return string(buf)
	}
	m2 := p.manager(t, tlsconf.Request{Node: 2})
	var seen []string
	cl := tlsOf(m2, false)
	verify := cl.Client.VerifyConnection
	cl.Client.VerifyConnection = nil
	cl.Client.VerifyConnection = func(cs tls.ConnectionState) error {
		seen = append(seen, cs.PeerCertificates[0].SerialNumber.String())
		return verify(cs)
	}
	a, err := tcp.Listen(2, "127.0.0.1:0", tcp.Config{TLS: cl})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.AddPeer(1, n1.Addr())
	if got := read(a); got != "before" {
		t.Fatalf("read %q", got)
	}

	issue(true)
	if err := m1.Reload(); err != nil {
		t.Fatal(err)
	}
	copy(reg.Bytes(), "after!")
	// The connection that is up keeps working.
	if got := read(a); got != "after!" {
		t.Fatalf("read %q", got)
	}
	// A new connection sees the new certificate.
	b, err := tcp.Listen(2, "127.0.0.1:0", tcp.Config{TLS: cl})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.AddPeer(1, n1.Addr())
	if got := read(b); got != "after!" {
		t.Fatalf("read %q", got)
	}
	if len(seen) != 2 || seen[0] == seen[1] || seen[1] != m1.Leaf().SerialNumber.String() {
		t.Fatalf("certificates seen by the dialers: %v; want the old one, then %v", seen, m1.Leaf().SerialNumber)
	}
}
