package node

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
)

// The node layer of fills (docs/failover.md §6, "As built in the
// daemon"). On every protocol epoch, for each shard this node is home of,
// every backup of the shard that is not complete (placement.go: a
// replacement without a completeness record) is filled: the home lists
// the shard's populated pages (engine.Populated: a page left out was
// never written) and steps coherence.Fill for them, in chunks. When every
// page of a shard is reported filled to a backup, the home records the
// backup complete for the shard in the directory (RecordFilled), off the
// engine's goroutine: the engine never waits for Raft. A fill given up
// (coherence.ErrFillAbandoned: the backup departed or left the set, or
// this node is no longer the home) or a record refused is tried again at
// the next epoch if the shard still needs it.
//
// Why no backup slot is cleared: with the chains of placement.go a member
// leaves a shard's backups only by departing (its memory goes with its
// process), by a failure verdict (it is never a backup of the region
// again) or when the home moves past it (it is then before the home in
// the chain and never a backup of the shard again). So a slot never
// enters a backup set again once it has left one, and a member enters a
// set with the slot it has had since its start: zero, as coherence.Fill
// requires. Giving the memory of such slots back to the system is left
// to do.

// fillChunk is how many pages one coherence.Fill names.
const fillChunk = 256

// fillKey names the fill of one shard to one backup.
type fillKey struct {
	shard uint64
	to    ids.NodeID
}

// fillRun is one fill of a shard to a backup.
type fillRun struct {
	pages map[ids.PageNo]bool // not reported filled yet
	since ids.Epoch           // the directory epoch of the view it began in
	// failed: a page was given up, or the record refused; done: the
	// record is proposed or committed.
	failed, done bool
}

// regionFills drives the fills of one region at this node.
type regionFills struct {
	es   *engines
	re   *regionEngine
	stop chan struct{}
	kick chan struct{} // buffered 1

	mu      sync.Mutex
	pm      *protoMap // the last epoch to plan for (nil: planned)
	promo   *protoMap // the last view to consider promotions in (nil: done)
	results []coherence.FillDone
	runs    map[fillKey]*fillRun // owned by the loop
	// proposing: a promotion is being proposed. sent are the shards of
	// the last one committed, and sentAt the region's promotion records
	// then: a view that does not list more records yet is older than the
	// commit, and those shards are not proposed again from it. All three
	// under mu.
	proposing bool
	sent      map[uint64]bool
	sentAt    int
}

func newRegionFills(es *engines, re *regionEngine) *regionFills {
	return &regionFills{es: es, re: re, stop: make(chan struct{}), kick: make(chan struct{}, 1), runs: map[fillKey]*fillRun{}}
}

// filled is the engine's Config.Filled: it must not block.
func (rf *regionFills) filled(d []coherence.FillDone) {
	rf.mu.Lock()
	rf.results = append(rf.results, d...)
	rf.mu.Unlock()
	rf.wake()
}

// plan asks for the fills of pm's epoch, once the engine is in it.
func (rf *regionFills) plan(pm *protoMap) {
	rf.mu.Lock()
	rf.pm = pm
	rf.mu.Unlock()
	rf.wake()
}

func (rf *regionFills) wake() {
	select {
	case rf.kick <- struct{}{}:
	default:
	}
}

// close stops the loop (the engine is closed or closing).
func (rf *regionFills) close() { close(rf.stop) }

func (rf *regionFills) loop() {
	for {
		select {
		case <-rf.stop:
			return
		case <-rf.kick:
		}
		rf.mu.Lock()
		pm, res, promo := rf.pm, rf.results, rf.promo
		rf.pm, rf.results, rf.promo = nil, nil, nil
		rf.mu.Unlock()
		if pm != nil {
			rf.start(pm)
		}
		rf.count(res)
		if promo != nil && !rf.propose(promo) {
			// A proposal is in flight: this view is considered when it
			// ends (with the latest view then).
			rf.mu.Lock()
			if rf.promo == nil {
				rf.promo = promo
			}
			rf.mu.Unlock()
		}
	}
}

// considerPromotion asks for the promotions this node may propose in pm
// (any view: a completeness record does not move the protocol epoch).
func (rf *regionFills) considerPromotion(pm *protoMap) {
	rf.mu.Lock()
	rf.promo = pm
	rf.mu.Unlock()
	rf.wake()
}

// propose proposes this incarnation's promotion to home of the shards it
// is the preferred member of (placement.go: the rendezvous winner among
// the usable members) when it is not their home and holds them complete
// by a completeness record of its own (the directory applies a promotion
// only for shards such a record covers): docs/failover.md §6, step 5. One
// proposal is in flight at a time: propose returns false, doing nothing,
// while one is, and the view is considered when it ends; a refused or
// failed proposal is tried again a second later, with the latest view.
func (rf *regionFills) propose(pm *protoMap) bool {
	self := ids.NodeID(rf.es.self.Load())
	me, ok := pm.byProto[self]
	if !ok || me.departed {
		return true
	}
	rf.mu.Lock()
	busy := rf.proposing
	rf.mu.Unlock()
	if busy {
		return false
	}
	r, rc := rf.re.region, rf.re.chains
	recs := pm.fillRecords(r.ID)
	rf.mu.Lock()
	sentBefore := rf.sent
	stale := len(pm.promoteRecords(r.ID)) <= rf.sentAt
	rf.mu.Unlock()
	var shards []uint64
	for i := range r.Shards() {
		if stale && sentBefore[i] {
			continue
		}
		s := placement.Shard{Region: r.ID, Index: i}
		sp := rc.place(s, pm)
		if len(sp.c) == 0 || sp.preferred != self || sp.c[sp.hi] == self || pm.departedAt(sp.c[sp.hi]) != 0 {
			continue
		}
		if !rc.completeAt(sp, self, s, never, pm) || !slices.ContainsFunc(recs, func(f directory.FillRecord) bool {
			return f.Proto == self && f.Covers(i)
		}) {
			continue
		}
		shards = append(shards, i)
	}
	if len(shards) == 0 {
		return true
	}
	rf.mu.Lock()
	rf.proposing = true
	rf.mu.Unlock()
	ranges := shardRanges(shards)
	sent, sentAt := map[uint64]bool{}, len(pm.promoteRecords(r.ID))
	for _, i := range shards {
		sent[i] = true
	}
	go func() {
		ctx, cancel := context.WithTimeout(rf.es.n.ctx, 10*time.Second)
		err := rf.es.n.dir.Promote(ctx, r.ID, me.node, me.nonce, ranges)
		cancel()
		if err != nil {
			rf.es.log.Warn("promotion not recorded: proposed again", "region", r.Name, "shards", len(shards), "err", err)
		} else {
			rf.es.log.Info("promoted to home of the shards this node is preferred for", "region", r.Name, "shards", len(shards),
				"ranges", len(ranges))
		}
		if err != nil {
			select { // not at once: the directory may be electing a leader
			case <-time.After(time.Second):
			case <-rf.stop:
			}
		}
		rf.mu.Lock()
		rf.proposing = false
		if err == nil {
			// The view that records it comes through follow, which
			// considers the promotions again.
			rf.sent, rf.sentAt = sent, sentAt
		} else if rf.promo == nil {
			rf.promo = rf.es.pv.p.Load()
		}
		rf.mu.Unlock()
		rf.wake() // a view deferred meanwhile, or the retry
	}()
	return true
}

// shardRanges turns shard indexes into sorted, disjoint ranges.
func shardRanges(shards []uint64) []directory.ShardRange {
	slices.Sort(shards)
	var ranges []directory.ShardRange
	for _, s := range shards {
		if n := len(ranges); n > 0 && ranges[n-1].End == s {
			ranges[n-1].End++
			continue
		}
		ranges = append(ranges, directory.ShardRange{First: s, End: s + 1})
	}
	return ranges
}

// start begins the fills that pm's placement needs and this node's home
// owes, and forgets those it no longer needs.
func (rf *regionFills) start(pm *protoMap) {
	self := ids.NodeID(rf.es.self.Load())
	r, rc := rf.re.region, rf.re.chains
	need := map[fillKey]bool{}
	for i := range r.Shards() {
		s := placement.Shard{Region: r.ID, Index: i}
		if rc.shardHome(s, pm) != self {
			continue
		}
		_, incomplete := rc.completeBackups(s, pm)
		for _, to := range incomplete {
			k := fillKey{i, to}
			need[k] = true
			if run := rf.runs[k]; run != nil && !run.failed {
				continue // under way, or recorded
			}
			first := ids.PageNo(i * r.PagesPerShard())
			pages := rf.re.e.Populated(first, first+ids.PageNo(r.PagesPerShard()))
			run := &fillRun{pages: make(map[ids.PageNo]bool, len(pages)), since: pm.dirEpoch}
			for _, p := range pages {
				run.pages[p] = true
			}
			rf.runs[k] = run
			rf.es.log.Info("filling a backup", "region", r.Name, "shard", i, "to", to, "pages", len(pages))
			for len(pages) > 0 {
				n := min(len(pages), fillChunk)
				rf.re.e.Fill(pages[:n], to)
				pages = pages[n:]
			}
		}
	}
	for k := range rf.runs {
		if !need[k] {
			delete(rf.runs, k)
		}
	}
	rf.count(nil)
}

// count takes fill results and records the shards whose fills completed.
func (rf *regionFills) count(res []coherence.FillDone) {
	r := rf.re.region
	for _, d := range res {
		run := rf.runs[fillKey{r.ShardOf(d.Page).Index, d.To}]
		if run != nil && errors.Is(d.Err, errRecordRefused) {
			run.done, run.failed = false, true
			continue
		}
		if run == nil || run.done {
			continue
		}
		if d.Err != nil {
			if !run.failed {
				rf.es.log.Info("fill given up: tried again at the next epoch", "region", r.Name, "page", d.Page, "to", d.To, "err", d.Err)
			}
			run.failed = true
			continue
		}
		delete(run.pages, d.Page)
	}
	// Complete runs, by backup and begin epoch: one record each.
	type recKey struct {
		to    ids.NodeID
		since ids.Epoch
	}
	recs := map[recKey][]uint64{}
	for k, run := range rf.runs {
		if !run.done && !run.failed && len(run.pages) == 0 {
			run.done = true
			rk := recKey{k.to, run.since}
			recs[rk] = append(recs[rk], k.shard)
		}
	}
	for rk, shards := range recs {
		go rf.record(rk.to, rk.since, shards)
	}
}

// record proposes the completeness record of backup to for shards. A
// refusal marks the runs failed, to be tried again at the next epoch.
func (rf *regionFills) record(to ids.NodeID, since ids.Epoch, shards []uint64) {
	r := rf.re.region
	pm := rf.es.pv.p.Load()
	in, ok := pm.byProto[to]
	var err error
	if !ok || in.departed {
		err = errors.New("the backup is no member")
	} else {
		ranges := shardRanges(shards)
		for try := 0; try < 5; try++ {
			ctx, cancel := context.WithTimeout(rf.es.n.ctx, 10*time.Second)
			err = rf.es.n.dir.RecordFilled(ctx, r.ID, in.node, in.nonce, since, ranges)
			cancel()
			if err == nil || errors.Is(err, directory.ErrStaleIncarnation) || errors.Is(err, directory.ErrInvalidMember) ||
				errors.Is(err, directory.ErrNoRegion) || errors.Is(err, directory.ErrBadCommand) || rf.es.n.ctx.Err() != nil {
				break
			}
			select {
			case <-time.After(time.Duration(200*(try+1)) * time.Millisecond):
			case <-rf.stop:
				return
			}
		}
	}
	if err == nil {
		rf.es.log.Info("backup recorded complete", "region", r.Name, "to", to, "node", in.node, "shards", len(shards), "since", since)
		return
	}
	rf.es.log.Warn("backup fill not recorded: tried again at the next epoch", "region", r.Name, "to", to, "shards", len(shards), "err", err)
	rf.mu.Lock()
	rf.results = append(rf.results, refusedRecord(r, to, shards)...)
	rf.mu.Unlock()
	rf.wake()
}

// refusedRecord turns a refused record into given-up fills of the shards'
// first pages, which reopen their runs as failed (count).
func refusedRecord(r directory.Region, to ids.NodeID, shards []uint64) []coherence.FillDone {
	out := make([]coherence.FillDone, len(shards))
	for i, s := range shards {
		out[i] = coherence.FillDone{Page: ids.PageNo(s * r.PagesPerShard()), To: to, Err: errRecordRefused}
	}
	return out
}

// errRecordRefused marks a run whose completeness record was refused.
var errRecordRefused = errors.New("node: completeness record refused")
