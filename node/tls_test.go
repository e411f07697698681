package node

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/tlsconf"
)

// TestNodeTLS starts a single node with TLS: it refuses a certificate of
// another node, reloads a replaced certificate, and keeps the last good
// one when a reload fails.
func TestNodeTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsconf.CreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(n ids.NodeID, replace bool) {
		is, err := ca.Issue(tlsconf.Request{Node: n})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tlsconf.WriteIssued(dir, tlsconf.Request{Node: n}, is, replace); err != nil {
			t.Fatal(err)
		}
	}
	issue(1, false)
	issue(2, false)
	config := func(id uint32) Config {
		cfg := Default()
		cfg.ID, cfg.DataDir, cfg.BootstrapExpect = id, t.TempDir(), 1
		cfg.GossipAddr, cfg.RaftAddr, cfg.RPCAddr, cfg.VerbsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
		cfg.CacheSize = 8 << 20
		cfg.TLSDir = dir
		return cfg
	}

	// Node 3 with node 2's files: refused at Start.
	cfg := config(3)
	cfg.TLSDir, cfg.TLSCA, cfg.TLSCert, cfg.TLSKey = "", tlsconf.FilesIn(dir, 2).CA, tlsconf.FilesIn(dir, 2).Cert, tlsconf.FilesIn(dir, 2).Key
	n3, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n3.Start(); err == nil || !strings.Contains(err.Error(), "names node 2, but this is node 3") {
		t.Fatalf("Start with node 2's certificate as node 3: %v", err)
	}

	var logs syncBuffer
	n, err := New(config(1), Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.Shutdown(ctx)
	}()
	before := n.tls.Leaf().SerialNumber
	issue(1, true)
	if err := n.ReloadTLS(); err != nil {
		t.Fatal(err)
	}
	if n.tls.Leaf().SerialNumber.Cmp(before) == 0 {
		t.Fatal("ReloadTLS kept the old certificate")
	}
	good := n.tls.Leaf().SerialNumber
	os.WriteFile(tlsconf.FilesIn(dir, 1).Key, []byte("not a key"), 0o600)
	if err := n.ReloadTLS(); err == nil {
		t.Fatal("ReloadTLS of a broken key succeeded")
	}
	if n.tls.Leaf().SerialNumber.Cmp(good) != 0 {
		t.Fatal("a failed reload changed the certificate")
	}
	if !strings.Contains(logs.String(), "TLS on") || !strings.Contains(logs.String(), "TLS reloaded") {
		t.Fatalf("logs: %s", logs.String())
	}
}

// TestWarnInsecure: an insecure node says so when it starts (and every
// minute after).
func TestWarnInsecure(t *testing.T) {
	var logs syncBuffer
	n := &Node{log: slog.New(slog.NewTextHandler(&logs, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n.warnInsecure(ctx, "10.0.0.1:7946")
	if !strings.Contains(logs.String(), "INSECURE") || !strings.Contains(logs.String(), "10.0.0.1:7946") {
		t.Fatalf("logs: %q", logs.String())
	}
}

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
