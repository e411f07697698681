package tests

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// smallCacheNode runs with a page cache of smallCache bytes; the other
// nodes keep the default.
const (
	smallCacheNode = 3
	smallCache     = 512 << 10
)

// TestCoherentMemory runs the coherent address space across three real
// dsmd processes on loopback, each subtest on a region of its own and
// dsmclient processes as the applications.
func TestCoherentMemory(t *testing.T) {
	t.Parallel() // its own cluster, and nothing in it depends on timing
	c := startClusterWith(t, 3, map[int][]string{smallCacheNode: {"--cache-size", fmt.Sprint(smallCache)}})
	c.waitHealthy(1)
	c.waitHealthy(3)

	t.Run("BytesAcrossNodes", func(t *testing.T) { testBytesAcrossNodes(t, c) })
	t.Run("AddFromAllNodes", func(t *testing.T) { testAddFromAllNodes(t, c) })
	t.Run("MutexIncrement", func(t *testing.T) { testMutexIncrement(t, c) })
	t.Run("SameNodeNoMessages", func(t *testing.T) { testSameNodeNoMessages(t, c) })
	t.Run("KilledClient", func(t *testing.T) { testKilledClient(t, c) })
	t.Run("OneTiB", func(t *testing.T) { testOneTiB(t, c) })
	t.Run("EvictionSmallCache", func(t *testing.T) { testEviction(t, c) })
	t.Run("Linearizable", func(t *testing.T) { testLinearizable(t, c) })
	c.alive(t)
}

func u64hex(v uint64) string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	return hex.EncodeToString(b[:])
}

func parseU64(t *testing.T, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return v
}

// repls starts one repl client per node on region and returns them by
// node number (index 0 unused).
func repls(t *testing.T, c *dsmCluster, region string) []*clientProc {
	t.Helper()
	r := make([]*clientProc, len(c.nodes)+1)
	for i := 1; i <= len(c.nodes); i++ {
		r[i] = c.startClient(t, i, region, "repl")
	}
	return r
}

// (a) A store through Bytes() on one node is what a load through Bytes()
// reads on the others, in both directions. The readers keep their
// mappings (and Shared copies) open while the value changes.
func testBytesAcrossNodes(t *testing.T, c *dsmCluster) {
	const region = "bytes"
	c.createRegion(t, 1, region, 1<<20)
	r := repls(t, c, region)
	offs := []string{"0", "5000", "1048560"} // first page, a middle page, the last 16 bytes
	first := "00112233445566778899aabbccddeeff"
	for _, off := range offs {
		r[1].call(t, "put-bytes "+off+" "+first)
	}
	for _, node := range []int{2, 3} {
		for _, off := range offs {
			if got := r[node].call(t, "get-bytes "+off+" 16"); got != first {
				t.Fatalf("n%d reads %s at %s after n1 wrote %s", node, got, off, first)
			}
		}
	}
	// n3 writes over what n1 and n2 now hold Shared: they must see it.
	second := "f0e1d2c3b4a5968778695a4b3c2d1e0f"
	r[3].call(t, "put-bytes 5000 "+second)
	for _, node := range []int{1, 2} {
		if got := r[node].call(t, "get-bytes 5000 16"); got != second {
			t.Fatalf("n%d reads %s after n3 wrote %s", node, got, second)
		}
	}
	// And back: n1 writes, n3 (which held the page Modified) sees it; the
	// untouched neighbours are unchanged.
	r[1].call(t, "put-bytes 5008 0a0b")
	want := "0000000000000000" + second[:16] + "0a0b" + second[20:] + "0000000000000000"
	for _, node := range []int{3, 2} {
		if got := r[node].call(t, "get-bytes 4992 32"); got != want {
			t.Fatalf("n%d reads %s around 5000, want %s", node, got, want)
		}
	}
	// A fresh process on n2 maps the region and reads the same.
	if got := c.mustClient(t, 2, region, "get-bytes", "4992", "32"); got != want {
		t.Fatalf("a new client on n2 reads %s, want %s", got, want)
	}
}

// runAll runs one dsmclient per (node, args) at once and returns their
// outputs in order.
func runAll(t *testing.T, c *dsmCluster, region string, nodes []int, args func(i int) []string) []string {
	t.Helper()
	outs := make([]string, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, node := range nodes {
		wg.Go(func() { outs[i], errs[i] = c.client(node, region, args(i)...) })
	}
	wg.Wait()
	failed := false
	for i, err := range errs {
		if err != nil {
			t.Errorf("client %d of %d: %v", i+1, len(nodes), err)
			failed = true
		}
	}
	if failed {
		c.alive(t)
		t.FailNow()
	}
	for i := range outs {
		outs[i] = strings.TrimSpace(outs[i])
	}
	return outs
}

// (b) AddUint64 from clients on every node (two on n1) sums exactly, on a
// word of the first page and one of another page.
func testAddFromAllNodes(t *testing.T, c *dsmCluster) {
	const region, n = "add", 150
	c.createRegion(t, 2, region, 1<<20)
	nodes := []int{1, 2, 3, 1}
	outs := runAll(t, c, region, nodes, func(i int) []string {
		if i%2 == 0 {
			return []string{"add", "8", "1", fmt.Sprint(n)}
		}
		return []string{"add", "65536", "3", fmt.Sprint(n)}
	})
	// The last Add to complete on each word returns the total.
	var max8, max64k uint64
	for i, o := range outs {
		v := parseU64(t, o)
		if i%2 == 0 {
			max8 = max(max8, v)
		} else {
			max64k = max(max64k, v)
		}
	}
	want8, want64k := uint64(2*n), uint64(2*3*n)
	if max8 != want8 || max64k != want64k {
		t.Fatalf("largest results of Add: %d and %d, want %d and %d (outputs %v)", max8, max64k, want8, want64k, outs)
	}
	want := fmt.Sprintf("%d %d", want8, want64k)
	for node := 1; node <= 3; node++ {
		if got := c.mustClient(t, node, region, "read-u64", "8", "65536"); got != want {
			t.Fatalf("n%d reads %q at 8 and 65536, want %q", node, got, want)
		}
	}
}

// (c) A ticket Mutex makes plain read-increment-writes through Bytes()
// exact across processes on every node, for a counter on the lock's page
// and one on a page of its own.
func testMutexIncrement(t *testing.T, c *dsmCluster) {
	const region, n = "mutex", 50
	c.createRegion(t, 3, region, 1<<20)
	nodes := []int{1, 2, 3, 2}
	runAll(t, c, region, nodes, func(int) []string {
		return []string{"mutex-inc", "0", fmt.Sprint(n), "96", "8192"}
	})
	want := fmt.Sprintf("%d %d", len(nodes)*n, len(nodes)*n)
	for node := 1; node <= 3; node++ {
		if got := c.mustClient(t, node, region, "read-u64", "96", "8192"); got != want {
			t.Fatalf("counters on n%d: %q, want %q", node, got, want)
		}
	}
	// The lock is free: both ticket words agree.
	h := c.mustClient(t, 1, region, "get-bytes", "0", "16")
	if h[:16] != h[16:] {
		t.Fatalf("lock words after all Unlocks: %s", h)
	}
}

// (d) Two processes on one node share the page: each sees the other's
// stores at once, and the node's coherence counters do not move.
func testSameNodeNoMessages(t *testing.T, c *dsmCluster) {
	const region, node = "local", 2
	c.createRegion(t, node, region, 1<<20)
	a := c.startClient(t, node, region, "repl")
	b := c.startClient(t, node, region, "repl")
	// a holds the page Modified on this node.
	a.call(t, "put-bytes 4096 "+u64hex(1))
	if got := a.call(t, "get-bytes 4096 8"); got != u64hex(1) {
		t.Fatalf("a reads back %s", got)
	}
	before, via := c.counters(t, node)
	msgsBefore := c.protocolMessages(t, node)
	if got := b.call(t, "get-bytes 4096 8"); got != u64hex(1) {
		t.Fatalf("b reads %s after a stored 1", got)
	}
	a.call(t, "put-bytes 4096 "+u64hex(2))
	if got := b.call(t, "get-bytes 4096 8"); got != u64hex(2) {
		t.Fatalf("b reads %s after a stored 2", got)
	}
	b.call(t, "put-bytes 4100 ff")
	if got := a.call(t, "get-bytes 4096 8"); got != "02000000ff000000" {
		t.Fatalf("a reads %s after b stored ff at 4100", got)
	}
	after, _ := c.counters(t, node)
	if msgs := c.protocolMessages(t, node); !maps.Equal(msgsBefore, msgs) {
		t.Fatalf("n%d exchanged coherence messages while only its own processes used a page it holds:\nbefore %v\nafter  %v", node, msgsBefore, msgs)
	}
	if !maps.Equal(before, after) {
		t.Fatalf("n%d's coherence counters (from %s) moved while only its own processes used a page it holds:\nbefore %v\nafter  %v", node, via, before, after)
	}
	t.Logf("n%d's counters from %s, unchanged: %v", node, via, after)
	// The counters do count: another node reading the page moves them.
	if got := c.mustClient(t, 3, region, "get-bytes", "4096", "8"); got != "02000000ff000000" {
		t.Fatalf("n3 reads %s", got)
	}
	if later, _ := c.counters(t, node); maps.Equal(after, later) {
		t.Fatalf("n%d's counters (from %s) did not move when n3 read its Modified page: %v", node, via, later)
	}
	if msgs := c.protocolMessages(t, node); maps.Equal(msgsBefore, msgs) {
		t.Fatalf("n%d's protocol message counters did not move when n3 read its Modified page: %v", node, msgs)
	}
}

// (e) Clients killed while they map the region, and while they are in
// the middle of faults, leave dsmd serving it.
func testKilledClient(t *testing.T, c *dsmCluster) {
	const region, node = "killed", 1
	const span = 16 << 20
	c.createRegion(t, node, region, span)
	holder := c.startClient(t, node, region, "hold")
	if l := holder.next(t); l != "mapped" {
		t.Fatalf("hold says %q", l)
	}
	holder.kill(t)
	for round := range 3 {
		// n2 takes pages away meanwhile, so that the loop keeps faulting.
		loop := c.startClient(t, node, region, "fault-loop", "0", fmt.Sprint(span))
		if l := loop.next(t); l != "started" {
			t.Fatalf("fault-loop says %q", l)
		}
		c.mustClient(t, 2, region, "touch-sparse", "8", "4194312", "12582920")
		time.Sleep(time.Duration(20*(round+1)) * time.Millisecond) // let it reach some faults; not asserted
		loop.kill(t)
	}
	c.alive(t)
	// dsmd lets go of the dead clients' mappings.
	eventually(t, "n1 serves no client mapping after the kills", clientHang, func() error {
		if v := c.metricsOf(t, node)["dsm_cache_clients"]; v != 0 {
			return fmt.Errorf("dsm_cache_clients %v", v)
		}
		return nil
	})
	// Another client on the same node reads and writes, and n2 sees it.
	after := c.startClient(t, node, region, "repl")
	other := c.startClient(t, 2, region, "repl")
	if got := after.call(t, "read-u64 8 4194312 12582920"); got != "8 4194312 12582920" {
		t.Fatalf("n1 reads %q after the kills", got)
	}
	for i, off := range []string{"0", "8388608", fmt.Sprint(span - 16)} {
		v := u64hex(uint64(0x0102030405060700 + i))
		after.call(t, "put-bytes "+off+" "+v)
		if got := after.call(t, "get-bytes "+off+" 8"); got != v {
			t.Fatalf("n1 reads %s at %s after the kills, want %s", got, off, v)
		}
		if got := other.call(t, "get-bytes "+off+" 8"); got != v {
			t.Fatalf("n2 reads %s at %s written by n1 after the kills, want %s", got, off, v)
		}
	}
	c.alive(t)
}

// (f) A 1 TiB region is created and mapped; pages far apart are written
// on one node and read on the others.
func testOneTiB(t *testing.T, c *dsmCluster) {
	const region = "tib"
	c.createRegion(t, 1, region, int64(1)<<40)
	offs := []string{"0", fmt.Sprint(1<<30 + 8), fmt.Sprint(int64(1) << 39), fmt.Sprint(int64(777)<<30 + 3*4096 + 16), fmt.Sprint(int64(1)<<40 - 8)}
	c.mustClient(t, 1, region, append([]string{"touch-sparse"}, offs...)...)
	want := strings.Join(offs, " ")
	for _, node := range []int{2, 3} {
		if got := c.mustClient(t, node, region, append([]string{"read-u64"}, offs...)...); got != want {
			t.Fatalf("n%d reads\n%s\nwant\n%s", node, got, want)
		}
	}
	more := []string{fmt.Sprint(int64(500) << 30), fmt.Sprint(int64(1)<<40 - 4096)}
	c.mustClient(t, 3, region, append([]string{"touch-sparse"}, more...)...)
	if got := c.mustClient(t, 1, region, append([]string{"read-u64"}, more...)...); got != strings.Join(more, " ") {
		t.Fatalf("n1 reads %q", got)
	}
}

// (g) The node with a small cache writes four times more pages than fit:
// evicted pages are written back, and every node reads them all.
func testEviction(t *testing.T, c *dsmCluster) {
	const region, span, seed = "evict", 4 * smallCache, "7"
	c.createRegion(t, smallCacheNode, region, span)
	before, via := c.counters(t, smallCacheNode)
	if got := c.mustClient(t, smallCacheNode, region, "fill", "0", fmt.Sprint(span), seed); got != "ok" {
		t.Fatal(got)
	}
	after, _ := c.counters(t, smallCacheNode)
	if after.evictions() <= before.evictions() {
		t.Fatalf("n%d (cache %d bytes) wrote %d bytes and evicted nothing (counters from %s: %v)", smallCacheNode, smallCache, span, via, after)
	}
	if after["writeback"]+after["writebacks"] <= before["writeback"]+before["writebacks"] {
		t.Fatalf("n%d evicted pages it had written without writing any back (counters from %s: %v)", smallCacheNode, via, after)
	}
	for _, node := range []int{1, smallCacheNode} {
		if got := c.mustClient(t, node, region, "check", "0", fmt.Sprint(span), seed); got != "ok" {
			t.Fatalf("n%d: %s", node, got)
		}
	}
}
