package sim

import (
	"flag"
	"fmt"
	"sync"
	"testing"
	"time"
)

var (
	flagSeeds   = flag.Int("seeds", 0, "seeds per configuration (0: the CI share)")
	flagSeed    = flag.Int64("seed", -1, "run only this seed (with -config) and print its trace on failure")
	flagConf    = flag.String("config", "", "run only the configuration with this name")
	flagFirst   = flag.Int64("first-seed", 1, "first seed")
	flagWorkers = flag.Int("workers", 1, "seeds run in parallel")
)

// configs are the configurations every seed runs through, with the share
// of the CI seeds each gets.
var configs = []struct {
	name  string
	opts  Options
	share int
}{
	{"small", Options{Nodes: 3, Pages: 2, Ops: 60, Linearizability: true}, 75},
	{"small-faults", Options{Nodes: 4, Pages: 2, Ops: 60, Faults: true, Evict: true, Linearizability: true}, 100},
	{"evict", Options{Nodes: 5, Pages: 3, Ops: 80, Evict: true, Linearizability: true}, 125},
	{"crash", Options{Nodes: 6, Pages: 2, Ops: 80, Faults: true, Evict: true, Crashes: 2}, 150},
	{"home-crash", Options{Nodes: 5, Pages: 3, Ops: 80, Faults: true, Evict: true, Crashes: 2, HomeCrashes: 2}, 150},
	{"async-reconfig", Options{Nodes: 6, Pages: 3, Ops: 100, Faults: true, Evict: true, Crashes: 3, HomeCrashes: 1, AsyncReconfig: true}, 150},
	{"hot-8", Options{Nodes: 8, Pages: 1, Ops: 80, Hot: true, Faults: true, Linearizability: true}, 50},
	{"hot-8-lazy", Options{Nodes: 8, Pages: 2, Ops: 80, Hot: true, Faults: true, Linearizability: true, LazyHomes: true}, 100},
	{"mutex", Options{Nodes: 5, Pages: 1, Ops: 60, Mutex: true, Faults: true}, 100},
	{"mutex-lazy", Options{Nodes: 5, Pages: 1, Ops: 60, Mutex: true, Faults: true, LazyHomes: true}, 100},
	{"wide-20", Options{Nodes: 20, Pages: 2, Ops: 100, Faults: true, Evict: true, Crashes: 2, HomeCrashes: 1}, 150},
	{"hot-64", Options{Nodes: 64, Pages: 1, Ops: 100, Hot: true, Faults: true, Crashes: 1}, 25},
	{"wide-64", Options{Nodes: 64, Pages: 4, Ops: 120, Evict: true, Faults: true, Crashes: 3, HomeCrashes: 1}, 25},
	// Batches of unknown outcome on every verb kind (nodes 15 and 16 count
	// in the coarse field), with crashes, a home crash and epochs learnt
	// at different times.
	{"unknown-outcome", Options{Nodes: 16, Pages: 3, Ops: 100, Faults: true, UnknownOutcomes: true, Evict: true, Crashes: 2, HomeCrashes: 1, AsyncReconfig: true}, 100},
	// The same faults on one hot page with lazy homes: reservations
	// passed and handed back with unknown outcomes, and the history
	// checked for linearizability (no crashes).
	{"unknown-hot", Options{Nodes: 8, Pages: 2, Ops: 80, Hot: true, Faults: true, UnknownOutcomes: true, Linearizability: true, LazyHomes: true}, 50},
	// Both at once: batches of unknown outcome with lazy homes (the
	// trust rule, MsgStamp), crashes, a home crash and departures learnt
	// asynchronously, on 16 nodes (two coarse).
	{"unknown-lazy-crash", Options{Nodes: 16, Pages: 3, Ops: 100, Faults: true, UnknownOutcomes: true, Evict: true, Crashes: 2, HomeCrashes: 1, AsyncReconfig: true, LazyHomes: true}, 100},
	// The trust rule and MsgStamp: lazy homes (zero home memory, no
	// HomedPages) with departures learnt asynchronously.
	{"lazy-crash", Options{Nodes: 6, Pages: 3, Ops: 100, Faults: true, Evict: true, Crashes: 2, AsyncReconfig: true, LazyHomes: true}, 125},
	// Lazy homes with home crashes: the pages of a crashed home move to
	// new homes named by the placement (Reconfigure.HomeOf), which rebuild
	// the words of the pages reported to them.
	{"lazy-home-crash", Options{Nodes: 5, Pages: 3, Ops: 80, Faults: true, Evict: true, Crashes: 2, HomeCrashes: 2, LazyHomes: true}, 50},
	// Moves by placement (docs/failover.md §5): more pages than most nodes
	// touch (a page with no state at a node waits for its new home's
	// MsgMoveDone), three home crashes, epochs learnt at different times,
	// a joiner created while moves are under way, and new homes whose
	// slots are ready only some steps after the epoch (SlotsReady).
	{"range-move", Options{Nodes: 12, Pages: 12, Ops: 120, Faults: true, Evict: true, Crashes: 3, HomeCrashes: 3, Joins: 1, AsyncReconfig: true, LazyHomes: true, SlowSlots: true, LearnOdds: 16}, 100},
	// range-move where nodes skip epochs, moves included: crashes (of
	// homes too), their reconfigurations and the join come while nodes
	// still lag behind earlier epochs; a lagging node learns only the
	// latest epoch, its Targets computed against the placement of the
	// last epoch it learnt (as dsmd computes them from coalesced views).
	{"skip-move", Options{Nodes: 12, Pages: 12, Ops: 120, Faults: true, Evict: true, Crashes: 3, HomeCrashes: 3, Joins: 1, AsyncReconfig: true, LazyHomes: true, SlowSlots: true, LearnOdds: 16, SkipMoves: true, Taints: 2}, 100},
	// The same, slower to learn (LearnOdds 32): more nodes skip a move
	// and learn an epoch that moves pages again.
	{"skip-move-slow", Options{Nodes: 12, Pages: 12, Ops: 120, Faults: true, Evict: true, Crashes: 3, HomeCrashes: 3, Joins: 1, AsyncReconfig: true, LazyHomes: true, SlowSlots: true, LearnOdds: 32, SkipMoves: true, Taints: 2}, 25},
	// Taints (as dsmd does for a member its failure detector declared
	// failed, alive or not): epochs with the same members in which a live
	// node stops being a backup of every page; it stays a member, a client
	// and a home, and is never promoted. Every page has Crashes+Taints
	// backups, every home may crash.
	{"taint", Options{Nodes: 10, Pages: 10, Ops: 120, Faults: true, Evict: true, Crashes: 3, HomeCrashes: 3, Taints: 2, AsyncReconfig: true, LazyHomes: true, SlowSlots: true}, 100},
	// Words zero in epoch 16, 40 empty epochs (the 4-bit tag wraps more
	// than twice) and 2 crashes between the requests.
	// Members that join (docs/protocol.md, "Members that join"): nodes
	// created mid-run as new members, with the current epoch and members,
	// which every other node learns at a different time (slowly: LearnOdds
	// 32, so that nodes in the old epoch meet a joiner's acts; with 8, a
	// joiner that waited only for the homes' acknowledgements failed 4
	// seeds in 15,000, with 32, 81 in 9,000). A joiner reads,
	// writes, runs atomics and evicts like any member; homes stay among
	// the first nodes. join: lazy homes, no crash, linearizability.
	{"join", Options{Nodes: 5, Pages: 3, Ops: 100, Faults: true, Evict: true, Joins: 3, AsyncReconfig: true, LazyHomes: true, Linearizability: true, LearnOdds: 32}, 75},
	// Joins with crashes (one of a home) and epochs learnt at different
	// times: nodes skip epochs, joiners are created while a page is
	// rebuilt, crash before they are synced.
	{"join-async", Options{Nodes: 6, Pages: 3, Ops: 100, Faults: true, Evict: true, Crashes: 2, HomeCrashes: 1, Joins: 2, AsyncReconfig: true, LearnOdds: 32}, 75},
	// Mutex clients among which nodes join: a joiner takes the lock like
	// any member (mutual exclusion and the counter are checked).
	{"join-mutex", Options{Nodes: 5, Pages: 1, Ops: 60, Mutex: true, Faults: true, Joins: 2, AsyncReconfig: true, LazyHomes: true, LearnOdds: 32}, 25},
	// Restarts: a crash, then the crashed id departs and a new id joins
	// in the same epoch (lazy homes, a mutex-free random workload).
	{"restart-join", Options{Nodes: 6, Pages: 3, Ops: 100, Faults: true, Evict: true, Crashes: 2, Restarts: 2, Joins: 1, AsyncReconfig: true, LazyHomes: true, LearnOdds: 32}, 75},
	// Fills (docs/failover.md §6): one backup per page; every backup that
	// crashes or is promoted is replaced (by the crashed node's new
	// incarnation first) and filled by the page's home; homes crash one
	// at a time, each once the fills are done, and move to the filled
	// backups: with fills, losing one node at a time, four times over,
	// loses nothing.
	{"fill", Options{Nodes: 5, Pages: 4, Ops: 150, Faults: true, Evict: true, Crashes: 4, HomeCrashes: 4, Restarts: 4, Backups: 1, Fills: true, AsyncReconfig: true, LazyHomes: true, LearnOdds: 16}, 200},
	// Crashes during fills, two backups per page: the home, the backup
	// being filled or a releaser dies while a fill is under way (a
	// complete copy of every page always survives); batches of unknown
	// outcome, fills included.
	{"fill-crash", Options{Nodes: 6, Pages: 4, Ops: 150, Faults: true, UnknownOutcomes: true, Evict: true, Crashes: 4, HomeCrashes: 3, Restarts: 2, Backups: 2, Fills: true, MidFillCrashes: true, AsyncReconfig: true, LearnOdds: 16}, 200},
	// Fills after taints: a live node leaves every backup set (a failure
	// verdict) and is replaced, so the backups change without a departure
	// and without a probe; nodes learn epochs slowly, and one that lags
	// behind the taint still writes the tainted node, not its replacement.
	// Only the fill's fence (every member in the epoch first) keeps the
	// filled backup complete.
	{"fill-taint", Options{Nodes: 6, Pages: 4, Ops: 150, Faults: true, Evict: true, Crashes: 2, HomeCrashes: 2, Restarts: 2, Taints: 2, Backups: 1, Fills: true, AsyncReconfig: true, LazyHomes: true, LearnOdds: 32}, 100},
	// Moves away from live homes (docs/protocol.md, "Moves from live
	// homes"): a page's complete backup becomes its home in an epoch
	// without a departure, the old home becomes its first backup and
	// stamps the word it leaves behind at a random later step; members
	// learn the epoch slowly, so that lagging members' verbs land on the
	// old home's slot before and after its stamp. promote-crash adds
	// crashes (of the new homes too: a page moves back to the demoted
	// home), restarts, batches of unknown outcome and skipped epochs.
	{"promote", Options{Nodes: 5, Pages: 4, Ops: 150, Faults: true, Evict: true, Backups: 1, Fills: true, Promotions: 6, AsyncReconfig: true, LazyHomes: true, LearnOdds: 32, Linearizability: true}, 150},
	{"promote-crash", Options{Nodes: 6, Pages: 4, Ops: 150, Faults: true, UnknownOutcomes: true, Evict: true, Crashes: 3, HomeCrashes: 3, Restarts: 2, Backups: 2, Fills: true, Promotions: 6, AsyncReconfig: true, LazyHomes: true, SkipMoves: true, SlowSlots: true, LearnOdds: 16}, 150},
	// partial-crash is promote-crash with its crashes aimed at the
	// senders of batches that executed in part: a dead releaser's write
	// at some backups and not at others, the backup made home, reads and
	// fills of data beside a word never written, promotions before the
	// rebuild (docs/failover.md §7, "Data beside a word never written").
	{"partial-crash", Options{Nodes: 6, Pages: 4, Ops: 150, Faults: true, UnknownOutcomes: true, Evict: true, Crashes: 3, HomeCrashes: 3, Restarts: 2, Backups: 2, Fills: true, Promotions: 6, AsyncReconfig: true, LazyHomes: true, SkipMoves: true, SlowSlots: true, LearnOdds: 16, CrashPartial: true}, 100},
	// Persists (docs/durability.md §2): homes hand over stable copies of
	// pages under writes, crashes, fills and moves; every copy is the
	// page's latest data at its home word's version.
	{"persist", Options{Nodes: 6, Pages: 4, Ops: 150, Faults: true, UnknownOutcomes: true, Evict: true, Crashes: 3, HomeCrashes: 2, Restarts: 2, Backups: 2, Fills: true, Promotions: 3, Persists: 30, AsyncReconfig: true, LazyHomes: true, LearnOdds: 16}, 100},
	// Graceful leaves (docs/failover.md §11): a node marked draining
	// writes back what it holds Modified and its pages move to complete
	// backups while members learn each epoch slowly; it departs once it
	// holds and homes nothing, and its departure must revert nothing.
	// drain-crash adds crashes (of homes too, while a node drains),
	// restarts, a join, two backups, unknown outcomes and skipped epochs.
	{"drain", Options{Nodes: 6, Pages: 4, Ops: 150, Faults: true, Evict: true, Backups: 1, Fills: true, Drains: 2, AsyncReconfig: true, LazyHomes: true, LearnOdds: 32, Linearizability: true}, 100},
	{"drain-crash", Options{Nodes: 7, Pages: 4, Ops: 150, Faults: true, UnknownOutcomes: true, Evict: true, Crashes: 2, HomeCrashes: 2, Restarts: 1, Joins: 1, Backups: 2, Fills: true, Promotions: 2, Drains: 2, AsyncReconfig: true, LazyHomes: true, SkipMoves: true, SlowSlots: true, LearnOdds: 16}, 100},
	// Partitions under leases (docs/failover.md §9): a node's lease ends
	// (its client stops, its engine runs on), the members remove it while
	// it lives and fence it one by one as they learn the epoch, and it
	// closes later, a new incarnation joining; the pages it homes move
	// at its removal. partition-crash adds crashes (of homes too), a
	// restart, a join, promotions, two backups, skipped epochs and slow
	// slots.
	{"partition", Options{Nodes: 6, Pages: 4, Ops: 150, Faults: true, Evict: true, Backups: 1, Fills: true, Partitions: 2, AsyncReconfig: true, LazyHomes: true, LearnOdds: 32}, 100},
	{"partition-crash", Options{Nodes: 7, Pages: 4, Ops: 150, Faults: true, Evict: true, Crashes: 2, HomeCrashes: 2, Restarts: 1, Joins: 1, Backups: 2, Fills: true, Promotions: 2, Partitions: 2, AsyncReconfig: true, LazyHomes: true, SkipMoves: true, SlowSlots: true, LearnOdds: 16}, 100},
	{"promote-mutex", Options{Nodes: 4, Pages: 1, Ops: 60, Mutex: true, Faults: true, Backups: 1, Fills: true, Promotions: 4, AsyncReconfig: true, LazyHomes: true, LearnOdds: 32}, 50},
	// READs that are not atomic (mem.SplitReads): every READ of a slot or
	// a page (32 bytes) reads its last half when its batch is delivered
	// and the rest (the word among it) when a later step delivers the
	// rest, as a NIC or Go's copy may. Six writers and readers on two
	// pages, so that releases land between the two parts of read misses,
	// and dropped rests (of unknown outcome after an FAA or a CAS).
	{"split-reads", Options{Nodes: 6, Pages: 2, PageSize: 32, Ops: 100, Faults: true, Evict: true, Linearizability: true, SplitReads: true}, 100},
	{"split-reads-fill", Options{Nodes: 5, Pages: 4, PageSize: 32, Ops: 150, Faults: true, Evict: true, Crashes: 4, HomeCrashes: 4, Restarts: 4, Backups: 1, Fills: true, Persists: 30, AsyncReconfig: true, LazyHomes: true, LearnOdds: 16, SplitReads: true}, 100},
	{"tag-wrap", Options{Nodes: 5, Pages: 3, Ops: 100, Faults: true, Evict: true, Crashes: 2, AsyncReconfig: true, LazyHomes: true, Epoch: 16, EmptyEpochs: 40}, 125},
}

func totalShare() int {
	t := 0
	for _, c := range configs {
		t += c.share
	}
	return t
}

// TestSimSeeds runs the simulator over many seeds of every configuration:
// the CI share by default (4,075 seeds; a twentieth under the race
// detector), or -seeds=N in all (make sim SEEDS=N), in parallel with
// -workers. A failure prints the seed, the invariant and the trace, and
// the command that reruns that seed alone.
func TestSimSeeds(t *testing.T) {
	total := 0
	for _, c := range configs {
		if *flagConf != "" && *flagConf != c.name {
			continue
		}
		n := c.share
		if raceEnabled {
			// A seed runs on one goroutine (one worker by default):
			// the race detector has little to find, and a few seeds
			// show that much. The run without it does the full share.
			n = max(1, n/20)
		}
		if *flagSeeds > 0 {
			n = max(1, int(int64(c.share)*int64(*flagSeeds)/int64(totalShare())))
		}
		first := *flagFirst
		if *flagSeed >= 0 {
			first, n = *flagSeed, 1
		}
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			var (
				mu     sync.Mutex
				worst  Stats
				failed error
				next   = first
			)
			var wg sync.WaitGroup
			for w := 0; w < max(1, *flagWorkers); w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						mu.Lock()
						if failed != nil || next >= first+int64(n) {
							mu.Unlock()
							return
						}
						seed := next
						next++
						mu.Unlock()
						st, err := Run(seed, c.opts)
						mu.Lock()
						if err != nil && failed == nil {
							failed = fmt.Errorf("%v\nrerun: go test ./coherence/sim -run 'TestSimSeeds/%s$' -config=%s -seed=%d -v", err, c.name, c.name, seed)
						}
						worst.MaxLatency = max(worst.MaxLatency, st.MaxLatency)
						worst.SettleSteps = max(worst.SettleSteps, st.SettleSteps)
						worst.Steps = max(worst.Steps, st.Steps)
						worst.MaxOvertakes = max(worst.MaxOvertakes, st.MaxOvertakes)
						worst.CriticalSections += st.CriticalSections
						worst.Crashes += st.Crashes
						worst.HomeCrashes += st.HomeCrashes
						worst.Unknown += st.Unknown
						worst.UnknownExecuted += st.UnknownExecuted
						worst.EmptyEpochs += st.EmptyEpochs
						worst.Stamps += st.Stamps
						worst.Joins += st.Joins
						worst.JoinerOps += st.JoinerOps
						worst.Taints += st.Taints
						worst.PassedTainted += st.PassedTainted
						worst.SkippedMoves += st.SkippedMoves
						worst.Fills += st.Fills
						worst.FillsAbandoned += st.FillsAbandoned
						worst.FilledPromotions += st.FilledPromotions
						worst.MidFillCrashes += st.MidFillCrashes
						worst.Promotions += st.Promotions
						worst.DemoteStamps += st.DemoteStamps
						worst.DemoteClears += st.DemoteClears
						worst.LaggingHomeVerbs += st.LaggingHomeVerbs
						worst.StampOnly += st.StampOnly
						worst.Persisted += st.Persisted
						worst.PersistsAbandoned += st.PersistsAbandoned
						worst.Rests += st.Rests
						worst.Drains += st.Drains
						worst.DrainEvictions += st.DrainEvictions
						worst.DrainPromotions += st.DrainPromotions
						worst.Partitions += st.Partitions
						worst.ZombieVerbs += st.ZombieVerbs
						worst.ZombieFenced += st.ZombieFenced
						worst.ZombieReleases += st.ZombieReleases
						worst.ZombieHomes += st.ZombieHomes
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			if failed != nil {
				t.Fatal(failed)
			}
			if c.opts.Mutex && worst.CriticalSections == 0 {
				t.Fatal("no mutex client ever entered its critical section")
			}
			if n >= 20 && c.opts.Crashes > 0 && worst.Crashes == 0 || n >= 20 && c.opts.HomeCrashes > 0 && worst.HomeCrashes == 0 {
				t.Fatalf("no crash happened in %d seeds of a configuration with crashes", n)
			}
			if n >= 20 && c.opts.UnknownOutcomes && (worst.UnknownExecuted == 0 || worst.UnknownExecuted == worst.Unknown) {
				t.Fatalf("%d seeds with unknown outcomes had %d batches of unknown outcome, %d of them executed: not both kinds", n, worst.Unknown, worst.UnknownExecuted)
			}
			if n >= 20 && (c.opts.Joins > 0 || c.opts.Restarts > 0) && (worst.Joins == 0 || worst.JoinerOps == 0) {
				t.Fatalf("%d seeds with joins: %d joins, %d requests completed by joiners", n, worst.Joins, worst.JoinerOps)
			}
			if n >= 20 && c.opts.Taints > 0 && (worst.Taints == 0 || c.opts.HomeCrashes > 0 && !c.opts.Fills && worst.PassedTainted == 0) {
				t.Fatalf("%d seeds of a configuration with taints: %d taints, %d promotions passed over a tainted backup", n, worst.Taints, worst.PassedTainted)
			}
			if n >= 20 && c.opts.SkipMoves && worst.SkippedMoves == 0 {
				t.Fatalf("no node skipped a move in %d seeds of a configuration with SkipMoves", n)
			}
			if n >= 20 && c.opts.Fills && c.opts.HomeCrashes > 0 && (worst.Fills == 0 || worst.FilledPromotions == 0 || c.opts.MidFillCrashes && worst.MidFillCrashes == 0) {
				t.Fatalf("%d seeds with fills: %d pages filled, %d filled backups promoted, %d crashes during fills", n, worst.Fills, worst.FilledPromotions, worst.MidFillCrashes)
			}
			if n >= 20 && c.opts.Promotions > 0 && (worst.Promotions == 0 || worst.DemoteStamps == 0 || worst.DemoteClears == 0 || worst.LaggingHomeVerbs == 0) {
				t.Fatalf("%d seeds with promotions: %d moves from live homes, %d old slots stamped, %d cleared, %d batches at an old home's slot", n, worst.Promotions, worst.DemoteStamps, worst.DemoteClears, worst.LaggingHomeVerbs)
			}
			if n >= 20 && c.opts.Persists > 0 && (worst.Persisted == 0 || worst.PersistsAbandoned == 0) {
				t.Fatalf("%d seeds with persists: %d stable copies, %d given up", n, worst.Persisted, worst.PersistsAbandoned)
			}
			if n >= 20 && c.opts.Drains > 0 && (worst.Drains == 0 || worst.DrainEvictions == 0 || worst.DrainPromotions == 0) {
				t.Fatalf("%d seeds with drains: %d leaves, %d evictions of Modified pages, %d moves away from a draining home", n, worst.Drains, worst.DrainEvictions, worst.DrainPromotions)
			}
			if c.opts.Drains > 0 {
				t.Logf("drains: %d leaves, %d evictions of Modified pages, %d moves away from a draining home", worst.Drains, worst.DrainEvictions, worst.DrainPromotions)
			}
			if n >= 20 && c.opts.Partitions > 0 && (worst.Partitions == 0 || worst.ZombieVerbs == 0 || worst.ZombieFenced == 0) {
				t.Fatalf("%d seeds with partitions: %d healed, %d batches of removed nodes executed, %d fenced", n, worst.Partitions, worst.ZombieVerbs, worst.ZombieFenced)
			}
			if c.opts.Partitions > 0 {
				t.Logf("partitions: %d healed, %d batches of removed nodes executed, %d fenced, %d pages decided by a removed node's write-back, %d pages moved away from a removed live home", worst.Partitions, worst.ZombieVerbs, worst.ZombieFenced, worst.ZombieReleases, worst.ZombieHomes)
			}
			if n >= 20 && c.opts.SplitReads && worst.Rests == 0 {
				t.Fatalf("no READ was split in %d seeds of a configuration with SplitReads", n)
			}
			if c.opts.SplitReads {
				t.Logf("split reads: %d rests of batches delivered", worst.Rests)
			}
			if n >= 20 && c.opts.EmptyEpochs > 0 && worst.EmptyEpochs == 0 {
				t.Fatalf("no empty epoch happened in %d seeds of a configuration with empty epochs", n)
			}
			t.Logf("%d seeds in %v; worst: steps=%d settle=%d request latency=%d steps, overtaken by %d tenures; in all: %d critical sections, %d crashes (%d of homes), %d batches of unknown outcome (%d executed), %d empty epochs, %d stamp requests, %d joins, %d requests of joiners, %d taints (%d promotions passed over a tainted backup), %d epochs learnt skipping a move",
				n, time.Since(start).Round(time.Millisecond), worst.Steps, worst.SettleSteps, worst.MaxLatency, worst.MaxOvertakes, worst.CriticalSections, worst.Crashes, worst.HomeCrashes, worst.Unknown, worst.UnknownExecuted, worst.EmptyEpochs, worst.Stamps, worst.Joins, worst.JoinerOps, worst.Taints, worst.PassedTainted, worst.SkippedMoves)
			if c.opts.Fills {
				t.Logf("fills: %d pages filled, %d fills given up, %d promotions of filled backups, %d crashes during fills", worst.Fills, worst.FillsAbandoned, worst.FilledPromotions, worst.MidFillCrashes)
			}
			if c.opts.Persists > 0 {
				t.Logf("persists: %d stable copies, %d given up", worst.Persisted, worst.PersistsAbandoned)
			}
			if c.opts.Promotions > 0 {
				t.Logf("promotions: %d moves from live homes, %d old slots stamped, %d cleared, %d batches at an old home's slot", worst.Promotions, worst.DemoteStamps, worst.DemoteClears, worst.LaggingHomeVerbs)
			}
			if n >= 2000 && c.opts.CrashPartial && worst.StampOnly == 0 {
				t.Fatalf("%d seeds of a configuration with CrashPartial: no backup became a home with a dead releaser's stamp beside the copy before", n)
			}
			if worst.StampOnly > 0 {
				t.Logf("partial releases: %d backups became homes with a dead releaser's stamp beside the copy before", worst.StampOnly)
			}
		})
		total += n
	}
	t.Logf("%d seeds in all", total)
}

func Example_options() {
	fmt.Println(configs[0].opts)
	// Output: nodes=3 pages=2 ops=60 hot=false faults=false unknown=false crashes=0 home-crashes=0 async-reconfig=false evict=false mutex=false lin=true
}

// TestSimRegressions reruns seeds that once broke an invariant, each in the
// configuration it failed in.
func TestSimRegressions(t *testing.T) {
	for _, tc := range []struct {
		config string
		seed   int64
		why    string
	}{
		// A downgrade's CAS executed, the next tenure was taken by a node
		// that crashed before its invalidation arrived, and the
		// reconfiguration kept the copy of the downgrade in flight: a
		// stale S copy outlived a later store.
		{"wide-20", 3104303, "reconfiguration during a downgrade"},
		// The trust rule at first let a READ of the slot that executed
		// before a departed acquirer's CAS (the acquirer died before its
		// invalidation arrived) install a copy after the reconfiguration
		// had dropped every Shared copy; the tag used to reject it. A
		// later writer did not invalidate that copy.
		{"crash", 16338, "read in flight across a departure"},
		{"async-reconfig", 2110, "read in flight across a departure"},
		{"lazy-home-crash", 6895, "read in flight across a departure"},
		// A release of unknown outcome was still being resolved (the
		// READ of the word lost) when its home died; it had executed and
		// a later tenure had stored and been evicted to I. The frozen
		// release claimed its tenure and, no Invalid report saying
		// more, the new home made it the holder again with stale data.
		// Reports now say which tenure an Invalid node held last.
		{"unknown-outcome", 501209, "release of unknown outcome across a home crash"},
	} {
		t.Run(fmt.Sprintf("%s/%d", tc.config, tc.seed), func(t *testing.T) {
			for _, c := range configs {
				if c.name == tc.config {
					if _, err := Run(tc.seed, c.opts); err != nil {
						t.Fatalf("%s: %v", tc.why, err)
					}
					return
				}
			}
			t.Fatalf("no configuration %q", tc.config)
		})
	}
}

// mustCatch runs up to 400 seeds of configuration config broken by
// breakIt, and fails t unless some seed breaks an invariant: the proof
// that the configuration's checks can fail.
func mustCatch(t *testing.T, config string, breakIt func(*Options), what string) {
	t.Helper()
	var opts Options
	for _, c := range configs {
		if c.name == config {
			opts = c.opts
		}
	}
	breakIt(&opts)
	const seeds = 400
	for seed := int64(1); seed <= seeds; seed++ {
		if _, err := runOnce(seed, opts); err != nil {
			t.Logf("caught at seed %d: %.300s", seed, err)
			return
		}
	}
	t.Fatalf("%d seeds %s and no check failed", seeds, what)
}

// TestSimCatchesEarlyPromotion proves the checks of fills: with
// EarlyPromote the driver moves a crashed home's pages to a backup whose
// fill is not done (I9 broken on purpose), and some seed must fail.
func TestSimCatchesEarlyPromotion(t *testing.T) {
	mustCatch(t, "fill", func(o *Options) { o.EarlyPromote, o.MidFillCrashes = true, true },
		"promoted backups before their fills")
}

// TestSimCatchesLeaveHolding checks that the drain configuration can fail:
// with LeaveHolding a draining node departs without writing back its
// Modified pages and the driver does not check it at the departure, and
// the data checks must see the writes it took with it.
func TestSimCatchesLeaveHolding(t *testing.T) {
	mustCatch(t, "drain", func(o *Options) { o.LeaveHolding = true },
		"had draining nodes leave with their Modified pages")
}

// TestSimCatchesUnsafeLease checks that the partition configuration can
// fail: with UnsafeLease the partitioned node's client goes on after its
// removal (its lease is not honoured), and the checks must see its stores
// beside the majority's.
func TestSimCatchesUnsafeLease(t *testing.T) {
	mustCatch(t, "partition", func(o *Options) { o.UnsafeLease = true },
		"let a removed node's client go on")
}
