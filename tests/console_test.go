package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
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

// chromium runs headless Chromium on url with args (--dump-dom,
// --screenshot=...) and returns its stdout. virtualMs of virtual time let
// the page's scripts fetch and draw first.
func chromium(t *testing.T, bin, url string, virtualMs int, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	full := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--user-data-dir=" + t.TempDir(), fmt.Sprintf("--virtual-time-budget=%d", virtualMs)}, args...)
	cmd := exec.CommandContext(ctx, bin, append(full, url)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, tail(errb.String(), 3000))
	}
	return out.String()
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

// TestWebConsole loads the console of a real three-node cluster in
// headless Chromium and checks what it shows: the members and their
// health, the region, and the page map's cells in the states the writes
// and reads left.
func TestWebConsole(t *testing.T) {
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
	c.waitHealthy(2)

	wantStates := "M..M...S" + strings.Repeat(".", 56)
	wantOwners := "1,,,2" + strings.Repeat(",", 60)
	url := "http://" + c.metrics[1] + "/" // n2's console
	var dom string
	eventually(t, "the console shows the cluster", 45*time.Second, func() error {
		dom = chromium(t, bin, url, 2500, "--dump-dom")
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
		if !strings.Contains(dom, `<tr data-region="console"`) {
			return fmt.Errorf("no row of region console")
		}
		if r := attr(dom, "pagemap", "data-region"); r != "console" {
			return fmt.Errorf("page map of %q", r)
		}
		if s, o := attr(dom, "pagemap", "data-states"), attr(dom, "pagemap", "data-owners"); s != wantStates || o != wantOwners {
			return fmt.Errorf("page map states %q owners %q; want %q %q", s, o, wantStates, wantOwners)
		}
		return nil
	})
	for _, want := range []string{"n2 · ", "M 2 · S 1 · I 61", "M at n1", "M at n2", "pages 0–63 of 64 · 1 cell = 1 page · cluster view from n2"} {
		if !strings.Contains(dom, want) {
			t.Errorf("the console lacks %q", want)
		}
	}
	if dir := os.Getenv("DSM_CONSOLE_SCREENSHOT"); dir != "" {
		// DSM_CONSOLE_SCREENSHOT=DIR keeps a picture of the page (docs/console.png).
		shot := filepath.Join(dir, "console.png")
		chromium(t, bin, url, 4500, "--hide-scrollbars", "--window-size=1200,1250", "--screenshot="+shot)
		t.Logf("screenshot in %s", shot)
	}
}
