package cli

import (
	"strings"
	"testing"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// TestPagesLargest draws the largest region dsmd allows (16 TiB of 4 KiB
// pages, 2^23 shards of 2 MiB): pages asks RegionInfo for the region, not
// for its placement, and groups pages so that one Pages request holds the
// cells.
func TestPagesLargest(t *testing.T) {
	f, sock := serveFake(t)
	f.mu.Lock()
	f.addRegion("largest", 16<<40, 4096, dsmpb.Durability_DURABILITY_MEMORY).Shards = 1 << 23
	f.mu.Unlock()
	r := run(t, sock, runOpts{}, "pages", "largest").ok(t)
	head := "region largest (r3) · pages 0-4294967295 of 4294967296 · 4 KiB pages · 1 cell = 4194304 pages · cluster view from n1\n"
	if !strings.HasPrefix(r.stdout, head) || !strings.Contains(r.stdout, "\nlegend  A M at n1  B M at n2  C M at n3") {
		t.Errorf("pages largest:\n%s", r.stdout)
	}
	f.mu.Lock()
	reqs := f.infoReqs
	f.mu.Unlock()
	for _, q := range reqs {
		if q.MaxShards != 1 {
			t.Errorf("pages asked RegionInfo for %d shards (0: the default 4096); it needs the region only", q.MaxShards)
		}
	}
	// The most cells the Pages RPC answers, and a range at the very end.
	r = run(t, sock, runOpts{}, "pages", "largest", "--max-cells", "65536", "--width", "1024").ok(t)
	if !strings.Contains(r.stdout, "1 cell = 65536 pages") || strings.Count(r.stdout, "\n") != 64+5 {
		t.Errorf("pages largest --max-cells 65536: %d lines\n%.300s", strings.Count(r.stdout, "\n"), r.stdout)
	}
	r = run(t, sock, runOpts{}, "pages", "largest", "--range", "4294967200:").ok(t)
	if !strings.Contains(r.stdout, "pages 4294967200-4294967295 of 4294967296 · 4 KiB pages · 1 cell = 1 page") {
		t.Errorf("pages at the end of the largest region:\n%s", r.stdout)
	}
	if r := run(t, sock, runOpts{}, "pages", "largest", "--max-cells", "65537"); r.code != ExitUsage {
		t.Errorf("--max-cells 65537: exit %d, %q", r.code, r.stderr)
	}
}
