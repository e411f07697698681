package node

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// get fetches http://ADDR+path and returns the status and body.
func get(t *testing.T, addr, path string) (int, string, http.Header) {
	t.Helper()
	hc := &http.Client{Timeout: 15 * time.Second}
	resp, err := hc.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

func mustGet(t *testing.T, addr, path string) string {
	t.Helper()
	code, body, _ := get(t, addr, path)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, body)
	}
	return body
}

// decodeOK fetches a JSON endpoint that must answer 200 into v.
func decodeOK(t *testing.T, addr, path string, v any) {
	t.Helper()
	body := mustGet(t, addr, path)
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("GET %s: %v\n%s", path, err, body)
	}
}

func parse(t *testing.T, c *Config, args ...string) error {
	t.Helper()
	var err error
	*c, err = ParseFlags(args, io.Discard)
	return err
}

func TestConsoleAPI(t *testing.T) {
	n, conn := startOne(t)
	adm := dsmpb.NewAdminClient(conn)
	waitHealthy(t, adm)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// 1 MiB: 256 pages; bytes written at pages 0 and 9 make them M here.
	if _, err := adm.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "web", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	for _, off := range []uint64{0, 9 * 4096} {
		// The page cache sets the region up once the directory has it.
		for {
			_, err := adm.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{Region: "web", Offset: off, Data: []byte("console")})
			if err == nil {
				break
			}
			if code(err) != codes.NotFound || ctx.Err() != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	addr := n.MetricsAddr()

	t.Run("page", func(t *testing.T) {
		for path, want := range map[string]string{"/": "<canvas id=\"pagemap\"", "/console.js": "api/overview", "/console.css": "#pagemap"} {
			code, body, _ := get(t, addr, path)
			if code != http.StatusOK || !strings.Contains(body, want) {
				t.Errorf("GET %s: %d, lacks %q", path, code, want)
			}
		}
		if strings.Contains(mustGet(t, addr, "/"), "://") {
			t.Errorf("the page refers to another origin")
		}
		for _, path := range []string{"/index.htm", "/nope", "/api/", "/api/nope"} {
			if code, _, _ := get(t, addr, path); code != http.StatusNotFound {
				t.Errorf("GET %s: %d, want 404", path, code)
			}
		}
	})

	t.Run("overview", func(t *testing.T) {
		var o consoleOverview
		decodeOK(t, addr, "/api/overview", &o)
		// One node cannot hold the region's backup: degraded, with the reason.
		if o.NodeID != 1 || o.Health != "degraded" || len(o.Reasons) == 0 || len(o.Members) != 1 || o.Members[0].State != "alive" ||
			!o.Members[0].Leader || len(o.Regions) != 1 || o.Regions[0].Name != "web" || o.Regions[0].Pages != 256 {
			t.Fatalf("overview: %+v", o)
		}
	})

	t.Run("pages", func(t *testing.T) {
		var p consolePages
		decodeOK(t, addr, "/api/pages?region=web&first=0&count=16", &p)
		if p.Group != 1 || len(p.Cells) != 16 || p.Totals.Modified != 2 || p.Totals.Invalid != 14 || p.Totals.Dirty != 2 {
			t.Fatalf("pages 0-15: %+v", p)
		}
		for i, c := range p.Cells {
			want := "I"
			if i == 0 || i == 9 {
				want = "M"
			}
			if c.State != want || want == "M" && (len(c.Owners) != 1 || c.Owners[0] != 1) {
				t.Errorf("cell %d: %+v, want %s", i, c, want)
			}
		}
		// The whole region in at most 10 cells: groups of 26 pages, the
		// first holds both written pages.
		decodeOK(t, addr, "/api/pages?region=web&cells=10", &p)
		if p.Group != 26 || len(p.Cells) != 10 || p.Cells[0].State != "M" || p.Cells[0].Modified != 2 || p.Cells[1].State != "I" {
			t.Fatalf("pages in 10 cells: group %d, %d cells, first %+v", p.Group, len(p.Cells), p.Cells[0])
		}
		var total uint64
		for _, c := range p.Cells {
			total += c.Pages
		}
		if total != 256 {
			t.Errorf("cells cover %d pages, want 256", total)
		}
		decodeOK(t, addr, "/api/pages?region=web&first=250&local=true", &p)
		if p.Cluster || p.FirstPage != 250 || p.PageCount != 6 || len(p.Cells) != 6 {
			t.Fatalf("local pages 250-: %+v", p)
		}
	})

	t.Run("stats", func(t *testing.T) {
		var s consoleStats
		decodeOK(t, addr, "/api/stats", &s)
		if s.NodeID != 1 || s.TimeUnixNano == 0 || s.DirtyPages != 2 || s.MissLatency.Buckets == nil {
			t.Fatalf("stats: %+v", s)
		}
	})

	t.Run("dirty bytes", func(t *testing.T) {
		m := mustGet(t, addr, "/metrics")
		for _, want := range []string{`dsm_cache_bytes{kind="dirty"} 8192`, `dsm_cache_bytes{kind="resident"} 8192`} {
			if !strings.Contains(m, want+"\n") {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	})

	t.Run("errors", func(t *testing.T) {
		for _, tc := range []struct {
			path string
			code int
			want string
		}{
			{"/api/pages", 400, "region is required"},
			{"/api/pages?region=nope", 404, `region "nope" not found`},
			{"/api/pages?region=web&first=-1", 400, `first="-1" is not`},
			{"/api/pages?region=web&first=x", 400, `first="x" is not`},
			{"/api/pages?region=web&first=99999999999999999999", 400, "is not a non-negative whole number"},
			{"/api/pages?region=web&first=256", 400, "past its end"},
			{"/api/pages?region=web&first=200&count=57", 400, "runs past its end"},
			{"/api/pages?region=web&cells=0", 400, "cells=0: want 1 to 65536"},
			{"/api/pages?region=web&cells=65537", 400, "want 1 to 65536"},
			{"/api/pages?region=web&local=maybe", 400, "want true or false"},
			{"/api/pages?region=web&region=web", 400, "given 2 times"},
			{"/api/pages?region=web&zoom=2", 400, `unknown parameter "zoom"`},
			{"/api/pages?region=web&%zz", 400, "bad query"},
			{"/api/overview?x=1", 400, `unknown parameter "x"`},
			{"/api/stats?node=2", 400, `unknown parameter "node"`},
		} {
			code, body, h := get(t, addr, tc.path)
			var e consoleError
			if err := json.Unmarshal([]byte(body), &e); err != nil || code != tc.code || !strings.Contains(e.Error, tc.want) ||
				h.Get("Content-Type") != "application/json" {
				t.Errorf("GET %s: %d %s, want %d with %q", tc.path, code, body, tc.code, tc.want)
			}
		}
		hc := &http.Client{Timeout: 10 * time.Second}
		resp, err := hc.Post("http://"+addr+"/api/overview", "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET" {
			t.Errorf("POST /api/overview: %s", resp.Status)
		}
	})

	t.Run("pprof off", func(t *testing.T) {
		if code, _, _ := get(t, addr, "/debug/pprof/"); code != http.StatusNotFound {
			t.Errorf("GET /debug/pprof/ without --pprof: %d, want 404", code)
		}
	})
}

func TestPprofFlag(t *testing.T) {
	var c Config
	if err := parse(t, &c, "--id", "1", "--data-dir", t.TempDir()); err != nil || c.Pprof {
		t.Fatalf("default: pprof %v, err %v", c.Pprof, err)
	}
	err := parse(t, &c, "--id", "1", "--data-dir", t.TempDir(), "--pprof")
	if err == nil || !strings.Contains(err.Error(), "--pprof: needs --metrics-addr") {
		t.Fatalf("--pprof alone: %v", err)
	}
	if err := parse(t, &c, "--id", "1", "--data-dir", t.TempDir(), "--pprof", "--metrics-addr", "127.0.0.1:0"); err != nil || !c.Pprof {
		t.Fatalf("--pprof: pprof %v, err %v", c.Pprof, err)
	}
	var help strings.Builder
	Usage(&help)
	if !strings.Contains(help.String(), "-pprof") || !strings.Contains(help.String(), "/debug/pprof/") {
		t.Errorf("help lacks --pprof:\n%s", help.String())
	}

	// Served with the flag.
	n := &Node{cfg: c}
	srv := n.metricsHandler()
	for path, want := range map[string]int{"/debug/pprof/": 200, "/debug/pprof/heap": 200, "/debug/pprof/goroutine?debug=1": 200,
		"/debug/pprof/symbol": 200, "/debug/pprof/cmdline": 404, "/metrics": 200} {
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != want {
			t.Errorf("with --pprof, GET %s: %d, want %d", path, rec.Code, want)
		}
	}
	n = &Node{cfg: Config{}}
	rec := httptest.NewRecorder()
	n.metricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("without --pprof, GET /debug/pprof/: %d, want 404", rec.Code)
	}
	// The API of a node that has not started says so.
	rec = httptest.NewRecorder()
	n.metricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/api/overview", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("GET /api/overview before Start: %d, want 503", rec.Code)
	}
}
