package cli

import (
	"strings"
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/tlsconf"
)

// TestTLSCommands makes a CA, node and client certificates with the
// commands and checks that the files load and name the right identities.
func TestTLSCommands(t *testing.T) {
	dir := t.TempDir()
	run(t, "", runOpts{}, "tls", "ca", "create", "--dir", dir).ok(t)
	run(t, "", runOpts{}, "tls", "cert", "create", "--node", "3", "--dir", dir, "--addr", "10.1.2.3,n3.example").ok(t)
	run(t, "", runOpts{}, "tls", "cert", "create", "--client", "--dir", dir).ok(t)

	m, err := tlsconf.Load(tlsconf.FilesIn(dir, 3))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Self(); got.Node != 3 || got.Client {
		t.Fatalf("node certificate names %v", got)
	}
	leaf := m.Leaf()
	if len(leaf.IPAddresses) != 2 || leaf.IPAddresses[1].String() != "10.1.2.3" || len(leaf.DNSNames) != 2 || leaf.DNSNames[1] != "n3.example" {
		t.Fatalf("node certificate addresses %v %v", leaf.IPAddresses, leaf.DNSNames)
	}
	c, err := tlsconf.Load(tlsconf.FilesIn(dir, ids.None))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Self().Client {
		t.Fatalf("client certificate names %v", c.Self())
	}

	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"tls", "ca", "create", "--dir", dir}, ExitError, "file exists"},
		{[]string{"tls", "cert", "create", "--node", "3", "--dir", dir}, ExitError, "file exists"},
		{[]string{"tls", "cert", "create", "--dir", dir}, ExitUsage, "--node N or --client"},
		{[]string{"tls", "cert", "create", "--node", "0", "--dir", dir}, ExitUsage, "not a node id"},
		{[]string{"tls", "cert", "create", "--node", "1", "--client", "--dir", dir}, ExitUsage, "exclude each other"},
		{[]string{"tls", "cert", "create", "--node", "1", "--dir", t.TempDir()}, ExitError, "dsmctl tls ca create"},
	} {
		r := run(t, "", runOpts{}, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.msg) {
			t.Errorf("dsmctl %s: exit %d, stderr %q; want exit %d and %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.code, tc.msg)
		}
	}
	// --replace rotates the node's certificate.
	before := leaf.SerialNumber
	run(t, "", runOpts{}, "tls", "cert", "create", "--node", "3", "--dir", dir, "--replace").ok(t)
	if err := m.Reload(); err != nil {
		t.Fatal(err)
	}
	if m.Leaf().SerialNumber.Cmp(before) == 0 {
		t.Fatal("--replace kept the old certificate")
	}
	// A TCP address with half the certificate flags is a usage error.
	r := run(t, "127.0.0.1:1", runOpts{}, "--tls-ca", tlsconf.FilesIn(dir, 3).CA, "status")
	if r.code != ExitUsage || !strings.Contains(r.stderr, "--tls-cert") {
		t.Fatalf("status with --tls-ca only: exit %d, %q", r.code, r.stderr)
	}
}
