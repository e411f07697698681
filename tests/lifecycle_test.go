package tests

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
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
	t.Parallel() // its own cluster, and nothing in it depends on timing
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

func testMemoryBack(t *testing.T, c *dsmCluster) {
	const region, span = "mem", 16 << 20
	c.createRegion(t, 1, region, 64<<20)
	c.mustClient(t, 1, region, "fill", "0", fmt.Sprint(span), "11")
	c.mustClient(t, 2, region, "check", "0", fmt.Sprint(span/4), "11")
	pid := func(node int) int { return c.nodes[node-1].cmd.Process.Pid }
	before := map[int]regionMemory{}
	for node := 1; node <= 3; node++ {
		before[node] = memoryOf(t, pid(node), region)
	}
	if cached := cachedBytes(t, c, 1); cached < span/2 {
		t.Fatalf("n1 caches %.0f bytes after writing %d; the test needs them cached", cached, span)
	}
	// n1 held the written pages (Modified), n2 a quarter of them
	// (Shared): each page cache has at least half of that in the
	// region's memfd before the delete. The quarter n2 read was written
	// back to the pages' homes and backups: two copies of 4 MiB in home
	// slots, somewhere in the cluster.
	held := map[int]int64{1: span, 2: span / 4}
	for node, h := range held {
		if m := before[node]; !m.open || m.cache < h/2 {
			t.Fatalf("n%d before the delete: %v; the test needs at least %d bytes in the memfd", node, m, h/2)
		}
	}
	c.mustCtl(t, 3, "region", "rm", region)
	// After it, every memfd of the region is closed (its memory is the
	// kernel's again) and the home slots committed to anonymous memory
	// are unmapped. These are measured from /proc, not from the
	// process's resident size, whose Go heap (and, under the race
	// detector, shadow memory) moves by more than a 16 MiB region.
	var dropped int64
	for node := 1; node <= 3; node++ {
		eventually(t, fmt.Sprintf("n%d gives the deleted region's memory back", node), clientHang, func() error {
			after := memoryOf(t, pid(node), region)
			cached := cachedBytes(t, c, node)
			t.Logf("n%d before the delete: %v; after: %v; cache gauge %.0f bytes", node, before[node], after, cached)
			if cached != 0 || after.open || after.slots > before[node].slots {
				return fmt.Errorf("%v, cache gauge %.0f", after, cached)
			}
			dropped += before[node].slots - after.slots
			return nil
		})
	}
	if dropped < span/4 {
		t.Errorf("the home slots resident in the cluster dropped by %d bytes with the delete; want at least %d (two copies of the 4 MiB written back)", dropped, span/4)
	}
}

// regionMemory is what a dsmd holds for a region, as the kernel counts
// it: the bytes allocated to the region's page cache memfd (whether or not
// the daemon maps them: it fills pages with pwrite) and the resident bytes
// of the daemon's private MAP_NORESERVE mappings, which are the home slots
// of every region (rdma.Alloc) and nothing else of the Go runtime's.
type regionMemory struct {
	open  bool  // a descriptor of the region's memfd is open
	cache int64 // bytes allocated to the memfd
	slots int64 // resident bytes of the home-slot mappings, all regions
}

func (m regionMemory) String() string {
	return fmt.Sprintf("memfd open %v with %d KiB, home slots %d KiB resident", m.open, m.cache>>10, m.slots>>10)
}

// memoryOf measures regionMemory of process pid for region name. The
// race detector's shadow memory is also MAP_NORESERVE; it lies in
// [0x200000000000, 0x400000000000) on linux/amd64 and is left out.
func memoryOf(t *testing.T, pid int, name string) regionMemory {
	t.Helper()
	var m regionMemory
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		path := fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())
		target, err := os.Readlink(path)
		if err != nil || !strings.HasPrefix(target, "/memfd:dsm-"+name+" ") {
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err == nil {
			m.open, m.cache = true, m.cache+st.Blocks*512
		}
	}
	smaps, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		t.Fatal(err)
	}
	var rss int64
	var anon bool
	for _, l := range strings.Split(string(smaps), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			start, _ := strconv.ParseUint(strings.Split(f[0], "-")[0], 16, 64)
			anon = len(f) == 5 && (start < 0x200000000000 || start >= 0x400000000000)
		case len(f) == 3 && f[0] == "Rss:":
			rss, _ = strconv.ParseInt(f[1], 10, 64)
		case len(f) >= 1 && f[0] == "VmFlags:":
			if anon && slices.Contains(f[1:], "nr") {
				m.slots += rss << 10
			}
		}
	}
	return m
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
