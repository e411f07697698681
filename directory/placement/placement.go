package placement

import (
	"slices"

	"github.com/dsmkit/dsm/internal/ids"
)

// Shard names a group of consecutive pages of one region, placed together.
type Shard struct {
	Region ids.RegionID
	Index  uint64
}

// Score is the rendezvous weight of node for shard s.
func Score(s Shard, node ids.NodeID) uint64 {
	h := mix(uint64(s.Region)<<32 ^ 0x9e3779b97f4a7c15)
	h = mix(h ^ s.Index)
	return mix(h ^ uint64(node)*0xc2b2ae3d27d4eb4f)
}

func mix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Rank returns up to k nodes of candidates in rendezvous order for s: the
// home first, then the backups. Ties (which need equal 64-bit scores) go to
// the lower node id. candidates is not modified; duplicates count once.
func Rank(s Shard, candidates []ids.NodeID, k int) []ids.NodeID {
	if k <= 0 || len(candidates) == 0 {
		return nil
	}
	type scored struct {
		node  ids.NodeID
		score uint64
	}
	all := make([]scored, 0, len(candidates))
	for _, n := range candidates {
		all = append(all, scored{n, Score(s, n)})
	}
	slices.SortFunc(all, func(a, b scored) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		case a.node < b.node:
			return -1
		case a.node > b.node:
			return 1
		}
		return 0
	})
	all = slices.CompactFunc(all, func(a, b scored) bool { return a.node == b.node })
	if k > len(all) {
		k = len(all)
	}
	out := make([]ids.NodeID, k)
	for i := range out {
		out[i] = all[i].node
	}
	return out
}

// Home returns the highest-ranked node for s, ids.None without candidates.
func Home(s Shard, candidates []ids.NodeID) ids.NodeID {
	best, bestScore := ids.None, uint64(0)
	for _, n := range candidates {
		sc := Score(s, n)
		if best == ids.None || sc > bestScore || (sc == bestScore && n < best) {
			best, bestScore = n, sc
		}
	}
	return best
}
