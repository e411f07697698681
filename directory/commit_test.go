package directory_test

import (
	"testing"
	"time"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/ids"
)

// TestFollowersLearnCommitsWithoutIdleAppends: with the Raft commit timeout
// so long that the leader never sends an idle append during the test, a
// command still reaches every replica, because the leader announces each
// commit it applies. A region created through a follower (whose apply waits
// until its own replica has applied the command) and one created through the
// leader both show up everywhere. Nothing is asserted about how long it
// took: waitFor's deadline only catches a replica that never learns.
func TestFollowersLearnCommitsWithoutIdleAppends(t *testing.T) {
	c := newCluster(t)
	c.startNWith(3, 3, 3, func(cfg *directory.Config) { cfg.Timing.RaftCommit = time.Hour })
	l := c.leader()
	c.waitMembers(1, 2, 3)

	follower := ids.NodeID(1)
	for c.node(follower) == l {
		follower++
	}
	ctx := ctxT(t)
	if _, err := c.node(follower).CreateRegion(ctx, spec("through-a-follower")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateRegion(ctx, spec("through-the-leader")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"through-a-follower", "through-the-leader"} {
		waitFor(t, name+" on every replica", func() bool {
			for _, d := range c.live() {
				if _, ok := d.View().Region(name); !ok {
					return false
				}
			}
			return true
		})
	}
}
