package tests

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRegionLifecycle drives a region's life through dsmctl and client
// processes on a real three-node cluster: delete refuses while a process
// maps the region and cuts the mapping off when forced, a name created
// again is a new empty region on every node, dsmctl bench runs twice,
// memory goes back to the OS after a delete, the largest region works
// with every command, and a region too large is refused in one line.
func TestRegionLifecycle(t *testing.T) {
	c := startClusterWith(t, 3, nil)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	t.Run("recreate", func(t *testing.T) { testRecreate(t, c) })
	t.Run("bench-twice", func(t *testing.T) { testBenchTwice(t, c) })
	t.Run("memory-back", func(t *testing.T) { testMemoryBack(t, c) })
	t.Run("largest", func(t *testing.T) { testLargest(t, c) })
	c.alive(t)
}

func (c *dsmCluster) mustCtl(t *testing.T, node int, args ...string) string {
	t.Helper()
	out, errs, code := c.ctl(node, args...)
	if code != 0 {
		t.Logf("dsmctl %v on n%d: exit %d: %s", args, node, code, errs)
		c.alive(t)
		t.Fatalf("dsmctl %v on n%d: exit %d: %s", args, node, code, errs)
	}
	return out
}

func testRecreate(t *testing.T, c *dsmCluster) {
	const region = "demo"
	c.mustCtl(t, 1, "region", "create", region, "16MiB")
	if out := c.mustCtl(t, 2, "region", "create", region, "16MiB"); !strings.Contains(out, "exists") || !strings.Contains(out, "same spec") {
		t.Errorf("create of an existing region with the same spec says %q", out)
	}
	c.createRegion(t, 1, region, 16<<20) // waits for every replica
	c.mustCtl(t, 1, "put", region, "4096", "hello-from-n1")
	c.mustCtl(t, 1, "put", region, "0x800000", "hello-again")
	if out := c.mustCtl(t, 2, "get", region, "4096", "13"); !strings.Contains(out, "hello-from-n1") {
		t.Fatalf("n2 reads %q", out)
	}
	// A process on n3 maps the region.
	hold := c.startClient(t, 3, region, "hold")
	if l := hold.next(t); l != "mapped" {
		t.Fatalf("hold client says %q", l)
	}
	_, errs, code := c.ctl(1, "region", "rm", region)
	if code == 0 || !strings.Contains(errs, "n3") || strings.Count(strings.TrimSpace(errs), "\n") > 1 {
		t.Fatalf("rm of a mapped region: exit %d, %q; want a refusal naming the mapping on n3", code, errs)
	}
	if out := c.mustCtl(t, 1, "region", "rm", region, "--force"); !strings.Contains(out, "1 mapping") {
		t.Errorf("rm --force says %q; want the mapping it cut off counted", out)
	}
	if l := hold.next(t); !strings.HasPrefix(l, "dead:") || !strings.Contains(l, "deleted") {
		t.Fatalf("the mapping of the deleted region says %q; want it dead because the region was deleted", l)
	}

	// The same name again: a new region, zeros everywhere, through dsmctl
	// and through the library.
	c.mustCtl(t, 2, "region", "create", region, "16MiB")
	c.createRegion(t, 2, region, 16<<20)
	zeros := strings.Repeat("0", 2*13)
	for node := 1; node <= 3; node++ {
		eventually(t, fmt.Sprintf("n%d serves the new %s", node, region), clientHang, func() error {
			out, errs, code := c.ctl(node, "get", region, "4096", "13")
			if code != 0 {
				return fmt.Errorf("exit %d: %s", code, errs)
			}
			if strings.Contains(out, "hello") {
				t.Fatalf("n%d reads the deleted region's bytes through dsmctl: %q", node, out)
			}
			return nil
		})
		for _, off := range []string{"4096", "0x800000"} {
			if got := c.mustClient(t, node, region, "get-bytes", off, "13"); got != zeros {
				t.Fatalf("n%d maps the re-created region and reads %s at %s; want zeros", node, got, off)
			}
		}
	}
	c.mustCtl(t, 3, "region", "rm", region)
}

func testBenchTwice(t *testing.T, c *dsmCluster) {
	for i := range 2 {
		if out, errs, code := c.ctl(1, "bench", "--ops", "200"); code != 0 {
			t.Fatalf("bench run %d: exit %d: %s\n%s", i+1, code, errs, out)
		}
	}
}

// rss is a process's resident memory in bytes (VmRSS), shared memory
// mapped included.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS for pid %d", pid)
	return 0
}

func testMemoryBack(t *testing.T, c *dsmCluster) {
	const region, span = "mem", 16 << 20
	c.createRegion(t, 1, region, 64<<20)
	c.mustClient(t, 1, region, "fill", "0", fmt.Sprint(span), "11")
	c.mustClient(t, 2, region, "check", "0", fmt.Sprint(span/4), "11")
	pid := func(node int) int { return c.nodes[node-1].cmd.Process.Pid }
	before := map[int]int64{}
	for node := 1; node <= 2; node++ {
		before[node] = rss(t, pid(node))
	}
	if cached := cachedBytes(t, c, 1); cached < span/2 {
		t.Fatalf("n1 caches %.0f bytes after writing %d; the test needs them cached", cached, span)
	}
	c.mustCtl(t, 3, "region", "rm", region)
	// n1 held the written pages (Modified), n2 a quarter of them
	// (Shared): each gets at least half of that back.
	for node, held := range map[int]int64{1: span, 2: span / 4} {
		eventually(t, fmt.Sprintf("n%d gives the deleted region's memory back", node), clientHang, func() error {
			after := rss(t, pid(node))
			cached := cachedBytes(t, c, node)
			t.Logf("n%d: RSS %d KiB before the delete, %d KiB after; cache gauge %.0f bytes", node, before[node]>>10, after>>10, cached)
			if cached != 0 || before[node]-after < held/2 {
				return fmt.Errorf("RSS %d -> %d bytes, cache gauge %.0f", before[node], after, cached)
			}
			return nil
		})
	}
}

// cachedBytes is the page cache's resident pages gauge of a node, in
// bytes.
func cachedBytes(t *testing.T, c *dsmCluster, node int) float64 {
	return 4096 * c.metricsOf(t, node)[`dsm_cache_pages{kind="resident"}`]
}

func testLargest(t *testing.T, c *dsmCluster) {
	const region = "max"
	_, errs, code := c.ctl(1, "region", "create", "toolarge", "17TiB")
	if code == 0 || strings.Count(strings.TrimSpace(errs), "\n") != 0 || !strings.Contains(errs, "16 TiB") {
		t.Fatalf("create of 17 TiB: exit %d, %q; want one line that names the largest size", code, errs)
	}
	c.mustCtl(t, 1, "region", "create", region, "16TiB")
	c.createRegion(t, 1, region, 16<<40)
	last := fmt.Sprint(int64(16<<40) - 4096)
	c.mustCtl(t, 1, "put", region, last, "the-last-page")
	eventually(t, "n3 reads the last page of the largest region", clientHang, func() error {
		out, errs, code := c.ctl(3, "get", region, last, "13")
		if code != 0 {
			return fmt.Errorf("exit %d: %s", code, errs)
		}
		if !strings.Contains(out, "the-last-page") {
			t.Fatalf("n3 reads %q", out)
		}
		return nil
	})
	if out := c.mustCtl(t, 2, "region", "info", region); !strings.Contains(out, "8388608") {
		t.Errorf("region info of the largest region does not count its 8388608 shards:\n%s", out)
	}
	// The cluster view from n2, which holds nothing, finds the last page
	// (2^32 pages from the first) Shared by n1 and n3.
	if out := c.mustCtl(t, 2, "pages", region); !strings.Contains(out, "pages   M 0 · S 1 ") || !strings.Contains(out, ".2\n") {
		t.Errorf("pages of the largest region does not show its one page shared at two nodes:\n%s", out)
	}
	c.mustCtl(t, 2, "status")
	start := time.Now()
	c.mustCtl(t, 1, "region", "rm", region)
	t.Logf("deleted a 16 TiB region in %v", time.Since(start))
}
