package cli

import (
	"slices"
	"strings"
	"testing"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

func TestBenchAgainstFake(t *testing.T) {
	f, sock := serveFake(t)
	var v benchJSON
	r := run(t, sock, runOpts{}, "bench", "--ops", "400", "--threads", "4", "--read-ratio", "0.5",
		"--skew", "0.9", "--progress", "always", "--here", "--json").ok(t)
	decode(t, r.stdout, &v)
	f.mu.Lock()
	reads, writes, deleted, forced := f.reads, f.writes, slices.Clone(f.deleted), slices.Clone(f.forced)
	_, left := f.regions["dsmctl-bench"]
	f.mu.Unlock()
	if v.Ops != 400 || v.Read.Count+v.Write.Count != 400 || v.All.Count != 400 {
		t.Errorf("bench counted %d ops (%d reads, %d writes), want 400", v.Ops, v.Read.Count, v.Write.Count)
	}
	if reads != v.Read.Count || writes != v.Write.Count {
		t.Errorf("the server saw %d reads and %d writes; bench reports %d and %d", reads, writes, v.Read.Count, v.Write.Count)
	}
	if v.Read.Count == 0 || v.Write.Count == 0 || v.All.P50NS <= 0 || v.All.MaxNS < v.All.P99NS || v.All.P99NS < v.All.P50NS {
		t.Errorf("implausible latencies: %+v", v.All)
	}
	if v.Workload.Region != "dsmctl-bench" || v.Workload.RegionSize != 64<<20 || v.Workload.Skew != 0.9 || v.Target != "admin on the answering node" {
		t.Errorf("workload: %+v", v.Workload)
	}
	if left || !slices.Equal(deleted, []string{"dsmctl-bench"}) || !slices.Equal(forced, deleted) {
		t.Errorf("the region bench created was not deleted with force (deleted %v, forced %v)", deleted, forced)
	}
	if !strings.Contains(r.stderr, "100% 400/400 ops") {
		t.Errorf("no final progress bar on stderr: %q", r.stderr)
	}

	// An existing region is used as it is, and kept.
	r = run(t, sock, runOpts{}, "bench", "--region", "small", "--ops", "100", "--threads", "2", "--here").ok(t)
	for _, w := range []string{"bench on small (400 KiB, 4 KiB pages) through admin on the answering node · 2 threads", "OP", "read", "write", "all", "100 ops in"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("bench table lacks %q:\n%s", w, r.stdout)
		}
	}
	if r.stderr != "" {
		t.Errorf("progress bar drawn on a non-terminal: %q", r.stderr)
	}
	f.mu.Lock()
	_, kept := f.regions["small"]
	f.mu.Unlock()
	if !kept {
		t.Error("bench deleted a region it did not create")
	}

	// A region created by someone else between bench's look and its create
	// (CreateRegion answers existed) is theirs: used, and kept.
	f.mu.Lock()
	f.addRegion("race", 64<<20, 4096, dsmpb.Durability_DURABILITY_MEMORY)
	f.hidden = "race"
	f.mu.Unlock()
	run(t, sock, runOpts{}, "bench", "--region", "race", "--ops", "100", "--here").ok(t)
	f.mu.Lock()
	_, kept = f.regions["race"]
	f.mu.Unlock()
	if !kept {
		t.Error("bench deleted a region that existed when it created it")
	}

	// A workload the region cannot hold is a usage error.
	if r := run(t, sock, runOpts{}, "bench", "--region", "small", "--threads", "64", "--here"); r.code != ExitUsage ||
		!strings.Contains(r.stderr, "private area") {
		t.Errorf("too many threads for the region: exit %d, %q", r.code, r.stderr)
	}
}
