package directory_test

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/ids"
)

// Multi-process tests: the test binary re-executes itself as a directory
// node (TestMain sees nodeProcessEnv) that serves until it is killed. Nodes
// run real Raft on disk, real gossip and the forwarding RPC on 127.0.0.1.

const nodeProcessEnv = "DSM_DIRECTORY_TEST_NODE"

var stockTiming = flag.Bool("directory.stock-timing", false, "run TestProcessCluster with the stock memberlist LAN and raft timeouts instead of LANTiming (for comparison)")

// stock is memberlist's DefaultLANConfig and raft's DefaultConfig timing.
func stock() directory.Timing {
	t := directory.LANTiming()
	t.GossipProbeInterval, t.GossipProbeTimeout, t.GossipInterval = time.Second, 500*time.Millisecond, 200*time.Millisecond
	t.GossipSuspicionMult, t.GossipSuspicionMaxMult = 4, 6
	t.RaftHeartbeat, t.RaftElection, t.RaftLeaderLease = time.Second, time.Second, 500*time.Millisecond
	return t
}

var measure = flag.Int("directory.measure", 0, "repeat the kill -9 failover and detection measurement this many times and log the figures")

type procConfig struct {
	ID        ids.NodeID
	Dir       string
	Gossip    string
	Raft      string
	RPC       string
	Join      []string
	Expect    int
	MaxVoters int
	Stock     bool
	// Create lists regions the node creates (through the leader) before it
	// reports ready.
	Create []string
	// Nonce is the process's incarnation nonce; 0 lets the directory draw
	// one.
	Nonce uint64
}

// runNodeProcess is the body of a child node process.
func runNodeProcess() {
	var pc procConfig
	if err := json.Unmarshal([]byte(os.Getenv(nodeProcessEnv)), &pc); err != nil {
		fmt.Fprintln(os.Stderr, "bad node config:", err)
		os.Exit(2)
	}
	timing := directory.LANTiming()
	if pc.Stock {
		timing = stock()
	}
	d, err := directory.Open(directory.Config{
		NodeID: pc.ID, DataDir: pc.Dir, Nonce: pc.Nonce, GossipAddr: pc.Gossip, RaftAddr: pc.Raft, RPCAddr: pc.RPC,
		GRPCAddr: "127.0.0.1:1", VerbsAddr: "127.0.0.1:2",
		Join: pc.Join, BootstrapExpect: pc.Expect, MaxVoters: pc.MaxVoters,
		Timing: timing,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(2)
	}
	for _, name := range pc.Create {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := d.CreateRegion(ctx, directory.RegionSpec{Name: name, Size: 1 << 30})
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, "create:", err)
			os.Exit(2)
		}
	}
	fmt.Println("READY", d.Addrs().RPC)
	// Exit when the test process goes away (stdin is a pipe from it), so
	// that a test binary killed by a timeout leaves no node behind.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	d.Close()
	os.Exit(0)
}

type proc struct {
	cfg    procConfig
	cmd    *exec.Cmd
	stderr string
}

type procCluster struct {
	t     *testing.T
	dir   string
	procs map[ids.NodeID]*proc
}

func newProcCluster(t *testing.T) *procCluster {
	pc := &procCluster{t: t, dir: t.TempDir(), procs: map[ids.NodeID]*proc{}}
	t.Cleanup(func() {
		for id := range pc.procs {
			pc.kill(id)
		}
		if t.Failed() {
			for id, p := range pc.procs {
				b, _ := os.ReadFile(p.stderr)
				lines := strings.Split(string(b), "\n")
				t.Logf("--- stderr of %v (last lines):\n%s", id, strings.Join(lines[max(0, len(lines)-30):], "\n"))
			}
		}
	})
	return pc
}

func (pc *procCluster) config(id ids.NodeID, expect, maxVoters int, join []string) procConfig {
	if p, ok := pc.procs[id]; ok {
		return p.cfg
	}
	return procConfig{
		ID: id, Dir: filepath.Join(pc.dir, fmt.Sprintf("n%d", id)),
		Gossip: freeAddr(pc.t), Raft: freeAddr(pc.t), RPC: freeAddr(pc.t),
		Join: join, Expect: expect, MaxVoters: maxVoters, Stock: *stockTiming,
	}
}

// start runs a node process and waits until it serves.
func (pc *procCluster) start(cfg procConfig) {
	t := pc.t
	t.Helper()
	b, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), nodeProcessEnv+"="+string(b))
	errPath := filepath.Join(pc.dir, fmt.Sprintf("stderr-%d-%d.log", cfg.ID, time.Now().UnixNano()))
	ef, err := os.Create(errPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	cmd.Stderr = ef
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cmd.StdinPipe(); err != nil { // closed by Wait, or by our death
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && !strings.HasPrefix(line, "READY") {
			err = fmt.Errorf("unexpected first line %q", line)
		}
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			b, _ := os.ReadFile(errPath)
			t.Fatalf("node %v did not start: %v\n%s", cfg.ID, err, b)
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("node %v did not start in time", cfg.ID)
	}
	pc.procs[cfg.ID] = &proc{cfg: cfg, cmd: cmd, stderr: errPath}
}

// kill sends SIGKILL: no cleanup, no goodbye, like a power cut of the
// process (the OS still has the files pebble synced).
func (pc *procCluster) kill(id ids.NodeID) {
	p := pc.procs[id]
	if p == nil || p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
	p.cmd = nil
}

func (pc *procCluster) restart(id ids.NodeID) {
	pc.t.Helper()
	pc.start(pc.procs[id].cfg)
}

type figures struct {
	failover  []time.Duration // kill -9 of the leader until CreateRegion succeeds
	gossip    []time.Duration // kill -9 of a follower until gossip reports it dead
	fsmFailed []time.Duration // kill -9 of a follower until the directory marks it failed
}

func summary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return fmt.Sprintf("n=%d min=%v median=%v max=%v", len(s), s[0].Round(time.Millisecond), s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

// TestProcessCluster runs three node processes plus this process as a
// fourth member, then: kills the leader with SIGKILL and checks that a new
// leader takes over without losing a committed region; restarts the killed
// node from its data directory and checks it catches up; kills a follower
// and checks that it is marked failed in a new epoch. It logs the failover
// and detection times it observed (no assertion on them: the machine is
// shared). -directory.measure=N repeats the kills N times.
func TestProcessCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	pc := newProcCluster(t)
	var seed procConfig
	for _, id := range []ids.NodeID{1, 2, 3} {
		var join []string
		if id > 1 {
			join = []string{seed.Gossip}
		}
		cfg := pc.config(id, 3, 3, join)
		if id == 1 {
			seed = cfg
		}
		pc.start(cfg)
	}
	c := newCluster(t)
	cfg := c.config(10, 0, 3, []string{seed.Gossip})
	cfg.Timing = directory.LANTiming()
	if *stockTiming {
		cfg.Timing = stock()
	}
	c.cfgs[10] = cfg
	me := c.start(cfg)
	waitFor(t, "a leader", func() bool { return me.RaftStats().Leader != ids.None })
	waitFor(t, "4 alive members", func() bool { return len(me.View().Alive()) == 4 })

	// Count departures of members nobody killed: false positives of the
	// failure detector.
	var (
		killedMu sync.Mutex
		killed   = map[ids.NodeID]bool{}
		falsePos []string
	)
	changes, cancel := me.Subscribe()
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for ch := range changes {
			killedMu.Lock()
			for _, id := range ch.Departed() {
				if !killed[id] {
					falsePos = append(falsePos, fmt.Sprintf("%v in %v", id, ch.Cur.Epoch))
				}
			}
			for _, id := range ch.Joined() {
				delete(killed, id)
			}
			killedMu.Unlock()
		}
	}()
	kill := func(id ids.NodeID) {
		killedMu.Lock()
		killed[id] = true
		killedMu.Unlock()
		pc.kill(id)
	}

	var f figures
	rounds := max(1, *measure)
	for round := range rounds {
		ctx, cancelRound := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancelRound()
		before, err := me.CreateRegion(ctx, spec(fmt.Sprintf("before-%d", round)))
		if err != nil {
			t.Fatal(err)
		}
		// Kill the leader.
		var leader ids.NodeID
		waitFor(t, "a process leader", func() bool {
			leader = me.RaftStats().Leader
			if leader == me.NodeID() {
				// This process was promoted and elected; hand off, so that the
				// leader killed is a node process.
				_ = me.TransferLeadership()
				return false
			}
			return leader != ids.None && pc.procs[leader] != nil && pc.procs[leader].cmd != nil
		})
		e0 := me.Epoch()
		start := time.Now()
		kill(leader)
		after, err := me.CreateRegion(ctx, spec(fmt.Sprintf("after-%d", round)))
		if err != nil {
			t.Fatalf("create after killing leader %v: %v", leader, err)
		}
		f.failover = append(f.failover, time.Since(start))
		v, err := me.LinearizableView(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if r, ok := v.Region(before.Name); !ok || r.ID != before.ID {
			t.Fatalf("region %q committed before the kill is lost", before.Name)
		}
		waitFor(t, "killed leader marked failed", func() bool {
			m, _ := me.View().Member(leader)
			return m.State == directory.StateFailed
		})
		if me.Epoch() <= e0 {
			t.Fatalf("epoch %v did not grow past %v", me.Epoch(), e0)
		}

		// Restart it from its data directory; it catches up.
		pc.restart(leader)
		waitFor(t, "restarted node alive again", func() bool {
			m, _ := me.View().Member(leader)
			return m.State == directory.StateAlive
		})
		rpc := pc.procs[leader].cfg.RPC
		waitFor(t, "restarted node has both regions", func() bool {
			rv, err := directory.RemoteView(ctx, rpc)
			if err != nil {
				return false
			}
			a, okA := rv.Region(before.Name)
			b, okB := rv.Region(after.Name)
			return okA && okB && a.ID == before.ID && b.ID == after.ID
		})

		// Kill a follower process; time gossip detection and the
		// directory's failed mark.
		var victim ids.NodeID
		l := me.RaftStats().Leader
		for id := range pc.procs {
			if id != l && pc.procs[id].cmd != nil {
				victim = id
				break
			}
		}
		waitFor(t, "this process's gossip sees the victim alive", func() bool {
			for _, g := range me.GossipMembers() {
				if g.ID == victim {
					return g.State == directory.StateAlive
				}
			}
			return false
		})
		e1 := me.Epoch()
		start = time.Now()
		kill(victim)
		waitFor(t, "gossip reports the killed follower dead", func() bool {
			for _, g := range me.GossipMembers() {
				if g.ID == victim {
					return g.State == directory.StateFailed || g.State == directory.StateLeft
				}
			}
			return true
		})
		f.gossip = append(f.gossip, time.Since(start))
		waitFor(t, "killed follower marked failed", func() bool {
			m, _ := me.View().Member(victim)
			return m.State == directory.StateFailed
		})
		f.fsmFailed = append(f.fsmFailed, time.Since(start))
		if me.Epoch() <= e1 {
			t.Fatalf("epoch did not grow when %v failed", victim)
		}
		pc.restart(victim)
		waitFor(t, "restarted follower alive", func() bool {
			m, _ := me.View().Member(victim)
			return m.State == directory.StateAlive
		})
	}
	cancel()
	<-watchDone
	t.Logf("leader kill -9 -> region created (failover): %s", summary(f.failover))
	t.Logf("follower kill -9 -> gossip says dead:       %s", summary(f.gossip))
	t.Logf("follower kill -9 -> directory marks failed: %s", summary(f.fsmFailed))
	t.Logf("members marked failed without being killed: %d %v", len(falsePos), falsePos)
}

// startProcs starts n node processes that bootstrap together and returns
// the first one's configuration (the seed); adjust, when given, changes
// each configuration before its process starts.
func (pc *procCluster) startProcs(n, maxVoters int, adjust ...func(*procConfig)) procConfig {
	var seed procConfig
	for i := 1; i <= n; i++ {
		id := ids.NodeID(i)
		var join []string
		if id > 1 {
			join = []string{seed.Gossip}
		}
		cfg := pc.config(id, n, maxVoters, join)
		for _, f := range adjust {
			f(&cfg)
		}
		if id == 1 {
			seed = cfg
		}
		pc.start(cfg)
	}
	return seed
}

// TestProcessSingleNode: a one-node cluster survives kill -9: the region it
// committed is there after a restart from its data directory, and the node
// leads again and accepts writes.
func TestProcessSingleNode(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	pc := newProcCluster(t)
	cfg := pc.config(1, 1, 1, nil)
	cfg.Create = []string{"solo-1"}
	pc.start(cfg)
	pc.kill(1)
	cfg.Create = []string{"solo-2"}
	pc.start(cfg)
	ctx := ctxT(t)
	v, err := directory.RemoteView(ctx, cfg.RPC)
	if err != nil {
		t.Fatal(err)
	}
	r1, ok1 := v.Region("solo-1")
	r2, ok2 := v.Region("solo-2")
	if !ok1 || !ok2 || r1.ID == r2.ID {
		t.Fatalf("after kill -9 and restart: regions %+v", v.Regions())
	}
	if m, _ := v.Member(1); m.State != directory.StateAlive {
		t.Fatalf("member 1 is %v", m.State)
	}
}

// TestProcessFiveNodes: five voter processes; the leader is killed; the
// four others elect a new one and keep every committed region.
func TestProcessFiveNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	pc := newProcCluster(t)
	seed := pc.startProcs(5, 5)
	c := newCluster(t)
	cfg := c.config(10, 0, 5, []string{seed.Gossip})
	cfg.Timing = directory.LANTiming()
	c.cfgs[10] = cfg
	me := c.start(cfg)
	ctx := ctxT(t)
	waitFor(t, "6 alive members", func() bool { return len(me.View().Alive()) == 6 })
	waitFor(t, "five voters and this process as non-voter", func() bool {
		st := me.RaftStats()
		return len(st.Voters) == 5 && slices.Equal(st.NonVoters, []ids.NodeID{10}) && st.Leader != ids.None && st.Leader != 10
	})
	before, err := me.CreateRegion(ctx, spec("five-before"))
	if err != nil {
		t.Fatal(err)
	}
	leader := me.RaftStats().Leader
	pc.kill(leader)
	if _, err := me.CreateRegion(ctx, spec("five-after")); err != nil {
		t.Fatal(err)
	}
	v, err := me.LinearizableView(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := v.Region(before.Name); !ok || r.ID != before.ID {
		t.Fatal("committed region lost")
	}
	waitFor(t, "killed leader marked failed, this process promoted", func() bool {
		m, _ := me.View().Member(leader)
		st := me.RaftStats()
		return m.State == directory.StateFailed && len(st.Voters) == 5 && slices.Contains(st.Voters, 10)
	})
}

// TestProcessRestartIsNewIncarnation: three node processes; one is killed
// with SIGKILL and restarted from its data directory with a new nonce. The
// others' views show it as the next incarnation under a new protocol id,
// with the old id quarantined, all in one epoch; gossip about the dead
// process never brings the old incarnation back. Once the restart is quick
// (no wait for failure detection: the member may never be marked failed),
// once after the member was marked failed.
func TestProcessRestartIsNewIncarnation(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	pc := newProcCluster(t)
	pc.startProcs(3, 3, func(c *procConfig) { c.Nonce = 0x1000 + uint64(c.ID) })
	ctx := ctxT(t)
	view := func(id ids.NodeID) *directory.View {
		v, err := directory.RemoteView(ctx, pc.procs[id].cfg.RPC)
		if err != nil {
			return nil
		}
		return v
	}
	waitFor(t, "3 alive members", func() bool {
		v := view(1)
		return v != nil && len(v.Alive()) == 3
	})
	protos := map[ids.NodeID]bool{}
	for _, m := range view(1).Members() {
		if m.Incarnation != 1 || m.Nonce != 0x1000+uint64(m.ID) || m.Proto == ids.None || protos[m.Proto] {
			t.Fatalf("first incarnation of %v: %+v", m.ID, m)
		}
		protos[m.Proto] = true
	}

	for round, waitFailed := range []bool{false, true} {
		// Kill a node other than the one observed from.
		victim := ids.NodeID(2 + round)
		old, _ := view(1).Member(victim)
		pc.kill(victim)
		if waitFailed {
			waitFor(t, fmt.Sprintf("%v marked failed", victim), func() bool {
				v := view(1)
				if v == nil {
					return false
				}
				m, _ := v.Member(victim)
				return m.State == directory.StateFailed
			})
		}
		cfg := pc.procs[victim].cfg
		cfg.Nonce = 0x2000 + uint64(round)
		pc.procs[victim].cfg = cfg
		pc.restart(victim)

		var v *directory.View
		var m directory.Member
		waitFor(t, fmt.Sprintf("%v alive as incarnation %d on every node", victim, old.Incarnation+1), func() bool {
			for _, id := range []ids.NodeID{1, 2, 3} {
				w := view(id)
				if w == nil {
					return false
				}
				x, _ := w.Member(victim)
				if x.Incarnation != old.Incarnation+1 || x.State != directory.StateAlive {
					return false
				}
				if id == 1 {
					v, m = w, x
				}
			}
			return true
		})
		if m.Nonce != cfg.Nonce || m.Proto == old.Proto || protos[m.Proto] || !slices.Contains(m.PastNonces, old.Nonce) {
			t.Fatalf("round %d: restarted %v is %+v (was %+v)", round, victim, m, old)
		}
		protos[m.Proto] = true
		// The old id is quarantined in the epoch of the restart, and that
		// one epoch is where the new incarnation appears.
		// It may have been declared failed before it came back (FailedAt):
		// it departed then.
		q := v.Quarantine()
		var got directory.Quarantined
		if len(q) == round+1 {
			got = q[round]
		}
		leftAt := m.Epoch
		if got.Failures > 0 {
			leftAt = got.LastFailedAt
		}
		want := directory.Quarantined{Proto: old.Proto, LeftAt: leftAt, Node: victim, Incarnation: old.Incarnation,
			FailedAt: got.FailedAt, LastFailedAt: got.LastFailedAt, Failures: got.Failures, JoinedAt: old.JoinedAt}
		if len(q) != round+1 || got.LastFailedAt >= m.Epoch || got != want {
			t.Fatalf("round %d: quarantine %+v, want %v left in %v", round, q, old.Proto, m.Epoch)
		}
		if v.ProtoIDsLeft() != int(directory.MaxProtoID)-3-(round+1) {
			t.Fatalf("round %d: %d protocol ids left", round, v.ProtoIDsLeft())
		}
		h := v.History(m.Epoch - 2)
		if len(h) < 2 || h[1].Epoch != m.Epoch {
			t.Fatalf("round %d: history around %v: %+v", round, m.Epoch, h)
		}
		for _, pm := range h[0].Members {
			if pm.Node == victim && (pm.Incarnation != old.Incarnation || pm.Proto != old.Proto) {
				t.Fatalf("round %d: epoch %v before the restart has %+v", round, h[0].Epoch, pm)
			}
		}
		if i := slices.IndexFunc(h[1].Members, func(pm directory.ProtoMember) bool { return pm.Node == victim }); i < 0 ||
			h[1].Members[i] != (directory.ProtoMember{Node: victim, Incarnation: m.Incarnation, Proto: m.Proto, State: directory.StateAlive}) {
			t.Fatalf("round %d: epoch %v of the restart: %+v", round, m.Epoch, h[1].Members)
		}
		wasMember := slices.ContainsFunc(h[0].Members, func(pm directory.ProtoMember) bool { return pm.Node == victim })
		t.Logf("round %d: %v restarted as incarnation %d, proto %v -> %v, in epoch %v (member until then: %v)",
			round, victim, m.Incarnation, old.Proto, m.Proto, m.Epoch, wasMember)
		if waitFailed {
			for _, pm := range h[0].Members {
				if pm.Node == victim {
					t.Fatalf("round %d: %v still a member in %v after it was marked failed", round, victim, h[0].Epoch)
				}
			}
		}
		// Whatever gossip still says about the dead process, the record
		// stays the new incarnation's: a few reconciliations later it has
		// not moved.
		time.Sleep(3 * time.Second)
		for _, id := range []ids.NodeID{1, 2, 3} {
			w := view(id)
			if w == nil {
				t.Fatalf("round %d: no view from %v", round, id)
			}
			if x, _ := w.Member(victim); x.Incarnation != m.Incarnation || x.Epoch != m.Epoch || x.State != directory.StateAlive {
				t.Fatalf("round %d: %v's view of %v moved to %+v", round, id, victim, x)
			}
		}
	}
}

// TestProcessFailedIsFinal: a process stopped (SIGSTOP) for longer than
// the failure detector waits is declared failed, and once it runs again
// it is not put alive again: it learns that its incarnation departed
// (from its log, or from a voter's lease refusal) and is never granted a
// lease, so its node can start a new incarnation (node.Run does).
func TestProcessFailedIsFinal(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	pc := newProcCluster(t)
	pc.startProcs(3, 3, func(c *procConfig) { c.Nonce = 0x2000 + uint64(c.ID) })
	ctx := ctxT(t)
	member := func(on, id ids.NodeID) (directory.Member, bool) {
		v, err := directory.RemoteView(ctx, pc.procs[on].cfg.RPC)
		if err != nil {
			return directory.Member{}, false
		}
		return v.Member(id)
	}
	waitFor(t, "n3 alive", func() bool {
		m, ok := member(1, 3)
		return ok && m.State == directory.StateAlive
	})
	p3 := pc.procs[3].cmd.Process
	if err := p3.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "n3 declared failed", func() bool {
		m, ok := member(1, 3)
		return ok && m.State == directory.StateFailed && m.Nonce == 0x2003
	})
	if err := p3.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "n3 learns that its incarnation was declared failed", func() bool {
		b, _ := os.ReadFile(pc.procs[3].stderr)
		return strings.Contains(string(b), "this incarnation departed") && strings.Contains(string(b), "declared failed")
	})
	// Gossip reaches it again, and it refutes its death there; the
	// directory still does not put it alive.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if m, ok := member(1, 3); !ok || m.State != directory.StateFailed || m.Nonce != 0x2003 {
			t.Fatalf("the failed incarnation came back: %+v", m)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
