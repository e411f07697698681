package tests

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
)

// TestJoinerTakesItsShare: a fourth dsmd joins a three-node cluster that
// holds a written region. It maps the region, is filled as the extra
// backup of the shards it wins by rendezvous, and is promoted to their
// home: exactly those shards move to it (about a quarter), no other. Every
// page written before reads back on every node, through the moves. Then
// every shard is written again at its new home, and once every shard has
// its complete backups again, an old home is killed with kill -9 (and
// removed), then the joiner: each time its shards move to their backups
// and every synced page still reads back on the survivors.
func TestJoinerTakesItsShare(t *testing.T) {
	longTest(t)
	const region = "join"
	c := startClusterWith(t, 3, nil)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	c.createRegion(t, 1, region, 64<<20)
	before := c.shards(t, 1, region)
	if len(before) < 16 {
		t.Fatalf("region %s has %d shards; the test wants at least 16", region, len(before))
	}
	rid := c.regionID(t, region)
	marker := func(i int) string { return fmt.Sprintf("s%03d-pre-join", i) } // one line of get's dump
	for i, s := range before {
		c.mustCtl(t, 1+i%3, "put", region, strconv.FormatUint(s.FirstPage*4096, 10), marker(i), "--sync")
	}

	c.add(t, 4)
	c.waitAlive(1, 2, 3, 4)
	want := map[int]bool{} // the shards node 4 wins
	for i := range before {
		if placement.Home(placement.Shard{Region: rid, Index: uint64(i)}, []ids.NodeID{1, 2, 3, 4}) == 4 {
			want[i] = true
		}
	}
	if len(want) == 0 {
		t.Fatal("node 4 wins no shard: the test checks nothing")
	}
	start := time.Now()
	eventually(t, "node 4 homes exactly the shards it wins", 90*time.Second, func() error {
		after := c.shards(t, 1, region)
		var wrong []string
		for i, s := range after {
			switch {
			case want[i] && s.Home != 4:
				wrong = append(wrong, fmt.Sprintf("shard %d at n%d", i, s.Home))
			case !want[i] && s.Home != before[i].Home:
				t.Fatalf("shard %d, which node 4 does not win, moved from n%d to n%d", i, before[i].Home, s.Home)
			}
		}
		if len(wrong) > 0 {
			return fmt.Errorf("%d of %d shards not moved yet: %v", len(wrong), len(want), wrong)
		}
		return nil
	})
	// Which shards move is rendezvous's choice, checked above shard by
	// shard; how many is its balance: 1/N, within three standard
	// deviations of a binomial draw (with 32 shards: 0.25 ± 0.23).
	frac, sd := float64(len(want))/float64(len(before)), math.Sqrt(0.25*0.75/float64(len(before)))
	t.Logf("%d of %d shards moved to the joiner (%.2f; 1/N = 0.25) in %v after it was alive", len(want), len(before),
		frac, time.Since(start).Round(100*time.Millisecond))
	if math.Abs(frac-0.25) > 3*sd {
		t.Errorf("%d of %d shards moved: not about 1/N", len(want), len(before))
	}
	c.readBack(t, region, before, []int{1, 2, 3, 4}, marker, "after the join")

	// Writes after the join, through mappings on every node, at the new
	// homes. Then, once every shard has its complete backups again (the
	// old homes that the join demoted are back in replica sets only by
	// fills), the kill of an old home with the joiner alive: its shards
	// move to their backups, the joiner among them. Then, once n2 is
	// removed (four voters with two dead have no quorum) and the survivors
	// are refilled, the kill of the joiner. Each time every page written
	// after the join reads back on the survivors.
	after := func(i int) string { return fmt.Sprintf("s%03d-post-join", i) }
	writers := repls(t, c, region)
	for i, s := range before {
		writers[1+i%4].call(t, fmt.Sprintf("put-bytes %d %s", s.FirstPage*4096, hex.EncodeToString([]byte(after(i)))))
	}
	for node := 1; node <= 4; node++ {
		writers[node].call(t, "sync")
		writers[node].kill(t)
	}
	c.waitBackedUp(t, 1, region)
	oldHome := 2 // an old home that is not node 1, whose status the test reads
	lostHomes := 0
	for _, s := range c.shards(t, 1, region) {
		if s.Home == uint32(oldHome) {
			lostHomes++
		}
	}
	if lostHomes == 0 {
		t.Fatalf("n%d homes no shard after the join: its kill checks nothing", oldHome)
	}
	c.kill(t, oldHome)
	c.readBack(t, region, before, []int{1, 3, 4}, after, fmt.Sprintf("after the kill of n%d", oldHome))
	t.Logf("the kill of old home n%d moved its %d shards; every page reads back on n1, n3 and n4", oldHome, lostHomes)

	eventually(t, "n2 is removed once the directory holds it failed", 60*time.Second, func() error {
		if _, errs, code := c.ctl(1, "members", "remove", "2"); code != 0 {
			return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
		}
		return nil
	})
	c.waitBackedUp(t, 1, region)
	c.kill(t, 4)
	c.readBack(t, region, before, []int{1, 3}, after, "after the kill of the joiner n4")
}

// waitBackedUp waits until node's status names no shard of region with
// fewer complete backups than the region asks for: the homes have filled
// every backup that a move or a departure took away.
func (c *dsmCluster) waitBackedUp(t *testing.T, node int, region string) {
	t.Helper()
	eventually(t, fmt.Sprintf("every shard of %s has its complete backups (status on n%d)", region, node), 90*time.Second, func() error {
		st, err := c.status(node)
		if err != nil {
			return err
		}
		for _, r := range st.Reasons {
			if strings.Contains(r, fmt.Sprintf("region %q:", region)) && strings.Contains(r, "complete backups") {
				return errors.New(r)
			}
		}
		return nil
	})
}

// kill kills node's dsmd with kill -9 and waits until it is reaped.
func (c *dsmCluster) kill(t *testing.T, node int) {
	t.Helper()
	p := c.nodes[node-1]
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

// readBack requires that a process mapping region on each node given reads
// want(i) at the first page of shard i, through ReadAt. A read may fail
// while shards move after a kill (it is tried again for up to a minute);
// it may never return anything else.
func (c *dsmCluster) readBack(t *testing.T, region string, shards []shardInfo, nodes []int, want func(int) string, when string) {
	t.Helper()
	for _, node := range nodes {
		r := c.startClient(t, node, region, "repl")
		for i, s := range shards {
			w := hex.EncodeToString([]byte(want(i)))
			line := fmt.Sprintf("read-at %d %d", s.FirstPage*4096, len(want(i)))
			eventually(t, fmt.Sprintf("n%d reads shard %d %s", node, i, when), 60*time.Second, func() error {
				got := r.try(t, line)
				switch {
				case strings.HasPrefix(got, "ERR "):
					return errors.New(got)
				case got != w:
					t.Fatalf("n%d reads %q in shard %d %s; want %q", node, got, i, when, w)
				}
				return nil
			})
		}
		r.kill(t)
	}
}

// regionID is the id of region, from `region info` on node 1.
func (c *dsmCluster) regionID(t *testing.T, region string) ids.RegionID {
	t.Helper()
	var info struct {
		Region struct {
			ID uint32 `json:"id"`
		} `json:"region"`
	}
	c.ctlJSON(1, &info, "region", "info", region)
	if info.Region.ID == 0 {
		t.Fatalf("region info %s gives no id", region)
	}
	return ids.RegionID(info.Region.ID)
}
