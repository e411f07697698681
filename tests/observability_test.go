package tests

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// promBuiltins are the names in PromQL expressions that are not metrics:
// functions, aggregations and their modifiers, keywords.
var promBuiltins = map[string]bool{
	"sum": true, "max": true, "min": true, "avg": true, "count": true, "by": true, "without": true,
	"rate": true, "irate": true, "increase": true, "histogram_quantile": true, "label_values": true,
	"and": true, "or": true, "unless": true, "bool": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "offset": true, "inf": true, "nan": true,
}

// scrapedBy are the series Prometheus records itself for every target.
var scrapedBy = map[string]bool{"up": true}

var (
	promStrings = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promBraces  = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promGroup   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent   = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	promNumber  = regexp.MustCompile(`\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b`)
)

// metricNames returns the metric names an expression uses.
func metricNames(expr string) []string {
	e := promStrings.ReplaceAllString(expr, " ")
	e = promBraces.ReplaceAllString(e, " ")
	e = promGroup.ReplaceAllString(e, " ")
	e = promNumber.ReplaceAllString(e, " ")
	var names []string
	for _, loc := range promIdent.FindAllStringIndex(e, -1) {
		id := e[loc[0]:loc[1]]
		rest := strings.TrimLeft(e[loc[1]:], " ")
		if promBuiltins[strings.ToLower(id)] || strings.HasPrefix(rest, "(") || strings.HasPrefix(id, "$") {
			continue
		}
		names = append(names, id)
	}
	return names
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`up{job="dsm"} == 0`: {"up"},
		`histogram_quantile(0.99, sum by (instance, le) (rate(dsm_miss_latency_seconds_bucket{job="dsm"}[5m]))) > 0.05`: {"dsm_miss_latency_seconds_bucket"},
		`dsm_cache_bytes{kind="dirty"} > 0.5 * dsm_cache_capacity_bytes`:                                                {"dsm_cache_bytes", "dsm_cache_capacity_bytes"},
		`label_values(dsm_node_info{job="dsm"}, instance)`:                                                              {"dsm_node_info", "instance"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%q) = %q, want %q", expr, got, want)
		}
	}
}

// httpGet returns the status of a GET of url.
func httpGet(t *testing.T, url string) int {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// exportedNames scrapes addr's /metrics and returns every series name it
// exports (a histogram's _bucket, _sum and _count included).
func exportedNames(t *testing.T, addr string) map[string]bool {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = true
			if f[3] == "histogram" || f[3] == "summary" {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					names[f[2]+s] = true
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// dashboardExprs returns every PromQL expression of the Grafana
// dashboard: the panels' targets and the template variables' queries.
func dashboardExprs(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	out := map[string]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out[tg.Expr] = "panel " + p.Title
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			out[v.Definition] = "variable " + v.Name
		}
	}
	return out
}

// alertExprs returns the expr of every rule of a Prometheus rules file
// (written one line each).
func alertExprs(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var alert string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "- alert:"):
			alert = strings.TrimSpace(strings.TrimPrefix(l, "- alert:"))
		case strings.HasPrefix(l, "expr:"):
			e := strings.TrimSpace(strings.TrimPrefix(l, "expr:"))
			if e == "" || e == "|" || e == ">" {
				t.Fatalf("%s: alert %s: write expr on one line", path, alert)
			}
			out[e] = "alert " + alert
		}
	}
	return out
}

// TestAlertsAndDashboardMetrics checks that every metric the Grafana
// dashboard and the Prometheus alert rules use is one that a real dsmd
// exports.
func TestAlertsAndDashboardMetrics(t *testing.T) {
	dash := dashboardExprs(t, "../deploy/grafana/dashboard.json")
	alerts := alertExprs(t, "../deploy/prometheus/alerts.yml")
	if len(dash) < 10 || len(alerts) < 5 {
		t.Fatalf("%d dashboard and %d alert expressions: the files were not read right", len(dash), len(alerts))
	}
	wantAlerts := []string{"DSMNodeDown", "DSMUnhealthy", "DSMDegraded", "DSMMissLatencyHigh", "DSMDirtyBytesHigh"}
	for _, a := range wantAlerts {
		found := false
		for _, where := range alerts {
			found = found || where == "alert "+a
		}
		if !found {
			t.Errorf("alerts.yml has no alert %s", a)
		}
	}

	// With --pprof, which the names do not depend on: the profiler answers.
	c := startClusterWith(t, 1, map[int][]string{1: {"--pprof"}})
	c.waitHealthy(1)
	if code := httpGet(t, "http://"+c.metrics[0]+"/debug/pprof/heap?debug=1"); code != http.StatusOK {
		t.Errorf("dsmd --pprof: GET /debug/pprof/heap: %d", code)
	}
	exported := exportedNames(t, c.metrics[0])
	for _, want := range []string{"dsm_health", "dsm_miss_latency_seconds_bucket", "go_goroutines", "process_resident_memory_bytes"} {
		if !exported[want] {
			t.Fatalf("/metrics lacks %s; it exports %d names", want, len(exported))
		}
	}
	for file, exprs := range map[string]map[string]string{"dashboard.json": dash, "alerts.yml": alerts} {
		for expr, where := range exprs {
			names := metricNames(expr)
			if len(names) == 0 {
				t.Errorf("%s, %s: no metric in %q", file, where, expr)
			}
			for _, n := range names {
				if n == "instance" && strings.HasPrefix(expr, "label_values(") {
					continue // the label whose values the variable lists
				}
				if !exported[n] && !scrapedBy[n] {
					t.Errorf("%s, %s: %s is not exported by dsmd (in %q)", file, where, n, expr)
				}
			}
		}
	}
}

// TestAlertRules checks alerts.yml with promtool, and runs its unit tests
// (alerts_test.yml: the alerts fire on the series they are about, and not
// before their time). Without promtool on $PATH (Debian's prometheus
// package has it) it is skipped.
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("no promtool on $PATH (apt-get install prometheus): the alert rules are not checked by Prometheus")
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "../deploy/prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
