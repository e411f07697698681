package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Main is the chaos command: it parses args (without the program name),
// runs the schedules and prints one summary line. It returns the exit
// status: 0 when no schedule found a violation, 1 when one did, 2 on a
// usage error, 3 when the harness itself failed.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "client" {
		return ClientMain(args[1:])
	}
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg Config
	faults := fs.String("faults", "all", "fault kinds the nemesis draws from, comma-separated, or all: "+strings.Join(allFaults, ","))
	short := fs.Bool("short", false, fmt.Sprintf("the short run: unless given otherwise, -seeds 1 -seed %d -duration %s -faults %s -fault-for %s-%s",
		ShortSeed, ShortDuration, strings.Join(ShortFaults, ","), ShortSpan[0], ShortSpan[1]))
	span := fs.String("fault-for", "3s-8s", "how long each fault lasts: MIN-MAX, drawn per fault (a client kill lasts 2 s at most)")
	fs.IntVar(&cfg.Seeds, "seeds", 1, "how many schedules to run")
	fs.Uint64Var(&cfg.FirstSeed, "seed", 0, "seed of the first schedule (0: from the clock); the others follow")
	fs.DurationVar(&cfg.Duration, "duration", 60*time.Second, "length of each schedule's workload, faults included")
	fs.IntVar(&cfg.Nodes, "nodes", 3, "dsmd nodes (1 to 5; join adds one)")
	fs.StringVar(&cfg.Mode, "mode", "auto", "netns (a network namespace per node), loopback (ports and nftables on 127.0.0.1), or auto: netns where it works")
	fs.StringVar(&cfg.Out, "out", filepath.Join(os.TempDir(), "dsm-chaos"), "directory that receives one run directory per schedule")
	fs.DurationVar(&cfg.Settle, "settle", 5*time.Second, "workload after the last fault healed, before the final check")
	fs.DurationVar(&cfg.OpDeadline, "op-deadline", 10*time.Second, "an operation slower than this counts as unavailable")
	fs.Float64Var(&cfg.Rate, "rate", 1, "scale of the clients' operation rates")
	fs.BoolVar(&cfg.Durable, "durable", true, "create the region durable (Sync's promise)")
	fs.BoolVar(&cfg.Race, "race", false, "build dsmd with the race detector (a race in a log is a violation)")
	fs.Int64Var(&cfg.DiskSize, "disk-size", 128<<20, "bytes of each node's tmpfs data directory (with the disk fault)")
	fs.IntVar(&cfg.PortBase, "port-base", 29000, "first port of the nodes in loopback mode (node i from base+10i)")
	fs.BoolVar(&cfg.KeepData, "keep-data", false, "keep the nodes' data directories in the run directory")
	dsmdBin := fs.String("dsmd", "", "a dsmd binary to use instead of building ./cmd/dsmd (with -ofi, one built with -tags ofi)")
	fs.StringVar(&cfg.OFIProvider, "ofi", "", "run every dsmd on --transport ofi with this libfabric provider (tcp;ofi_rxm, shm, sockets); the dsmd built has the ofi tag (needs libfabric-dev). Default: the tcp transport")
	fs.Func("dsmd-arg", "a flag for every dsmd, e.g. -dsmd-arg=--checkpoint-after=1 (repeat for more)", func(v string) error {
		cfg.DsmdArgs = append(cfg.DsmdArgs, v)
		return nil
	})
	checkDir := fs.String("check", "", "run the checkers again on the run directory DIR (no cluster, no root) and exit")
	sum := fs.Bool("report", false, "sum the verdicts of the run directories given as arguments (each a run directory or a directory of them, like -out) and exit: faults, operations, violations, availability per fault kind (no cluster, no root)")
	markdown := fs.Bool("markdown", false, "with -report, the availability as a Markdown table")
	fs.Usage = func() {
		fmt.Fprintf(stderr, `chaos runs real dsmd clusters under a seeded nemesis and checks what clients saw.

Usage: chaos [flags]     (as root: namespaces, nftables, mounts, cgroups)
       chaos -report [-markdown] DIR...   (sums the verdicts of earlier runs)

Every schedule gets a run directory with the schedule, the events, every
node's log, every client's history, the merged history, the checkers'
verdicts (verdict.txt, verdict.json), porcupine's visualization when the
registers are not linearizable, and timeline.svg. The last line is

  chaos: S schedules, F faults, O operations, V violations ...

and the exit status is 0 only when V is 0.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *short {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for name, v := range map[string]string{"seeds": "1", "seed": fmt.Sprint(ShortSeed), "duration": ShortDuration.String(),
			"faults": strings.Join(ShortFaults, ","), "fault-for": ShortSpan[0].String() + "-" + ShortSpan[1].String()} {
			if !set[name] {
				_ = fs.Set(name, v)
			}
		}
	}
	if *sum {
		if fs.NArg() == 0 {
			fmt.Fprintln(stderr, "chaos: -report needs run directories (or directories of them) as arguments")
			return 2
		}
		s, err := Summarize(fs.Args())
		if err == nil {
			err = s.Write(stdout, *markdown)
		}
		if err != nil {
			fmt.Fprintln(stderr, "chaos:", err)
			return 3
		}
		if s.Violations > 0 {
			return 1
		}
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "chaos: unexpected arguments %q (only -report takes directories)\n", fs.Args())
		return 2
	}
	if *checkDir != "" {
		v, err := analyzeDir(*checkDir)
		if err != nil {
			fmt.Fprintln(stderr, "chaos:", err)
			return 3
		}
		fmt.Fprintf(stdout, "chaos: 1 schedules, %d faults, %d operations, %d violations; verdict in %s\n", v.Faults, v.Ops,
			len(v.Violations), filepath.Join(*checkDir, "verdict.txt"))
		if len(v.Violations) > 0 {
			return 1
		}
		return 0
	}
	var err error
	if cfg.Faults, err = ParseFaults(*faults); err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return 2
	}
	if cfg.Span, err = ParseSpan(*span); err != nil {
		fmt.Fprintln(stderr, "chaos: -fault-for:", err)
		return 2
	}
	if cfg.Nodes < 1 || cfg.Nodes > maxNodes-1 || cfg.Seeds < 1 || cfg.Duration < 10*time.Second || cfg.Rate <= 0 {
		fmt.Fprintln(stderr, "chaos: -nodes 1..5, -seeds >= 1, -duration >= 10s and a positive -rate")
		return 2
	}
	if cfg.FirstSeed == 0 {
		cfg.FirstSeed = uint64(time.Now().UnixNano()%1000000) + 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *short && !isRoot() {
		// make test runs the short run; without root there is nothing to
		// run it with, which is not a failure of the code under test.
		fmt.Fprintln(stdout, "SKIPPED: chaos short run: needs root (network namespaces, nftables, mounts)")
		return 0
	}
	return run(ctx, cfg, *dsmdBin, stdout, stderr)
}

// totals sum up schedules for the summary line.
type totals struct {
	schedules, faults, ops, violations, errors, hung int
}

func run(ctx context.Context, cfg Config, dsmdBin string, stdout, stderr io.Writer) int {
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "chaos: "+format+"\n", a...) }
	if !isRoot() {
		logf("needs root (network namespaces, nftables, tmpfs mounts, cgroups)")
		return 3
	}
	unlock, err := lockHarness()
	if err != nil {
		logf("%v", err)
		return 3
	}
	defer unlock()
	if killed := cleanStale(); len(killed) > 0 {
		logf("ended %d processes a killed run left: %s", len(killed), strings.Join(killed, " "))
	}
	mode, why := cfg.Mode, ""
	if mode == "auto" {
		mode = "netns"
		if err := netnsWorks(); err != nil {
			mode, why = "loopback", fmt.Sprintf(" (network namespaces do not work here: %v)", err)
		}
	}
	if mode != "netns" && mode != "loopback" {
		logf("-mode %q: netns, loopback or auto", cfg.Mode)
		return 2
	}
	stamp := time.Now().UTC().Format("20060102-150405")
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		logf("%v", err)
		return 3
	}
	if dsmdBin == "" {
		root, err := moduleRoot()
		if err != nil {
			logf("%v", err)
			return 3
		}
		binDir := filepath.Join(cfg.Out, "bin")
		if err := os.MkdirAll(binDir, 0o755); err != nil {
			logf("%v", err)
			return 3
		}
		logf("building dsmd")
		if dsmdBin, err = buildDsmd(root, binDir, cfg.Race, cfg.OFIProvider != ""); err != nil {
			logf("%v", err)
			return 3
		}
	}
	self, err := os.Executable()
	if err != nil {
		logf("%v", err)
		return 3
	}
	extra := ""
	if len(cfg.DsmdArgs) > 0 {
		extra = "; dsmd " + strings.Join(cfg.DsmdArgs, " ")
	}
	logf("mode %s%s; transport %s; faults %s for %s-%s each; %d schedules of %s on %d nodes, seeds %d..%d%s", mode, why, cfg.transport(), strings.Join(cfg.Faults, ","),
		cfg.Span[0], cfg.Span[1], cfg.Seeds, cfg.Duration, cfg.Nodes, cfg.FirstSeed, cfg.FirstSeed+uint64(cfg.Seeds)-1, extra)
	var tot totals
	status := 0
	for s := 0; s < cfg.Seeds && ctx.Err() == nil; s++ {
		seed := cfg.FirstSeed + uint64(s)
		h := &harness{cfg: cfg, seed: seed, dsmdBin: dsmdBin, clientBin: self,
			dir:  filepath.Join(cfg.Out, fmt.Sprintf("%s-seed%d", stamp, seed)),
			pids: newPidFile(filepath.Join(stateDir, "pids"))}
		if mode == "netns" {
			h.net = &netnsNet{}
		} else {
			h.net = &loopbackNet{base: cfg.PortBase}
		}
		v, err := h.runSchedule(ctx, logf)
		if err != nil {
			logf("seed %d: %v (run directory %s)", seed, err, h.dir)
			status = 3
			continue
		}
		tot.schedules++
		tot.faults += v.Faults
		tot.ops += v.Ops
		tot.violations += len(v.Violations)
		for _, k := range v.Availability {
			tot.errors += k.Errors
			tot.hung += k.Hung
		}
		logf("seed %d: %d faults, %d operations, %d violations, longest wait %s; %s", seed, v.Faults, v.Ops,
			len(v.Violations), time.Duration(v.LongestWaitMS*1e6).Round(time.Millisecond), h.dir)
	}
	fmt.Fprintf(stdout, "chaos: %d schedules, %d faults, %d operations, %d violations; %d errors, %d hung, mode %s, transport %s, faults %s, runs in %s\n",
		tot.schedules, tot.faults, tot.ops, tot.violations, tot.errors, tot.hung, mode, cfg.transport(), strings.Join(cfg.Faults, ","), cfg.Out)
	switch {
	case ctx.Err() != nil:
		return 3
	case status != 0:
		return status
	case tot.violations > 0:
		return 1
	}
	return 0
}

// lockHarness makes sure one harness runs at a time on this machine (the
// namespaces, tables and mounts have fixed names).
func lockHarness() (func(), error) {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(stateDir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another chaos harness runs on this machine (%s is locked)", f.Name())
	}
	return func() { f.Close() }, nil
}

// cleanStale removes what a run that was killed left behind: its
// processes, namespaces, nftables table, tmpfs mounts and cgroups.
func cleanStale() []string {
	killed := killStale(filepath.Join(stateDir, "pids"))
	cleanNetns()
	cleanLoopback()
	cleanMounts()
	cleanCgroups()
	_ = os.Remove(filepath.Join(stateDir, "pids"))
	return killed
}

// moduleRoot is the directory of the go.mod of the working directory.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run chaos inside the dsm module (or give -dsmd)")
	}
	return filepath.Dir(mod), nil
}

// runSchedule runs one schedule and checks it.
func (h *harness) runSchedule(ctx context.Context, logf func(string, ...any)) (*Verdict, error) {
	h.schedule = Schedule(h.seed, h.cfg.Duration, h.cfg.Faults, h.cfg.Nodes, h.cfg.Span)
	if err := os.MkdirAll(h.dir, 0o755); err != nil {
		return nil, err
	}
	if err := writeJSON(filepath.Join(h.dir, "schedule.json"), h.schedule); err != nil {
		return nil, err
	}
	defer h.teardown()
	if err := h.setup(); err != nil {
		return nil, err
	}
	if fw := h.net.Firewall(); fw != nil {
		for _, k := range networkFaults {
			if containsKind(h.cfg.Faults, k) {
				return nil, fmt.Errorf("fault %s needs nftables, which does not work here: %v", k, fw)
			}
		}
	}
	logf("seed %d: starting %d nodes (%s); schedule: %s", h.seed, h.cfg.Nodes, h.net.Mode(), scheduleString(h.schedule))
	for i := 1; i <= h.cfg.Nodes; i++ {
		h.node(i).up = true
		if err := h.startDsmd(i); err != nil {
			return nil, err
		}
	}
	fctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	err := h.waitFormed(fctx)
	if err == nil {
		err = h.createRegion(fctx)
	}
	cancel()
	if err != nil {
		return nil, err
	}
	h.t0 = time.Now()
	h.event("workload-start", 0, "")
	for i := 1; i <= h.cfg.Nodes; i++ {
		h.node(i).clientUp = true
		if _, err := h.startClient(i, false); err != nil {
			return nil, err
		}
	}
	nctx, ncancel := context.WithDeadline(ctx, h.t0.Add(h.cfg.Duration))
	done := make(chan struct{})
	go func() { h.nemesis(nctx); close(done) }()
	<-nctx.Done()
	ncancel()
	<-done
	if ctx.Err() != nil {
		return nil, errors.New("interrupted")
	}
	h.ensureUp()
	h.event("settle", 0, "")
	settled := time.Now().Add(h.cfg.Settle)
	h.waitRecovered(ctx)
	sleepCtx(ctx, settled)
	h.stopClients()
	h.event("final-check", 0, "")
	h.finalReads()
	h.tEnd = time.Now()
	h.event("end", 0, "")
	h.stopAll()
	h.mu.Lock()
	info := runInfo{Config: h.cfg, Seed: h.seed, Mode: h.net.Mode(), T0: h.t0.UnixNano(), TEnd: h.tEnd.UnixNano(),
		Nodes: len(h.nodes)}
	for p := range h.killed {
		info.Killed = append(info.Killed, p)
	}
	h.mu.Unlock()
	sort.Strings(info.Killed)
	if h.cpuErr != nil {
		info.Notes = append(info.Notes, "slow: no cgroup, SIGSTOP bursts instead: "+h.cpuErr.Error())
	}
	if err := writeJSON(filepath.Join(h.dir, "schedule.json"), h.schedule); err != nil {
		return nil, err
	}
	if err := writeJSON(filepath.Join(h.dir, "run.json"), info); err != nil {
		return nil, err
	}
	return analyzeDir(h.dir)
}

func scheduleString(s []Fault) string {
	var parts []string
	for _, f := range s {
		parts = append(parts, fmt.Sprintf("%s@%s/%s", f.String(), f.At.Round(100*time.Millisecond), f.For.Round(100*time.Millisecond)))
	}
	if len(parts) == 0 {
		return "no faults (too short)"
	}
	return strings.Join(parts, "; ")
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
