package tests

import (
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// soakFor is how long TestSoak runs (make soak DURATION=10m); zero skips
// it.
var soakFor = flag.Duration("soak", 0, "run TestSoak for this long (make soak DURATION=10m)")

// soakOut is where TestSoak writes its samples as CSV ("" for none).
var soakOut = flag.String("soak-out", "", "write TestSoak's samples to this CSV file")

// Growth allowed per cycle, by the least-squares slope over the cycles
// after the warm-up: a leak of one goroutine, one descriptor or 128 KiB
// of resident memory a cycle fails. The soak that found the leaks this
// guards against measured 1 goroutine, 1 descriptor and 1.3 MiB a cycle.
var soakLimits = map[string]float64{
	"go_goroutines":                 0.2,
	"process_open_fds":              0.2,
	"process_resident_memory_bytes": 128 << 10,
}

// The first fifth of the cycles, and at least soakWarmup, are left out of
// the slopes: caches, pools and the Go heap grow to their working size
// first.
const soakWarmup = 5

// TestSoak runs region life cycles against a real three-node cluster for
// -soak: create a region, map it from client processes on every node
// (stores through Bytes, a check of every byte on another node, atomics
// from all nodes, a Mutex-protected increment, a short register history),
// list and describe it, then delete it while a process still maps it
// (forced). After every cycle it samples every dsmd's goroutines, open
// descriptors and resident memory from /metrics, prints them as a table
// and fails when one of them grows with the number of cycles.
func TestSoak(t *testing.T) {
	if *soakFor == 0 {
		t.Skip("a soak; run it with make soak DURATION=10m")
	}
	c := startClusterWith(t, 3, nil)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	metrics := []string{"go_goroutines", "process_open_fds", "process_resident_memory_bytes"}
	// samples[node][metric] is one value per cycle (index 0: before any).
	samples := make([]map[string][]float64, 3)
	for i := range samples {
		samples[i] = map[string][]float64{}
	}
	sample := func() {
		for node := 1; node <= 3; node++ {
			m := c.metricsOf(t, node)
			for _, k := range metrics {
				samples[node-1][k] = append(samples[node-1][k], m[k])
			}
		}
	}
	sample()
	start := time.Now()
	cycles := 0
	for time.Since(start) < *soakFor {
		cycles++
		soakCycle(t, c, cycles)
		if t.Failed() {
			break
		}
		// Let deferred work (session teardown, engine stop) finish before
		// sampling, as an operator's scrape would.
		time.Sleep(200 * time.Millisecond)
		sample()
		if cycles%10 == 0 {
			t.Logf("%d cycles in %v", cycles, time.Since(start).Round(time.Second))
		}
	}
	c.alive(t)
	t.Logf("%d cycles in %v", cycles, time.Since(start).Round(time.Second))
	var table strings.Builder
	fmt.Fprintf(&table, "%-4s %-30s %12s %12s %12s %14s %10s\n", "node", "metric", "start", "after warmup", "end", "slope/cycle", "limit")
	for node := 1; node <= 3; node++ {
		for _, k := range metrics {
			v := samples[node-1][k]
			w := min(max(soakWarmup, len(v)/5), len(v)-1)
			slope := leastSquaresSlope(v[w:])
			fmt.Fprintf(&table, "n%-3d %-30s %12.0f %12.0f %12.0f %14.2f %10g\n", node, k, v[0], v[w], v[len(v)-1], slope, soakLimits[k])
			if len(v)-w >= 10 && slope > soakLimits[k] {
				t.Errorf("n%d: %s grows by %.2f a cycle over %d cycles (limit %.0f)", node, k, slope, len(v)-1-w, soakLimits[k])
			}
		}
	}
	t.Logf("samples of every dsmd, one per cycle:\n%s", table.String())
	if cycles-max(soakWarmup, cycles/5) < 10 {
		t.Errorf("only %d cycles after the warm-up: too few to tell a leak; run longer", cycles-soakWarmup)
	}
	if *soakOut != "" {
		writeSoakCSV(t, *soakOut, metrics, samples)
	}
}

// soakCycle is one region life: create, use from every node, delete.
func soakCycle(t *testing.T, c *dsmCluster, n int) {
	region := fmt.Sprintf("soak-%d", n)
	const size = 16 << 20
	c.mustCtl(t, 1+n%3, "region", "create", region, "16MiB")
	c.createRegion(t, 1+n%3, region, size)
	seed := fmt.Sprint(n)
	c.mustClient(t, 1, region, "fill", "0", "0x100000", seed)
	c.mustClient(t, 2, region, "check", "0", "0x100000", seed)
	var adds []string
	for node := 1; node <= 3; node++ {
		adds = append(adds, c.mustClient(t, node, region, "add", "0x200000", "1", "20"))
	}
	sort.Strings(adds)
	if adds[2] != "60" {
		t.Errorf("cycle %d: adds from 3 nodes end at %v; want the last at 60", n, adds)
	}
	for node := 1; node <= 3; node++ {
		c.mustClient(t, node, region, "mutex-inc", "0x300000", "5", "0x301000")
	}
	if got := c.mustClient(t, 3, region, "read-u64", "0x301000"); got != "15" {
		t.Errorf("cycle %d: mutex-protected counter %s, want 15", n, got)
	}
	c.mustClient(t, 1+n%3, region, "history", "20", seed, "0x400000", "0x400008")
	c.mustCtl(t, 2, "region", "list")
	c.mustCtl(t, 3, "region", "info", region)
	c.mustCtl(t, 1, "pages", region)
	// Delete while a process on one node still maps the region.
	hold := c.startClient(t, 1+(n+1)%3, region, "hold")
	if l := hold.next(t); l != "mapped" {
		t.Fatalf("cycle %d: hold client says %q", n, l)
	}
	c.mustCtl(t, 1+(n+2)%3, "region", "rm", region, "--force")
	if l := hold.next(t); !strings.HasPrefix(l, "dead:") {
		t.Errorf("cycle %d: the mapping of the deleted region says %q", n, l)
	}
	select {
	case <-hold.done:
	case <-time.After(clientHang):
		t.Errorf("cycle %d: the hold client did not exit after its region was deleted", n)
	}
}

// leastSquaresSlope is the slope of the least-squares line through the
// points (i, v[i]).
func leastSquaresSlope(v []float64) float64 {
	n := float64(len(v))
	if n < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i, y := range v {
		x := float64(i)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return math.NaN()
	}
	return (n*sxy - sx*sy) / d
}

func writeSoakCSV(t *testing.T, path string, metrics []string, samples []map[string][]float64) {
	var b strings.Builder
	b.WriteString("cycle")
	for node := range samples {
		for _, k := range metrics {
			fmt.Fprintf(&b, ",n%d_%s", node+1, k)
		}
	}
	b.WriteString("\n")
	for i := range samples[0][metrics[0]] {
		fmt.Fprint(&b, i)
		for node := range samples {
			for _, k := range metrics {
				fmt.Fprintf(&b, ",%.0f", samples[node][k][i])
			}
		}
		b.WriteString("\n")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
