package node

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/node/engine"
	"github.com/dsmkit/dsm/node/localcache"
	"github.com/dsmkit/dsm/rdma"
)

// coherenceEpoch is the protocol epoch before any member: protoMap adds
// one per protocol id given out and one per id departed.
const coherenceEpoch ids.Epoch = 16

// engineTick is the protocol clock of the engines.
const engineTick = 2 * time.Millisecond

// ErrNotServed reports a region this node does not serve: one recorded
// without homes, or whose engine did not start.
var ErrNotServed = errors.New("node: region not served on this node")

// engines runs one coherence engine per region and is the page cache's
// Coherence: it routes each miss and eviction to the region's engine, and
// each protocol message to the engine it is for.
type engines struct {
	n   *Node
	log *slog.Logger

	mu      sync.RWMutex
	byID    map[ids.RegionID]*regionEngine
	refused map[ids.RegionID]string // why a region is not served here
	// pv maps protocol ids to nodes, as of the last view.
	pv protoView
	// self is this incarnation's protocol id once the directory has
	// recorded this process (0 before).
	self atomic.Uint32
	// applied is the protocol epoch of the last view follow has applied
	// to every engine (Reconfigure, and the slots left behind stamped).
	applied atomic.Uint64
	// suspended: the node's lease is over; every engine holds its verbs
	// back, those created meanwhile too (under mu; suspend).
	suspended bool

	missLat *histogram
}

type regionEngine struct {
	e        *engine.Engine
	region   directory.Region
	pageSize int
	// peers are the descriptors given to the engine by protocol id, to
	// skip repeats.
	peers map[ids.NodeID]rdma.Descriptor
	// down are the homes set down in the engine, and why (under es.mu).
	down map[ids.NodeID]string
	// last is the protocol view of the engine's last configuration (its
	// epoch is the engine's; under es.mu).
	last *protoMap
	// chains place the region's pages (placement.go).
	chains *regionChains
	// fills fill the backups of the shards this node is home of
	// (fills.go).
	fills *regionFills
	// clears are the shards whose slots the engine will ask to clear
	// (enteredAnew, clearEntered), by the protocol epoch that brought
	// them in; under clearMu. clearRun is held by the clear under way:
	// one at a time, so that the SlotsCleared of an epoch never comes
	// before the end of the clear of an earlier one.
	clearMu  sync.Mutex
	clears   []shardClear
	clearRun sync.Mutex
	// dropRun is held by the page store's cleanup of the region's shards
	// this node no longer backs (dropLeft).
	dropRun sync.Mutex
}

// shardClear is the clear owed, once the engine asks for epoch or a later
// one, of this node's slots of shards entered anew.
type shardClear struct {
	epoch  ids.Epoch
	shards []uint64
}

var _ localcache.Coherence = (*engines)(nil)

func newEngines(n *Node) *engines {
	return &engines{n: n, log: n.log.With("part", "engine"), byID: map[ids.RegionID]*regionEngine{},
		refused: map[ids.RegionID]string{}, missLat: newHistogram()}
}

func (es *engines) get(r ids.RegionID) (*regionEngine, error) {
	es.mu.RLock()
	defer es.mu.RUnlock()
	re := es.byID[r]
	if re == nil {
		if why := es.refused[r]; why != "" {
			return nil, fmt.Errorf("%w: %v: %s", ErrNotServed, r, why)
		}
		return nil, fmt.Errorf("%w: %v", engine.ErrUnknownRegion, r)
	}
	return re, nil
}

// refusedRegion says why this node does not serve a region ("" when it
// does, or does not know the region yet).
func (es *engines) refusedRegion(r ids.RegionID) string {
	es.mu.RLock()
	defer es.mu.RUnlock()
	return es.refused[r]
}

func (es *engines) refuse(r directory.Region, why string) {
	es.log.Warn("region not served here", "region", r.Name, "why", why)
	es.mu.Lock()
	es.refused[r.ID] = why
	es.mu.Unlock()
}

// ReadMiss implements localcache.Coherence.
func (es *engines) ReadMiss(ctx context.Context, r ids.RegionID, p ids.PageNo, buf []byte) error {
	return es.miss(ctx, r, p, buf, (*engine.Engine).ReadMiss)
}

// WriteMiss implements localcache.Coherence.
func (es *engines) WriteMiss(ctx context.Context, r ids.RegionID, p ids.PageNo, buf []byte) error {
	return es.miss(ctx, r, p, buf, (*engine.Engine).WriteMiss)
}

// miss routes a miss to the region's engine and counts its latency and
// the page data it brought.
func (es *engines) miss(ctx context.Context, r ids.RegionID, p ids.PageNo, buf []byte,
	call func(*engine.Engine, context.Context, ids.RegionID, ids.PageNo, []byte) error) error {
	re, err := es.get(r)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := call(re.e, ctx, r, p, buf); err != nil {
		return err
	}
	es.missLat.observe(time.Since(start))
	es.n.stats.bytesIn.Add(uint64(len(buf)))
	return nil
}

// Evict implements localcache.Coherence.
func (es *engines) Evict(ctx context.Context, r ids.RegionID, p ids.PageNo, dirty []byte) error {
	re, err := es.get(r)
	if err != nil {
		return err
	}
	err = re.e.Evict(ctx, r, p, dirty)
	if err == nil {
		es.n.stats.bytesOut.Add(uint64(len(dirty)))
	}
	return err
}

// ---- messages: one transport, one engine per region ----

// A protocol message on the verbs transport is the region id (4 bytes,
// little endian) followed by the coherence message.
const msgHeader = 4

// deliver is the verbs transport's message handler.
func (es *engines) deliver(from ids.NodeID, b []byte) {
	if len(b) < msgHeader {
		es.log.Warn("short protocol message", "from", from, "len", len(b))
		return
	}
	if isNodeMsg(b) {
		es.n.stats.msgsIn.Add(1)
		es.n.stats.bytesIn.Add(uint64(len(b)))
		es.n.persist.deliver(from, b)
		return
	}
	r := ids.RegionID(binary.LittleEndian.Uint32(b))
	es.mu.RLock()
	re := es.byID[r]
	es.mu.RUnlock()
	if re == nil {
		// A region this node has not set up yet (or does not serve):
		// the sender retransmits what matters.
		es.log.Debug("message for a region not served here", "from", from, "region", r)
		return
	}
	es.n.stats.msgsIn.Add(1)
	es.n.stats.bytesIn.Add(uint64(len(b)))
	re.e.Deliver(from, b[msgHeader:])
}

func (es *engines) sender(r ids.RegionID) func(ctx context.Context, to ids.NodeID, msg []byte) error {
	return func(ctx context.Context, to ids.NodeID, msg []byte) error {
		// to is a protocol id: only a current incarnation is sent to (a
		// departed one's node may run a new process now).
		pm := es.pv.p.Load()
		if pm == nil {
			return fmt.Errorf("node: no protocol ids known yet")
		}
		in, ok := pm.byProto[to]
		if !ok || in.departed {
			return fmt.Errorf("node: protocol id %v is no member", to)
		}
		b := make([]byte, msgHeader+len(msg))
		binary.LittleEndian.PutUint32(b, uint32(r))
		copy(b[msgHeader:], msg)
		st := &es.n.stats
		st.msgsOut.Add(1)
		st.bytesOut.Add(uint64(len(b)))
		if m, err := coherence.Unmarshal(msg); err == nil {
			switch m.Type {
			case coherence.MsgInvalidate:
				st.invalidationsSent.Add(1)
			case coherence.MsgRecall:
				st.recallsSent.Add(1)
			}
		}
		return es.n.verbs.Send(ctx, in.node, b)
	}
}

// ---- following the directory ----

// sync brings the engines in step with a directory view: an engine (and a
// page cache region) for every region this node is a home of, and every
// member's home memory descriptors handed to the engines. It reports
// whether this node's own descriptors changed (they must be published).
func (es *engines) sync(v *directory.View) (changed bool) {
	self := ids.NodeID(es.n.cfg.ID)
	// Deleted regions first: a name deleted and created again in one
	// change must find the page cache free of the old region.
	live := func(id ids.RegionID) bool { _, ok := v.RegionByID(id); return ok }
	es.mu.Lock()
	var gone []*regionEngine
	for id, re := range es.byID {
		if !live(id) {
			gone = append(gone, re)
		}
	}
	for id := range es.refused {
		if !live(id) {
			delete(es.refused, id)
		}
	}
	es.mu.Unlock()
	for _, re := range gone {
		es.remove(re)
		changed = true
	}
	me, ok := v.Member(self)
	if !ok || me.Proto == ids.None || me.Nonce != 0 && me.Nonce != es.n.verbs.Nonce() {
		// The directory's record of this node is not this process yet (a
		// restart the leader has not recorded): this incarnation has no
		// protocol id to take part with until it is.
		return changed
	}
	pm := newProtoMap(v)
	es.pv.p.Store(pm)
	es.self.Store(uint32(me.Proto))
	for _, r := range v.Regions() {
		es.mu.RLock()
		_, have := es.byID[r.ID]
		refused := es.refused[r.ID] != ""
		es.mu.RUnlock()
		if have || refused {
			continue
		}
		if len(r.Homes) == 0 {
			es.refuse(r, "the region was created by a dsmd that recorded no home set; delete and re-create it")
			continue
		}
		if err := es.add(r, pm, me.Proto); err != nil {
			es.refuse(r, fmt.Sprintf("its engine did not start: %v", err))
			continue
		}
		changed = true
	}
	es.follow(pm, me.Proto)
	for _, m := range v.Members() {
		if m.ID == self || m.Proto == ids.None || len(m.Descriptors) == 0 || m.State == directory.StateLeft {
			continue
		}
		descs, err := decodeDescriptors(m.ID, m.Descriptors)
		if err != nil {
			es.log.Warn("member descriptors", "member", m.ID, "err", err)
			continue
		}
		es.mu.Lock()
		for r, d := range descs {
			re := es.byID[r]
			if re == nil || re.peers[m.Proto] == d {
				continue
			}
			re.peers[m.Proto] = d
			re.e.SetPeer(m.Proto, d)
		}
		es.mu.Unlock()
	}
	return changed
}

// follow hands every engine the protocol's configuration of the view (a
// Reconfigure when its epoch changed: departed incarnations leave the
// protocol and their words are repaired by the homes; new ones join; the
// shards of a departed home move to their first complete backup, which
// rebuilds their words from every member's reports: see placement.go),
// and then tells it which incarnations are down: departed (restarted,
// left, or declared failed: a verdict is a departure, made safe by the
// lease fence that precedes it). Calls on the pages a departed home is
// still home of (no complete backup was left) fail at once with
// engine.ErrUnavailable instead of waiting for an answer that cannot
// come, and calls waiting for one as holder or sharer fail after
// engine.DefaultUnavailableAfter. The engine is in the new epoch before
// it hears of the departure, so that calls waiting on a home that moved
// go to the new home instead of failing with the old one's reason.
func (es *engines) follow(pm *protoMap, self ids.NodeID) {
	es.mu.Lock()
	// Reconfigure waits for the engine's loop, which may be busy sending
	// to a slow peer: it is called after es.mu is released, so that misses
	// of other regions go on meanwhile.
	type reconf struct {
		re   *regionEngine
		rc   coherence.Reconfigure
		last *protoMap // the engine's configuration before
	}
	var todo []reconf
	var every []*regionEngine // for the promotions, after the Reconfigures
	var avail []func()        // SetDown and SetUp, after the Reconfigures
	defer func() {
		es.mu.Unlock()
		for _, t := range todo {
			// The slots of lost shards brought back with this node as a
			// backup read zero before the engine takes the epoch.
			es.clearRevived(t.re, t.last, pm, self)
			// The slots of shards entered anew are cleared when the
			// engine asks (clearEntered), before their fills.
			if shards := es.enteredAnew(t.re, t.last, pm, self); len(shards) > 0 {
				t.rc.ClearPending = true
				t.re.clearMu.Lock()
				t.re.clears = append(t.re.clears, shardClear{epoch: pm.epoch, shards: shards})
				t.re.clearMu.Unlock()
			}
			t.re.e.Reconfigure(t.rc)
			// The engine is in the new epoch: stamp the slots of the
			// shards promoted away from this node, and fill its new
			// backups.
			es.stampLeftBehind(t.re, t.last, pm, self)
			t.re.fills.plan(pm)
			es.cleanStore(t.re, t.last, pm, self)
		}
		for _, re := range every {
			re.fills.considerPromotion(pm)
		}
		for _, f := range avail {
			f()
		}
		if uint64(pm.epoch) > es.applied.Load() {
			es.applied.Store(uint64(pm.epoch))
		}
	}()
	_, member := slices.BinarySearch(pm.members, self)
	for _, re := range es.byID {
		every = append(every, re)
		if member && pm.epoch > re.last.epoch {
			// The placement goes with every epoch after a departure:
			// moved shards name their targets, lost ones a home that
			// is no member.
			rc := coherence.Reconfigure{Epoch: pm.epoch, Members: pm.members, Backups: re.chains.backupsOf(pm)}
			if re.chains.anyDeparted(pm) {
				rc.HomeOf = re.chains.homeOf(pm)
			}
			if rc.Targets = re.chains.targets(re.last, pm); len(rc.Targets) > 0 {
				es.log.Info("region pages move to new homes", "region", re.region.Name, "targets", rc.Targets,
					"protocol_epoch", pm.epoch)
			}
			es.log.Info("region members changed", "region", re.region.Name, "members", pm.members, "protocol_epoch", pm.epoch,
				"homes", re.chains.homesDigest(pm))
			todo = append(todo, reconf{re, rc, re.last})
			re.last = pm
		}
		for p, in := range pm.byProto {
			if p == self {
				continue
			}
			why := ""
			if in.departed {
				why = in.why
			}
			// The shards of a durable region that a departed home is
			// still home of come back: a node whose page store holds
			// them loads them (placement.go, revive). Calls wait for
			// them rather than fail as lost.
			awaited := in.departed && re.region.Durability == directory.DurabilitySynced
			if awaited {
				why = in.event + ": the region is durable, and the pages it was still home of come back once a node whose page store holds them loads them"
			}
			e := re.e
			switch was := re.down[p]; {
			case why == was:
			case why == "":
				delete(re.down, p)
				avail = append(avail, func() { e.SetUp(p) })
				es.log.Info("member up again", "region", re.region.Name, "node", in.node, "proto", p)
			default:
				re.down[p] = why
				if awaited {
					avail = append(avail, func() { e.SetDownAwaited(p, why) })
				} else {
					avail = append(avail, func() { e.SetDown(p, why) })
				}
				switch lost := re.chains.homedAt(p, pm); {
				case lost == 0:
					es.log.Debug("member down: no shard of the region is homed there any more", "region", re.region.Name,
						"node", in.node, "proto", p, "why", why)
				case lost > 0 && awaited:
					es.log.Info("member down: the pages of the shards it is still home of wait until a node loads them from its page store",
						"region", re.region.Name, "node", in.node, "proto", p, "why", why, "shards", lost)
				case lost > 0:
					es.log.Warn("member down: the pages of the shards it is still home of fail (no complete copy was left to move them to)",
						"region", re.region.Name, "node", in.node, "proto", p, "why", why, "shards", lost)
				default:
					es.log.Info("member down: the pages of any shard it is still home of fail (dsmctl status counts them)",
						"region", re.region.Name, "node", in.node, "proto", p, "why", why)
				}
			}
		}
	}
}

// clearRevived clears this node's slots of the shards that were lost under
// last and are brought back under pm (placement.go, revive) at another
// home: such a slot may hold what a release or a fill wrote before the
// loss, and a fill from the new home requires a backup's slot to read zero
// when it enters the set, now or when the members before it in the chain
// are gone. It runs
// before the engine takes pm's epoch: until this node reports its pages to
// the new home, no tenure of the shard begins, so nothing of the new home's
// era has written the slots yet. Only a promotion record brings a lost
// shard back, so a region without one has nothing to clear.
func (es *engines) clearRevived(re *regionEngine, last, pm *protoMap, self ids.NodeID) {
	r := re.region
	if !re.chains.promoted(pm) || pm.departedAt(self) != 0 || !re.chains.anyDeparted(last) {
		return
	}
	cleared, shards := 0, 0
	for i := range r.Shards() {
		s := placement.Shard{Region: r.ID, Index: i}
		before := re.chains.place(s, last)
		if before.lostAt == 0 {
			continue
		}
		now := re.chains.place(s, pm)
		if now.lostAt != 0 || len(now.set) == 0 || now.set[0] == self {
			continue
		}
		first := ids.PageNo(i * r.PagesPerShard())
		end := min(first+ids.PageNo(r.PagesPerShard()), ids.PageNo(r.Pages()))
		n, err := re.e.ClearSlots(es.n.ctx, first, end)
		if err != nil {
			es.log.Warn("slots of a shard brought back not cleared", "region", r.Name, "shard", i, "err", err)
		}
		cleared += n
		shards++
	}
	if shards > 0 {
		es.log.Info("lost shards brought back at another home: this node's slots of them cleared", "region", r.Name, "shards", shards, "slots", cleared)
	}
}

// enteredAnew lists the shards of re's region whose replica set this
// incarnation is in under pm, not as their home and not complete, having
// entered it after last's view. Most such members come with slots that
// read zero (a replacement, a joiner), and their clear walks nothing; a
// home demoted by a promotion, or a preferred member that left the set
// and came back, comes with the slots it had. Its new home's fill, which
// skips a page the new home never had written, would leave those there:
// after a home died having written only this backup in a release, and the
// shard was promoted away before this node rebuilt it, a dead write that
// readers never saw (docs/failover.md §7, "A page promoted away before its
// new home rebuilt it"). The engine asks for the clear (clearEntered) once
// no member can use the slots as home slots any more, and fills wait for
// it. A view without a directory epoch (tests) cannot tell: nothing to
// clear. Nor is a region of more than maxExactTargets shards walked: the
// walk runs before the engine takes the epoch, and for such regions the
// hand-overs are not built either (docs/failover.md §7 says what that
// leaves open).
func (es *engines) enteredAnew(re *regionEngine, last, pm *protoMap, self ids.NodeID) []uint64 {
	r := re.region
	if pm.departedAt(self) != 0 || pm.dirEpoch == 0 || r.Shards() > maxExactTargets {
		return nil
	}
	var shards []uint64
	var why []string
	for i := range r.Shards() {
		s := placement.Shard{Region: r.ID, Index: i}
		sp := re.chains.place(s, pm)
		since, in := sp.since[self]
		if !in || since <= last.dirEpoch || len(sp.c) == 0 || sp.c[sp.hi] == self || re.chains.completeAt(sp, self, s, never, pm) {
			continue
		}
		shards = append(shards, i)
		if len(why) < 16 {
			why = append(why, fmt.Sprintf("%d@%v(home %v)", i, since, sp.c[sp.hi]))
		}
	}
	if len(shards) > 0 {
		es.log.Info("shards entered anew as a backup: their slots are cleared before their fills", "region", r.Name,
			"shards", len(shards), "first", why, "protocol_epoch", pm.epoch, "last_view", last.dirEpoch, "view", pm.dirEpoch)
	}
	return shards
}

// clearEntered zeroes the data of this node's slots of the shards entered
// anew up to protocol epoch ep (enteredAnew), stamping their words first,
// and then tells the engine, which asked for it (engine.Config.ClearSlots:
// every member has acknowledged ep to this node, so none uses those slots
// as home slots any more, and no fill has written them yet). A shard this
// node is home of again is left alone. It runs on its own goroutine, one
// at a time per region: a later epoch's SlotsCleared tells the engine
// that every earlier clear is done too, so the clear of an earlier epoch
// must not still be under way then (a chaos schedule met that: the later
// clear ended first, fills wrote the slots, this node became their home,
// and the earlier clear zeroed them).
func (es *engines) clearEntered(re *regionEngine, ep ids.Epoch) {
	re.clearRun.Lock()
	defer re.clearRun.Unlock()
	re.clearMu.Lock()
	var shards []uint64
	keep := re.clears[:0]
	for _, c := range re.clears {
		if c.epoch <= ep {
			shards = append(shards, c.shards...)
		} else {
			keep = append(keep, c)
		}
	}
	re.clears = keep
	re.clearMu.Unlock()
	r := re.region
	self := ids.NodeID(es.self.Load())
	slices.Sort(shards)
	shards = slices.Compact(shards)
	cleared := 0
	for _, i := range shards {
		if pm := es.pv.p.Load(); pm != nil && re.chains.shardHome(placement.Shard{Region: r.ID, Index: i}, pm) == self {
			continue
		}
		first := ids.PageNo(i * r.PagesPerShard())
		end := min(first+ids.PageNo(r.PagesPerShard()), ids.PageNo(r.Pages()))
		for {
			n, err := re.e.ClearData(es.n.ctx, first, end)
			if err == nil {
				cleared += n
				break
			}
			if errors.Is(err, engine.ErrClosed) {
				return // the region is gone, or the node stops
			}
			es.log.Warn("slots of a shard entered anew not cleared: tried again", "region", r.Name, "shard", i, "err", err)
			select {
			case <-es.n.ctx.Done():
				return // the node stops: its fills do not matter any more
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	if len(shards) > 0 {
		es.log.Info("shards entered anew as a backup: this node's slots of them cleared before their fills", "region", r.Name,
			"shards", len(shards), "ranges", shardRanges(slices.Clone(shards)), "slots", cleared, "protocol_epoch", ep)
	}
	re.e.SlotsCleared(ep)
}

// handOverWatch are, by region, the shards that need this incarnation
// (regionChains.needing) in pm, and the regions too large to tell.
func (es *engines) handOverWatch(pm *protoMap) (watch map[ids.RegionID][]uint64, uncounted int) {
	self := ids.NodeID(es.self.Load())
	es.mu.RLock()
	defer es.mu.RUnlock()
	watch = make(map[ids.RegionID][]uint64, len(es.byID))
	for id, re := range es.byID {
		if re.region.Shards() > maxExactTargets {
			uncounted++
			continue
		}
		watch[id] = re.chains.needing(self, pm)
	}
	return watch, uncounted
}

// handOverLeft counts the shards of watch that still need this
// incarnation in pm (regionChains.handOver). A region deleted since needs
// nothing.
func (es *engines) handOverLeft(pm *protoMap, watch map[ids.RegionID][]uint64) int {
	self := ids.NodeID(es.self.Load())
	es.mu.RLock()
	defer es.mu.RUnlock()
	left := 0
	for id, shards := range watch {
		if re, ok := es.byID[id]; ok {
			left += re.chains.handOver(self, pm, shards)
		}
	}
	return left
}

// stampLeftBehind stamps the home slots of the shards whose home was this
// live incarnation under last and is another member under pm (a
// promotion: docs/protocol.md, "Moves from live homes"): a lagging
// member's CAS that lands on such a slot finds NotHome and retries at the
// new home. It runs after the engine took pm's epoch. Only promotions move
// a shard away from a live home, so a region without promotion records
// has nothing to stamp.
func (es *engines) stampLeftBehind(re *regionEngine, last, pm *protoMap, self ids.NodeID) {
	r := re.region
	if !re.chains.promoted(pm) || pm.departedAt(self) != 0 {
		return
	}
	stamped, shards := 0, 0
	for i := range r.Shards() {
		s := placement.Shard{Region: r.ID, Index: i}
		if re.chains.shardHome(s, last) != self || re.chains.shardHome(s, pm) == self {
			continue
		}
		first := ids.PageNo(i * r.PagesPerShard())
		end := min(first+ids.PageNo(r.PagesPerShard()), ids.PageNo(r.Pages()))
		stamped += re.e.StampLeftBehind(first, end)
		shards++
	}
	if shards > 0 {
		es.log.Info("shards promoted away from this node: their home slots stamped", "region", r.Name, "shards", shards,
			"words", stamped, "protocol_epoch", pm.epoch)
	}
}

// add starts the engine of region r, under this incarnation's protocol id
// self with the members of pm, and adds the region to the page cache.
func (es *engines) add(r directory.Region, pm *protoMap, self ids.NodeID) error {
	homes, err := pm.homeProtos(r)
	if err != nil {
		return err
	}
	chains := newRegionChains(r, homes)
	// A node that was a home at the region's creation, in this
	// incarnation, took part from the region's first epoch. Any other
	// (joined later, restarted since, or not alive then) is new to the
	// protocol: it acts once every member knows it (coherence.Config.Joining).
	joining := true
	if inc, ok := r.HomeIncarnation(ids.NodeID(es.n.cfg.ID)); ok {
		if me, found := pm.byProto[self]; found && (inc == 0 || inc == me.inc) {
			joining = false
		}
	}
	rf := newRegionFills(es, nil)
	var re *regionEngine // set below, before the engine's first Reconfigure
	var released func(ids.PageNo, uint16)
	var persisted func([]coherence.PersistDone)
	if r.Durability == directory.DurabilitySynced {
		released, persisted = es.n.persist.releasedFn(r.ID), es.n.persist.persistedFn(r.ID)
	}
	e, err := engine.New(engine.Config{
		ID: self, Region: r.ID, Name: r.Name, NumPages: int(r.Pages()), PageSize: int(r.PageSize),
		Epoch: pm.epoch, Members: pm.members, Joining: joining,
		HomeOf:  chains.homeOf(pm),
		Backups: chains.backupsOf(pm),
		// A new member waits for the moves that may not be done yet:
		// those to every home that is not the first of its chain.
		Targets:   chains.targets(noEvents{}, pm),
		NodeOf:    es.pv.nodeOf,
		Transport: es.n.verbs,
		Send:      es.sender(r.ID),
		Pages:     cachePages{n: es.n, pageSize: int(r.PageSize)},
		Filled:    rf.filled,
		Released:  released,
		Persisted: persisted,
		// Never blocks the engine's loop: the clear posts to the
		// transport and then steps the engine.
		ClearSlots: func(ep ids.Epoch) { go es.clearEntered(re, ep) },
		Tick:       engineTick,
		Logger:     es.log.With("region", r.Name),
	})
	if err != nil {
		return err
	}
	re = &regionEngine{e: e, region: r, pageSize: int(r.PageSize), peers: map[ids.NodeID]rdma.Descriptor{},
		down: map[ids.NodeID]string{}, last: pm, chains: chains, fills: rf}
	rf.re = re
	es.mu.Lock()
	es.byID[r.ID] = re
	if es.suspended {
		e.Suspend()
	}
	es.mu.Unlock()
	e.Start(nil)
	go rf.loop()
	rf.plan(pm)
	// What a previous incarnation of this node persisted of the shards
	// this one does not back is read by nobody (storeclean.go).
	es.cleanStore(re, nil, pm, self)
	// The page cache must not hold the name already: that would be a
	// deleted region's memory (a removal that has not finished), never to
	// be served as this one.
	err = es.n.cache.AddRegion(localcache.RegionSpec{ID: r.ID, Name: r.Name, Size: int64(r.Size), PageSize: int64(r.PageSize)})
	if err != nil {
		es.mu.Lock()
		delete(es.byID, r.ID)
		es.mu.Unlock()
		rf.close()
		return errors.Join(fmt.Errorf("page cache: %w", err), e.Close())
	}
	es.log.Info("region served", "region", r.Name, "id", r.ID, "pages", r.Pages(), "homes", r.Homes, "home_protos", homes, "proto", self)
	return nil
}

// suspend makes every engine hold its verbs back (on) or post them again
// (off): the node's lease ended, or a majority granted one again
// (guardLease; engine.Engine.Suspend says why).
func (es *engines) suspend(on bool) {
	es.mu.Lock()
	defer es.mu.Unlock()
	es.suspended = on
	for _, re := range es.byID {
		if on {
			re.e.Suspend()
		} else {
			re.e.Resume()
		}
	}
}

// removeTimeout bounds how long a deleted region's removal waits for the
// calls in progress on its pages.
const removeTimeout = 30 * time.Second

// remove stops a deleted region's engine (its misses fail from now on and
// its home memory goes back to the OS), then removes it from the page
// cache, which ends the processes' mappings and frees the cached pages.
func (es *engines) remove(re *regionEngine) {
	r := re.region
	es.mu.Lock()
	delete(es.byID, r.ID)
	es.mu.Unlock()
	var errs []error
	re.fills.close()
	if err := re.e.Close(); err != nil {
		errs = append(errs, fmt.Errorf("engine: %w", err))
	}
	ctx, cancel := context.WithTimeout(es.n.ctx, removeTimeout)
	defer cancel()
	why := fmt.Sprintf("region %q (%v) was deleted", r.Name, r.ID)
	if err := es.n.cache.RemoveRegion(ctx, r.ID, why); err != nil && !errors.Is(err, localcache.ErrUnknownRegion) {
		errs = append(errs, fmt.Errorf("page cache: %w", err))
	}
	es.n.persist.forget(r.ID)
	if r.Durability == directory.DurabilitySynced {
		// Its pages in this node's store, as home or backup (a region id
		// is never given out again, so nothing else could read them).
		if err := es.n.pages.DeleteRegion(r.ID); err != nil {
			errs = append(errs, fmt.Errorf("page store: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		es.log.Warn("region removed with errors", "region", r.Name, "id", r.ID, "err", err)
		return
	}
	es.log.Info("region removed", "region", r.Name, "id", r.ID)
}

// descriptors encodes this node's home memory descriptors for the member
// table.
func (es *engines) descriptors() []byte {
	es.mu.RLock()
	defer es.mu.RUnlock()
	m := map[ids.RegionID]rdma.Descriptor{}
	for r, re := range es.byID {
		m[r] = re.e.Descriptor()
	}
	return encodeDescriptors(m)
}

func (es *engines) close() error {
	es.mu.Lock()
	defer es.mu.Unlock()
	var errs []error
	for _, re := range es.byID {
		re.fills.close()
		errs = append(errs, re.e.Close())
	}
	es.byID = map[ids.RegionID]*regionEngine{}
	return errors.Join(errs...)
}

// ---- the page cache as the engines' Pages ----

// cachePages gives pages up from the page cache when the protocol takes
// them away.
type cachePages struct {
	n        *Node
	pageSize int
}

// Drop implements engine.Pages.
func (cp cachePages) Drop(r ids.RegionID, p ids.PageNo) []byte {
	buf := make([]byte, cp.pageSize)
	st, err := cp.n.cache.Invalidate(cp.n.ctx, r, p, buf)
	if err != nil {
		cp.n.log.Warn("invalidate", "region", r, "page", p, "err", err)
		return nil
	}
	if st == localcache.Modified {
		cp.n.stats.bytesOut.Add(uint64(len(buf)))
		return buf
	}
	return nil
}

// Downgrade implements engine.Pages.
func (cp cachePages) Downgrade(r ids.RegionID, p ids.PageNo) []byte {
	buf := make([]byte, cp.pageSize)
	st, err := cp.n.cache.Downgrade(cp.n.ctx, r, p, buf)
	if err != nil {
		cp.n.log.Warn("downgrade", "region", r, "page", p, "err", err)
		return nil
	}
	if st == localcache.Modified {
		cp.n.stats.bytesOut.Add(uint64(len(buf)))
		return buf
	}
	return nil
}

// ---- descriptors in the member table ----

// The descriptors a member publishes: a version byte (1), then per region
// the region id (4 bytes), the key, base and length (8 bytes each) and the
// access rights (1 byte), little endian.
const (
	descVersion  = 1
	descEntryLen = 4 + 8 + 8 + 8 + 1
)

func encodeDescriptors(m map[ids.RegionID]rdma.Descriptor) []byte {
	rs := make([]ids.RegionID, 0, len(m))
	for r := range m {
		rs = append(rs, r)
	}
	slices.Sort(rs)
	b := make([]byte, 1, 1+len(rs)*descEntryLen)
	b[0] = descVersion
	for _, r := range rs {
		d := m[r]
		b = binary.LittleEndian.AppendUint32(b, uint32(r))
		b = binary.LittleEndian.AppendUint64(b, d.RKey.Key)
		b = binary.LittleEndian.AppendUint64(b, d.RKey.Base)
		b = binary.LittleEndian.AppendUint64(b, d.Len)
		b = append(b, byte(d.Access))
	}
	return b
}

// errBadDescriptors refuses a member's descriptors that do not decode.
var errBadDescriptors = errors.New("node: bad descriptors")

func decodeDescriptors(node ids.NodeID, b []byte) (map[ids.RegionID]rdma.Descriptor, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[0] != descVersion {
		return nil, fmt.Errorf("%w: version %d", errBadDescriptors, b[0])
	}
	b = b[1:]
	if len(b)%descEntryLen != 0 {
		return nil, fmt.Errorf("%w: %d bytes is not a whole number of entries", errBadDescriptors, len(b))
	}
	m := make(map[ids.RegionID]rdma.Descriptor, len(b)/descEntryLen)
	for ; len(b) > 0; b = b[descEntryLen:] {
		r := ids.RegionID(binary.LittleEndian.Uint32(b))
		if r == 0 {
			return nil, fmt.Errorf("%w: region 0", errBadDescriptors)
		}
		if _, dup := m[r]; dup {
			return nil, fmt.Errorf("%w: region %v twice", errBadDescriptors, r)
		}
		m[r] = rdma.Descriptor{Node: node,
			RKey: rdma.RKey{Key: binary.LittleEndian.Uint64(b[4:]), Base: binary.LittleEndian.Uint64(b[12:])},
			Len:  binary.LittleEndian.Uint64(b[20:]), Access: rdma.Access(b[28])}
	}
	return m, nil
}

// ---- counters ----

// nodeStats are the engines' counters (the page cache keeps its own).
type nodeStats struct {
	msgsIn, msgsOut                atomic.Uint64
	invalidationsSent, recallsSent atomic.Uint64
	// bytesIn: page data fetched by misses and protocol messages
	// received; bytesOut: page data written back and messages sent.
	bytesIn, bytesOut atomic.Uint64
	// leaseSuspends and leaseResumes count the lease's ends (local access
	// suspended) and returns (resumed).
	leaseSuspends, leaseResumes atomic.Uint64
	// storeShardsDropped counts the shards whose pages the page store
	// deleted because this node no longer backs them (storeclean.go).
	storeShardsDropped atomic.Uint64
}
