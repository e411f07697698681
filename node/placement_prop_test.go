package node

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
)

// Every copy the placement would promote is written by every release: in
// any history, for every shard, each member after the home that counts as
// complete now is one of the shard's backups (a complete member outside
// the backups would miss releases, and a later departure of the home could
// promote its stale copy). 40 seeded histories (80 s under the race
// detector for 200).
func TestCompleteMembersAreBackups(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewSource(seed))
		d := newDirModel(1, 2, 3, 4)
		rc := d.region(1 + rng.Intn(2))
		next := ids.NodeID(5)
		var log []string
		for step := 0; step < 60; step++ {
			n := ids.NodeID(1 + rng.Intn(int(next)-1))
			m := d.members[n]
			switch op := rng.Intn(10); {
			case op < 3:
				d.restart(n)
				log = append(log, fmt.Sprintf("restart %v", n))
			case op < 4 && m.State == directory.StateAlive:
				d.setState(n, directory.StateFailed)
				log = append(log, fmt.Sprintf("fail %v", n))
			case op < 5 && m.State == directory.StateFailed:
				d.setState(n, directory.StateLeft)
				log = append(log, fmt.Sprintf("remove %v", n))
			case op < 6 && m.State != directory.StateLeft:
				d.setState(n, directory.StateLeft)
				log = append(log, fmt.Sprintf("leave %v", n))
			case op < 7 && next < 10:
				d.join(next)
				log = append(log, fmt.Sprintf("join %v", next))
				next++
			default:
				fillAll(d, rc)
				log = append(log, "fill")
			}
			pm := d.pm()
			for i := range rc.r.Shards() {
				s := placement.Shard{Region: 1, Index: i}
				c, base, hi := rc.place(s, pm)
				if pm.departedAt(c[hi]) != 0 {
					continue // lost
				}
				backups := rc.backupIndexes(c, hi, pm)
				for j := hi + 1; j < len(c); j++ {
					if rc.completeAt(c, base, j, s, never, pm) && !slices.Contains(backups, j) {
						t.Fatalf("seed %d step %d: shard %d: chain %v, home %v, backups %v: %v counts as complete but is no backup, after %v",
							seed, step, i, c, c[hi], backups, c[j], log)
					}
				}
			}
		}
	}
}
