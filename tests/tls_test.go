package tests

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/ids"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
	"github.com/dsmkit/dsm/internal/tlsconf"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/tcp"
)

// tool runs dsmctl (no daemon needed) and fails t unless it succeeds.
func tool(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(dsmctlBin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("dsmctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// arg is the value of flag name in p's arguments.
func (p *proc) arg(name string) string {
	for i, a := range p.args {
		if a == name && i+1 < len(p.args) {
			return p.args[i+1]
		}
	}
	return ""
}

// tlsCluster makes a CA and certificates with dsmctl tls and starts n dsmd
// with --tls-dir and a gRPC TCP listener each.
func tlsCluster(t *testing.T, n int) (c *cluster, dir string, grpcAddrs []string) {
	t.Helper()
	needsTCP(t) // TLS covers the verbs connections of the tcp transport only
	if testing.Short() {
		t.Skip("starts dsmd processes; skipped with -short")
	}
	dir = t.TempDir()
	tool(t, "tls", "ca", "create", "--dir", dir)
	for i := 1; i <= n; i++ {
		tool(t, "tls", "cert", "create", "--node", fmt.Sprint(i), "--dir", dir)
	}
	tool(t, "tls", "cert", "create", "--client", "--dir", dir)
	grpcAddrs = make([]string, n)
	for i := range grpcAddrs {
		grpcAddrs[i] = freeAddr(t)
	}
	c = launch(t, n, func(i int) []string {
		return []string{"--tls-dir", dir, "--grpc-addr", grpcAddrs[i-1]}
	})
	c.waitHealthy(1)
	c.waitAllAlive(1)
	return c, dir, grpcAddrs
}

// rogue is a would-be peer: a certificate it presents whatever the
// listener asks (none when cert is nil), trusting any listener.
type rogue struct {
	name string
	cert *tls.Certificate
}

func (r rogue) config() *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	if r.cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return r.cert, nil }
	}
	return cfg
}

func keyPair(t *testing.T, is *tlsconf.Issued) *tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(is.CertPEM, is.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

// selfSigned is a certificate that names node n, signed by its own key.
func selfSigned(t *testing.T, n ids.NodeID) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: fmt.Sprintf("node-%d", n)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		URIs:        []*url.URL{tlsconf.NodeURI(n)},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	c, err := tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

// rogues are the would-be peers without a valid certificate for node 2:
// none, self-signed, another CA's, expired, and the cluster CA's for
// another node (9, no member).
func rogues(t *testing.T, dir string) []rogue {
	t.Helper()
	ca, err := tlsconf.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	other, err := tlsconf.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *tlsconf.CA, r tlsconf.Request) *tls.Certificate {
		is, err := ca.Issue(r)
		if err != nil {
			t.Fatal(err)
		}
		return keyPair(t, is)
	}
	past := time.Now().Add(-72 * time.Hour)
	return []rogue{
		{"no certificate", nil},
		{"self-signed", selfSigned(t, 2)},
		{"another CA", issue(other, tlsconf.Request{Node: 2})},
		{"expired", issue(ca, tlsconf.Request{Node: 2, NotBefore: past, NotAfter: past.Add(24 * time.Hour)})},
		{"wrong node id", issue(ca, tlsconf.Request{Node: 9})},
	}
}

// descriptorOf reads, from a member's descriptors (node/regions.go: a
// version byte, then 29-byte entries: region u32, key u64, base u64, len
// u64, access u8), the remote key of region r.
func descriptorOf(t *testing.T, b []byte, r ids.RegionID) rdma.RKey {
	t.Helper()
	if len(b) == 0 || b[0] != 1 {
		t.Fatalf("descriptors %x", b)
	}
	for b = b[1:]; len(b) >= 29; b = b[29:] {
		if ids.RegionID(binary.LittleEndian.Uint32(b)) == r {
			return rdma.RKey{Key: binary.LittleEndian.Uint64(b[4:]), Base: binary.LittleEndian.Uint64(b[12:])}
		}
	}
	t.Fatalf("no descriptor of %v", r)
	return rdma.RKey{}
}

// TestTLSCluster runs three dsmd with mutual TLS on every TCP listener:
// the cluster forms and serves reads and writes across nodes, dsmctl
// reaches it over TCP with a client certificate, and a process without a
// valid certificate for the node it claims to be can call neither the
// forwarding RPC nor gRPC, cannot talk Raft, and reads no byte through the
// verbs port.
func TestTLSCluster(t *testing.T) {
	longTest(t)
	t.Parallel()
	c, dir, grpcAddrs := tlsCluster(t, 3)

	// Status asks every peer's gRPC TCP listener (over TLS) for its cache.
	var st statusJSON
	c.ctlJSON(1, &st, "status")
	for _, n := range st.Nodes {
		if n.Error != "" || n.CacheCap == 0 {
			t.Fatalf("status of n%d through n1: %+v", n.Node, n)
		}
	}

	// Data crosses the verbs transport (over TLS) between nodes.
	if out, errs, code := c.ctl(1, "region", "create", "r1", "64MiB"); code != 0 {
		t.Fatalf("region create: %s%s", out, errs)
	}
	secret := "TOP-SECRET-PAYLOAD"
	eventually(t, "put on n1", 30*time.Second, func() error {
		if out, errs, code := c.ctl(1, "put", "r1", "0", secret); code != 0 {
			return fmt.Errorf("exit %d: %s%s", code, out, errs)
		}
		return nil
	})
	for i := 2; i <= 3; i++ {
		if out, errs, code := c.ctl(i, "get", "r1", "0", fmt.Sprint(len(secret)), "--raw"); code != 0 || out != secret {
			t.Fatalf("get on n%d: %q %s", i, out, errs)
		}
	}
	if out, errs, code := c.ctl(3, "put", "r1", "4096", "from n3"); code != 0 {
		t.Fatalf("put on n3: %s%s", out, errs)
	}
	if out, errs, code := c.ctl(1, "get", "r1", "4096", "7", "--raw"); code != 0 || out != "from n3" {
		t.Fatalf("get on n1: %q %s", out, errs)
	}

	// dsmctl over TCP: with the client certificate, and without.
	if out, errs, code := ctlAt(t, grpcAddrs[0], "--tls-dir", dir, "status"); code != 0 {
		t.Fatalf("dsmctl status over TLS: exit %d: %s%s", code, out, errs)
	}
	if out, errs, code := ctlAt(t, grpcAddrs[0], "status"); code == 0 || !strings.Contains(errs, "--tls-dir") {
		t.Fatalf("dsmctl status over TCP without a certificate: exit %d: %s%s; want a failure that suggests --tls-dir", code, out, errs)
	} else {
		t.Logf("dsmctl without a certificate: exit %d: %s", code, strings.TrimSpace(errs))
	}

	// The operator (with node 2's certificate) reads the member table:
	// the addresses and the remote key of r1 at n1.
	n2, err := tlsconf.Load(tlsconf.FilesIn(dir, 2))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rpcAddr, raftAddr := c.nodes[0].arg("--rpc-addr"), c.nodes[0].arg("--raft-addr")
	v, err := directory.RemoteViewTLS(ctx, rpcAddr, n2.ClientConfig(tlsconf.Node(1)))
	if err != nil {
		t.Fatal(err)
	}
	m1, ok := v.Member(1)
	if !ok {
		t.Fatal("n1 is not in the member table")
	}
	reg, ok := v.Region("r1")
	if !ok {
		t.Fatal("no region r1")
	}
	key := descriptorOf(t, m1.Descriptors, reg.ID)

	for _, r := range rogues(t, dir) {
		t.Run(r.name, func(t *testing.T) {
			// The forwarding RPC.
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if _, err := directory.RemoteViewTLS(cctx, rpcAddr, r.config()); err == nil {
				t.Error("the forwarding RPC answered")
			} else {
				t.Logf("forwarding RPC: %v", err)
			}

			// Raft: a TLS connection that sends a request gets the
			// connection closed, no answer.
			if err := raftProbe(raftAddr, r.config()); err == nil {
				t.Error("Raft answered")
			} else {
				t.Logf("raft: %v", err)
			}

			// gRPC.
			if err := grpcStatus(cctx, grpcAddrs[0], credentials.NewTLS(r.config())); err == nil {
				t.Error("gRPC answered")
			} else {
				t.Logf("grpc: %v", err)
			}

			// Verbs: READ the secret from n1's memory, claiming node 2.
			cfg := tcp.Config{RetryWindow: -1, TLS: &tcp.TLS{Server: r.config(), Client: r.config(),
				PeerNode: func(tls.ConnectionState) (ids.NodeID, error) { return 1, nil }}}
			if r.cert == nil {
				cfg.TLS = nil // plain TCP, as before TLS
			}
			thief, err := tcp.Listen(2, "127.0.0.1:0", cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer thief.Close()
			thief.AddPeer(1, m1.VerbsAddr)
			buf := make([]byte, len(secret))
			err = thief.Post(cctx, 1, []rdma.Op{{Kind: rdma.OpRead, RKey: key, Buf: buf}})
			if err == nil || bytes.Contains(buf, []byte("TOP")) || !errors.Is(err, rdma.ErrPeerUnreachable) {
				t.Errorf("verbs READ: err %v, read %q; want the connection refused", err, buf)
			} else {
				t.Logf("verbs: %v", err)
			}
		})
	}
	// Plain TCP on the RPC, Raft and gRPC ports.
	if _, err := directory.RemoteView(ctx, rpcAddr); err == nil {
		t.Error("the forwarding RPC answered plain TCP")
	}
	if err := raftProbe(raftAddr, nil); err == nil {
		t.Error("Raft answered plain TCP")
	}
	if err := grpcStatus(ctx, grpcAddrs[0], insecure.NewCredentials()); err == nil {
		t.Error("gRPC answered plain TCP")
	}
	// The key was good: a process with node 2's certificate reads it. It
	// is a new incarnation of node 2 to n1, so this comes last.
	good, err := tcp.Listen(2, "127.0.0.1:0", tcp.Config{TLS: &tcp.TLS{
		Server: n2.ServerConfig(tlsconf.AnyNode), Client: n2.ClientConfig(tlsconf.AnyNode), PeerNode: tlsconf.PeerNode}})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	good.AddPeer(1, m1.VerbsAddr)
	buf := make([]byte, 1)
	if err := good.Post(ctx, 1, []rdma.Op{{Kind: rdma.OpRead, RKey: key, Buf: buf}}); err != nil {
		t.Fatalf("READ with node 2's certificate: %v", err)
	}
}

// raftProbe connects to a Raft port (over TLS with cfg, plain TCP when
// cfg is nil), sends the start of an AppendEntries request and reads: nil
// means Raft answered something.
func raftProbe(addr string, cfg *tls.Config) error {
	d := &net.Dialer{Timeout: 10 * time.Second}
	var c net.Conn
	var err error
	if cfg != nil {
		c, err = tls.DialWithDialer(d, "tcp", addr, cfg)
	} else {
		c, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	// rpcAppendEntries (0), then a msgpack map: raft reads it or fails.
	if _, err := c.Write([]byte{0, 0x80}); err != nil {
		return err
	}
	var b [64]byte
	n, err := c.Read(b[:])
	if err != nil {
		return err
	}
	return fmt.Errorf("%w: raft answered %d bytes", errAnswered, n)
}

var errAnswered = errors.New("answered")

// grpcStatus calls Admin.Status at addr with creds.
func grpcStatus(ctx context.Context, addr string, creds credentials.TransportCredentials) error {
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = dsmpb.NewAdminClient(conn).Status(ctx, &dsmpb.StatusRequest{})
	return err
}

// TestTLSRotation replaces n1's certificate under load: writes and reads
// through every node keep succeeding, and after SIGHUP n1's new
// connections present the new certificate.
func TestTLSRotation(t *testing.T) {
	longTest(t)
	t.Parallel()
	c, dir, grpcAddrs := tlsCluster(t, 3)
	if out, errs, code := c.ctl(1, "region", "create", "rot", "1MiB"); code != 0 {
		t.Fatalf("region create: %s%s", out, errs)
	}
	serial := func() string {
		var got string
		cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, NextProtos: []string{"h2"}}
		m, err := tlsconf.Load(tlsconf.FilesIn(dir, ids.None))
		if err != nil {
			t.Fatal(err)
		}
		cl := m.ClientConfig(tlsconf.Node(1))
		cfg.GetClientCertificate = cl.GetClientCertificate
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			got = cs.PeerCertificates[0].SerialNumber.String()
			return cl.VerifyConnection(cs)
		}
		conn, err := tls.Dial("tcp", grpcAddrs[0], cfg)
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
		return got
	}
	before := serial()

	// Load: each node writes its own counter and reads the others'.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errc := make(chan error, 3)
	var mu sync.Mutex
	ops := 0
	for i := 1; i <= 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				val := fmt.Sprintf("n%d-%06d", i, k)
				off := fmt.Sprint(i * 4096)
				if out, errs, code := c.ctl(i, "put", "rot", off, val); code != 0 {
					errc <- fmt.Errorf("put on n%d: %s%s", i, out, errs)
					return
				}
				other := i%3 + 1
				if out, errs, code := c.ctl(other, "get", "rot", off, fmt.Sprint(len(val)), "--raw"); code != 0 || out != val {
					errc <- fmt.Errorf("get on n%d of n%d's %q: %q %s", other, i, val, out, errs)
					return
				}
				mu.Lock()
				ops++
				mu.Unlock()
			}
		}()
	}
	waitOps := func(n int) {
		eventually(t, fmt.Sprintf("%d operations", n), time.Minute, func() error {
			select {
			case err := <-errc:
				t.Fatal(err)
			default:
			}
			mu.Lock()
			defer mu.Unlock()
			if ops < n {
				return fmt.Errorf("%d done", ops)
			}
			return nil
		})
	}
	waitOps(3)
	tool(t, "tls", "cert", "create", "--node", "1", "--dir", dir, "--replace")
	if err := c.nodes[0].cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, "n1 logs the reload", 30*time.Second, func() error {
		if !strings.Contains(c.nodes[0].logString(), "TLS reloaded") {
			return errors.New("not yet")
		}
		return nil
	})
	mu.Lock()
	at := ops
	mu.Unlock()
	waitOps(at + 6)
	close(stop)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	after := serial()
	if after == before {
		t.Fatalf("n1 presents the certificate it had before SIGHUP (%s)", before)
	}
	newCert, err := tlsconf.Load(tlsconf.FilesIn(dir, 1))
	if err != nil {
		t.Fatal(err)
	}
	if after != newCert.Leaf().SerialNumber.String() {
		t.Fatalf("n1 presents %s, the new certificate is %s", after, newCert.Leaf().SerialNumber)
	}
	// n1 still takes part: a write on n1 is read on n2 and n3, a new
	// dsmctl connection over TCP works.
	if out, errs, code := c.ctl(1, "put", "rot", "0", "rotated"); code != 0 {
		t.Fatalf("put on n1: %s%s", out, errs)
	}
	for i := 2; i <= 3; i++ {
		if out, errs, code := c.ctl(i, "get", "rot", "0", "7", "--raw"); code != 0 || out != "rotated" {
			t.Fatalf("get on n%d: %q %s", i, out, errs)
		}
	}
	if out, errs, code := ctlAt(t, grpcAddrs[0], "--tls-dir", dir, "status"); code != 0 {
		t.Fatalf("dsmctl over TLS after the rotation: %s%s", out, errs)
	}
	t.Logf("%d operations, none lost; n1's certificate %s -> %s", ops, before, after)
}

// TestTLSRefusals: dsmd will not start with a certificate for another node
// id, nor bind a non-loopback address without TLS (unless --insecure).
func TestTLSRefusals(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs dsmd; skipped with -short")
	}
	dir := t.TempDir()
	tool(t, "tls", "ca", "create", "--dir", dir)
	tool(t, "tls", "cert", "create", "--node", "5", "--dir", dir)
	os.Rename(filepath.Join(dir, "node-5.pem"), filepath.Join(dir, "node-4.pem"))
	os.Rename(filepath.Join(dir, "node-5-key.pem"), filepath.Join(dir, "node-4-key.pem"))
	base := []string{"--id", "4", "--data-dir", t.TempDir(), "--gossip-addr", freeAddr(t), "--raft-addr", freeAddr(t),
		"--rpc-addr", freeAddr(t), "--verbs-addr", freeAddr(t), "--bootstrap-expect", "1"}
	out, err := exec.Command(dsmdBin, append(base, "--tls-dir", dir)...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "names node 5, but this is node 4") {
		t.Fatalf("dsmd with node 5's certificate as node 4: %v\n%s", err, tail(string(out), 2000))
	}
	out, err = exec.Command(dsmdBin, "--id", "4", "--data-dir", t.TempDir(), "--bind", "192.0.2.1").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "--insecure") {
		t.Fatalf("dsmd on a non-loopback address without TLS: %v\n%s", err, out)
	}
}

// TestTLSStrangerCannotJoinRaft: a dsmd whose certificate comes from
// another CA joins gossip (which TLS does not cover) and is added to Raft
// by the leader, but it never receives an entry of the log: every Raft
// connection between it and the members fails the TLS handshake.
func TestTLSStrangerCannotJoinRaft(t *testing.T) {
	longTest(t)
	t.Parallel()
	c, _, _ := tlsCluster(t, 3)
	other := t.TempDir()
	tool(t, "tls", "ca", "create", "--dir", other)
	tool(t, "tls", "cert", "create", "--node", "4", "--dir", other)
	dir := t.TempDir()
	p := &proc{id: 4, socket: filepath.Join(dir, "dsmd.sock"), log: &bytes.Buffer{}}
	p.args = []string{"--id", "4", "--data-dir", dir, "--gossip-addr", freeAddr(t), "--raft-addr", freeAddr(t),
		"--rpc-addr", freeAddr(t), "--verbs-addr", freeAddr(t), "--join", c.nodes[0].arg("--gossip-addr"),
		"--tls-dir", other, "--log-level", "info"}
	p.start(t)
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("---- n4 log:\n%s", tail(p.logString(), 4000))
		}
	})
	type raftJSON struct {
		Leader    uint32   `json:"leader_id"`
		LastIndex uint64   `json:"last_index"`
		NonVoters []uint32 `json:"non_voters"`
	}
	// The leader does not record n4: its directory RPC cannot prove the
	// node id with a certificate of the cluster CA. So n4 is never a
	// member, nor in Raft.
	eventually(t, "the leader says why it does not record n4", 60*time.Second, func() error {
		for _, p := range c.nodes {
			if strings.Contains(p.logString(), "gossip member not recorded") && strings.Contains(p.logString(), "member=n4") {
				return nil
			}
		}
		return errors.New("no node logged it")
	})
	var r raftJSON
	c.ctlJSON(1, &r, "raft")
	if slices.Contains(r.NonVoters, 4) {
		t.Fatalf("n4, with another CA's certificate, is a Raft non-voter: %+v", r)
	}
	if st, ok := c.memberStates(1)[4]; ok && st != "joining" {
		t.Fatalf("n4, with another CA's certificate, is a member (%s)", st)
	}
	if out, errs, code := c.ctl(1, "region", "create", "after-n4", "1MiB"); code != 0 {
		t.Fatalf("region create: %s%s", out, errs)
	}
	c.ctlJSON(2, &r, "raft")
	want := r.LastIndex // n2 has the region's entry
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, dsmctlBin, "--addr", p.socket, "raft", "--json").Output()
	if err != nil {
		t.Fatalf("dsmctl raft on n4: %v", err)
	}
	var r4 raftJSON
	if err := json.Unmarshal(out, &r4); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if r4.LastIndex != 0 || r4.Leader != 0 {
		t.Fatalf("n4, with another CA's certificate, has Raft entries or a leader: %+v (members are at index %d)", r4, want)
	}
}

// A process that has the gossip key but no certificate of the cluster CA
// gossips with the members, and is never recorded as one: the leader asks
// its directory RPC to prove the node id over mutual TLS first. A node with
// its certificate joins the same way and is recorded.
func TestTLSGossipKeyWithoutCertificate(t *testing.T) {
	longTest(t)
	needsTCP(t)
	t.Parallel()
	if testing.Short() {
		t.Skip("starts dsmd processes; skipped with -short")
	}
	key := keygen(t)
	dir := t.TempDir()
	tool(t, "tls", "ca", "create", "--dir", dir)
	for i := 1; i <= 4; i++ {
		tool(t, "tls", "cert", "create", "--node", fmt.Sprint(i), "--dir", dir)
	}
	tool(t, "tls", "cert", "create", "--client", "--dir", dir)
	c := launch(t, 3, func(int) []string { return []string{"--tls-dir", dir, "--gossip-key", key} })
	c.waitHealthy(1)

	// On loopback, dsmd runs without TLS; with the key it gossips.
	intruder := c.add(t, 5, "--gossip-key", key)
	c.add(t, 4, "--gossip-key", key, "--tls-dir", dir)
	eventually(t, "n4 is recorded alive", 60*time.Second, func() error {
		if st := c.memberStates(1); st[4] != "alive" {
			return fmt.Errorf("members %v", st)
		}
		return nil
	})
	eventually(t, "the leader says why it does not record n5", 30*time.Second, func() error {
		for _, p := range c.nodes[:3] {
			if strings.Contains(p.logString(), `gossip member not recorded`) && strings.Contains(p.logString(), "member=n5") {
				return nil
			}
		}
		return errors.New("no node logged it")
	})
	// dsmctl members lists what gossip sees beside the member table: n5
	// may show as joining, never as a member.
	for i := 1; i <= 3; i++ {
		if st, ok := c.memberStates(i)[5]; ok && st != "joining" {
			t.Errorf("n%d's member table has n5 (%s), which proved no node id", i, st)
		}
	}
	c.remove(t, intruder)
}
