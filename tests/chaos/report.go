package chaos

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// A Summary is the sum of the verdicts of many run directories: what
// docs/reliability.md reports for a batch of schedules (schedules, faults
// by kind, operations checked, violations, and the availability per fault
// kind with its longest wait).
type Summary struct {
	Schedules  int
	Faults     int
	Ops        int
	Violations int
	// Failed are the seeds of the schedules with a violation, and Seeds
	// every seed summed, in the order read.
	Failed, Seeds []uint64
	// Durations are the workload lengths of the schedules, and
	// Transports their dsmds' verbs transports, each once.
	Durations  []time.Duration
	Transports []string
	// Kinds is the availability per fault kind, "none" first, then by
	// name; MaxLatencyMS is the longest over the schedules, and MaxSeed
	// the schedule it was in.
	Kinds   []KindStats
	MaxSeed map[string]uint64
	// LongestWaitMS is the longest wait of any operation, in schedule
	// LongestSeed.
	LongestWaitMS float64
	LongestSeed   uint64
	// Skipped are the directories that hold no verdict: a run cut short
	// before its checkers ran (chaos -check DIR runs them).
	Skipped []string
}

// runDirs returns the run directories under each of dirs: a directory
// with a verdict.json, or the directories right below it that have one,
// or, for those that lack one but hold run.json, the run left unchecked.
func runDirs(dirs []string) (runs, unchecked []string, err error) {
	isRun := func(d string) (run, started bool) {
		_, e1 := os.Stat(filepath.Join(d, "verdict.json"))
		_, e2 := os.Stat(filepath.Join(d, "schedule.json"))
		return e1 == nil, e2 == nil
	}
	for _, d := range dirs {
		if run, _ := isRun(d); run {
			runs = append(runs, d)
			continue
		}
		ents, err := os.ReadDir(d)
		if err != nil {
			return nil, nil, err
		}
		found := false
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			sub := filepath.Join(d, e.Name())
			switch run, started := isRun(sub); {
			case run:
				runs = append(runs, sub)
				found = true
			case started:
				unchecked = append(unchecked, sub)
				found = true
			}
		}
		if !found {
			return nil, nil, fmt.Errorf("%s: no run directory (one with verdict.json) in it or right below it", d)
		}
	}
	return runs, unchecked, nil
}

// Summarize reads the verdicts (verdict.json) of the run directories under
// dirs (each a run directory or a directory of them, as -out makes) and
// sums them. A directory with none fails it; a run cut short before its
// checkers is counted in Skipped, not as a schedule.
func Summarize(dirs []string) (*Summary, error) {
	runs, unchecked, err := runDirs(dirs)
	if err != nil {
		return nil, err
	}
	s := &Summary{Skipped: unchecked, MaxSeed: map[string]uint64{}}
	kinds := map[string]*KindStats{}
	for _, d := range runs {
		var v Verdict
		if err := readJSON(filepath.Join(d, "verdict.json"), &v); err != nil {
			return nil, fmt.Errorf("%s: %w", d, err)
		}
		var info runInfo
		if err := readJSON(filepath.Join(d, "run.json"), &info); err == nil {
			if !slices.Contains(s.Durations, info.Config.Duration) {
				s.Durations = append(s.Durations, info.Config.Duration)
			}
			if tr := info.Config.transport(); !slices.Contains(s.Transports, tr) {
				s.Transports = append(s.Transports, tr)
			}
		}
		s.Schedules++
		s.Faults += v.Faults
		s.Ops += v.Ops
		s.Violations += len(v.Violations)
		s.Seeds = append(s.Seeds, v.Seed)
		if len(v.Violations) > 0 {
			s.Failed = append(s.Failed, v.Seed)
		}
		if v.LongestWaitMS > s.LongestWaitMS {
			s.LongestWaitMS, s.LongestSeed = v.LongestWaitMS, v.Seed
		}
		for _, k := range v.Availability {
			t := kinds[k.Kind]
			if t == nil {
				t = &KindStats{Kind: k.Kind}
				kinds[k.Kind] = t
			}
			t.Faults += k.Faults
			t.Ops += k.Ops
			t.Errors += k.Errors
			t.Hung += k.Hung
			t.Killed += k.Killed
			t.OverDeadline += k.OverDeadline
			if k.MaxLatencyMS > t.MaxLatencyMS {
				t.MaxLatencyMS = k.MaxLatencyMS
				s.MaxSeed[k.Kind] = v.Seed
			}
		}
	}
	if s.Schedules == 0 {
		return nil, errors.New("no schedule with a verdict in " + strings.Join(dirs, ", "))
	}
	for _, t := range kinds {
		if t.Ops > 0 {
			t.ErrorFraction = float64(t.Errors+t.Hung) / float64(t.Ops)
		}
		s.Kinds = append(s.Kinds, *t)
	}
	slices.SortFunc(s.Kinds, func(a, b KindStats) int {
		switch {
		case a.Kind == b.Kind:
			return 0
		case a.Kind == "none":
			return -1
		case b.Kind == "none":
			return 1
		}
		return strings.Compare(a.Kind, b.Kind)
	})
	return s, nil
}

// Line is the summary line of chaos's runs, for the batch.
func (s *Summary) Line() string {
	line := fmt.Sprintf("chaos: %d schedules, %d faults, %d operations, %d violations", s.Schedules, s.Faults, s.Ops, s.Violations)
	if len(s.Failed) > 0 {
		line += fmt.Sprintf("; schedules with violations: seeds %s", seedList(s.Failed))
	}
	return line
}

func seedList(seeds []uint64) string {
	out := make([]string, len(seeds))
	for i, x := range seeds {
		out[i] = fmt.Sprint(x)
	}
	return strings.Join(out, ", ")
}

func ms(v float64) string { return time.Duration(v * 1e6).Round(time.Millisecond).String() }

// Write writes s for people: a table per fault kind as in verdict.txt,
// or, with markdown, as a Markdown table for docs/reliability.md.
func (s *Summary) Write(w io.Writer, markdown bool) error {
	var b strings.Builder
	durs := make([]string, len(s.Durations))
	for i, d := range s.Durations {
		durs[i] = d.String()
	}
	fmt.Fprintf(&b, "%d schedules (of %s; transport %s), seeds %s\n", s.Schedules, strings.Join(durs, ", "), strings.Join(s.Transports, ", "),
		seedList(s.Seeds))
	fmt.Fprintf(&b, "%d faults, %d operations, %d violations", s.Faults, s.Ops, s.Violations)
	if len(s.Failed) > 0 {
		fmt.Fprintf(&b, " (in the schedules of seeds %s)", seedList(s.Failed))
	}
	fmt.Fprintf(&b, "; longest wait %s (seed %d)\n", ms(s.LongestWaitMS), s.LongestSeed)
	if len(s.Skipped) > 0 {
		fmt.Fprintf(&b, "not counted, no verdict (cut short; chaos -check DIR runs the checkers): %s\n", strings.Join(s.Skipped, ", "))
	}
	fmt.Fprintf(&b, "\navailability (operations attributed to the fault in progress or healed in the last %s):\n", recoveryWindow)
	if markdown {
		b.WriteString("\n| fault kind | faults | operations | errors | hung | over the deadline | failed or hung | longest wait (seed) |\n")
		b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, k := range s.Kinds {
			fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %.2f%% | %s (%d) |\n", k.Kind, k.Faults, k.Ops, k.Errors, k.Hung,
				k.OverDeadline, 100*k.ErrorFraction, ms(k.MaxLatencyMS), s.MaxSeed[k.Kind])
		}
	} else {
		fmt.Fprintf(&b, "  %-12s %6s %8s %7s %5s %7s %9s %10s %8s\n", "KIND", "FAULTS", "OPS", "ERRORS", "HUNG", "KILLED", ">DEADLINE",
			"MAX WAIT", "IN SEED")
		for _, k := range s.Kinds {
			fmt.Fprintf(&b, "  %-12s %6d %8d %7d %5d %7d %9d %10s %8d   %.2f%% failed or hung\n", k.Kind, k.Faults, k.Ops, k.Errors,
				k.Hung, k.Killed, k.OverDeadline, ms(k.MaxLatencyMS), s.MaxSeed[k.Kind], 100*k.ErrorFraction)
		}
	}
	b.WriteString("\n" + s.Line() + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}
