package tests

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// threeNodesWithRegion starts a healthy three-node cluster with a 16 MiB
// region and returns it with the first page of a shard homed at each node.
func threeNodesWithRegion(t *testing.T, region string) (*dsmCluster, map[uint32]uint64) {
	t.Helper()
	return threeNodesWithRegionArgs(t, region, nil)
}

// threeNodesWithRegionArgs is threeNodesWithRegion with extra dsmd flags
// by node (1..3).
func threeNodesWithRegionArgs(t *testing.T, region string, extra map[int][]string) (*dsmCluster, map[uint32]uint64) {
	t.Helper()
	c := startClusterWith(t, 3, extra)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	c.createRegion(t, 1, region, 16<<20)
	homes := c.homedPages(t, 1, region)
	if len(homes) != 3 {
		t.Fatalf("the shards of %s are homed at %v; want every node", region, homes)
	}
	return c, homes
}

// shardInfo is one shard of `dsmctl region info --json`: where the data
// plane places it.
type shardInfo struct {
	FirstPage uint64   `json:"first_page"`
	Home      uint32   `json:"home"`
	HomeLost  bool     `json:"home_lost"`
	Backups   []uint32 `json:"backups"`
}

// shards returns the placement of every shard of region, as node sees it.
func (c *dsmCluster) shards(t *testing.T, node int, region string) []shardInfo {
	t.Helper()
	var info struct {
		Shards []shardInfo `json:"shards"`
	}
	c.ctlJSON(node, &info, "region", "info", region, "--shards", "0:")
	return info.Shards
}

// homedPages returns, from `region info`, the first page of a shard homed
// at each node.
func (c *dsmCluster) homedPages(t *testing.T, node int, region string) map[uint32]uint64 {
	t.Helper()
	out := map[uint32]uint64{}
	for _, s := range c.shards(t, node, region) {
		if _, ok := out[s.Home]; !ok {
			out[s.Home] = s.FirstPage
		}
	}
	return out
}

// firstShardCopies returns the first page of region's shard 0 and the two
// nodes that hold its copies (home and backup), and the third, which
// holds none, in a three-node cluster.
func (c *dsmCluster) firstShardCopies(t *testing.T, region string) (first uint64, home, backup, other int) {
	t.Helper()
	sh := c.shards(t, 1, region)[0]
	if len(sh.Backups) != 1 || sh.Home == 0 || sh.Backups[0] == sh.Home {
		t.Fatalf("shard 0 is homed at n%d with backups %v", sh.Home, sh.Backups)
	}
	home, backup = int(sh.Home), int(sh.Backups[0])
	return sh.FirstPage, home, backup, 6 - home - backup
}

// killAndRestart kills the dsmd of every node given with kill -9, all
// before any restarts, then starts each again from its data directory.
func (c *cluster) killAndRestart(t testing.TB, nodes ...int) {
	t.Helper()
	for _, i := range nodes {
		if err := c.nodes[i-1].cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range nodes {
		q := c.nodes[i-1]
		<-q.done
		q.log.Reset()
		q.start(t)
	}
}

// incarnationOf is node's incarnation in the member table, as node on
// sees it.
func (c *dsmCluster) incarnationOf(t *testing.T, on, node int) uint64 {
	t.Helper()
	var members struct {
		Members []struct {
			Node        uint32 `json:"node_id"`
			Incarnation uint64 `json:"incarnation"`
		} `json:"members"`
	}
	c.ctlJSON(on, &members, "members")
	for _, m := range members.Members {
		if int(m.Node) == node {
			return m.Incarnation
		}
	}
	return 0
}

// TestKilledHomeFailsOver kills the home of some pages with kill -9 and
// does not restart it. Until the directory declares it failed, accesses
// to the pages it was home of wait or fail with one line that names the
// page and "unavailable", and never return other data. Once it is
// declared failed (a departure: its leases were fenced first), the shards
// it was home of move to their backups, which serve every page written
// back before the kill on every survivor (a mapped ReadAt issued right
// after the kill waits through the failover and returns them: the no-hang
// bound, design §10); the page it held Modified
// without Sync is served as last written back (its store died with it);
// the survivors' own pages are served throughout. It then restarts from
// its data directory as a new incarnation that reads and writes
// everything.
func TestKilledHomeFailsOver(t *testing.T) {
	const region = "fo"
	c, homes := threeNodesWithRegion(t, region)
	offOf := func(home uint32) string { return strconv.FormatUint(homes[home]*4096, 10) }
	for h := uint32(1); h <= 3; h++ {
		c.mustCtl(t, 1, "put", region, offOf(h), fmt.Sprintf("homed-at-n%d", h))
	}
	// n2 reads them all once (n1 writes its copies back to the homes and
	// their backups).
	for h := uint32(1); h <= 3; h++ {
		if out := c.mustCtl(t, 2, "get", region, offOf(h), "11"); !strings.Contains(out, fmt.Sprintf("homed-at-n%d", h)) {
			t.Fatalf("n2 reads %q at the page homed at n%d", out, h)
		}
	}

	// A page homed at n1, written back there ("v1"), then taken Modified
	// by n3 without Sync.
	held := strconv.FormatUint((homes[1]+2)*4096, 10)
	c.mustCtl(t, 1, "put", region, held, "v1-by-n1")
	if out := c.mustCtl(t, 2, "get", region, held, "8"); !strings.Contains(out, "v1-by-n1") {
		t.Fatalf("n2 reads %q", out)
	}
	c.mustCtl(t, 3, "put", region, held, "v3-unsynced")
	// A page homed at n3 that only n3 wrote, synced: at its home and its
	// backup, in no other cache.
	synced := strconv.FormatUint((homes[3]+3)*4096, 10)
	c.mustCtl(t, 3, "put", region, synced, "synced-by-n3", "--sync")

	// A client of n1 with a mapping of the region (the default fault
	// timeout, 30 s), started before the kill.
	reader := c.startClient(t, 1, region, "repl")

	victim := c.nodes[2]
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	<-victim.done

	// The no-hang bound across a real failover (must-hold 5): the client's
	// ReadAt of the synced page, which n1 never held, issued while its home
	// is dead, waits through the failover (its misses fail as unavailable
	// until the failure verdict moves the shard to its backup) and then
	// returns the synced data: neither an error nor a wait past the fault
	// timeout. Nothing reads that page through n1 before it.
	asked := time.Now()
	if got, want := reader.try(t, "read-at "+synced+" 12"), hex.EncodeToString([]byte("synced-by-n3")); got != want {
		t.Fatalf("n1's mapped ReadAt of the page synced at the dead n3, issued %v after the kill: %q; want %s (synced-by-n3)",
			asked.Sub(killed).Round(time.Millisecond), got, want)
	}
	t.Logf("n1's mapped ReadAt, issued %v after the kill, returned the synced data %v after the kill",
		asked.Sub(killed).Round(time.Millisecond), time.Since(killed).Round(100*time.Millisecond))

	// Through the failover, a read of the synced page returns its data or
	// fails as unavailable in one line; once n3 is declared failed, it is
	// served from its backup, on both survivors.
	for _, node := range []int{2, 1} {
		var failures []string
		eventually(t, fmt.Sprintf("n%d reads the page synced at the dead n3 from its backup", node), 60*time.Second, func() error {
			out, errs, code := c.ctl(node, "--timeout", "15s", "get", region, synced, "12")
			switch {
			case code == 0 && !strings.Contains(out, "synced-by-n3"):
				t.Fatalf("n%d reads %q at the page synced at the dead n3; want synced-by-n3", node, out)
			case code == 0:
				return nil
			}
			line := strings.TrimSpace(errs)
			if strings.Contains(line, "\n") || !strings.Contains(line, "unavailable") && !strings.Contains(line, "deadline") {
				t.Errorf("n%d's read during the failover failed unclearly: exit %d, %q", node, code, line)
			}
			failures = append(failures, line)
			return fmt.Errorf("exit %d: %s", code, line)
		})
		t.Logf("n%d reads the page of the dead n3 %v after the kill (%d failed reads before: %q)",
			node, time.Since(killed).Round(100*time.Millisecond), len(failures), failures)
		if out := c.mustCtl(t, node, "get", region, offOf(3), "11"); !strings.Contains(out, "homed-at-n3") {
			t.Fatalf("n%d reads %q at the page homed at the dead n3; want its last write-back, homed-at-n3", node, out)
		}
	}
	var members struct {
		Members []struct {
			Node        uint32 `json:"node_id"`
			State       string `json:"state"`
			Incarnation uint64 `json:"incarnation"`
			ProtoID     uint32 `json:"proto_id"`
		} `json:"members"`
	}
	c.ctlJSON(1, &members, "members")
	for _, m := range members.Members {
		if m.Node == 3 && m.State != "failed" && m.State != "dead" {
			t.Errorf("dsmctl members after the failover: n3 is %s, want failed", m.State)
		}
	}
	// A page of that shard nobody wrote reads as zeros (it is one), and
	// the moved pages take writes.
	untouched := strconv.FormatUint((homes[3]+1)*4096, 10)
	if out := c.mustCtl(t, 1, "get", region, untouched, "4", "--raw"); out != "\x00\x00\x00\x00" {
		t.Fatalf("n1 reads %q at a page never written", out)
	}
	c.mustCtl(t, 1, "put", region, offOf(3), "moved-by-n1")
	c.mustCtl(t, 2, "put", region, untouched, "fresh-by-n2")
	for _, node := range []int{1, 2} {
		if out := c.mustCtl(t, node, "get", region, offOf(3), "11"); !strings.Contains(out, "moved-by-n1") {
			t.Fatalf("n%d reads %q after n1's write of a moved page", node, out)
		}
		if out := c.mustCtl(t, node, "get", region, untouched, "11"); !strings.Contains(out, "fresh-by-n2") {
			t.Fatalf("n%d reads %q after n2's write of a moved page", node, out)
		}
	}
	// The survivors' pages are served, with their data, from both.
	for _, node := range []int{1, 2} {
		for h := uint32(1); h <= 2; h++ {
			out := c.mustCtl(t, node, "get", region, offOf(h), "11")
			if !strings.Contains(out, fmt.Sprintf("homed-at-n%d", h)) {
				t.Fatalf("n%d reads %q at the page homed at the live n%d", node, out, h)
			}
		}
	}
	// The page the dead n3 held Modified: its home repaired the word, and
	// serves the last data written back (n3's unsynced store died with
	// it).
	eventually(t, "n2 reads the page the dead n3 held, as last written back", 60*time.Second, func() error {
		out, errs, code := c.ctl(2, "get", region, held, "8")
		if code != 0 {
			return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
		}
		if !strings.Contains(out, "v1-by-n1") {
			t.Fatalf("n2 reads %q at the page the dead n3 held; want the last write-back, v1-by-n1", out)
		}
		return nil
	})
	c.mustCtl(t, 1, "put", region, held, "v2-by-n1")
	if out := c.mustCtl(t, 2, "get", region, held, "8"); !strings.Contains(out, "v2-by-n1") {
		t.Fatalf("n2 reads %q after n1's write", out)
	}

	// n3 restarts from its data directory: a new incarnation with empty
	// memory and a new protocol id, home of nothing, that reads what the
	// others wrote (its empty memory is nobody's data: that read zeros
	// before incarnations existed).
	victim.log.Reset()
	victim.start(t)
	c.waitAllAlive(3)
	eventually(t, "the restarted n3 reads the moved page", 60*time.Second, func() error {
		out, errs, code := c.ctl(3, "get", region, offOf(3), "11")
		if code != 0 {
			return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
		}
		if !strings.Contains(out, "moved-by-n1") {
			t.Fatalf("the restarted n3 reads %q at the moved page; want moved-by-n1", out)
		}
		return nil
	})
	if out := c.mustCtl(t, 3, "get", region, untouched, "11"); !strings.Contains(out, "fresh-by-n2") {
		t.Fatalf("the restarted n3 reads %q; want fresh-by-n2", out)
	}
	c.ctlJSON(1, &members, "members")
	for _, m := range members.Members {
		if want := map[bool]uint64{true: 2, false: 1}[m.Node == 3]; m.Incarnation != want || m.ProtoID == 0 || m.Node == 3 && m.ProtoID == 3 {
			t.Errorf("dsmctl members after n3's restart: n%d is incarnation %d, protocol id %d; want incarnation %d and a fresh id", m.Node, m.Incarnation, m.ProtoID, want)
		}
	}

	// Every shard has a live home, and none is lost; the shards whose
	// backup became home have a new backup (the member after it in their
	// chain), which their homes fill, and the new n3 is filled as the
	// extra backup of the shards it wins and then promoted to their home
	// (docs/failover.md §6): dsmctl status is degraded until they are
	// recorded complete, then healthy.
	for i, sh := range c.shards(t, 2, region) {
		if sh.HomeLost || sh.Home == 0 {
			t.Errorf("region info after n3's restart: shard %d homed at n%d, lost %t", i, sh.Home, sh.HomeLost)
		}
		if len(sh.Backups) < 1 || len(sh.Backups) > 2 || slices.Contains(sh.Backups, sh.Home) {
			t.Errorf("region info after n3's restart: shard %d homed at n%d has backups %v", i, sh.Home, sh.Backups)
		}
	}
	eventually(t, "dsmctl status is healthy once the new backups are filled", 60*time.Second, func() error {
		out, _, code := c.ctl(1, "status")
		if code != 0 {
			return fmt.Errorf("exit %d:\n%s", code, out)
		}
		return nil
	})
	// The new n3 reads and writes the region's other pages, through dsmctl
	// and through a mapping; n1 and n2 see its writes.
	if out := c.mustCtl(t, 3, "get", region, held, "8"); !strings.Contains(out, "v2-by-n1") {
		t.Fatalf("the restarted n3 reads %q at a page homed at n1; want v2-by-n1", out)
	}
	if got := c.mustClient(t, 3, region, "get-bytes", offOf(2), "11"); got != fmt.Sprintf("%x", "homed-at-n2") {
		t.Fatalf("the restarted n3 maps the region and reads %s at the page homed at n2", got)
	}
	c.mustCtl(t, 3, "put", region, offOf(2), "n3-new-life")
	for _, node := range []int{1, 2} {
		if out := c.mustCtl(t, node, "get", region, offOf(2), "11"); !strings.Contains(out, "n3-new-life") {
			t.Fatalf("n%d reads %q after the new n3's write", node, out)
		}
	}
	// Regions created after the restart are served everywhere.
	c.createRegion(t, 3, "fo2", 4<<20)
	c.mustCtl(t, 3, "put", "fo2", "8192", "new-life")
	for _, node := range []int{1, 2} {
		eventually(t, fmt.Sprintf("n%d reads fo2", node), 30*time.Second, func() error {
			out, errs, code := c.ctl(node, "get", "fo2", "8192", "8")
			if code != 0 {
				return fmt.Errorf("exit %d: %s", code, errs)
			}
			if !strings.Contains(out, "new-life") {
				t.Fatalf("n%d reads %q in fo2", node, out)
			}
			return nil
		})
	}
}

// TestSigtermWritesBack stops a node with SIGTERM right after it wrote
// pages homed on every node, without Sync: the drain writes them back
// before the node leaves, and the shards it was home of move to their
// backups once it has left, so the survivors read them all, with the pages
// homed there that another node held Modified. A process mapping a
// region there sees its mapping end with the reason.
func TestSigtermWritesBack(t *testing.T) {
	longTest(t)
	const region = "drain"
	c, homes := threeNodesWithRegion(t, region)
	hold := c.startClient(t, 3, region, "hold")
	if l := hold.next(t); l != "mapped" {
		t.Fatalf("hold client says %q", l)
	}
	var offs []string
	for _, h := range []uint32{1, 2, 3} {
		for k := uint64(0); k < 4; k++ {
			off := strconv.FormatUint((homes[h]+k)*4096+8, 10)
			offs = append(offs, off)
			c.mustCtl(t, 3, "put", region, off, "by-n3-"+off)
		}
	}
	// Pages homed at n3 written by n1, unsynced: n1 keeps them Modified
	// across n3's departure.
	var mine []string
	for k := uint64(4); k < 6; k++ {
		off := strconv.FormatUint((homes[3]+k)*4096+8, 10)
		mine = append(mine, off)
		c.mustCtl(t, 1, "put", region, off, "by-n1-"+off)
	}
	// Clients on n1 and n2 write in turn to a page homed at n3, so that
	// every write goes through its home, before the SIGTERM and until n3
	// has left: no write fails, and the longest one is logged (the wait
	// of a hand-over: docs/failover.md §11).
	hot := strconv.FormatUint((homes[3]+6)*4096, 10)
	writers := []*clientProc{c.startClient(t, 1, region, "repl"), c.startClient(t, 2, region, "repl")}
	valueOf := func(i int) string { return fmt.Sprintf("w%07d", i) }
	write := func(i int) time.Duration {
		start := time.Now()
		writers[i%2].call(t, "put-bytes "+hot+" "+hex.EncodeToString([]byte(valueOf(i))))
		return time.Since(start)
	}
	var before, during time.Duration
	i := 0
	for ; i < 40; i++ {
		before = max(before, write(i))
	}
	victim := c.nodes[2]
	if err := victim.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(30 * time.Second)
	var after <-chan time.Time // 3 s after n3 exited: its departure, and any move it makes, are done
	exited := victim.done
	for end := false; !end; i++ {
		select {
		case <-exited:
			after, exited = time.After(3*time.Second), nil
		case <-after:
			end = true
		case <-deadline:
			t.Fatal("n3 did not exit 30 s after SIGTERM")
		default:
			during = max(during, write(i))
		}
	}
	t.Logf("writes to a page homed at n3, in turn from n1 and n2: the longest of 40 before the SIGTERM %v, of %d until 3 s after n3 exited %v",
		before.Round(time.Millisecond), i-41, during.Round(time.Millisecond))
	// The hand-over left every replica set whole: in n1's view after n3's
	// departure (3 s after it exited), no shard lacks a complete backup (a
	// departure without it thinned the sets until the fills).
	st, err := c.status(1)
	if err != nil {
		t.Fatal(err)
	}
	for _, nd := range st.Nodes {
		if nd.Node == 3 && nd.State != "left" {
			t.Errorf("n1's status shows n3 %s 3 s after it exited", nd.State)
		}
	}
	for _, r := range st.Reasons {
		if strings.Contains(r, fmt.Sprintf("region %q:", region)) && strings.Contains(r, "complete backups") {
			t.Errorf("right after n3's departure: %s", r)
		}
	}
	if got := writers[0].call(t, fmt.Sprintf("read-at %s %d", hot, len(valueOf(0)))); got != hex.EncodeToString([]byte(valueOf(i-2))) {
		t.Errorf("n1 reads %q at the page written in turn; want the last write, %q", got, valueOf(i-2))
	}
	if l := hold.next(t); !strings.HasPrefix(l, "dead:") || !strings.Contains(l, "leaving") {
		t.Errorf("the mapping on the leaving n3 says %q; want it dead because dsmd is leaving", l)
	}
	if !strings.Contains(victim.logString(), "drained: dirty pages written back") {
		t.Errorf("n3's log does not say it drained:\n%s", tail(victim.logString(), 2000))
	}
	// Its shards were handed over before it left (promoted to their
	// preferred members, its backup copies replaced): the departure moved
	// none of them (docs/failover.md §11).
	if i := strings.Index(victim.logString(), "handed over: no shard needs this node"); i < 0 {
		t.Errorf("n3's log does not say it handed its shards over:\n%s", tail(victim.logString(), 3000))
	} else {
		line, _, _ := strings.Cut(victim.logString()[i:], "\n")
		t.Logf("n3: %s", line)
	}
	// Members that entered replica sets anew in the hand-over cleared
	// their slots of those shards before their fills (docs/failover.md
	// §7); the check above that every set is whole shows that the fills
	// waited for them and completed.
	for _, p := range c.nodes {
		if n := strings.Count(p.logString(), "this node's slots of them cleared before their fills"); n > 0 {
			t.Logf("n%d: %d clears of slots of shards entered anew", p.id, n)
		}
	}
	if !strings.Contains(c.nodes[0].logString()+c.nodes[1].logString(), "promoted to home of the shards this node is preferred for") {
		t.Errorf("neither n1's nor n2's log shows a promotion of n3's shards:\n%s", tail(c.nodes[0].logString(), 3000))
	}
	// Every page n3 wrote is read on the survivors, those homed at n3
	// too (its shards moved to their backups), and so are the pages homed
	// at n3 that n1 held Modified.
	for _, node := range []int{1, 2} {
		for _, off := range offs {
			var out string
			eventually(t, fmt.Sprintf("n%d reads %s after n3 left", node, off), 30*time.Second, func() error {
				o, errs, code := c.ctl(node, "get", region, off, strconv.Itoa(len("by-n3-")+len(off)))
				if code != 0 {
					return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
				}
				out = o
				return nil
			})
			if !strings.Contains(out, "by-n3-"+off) {
				t.Fatalf("n%d reads %q at %s after n3 left; want what n3 wrote", node, out, off)
			}
		}
		for _, off := range mine {
			if out := c.mustCtl(t, node, "get", region, off, strconv.Itoa(len("by-n1-")+len(off))); !strings.Contains(out, "by-n1-"+off) {
				t.Fatalf("n%d reads %q at %s after n3 left; want what n1 wrote", node, out, off)
			}
		}
	}
}

// TestRemoveFailedMember kills the home of some pages with kill -9 and
// does not restart it: once the directory holds it failed, its shards move
// to their backups, and an operator removes it (dsmctl members remove):
// every page written back before the kill is read on the survivors, and a
// page a survivor held Modified without Sync keeps that survivor's data. A
// member that is alive cannot be removed. The removed node restarts later
// as a new incarnation and reads the same data. Last, the home and the
// backup of one shard restart at once: its pages are lost, and say so.
func TestRemoveFailedMember(t *testing.T) {
	longTest(t)
	const region = "rm"
	c, homes := threeNodesWithRegion(t, region)
	offOf := func(home uint32, k uint64) string { return strconv.FormatUint((homes[home]+k)*4096, 10) }
	for h := uint32(1); h <= 3; h++ {
		c.mustCtl(t, 1, "put", region, offOf(h, 0), fmt.Sprintf("homed-at-n%d", h))
	}
	for h := uint32(1); h <= 3; h++ {
		// n2's read makes n1 write its copy back (home and backups).
		if out := c.mustCtl(t, 2, "get", region, offOf(h, 0), "11"); !strings.Contains(out, fmt.Sprintf("homed-at-n%d", h)) {
			t.Fatalf("n2 reads %q at the page homed at n%d", out, h)
		}
	}
	// n1 holds a page homed at n3 Modified, never written back.
	c.mustCtl(t, 1, "put", region, offOf(3, 1), "n1-unsynced")

	if _, errs, code := c.ctl(1, "members", "remove", "2"); code == 0 || !strings.Contains(errs, "only a failed member can be removed") {
		t.Fatalf("members remove of the alive n2: exit %d, %q", code, errs)
	}

	victim := c.nodes[2]
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	<-victim.done
	var removed time.Time
	eventually(t, "n3 is removed once the directory holds it failed", 60*time.Second, func() error {
		out, errs, code := c.ctl(1, "members", "remove", "3")
		if code != 0 {
			return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
		}
		if !strings.Contains(out, "n3 removed in epoch") {
			t.Fatalf("members remove 3: %q", out)
		}
		removed = time.Now()
		return nil
	})
	for _, node := range []int{1, 2} {
		eventually(t, fmt.Sprintf("n%d reads the page homed at the removed n3", node), 60*time.Second, func() error {
			out, errs, code := c.ctl(node, "get", region, offOf(3, 0), "11")
			if code != 0 {
				return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
			}
			if !strings.Contains(out, "homed-at-n3") {
				t.Fatalf("n%d reads %q at the page homed at the removed n3; want homed-at-n3", node, out)
			}
			return nil
		})
	}
	t.Logf("pages of the killed n3 served again %v after the kill, %v after its removal",
		time.Since(killed).Round(100*time.Millisecond), time.Since(removed).Round(100*time.Millisecond))
	// n1's unsynced write survived its page's home.
	if out := c.mustCtl(t, 2, "get", region, offOf(3, 1), "11"); !strings.Contains(out, "n1-unsynced") {
		t.Fatalf("n2 reads %q at the page n1 held Modified when its home died; want n1-unsynced", out)
	}
	for h := uint32(1); h <= 2; h++ {
		if out := c.mustCtl(t, 2, "get", region, offOf(h, 0), "11"); !strings.Contains(out, fmt.Sprintf("homed-at-n%d", h)) {
			t.Fatalf("n2 reads %q at the page homed at n%d", out, h)
		}
	}
	c.mustCtl(t, 2, "put", region, offOf(3, 0), "after-removal")
	if out := c.mustCtl(t, 1, "get", region, offOf(3, 0), "13"); !strings.Contains(out, "after-removal") {
		t.Fatalf("n1 reads %q after n2's write of a moved page", out)
	}
	var members struct {
		Members []struct {
			Node  uint32 `json:"node_id"`
			State string `json:"state"`
		} `json:"members"`
	}
	c.ctlJSON(1, &members, "members")
	for _, m := range members.Members {
		if m.Node == 3 && m.State != "left" {
			t.Errorf("dsmctl members after the removal: n3 is %s, want left", m.State)
		}
	}

	// The machine comes back: a new incarnation, home of nothing, that
	// reads what the others wrote.
	victim.log.Reset()
	victim.start(t)
	eventually(t, "the restarted n3 reads the moved page", 60*time.Second, func() error {
		out, errs, code := c.ctl(3, "get", region, offOf(3, 0), "13")
		if code != 0 {
			return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
		}
		if !strings.Contains(out, "after-removal") {
			t.Fatalf("the restarted n3 reads %q; want after-removal", out)
		}
		return nil
	})

	// The shard that moved got a new backup (the other survivor), filled
	// by its new home, and the new n3 is filled as its extra backup and
	// may be promoted back: once every backup is complete, a restart of
	// its home loses nothing. Restarting a shard's home and its backup at once
	// does: then its pages are lost. They fail at once, through dsmctl and
	// through a mapping (no wait for the fault timeout: they will not come
	// back), naming the home that departed, and dsmctl status names them.
	eventually(t, "dsmctl status is healthy once the new backups are filled", 60*time.Second, func() error {
		out, _, code := c.ctl(3, "status")
		if code != 0 {
			return fmt.Errorf("exit %d:\n%s", code, out)
		}
		return nil
	})
	var second uint32
	for _, sh := range c.shards(t, 1, region) {
		if sh.FirstPage == homes[3] {
			second = sh.Home
		}
	}
	// n1 or n2, or the new n3 once it was filled and promoted back
	// (docs/failover.md §6): whichever, its backups are complete now.
	if second < 1 || second > 3 {
		t.Fatalf("the shard of the removed n3 is homed at n%d; want a live member", second)
	}
	p := c.nodes[second-1]
	asker := 3 // a node that stays up: n3, or n1 when the home is n3
	if second == 3 {
		asker = 1
	}
	was := c.incarnationOf(t, asker, int(second))
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done
	p.log.Reset()
	p.start(t)
	// The directory records the new incarnation once the old one's leases
	// are fenced; until then the old one is a member (and home).
	eventually(t, fmt.Sprintf("the restart of n%d is recorded", second), 30*time.Second, func() error {
		if now := c.incarnationOf(t, asker, int(second)); now <= was {
			return fmt.Errorf("n%d is incarnation %d", second, now)
		}
		return nil
	})
	eventually(t, "n3 reads the moved page from its filled backup", 60*time.Second, func() error {
		out, errs, code := c.ctl(3, "get", region, offOf(3, 0), "13")
		if code != 0 {
			return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
		}
		if !strings.Contains(out, "after-removal") {
			t.Fatalf("n3 reads %q after the restart of the moved page's home; want after-removal", out)
		}
		return nil
	})
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	// A region created now has every shard at the first two members of
	// its chain, and the third holds no copy of it.
	const lostRegion = "rm-lost"
	c.createRegion(t, 1, lostRegion, 4<<20)
	lostPage, home, backup, survivor := c.firstShardCopies(t, lostRegion)
	t.Logf("shard 0 (first page %d) is homed at n%d, backed up at n%d: both restart, n%d survives", lostPage, home, backup, survivor)
	lost := strconv.FormatUint(lostPage*4096, 10)
	eventually(t, fmt.Sprintf("n%d writes and syncs a page of shard 0", home), 30*time.Second, func() error {
		if _, errs, code := c.ctl(home, "put", lostRegion, lost, "to-be-lost", "--sync"); code != 0 { // at its home and backup
			return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
		}
		return nil
	})
	c.killAndRestart(t, home, backup)
	departed := func(errs string) bool {
		return strings.Contains(errs, "restarted") || strings.Contains(errs, "failed in epoch")
	}
	eventually(t, fmt.Sprintf("n%d fails the lost page", survivor), 60*time.Second, func() error {
		out, errs, code := c.ctl(survivor, "get", lostRegion, lost, "10")
		if code == 0 && strings.Contains(out, "to-be-lost") {
			t.Fatalf("n%d reads the page whose home and backup both restarted: %q", survivor, out)
		}
		if code != 0 && strings.Contains(errs, "unavailable") && departed(errs) {
			return nil
		}
		return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
	})
	lostNext := strconv.FormatUint((lostPage+2)*4096, 10)
	out, err := c.client(survivor, lostRegion, "-fault-timeout", "1h", "try-get-bytes", lostNext, "8")
	if err != nil {
		t.Fatalf("plain load of a lost page (fault timeout 1h): %v", err)
	}
	if !strings.HasPrefix(out, "fault: ") || !departed(out) {
		t.Fatalf("plain load of a lost page: %q; want a fault naming the departed home", out)
	}
	st, _, code := c.ctl(survivor, "status")
	if code != 3 || !strings.Contains(st, `region "rm-lost" lost the pages of`) {
		t.Errorf("dsmctl status with a lost shard: exit %d, want 3 and the lost shard named:\n%s", code, st)
	}
}

// TestFailoverTime measures the failover of a home killed with kill -9 and
// restarted at once (as a service manager restarts it): from the kill
// until a survivor reads a page the dead process was home of, from its
// backup. Each round uses a new region (a region created before the round
// has lost its backups of the shards that moved: new copies are not made
// yet). It runs only with DSM_FAILOVER_ROUNDS set (make failover-time
// sets 10) and reports the figures; it fails only on wrong data or a hang.
func TestFailoverTime(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("DSM_FAILOVER_ROUNDS"))
	if rounds <= 0 {
		t.Skip("a measurement: set DSM_FAILOVER_ROUNDS (make failover-time)")
	}
	// DSM_FAILOVER_RESTART=0: the killed home stays down until its pages
	// are read elsewhere (the failure verdict moves them), and is
	// restarted only then, for the next round.
	restart := os.Getenv("DSM_FAILOVER_RESTART") != "0"
	how := "kill -9 and restart"
	if !restart {
		how = "kill -9 without restart"
	}
	var extra map[int][]string
	if os.Getenv("DSM_TEST_DEBUG") != "" {
		extra = map[int][]string{0: {"--log-level", "debug"}, 1: {"--log-level", "debug"}, 2: {"--log-level", "debug"}}
	}
	c := startClusterWith(t, 3, extra)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	var took []time.Duration
	for round := range rounds {
		region := fmt.Sprintf("ft%d", round)
		c.createRegion(t, 1, region, 16<<20)
		homes := c.homedPages(t, 1, region)
		victim := uint32(round%3 + 1)
		for range 3 {
			if _, ok := homes[victim]; ok {
				break
			}
			victim = victim%3 + 1 // no shard of this region there
		}
		first, ok := homes[victim]
		if !ok {
			t.Fatalf("round %d: no home found in %v", round, homes)
		}
		writer := int(victim%3 + 1)
		reader := int(writer%3 + 1)
		off := strconv.FormatUint(first*4096, 10)
		want := fmt.Sprintf("round-%d", round)
		// The writer's page goes back to the home (and its backup) when
		// the home reads it; the reader never held it, so its read after
		// the kill is a miss that needs the page's home.
		c.mustCtl(t, writer, "put", region, off, want)
		if out := c.mustCtl(t, int(victim), "get", region, off, strconv.Itoa(len(want))); !strings.Contains(out, want) {
			t.Fatalf("round %d: n%d reads %q", round, victim, out)
		}

		p := c.nodes[victim-1]
		if err := p.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		<-p.done
		fmt.Fprintf(p.log, "==== killed by the test, round %d ====\n", round)
		if restart {
			p.start(t)
		}
		eventually(t, fmt.Sprintf("round %d: n%d reads the page homed at the killed n%d", round, reader, victim), 60*time.Second, func() error {
			out, errs, code := c.ctl(reader, "--timeout", "2s", "get", region, off, strconv.Itoa(len(want)))
			if code != 0 {
				return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
			}
			if !strings.Contains(out, want) {
				t.Errorf("round %d: n%d reads %q after the failover; want %q", round, reader, out, want)
				t.Logf("region info:\n%s", c.mustCtl(t, 1, "region", "info", region))
				for n := 1; n <= 3; n++ {
					out, errs, _ := c.ctl(n, "pages", region, "--range", fmt.Sprintf("%d:%d", first, first+1), "--json")
					t.Logf("pages on n%d: %s %s", n, out, errs)
				}
				t.FailNow()
			}
			return nil
		})
		took = append(took, time.Since(killed))
		t.Logf("round %d: %s of n%d: its pages readable on n%d after %v", round, how, victim, reader, took[round].Round(10*time.Millisecond))
		if !restart {
			p.start(t)
		}
		c.waitAllAlive(1)
	}
	slices.Sort(took)
	t.Logf("failover after %s, %d rounds: median %v, min %v, max %v",
		how, rounds, took[len(took)/2].Round(10*time.Millisecond), took[0].Round(10*time.Millisecond), took[len(took)-1].Round(10*time.Millisecond))
}

// TestRollingRestartLosesNothing restarts every node of a three-node
// cluster in turn with kill -9, twice over, waiting after each restart
// until dsmctl status is healthy again (no shard with fewer complete
// backups than asked: the homes have filled the replacement backups);
// every page synced before, on shards homed at every node, is then read
// with its data on every node. The nodes checkpoint the placement after
// every record they can drop (--checkpoint-after 1), so the walks start
// from checkpoints and the departed incarnations' records are dropped as
// the restarts go: at least one checkpoint must be recorded.
func TestRollingRestartLosesNothing(t *testing.T) {
	longTest(t)
	const region = "roll"
	// Every node proposes placement checkpoints as soon as one drops a
	// record: the restarts' records are dropped as they go, and the
	// walks start from checkpoints.
	every := []string{"--checkpoint-after", "1"}
	c, homes := threeNodesWithRegionArgs(t, region, map[int][]string{1: every, 2: every, 3: every})
	checkpoints := 0
	countCheckpoints := func(n *proc) {
		checkpoints += strings.Count(n.logString(), "placement checkpoint recorded")
	}
	type page struct{ off, data string }
	var pages []page
	for h := uint32(1); h <= 3; h++ {
		for i := uint64(0); i < 4; i++ {
			p := page{strconv.FormatUint((homes[h]+i)*4096, 10), fmt.Sprintf("page-%d-of-n%d", i, h)}
			c.mustCtl(t, int(1+(uint64(h)+i)%3), "put", "--sync", region, p.off, p.data)
			pages = append(pages, p)
		}
	}
	healthy := func(what string) {
		eventually(t, what, 90*time.Second, func() error {
			for i := 1; i <= 3; i++ {
				var st statusJSON
				out, errs, _ := c.ctl(i, "status", "--json")
				if err := json.Unmarshal([]byte(out), &st); err != nil {
					return fmt.Errorf("n%d: %v: %s", i, err, errs)
				}
				if st.Health != "healthy" {
					return fmt.Errorf("n%d is %s: %v", i, st.Health, st.Reasons)
				}
			}
			return nil
		})
	}
	readAll := func(when string) {
		for node := 1; node <= 3; node++ {
			for _, p := range pages {
				eventually(t, fmt.Sprintf("%s: n%d reads %s", when, node, p.data), 60*time.Second, func() error {
					out, errs, code := c.ctl(node, "get", region, p.off, strconv.Itoa(len(p.data)))
					if code != 0 {
						return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
					}
					if !strings.Contains(out, p.data) {
						t.Fatalf("%s: n%d reads %q, want %q", when, node, out, p.data)
					}
					return nil
				})
			}
		}
	}
	for round := range 2 {
		for victim := 1; victim <= 3; victim++ {
			n := c.nodes[victim-1]
			if err := n.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			<-n.done
			countCheckpoints(n)
			n.log.Reset()
			n.start(t)
			// Every node's directory has the new incarnation (so the old
			// one departed there) before the health is asked.
			eventually(t, fmt.Sprintf("round %d: every node knows n%d's new incarnation", round, victim), 60*time.Second, func() error {
				for i := 1; i <= 3; i++ {
					incs, err := c.incarnations(i)
					if err != nil {
						return err
					}
					if inc, ok := incs[uint32(victim)]; ok && inc != uint64(round+2) {
						return fmt.Errorf("n%d lists n%d at incarnation %d", i, victim, inc)
					}
				}
				return nil
			})
			c.waitAllAlive(1 + victim%3)
			restarted := time.Now()
			healthy(fmt.Sprintf("round %d: the cluster is healthy after the restart of n%d", round, victim))
			t.Logf("round %d: every backup complete again %v after n%d's new incarnation was known", round, time.Since(restarted).Round(100*time.Millisecond), victim)
		}
		readAll(fmt.Sprintf("round %d", round))
	}
	for _, n := range c.nodes {
		countCheckpoints(n)
	}
	if checkpoints == 0 {
		t.Fatal("no placement checkpoint was recorded in six restarts")
	}
	t.Logf("%d placement checkpoints recorded", checkpoints)
}
