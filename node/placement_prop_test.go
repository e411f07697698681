package node

import (
	"slices"
	"testing"

	"github.com/dsmkit/dsm/directory/placement"
)

// Every copy the placement would promote is written by every release: in
// any history, for every shard, each member after the home that counts as
// complete now is one of the shard's backups (a complete member outside
// the backups would miss releases, and a later departure of the home could
// promote its stale copy). 40 seeded histories (80 s under the race
// detector for 200).
func TestCompleteMembersAreBackups(t *testing.T) {
	randomHistories(40, func(seed int64, step int, rc *regionChains, _, pm *protoMap, log []string) {
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
	})
}
