package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/dsmkit/dsm/dsm"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// clientHang bounds one dsmclient run: it only catches hangs.
const clientHang = 45 * time.Second

var (
	clientOnce sync.Once
	clientBin  string
	clientErr  error
)

// dsmclientBin builds tests/internal/dsmclient once, beside dsmd (TestMain
// removes that directory).
func dsmclientBin(t *testing.T) string {
	t.Helper()
	clientOnce.Do(func() {
		clientBin = filepath.Join(filepath.Dir(dsmdBin), "dsmclient")
		args := []string{"build", "-o", clientBin}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, "github.com/dsmkit/dsm/tests/internal/dsmclient")...).CombinedOutput()
		if err != nil {
			clientErr = fmt.Errorf("building dsmclient: %v\n%s", err, out)
		}
	})
	if clientErr != nil {
		t.Fatal(clientErr)
	}
	return clientBin
}

// dsmCluster is a cluster whose nodes also serve Prometheus metrics, and
// which runs dsmclient processes against its nodes.
type dsmCluster struct {
	*cluster
	metrics []string // metrics host:port of node i+1
}

// startClusterWith starts n dsmd processes like startCluster, with
// --metrics-addr on each and extra[i] appended to node i's arguments.
func startClusterWith(t *testing.T, n int, extra map[int][]string) *dsmCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts dsmd processes; skipped with -short")
	}
	dsmclientBin(t)
	metrics := make([]string, n)
	for i := range metrics {
		metrics[i] = freeAddr(t)
	}
	c := launch(t, n, func(i int) []string {
		return append([]string{"--metrics-addr", metrics[i-1]}, extra[i]...)
	})
	return &dsmCluster{cluster: c, metrics: metrics}
}

// alive fails t if a dsmd exited.
func (c *dsmCluster) alive(t *testing.T) {
	t.Helper()
	for _, p := range c.nodes {
		select {
		case <-p.done:
			t.Fatalf("n%d exited: %v\n%s", p.id, p.err, tail(p.logString(), 3000))
		default:
		}
	}
}

// client runs dsmclient against node i on region and returns its stdout;
// an exit status other than 0 is an error with its stderr.
func (c *dsmCluster) client(node int, region string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), clientHang+15*time.Second)
	defer cancel()
	full := append([]string{"-addr", c.nodes[node-1].socket, "-region", region, "-timeout", clientHang.String()}, args...)
	cmd := exec.CommandContext(ctx, clientBin, full...)
	// A hung client prints its goroutines (SIGQUIT) before it is killed.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) }
	cmd.WaitDelay = 5 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return out.String(), fmt.Errorf("dsmclient on n%d %v hung; its goroutines:\n%s\n%s", node, args, head(errb.String(), 8000), c.pages(region))
		}
		return out.String(), fmt.Errorf("dsmclient on n%d %v: %v: %s", node, args, err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// pages is what dsmctl pages says of the first pages of region, cluster-wide
// and on each node, for failure reports.
func (c *dsmCluster) pages(region string) string {
	var b strings.Builder
	for i, p := range c.nodes {
		for _, local := range []bool{false, true} {
			args := []string{"--addr", p.socket, "--timeout", "5s", "pages", region, "--range", "0:8", "--json"}
			if local {
				args = append(args, "--local")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			out, err := exec.CommandContext(ctx, dsmctlBin, args...).CombinedOutput()
			cancel()
			fmt.Fprintf(&b, "dsmctl pages on n%d (local %v): %v\n%s\n", i+1, local, err, compactJSON(out))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, dsmctlBin, "--addr", p.socket, "--timeout", "5s", "get", region, "0", "32").CombinedOutput()
		cancel()
		fmt.Fprintf(&b, "dsmctl get %s 0 32 on n%d: %v\n%s\n", region, i+1, err, out)
	}
	return b.String()
}

func head(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// compactJSON is b without its indentation, when it is JSON.
func compactJSON(b []byte) string {
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return string(b)
	}
	return out.String()
}

// mustClient is client that fails t on an error, and returns stdout
// without the final newline.
func (c *dsmCluster) mustClient(t *testing.T, node int, region string, args ...string) string {
	t.Helper()
	out, err := c.client(node, region, args...)
	if err != nil {
		c.alive(t)
		t.Fatal(err)
	}
	return strings.TrimSuffix(out, "\n")
}

// createRegion creates a region of size bytes through node's dsmd, and
// waits until every node's directory replica has it: a replica applies
// the creation after the leader commits it, and dsm's Map asks the local
// replica first. It uses the dsm library in this process.
func (c *dsmCluster) createRegion(t *testing.T, node int, region string, size int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientHang)
	defer cancel()
	cl, err := dsm.Dial(ctx, c.nodes[node-1].socket)
	if err != nil {
		t.Fatal(err)
	}
	err = cl.CreateRegion(ctx, region, size)
	cl.Close()
	if err != nil {
		t.Fatalf("creating region %s on n%d: %v", region, node, err)
	}
	for i, p := range c.nodes {
		cl, err := dsm.Dial(ctx, p.socket)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		eventually(t, fmt.Sprintf("n%d's directory lists region %s", i+1, region), clientHang, func() error {
			rs, err := cl.Regions(ctx)
			if err != nil {
				return err
			}
			for _, r := range rs {
				if r.Name == region {
					return nil
				}
			}
			return fmt.Errorf("not among %d regions", len(rs))
		})
	}
}

// clientProc is a long-running dsmclient (repl, fault-loop).
type clientProc struct {
	node   int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *syncWriter
	done   chan struct{}
	err    error
}

// startClient starts dsmclient in the background; it is killed at the end
// of the test if still running.
func (c *dsmCluster) startClient(t *testing.T, node int, region string, args ...string) *clientProc {
	t.Helper()
	full := append([]string{"-addr", c.nodes[node-1].socket, "-region", region, "-timeout", "10m"}, args...)
	p := &clientProc{node: node, cmd: exec.Command(clientBin, full...), lines: make(chan string, 1024),
		stderr: &syncWriter{w: &bytes.Buffer{}}, done: make(chan struct{})}
	stdin, err := p.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.stdin = stdin
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	go func() { <-read; p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Errorf("dsmclient on n%d not reaped 10 s after SIGKILL", node)
		}
	})
	return p
}

func (p *clientProc) stderrString() string {
	p.stderr.mu.Lock()
	defer p.stderr.mu.Unlock()
	return p.stderr.w.String()
}

// next waits for the next line of output.
func (p *clientProc) next(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			<-p.done
			t.Fatalf("dsmclient on n%d exited: %v: %s", p.node, p.err, p.stderrString())
		}
		return l
	case <-time.After(clientHang):
		t.Fatalf("dsmclient on n%d: no output within %v: %s", p.node, clientHang, p.stderrString())
	}
	return ""
}

// call sends one repl command and returns its answer, failing t on ERR.
func (p *clientProc) call(t *testing.T, line string) string {
	t.Helper()
	l := p.try(t, line)
	if strings.HasPrefix(l, "ERR ") {
		t.Fatalf("dsmclient on n%d: %s: %s", p.node, line, l)
	}
	return l
}

// try sends one repl command and returns its answer, an "ERR ..." line
// included.
func (p *clientProc) try(t *testing.T, line string) string {
	t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		select {
		case <-p.done:
			t.Fatalf("dsmclient on n%d exited: %v: %s", p.node, p.err, p.stderrString())
		case <-time.After(clientHang):
		}
		t.Fatalf("dsmclient on n%d: %v: %s", p.node, err, p.stderrString())
	}
	return p.next(t)
}

// kill sends SIGKILL and waits for the process to be reaped.
func (p *clientProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(clientHang):
		t.Fatalf("dsmclient on n%d not reaped after SIGKILL", p.node)
	}
}

// cacheCounters are the page cache counters of one node that count
// coherence work: each one moves only when the node exchanged a coherence
// message or changed a page's state.
type cacheCounters map[string]float64

// coherenceOps are the dsm_cache_ops_total kinds in cacheCounters.
var coherenceOps = []string{"read_miss", "write_miss", "upgrade", "invalidate", "downgrade", "evict", "writeback"}

// counters reads node i's page cache counters. It asks the Admin Stats RPC
// first; while dsmd answers that it is unimplemented, it scrapes
// /metrics. via says which source answered.
func (c *dsmCluster) counters(t *testing.T, node int) (cc cacheCounters, via string) {
	t.Helper()
	if cc, ok := c.statsRPC(t, node); ok {
		return cc, "Stats RPC"
	}
	return c.scrape(t, node), "/metrics"
}

func (c *dsmCluster) statsRPC(t *testing.T, node int) (cacheCounters, bool) {
	t.Helper()
	sock := c.nodes[node-1].socket
	conn, err := grpc.NewClient("passthrough:///"+sock,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := dsmpb.NewAdminClient(conn).Stats(ctx, &dsmpb.StatsRequest{})
	if status.Code(err) == codes.Unimplemented {
		return nil, false
	}
	if err != nil {
		t.Fatalf("Stats on n%d: %v", node, err)
	}
	for _, s := range r.GetNodes() {
		if s.GetNodeId() != uint32(node) {
			continue
		}
		if s.GetError() != "" {
			t.Fatalf("Stats on n%d: %s", node, s.GetError())
		}
		cc := cacheCounters{
			"misses": float64(s.GetMisses()), "invalidations_sent": float64(s.GetInvalidationsSent()),
			"invalidations_received": float64(s.GetInvalidationsReceived()),
			"recalls_sent":           float64(s.GetRecallsSent()), "recalls_received": float64(s.GetRecallsReceived()),
			"evictions": float64(s.GetEvictions()), "writebacks": float64(s.GetWritebacks()),
		}
		for k, v := range s.GetFaults() {
			if k != "minor" {
				cc["faults_"+k] = float64(v)
			}
		}
		return cc, true
	}
	t.Fatalf("Stats on n%d: no figures for n%d in %v", node, node, r)
	return nil, false
}

// metricsOf scrapes node i's /metrics: the value of every sample, by
// its name and labels as written ("dsm_cache_ops_total{op=\"evict\"}").
func (c *dsmCluster) metricsOf(t *testing.T, node int) map[string]float64 {
	t.Helper()
	hc := http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get("http://" + c.metrics[node-1] + "/metrics")
	if err != nil {
		t.Fatalf("metrics of n%d: %v", node, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics of n%d: %v %s", node, err, resp.Status)
	}
	m := map[string]float64{}
	for _, l := range strings.Split(string(body), "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		f, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics of n%d: %q: %v", node, l, err)
		}
		m[l[:i]] = f
	}
	return m
}

// scrape reads dsm_cache_ops_total from node i's /metrics.
func (c *dsmCluster) scrape(t *testing.T, node int) cacheCounters {
	t.Helper()
	m := c.metricsOf(t, node)
	cc := cacheCounters{}
	for _, op := range coherenceOps {
		if v, ok := m[`dsm_cache_ops_total{op="`+op+`"}`]; ok {
			cc[op] = v
		}
	}
	if len(cc) != len(coherenceOps) {
		t.Fatalf("metrics of n%d: found %v of the counters %v (is the page cache on?)", node, cc, coherenceOps)
	}
	return cc
}

// protocolMessages is node i's dsm_protocol_messages_total, all directions.
func (c *dsmCluster) protocolMessages(t *testing.T, node int) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for k, v := range c.metricsOf(t, node) {
		if strings.HasPrefix(k, "dsm_protocol_messages_total") {
			out[k] = v
		}
	}
	if len(out) == 0 {
		t.Fatalf("n%d's /metrics has no dsm_protocol_messages_total", node)
	}
	return out
}

// evictions is the eviction counter, whichever source answered.
func (cc cacheCounters) evictions() float64 { return cc["evict"] + cc["evictions"] }

// longTest skips a real-process test that takes minutes unless
// DSM_LONG_TESTS is set. make test-long runs them, and CI runs make
// test-long after make test: they stay checked on every change while make
// test keeps within its budget on two cores.
func longTest(t *testing.T) {
	t.Helper()
	if os.Getenv("DSM_LONG_TESTS") == "" {
		t.Skip("a long real-process test: make test-long runs it (and CI does), or set DSM_LONG_TESTS=1")
	}
}
