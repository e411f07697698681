package chaos

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeRun makes a run directory as a finished schedule leaves it: its
// run.json and its verdict.json.
func writeRun(t *testing.T, dir string, dur time.Duration, v Verdict) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, x := range map[string]any{
		"run.json":      runInfo{Seed: v.Seed, Config: Config{Duration: dur}},
		"verdict.json":  v,
		"schedule.json": []Fault{},
	} {
		b, err := json.Marshal(x)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The report of a batch sums the schedules' verdicts: faults, operations,
// violations (naming the schedules that had them), and per fault kind the
// counts and the longest wait with its schedule; a run cut short is
// named and not counted; the exit status says whether any violation was
// found.
func TestReport(t *testing.T) {
	base := t.TempDir()
	batch := filepath.Join(base, "batch")
	writeRun(t, filepath.Join(batch, "x-seed7"), 5*time.Minute, Verdict{Seed: 7, Faults: 3, Ops: 1000, LongestWaitMS: 900,
		Availability: []KindStats{
			{Kind: "none", Ops: 400, MaxLatencyMS: 20},
			{Kind: "kill", Faults: 2, Ops: 500, Errors: 5, Hung: 0, MaxLatencyMS: 900},
			{Kind: "pause", Faults: 1, Ops: 100, Errors: 10, OverDeadline: 1, MaxLatencyMS: 400},
		}})
	writeRun(t, filepath.Join(batch, "x-seed8"), 5*time.Minute, Verdict{Seed: 8, Faults: 2, Ops: 500, LongestWaitMS: 1200,
		Violations: []Violation{{Checker: "durability", What: "a stale page"}, {Checker: "counter", What: "lost add"}},
		Availability: []KindStats{
			{Kind: "kill", Faults: 1, Ops: 300, Errors: 1, Hung: 2, MaxLatencyMS: 1200},
			{Kind: "bridge", Faults: 1, Ops: 200, MaxLatencyMS: 50},
		}})
	if err := os.MkdirAll(filepath.Join(batch, "x-seed9"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(batch, "x-seed9", "schedule.json"), []byte("[]"), 0o644); err != nil {
		t.Fatal(err)
	}
	lone := filepath.Join(base, "lone-seed11")
	writeRun(t, lone, time.Minute, Verdict{Seed: 11, Faults: 1, Ops: 50, Availability: []KindStats{{Kind: "kill", Faults: 1, Ops: 50}}})

	s, err := Summarize([]string{batch, lone})
	if err != nil {
		t.Fatal(err)
	}
	if s.Schedules != 3 || s.Faults != 6 || s.Ops != 1550 || s.Violations != 2 {
		t.Errorf("schedules %d, faults %d, ops %d, violations %d; want 3, 6, 1550, 2", s.Schedules, s.Faults, s.Ops, s.Violations)
	}
	if len(s.Failed) != 1 || s.Failed[0] != 8 || s.LongestSeed != 8 || s.LongestWaitMS != 1200 {
		t.Errorf("failed %v, longest %v in seed %d; want [8], 1200 in 8", s.Failed, s.LongestWaitMS, s.LongestSeed)
	}
	if len(s.Skipped) != 1 || !strings.HasSuffix(s.Skipped[0], "x-seed9") {
		t.Errorf("skipped %v; want the run without a verdict", s.Skipped)
	}
	var kinds []string
	for _, k := range s.Kinds {
		kinds = append(kinds, k.Kind)
	}
	if got := strings.Join(kinds, ","); got != "none,bridge,kill,pause" {
		t.Errorf("kinds %s; want none first, then by name", got)
	}
	kill := s.Kinds[2]
	if kill.Faults != 4 || kill.Ops != 850 || kill.Errors != 6 || kill.Hung != 2 || kill.MaxLatencyMS != 1200 || s.MaxSeed["kill"] != 8 {
		t.Errorf("kill: %+v, longest in seed %d", kill, s.MaxSeed["kill"])
	}
	if want := 8.0 / 850; kill.ErrorFraction != want {
		t.Errorf("kill's failed or hung fraction %v; want %v", kill.ErrorFraction, want)
	}
	if s.MaxSeed["pause"] != 7 {
		t.Errorf("pause's longest wait in seed %d; want 7", s.MaxSeed["pause"])
	}
	if len(s.Durations) != 2 {
		t.Errorf("durations %v; want 5m and 1m", s.Durations)
	}
	if len(s.Transports) != 1 || s.Transports[0] != "tcp" {
		t.Errorf("transports %v; want tcp", s.Transports)
	}

	for _, md := range []bool{false, true} {
		var out bytes.Buffer
		if err := s.Write(&out, md); err != nil {
			t.Fatal(err)
		}
		text := out.String()
		for _, want := range []string{"chaos: 3 schedules, 6 faults, 1550 operations, 2 violations; schedules with violations: seeds 8",
			"x-seed9", "1.2s"} {
			if !strings.Contains(text, want) {
				t.Errorf("markdown %v: the report lacks %q:\n%s", md, want, text)
			}
		}
		if md && !strings.Contains(text, "| kill | 4 | 850 | 6 | 2 | 0 | 0.94% | 1.2s (8) |") {
			t.Errorf("the Markdown table lacks kill's row:\n%s", text)
		}
	}

	var stdout, stderr bytes.Buffer
	if code := Main([]string{"-report", batch}, &stdout, &stderr); code != 1 {
		t.Errorf("-report of a batch with violations: exit %d; want 1 (stderr %s)", code, stderr.String())
	}
	if code := Main([]string{"-report", lone}, &stdout, &stderr); code != 0 {
		t.Errorf("-report of a clean run: exit %d; want 0 (stderr %s)", code, stderr.String())
	}
	if code := Main([]string{"-report"}, &stdout, &stderr); code != 2 {
		t.Errorf("-report without directories: exit %d; want 2", code)
	}
	if code := Main([]string{"-report", base + "/absent"}, &stdout, &stderr); code != 3 {
		t.Errorf("-report of a missing directory: exit %d; want 3", code)
	}
	empty := filepath.Join(base, "empty")
	if err := os.MkdirAll(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Summarize([]string{empty}); err == nil {
		t.Error("a directory without runs summed without an error")
	}
}
