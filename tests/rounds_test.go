package tests

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// The no-hang bound that TestKillRestartRounds asserts on every call of
// the library (WriteAt, Sync, ReadAt), in flight during a kill and restart
// or not. docs/failover.md §10, "What a caller sees", and
// node/localcache/doc.go: a fault on a page the cluster cannot serve ends
// within the mapping's fault timeout, plus one retry interval (retryMax,
// 100 ms), plus the miss in flight at that moment, which the engine bounds
// by its UnavailableAfter (10 s, engine.DefaultUnavailableAfter); Sync's
// write-back of a page whose home is unreachable fails after
// UnavailableAfter. The clients map with a fault timeout of
// roundsFaultTimeout, so the bound is 5 s + 0.1 s + 10 s. The failover
// itself (about 2 s after the restart, §10 "The bound") is well inside it:
// a call either completes after the failover or fails with
// ErrUnavailable, and waiting longer is a hang.
const (
	roundsFaultTimeout = 5 * time.Second
	roundsBound        = roundsFaultTimeout + 100*time.Millisecond + 10*time.Second
)

// The workload's layout in the region of TestKillRestartRounds: shards are
// 2 MiB (directory.DefaultShardSize, which CreateRegion cannot change), so
// the region has roundsShards shards, for rendezvous placement to put
// homes on every node. Each shard holds three keys: two words on its first
// page (written by different pairs of nodes: false sharing) and one on
// its second page. The pages compared at the end are the first
// roundsComparePages of each shard: the keys' pages and two that nobody
// writes.
const (
	roundsShards       = 8
	roundsShardSize    = 2 << 20
	roundsComparePages = 4
)

// roundsKeys are the offsets of the workload's 8-byte registers.
func roundsKeys() []int64 {
	var keys []int64
	for s := range int64(roundsShards) {
		base := s * roundsShardSize
		keys = append(keys, base, base+8, base+4096)
	}
	return keys
}

// writesKey says whether the writer on node writes key number k of n
// nodes: each key has two writer nodes, k%n+1 and (k+1)%n+1, and is read
// by the readers of the others. A reader never reads a key that a writer
// of its own node writes: a WriteAt is visible on its node at once and
// is durable only after Sync, so a read there may see a write that dies
// unsynced with the node (the msync contract, docs/failover.md §7),
// which a register cannot explain. A read on another node recalls the
// writer's copy, which writes it back to its home and backups: durable.
func writesKey(node, k, n int) bool {
	return node == k%n+1 || node == (k+1)%n+1
}

func envInt(t testing.TB, name string, def int64) int64 {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s, err)
	}
	return v
}

// regEvent is one line of `dsmclient registers` (its RegEvent).
type regEvent struct {
	Client  int    `json:"client"`
	Kind    string `json:"kind"`
	Phase   string `json:"phase"`
	Off     int64  `json:"off"`
	Value   uint64 `json:"value"`
	Out     uint64 `json:"out"`
	Call    int64  `json:"call"`
	Written int64  `json:"written"`
	Return  int64  `json:"return"`
	Err     string `json:"err"`
}

// regClient is one dsmclient registers process and what it printed.
type regClient struct {
	*clientProc
	id    int
	write bool
	mu    sync.Mutex // guards out
	out   []string
	// drained is closed once the process is reaped and its output read;
	// ended is when that was seen (read it after drained).
	drained chan struct{}
	ended   time.Time
	// killed is when the test killed it (zero if it did not); only the
	// test's goroutine uses it.
	killed time.Time
}

func (rc *regClient) lines() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.out)
}

// stop kills the client with SIGKILL (unless it exited already, as it
// does when its mapping dies with its dsmd) and waits for its output.
func (rc *regClient) stop(t *testing.T) {
	t.Helper()
	rc.killed = time.Now()
	if err := rc.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatal(err)
	}
	select {
	case <-rc.drained:
	case <-time.After(clientHang):
		t.Fatalf("client %d on n%d not reaped %v after SIGKILL", rc.id, rc.node, clientHang)
	}
}

// regOp is one operation of the history TestKillRestartRounds checks.
type regOp struct {
	Client int
	// Kind is "write" (it took effect: Sync returned), "maybe" (a write
	// whose WriteAt or Sync failed, or that was in flight when its client
	// died: it took effect between its call and its return, or never),
	// or "read".
	Kind   string
	Off    int64
	Value  uint64 // write, maybe
	Out    uint64 // read
	Call   int64
	Return int64
}

// regModel is the sequential specification of independent 8-byte
// registers, each starting at 0, under writes that took effect, writes
// of unknown outcome (which may leave the register as it was) and reads.
var regModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		return partitionByOff(h, func(in any) int64 { return in.(regOp).Off })
	},
	Init: func() []any { return []any{uint64(0)} },
	Step: func(state, input, _ any) []any {
		v, op := state.(uint64), input.(regOp)
		switch op.Kind {
		case "write":
			return []any{op.Value}
		case "maybe":
			return []any{v, op.Value}
		case "read":
			if op.Out == v {
				return []any{v}
			}
		}
		return nil
	},
	DescribeOperation: func(input, _ any) string {
		op := input.(regOp)
		switch op.Kind {
		case "read":
			return fmt.Sprintf("c%d read @%d -> %#x", op.Client, op.Off, op.Out)
		case "maybe":
			return fmt.Sprintf("c%d write @%d %#x (unknown outcome)", op.Client, op.Off, op.Value)
		}
		return fmt.Sprintf("c%d write @%d %#x", op.Client, op.Off, op.Value)
	},
}

// roundsFigures are what one run measured.
type roundsFigures struct {
	writes, maybes, reads, failedReads, failedWrites int
	readsSeen                                        int // reads of a value other than 0
	longest                                          time.Duration
	longestWhat                                      string
	errs                                             map[string]int // error texts, shortened, by count
	// firstErr is the first instance of each of errs: its client, node,
	// time and whole text.
	firstErr map[string]string
}

// TestKillRestartRounds is issue 17's "rounds of kill/restart of random
// nodes with the workload running": three dsmd (DSM_ROUNDS_NODES), one
// region with one backup per shard, and on every node a writer process
// (WriteAt of a unique value to a random register, then Sync) and a
// reader process (ReadAt), dsmclient registers. DSM_ROUNDS rounds (3 by
// default; make rounds runs 20): kill -9 of a random node's dsmd and of
// its clients (a machine that crashes), a random pause of 0 to 3 s, a
// restart from its data directory, a wait until every node knows its new
// incarnation and dsmctl status is healthy on every node (every member
// alive, every shard's backups complete), then its clients again. The
// schedule comes from a seed, logged; DSM_ROUNDS_SEED replays it (the
// timing of the processes is not replayed).
//
// Then, with the workload stopped: every node reads every register and
// the first pages of every shard with ReadAt, and all read the same
// bytes; the node restarted last reads the whole region as zeros with
// the registers' values; every register holds its last synced value, or
// the value of a write of unknown outcome not followed by a synced one;
// the whole history, those final reads included, is linearizable
// (porcupine; a write whose WriteAt or Sync failed, or that was in flight
// when its client died, took effect between its call and that moment, or
// never); and no call of the library waited longer than roundsBound (the
// documented no-hang bound), including the calls in flight when their
// client was killed. Calls that fail with an error within the bound
// (ErrUnavailable during a failover, the dsmd of a killed node gone) are
// allowed.
//
// It asserts only what a user sees, so it holds whether the failure
// detector declares the killed node failed before its restart or not.
func TestKillRestartRounds(t *testing.T) {
	longTest(t)
	const region = "rounds"
	rounds := int(envInt(t, "DSM_ROUNDS", 3))
	n := int(envInt(t, "DSM_ROUNDS_NODES", 3))
	seed := envInt(t, "DSM_ROUNDS_SEED", time.Now().UnixNano()%1_000_000_000)
	t.Logf("%d rounds on %d nodes, seed %d (DSM_ROUNDS_SEED=%d replays the schedule)", rounds, n, seed, seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 17))
	start := time.Now()

	c := startClusterWith(t, n, nil)
	for i := 1; i <= n; i++ {
		c.waitHealthy(i)
	}
	c.createRegion(t, 1, region, roundsShards*roundsShardSize)
	homes := c.homedPages(t, 1, region)
	t.Logf("the region's shards are homed at %d of the %d nodes", len(homes), n)

	keys := roundsKeys()
	var clients []*regClient
	nextID := 0
	startClients := func(node int) {
		for _, write := range []bool{true, false} {
			var offs []string
			for k, off := range keys {
				if writesKey(node, k, n) == write {
					offs = append(offs, strconv.FormatInt(off, 10))
				}
			}
			nextID++
			role, pause := "read", "10"
			if write {
				role, pause = "write", "20"
			}
			args := append([]string{"-id", strconv.Itoa(nextID), "-timeout", "1h", "-fault-timeout", roundsFaultTimeout.String(),
				"registers", role, strconv.FormatUint(rng.Uint64()>>1, 10), pause}, offs...)
			rc := &regClient{clientProc: c.startClient(t, node, region, args...), id: nextID, write: write, drained: make(chan struct{})}
			go func() {
				for l := range rc.clientProc.lines {
					rc.mu.Lock()
					rc.out = append(rc.out, l)
					rc.mu.Unlock()
				}
				<-rc.done
				rc.ended = time.Now()
				close(rc.drained)
			}()
			clients = append(clients, rc)
		}
	}
	running := func(node int) []*regClient {
		var out []*regClient
		for _, rc := range clients {
			select {
			case <-rc.drained:
			default:
				if rc.node == node {
					out = append(out, rc)
				}
			}
		}
		return out
	}
	for node := 1; node <= n; node++ {
		startClients(node)
	}
	time.Sleep(2 * time.Second)

	incarnation := make([]uint64, n+1)
	for i := range incarnation {
		incarnation[i] = 1
	}
	lastVictim := 1
	for round := range rounds {
		victim := 1 + rng.IntN(n)
		lastVictim = victim
		down := time.Duration(rng.Int64N(int64(3 * time.Second)))
		p := c.nodes[victim-1]
		// Its clients die with it: those that see their mapping die first
		// exit on their own, the others are killed.
		doomed := running(victim)
		if err := p.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		<-p.done
		for _, rc := range doomed {
			rc.stop(t)
		}
		fmt.Fprintf(p.log, "==== round %d: killed by the test ====\n", round)
		time.Sleep(down)
		p.start(t)
		restarted := time.Now()
		incarnation[victim]++
		c.waitIncarnation(t, victim, incarnation[victim], fmt.Sprintf("round %d", round))
		known := time.Now()
		c.waitClusterHealthy(t, fmt.Sprintf("round %d: the cluster is healthy after the restart of n%d", round, victim))
		healthy := time.Now()
		// A client that ended on its own (its mapping died) is replaced too.
		for node := 1; node <= n; node++ {
			if node != victim && len(running(node)) == 2 {
				continue
			}
			for _, rc := range running(node) {
				rc.stop(t)
			}
			if node != victim {
				t.Logf("round %d: a client on n%d ended on its own; its clients start again", round, node)
			}
			startClients(node)
		}
		t.Logf("round %d: kill -9 of n%d, restarted %v later; its new incarnation known everywhere %v after the restart, the cluster healthy %v after that",
			round, victim, restarted.Sub(killed).Round(10*time.Millisecond), known.Sub(restarted).Round(10*time.Millisecond), healthy.Sub(known).Round(10*time.Millisecond))
		time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
	}

	// Quiesce: every client finishes its operation and exits.
	for _, rc := range clients {
		rc.stdin.Close()
	}
	for _, rc := range clients {
		select {
		case <-rc.drained:
		case <-time.After(roundsBound + 10*time.Second):
			rc.cmd.Process.Signal(syscall.SIGQUIT)
			time.Sleep(2 * time.Second)
			t.Fatalf("client %d on n%d did not finish its operation %v after its stdin closed (a hang); its goroutines:\n%s",
				rc.id, rc.node, roundsBound+10*time.Second, head(rc.stderrString(), 8000))
		}
		if strings.Contains(rc.stderrString(), "DATA RACE") {
			t.Errorf("client %d on n%d: the race detector fired:\n%s", rc.id, rc.node, head(rc.stderrString(), 8000))
		}
		if rc.killed.IsZero() && rc.err != nil {
			t.Logf("client %d on n%d, which the test did not kill, exited with %v: %s", rc.id, rc.node, rc.err, strings.TrimSpace(rc.stderrString()))
		}
	}
	c.waitClusterHealthy(t, "the cluster is healthy after the workload")

	quiet := time.Now()
	ops, fig := roundsHistory(t, clients)
	finals := c.roundsFinalReads(t, region, keys, lastVictim)
	ops = append(ops, finals...)
	roundsCheckFinal(t, ops, finals)
	if t.Failed() {
		t.FailNow()
	}
	read := time.Now()
	if err := roundsLinearizable(ops, true); err != nil {
		t.Fatal(err)
	}
	t.Logf("the final reads took %v, the linearizability check %v", read.Sub(quiet).Round(100*time.Millisecond), time.Since(read).Round(100*time.Millisecond))
	if fig.longest > roundsBound {
		t.Errorf("a call waited %v (%s); the bound is %v", fig.longest.Round(time.Millisecond), fig.longestWhat, roundsBound)
	}
	var errs []string
	for e, k := range fig.errs {
		first := fig.firstErr[e]
		errs = append(errs, fmt.Sprintf("%d× %s\n    first: %s", k, e, first[strings.IndexByte(first, ' ')+1:]))
	}
	slices.Sort(errs)
	t.Logf("%d rounds on %d nodes in %v (seed %d): %d operations by %d client processes: %d synced writes, %d writes of unknown outcome (%d failed, the others in flight when killed), %d reads (%d of a written value; %d more failed), %d final reads; longest wait %v (%s); linearizable",
		rounds, n, time.Since(start).Round(time.Second), seed, fig.writes+fig.maybes+fig.reads+fig.failedReads, len(clients),
		fig.writes, fig.maybes, fig.failedWrites, fig.reads, fig.readsSeen, fig.failedReads, len(finals), fig.longest.Round(time.Millisecond), fig.longestWhat)
	if len(errs) > 0 {
		t.Logf("errors of failed calls:\n  %s", strings.Join(errs, "\n  "))
	}
}

// roundsHistory turns the clients' output into operations, and measures
// every call's wait. A call in flight when its client died gets the
// moment the test killed it (or saw it end) as its return: a write then
// has an unknown outcome, a read is left out.
func roundsHistory(t *testing.T, clients []*regClient) ([]regOp, roundsFigures) {
	t.Helper()
	fig := roundsFigures{errs: map[string]int{}, firstErr: map[string]string{}}
	var ops []regOp
	wait := func(d time.Duration, what string) {
		if d > fig.longest {
			fig.longest, fig.longestWhat = d, what
		}
	}
	for _, rc := range clients {
		<-rc.drained
		var call *regEvent
		for _, l := range rc.lines() {
			var e regEvent
			if err := json.Unmarshal([]byte(l), &e); err != nil {
				t.Fatalf("client %d on n%d: line %q: %v", rc.id, rc.node, l, err)
			}
			if e.Client != rc.id {
				t.Fatalf("client %d on n%d: line %q of another client", rc.id, rc.node, l)
			}
			if e.Phase == "call" {
				if call != nil {
					t.Fatalf("client %d on n%d: a call before the return of the one before: %q", rc.id, rc.node, l)
				}
				call = &e
				continue
			}
			if call == nil || e.Kind != call.Kind || e.Off != call.Off || e.Value != call.Value || e.Call != call.Call || e.Return < e.Call {
				t.Fatalf("client %d on n%d: return %q does not match its call %+v", rc.id, rc.node, l, call)
			}
			call = nil
			what := fmt.Sprintf("client %d on n%d: %s of %d", rc.id, rc.node, e.Kind, e.Off)
			if e.Kind == "write" && e.Written != 0 {
				wait(time.Duration(e.Written-e.Call), what+": WriteAt")
				wait(time.Duration(e.Return-e.Written), what+": Sync")
			} else {
				wait(time.Duration(e.Return-e.Call), what)
			}
			if e.Err != "" {
				k := shortErr(e.Err)
				fig.errs[k]++
				if first, ok := fig.firstErr[k]; !ok || e.Return < firstAt(first) {
					fig.firstErr[k] = fmt.Sprintf("%d %s at %s after %v: %s", e.Return, what, time.Unix(0, e.Return).Format("15:04:05.000"),
						time.Duration(e.Return-e.Call).Round(time.Millisecond), e.Err)
				}
			}
			op := regOp{Client: rc.id, Kind: e.Kind, Off: e.Off, Value: e.Value, Out: e.Out, Call: e.Call, Return: e.Return}
			switch {
			case e.Kind == "read" && e.Err != "":
				fig.failedReads++
				continue
			case e.Kind == "read":
				fig.reads++
				if e.Out != 0 {
					fig.readsSeen++
				}
			case e.Err != "":
				op.Kind = "maybe"
				fig.maybes++
				fig.failedWrites++
			default:
				fig.writes++
			}
			ops = append(ops, op)
		}
		if call == nil {
			continue
		}
		died := rc.killed
		if died.IsZero() {
			died = rc.ended
		}
		wait(died.Sub(time.Unix(0, call.Call)), fmt.Sprintf("client %d on n%d: %s of %d, in flight when the client died", rc.id, rc.node, call.Kind, call.Off))
		if call.Kind == "write" {
			ops = append(ops, regOp{Client: rc.id, Kind: "maybe", Off: call.Off, Value: call.Value, Call: call.Call, Return: died.UnixNano()})
			fig.maybes++
		}
	}
	return ops, fig
}

// firstAt is the time in front of a firstErr entry.
func firstAt(s string) int64 {
	v, _ := strconv.ParseInt(s[:strings.IndexByte(s, ' ')], 10, 64)
	return v
}

// shortErr is an error text without the numbers that make every instance
// different (pages, epochs, durations), for counting them.
func shortErr(s string) string {
	var b strings.Builder
	digits := false
	for _, r := range s {
		if r >= '0' && r <= '9' {
			if !digits {
				b.WriteByte('N')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteRune(r)
	}
	return head(b.String(), 200)
}

// roundsFinalReads reads, on every node with ReadAt, the first
// roundsComparePages pages of every shard, checks that every node reads
// the same bytes, and returns the reads of the registers. Then it checks
// that the whole region reads on node whole as zeros with the values read
// in the registers (nothing else is ever written), by its SHA-256: one
// node only, as that is 4096 misses (seconds under the race detector).
func (c *dsmCluster) roundsFinalReads(t *testing.T, region string, keys []int64, wholeOn int) []regOp {
	t.Helper()
	const span = roundsComparePages * 4096
	var ops []regOp
	first := map[int64]string{} // shard offset -> hex read on n1
	whole := make([]byte, roundsShards*roundsShardSize)
	var procs []*clientProc
	for node := 1; node <= len(c.nodes); node++ {
		p := c.startClient(t, node, region, "-fault-timeout", roundsFaultTimeout.String(), "repl")
		procs = append(procs, p)
		for s := range int64(roundsShards) {
			base := s * roundsShardSize
			call := time.Now().UnixNano()
			got := p.call(t, fmt.Sprintf("read-at %d %d", base, span))
			ret := time.Now().UnixNano()
			b, err := hex.DecodeString(got)
			if err != nil || len(b) != span {
				t.Fatalf("n%d: read-at %d %d: %q", node, base, span, head(got, 200))
			}
			if want, ok := first[base]; !ok {
				first[base] = got
			} else if got != want {
				t.Errorf("n%d reads other bytes than n1 in pages %d to %d: %s", node, base/4096, base/4096+roundsComparePages-1, firstDiff(want, got))
			}
			for _, off := range keys {
				if off >= base && off < base+span {
					ops = append(ops, regOp{Client: -node, Kind: "read", Off: off, Out: binary.LittleEndian.Uint64(b[off-base:]), Call: call, Return: ret})
				}
			}
			if node == 1 {
				copy(whole[base:], b)
			}
		}
	}
	sum := sha256.Sum256(whole)
	if got, want := procs[wholeOn-1].call(t, fmt.Sprintf("read-sum 0 %d", len(whole))), hex.EncodeToString(sum[:]); got != want {
		t.Errorf("n%d's region, read whole, is not zeros with the registers' values: SHA-256 %s, want %s", wholeOn, got, want)
	}
	for _, p := range procs {
		p.stdin.Close()
	}
	return ops
}

// firstDiff says where two hex strings of the same length first differ.
func firstDiff(a, b string) string {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			at := i / 2 &^ 7
			return fmt.Sprintf("byte %d: word %s against %s", i/2, a[2*at:min(2*at+16, len(a))], b[2*at:min(2*at+16, len(b))])
		}
	}
	return fmt.Sprintf("lengths %d and %d", len(a)/2, len(b)/2)
}

// roundsCheckFinal checks that every final read of a register returns
// the value of its last synced write, or of a write of unknown outcome
// that no synced write follows (roundsFinalErrors).
func roundsCheckFinal(t *testing.T, ops, finals []regOp) {
	t.Helper()
	for _, e := range roundsFinalErrors(ops, finals) {
		t.Error(e)
	}
}

// roundsFinalErrors says which final reads (Client -node) return a value
// that no write explains: a write w is allowed unless a synced write began
// after w returned; zero only where no write was synced.
func roundsFinalErrors(ops, finals []regOp) []string {
	writes := map[int64][]regOp{}
	for _, op := range ops {
		if op.Kind == "write" || op.Kind == "maybe" {
			writes[op.Off] = append(writes[op.Off], op)
		}
	}
	var errs []string
	for _, f := range finals {
		var lastSynced *regOp
		for i, w := range writes[f.Off] {
			if w.Kind == "write" && (lastSynced == nil || w.Call > lastSynced.Call) {
				lastSynced = &writes[f.Off][i]
			}
		}
		allowed := lastSynced == nil && f.Out == 0
		for _, w := range writes[f.Off] {
			if w.Value == f.Out && (lastSynced == nil || lastSynced.Call <= w.Return) {
				allowed = true
			}
		}
		if allowed {
			continue
		}
		var what string
		for _, w := range writes[f.Off] {
			if w.Value == f.Out {
				what = fmt.Sprintf("; that value was written by client %d (%s), which returned before the synced write began", w.Client, w.Kind)
			}
		}
		if lastSynced == nil {
			errs = append(errs, fmt.Sprintf("n%d reads %#x at %d, which nobody wrote and no write was synced%s", -f.Client, f.Out, f.Off, what))
			continue
		}
		errs = append(errs, fmt.Sprintf("synced write lost: n%d reads %#x at %d; the last synced write there is %#x by client %d (Sync returned at %s)%s",
			-f.Client, f.Out, f.Off, lastSynced.Value, lastSynced.Client, time.Unix(0, lastSynced.Return).Format("15:04:05.000"), what))
	}
	return errs
}

// TestRoundsCheckers checks the checkers of TestKillRestartRounds on
// histories written by hand: the register model (a write of unknown
// outcome takes effect within its call and return, or never) and the
// check of the final reads.
func TestRoundsCheckers(t *testing.T) {
	w := func(kind string, v uint64, call, ret int64) regOp {
		return regOp{Client: 1, Kind: kind, Value: v, Call: call, Return: ret}
	}
	r := func(out uint64, call, ret int64) regOp {
		return regOp{Client: 2, Kind: "read", Out: out, Call: call, Return: ret}
	}
	for _, tc := range []struct {
		name string
		h    []regOp
		ok   bool
	}{
		{"stale read after a synced write", []regOp{w("write", 5, 1, 2), r(0, 3, 4)}, false},
		{"read of the synced write", []regOp{w("write", 5, 1, 2), r(5, 3, 4)}, true},
		{"a write of unknown outcome that did not happen", []regOp{w("maybe", 5, 1, 2), r(0, 3, 4)}, true},
		{"a write of unknown outcome that happened", []regOp{w("maybe", 5, 1, 2), r(5, 3, 4)}, true},
		{"a write of unknown outcome seen, then lost", []regOp{w("maybe", 5, 1, 2), r(5, 3, 4), r(0, 5, 6)}, false},
		{"a write of unknown outcome taking effect after its return", []regOp{w("write", 1, 1, 2), w("maybe", 5, 3, 4), w("write", 6, 5, 6), r(5, 7, 8)}, false},
		{"a value nobody wrote", []regOp{w("write", 5, 1, 2), r(7, 3, 4)}, false},
		{"registers are independent", []regOp{{Client: 1, Kind: "write", Off: 8, Value: 5, Call: 1, Return: 2}, r(0, 3, 4)}, true},
	} {
		err := roundsLinearizable(tc.h, false)
		if (err == nil) != tc.ok {
			t.Errorf("%s: the checker says %v, want ok=%v", tc.name, err, tc.ok)
		}
	}

	final := func(out uint64) []regOp { return []regOp{{Client: -1, Kind: "read", Out: out, Call: 100, Return: 101}} }
	for _, tc := range []struct {
		name string
		h    []regOp
		out  uint64
		ok   bool
	}{
		{"the last synced value", []regOp{w("write", 1, 1, 2), w("write", 2, 3, 4)}, 2, true},
		{"a synced value overwritten by a synced write", []regOp{w("write", 1, 1, 2), w("write", 2, 3, 4)}, 1, false},
		{"a concurrent synced write", []regOp{w("write", 1, 1, 4), w("write", 2, 3, 5)}, 1, true},
		{"zero after a synced write", []regOp{w("write", 1, 1, 2)}, 0, false},
		{"zero after writes of unknown outcome only", []regOp{w("maybe", 1, 1, 2)}, 0, true},
		{"a write of unknown outcome after the last synced one", []regOp{w("write", 1, 1, 2), w("maybe", 2, 3, 4)}, 2, true},
		{"a write of unknown outcome before the last synced one", []regOp{w("maybe", 2, 1, 2), w("write", 1, 3, 4)}, 2, false},
	} {
		errs := roundsFinalErrors(tc.h, final(tc.out))
		if (len(errs) == 0) != tc.ok {
			t.Errorf("%s: the final check says %q, want ok=%v", tc.name, errs, tc.ok)
		}
	}
}

// roundsLinearizable runs porcupine on ops; with viz, a history that is
// not linearizable is written as an HTML visualization into a new
// directory under $TMPDIR, kept after the test.
func roundsLinearizable(ops []regOp, viz bool) error {
	pops := make([]porcupine.Operation, len(ops))
	for i, op := range ops {
		pops[i] = porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call, Return: op.Return}
	}
	model := regModel.ToModel()
	res, info := porcupine.CheckOperationsVerbose(model, pops, 2*time.Minute)
	switch res {
	case porcupine.Ok:
		return nil
	case porcupine.Unknown:
		return fmt.Errorf("porcupine timed out on %d operations", len(ops))
	}
	if !viz {
		return fmt.Errorf("history of %d operations is not linearizable", len(ops))
	}
	if dir, err := os.MkdirTemp("", "dsm-rounds-"); err == nil {
		path := filepath.Join(dir, "history.html")
		if err := porcupine.VisualizePath(model, info, path); err == nil {
			return fmt.Errorf("history of %d operations is not linearizable (visualization: %s)", len(ops), path)
		}
	}
	return fmt.Errorf("history of %d operations is not linearizable", len(ops))
}

// waitIncarnation waits until every node lists node at incarnation want
// or later (a later one: dsmd restarted itself after a false failure
// verdict).
func (c *dsmCluster) waitIncarnation(t *testing.T, node int, want uint64, when string) {
	t.Helper()
	eventually(t, fmt.Sprintf("%s: every node knows n%d's incarnation %d", when, node, want), 90*time.Second, func() error {
		for i := 1; i <= len(c.nodes); i++ {
			incs, err := c.incarnations(i)
			if err != nil {
				return err
			}
			if inc := incs[uint32(node)]; inc < want {
				return fmt.Errorf("n%d lists n%d at incarnation %d", i, node, inc)
			}
		}
		return nil
	})
}

// waitClusterHealthy waits until dsmctl status says healthy on every node:
// every member alive, a leader, every shard with a live home and all its
// backups complete.
func (c *dsmCluster) waitClusterHealthy(t *testing.T, what string) {
	t.Helper()
	eventually(t, what, 90*time.Second, func() error {
		for i := 1; i <= len(c.nodes); i++ {
			var st statusJSON
			out, errs, _ := c.ctl(i, "status", "--json")
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				return fmt.Errorf("n%d: %v: %s", i, err, strings.TrimSpace(errs))
			}
			if st.Health != "healthy" {
				return fmt.Errorf("n%d is %s: %v", i, st.Health, st.Reasons)
			}
		}
		return nil
	})
}
