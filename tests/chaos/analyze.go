package chaos

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// runInfo is run.json: what analyzeDir needs besides the schedule, the
// events and the histories.
type runInfo struct {
	Config Config `json:"config"`
	Seed   uint64 `json:"seed"`
	Mode   string `json:"mode"`
	T0     int64  `json:"t0"`    // the workload started (Unix ns)
	TEnd   int64  `json:"t_end"` // the final check ended
	Nodes  int    `json:"nodes"` // base nodes and the joining one
	// Killed names the client processes the nemesis killed.
	Killed []string `json:"killed,omitempty"`
	Notes  []string `json:"notes,omitempty"`
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func readEvents(path string) ([]event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// failureVerdicts reads the directory's failure verdicts from the dsmd
// logs: every node logs `directory: epoch ... failed=[nK]` as it takes an
// epoch in which nK was declared failed (before its engines move to it),
// and the leader logs `directory: member failed ... member=nK`. A verdict
// is the departure of that incarnation, as a kill -9 is: what it held
// Modified and had not written back is lost (a process cut off or paused
// lives on and starts a new incarnation), so each is a loss of its node at
// the earliest time any log shows it.
func failureVerdicts(dirs map[int]string) ([]event, error) {
	type verdict struct {
		node  int
		epoch string
	}
	first := map[verdict]time.Time{}
	note := func(node int, epoch string, t time.Time) {
		k := verdict{node, epoch}
		if was, ok := first[k]; !ok || t.Before(was) {
			first[k] = t
		}
	}
	for _, d := range dirs {
		f, err := os.Open(filepath.Join(d, "dsmd.log"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			leader := strings.Contains(line, `msg="directory: member failed"`)
			epochLine := strings.Contains(line, `msg="directory: epoch"`) && strings.Contains(line, " failed=")
			if !leader && !epochLine {
				continue
			}
			t, err := time.Parse(time.RFC3339Nano, field(line, "time"))
			if err != nil {
				continue
			}
			epoch := field(line, "epoch")
			if leader {
				if node, err := strconv.Atoi(strings.TrimPrefix(field(line, "member"), "n")); err == nil {
					note(node, epoch, t)
				}
				continue
			}
			for _, n := range strings.Fields(strings.Trim(field(line, "failed"), "[]")) {
				if node, err := strconv.Atoi(strings.TrimPrefix(n, "n")); err == nil {
					note(node, epoch, t)
				}
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	var out []event
	for k, t := range first {
		out = append(out, event{T: t.UnixNano(), What: evLoss, Node: k.node, Detail: "declared failed in " + k.epoch})
	}
	return out, nil
}

// field returns the value of key in a logfmt line (unquoted), or "".
func field(line, key string) string {
	i := strings.Index(line, " "+key+"=")
	if i < 0 && strings.HasPrefix(line, key+"=") {
		i = -1
	} else if i < 0 {
		return ""
	}
	v := line[i+len(key)+2:]
	if strings.HasPrefix(v, `"`) {
		if j := strings.Index(v[1:], `"`); j >= 0 {
			return v[1 : 1+j]
		}
		return v[1:]
	}
	if j := strings.IndexByte(v, ' '); j >= 0 {
		return v[:j]
	}
	return v
}

// analyzeDir reads a run directory (run.json, schedule.json, events.jsonl,
// clients/*.jsonl), runs the checkers and writes history.jsonl,
// verdict.json, verdict.txt, timeline.svg and, for a register history
// that is not linearizable, porcupine's visualization. `chaos -check DIR`
// runs it again on a finished run.
func analyzeDir(dir string) (*Verdict, error) {
	var info runInfo
	if err := readJSON(filepath.Join(dir, "run.json"), &info); err != nil {
		return nil, err
	}
	var schedule []Fault
	if err := readJSON(filepath.Join(dir, "schedule.json"), &schedule); err != nil {
		return nil, err
	}
	events, err := readEvents(filepath.Join(dir, "events.jsonl"))
	if err != nil {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(dir, "clients", "*.jsonl"))
	if err != nil {
		return nil, err
	}
	killed := map[string]bool{}
	for _, p := range info.Killed {
		killed[p] = true
	}
	var ops []*Op
	for _, f := range files {
		proc := strings.TrimSuffix(filepath.Base(f), ".jsonl")
		var node int
		fmt.Sscanf(proc, "n%d", &node)
		o, err := readHistory(f, proc, node, strings.HasSuffix(proc, "final"))
		if err != nil {
			return nil, err
		}
		for _, op := range o {
			op.Killed = op.Pending() && killed[proc]
		}
		ops = append(ops, o...)
	}
	sortOps(ops)
	if err := writeHistory(filepath.Join(dir, "history.jsonl"), ops); err != nil {
		return nil, err
	}
	dirs := map[int]string{}
	for i := 1; i <= info.Nodes; i++ {
		dirs[i] = filepath.Join(dir, "nodes", fmt.Sprintf("n%d", i))
	}
	verdicts, err := failureVerdicts(dirs)
	if err != nil {
		return nil, err
	}
	events = append(events, verdicts...)
	c := newChecker(ops, schedule, events, info.TEnd, info.Config.OpDeadline, dir)
	v := c.check()
	c.crashes(events, dirs)
	c.placements(dir)
	c.recovery(events)
	v.Seed, v.Mode = info.Seed, info.Mode
	for _, f := range schedule {
		if f.Start != 0 {
			v.Faults++
		}
	}
	v.Notes = append(v.Notes, info.Notes...)
	for _, e := range events {
		if e.What == evClientEnd || e.What == "dsmd-stuck" || e.What == "error" {
			v.Notes = append(v.Notes, fmt.Sprintf("n%d: %s", e.Node, e.Detail))
		}
	}
	sort.SliceStable(v.Violations, func(i, j int) bool { return v.Violations[i].T < v.Violations[j].T })
	if err := writeJSON(filepath.Join(dir, "verdict.json"), v); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "verdict.txt"), []byte(report(&info, schedule, v)), 0o644); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(dir, "timeline.svg"))
	if err != nil {
		return nil, err
	}
	title := fmt.Sprintf("seed %d · %s · %d nodes · faults %s · %d operations · %d violations", info.Seed, info.Mode,
		info.Config.Nodes, strings.Join(info.Config.Faults, ","), v.Ops, len(v.Violations))
	err = picture(f, title, ops, schedule, events, v.Violations, info.Nodes, info.T0, info.TEnd, info.Config.OpDeadline)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return v, err
}

// report is verdict.txt: the verdict for people.
func report(info *runInfo, schedule []Fault, v *Verdict) string {
	var b strings.Builder
	cfg := info.Config
	rel := func(t int64) float64 { return float64(t-info.T0) / 1e9 }
	fmt.Fprintf(&b, "chaos run: seed %d, mode %s, transport %s, %d nodes, %s, faults %s for %s-%s\n", info.Seed, v.Mode, cfg.transport(), cfg.Nodes, cfg.Duration,
		strings.Join(cfg.Faults, ","), cfg.Span[0], cfg.Span[1])
	fmt.Fprintf(&b, "%d faults, %d operations, %d violations; longest wait %s\n\n", v.Faults, v.Ops, len(v.Violations),
		time.Duration(v.LongestWaitMS*1e6).Round(time.Millisecond))
	b.WriteString("schedule (as executed, seconds from the workload's start):\n")
	for _, f := range schedule {
		if f.Start == 0 {
			fmt.Fprintf(&b, "  not run   %s\n", f.String())
			continue
		}
		fmt.Fprintf(&b, "  %6.1f-%-6.1f %s", rel(f.Start), rel(f.End), f.String())
		if f.Note != "" {
			fmt.Fprintf(&b, " (%s)", f.Note)
		}
		if f.Err != "" {
			fmt.Fprintf(&b, " ERROR: %s", f.Err)
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "\nlinearizability of the registers: %s\n", v.Linearizable)
	fmt.Fprintf(&b, "\nviolations (%d):\n", len(v.Violations))
	if len(v.Violations) == 0 {
		b.WriteString("  none\n")
	}
	byChecker := map[string]int{}
	for _, x := range v.Violations {
		byChecker[x.Checker]++
	}
	shown := map[string]int{}
	for _, x := range v.Violations {
		shown[x.Checker]++
		if shown[x.Checker] > 10 {
			continue
		}
		at := ""
		if x.T != 0 {
			at = fmt.Sprintf("%.1fs ", rel(x.T))
		}
		fmt.Fprintf(&b, "  [%s] %s%s", x.Checker, at, x.What)
		if x.Context != "" {
			fmt.Fprintf(&b, "\n      (%s)", x.Context)
		}
		b.WriteByte('\n')
	}
	var more []string
	for k, n := range byChecker {
		if n > 10 {
			more = append(more, fmt.Sprintf("  [%s] ... %d more in verdict.json\n", k, n-10))
		}
	}
	sort.Strings(more)
	b.WriteString(strings.Join(more, ""))
	fmt.Fprintf(&b, "\navailability (operations attributed to the fault in progress or healed in the last %s):\n", recoveryWindow)
	fmt.Fprintf(&b, "  %-12s %6s %7s %7s %5s %7s %9s %10s\n", "KIND", "FAULTS", "OPS", "ERRORS", "HUNG", "KILLED", ">DEADLINE", "MAX WAIT")
	for _, k := range v.Availability {
		fmt.Fprintf(&b, "  %-12s %6d %7d %7d %5d %7d %9d %10s   %.1f%% failed or hung\n", k.Kind, k.Faults, k.Ops, k.Errors, k.Hung, k.Killed, k.OverDeadline,
			time.Duration(k.MaxLatencyMS*1e6).Round(time.Millisecond), 100*k.ErrorFraction)
		for _, e := range k.SampleErrors {
			fmt.Fprintf(&b, "      e.g. %s\n", e)
		}
	}
	if o := v.LongestWaitOp; o != nil {
		state := "returned"
		if o.Pending() {
			state = "never returned"
		}
		fmt.Fprintf(&b, "\nlongest wait: %s %s at %#x, called at %.1fs, %s\n", o.Proc, o.Kind, o.Addr, rel(o.Call), state)
	}
	if len(v.Notes) > 0 {
		b.WriteString("\nnotes:\n")
		for _, n := range v.Notes {
			fmt.Fprintf(&b, "  %s\n", n)
		}
	}
	return b.String()
}
