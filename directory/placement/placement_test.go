package placement

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
)

func nodes(n int, first ids.NodeID) []ids.NodeID {
	out := make([]ids.NodeID, n)
	for i := range out {
		out[i] = first + ids.NodeID(i)
	}
	return out
}

func TestRankDeterministicAndComplete(t *testing.T) {
	c := nodes(7, 1)
	s := Shard{Region: 3, Index: 42}
	a := Rank(s, c, 7)
	shuffled := slices.Clone(c)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	b := Rank(s, shuffled, 7)
	if !slices.Equal(a, b) {
		t.Fatalf("rank depends on input order: %v vs %v", a, b)
	}
	sorted := slices.Clone(a)
	slices.Sort(sorted)
	if !slices.Equal(sorted, c) {
		t.Fatalf("rank %v is not a permutation of %v", a, c)
	}
	if Home(s, shuffled) != a[0] {
		t.Fatalf("Home %v differs from Rank[0] %v", Home(s, shuffled), a[0])
	}
	if got := Rank(s, append(slices.Clone(c), c...), 10); len(got) != 7 {
		t.Fatalf("duplicates counted: %v", got)
	}
	if Rank(s, nil, 3) != nil || Home(s, nil) != ids.None {
		t.Fatal("empty candidates must give no placement")
	}
}

// TestJoinMovesAboutOneNth is the property that makes rendezvous hashing fit:
// when one node joins N, the only shards whose home changes are those the
// joiner now owns, and they are about 1/(N+1) of all shards.
func TestJoinMovesAboutOneNth(t *testing.T) {
	const shards = 20000
	for _, n := range []int{1, 2, 3, 4, 5, 8, 16, 31} {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("n=%d/seed=%d", n, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, uint64(n)))
				before := make([]ids.NodeID, n)
				seen := map[ids.NodeID]bool{}
				for i := range before {
					for {
						id := ids.NodeID(rng.Uint32N(1000) + 1)
						if !seen[id] {
							seen[id] = true
							before[i] = id
							break
						}
					}
				}
				joiner := ids.NodeID(2000 + seed)
				after := append(slices.Clone(before), joiner)
				region := ids.RegionID(rng.Uint32N(100) + 1)
				moved := 0
				for i := uint64(0); i < shards; i++ {
					s := Shard{Region: region, Index: i}
					h0, h1 := Home(s, before), Home(s, after)
					if h0 != h1 {
						moved++
						if h1 != joiner {
							t.Fatalf("shard %d moved from %v to %v, not to the joiner", i, h0, h1)
						}
					}
				}
				want := float64(shards) / float64(n+1)
				slack := 0.25*want + 200 // binomial noise is ~sqrt(want); this is far outside it
				if float64(moved) > want+slack || float64(moved) < want-slack {
					t.Fatalf("join of 1 to %d moved %d of %d shards, want about %.0f", n, moved, shards, want)
				}
			})
		}
	}
}

// TestLeaveHandsShardsToFirstBackup checks that when a home disappears, the
// new home of each of its shards is the shard's former first backup, and
// shards of other homes do not move.
func TestLeaveHandsShardsToFirstBackup(t *testing.T) {
	c := nodes(5, 10)
	gone := ids.NodeID(12)
	rest := slices.DeleteFunc(slices.Clone(c), func(n ids.NodeID) bool { return n == gone })
	for i := uint64(0); i < 5000; i++ {
		s := Shard{Region: 9, Index: i}
		r := Rank(s, c, 2)
		h := Home(s, rest)
		if r[0] == gone {
			if h != r[1] {
				t.Fatalf("shard %d: home %v gone, new home %v, first backup was %v", i, gone, h, r[1])
			}
		} else if h != r[0] {
			t.Fatalf("shard %d moved from %v to %v although its home stayed", i, r[0], h)
		}
	}
}

func TestBalance(t *testing.T) {
	c := nodes(5, 1)
	count := map[ids.NodeID]int{}
	const shards = 50000
	for i := uint64(0); i < shards; i++ {
		count[Home(Shard{Region: 1, Index: i}, c)]++
	}
	for _, n := range c {
		if got, want := count[n], shards/len(c); got < want*85/100 || got > want*115/100 {
			t.Fatalf("node %v homes %d shards, want about %d (%v)", n, got, want, count)
		}
	}
}
