package tlsconf

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
)

// setup makes a CA in a temporary directory with certificates for nodes 1
// and 2 and the client.
func setup(t *testing.T) (string, *CA) {
	t.Helper()
	dir := t.TempDir()
	ca, err := CreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []Request{{Node: 1}, {Node: 2}, {Client: true}} {
		is, err := ca.Issue(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := WriteIssued(dir, r, is, false); err != nil {
			t.Fatal(err)
		}
	}
	return dir, ca
}

func mustLoad(t *testing.T, f Files) *Manager {
	t.Helper()
	m, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// handshake runs a TLS handshake between cli and srv over a pipe and
// returns both sides' errors and the server's view of the client.
func handshake(t *testing.T, cli, srv *tls.Config) (cs tls.ConnectionState, cerr, serr error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	done := make(chan struct{})
	s := tls.Server(b, srv)
	go func() {
		defer close(done)
		serr = s.Handshake()
		if serr == nil {
			cs = s.ConnectionState()
		}
		b.Close()
	}()
	c := tls.Client(a, cli)
	cerr = c.Handshake()
	if cerr == nil {
		// The client finishes first in TLS 1.3: read until the server has
		// checked the client's certificate and closed.
		_, cerr = c.Read(make([]byte, 1))
		if errors.Is(cerr, net.ErrClosed) || cerr != nil && cerr.Error() == "EOF" {
			cerr = nil
		}
	}
	a.Close()
	<-done
	return cs, cerr, serr
}

func TestMutualHandshake(t *testing.T) {
	dir, _ := setup(t)
	n1 := mustLoad(t, FilesIn(dir, 1))
	n2 := mustLoad(t, FilesIn(dir, 2))
	if got := n1.Self(); got.Node != 1 || got.Client {
		t.Fatalf("Self = %v", got)
	}
	cs, cerr, serr := handshake(t, n2.ClientConfig(Node(1)), n1.ServerConfig(AnyNode))
	if cerr != nil || serr != nil {
		t.Fatalf("handshake: client %v, server %v", cerr, serr)
	}
	if cs.Version != tls.VersionTLS13 {
		t.Fatalf("version %#x, want TLS 1.3", cs.Version)
	}
	if n, err := PeerNode(cs); err != nil || n != 2 {
		t.Fatalf("PeerNode = %v, %v; want n2", n, err)
	}
}

func TestRefusals(t *testing.T) {
	dir, ca := setup(t)
	n1 := mustLoad(t, FilesIn(dir, 1))
	n2 := mustLoad(t, FilesIn(dir, 2))
	client := mustLoad(t, FilesIn(dir, ids.None))

	other := t.TempDir()
	if _, err := CreateCA(other); err != nil {
		t.Fatal(err)
	}
	oca, _ := LoadCA(other)
	is, _ := oca.Issue(Request{Node: 2})
	WriteIssued(other, Request{Node: 2}, is, false)
	foreign := mustLoad(t, FilesIn(other, 2)) // trusts the other CA only

	expiredDir := t.TempDir()
	copyFile(t, filepath.Join(dir, CAFile), filepath.Join(expiredDir, CAFile))
	is, _ = ca.Issue(Request{Node: 2, NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	WriteIssued(expiredDir, Request{Node: 2}, is, false)
	cert, err := tls.LoadX509KeyPair(filepath.Join(expiredDir, "node-2.pem"), filepath.Join(expiredDir, "node-2-key.pem"))
	if err != nil {
		t.Fatal(err)
	}

	// A self-signed certificate that names node 2.
	selfCA, _ := NewCA("self", time.Hour)
	selfIs, _ := selfCA.Issue(Request{Node: 2})
	selfCert, _ := tls.X509KeyPair(selfIs.CertPEM, selfIs.KeyPEM)
	// The rogue dialers below present their certificate whatever the
	// listener asks for, and trust any listener.
	rogue := func(c tls.Certificate) *tls.Config {
		return &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }}
	}
	foreignCert, err := tls.LoadX509KeyPair(FilesIn(other, 2).Cert, FilesIn(other, 2).Key)
	if err != nil {
		t.Fatal(err)
	}

	srv := n1.ServerConfig(AnyNode)
	cases := []struct {
		name string
		cli  *tls.Config
		srv  *tls.Config
	}{
		{"no certificate", &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}, srv},
		{"self-signed", rogue(selfCert), srv},
		{"another CA", rogue(foreignCert), srv},
		{"another CA (dialer checks)", foreign.ClientConfig(nil), srv},
		{"expired", rogue(cert), srv},
		{"client where a node is required", client.ClientConfig(AnyNode), srv},
		{"wrong node id (listener checks)", n2.ClientConfig(nil), n1.ServerConfig(Node(3))},
		{"wrong node id (dialer checks)", n2.ClientConfig(Node(3)), srv},
		{"TLS 1.2", &tls.Config{MaxVersion: tls.VersionTLS12, InsecureSkipVerify: true, Certificates: []tls.Certificate{selfCert}}, srv},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, cerr, serr := handshake(t, c.cli, c.srv)
			if cerr == nil && serr == nil {
				t.Fatal("handshake succeeded")
			}
			refused := serr // the listener's own error
			if strings.Contains(c.name, "dialer checks") {
				refused = cerr
			}
			if refused == nil || strings.Contains(refused.Error(), "remote error") {
				t.Fatalf("the wrong side refused: client %v, server %v", cerr, serr)
			}
			t.Logf("client: %v; server: %v", cerr, serr)
		})
	}
	// The client certificate is good where clients are allowed.
	if _, cerr, serr := handshake(t, client.ClientConfig(AnyNode), n1.ServerConfig(NodeOrClient)); cerr != nil || serr != nil {
		t.Fatalf("client handshake: %v, %v", cerr, serr)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLoadErrors(t *testing.T) {
	dir, _ := setup(t)
	other := t.TempDir()
	CreateCA(other)
	for name, f := range map[string]Files{
		"missing CA":    {CA: filepath.Join(dir, "nope.pem"), Cert: FilesIn(dir, 1).Cert, Key: FilesIn(dir, 1).Key},
		"mismatch key":  {CA: FilesIn(dir, 1).CA, Cert: FilesIn(dir, 1).Cert, Key: FilesIn(dir, 2).Key},
		"wrong CA":      {CA: filepath.Join(other, CAFile), Cert: FilesIn(dir, 1).Cert, Key: FilesIn(dir, 1).Key},
		"key as the CA": {CA: FilesIn(dir, 1).Key, Cert: FilesIn(dir, 1).Cert, Key: FilesIn(dir, 1).Key},
	} {
		if _, err := Load(f); !errors.Is(err, ErrFiles) {
			t.Errorf("%s: Load = %v, want ErrFiles", name, err)
		}
	}
	if _, err := CreateCA(dir); !errors.Is(err, ErrExists) {
		t.Errorf("CreateCA over an existing CA = %v, want ErrExists", err)
	}
	if _, err := WriteIssued(dir, Request{Node: 1}, &Issued{}, false); !errors.Is(err, ErrExists) {
		t.Errorf("WriteIssued over an existing certificate = %v, want ErrExists", err)
	}
}

// TestReload rotates node 1's certificate: the next handshake presents
// the new one; a failed reload keeps the old.
func TestReload(t *testing.T) {
	dir, ca := setup(t)
	n1 := mustLoad(t, FilesIn(dir, 1))
	n2 := mustLoad(t, FilesIn(dir, 2))
	before := n1.Leaf().SerialNumber

	is, err := ca.Issue(Request{Node: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WriteIssued(dir, Request{Node: 1}, is, true); err != nil {
		t.Fatal(err)
	}
	if err := n1.Reload(); err != nil {
		t.Fatal(err)
	}
	if n1.Leaf().SerialNumber.Cmp(before) == 0 {
		t.Fatal("Reload kept the old certificate")
	}
	var seen *tls.Config
	cli := n2.ClientConfig(Node(1))
	cli.VerifyConnection = func(cs tls.ConnectionState) error {
		if cs.PeerCertificates[0].SerialNumber.Cmp(is.Cert.SerialNumber) != 0 {
			return errors.New("old certificate presented")
		}
		seen = cli
		return nil
	}
	if _, cerr, serr := handshake(t, cli, n1.ServerConfig(AnyNode)); cerr != nil || serr != nil || seen == nil {
		t.Fatalf("handshake after reload: %v, %v", cerr, serr)
	}

	// A broken file: Reload fails, the manager keeps serving the last good pair.
	os.WriteFile(FilesIn(dir, 1).Cert, []byte("garbage"), 0o600)
	if err := n1.Reload(); !errors.Is(err, ErrFiles) {
		t.Fatalf("Reload of garbage = %v, want ErrFiles", err)
	}
	if _, cerr, serr := handshake(t, n2.ClientConfig(Node(1)), n1.ServerConfig(AnyNode)); cerr != nil || serr != nil {
		t.Fatalf("handshake after a failed reload: %v, %v", cerr, serr)
	}
}

func TestIdentityOf(t *testing.T) {
	ca, _ := NewCA("t", time.Hour)
	for _, r := range []Request{{Node: 7}, {Client: true}} {
		is, err := ca.Issue(r)
		if err != nil {
			t.Fatal(err)
		}
		id, err := IdentityOf(is.Cert)
		if err != nil || id.Node != r.Node || id.Client != r.Client {
			t.Fatalf("IdentityOf(%+v) = %v, %v", r, id, err)
		}
	}
	if _, err := ca.Issue(Request{}); err == nil {
		t.Fatal("Issue of neither node nor client succeeded")
	}
	if _, err := IdentityOf(ca.Cert); !errors.Is(err, ErrIdentity) {
		t.Fatalf("IdentityOf(CA) = %v, want ErrIdentity", err)
	}
}
