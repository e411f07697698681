package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/testports"
)

// The binaries built by TestMain.
var dsmdBin, dsmctlBin string

// The verbs transport the clusters of these tests run on: $DSM_TEST_TRANSPORT
// (tcp when unset) and, for ofi, the libfabric provider
// $DSM_TEST_OFI_PROVIDER (make test-ofi and test-ofi-cluster set them).
// With ofi, TestMain builds dsmd with the ofi tag, and every dsmd of this
// build is started with --transport ofi --ofi-provider PROVIDER.
var (
	testTransport   = envOr("DSM_TEST_TRANSPORT", "tcp")
	testOFIProvider = os.Getenv("DSM_TEST_OFI_PROVIDER")
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// transportArgs are the arguments that put a dsmd of this build on the
// transport under test.
func transportArgs() []string {
	if testTransport == "tcp" {
		return nil
	}
	args := []string{"--transport", testTransport}
	if testOFIProvider != "" {
		args = append(args, "--ofi-provider", testOFIProvider)
	}
	return args
}

// needsTCP skips a test that depends on the tcp transport (TLS on the
// verbs connections, its addresses) when the suite runs on another.
func needsTCP(t testing.TB) {
	t.Helper()
	if testTransport != "tcp" {
		t.Skipf("needs the tcp verbs transport; this run is on %s %s", testTransport, testOFIProvider)
	}
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "dsm-tests-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// Other users run the binaries too (the local security tests).
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dsmdBin, dsmctlBin = filepath.Join(dir, "dsmd"), filepath.Join(dir, "dsmctl")
	switch testTransport {
	case "tcp", "ofi":
	default:
		fmt.Fprintf(os.Stderr, "DSM_TEST_TRANSPORT=%q: want tcp or ofi\n", testTransport)
		return 1
	}
	for bin, pkg := range map[string]string{dsmdBin: "github.com/dsmkit/dsm/cmd/dsmd", dsmctlBin: "github.com/dsmkit/dsm/cmd/dsmctl"} {
		args := []string{"build", "-o", bin}
		if raceEnabled {
			args = append(args, "-race")
		}
		if bin == dsmdBin && testTransport == "ofi" {
			args = append(args, "-tags", "ofi")
		}
		out, err := exec.Command("go", append(args, pkg)...).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n%s", pkg, err, out)
			return 1
		}
	}
	return m.Run()
}

// freeAddr returns a loopback address whose port is free for TCP and UDP
// (gossip binds both) and given to no other test process.
func freeAddr(t testing.TB) string { return testports.Addr(t) }

// proc is one dsmd process.
type proc struct {
	id     int
	bin    string // the dsmd binary: dsmdBin when empty
	args   []string
	socket string
	cmd    *exec.Cmd
	log    *bytes.Buffer
	done   chan struct{}
	err    error
}

type cluster struct {
	t     testing.TB
	nodes []*proc
}

// startCluster starts n dsmd processes that bootstrap one cluster.
func startCluster(t testing.TB, n int) *cluster {
	t.Helper()
	return launch(t, n, nil)
}

// launch starts n dsmd processes that bootstrap one cluster (at most
// three voters at first); more(i) adds arguments for node i. When the test
// ends they get SIGTERM, and their logs are shown if it failed.
func launch(t testing.TB, n int, more func(i int) []string) *cluster {
	t.Helper()
	return launchBins(t, n, more, nil)
}

// launchBins is launch with node i running bin(i) (nil, or "": dsmdBin).
func launchBins(t testing.TB, n int, more func(i int) []string, bin func(i int) string) *cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts dsmd processes; skipped with -short")
	}
	c := &cluster{t: t}
	base := t.TempDir()
	var join string
	for i := 1; i <= n; i++ {
		dir := filepath.Join(base, fmt.Sprintf("n%d", i))
		gossip := freeAddr(t)
		if join == "" {
			join = gossip
		}
		p := &proc{id: i, socket: filepath.Join(dir, "dsmd.sock"), log: &bytes.Buffer{}}
		if bin != nil {
			p.bin = bin(i)
		}
		p.args = []string{"--id", fmt.Sprint(i), "--data-dir", dir,
			"--gossip-addr", gossip, "--raft-addr", freeAddr(t), "--rpc-addr", freeAddr(t), "--verbs-addr", freeAddr(t),
			"--bootstrap-expect", fmt.Sprint(min(n, 3)), "--join", join, "--log-level", testLogLevel()}
		if p.bin == "" {
			p.args = append(p.args, transportArgs()...)
		}
		if more != nil {
			p.args = append(p.args, more(i)...)
		}
		p.start(t)
		c.nodes = append(c.nodes, p)
	}
	t.Cleanup(func() {
		for _, p := range c.nodes {
			p.cmd.Process.Signal(syscall.SIGTERM)
		}
		// dsmd's leave is bounded by --leave-timeout (20 s by default):
		// in a cluster that lost its quorum (every node stopped at once,
		// some killed before) the departure waits for all of it.
		deadline := time.Now().Add(30 * time.Second)
		for _, p := range c.nodes {
			select {
			case <-p.done:
			case <-time.After(time.Until(deadline)):
				t.Errorf("n%d did not exit 30 s after SIGTERM", p.id)
				p.cmd.Process.Kill()
				<-p.done
			}
		}
		for _, p := range c.nodes {
			if strings.Contains(p.logString(), "DATA RACE") {
				t.Errorf("n%d: the race detector fired", p.id)
			}
		}
		for _, p := range c.nodes {
			if t.Failed() {
				t.Logf("---- n%d log (last 4000 bytes):\n%s", p.id, tail(p.logString(), 4000))
			}
			if dir := os.Getenv("DSM_TEST_LOGS"); dir != "" {
				// The whole log, for diagnosis (DSM_TEST_LOG_LEVEL=debug
				// for more), failed or not.
				name := filepath.Join(dir, fmt.Sprintf("%s-n%d.log", strings.ReplaceAll(t.Name(), "/", "_"), p.id))
				if err := os.WriteFile(name, []byte(p.logString()), 0o644); err != nil {
					t.Logf("DSM_TEST_LOGS: %v", err)
				}
			}
		}
	})
	return c
}

// start runs dsmd with p's arguments (again, after a crash: same id, data
// and addresses).
func (p *proc) start(t testing.TB) {
	t.Helper()
	p.done = make(chan struct{})
	b := p.bin
	if b == "" {
		b = dsmdBin
	}
	p.cmd = exec.Command(b, p.args...)
	sw := &syncWriter{w: p.log}
	p.cmd.Stdout, p.cmd.Stderr = sw, sw
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd, done := p.cmd, p.done
	go func() { p.err = cmd.Wait(); close(done) }()
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

func (p *proc) logString() string {
	if sw, ok := p.cmd.Stderr.(*syncWriter); ok {
		sw.mu.Lock()
		defer sw.mu.Unlock()
	}
	return p.log.String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// ctl runs dsmctl against node i and returns stdout, stderr and the exit
// code.
func (c *cluster) ctl(i int, args ...string) (string, string, int) {
	c.t.Helper()
	return ctlAt(c.t, c.nodes[i-1].socket, args...)
}

// ctlAt runs dsmctl against addr (a socket path or a TCP address) and
// returns stdout, stderr and the exit code.
func ctlAt(t testing.TB, addr string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, dsmctlBin, append([]string{"--addr", addr, "--timeout", "10s"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), errb.String(), 0
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitCode()
	}
	t.Fatalf("dsmctl %v: %v", args, err)
	return "", "", -1
}

// ctlJSON runs a dsmctl command with --json that must succeed and decodes it.
func (c *cluster) ctlJSON(i int, v any, args ...string) {
	c.t.Helper()
	out, errs, code := c.ctl(i, append(args, "--json")...)
	if code != 0 {
		c.t.Fatalf("dsmctl %v on n%d: exit %d: %s", args, i, code, errs)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		c.t.Fatalf("dsmctl %v --json: %v\n%s", args, err, out)
	}
}

// eventually retries f until it returns nil or the deadline (generous: it
// only catches hangs) passes.
func eventually(t testing.TB, what string, d time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type statusJSON struct {
	Node    uint32   `json:"node_id"`
	Leader  uint32   `json:"leader_id"`
	Term    uint64   `json:"term"`
	Epoch   uint64   `json:"epoch"`
	Regions uint32   `json:"region_count"`
	Health  string   `json:"health"`
	Reasons []string `json:"reasons"`
	Nodes   []struct {
		Node     uint32 `json:"node_id"`
		State    string `json:"state"`
		Voter    bool   `json:"voter"`
		CacheCap uint64 `json:"cache_capacity_bytes"`
		Homed    uint32 `json:"homed_shards"`
		Error    string `json:"error"`
	} `json:"nodes"`
}

func (c *cluster) waitHealthy(i int) {
	c.t.Helper()
	c.waitHealthyWithin(i, 60*time.Second)
}

// waitHealthyWithin is waitHealthy with a bound of d.
func (c *cluster) waitHealthyWithin(i int, d time.Duration) {
	c.t.Helper()
	eventually(c.t, fmt.Sprintf("dsmctl status on n%d exits 0", i), d, func() error {
		for _, p := range c.nodes {
			select {
			case <-p.done:
				return fmt.Errorf("n%d exited: %v", p.id, p.err)
			default:
			}
		}
		out, errs, code := c.ctl(i, "status")
		if code != 0 {
			return fmt.Errorf("exit %d: %s%s", code, out, errs)
		}
		return nil
	})
}

// status is dsmctl status --json on node i, whatever its health verdict
// (it exits 3 when degraded, 4 when failing).
func (c *cluster) status(i int) (statusJSON, error) {
	var st statusJSON
	out, errs, code := c.ctl(i, "status", "--json")
	if code != 0 && code != 3 && code != 4 {
		return st, fmt.Errorf("exit %d: %s%s", code, out, errs)
	}
	err := json.Unmarshal([]byte(out), &st)
	return st, err
}

// incarnations returns the incarnation of each member as node i lists it.
func (c *cluster) incarnations(i int) (map[uint32]uint64, error) {
	var members struct {
		Members []struct {
			Node        uint32 `json:"node_id"`
			Incarnation uint64 `json:"incarnation"`
		} `json:"members"`
	}
	out, errs, code := c.ctl(i, "members", "--json")
	if code != 0 {
		return nil, fmt.Errorf("dsmctl members on n%d: exit %d: %s", i, code, strings.TrimSpace(errs))
	}
	if err := json.Unmarshal([]byte(out), &members); err != nil {
		return nil, err
	}
	incs := map[uint32]uint64{}
	for _, m := range members.Members {
		incs[m.Node] = m.Incarnation
	}
	return incs, nil
}

// waitAllAlive waits until dsmctl status on node i answers with every
// member alive, whatever its health verdict (a restart that lost a
// region's pages leaves the cluster degraded).
func (c *cluster) waitAllAlive(i int) {
	c.t.Helper()
	eventually(c.t, fmt.Sprintf("dsmctl status on n%d shows every member alive", i), 60*time.Second, func() error {
		st, err := c.status(i)
		if err != nil {
			return err
		}
		if len(st.Nodes) != len(c.nodes) {
			return fmt.Errorf("%d members, want %d", len(st.Nodes), len(c.nodes))
		}
		for _, n := range st.Nodes {
			if n.State != "alive" {
				return fmt.Errorf("n%d is %s", n.Node, n.State)
			}
		}
		return nil
	})
}

// waitRevived waits, up to d, until dsmctl status on node i shows the
// cluster's shards (shards in all) homed at live incarnations, and names no
// region whose pages wait for a page store to load them (a durable
// region's shards after a restart of their homes, docs/durability.md §4).
func (c *cluster) waitRevived(i int, shards uint32, d time.Duration) {
	c.t.Helper()
	eventually(c.t, fmt.Sprintf("dsmctl status on n%d shows every shard homed at a live node", i), d, func() error {
		st, err := c.status(i)
		if err != nil {
			return err
		}
		for _, r := range st.Reasons {
			if strings.Contains(r, "page store holds them loads them") {
				return errors.New(r)
			}
		}
		var homed uint32
		for _, n := range st.Nodes {
			homed += n.Homed
		}
		if homed != shards {
			return fmt.Errorf("%d of %d shards homed at live nodes", homed, shards)
		}
		return nil
	})
}

func TestClusterThroughDsmctl(t *testing.T) {
	longTest(t)
	c := startCluster(t, 3)
	c.waitHealthy(1)

	var st statusJSON
	c.ctlJSON(2, &st, "status")
	if st.Node != 2 || st.Leader == 0 || st.Term == 0 || st.Health != "healthy" || len(st.Nodes) != 3 {
		t.Fatalf("status on n2: %+v", st)
	}
	for _, n := range st.Nodes {
		// Every node answered for its own cache (the default 1 GiB).
		if n.State != "alive" || !n.Voter || n.CacheCap != 1<<30 || n.Error != "" {
			t.Fatalf("status on n2: member %+v", n)
		}
	}
	out, _, code := c.ctl(3, "status")
	if code != 0 || !strings.Contains(out, "health: healthy") || !strings.Contains(out, fmt.Sprintf("leader n%d", st.Leader)) {
		t.Fatalf("status text on n3 (exit %d):\n%s", code, out)
	}

	var mem struct {
		Epoch   uint64 `json:"epoch"`
		Members []struct {
			Node     uint32 `json:"node_id"`
			State    string `json:"state"`
			Gossip   string `json:"gossip_addr"`
			Raft     string `json:"raft_addr"`
			Verbs    string `json:"verbs_addr"`
			GRPCAddr string `json:"grpc_addr"`
		} `json:"members"`
	}
	c.ctlJSON(1, &mem, "members")
	if len(mem.Members) != 3 || mem.Epoch == 0 {
		t.Fatalf("members: %+v", mem)
	}
	for i, m := range mem.Members {
		if m.Node != uint32(i+1) || m.State != "alive" || m.Gossip == "" || m.Raft == "" || m.Verbs == "" ||
			m.GRPCAddr != "unix://"+c.nodes[i].socket {
			t.Fatalf("member %d: %+v", i, m)
		}
	}
	if out, _, code := c.ctl(1, "members"); code != 0 || strings.Count(out, "alive") != 3 {
		t.Fatalf("members text (exit %d):\n%s", code, out)
	}

	var rf struct {
		Node   uint32   `json:"node_id"`
		Role   string   `json:"role"`
		Leader uint32   `json:"leader_id"`
		Voters []uint32 `json:"voters"`
	}
	c.ctlJSON(3, &rf, "raft")
	if rf.Node != 3 || rf.Leader != st.Leader || len(rf.Voters) != 3 {
		t.Fatalf("raft on n3: %+v", rf)
	}
	if (rf.Role == "leader") != (st.Leader == 3) {
		t.Fatalf("raft on n3: role %q with leader n%d", rf.Role, st.Leader)
	}

	if out, errs, code := c.ctl(1, "region", "create", "r1", "64MiB"); code != 0 {
		t.Fatalf("region create: exit %d: %s%s", code, out, errs)
	}
	type regionJSON struct {
		Name   string `json:"name"`
		ID     uint32 `json:"id"`
		Size   uint64 `json:"size"`
		Shards uint32 `json:"shards"`
	}
	var ls struct {
		Regions []regionJSON `json:"regions"`
	}
	c.ctlJSON(3, &ls, "region", "ls")
	if len(ls.Regions) != 1 || ls.Regions[0].Name != "r1" || ls.Regions[0].Size != 64<<20 || ls.Regions[0].Shards != 32 {
		t.Fatalf("region ls on n3: %+v", ls)
	}
	if out, _, code := c.ctl(3, "region", "ls"); code != 0 || !strings.Contains(out, "r1") {
		t.Fatalf("region ls text (exit %d):\n%s", code, out)
	}

	var info struct {
		Region regionJSON `json:"region"`
		Shards []struct {
			Index     uint32   `json:"index"`
			FirstPage uint64   `json:"first_page"`
			PageCount uint64   `json:"page_count"`
			Home      uint32   `json:"home"`
			Backups   []uint32 `json:"backups"`
		} `json:"shards"`
	}
	c.ctlJSON(2, &info, "region", "info", "r1")
	if info.Region.Name != "r1" || len(info.Shards) != 32 {
		t.Fatalf("region info: %+v", info.Region)
	}
	homes := map[uint32]int{}
	var pages uint64
	for _, s := range info.Shards {
		if s.Home < 1 || s.Home > 3 || len(s.Backups) != 1 || s.Backups[0] == s.Home || s.Backups[0] < 1 || s.Backups[0] > 3 {
			t.Fatalf("shard %+v: want a home and one other backup among n1..n3", s)
		}
		if s.FirstPage != pages {
			t.Fatalf("shard %d starts at page %d, want %d", s.Index, s.FirstPage, pages)
		}
		pages += s.PageCount
		homes[s.Home]++
	}
	if pages != (64<<20)/4096 || len(homes) < 2 {
		t.Fatalf("shards cover %d pages over homes %v", pages, homes)
	}
	if out, _, code := c.ctl(2, "region", "info", "r1"); code != 0 || !strings.Contains(out, "BACKUPS") {
		t.Fatalf("region info text (exit %d):\n%s", code, out)
	}

	// Memory through the coherence protocol: put on n1, get on n2 and n3;
	// then n3 overwrites part of it and n1 sees that.
	if out, errs, code := c.ctl(1, "put", "r1", "8190", "hello, dsm"); code != 0 || !strings.Contains(out, "wrote 10 bytes") {
		t.Fatalf("put on n1: exit %d: %s%s", code, out, errs)
	}
	for _, i := range []int{2, 3} {
		if out, errs, code := c.ctl(i, "get", "r1", "8190", "10", "--raw"); code != 0 || out != "hello, dsm" {
			t.Fatalf("get --raw on n%d: exit %d: %q %s", i, code, out, errs)
		}
	}
	if out, errs, code := c.ctl(3, "put", "r1", "8190", "HELLO"); code != 0 {
		t.Fatalf("put on n3: exit %d: %s%s", code, out, errs)
	}
	if out, errs, code := c.ctl(1, "get", "r1", "8190", "10"); code != 0 || !strings.Contains(out, "|HELLO, dsm|") {
		t.Fatalf("get (hexdump) on n1: exit %d: %q %s", code, out, errs)
	}
	// The cluster picture of pages 0-3: page 1 (the first bytes) is now
	// Shared at n1 and, after n3's put, Modified nowhere else; page 2
	// holds the tail.
	var pj struct {
		Cluster bool `json:"cluster"`
		Cells   []struct {
			FirstPage  uint64   `json:"first_page"`
			Modified   uint64   `json:"modified"`
			Shared     uint64   `json:"shared"`
			Invalid    uint64   `json:"invalid"`
			Owners     []uint32 `json:"owners"`
			MaxSharers uint32   `json:"max_sharers"`
		} `json:"cells"`
	}
	c.ctlJSON(2, &pj, "pages", "r1", "--range", "0:4")
	if !pj.Cluster || len(pj.Cells) != 4 || pj.Cells[0].Invalid != 1 || pj.Cells[3].Invalid != 1 ||
		pj.Cells[1].Invalid != 0 || pj.Cells[2].Invalid != 0 {
		t.Fatalf("pages --json: %+v", pj)
	}
	for _, cell := range pj.Cells[1:3] {
		if cell.Modified == 1 && len(cell.Owners) != 1 || cell.Shared == 1 && cell.MaxSharers == 0 {
			t.Fatalf("pages --json cell %+v", cell)
		}
	}
	if out, _, code := c.ctl(2, "pages", "r1", "--range", "0:64"); code != 0 || !strings.Contains(out, "legend") {
		t.Fatalf("pages picture (exit %d):\n%s", code, out)
	}
	var top struct {
		Nodes []struct {
			Node  uint32 `json:"node_id"`
			Error string `json:"error"`
		} `json:"nodes"`
	}
	c.ctlJSON(1, &top, "top", "--once")
	if len(top.Nodes) != 3 {
		t.Fatalf("top --once --json: %+v", top)
	}
	for _, n := range top.Nodes {
		if n.Error != "" {
			t.Fatalf("top: n%d: %s", n.Node, n.Error)
		}
	}
	var bench struct {
		Target string `json:"target"`
		Ops    int    `json:"ops"`
		All    struct {
			Count int `json:"count"`
		} `json:"all"`
	}
	out, errs, code := c.ctl(3, "bench", "--region", "r1", "--ops", "200", "--threads", "2", "--json")
	if code != 0 || json.Unmarshal([]byte(out), &bench) != nil || bench.Ops != 200 || bench.All.Count != 200 ||
		bench.Target != "admin on n1,n2,n3" {
		t.Fatalf("bench --json: exit %d: %s %s", code, out, errs)
	}
	// Bad input is refused with one line and a non-zero exit.
	if _, errs, code := c.ctl(1, "get", "r1", "67108860", "16"); code == 0 || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
		t.Fatalf("get past the end: exit %d, stderr %q", code, errs)
	}

	if out, errs, code := c.ctl(2, "region", "rm", "r1"); code != 0 {
		t.Fatalf("region rm: exit %d: %s%s", code, out, errs)
	}
	c.ctlJSON(1, &ls, "region", "ls")
	if len(ls.Regions) != 0 {
		t.Fatalf("region ls after rm: %+v", ls)
	}
	if _, _, code := c.ctl(1, "region", "info", "r1"); code == 0 {
		t.Fatal("region info of a deleted region exits 0")
	}

	// SIGTERM: n3 leaves gracefully and exits 0; the others stay healthy
	// and list it as left.
	n3 := c.nodes[2]
	if err := n3.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n3.done:
		if n3.err != nil {
			t.Fatalf("n3 after SIGTERM: %v", n3.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("n3 did not exit 30 s after SIGTERM")
	}
	eventually(t, "n1 lists n3 as left and is healthy", 30*time.Second, func() error {
		var st statusJSON
		out, _, code := c.ctl(1, "status", "--json")
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return err
		}
		for _, n := range st.Nodes {
			if n.Node == 3 && n.State == "left" && code == 0 {
				return nil
			}
		}
		return fmt.Errorf("exit %d: %s", code, out)
	})
}

func TestKilledNodeMakesStatusFail(t *testing.T) {
	longTest(t)
	c := startCluster(t, 3)
	c.waitHealthy(1)
	victim := c.nodes[2]
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	var last string
	eventually(t, "dsmctl status on n1 exits non-zero after n3 is killed", 60*time.Second, func() error {
		out, _, code := c.ctl(1, "status")
		last = out
		if code == 0 {
			return errors.New("still healthy")
		}
		if code != 3 && code != 4 {
			return fmt.Errorf("exit %d, want 3 (degraded) or 4 (unhealthy):\n%s", code, out)
		}
		return nil
	})
	var st statusJSON
	out, _, code := c.ctl(2, "status", "--json")
	if code != 3 && code != 4 {
		t.Fatalf("status on n2: exit %d\n%s\n(n1 said:\n%s)", code, out, last)
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	if st.Health == "healthy" || len(st.Reasons) == 0 || !strings.Contains(strings.Join(st.Reasons, "\n"), "n3") {
		t.Fatalf("status on n2 after n3 died: %+v", st)
	}

	// n3 restarts from its data directory (its socket file is stale) and the
	// cluster is healthy again, with n3 alive.
	victim.log.Reset()
	victim.start(t)
	c.waitHealthy(1)
	c.waitHealthy(3)
	c.ctlJSON(1, &st, "status")
	for _, n := range st.Nodes {
		if n.State != "alive" {
			t.Fatalf("after n3's restart: %+v", st)
		}
	}
}

func TestDsmdHelp(t *testing.T) {
	out, err := exec.Command(dsmdBin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("dsmd --help: %v\n%s", err, out)
	}
	for _, f := range []string{"id", "data-dir", "bind", "port-base", "gossip-addr", "raft-addr", "rpc-addr",
		"verbs-addr", "grpc-addr", "join", "bootstrap-expect", "socket", "map-socket", "cache-size",
		"metrics-addr", "pprof", "log-level", "config"} {
		if !strings.Contains(string(out), "-"+f+" ") && !strings.Contains(string(out), "-"+f+"\n") {
			t.Errorf("dsmd --help does not explain --%s", f)
		}
	}
	if !strings.Contains(string(out), "Example") {
		t.Error("dsmd --help has no example")
	}
	// A missing required flag is a usage error naming it.
	cmd := exec.Command(dsmdBin, "--data-dir", t.TempDir())
	out, err = cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "--id") {
		t.Fatalf("dsmd without --id: %v\n%s", err, out)
	}
}

// testLogLevel is the dsmd log level of the clusters the tests start:
// DSM_TEST_LOG_LEVEL (debug, for instance, to see a Sync's phases), or info.
func testLogLevel() string {
	if l := os.Getenv("DSM_TEST_LOG_LEVEL"); l != "" {
		return l
	}
	return "info"
}
