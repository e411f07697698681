package tests

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRegionExportImportThroughDsmd exports a region of a real three-node
// cluster with a few pages written at scattered offsets through different
// nodes, imports the file into a new region through another node, and
// compares the two regions byte for byte.
func TestRegionExportImportThroughDsmd(t *testing.T) {
	longTest(t)
	c := startCluster(t, 3)
	c.waitHealthy(1)
	if out, errs, code := c.ctl(1, "region", "create", "src", "8MiB"); code != 0 {
		t.Fatalf("region create: exit %d: %s%s", code, out, errs)
	}
	writes := []struct {
		node      int
		off, data string
	}{{1, "0", "first page"}, {2, "3145828", "inside page 768"}, {3, "7344122", "across pages 1792 and 1793"}}
	for _, w := range writes {
		if _, errs, code := c.ctl(w.node, "put", "src", w.off, w.data); code != 0 {
			t.Fatalf("put on n%d: exit %d: %s", w.node, code, errs)
		}
	}
	file := filepath.Join(t.TempDir(), "src.dsmr")
	out, errs, code := c.ctl(2, "region", "export", "src", file, "--json")
	if code != 0 {
		t.Fatalf("export on n2: exit %d: %s", code, errs)
	}
	var e struct {
		Pages     uint64 `json:"pages"`
		PagesRead uint64 `json:"pages_read"`
		SHA256    string `json:"sha256"`
		ElapsedNS int64  `json:"elapsed_ns"`
	}
	if err := json.Unmarshal([]byte(out), &e); err != nil || e.Pages != 4 || e.PagesRead != 2048 {
		t.Fatalf("export --json: %+v, %v; want 4 populated pages of 2048\n%s", e, err, out)
	}
	out, errs, code = c.ctl(3, "region", "import", "dst", file, "--json")
	if code != 0 {
		t.Fatalf("import on n3: exit %d: %s", code, errs)
	}
	var i struct {
		Created bool   `json:"created"`
		Pages   uint64 `json:"pages"`
		Synced  bool   `json:"synced"`
		SHA256  string `json:"sha256"`
		Elapsed int64  `json:"elapsed_ns"`
	}
	if err := json.Unmarshal([]byte(out), &i); err != nil || !i.Created || i.Pages != 4 || !i.Synced || i.SHA256 != e.SHA256 {
		t.Fatalf("import --json: %+v, %v; want a created region, 4 pages synced, the export's sha256\n%s", i, err, out)
	}
	t.Logf("export of 8 MiB (2048 pages read, 4 written): %v; import of 4 pages: %v",
		time.Duration(e.ElapsedNS), time.Duration(i.Elapsed))
	var src, dst string
	for _, r := range []struct {
		name string
		into *string
	}{{"src", &src}, {"dst", &dst}} {
		var errs string
		var code int
		*r.into, errs, code = c.ctl(1, "get", r.name, "0", "8MiB", "--raw")
		if code != 0 || len(*r.into) != 8<<20 {
			t.Fatalf("get of region %s on n1: exit %d, %d bytes: %s", r.name, code, len(*r.into), errs)
		}
	}
	if src != dst {
		t.Fatal("region dst differs from region src after export and import")
	}
	for _, w := range writes {
		if !strings.Contains(dst, w.data) {
			t.Errorf("region dst lacks %q", w.data)
		}
	}
	if strings.Trim(dst[4096:3145728], "\x00") != "" {
		t.Error("region dst has bytes where src has none")
	}
}
