package tests

import (
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
// the new node is killed with kill -9: its shards move to their backups
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
	for node := 1; node <= 4; node++ {
		for i, s := range before {
			out := c.mustCtl(t, node, "get", region, strconv.FormatUint(s.FirstPage*4096, 10), strconv.Itoa(len(marker(i))))
			if !strings.Contains(out, marker(i)) {
				t.Fatalf("n%d reads %q in shard %d after the join; want %q", node, out, i, marker(i))
			}
		}
	}

	victim := c.nodes[3]
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	for node := 1; node <= 3; node++ {
		for i, s := range before {
			off := strconv.FormatUint(s.FirstPage*4096, 10)
			eventually(t, fmt.Sprintf("n%d reads shard %d after the kill of the joiner", node, i), 60*time.Second, func() error {
				out, errs, code := c.ctl(node, "--timeout", "15s", "get", region, off, strconv.Itoa(len(marker(i))))
				switch {
				case code == 0 && !strings.Contains(out, marker(i)):
					t.Fatalf("n%d reads %q in shard %d after the kill of the joiner; want %q", node, out, i, marker(i))
				case code != 0:
					return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
				}
				return nil
			})
		}
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
