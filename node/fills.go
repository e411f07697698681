package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/node/pagestore"
)

// The node layer of fills (docs/failover.md §6, "As built in the
// daemon"). On every protocol epoch, for each shard this node is home of,
// every backup of the shard that is not complete (placement.go: a
// replacement without a completeness record) is filled: the home lists
// the shard's populated pages (engine.Populated: a page left out was
// never written) and steps coherence.Fill for them, in chunks. When every
// page of a shard is reported filled to a backup, the home records the
// backup complete for the shard in the directory (RecordFilled), off the
// engine's goroutine: the engine never waits for Raft. For a durable
// region it first has the backup write the shard's pages to its page store
// (persistFill, docs/durability.md §3), so that a completeness record
// means "in memory and on disk". The same loop brings lost shards back
// (revive, docs/durability.md §4). A fill given up
// (coherence.ErrFillAbandoned: the backup departed or left the set, or
// this node is no longer the home) or a record refused is tried again at
// the next epoch if the shard still needs it.
//
// Which backup slots are cleared: with the chains of placement.go a member
// leaves a shard's backups only by departing (its memory goes with its
// process), by a failure verdict (it is never a backup of the region
// again), when the home moves past it (it is then before the home in the
// chain, and only a promotion brings it back), or when a promotion
// demotes it. A demoted home stays in the set (incomplete until filled)
// with the slots it had as the home, and coherence.Fill requires the
// slots of a backup that enters a set to read zero for the pages it
// skips (never written at the home). So every member that enters a set
// anew clears its slots of the shard, once the engine says no member uses
// them as home slots any more and before any fill (regions.go,
// enteredAnew and clearEntered; docs/failover.md §7). Giving the memory of
// slots that left a set back to the system is left to do.

// fillChunk is how many pages one coherence.Fill names.
const fillChunk = 256

// fillWindow bounds the pages of a region whose fills have been asked of
// the engine and not reported yet; the others wait in regionFills.queue.
// The state machine keeps a home duty busy for each page being filled,
// and walks every busy duty at every tick: when a restart made every
// backup of a 1 GiB region incomplete at once, asking for all 262,144
// pages left each tick walking them, at 92% of a CPU, and the fills
// crawled (docs/benchmarks.md, "Durable regions on a cluster"). Tests
// set fillWindowPages.
const fillWindow = 2048

var fillWindowPages atomic.Int64

func init() { fillWindowPages.Store(fillWindow) }

// fillKey names the fill of one shard to one backup.
type fillKey struct {
	shard uint64
	to    ids.NodeID
}

// fillRun is one fill of a shard to a backup.
type fillRun struct {
	pages  map[ids.PageNo]bool // not reported filled yet
	toSend []ids.PageNo        // not asked of the engine yet (fillWindow)
	since  ids.Epoch           // the directory epoch of the view it began in
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
	// queue holds the runs with pages not asked of the engine yet, in
	// the order planned; outstanding counts, per run, the pages asked and
	// not reported, and inflight their sum (at most about fillWindow).
	// Owned by the loop.
	queue       []fillKey
	outstanding map[fillKey]int
	inflight    int
	// proposing: a promotion is being proposed. sent are the shards of
	// the last one committed, and sentAt the count of promotions then
	// (View.Promotions): a view that does not count more yet is older
	// than the commit, and those shards are not proposed again from it.
	// All three under mu.
	proposing bool
	sent      map[uint64]bool
	sentAt    uint64
	// reviving: a revival of lost shards is under way (revive); loaded
	// are the shards this engine loaded from the page store. Under mu.
	reviving bool
	loaded   map[uint64]bool
	// checkpointing: a placement checkpoint is being recorded; tooLarge:
	// the last one computed did not fit in a command (logged once). Under
	// mu.
	checkpointing, tooLarge bool
}

func newRegionFills(es *engines, re *regionEngine) *regionFills {
	return &regionFills{es: es, re: re, stop: make(chan struct{}), kick: make(chan struct{}, 1), runs: map[fillKey]*fillRun{},
		outstanding: map[fillKey]int{}}
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

// backOff waits a second before a proposal is tried again (not at once:
// the directory may be electing a leader), or until the loop stops.
func (rf *regionFills) backOff() {
	select {
	case <-time.After(time.Second):
	case <-rf.stop:
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
		if promo != nil {
			rf.revive(promo)
			rf.checkpoint(promo)
		}
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
// by a completeness record of its own or since the region's creation (the
// directory applies a promotion only for such shards): docs/failover.md
// §6, step 5, and §11 (a draining home's shards). One
// proposal is in flight at a time: propose returns false, doing nothing,
// while one is, and the view is considered when it ends; a refused or
// failed proposal is tried again a second later, with the latest view.
func (rf *regionFills) propose(pm *protoMap) bool {
	self := ids.NodeID(rf.es.self.Load())
	me, ok := pm.byProto[self]
	if !ok || me.departed || me.drainedAt != 0 {
		return true // a draining member is never promoted
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
	stale := pm.promotions <= rf.sentAt
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
		// Complete by a record of its own, or since the region's creation
		// (a creation backup preferred over a draining home: the directory
		// takes it without a record, directory.Region.createdHolding).
		if !rc.completeAt(sp, self, s, never, pm) || (sp.since[self] != r.Epoch && !slices.ContainsFunc(recs, func(f directory.FillRecord) bool {
			return f.Proto == self && f.Covers(i)
		})) {
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
	sent, sentAt := map[uint64]bool{}, pm.promotions
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
			rf.es.log.Info("promoted to home of the shards this node is preferred for", "region", r.Name, "shards", len(shards), "list", ranges,
				"ranges", len(ranges))
		}
		if err != nil {
			rf.backOff()
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

// checkpoint proposes a placement checkpoint of the region under pm
// (directory.RecordCheckpoint, placement.go walkFrom) when it lets the
// directory drop at least Config.CheckpointAfter records: completeness records of
// incarnations departed by pm's epoch, and promotion records. Each
// checkpoint is the placement every member computes for pm, so any member
// could propose it; the member with the lowest protocol id does, one at a
// time. A region of more than maxCachedChains shards, whose placements
// are not kept, or whose checkpoint does not fit in a command, is not
// checkpointed: its records stay.
func (rf *regionFills) checkpoint(pm *protoMap) {
	self := ids.NodeID(rf.es.self.Load())
	r, rc := rf.re.region, rf.re.chains
	after := rf.es.n.cfg.CheckpointAfter
	if after == 0 || len(pm.members) == 0 || pm.members[0] != self || pm.known() == 0 || r.Shards() > maxCachedChains {
		return
	}
	if at, _ := pm.checkpoint(r.ID); at >= pm.dirEpoch {
		return
	}
	drop := 0
	for _, f := range pm.fillRecords(r.ID) {
		if d := pm.departedAt(f.Proto); d != 0 && d <= pm.dirEpoch {
			drop++
		}
	}
	for _, p := range pm.promoteRecords(r.ID) {
		if p.At <= pm.dirEpoch {
			drop++
		}
	}
	rf.mu.Lock()
	busy := rf.checkpointing
	if drop < after || busy {
		rf.mu.Unlock()
		return
	}
	rf.checkpointing = true
	rf.mu.Unlock()
	b := rc.checkpoint(pm).Encode()
	if len(b) > directory.MaxCheckpointSize {
		rf.mu.Lock()
		logged := rf.tooLarge
		rf.tooLarge, rf.checkpointing = true, false
		rf.mu.Unlock()
		if !logged {
			rf.es.log.Warn("placement checkpoint too large to record: the region's records are kept", "region", r.Name,
				"bytes", len(b), "max", directory.MaxCheckpointSize)
		}
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(rf.es.n.ctx, 10*time.Second)
		err := rf.es.n.dir.RecordCheckpoint(ctx, r.ID, b)
		cancel()
		switch {
		case err == nil:
			rf.es.log.Info("placement checkpoint recorded", "region", r.Name, "epoch", pm.dirEpoch, "bytes", len(b), "records_dropped", drop)
		case errors.Is(err, directory.ErrStaleCheckpoint):
		default:
			rf.es.log.Warn("placement checkpoint not recorded: proposed again with a later view", "region", r.Name, "err", err)
			rf.backOff()
		}
		rf.mu.Lock()
		rf.checkpointing = false
		rf.mu.Unlock()
	}()
}

// revive takes the lost shards of the region that this incarnation should
// bring back (docs/durability.md §4, placement.go revive). For a durable
// region: the shards whose first candidate node with an incarnation alive
// is this node. It loads their pages from its page store into its slots
// (engine.LoadSlot), then records itself complete for them and proposes
// its promotion; the placement makes it their home in the promotion's
// epoch, and the engine rebuilds their words from the members' reports
// over the loaded slots, as for a backup promoted. For a memory region:
// this incarnation records, for every lost shard of which it holds no
// page, a completeness record made after the loss (what the placement
// reads as "holds nothing": noCopiesLeft); the shard's preferred member,
// once no process can hold a copy, proposes its promotion, and the shard
// starts over empty ("contents lost at restart"). Both only once the
// cluster turned over (turnedOver: a restart of the whole cluster): a
// memory shard lost while processes of the region's time lived on stays
// lost. One revival is under way at a time; a failed one is tried again a
// second later with the latest view.
func (rf *regionFills) revive(pm *protoMap) {
	self := ids.NodeID(rf.es.self.Load())
	me, ok := pm.byProto[self]
	if !ok || me.departed {
		return
	}
	r, rc := rf.re.region, rf.re.chains
	if !rc.anyDeparted(pm) {
		return
	}
	durable := r.Durability == directory.DurabilitySynced
	recs := pm.fillRecords(r.ID)
	recorded := func(i uint64, lostAt ids.Epoch) bool {
		return slices.ContainsFunc(recs, func(f directory.FillRecord) bool {
			return f.Proto == self && f.Since >= lostAt && f.Covers(i)
		})
	}
	var load, record, promote []uint64
	for i := range r.Shards() {
		s := placement.Shard{Region: r.ID, Index: i}
		sp := rc.place(s, pm)
		switch {
		case sp.lostAt == 0 || len(sp.c) == 0:
		case durable:
			if rc.reviver(sp, pm) == me.node {
				load, record, promote = append(load, i), append(record, i), append(promote, i)
			}
		case !turnedOver(r.Epoch, sp.lostAt, never, pm):
			// A loss the cluster lived through stays a loss.
		case !recorded(i, sp.lostAt):
			if rf.holdsNothing(i) {
				record = append(record, i)
			}
		case sp.preferred == self && noCopiesLeft(sp, s, r.Epoch, never, pm):
			promote = append(promote, i)
		}
	}
	if len(record) == 0 && len(promote) == 0 {
		return
	}
	rf.mu.Lock()
	if rf.reviving {
		rf.mu.Unlock()
		return // tried again with the latest view when it ends
	}
	rf.reviving = true
	if rf.loaded == nil {
		rf.loaded = map[uint64]bool{}
	}
	rf.mu.Unlock()
	go func() {
		err := rf.reviveShards(me, pm.dirEpoch, load, record, promote)
		if err != nil {
			rf.es.log.Warn("lost shards not revived: tried again", "region", r.Name, "err", err)
			rf.backOff()
		}
		rf.mu.Lock()
		rf.reviving = false
		if rf.promo == nil {
			rf.promo = rf.es.pv.p.Load()
		}
		rf.mu.Unlock()
		rf.wake()
	}()
}

// holdsNothing reports whether this node's page cache holds no page of
// shard i (of a memory region whose home departed: no miss of it succeeds
// any more, so the answer cannot go stale).
func (rf *regionFills) holdsNothing(i uint64) bool {
	r := rf.re.region
	first := i * r.PagesPerShard()
	n := min(r.PagesPerShard(), r.Pages()-first)
	held, err := rf.es.n.cache.Held(r.ID, ids.PageNo(first), n)
	return err == nil && len(held) == 0
}

// reviveShards loads shards of load from the page store, proposes the
// completeness record of incarnation me for the shards of record, its
// fills (the load, or nothing held) begun in directory epoch since, then
// its promotion for the shards of promote.
func (rf *regionFills) reviveShards(me incarnation, since ids.Epoch, load, record, promote []uint64) error {
	r := rf.re.region
	ctx, cancel := context.WithTimeout(rf.es.n.ctx, persistCallTimeout)
	defer cancel()
	pages := 0
	for _, i := range load {
		rf.mu.Lock()
		done := rf.loaded[i]
		rf.mu.Unlock()
		if done {
			continue
		}
		n, err := rf.load(ctx, i)
		if err != nil {
			return err
		}
		pages += n
		rf.mu.Lock()
		rf.loaded[i] = true
		rf.mu.Unlock()
	}
	if len(load) > 0 {
		rf.es.log.Info("lost shards loaded from the page store", "region", r.Name, "shards", len(load), "pages", pages)
	}
	if len(record) > 0 {
		if err := rf.es.n.dir.RecordFilled(ctx, r.ID, me.node, me.nonce, since, shardRanges(slices.Clone(record))); err != nil {
			return err
		}
	}
	if len(promote) > 0 {
		if err := rf.es.n.dir.Promote(ctx, r.ID, me.node, me.nonce, shardRanges(slices.Clone(promote))); err != nil {
			return err
		}
		what := "loaded from this node's page store"
		if len(load) == 0 {
			what = "started over empty: contents lost at restart"
		}
		rf.es.log.Info("home of lost shards: "+what, "region", r.Name, "shards", len(promote))
	}
	return nil
}

// load writes the pages of shard i that this node's page store holds into
// the engine's slots, and returns how many.
func (rf *regionFills) load(ctx context.Context, i uint64) (int, error) {
	r := rf.re.region
	store := rf.es.n.pages
	if store == nil {
		return 0, errors.New("node: no page store to load from")
	}
	first := i * r.PagesPerShard()
	end := min(first+r.PagesPerShard(), r.Pages())
	n := 0
	err := store.Scan(r.ID, first, end, func(p pagestore.Page) error {
		if len(p.Data) != int(r.PageSize) {
			return fmt.Errorf("node: stored page %d of region %q has %d bytes, not %d", p.No, r.Name, len(p.Data), r.PageSize)
		}
		n++
		return rf.re.e.LoadSlot(ctx, ids.PageNo(p.No), p.Version, p.Data)
	})
	if err != nil {
		return 0, fmt.Errorf("load shard %d from the page store: %w", i, err)
	}
	return n, nil
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
			run := &fillRun{pages: make(map[ids.PageNo]bool, len(pages)), toSend: pages, since: pm.dirEpoch}
			for _, p := range pages {
				run.pages[p] = true
			}
			rf.runs[k] = run
			if len(pages) > 0 {
				rf.queue = append(rf.queue, k)
			}
			rf.es.log.Info("filling a backup", "region", r.Name, "shard", i, "to", to, "pages", len(pages),
				"queued_pages", rf.queuedPages())
		}
	}
	for k := range rf.runs {
		if !need[k] {
			delete(rf.runs, k)
		}
	}
	rf.count(nil)
}

// queuedPages counts the pages of the queued runs not asked yet.
func (rf *regionFills) queuedPages() int {
	n := 0
	for _, k := range rf.queue {
		if run := rf.runs[k]; run != nil {
			n += len(run.toSend)
		}
	}
	return n
}

// pump asks the engine for the fills of queued pages while fewer than
// fillWindow are under way, in the order planned. A run dropped (no
// longer needed) or failed (tried again at the next epoch) is skipped.
func (rf *regionFills) pump() {
	window := int(fillWindowPages.Load())
	for rf.inflight < window && len(rf.queue) > 0 {
		k := rf.queue[0]
		run := rf.runs[k]
		if run == nil || run.failed || len(run.toSend) == 0 {
			rf.queue = rf.queue[1:]
			continue
		}
		n := min(len(run.toSend), fillChunk, window-rf.inflight)
		rf.re.e.Fill(run.toSend[:n], k.to)
		run.toSend = run.toSend[n:]
		rf.outstanding[k] += n
		rf.inflight += n
	}
}

// count takes fill results and records the shards whose fills completed.
func (rf *regionFills) count(res []coherence.FillDone) {
	r := rf.re.region
	defer rf.pump()
	for _, d := range res {
		k := fillKey{r.ShardOf(d.Page).Index, d.To}
		if rf.outstanding[k] > 0 {
			rf.outstanding[k]--
			rf.inflight--
			if rf.outstanding[k] == 0 {
				delete(rf.outstanding, k)
			}
		}
		run := rf.runs[k]
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
	} else if r.Durability == directory.DurabilitySynced {
		// A completeness record of a durable region means "in memory and
		// on disk": the pages go to the backup's store first.
		err = rf.persistFill(in.node, shards)
	}
	if err == nil {
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
		rf.es.log.Info("backup recorded complete", "region", r.Name, "to", to, "node", in.node, "shards", len(shards), "since", since,
			"ranges", shardRanges(slices.Clone(shards)))
		return
	}
	rf.es.log.Warn("backup fill not recorded: tried again at the next epoch", "region", r.Name, "to", to, "shards", len(shards), "err", err)
	rf.mu.Lock()
	rf.results = append(rf.results, refusedRecord(r, to, shards)...)
	rf.mu.Unlock()
	rf.wake()
}

// persistFill has the backup, node `to`, write the populated pages of
// shards to its page store (persister.persistFill), before its
// completeness record is proposed.
func (rf *regionFills) persistFill(to ids.NodeID, shards []uint64) error {
	r := rf.re.region
	var pages []ids.PageNo
	for _, i := range shards {
		first := ids.PageNo(i * r.PagesPerShard())
		pages = append(pages, rf.re.e.Populated(first, first+ids.PageNo(r.PagesPerShard()))...)
	}
	ctx, cancel := context.WithTimeout(rf.es.n.ctx, persistCallTimeout)
	defer cancel()
	go func() {
		select {
		case <-rf.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := rf.es.n.persist.persistFill(ctx, rf.re, to, pages); err != nil {
		return err
	}
	rf.es.log.Info("filled pages persisted at the backup", "region", r.Name, "to", to, "shards", len(shards), "pages", len(pages))
	return nil
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
