package tests

import (
	"context"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// chromiumBin finds a headless-capable Chromium. Without one the test
// fails when $CI is set (CI installs it) and is skipped otherwise.
func chromiumBin(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const msg = "no chromium on $PATH (apt-get install chromium): the web console is not tested in a browser"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// chromium runs headless Chromium with its profile in dir on url with
// args (--dump-dom, --screenshot=...) and returns its stdout. virtualMs of
// virtual time let the page's scripts fetch and draw first.
func chromium(bin, dir, url string, virtualMs int, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	full := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--user-data-dir=" + dir, fmt.Sprintf("--virtual-time-budget=%d", virtualMs)}, args...)
	cmd := exec.CommandContext(ctx, bin, append(full, url)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("chromium %v: %v\n%s", args, err, tail(errb.String(), 3000))
	}
	return out.String(), nil
}

// pageMap checks the page map of a DOM: the region, the pages per cell,
// the state of each cell (M, S, . as the canvas's data-states has them),
// the owners of the M cells, and texts the page shows.
func pageMap(dom, region, group, states, owners string, texts ...string) error {
	if r, g := attr(dom, "pagemap", "data-region"), attr(dom, "pagemap", "data-group"); r != region || g != group {
		return fmt.Errorf("page map of %q in groups of %q; want %q in groups of %s", r, g, region, group)
	}
	if s, o := attr(dom, "pagemap", "data-states"), attr(dom, "pagemap", "data-owners"); s != states || o != owners {
		return fmt.Errorf("page map of %s: states %q owners %q; want %q %q", region, head(s, 100), head(o, 100), head(states, 100), head(owners, 100))
	}
	for _, want := range texts {
		if !strings.Contains(dom, want) {
			return fmt.Errorf("the page lacks %q", want)
		}
	}
	return nil
}

// attr returns the value of attribute name of the element with id, from
// a DOM that Chromium serialized.
func attr(dom, id, name string) string {
	re := regexp.MustCompile(`<[a-z]+ [^>]*\bid="` + regexp.QuoteMeta(id) + `"[^>]*>`)
	tag := re.FindString(dom)
	m := regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `="([^"]*)"`).FindStringSubmatch(tag)
	if m == nil {
		return ""
	}
	return m[1]
}

// clickHTML is a page that shows the console in a frame, clicks cell 1250
// of its page map once it shows region big in groups of 4 pages, and
// writes what the page map shows after the zoom into its <pre id="out">.
// Chromium lets it reach into the frame with --disable-web-security.
const clickHTML = `<!doctype html>
<html><body>
<iframe id="f" src="CONSOLE_URL" width="1200" height="1200"></iframe>
<pre id="out">waiting</pre>
<script>
const f = document.getElementById("f");
const out = document.getElementById("out");
function canvas() {
  try {
    const d = f.contentDocument;
    return d && d.getElementById("pagemap");
  } catch (e) {
    out.textContent = "error: " + e;
    return null;
  }
}
function clickCell() {
  const c = canvas();
  if (!c || c.dataset.region !== "big" || c.dataset.group !== "4") { setTimeout(clickCell, 100); return; }
  const r = c.getBoundingClientRect(), i = 1250, cols = 128, size = r.width / cols;
  c.dispatchEvent(new MouseEvent("click", { bubbles: true,
    clientX: r.left + (i % cols + 0.5) * size, clientY: r.top + (Math.floor(i / cols) + 0.5) * size }));
  zoomed();
}
function zoomed() {
  const c = canvas();
  if (!c || c.dataset.group !== "1") { setTimeout(zoomed, 100); return; }
  out.textContent = JSON.stringify({ first: c.dataset.first, count: c.dataset.count,
    m: c.dataset.states.indexOf("M"), hash: f.contentWindow.location.hash });
}
clickCell();
</script>
</body></html>
`

// clickHarness serves clickHTML around consoleURL on a loopback port
// until the test ends, and returns its address.
func clickHarness(t *testing.T, consoleURL string) string {
	t.Helper()
	ln, err := net.Listen("tcp", freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	page := strings.ReplaceAll(clickHTML, "CONSOLE_URL", consoleURL)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, page)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/"
}

// TestWebConsole loads the console of a real three-node cluster in
// headless Chromium and checks what it shows: the members and their
// health, the region, and the page map's cells in the states the writes
// and reads left.
func TestWebConsole(t *testing.T) {
	longTest(t)
	bin := chromiumBin(t)
	c := startClusterWith(t, 3, nil)
	c.waitHealthy(1)
	c.createRegion(t, 1, "console", 64*4096)
	// Page 0 Modified at n1, page 3 at n2; page 7 written by n3 and read
	// by n1: Shared at both.
	c.mustCtl(t, 1, "put", "console", "0", "n1 wrote this")
	c.mustCtl(t, 2, "put", "console", fmt.Sprint(3*4096), "n2 wrote this")
	c.mustCtl(t, 3, "put", "console", fmt.Sprint(7*4096), "n3 wrote this")
	c.mustCtl(t, 1, "get", "console", fmt.Sprint(7*4096), "13")
	// A region of 16384 pages is drawn in cells of 4 pages; page 5001,
	// Modified at n3, is in cell 1250.
	c.createRegion(t, 1, "big", 16384*4096)
	c.mustCtl(t, 3, "put", "big", fmt.Sprint(5001*4096), "n3 wrote this")
	c.waitHealthy(2)

	url := "http://" + c.metrics[1] + "/" // n2's console
	// The profiler is off without --pprof.
	if code := httpGet(t, url+"debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("dsmd without --pprof: GET /debug/pprof/: %d, want 404", code)
	}
	// Each view is loaded in its own Chromium, all at once (a browser's
	// start is most of the time), until every check passes.
	type view struct {
		url   string
		args  []string
		check func(dom string) error
	}
	views := map[string]view{
		"console": {url + "#region=console", nil, func(dom string) error {
			if m := regexp.MustCompile(`<p id="error"[^>]*>([^<]*)<`).FindStringSubmatch(dom); m == nil || m[1] != "" {
				return fmt.Errorf("the page shows an error: %q", m)
			}
			if h := attr(dom, "health", "data-health"); h != "healthy" {
				return fmt.Errorf("health %q", h)
			}
			for i := 1; i <= 3; i++ {
				if !strings.Contains(dom, fmt.Sprintf(`<tr data-node="%d" data-state="alive">`, i)) {
					return fmt.Errorf("no row of n%d alive", i)
				}
			}
			for _, r := range []string{"console", "big"} {
				if !strings.Contains(dom, `<tr data-region="`+r+`"`) {
					return fmt.Errorf("no row of region %s", r)
				}
			}
			return pageMap(dom, "console", "1", "M..M...S"+strings.Repeat(".", 56), "1,,,2"+strings.Repeat(",", 60),
				"n2 · ", "M 2 · S 1 · I 61", "M at n1", "M at n2", "pages 0–63 of 64 · 1 cell = 1 page · cluster view from n2")
		}},
		// The big region, whole, then zoomed in.
		"big": {url + "#region=big", nil, func(dom string) error {
			return pageMap(dom, "big", "4", strings.Repeat(".", 1250)+"M"+strings.Repeat(".", 4096-1251),
				strings.Repeat(",", 1250)+"3"+strings.Repeat(",", 4096-1251), "1 cell = 4 pages", "M 1 · S 0 · I 16383")
		}},
		"big zoomed": {url + "#region=big&first=4992&count=64", nil, func(dom string) error {
			return pageMap(dom, "big", "1", strings.Repeat(".", 9)+"M"+strings.Repeat(".", 54),
				strings.Repeat(",", 9)+"3"+strings.Repeat(",", 54), "pages 4992–5055 of 16384")
		}},
		// A click on cell 1250 of the whole big region zooms in 8 times
		// around it: 2048 pages from 3978, one a cell, page 5001 the
		// 1024th, and the address says so.
		"click": {clickHarness(t, url+"#region=big"), []string{"--disable-web-security", "--disable-site-isolation-trials"}, func(dom string) error {
			m := regexp.MustCompile(`<pre id="out">([^<]*)</pre>`).FindStringSubmatch(dom)
			if m == nil {
				return fmt.Errorf("the harness has no result")
			}
			want := `{"first":"3978","count":"2048","m":1023,"hash":"#region=big&first=3978&count=2048"}`
			if got := html.UnescapeString(m[1]); got != want {
				return fmt.Errorf("after a click on cell 1250: %s, want %s", got, want)
			}
			return nil
		}},
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(views) > 0 {
		var mu sync.Mutex
		var wg sync.WaitGroup
		failed := map[string]error{}
		for name, v := range views {
			wg.Add(1)
			dir := t.TempDir()
			go func() {
				defer wg.Done()
				dom, err := chromium(bin, dir, v.url, 2500, append([]string{"--dump-dom"}, v.args...)...)
				if err == nil {
					err = v.check(dom)
				}
				mu.Lock()
				defer mu.Unlock()
				failed[name] = err
			}()
		}
		wg.Wait()
		for name, err := range failed {
			if err == nil {
				delete(views, name)
				delete(failed, name)
			}
		}
		if len(views) > 0 && time.Now().After(deadline) {
			t.Fatalf("the console does not show what it should: %v", failed)
		}
	}
	if dir := os.Getenv("DSM_CONSOLE_SCREENSHOT"); dir != "" {
		// DSM_CONSOLE_SCREENSHOT=DIR keeps a picture of the page (docs/console.png).
		shot := filepath.Join(dir, "console.png")
		if _, err := chromium(bin, t.TempDir(), url+"#region=console", 4500, "--hide-scrollbars", "--window-size=1200,1250", "--screenshot="+shot); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot in %s", shot)
	}
}
