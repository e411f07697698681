package node

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"sync"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
)

// The placement of a region's pages in the data plane, as dsmd computes it
// from a directory view (docs/failover.md §5, §6 and §7, "the daemon").
//
// Every shard has a chain of incarnations (as protocol ids). It begins
// with the region's homes at its creation (at their incarnations then), in
// rendezvous order for the shard; then come every incarnation that joined
// since (a new node, or a restart), in the order they joined. The first
// 1+Backups members are complete from the start (the creation chain of
// the step before fills); every later one is a replacement, complete only
// once its home has filled it.
//
// The backups of a shard are the first Backups usable members after its
// home: not departed, never declared failed since the region's creation,
// not marked draining (a member marked draining stays in the sets it is
// in until it departs, and its shards are promoted to other members:
// docs/failover.md §11).
// A release writes every page's data and stamp to them before it releases
// the tenure at the home, so a replacement that enters the backups is
// written by every release from then on, and its home fills it with the
// pages released before (coherence.Fill, fills.go). Once every populated
// page is copied, the home records it complete in the directory
// (directory.FillRecord).
//
// When the home departs (restarted or left: its process, and its memory,
// are gone), the shard moves to the first member after it in the chain
// that was complete at that moment: not departed, and either one of the
// first 1+Backups never declared failed by then, or a replacement whose
// completeness record was committed before the departure and that was not
// declared failed after its fills began. The walk repeats for a new home
// that departs later. A shard with no complete member left stays at its
// departed home: its pages are lost, and calls on them fail with the
// home's reason.
//
// A lost shard comes back by a promotion record too (revive,
// docs/durability.md §4): for a durable region, of an incarnation of one
// of the nodes whose stores held the shard complete when it was lost (the
// departed home's node, then those of the members complete until they
// departed with it), which loaded the shard from its store and recorded
// itself complete after the loss; for a memory region, once every process
// that could hold a copy departed or recorded that it holds none, of any
// usable member, and the shard starts over empty (contents lost). The
// member becomes the home right after the departed one; every other member
// enters the set anew.
//
// A promotion record (directory.PromoteRecord, docs/failover.md §6) makes
// a complete member of the shard's replica set its home; the old home goes
// right after the members that were its backups (it stays a backup when
// the promoted member was one) and is demoted: incomplete until its new
// home fills it again.
//
// Why a record stays true: the walk keeps, for every member of the replica
// set, the epoch since which it has been in the set without a break, and a
// record counts only for fills begun since then. A member leaves the set
// by departing, by a failure verdict, when the home moves past it (it is
// then before the home, and only a promotion brings it back), or when a
// promotion demotes it; a member that comes back needs a new fill.
// Joiners go to the end of every chain, and the members ahead of a
// backup only leave, so nobody else pushes a backup out of the first
// Backups. The price: a new node is a backup only once the members before
// it are gone, or once it is promoted (nothing proposes promotions yet:
// docs/failover.md §6, "Promotion in the daemon").
//
// The placement is a function of one view, so every node computes the
// same one for the same protocol epoch, whichever views it skipped: the
// chains depend on the incarnations given out, the backups on departures
// and failure verdicts, and the homes on departures, verdicts, promotions
// and the completeness records committed before each departure or
// promotion. Each of those but the completeness records moves the protocol
// epoch (protoMap.epoch), and a completeness record counts only for events
// after it, each of which moves it.

// regionChains is the placement of one region: its chains, per shard,
// computed on demand.
type regionChains struct {
	r      directory.Region
	nodes  []ids.NodeID // the homes at creation (node ids)
	protos map[ids.NodeID]ids.NodeID
	length int // of the complete prefix: 1+Backups, at most len(nodes)
	k      int // backups per shard

	// nodeOf is rc.protos the other way round: the node of each creation
	// home's protocol id.
	nodeOf map[ids.NodeID]ids.NodeID

	mu     sync.Mutex
	chains map[uint64]chainEntry // by shard index, up to maxCachedChains
	places map[uint64]placeEntry // likewise
	recs   recordIndex           // of the latest view's completeness records
	later  laterIndex            // the incarnations that joined after an epoch, likewise
	// cps are the two latest checkpoints decoded (checkpointIn): a view
	// and the one before it, which the daemon compares.
	cps [2]*placement.Checkpoint
}

// chainEntry is one shard's chain for the incarnations of gen.
type chainEntry struct {
	gen ids.Epoch
	c   []ids.NodeID
}

// maxCachedChains bounds the chains and placements a region keeps
// computed; past it, a new one takes the place of an arbitrary one
// (evictOne), so that the shards in use in a larger region stay cached.
const maxCachedChains = 1 << 16

// evictOne deletes one entry of m, the first Go's map iteration yields.
func evictOne[V any](m map[uint64]V) {
	for k := range m {
		delete(m, k)
		return
	}
}

// recordIndex is a region's completeness records by member, for one
// view's records (first and n identify them: a view's records are never
// changed in place): a walk of a shard reads the records of its chain's
// members only, not every record of the region.
type recordIndex struct {
	first *directory.FillRecord
	n     int
	by    map[ids.NodeID][]directory.FillRecord
}

// recordsBy is ev's completeness records of the region by member, in the
// order of ev's.
func (rc *regionChains) recordsBy(ev eventsOf) map[ids.NodeID][]directory.FillRecord {
	recs := ev.fillRecords(rc.r.ID)
	if len(recs) == 0 {
		return nil
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if ix := rc.recs; ix.first == &recs[0] && ix.n == len(recs) {
		return ix.by
	}
	by := map[ids.NodeID][]directory.FillRecord{}
	for _, f := range recs {
		by[f.Proto] = append(by[f.Proto], f)
	}
	rc.recs = recordIndex{first: &recs[0], n: len(recs), by: by}
	return by
}

// laterIndex is, of one view's incarnations (first and n identify them),
// those that joined after epoch after: the candidates for the joiners a
// walk resumed from after takes (advance). The shards of a
// region are resumed from the same view, so one list serves them all.
type laterIndex struct {
	first *protoInc
	n     int
	after ids.Epoch
	ins   []protoInc
}

// joinedAfter are the incarnations of ins (a view's) that joined after
// epoch after.
func (rc *regionChains) joinedAfter(ins []protoInc, after ids.Epoch) []protoInc {
	if len(ins) == 0 {
		return nil
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if ix := rc.later; ix.first == &ins[0] && ix.n == len(ins) && ix.after == after {
		return ix.ins
	}
	var out []protoInc
	for _, in := range ins {
		if in.joined > after {
			out = append(out, in)
		}
	}
	rc.later = laterIndex{first: &ins[0], n: len(ins), after: after, ins: out}
	return out
}

func newRegionChains(r directory.Region, homeProtos []ids.NodeID) *regionChains {
	rc := &regionChains{r: r, nodes: slices.Clone(r.Homes), protos: make(map[ids.NodeID]ids.NodeID, len(r.Homes)),
		nodeOf: make(map[ids.NodeID]ids.NodeID, len(r.Homes)), chains: map[uint64]chainEntry{}, places: map[uint64]placeEntry{}}
	for i, h := range r.Homes {
		rc.protos[h] = homeProtos[i]
		rc.nodeOf[homeProtos[i]] = h
	}
	k := r.Backups
	if k == 0 {
		k = directory.DefaultBackups
	}
	rc.k = k
	rc.length = min(1+k, len(r.Homes))
	return rc
}

// baseChain is the region's homes at creation in shard s's rendezvous
// order, as protocol ids.
func (rc *regionChains) baseChain(s placement.Shard) []ids.NodeID {
	ns := placement.Rank(s, rc.nodes, len(rc.nodes))
	c := make([]ids.NodeID, len(ns))
	for i, n := range ns {
		c[i] = rc.protos[n]
	}
	return c
}

// chain is the chain of shard s under ev, as protocol ids, and the
// length of its complete prefix (1+Backups). The caller must not modify
// it.
func (rc *regionChains) chain(s placement.Shard, ev eventsOf) (c []ids.NodeID, base int) {
	gen, ins := ev.incarnations()
	rc.mu.Lock()
	e, ok := rc.chains[s.Index]
	rc.mu.Unlock()
	if ok && e.gen == gen {
		return e.c, min(rc.length, len(e.c))
	}
	c = rc.baseChain(s)
	base = min(rc.length, len(c))
	c = append(c, rc.joiners(s, ins, ev, func(in protoInc) bool { return !slices.Contains(c, in.proto) })...)
	if gen != 0 {
		rc.mu.Lock()
		if !ok && len(rc.chains) >= maxCachedChains {
			evictOne(rc.chains)
		}
		rc.chains[s.Index] = chainEntry{gen, c}
		rc.mu.Unlock()
	}
	return c, base
}

// protoInc names one incarnation: its protocol id, node and number, and
// the directory epoch in which it joined (0: unknown, before every region).
type protoInc struct {
	proto, node ids.NodeID
	inc         uint64
	joined      ids.Epoch
}

// eventsOf are what the placement needs to know of the protocol ids, in
// directory epochs: when each departed (0: never), whether it was
// declared failed in an epoch after `after` and up to upTo (when unsure,
// it says yes), every incarnation given out (gen names that set: equal
// gens, equal sets, and equal promotion records; 0 for none) and each one
// by protocol id, and the completeness and promotion records of a region; known is the epoch up to
// which the view holds every one of those events (its directory epoch: an
// event is recorded in an epoch of its own, a completeness record counts
// only for events after the one it was committed in), 0 when unknown.
type eventsOf interface {
	known() ids.Epoch
	// checkpoint is the region's placement checkpoint, encoded, and its
	// epoch (0: none): the view may lack the records a walk from it does
	// not read (directory.Region.Checkpoint).
	checkpoint(r ids.RegionID) (at ids.Epoch, data []byte)
	incarnation(p ids.NodeID) (protoInc, bool)
	departedAt(p ids.NodeID) ids.Epoch
	// drainedAt is the epoch of p's drain mark (0: none): from then on it
	// is usable no more, but stays in the replica sets it is in until it
	// departs (resetSet).
	drainedAt(p ids.NodeID) ids.Epoch
	failedBetween(p ids.NodeID, after, upTo ids.Epoch) bool
	incarnations() (gen ids.Epoch, ins []protoInc)
	fillRecords(r ids.RegionID) []directory.FillRecord
	promoteRecords(r ids.RegionID) []directory.PromoteRecord
}

// never is an epoch after every other.
const never = ids.Epoch(^uint64(0))

// shardPlace is the placement of one shard under a view: its chain as
// the promotions rearranged it, the index of its home in it, and, for
// every member of its replica set (the home and the backups), the epoch
// since which it has been in the set without a break (the region's
// creation epoch for the creation prefix that never left). The caller
// must not modify it.
type shardPlace struct {
	c     []ids.NodeID
	hi    int
	since map[ids.NodeID]ids.Epoch
	// set is the replica set now: the home, its Backups backups, and the
	// preferred member when it is neither (the extra backup).
	set []ids.NodeID
	// preferred is the shard's rendezvous winner among the members usable
	// now (ids.None: none): the member that should be its home.
	preferred ids.NodeID
	// loaded are the members that became home of the lost shard by a
	// revival (revive), by epoch: complete while in the set without a
	// break since then.
	loaded map[ids.NodeID]ids.Epoch
	// lostAt is the directory epoch in which the shard's home departed
	// with no complete member after it (0: the shard is not lost now).
	lostAt ids.Epoch
	// cands are, while the shard is lost, the nodes whose page stores hold
	// every synced page of it (a durable region): the node of the departed
	// home, then those of the members complete until they departed with it,
	// in the order a revival tries them.
	cands []ids.NodeID
	// reset: the shard started over empty once no process could hold a
	// copy of it (a memory region after a restart of the whole cluster:
	// contents lost at restart).
	reset bool
	// region is the region's id (for its records).
	region ids.RegionID
	// last is the epoch of the latest event the walk took (the region's
	// creation: none), known that of the view it walked, up to which it
	// took every event (eventsOf.known; 0: unknown, resume cannot go on
	// from it).
	last, known ids.Epoch
}

// placeEntry is one shard's placement for the view generation gen.
type placeEntry struct {
	gen ids.Epoch
	sp  *shardPlace
}

// completeAt reports whether member b of shard s held every release of the
// shard up to epoch d, exclusive: it had not departed by d, it is in the
// replica set, and either it has been in the set since the region's
// creation and was not declared failed since, or a completeness record
// committed before d covers s whose fills began while b was in the set
// (at or after sp.since[b]) and b was not declared failed after they
// began. A member that left the set and came back (a demoted home) needs
// a record of fills begun after its return: it missed the releases in
// between.
func (rc *regionChains) completeAt(sp *shardPlace, b ids.NodeID, s placement.Shard, d ids.Epoch, ev eventsOf) bool {
	return rc.completeWith(sp, b, s, d, ev, ev.fillRecords(rc.r.ID))
}

// completeWith is completeAt with the completeness records recs (a walk
// passes b's records that cover the shard, gathered once).
func (rc *regionChains) completeWith(sp *shardPlace, b ids.NodeID, s placement.Shard, d ids.Epoch, ev eventsOf, recs []directory.FillRecord) bool {
	if dj := ev.departedAt(b); dj != 0 && dj <= d {
		return false
	}
	return rc.heldAll(sp, b, s, d, d, ev, recs)
}

// heldAll reports whether member b of shard s, in the replica set now,
// held every release of the shard before epoch d: in the set since the
// region's creation, or since its revival (revive), or covered by a
// completeness record committed before d of fills begun since its latest
// entry into the set, without a failure verdict in (that start, upTo].
func (rc *regionChains) heldAll(sp *shardPlace, b ids.NodeID, s placement.Shard, d, upTo ids.Epoch, ev eventsOf, recs []directory.FillRecord) bool {
	since, in := sp.since[b]
	if !in {
		return false
	}
	if since == rc.r.Epoch && !ev.failedBetween(b, rc.r.Epoch, upTo) {
		return true
	}
	if l, ok := sp.loaded[b]; ok && l == since && !ev.failedBetween(b, since, upTo) {
		return true
	}
	for _, f := range recs {
		if f.Proto == b && f.At < d && f.Since >= since && f.Covers(s.Index) && !ev.failedBetween(b, f.Since, upTo) {
			return true
		}
	}
	return false
}

// lose marks shard s lost in epoch d: its home departed then, with no
// complete member after it. For a durable region it lists the nodes whose
// stores hold every synced page of the shard: the home's (a home holds a
// complete copy, in memory and, with fills that persist, on disk), then
// those of the members of the set that held every release until they
// departed in the same epoch (one that departed earlier missed the Syncs
// in between; a failure verdict is a departure, so only a verdict before
// d disqualifies). The set is the one before d's events.
func (rc *regionChains) lose(sp *shardPlace, s placement.Shard, d ids.Epoch, ev eventsOf, w *walkCtx) {
	sp.lostAt, sp.cands = d, nil
	if rc.r.Durability != directory.DurabilitySynced {
		return
	}
	h := sp.c[sp.hi]
	sp.cands = append(sp.cands, w.node[h])
	for _, b := range sp.c {
		if _, in := sp.since[b]; !in || b == h || ev.departedAt(b) != d {
			continue
		}
		if rc.heldAll(sp, b, s, d, d-1, ev, w.recs[b]) && !slices.Contains(sp.cands, w.node[b]) {
			sp.cands = append(sp.cands, w.node[b])
		}
	}
}

// revive applies a promotion record of member p, committed in epoch a,
// for shard s lost since sp.lostAt. For a durable region p must be an
// incarnation of one of the shard's candidate nodes (lose), which loaded
// the shard from its store before it recorded itself complete; for a
// memory region, every incarnation that joined before the loss must have
// departed by a (no process left can hold a copy), and p starts the shard
// over empty. In both cases p must be usable at a and hold a completeness
// record committed before a of fills (the load) begun after the loss. p
// becomes the home, right after the departed one in the chain; the
// members after it are its backups (replacements, filled from it). A
// record that meets none of this changes nothing.
func (rc *regionChains) revive(sp *shardPlace, p ids.NodeID, s placement.Shard, a ids.Epoch, ev eventsOf, w *walkCtx) {
	if sp.lostAt == 0 || !slices.Contains(sp.c, p) || !rc.usableAt(p, a, w) {
		return
	}
	if !slices.ContainsFunc(w.recs[p], func(f directory.FillRecord) bool {
		return f.Proto == p && f.At < a && f.Since >= sp.lostAt && f.Covers(s.Index) && !ev.failedBetween(p, f.Since, a)
	}) {
		return
	}
	reset := false
	if rc.r.Durability == directory.DurabilitySynced {
		if !slices.Contains(sp.cands, w.node[p]) {
			return
		}
	} else {
		if !noCopiesLeft(sp, s, rc.r.Epoch, a, ev) {
			return
		}
		reset = true
	}
	h := sp.c[sp.hi]
	c := make([]ids.NodeID, 0, len(sp.c))
	for _, b := range sp.c {
		if b != p {
			c = append(c, b)
		}
		if b == h {
			c = append(c, p)
		}
	}
	sp.c, sp.hi = c, slices.Index(c, p)
	// Every member enters the new set at a: a record made before (one
	// that said it held nothing) does not make it complete, and a member
	// that was in the lost shard's set clears its slots first (regions.go,
	// clearRevived).
	sp.since = map[ids.NodeID]ids.Epoch{p: a}
	sp.loaded = map[ids.NodeID]ids.Epoch{p: a}
	sp.lostAt, sp.cands = 0, nil
	sp.reset = sp.reset || reset
}

// turnedOver reports whether, by epoch a, every incarnation alive at some
// epoch x in [created, lost) had departed: the whole cluster as it was at
// x is gone (a restart of every dsmd, recorded one node after the other),
// not only the copies of one shard. The population alive at x is smallest
// right after departures, so x is tried at created and at every departure
// epoch in between.
func turnedOver(created, lost, a ids.Epoch, ev eventsOf) bool {
	_, ins := ev.incarnations()
	xs := []ids.Epoch{created}
	for _, in := range ins {
		if d := ev.departedAt(in.proto); d > created && d < lost {
			xs = append(xs, d)
		}
	}
	for _, x := range xs {
		gone := true
		for _, in := range ins {
			d := ev.departedAt(in.proto)
			if in.joined > x || d != 0 && d <= x {
				continue // not alive at x
			}
			if d == 0 || d > a {
				gone = false
				break
			}
		}
		if gone {
			return true
		}
	}
	return false
}

// reviver is the node that should bring lost shard sp back from its
// store: the first of its candidate nodes (lose) with an incarnation
// usable now (ids.None: none yet).
func (rc *regionChains) reviver(sp *shardPlace, ev eventsOf) ids.NodeID {
	_, ins := ev.incarnations()
	for _, n := range sp.cands {
		for _, in := range ins {
			if in.node == n && rc.usable(in.proto, ev) {
				return n
			}
		}
	}
	return ids.None
}

// contentsLost reports whether a shard of the region started over empty
// under ev (revive: a memory region after every process that could hold a
// copy departed). A region of more than maxExactTargets shards is not
// walked shard by shard: it says false.
func (rc *regionChains) contentsLost(ev eventsOf) bool {
	n := rc.r.Shards()
	if n > maxExactTargets || !rc.anyDeparted(ev) {
		return false
	}
	for i := range n {
		if rc.place(placement.Shard{Region: rc.r.ID, Index: i}, ev).reset {
			return true
		}
	}
	return false
}

// noCopiesLeft reports whether, at epoch a, lost shard s (lost since
// sp.lostAt) of a memory region may start over empty: the cluster turned
// over since the region's creation (turnedOver: a restart of the whole
// cluster), and no process can hold a copy of the shard: every
// incarnation that joined before the loss (or at an unknown epoch) had
// departed by a, or recorded before a, by a completeness record of s made
// after the loss, that it holds no page of the shard (fills.go, revive:
// after the home departed no miss of the shard succeeds and every Shared
// copy was dropped, so a process that holds nothing then never holds
// anything of it). A loss that live processes of the region's time saw
// (more than Backups failures, the cluster up) stays a loss: its pages
// fail, never read as zeros.
func noCopiesLeft(sp *shardPlace, s placement.Shard, created, a ids.Epoch, ev eventsOf) bool {
	if !turnedOver(created, sp.lostAt, a, ev) {
		return false
	}
	_, ins := ev.incarnations()
	for _, in := range ins {
		if in.joined >= sp.lostAt {
			continue
		}
		if dep := ev.departedAt(in.proto); dep != 0 && dep <= a {
			continue
		}
		if !slices.ContainsFunc(ev.fillRecords(sp.region), func(f directory.FillRecord) bool {
			return f.Proto == in.proto && f.At < a && f.Since >= sp.lostAt && f.Covers(s.Index)
		}) {
			return false
		}
	}
	return true
}

// walk places shard s under ev: it starts from the shard's chain at the
// region's creation (its homes then, in rendezvous order, and any member
// of that time that was no home: the part of chain that had joined by
// then) with its home first and the creation prefix in the set, and takes
// every event since (advance).
func (rc *regionChains) walk(s placement.Shard, ev eventsOf) *shardPlace {
	if cp := rc.checkpointIn(ev); cp != nil {
		return rc.walkFrom(cp, s, ev)
	}
	created := rc.r.Epoch
	c, base := rc.chain(s, ev)
	sp := &shardPlace{since: make(map[ids.NodeID]ids.Epoch, base), region: rc.r.ID, last: created}
	if len(c) == 0 {
		return sp
	}
	for _, b := range c[:base] {
		sp.since[b] = created
	}
	cut := base
	for ; cut < len(c); cut++ {
		if in, ok := ev.incarnation(c[cut]); ok && in.joined > created {
			break // chain orders the later members by the epoch they joined in
		}
	}
	sp.c = slices.Clone(c[:cut])
	rc.advance(sp, s, ev, created)
	return sp
}

// joiners are the incarnations of ins that keep, in the order in which
// chains take them: by the epoch they joined in, then by their rendezvous
// score for the shard. Incarnations that departed before the region's
// creation are none of its chains.
func (rc *regionChains) joiners(s placement.Shard, ins []protoInc, ev eventsOf, keep func(protoInc) bool) []ids.NodeID {
	type cand struct {
		score uint64
		in    protoInc
	}
	var js []cand
	for _, in := range ins {
		if !keep(in) {
			continue
		}
		if d := ev.departedAt(in.proto); d != 0 && d <= rc.r.Epoch {
			continue
		}
		js = append(js, cand{placement.Score(s, in.node), in})
	}
	slices.SortFunc(js, func(a, b cand) int {
		switch {
		case a.in.joined != b.in.joined:
			return cmp.Compare(a.in.joined, b.in.joined)
		case a.score != b.score:
			return -cmp.Compare(a.score, b.score)
		case a.in.node != b.in.node:
			return cmp.Compare(a.in.node, b.in.node)
		}
		return cmp.Compare(a.in.inc, b.in.inc)
	})
	out := make([]ids.NodeID, len(js))
	for i, x := range js {
		out[i] = x.in.proto
	}
	return out
}

// resume is walk from from, the placement of shard s under an earlier
// view of the same directory that held every event up to from.known: it
// takes only the events after that (advance), so the result is walk's
// (TestResumeIsWalk) at the cost of the new events and of the members
// alive, not of the history.
func (rc *regionChains) resume(from *shardPlace, s placement.Shard, ev eventsOf) *shardPlace {
	if cp := rc.checkpointIn(ev); cp != nil && cp.At > from.known {
		// The view may lack records of the events between the two.
		return rc.walkFrom(cp, s, ev)
	}
	sp := from.clone()
	if len(sp.c) > 0 {
		rc.advance(sp, s, ev, from.known)
	}
	return sp
}

// clone is a copy of sp that advance may change.
func (sp *shardPlace) clone() *shardPlace {
	n := *sp
	n.c = slices.Clone(sp.c)
	n.set = slices.Clone(sp.set)
	n.cands = slices.Clone(sp.cands)
	n.since = maps.Clone(sp.since)
	n.loaded = maps.Clone(sp.loaded)
	if n.since == nil {
		n.since = map[ids.NodeID]ids.Epoch{}
	}
	return &n
}

// advance takes into sp, the placement of shard s after every event up to
// epoch `after`, every later event of ev in epoch order: joins (a member
// that joins goes to the end of the chain, after everyone who joined
// before it), departures (a departed home's shard moves to the first
// member after it that was complete then, one not draining if there is
// one: moveHome; with none, the shard stays at the departed home: it is
// lost), promotions (promote), and every change of a member's usability
// (a join, a departure, a failure verdict, a drain mark), after each of
// which the set is the home and the first Backups members after it usable
// then, and the draining members already in it (resetSet). A failure verdict before the region's creation does not
// count: the node was alive again when the region was created (its chain
// holds only the members alive then), and has had every release of it.
//
// After each event it forgets the departed members other than the home:
// no later step reads them (a departed member is never complete, usable,
// preferred or promoted again, and a loss lists only the members that
// depart with the home, in the same epoch). So the chain holds the members
// alive (and a lost shard's home), and a walk costs its events times the
// members alive, not times every incarnation of the history. The walk of
// the whole chain at once, with departed members and joiners to come in
// it, gives the same placement (TestWalkIsReference).
func (rc *regionChains) advance(sp *shardPlace, s placement.Shard, ev eventsOf, after ids.Epoch) {
	var proms []directory.PromoteRecord
	for _, p := range ev.promoteRecords(rc.r.ID) {
		if p.At > after && p.Covers(s.Index) {
			proms = append(proms, p)
		}
	}
	_, ins := ev.incarnations()
	pending := rc.joiners(s, rc.joinedAfter(ins, after), ev, func(in protoInc) bool { return !slices.Contains(sp.c, in.proto) })
	members := append(slices.Clip(sp.c), pending...)
	w := &walkCtx{joined: make(map[ids.NodeID]ids.Epoch, len(members)), score: make(map[ids.NodeID]uint64, len(members)),
		recs: map[ids.NodeID][]directory.FillRecord{}, node: make(map[ids.NodeID]ids.NodeID, len(members)),
		span: make(map[ids.NodeID]memberSpan, len(members))}
	var es []ids.Epoch
	for _, b := range members {
		// Only the chain's members are looked up: a chain holds the
		// members alive, far fewer than the incarnations of a long
		// history.
		n := b
		if in, ok := ev.incarnation(b); ok {
			n = in.node
			w.joined[b] = in.joined
		}
		if hn, ok := rc.nodeOf[b]; ok {
			n = hn
		}
		w.node[b] = n
		w.score[b] = placement.Score(s, n)
		w.span[b], es = rc.spanOf(b, w.joined[b], ev, after, es)
	}
	if by := rc.recordsBy(ev); by != nil {
		for _, b := range members {
			for _, f := range by[b] {
				if f.Covers(s.Index) {
					w.recs[b] = append(w.recs[b], f)
				}
			}
		}
	}
	for _, p := range proms {
		es = append(es, p.At)
	}
	slices.Sort(es)
	es = slices.Compact(es)
	last := sp.last
	for _, e := range es {
		for len(pending) > 0 && w.joined[pending[0]] <= e {
			sp.c = append(sp.c, pending[0])
			pending = pending[1:]
		}
		if ev.departedAt(sp.c[sp.hi]) == e {
			rc.moveHome(sp, s, e, ev, w)
		}
		for _, p := range proms {
			if p.At == e {
				rc.promote(sp, p.Proto, s, e, ev, w)
			}
		}
		rc.resetSet(sp, e, ev, w)
		last = e
		sp.forgetDeparted(ev, e)
	}
	// pending is empty: each joiner joined in an epoch of es.
	rc.resetSet(sp, last, ev, w) // the set now (without events: the set before them)
	sp.last, sp.known = last, ev.known()
}

// moveHome moves shard s, whose home departed in epoch e, to the first
// member after it that was complete then and is not draining, or else to
// the first complete one that is (it hands the shard over again); with
// none, the shard stays at the departed home: it is lost.
func (rc *regionChains) moveHome(sp *shardPlace, s placement.Shard, e ids.Epoch, ev eventsOf, w *walkCtx) {
	first := -1
	for j := sp.hi + 1; j < len(sp.c); j++ {
		b := sp.c[j]
		if !rc.completeWith(sp, b, s, e, ev, w.recs[b]) {
			continue
		}
		if rc.usableAt(b, e, w) {
			sp.hi = j
			return
		}
		if first < 0 {
			first = j
		}
	}
	if first >= 0 {
		sp.hi = first
		return
	}
	rc.lose(sp, s, e, ev, w)
}

// spanOf is b's memberSpan under ev (it joined in epoch joined), and es
// with the epochs of its events after `after` and the region's creation:
// its join, departure, first failure verdict and drain mark.
func (rc *regionChains) spanOf(b ids.NodeID, joined ids.Epoch, ev eventsOf, after ids.Epoch, es []ids.Epoch) (memberSpan, []ids.Epoch) {
	dep, failed := ev.departedAt(b), rc.firstFailure(b, ev)
	until := failed
	if dep != 0 {
		until = min(until, dep)
	}
	drained := never
	if d := ev.drainedAt(b); d != 0 {
		drained = d
	}
	for _, e := range []ids.Epoch{dep, joined, failed, drained} {
		if e > rc.r.Epoch && e > after && e != never {
			es = append(es, e)
		}
	}
	return memberSpan{joined: joined, until: until, drained: drained}, es
}

// forgetDeparted drops the members that departed by epoch e, other than
// the home, from the chain (advance).
func (sp *shardPlace) forgetDeparted(ev eventsOf, e ids.Epoch) {
	h := sp.c[sp.hi]
	gone := func(b ids.NodeID) bool {
		d := ev.departedAt(b)
		return b != h && d != 0 && d <= e
	}
	sp.c = slices.DeleteFunc(sp.c, gone) // advance owns sp.c
	sp.hi = slices.Index(sp.c, h)
}

// walkCtx is what a walk knows of the chain's members: the epochs in which
// they joined and their rendezvous scores for the shard.
type walkCtx struct {
	joined map[ids.NodeID]ids.Epoch
	score  map[ids.NodeID]uint64
	recs   map[ids.NodeID][]directory.FillRecord // the completeness records that cover the shard, by member
	// span is, by member, when it is usable (usableAt in one lookup).
	span map[ids.NodeID]memberSpan
	// node is, by member, its node.
	node map[ids.NodeID]ids.NodeID
}

// memberSpan is when a member of a chain can be in a replica set: from
// the epoch it joined in until the first in which it departed or was
// declared failed since the region's creation, and when it can enter one
// or be preferred (usable): until then, and before its drain mark.
type memberSpan struct {
	joined, until, drained ids.Epoch
}

// promote applies a promotion record of member p for shard s committed in
// epoch a: p becomes the home, and the old home h goes right after the
// members that were its backups at a, p excepted (so p's place in the set
// goes to h when p was a backup, and nobody else leaves or enters it). h
// is demoted: its time in the set starts again at a, so it is incomplete
// until its new home fills it again. A record whose member is not complete
// at a (it departed, or it is not in the set, or its fills began before its
// latest entry into the set), or that names the home, or that comes when
// the home departed (the shard is lost), changes nothing: every node
// ignores it alike.
func (rc *regionChains) promote(sp *shardPlace, p ids.NodeID, s placement.Shard, a ids.Epoch, ev eventsOf, w *walkCtx) {
	h := sp.c[sp.hi]
	if p == h || !slices.Contains(sp.c, p) {
		return
	}
	if d := ev.departedAt(h); d != 0 && d <= a {
		rc.revive(sp, p, s, a, ev, w)
		return
	}
	if !rc.usableAt(p, a, w) || !rc.completeWith(sp, p, s, a, ev, w.recs[p]) {
		return // a draining member is never promoted (the directory refuses it too)
	}
	var backups []ids.NodeID
	for j := sp.hi + 1; j < len(sp.c) && len(backups) < rc.k; j++ {
		if rc.usableAt(sp.c[j], a, w) {
			backups = append(backups, sp.c[j])
		}
	}
	c := make([]ids.NodeID, 0, len(sp.c))
	for _, b := range sp.c[:sp.hi] {
		if b != p {
			c = append(c, b)
		}
	}
	hi := len(c)
	c = append(c, p)
	var rest []ids.NodeID
	for _, b := range sp.c[sp.hi+1:] {
		if b != p {
			rest = append(rest, b)
		}
	}
	at := 0
	for i, b := range rest {
		if slices.Contains(backups, b) {
			at = i + 1
		}
	}
	c = append(c, rest[:at]...)
	c = append(c, h)
	c = append(c, rest[at:]...)
	sp.c, sp.hi = c, hi
	delete(sp.since, h)
	delete(sp.loaded, h)
}

// resetSet makes the replica set of sp the home, the first Backups
// members after it usable at epoch e, and the shard's preferred member at
// e when it is neither (the extra backup, which its home fills so that it
// can be promoted): members that enter the set are in it since e, members
// that leave it are forgotten. A lost shard (its home departed) has no
// extra backup: nobody could fill it.
func (rc *regionChains) resetSet(sp *shardPlace, e ids.Epoch, ev eventsOf, w *walkCtx) {
	set := []ids.NodeID{sp.c[sp.hi]}
	for j := sp.hi + 1; j < len(sp.c) && len(set) <= rc.k; j++ {
		if rc.usableAt(sp.c[j], e, w) {
			set = append(set, sp.c[j])
		}
	}
	sp.preferred = ids.None
	for _, b := range sp.c {
		if rc.usableAt(b, e, w) && (sp.preferred == ids.None || w.score[b] > w.score[sp.preferred] ||
			w.score[b] == w.score[sp.preferred] && b < sp.preferred) {
			sp.preferred = b
		}
	}
	if h := sp.c[sp.hi]; sp.preferred != ids.None && !slices.Contains(set, sp.preferred) && (ev.departedAt(h) == 0 || ev.departedAt(h) > e) {
		set = append(set, sp.preferred)
	}
	// A draining member stays in the set it is in until it departs: its
	// copy counts, and releases reach it, while its replacement fills.
	for _, b := range sp.c[sp.hi+1:] {
		if _, in := sp.since[b]; in && !slices.Contains(set, b) && rc.drainingAt(b, e, w) {
			set = append(set, b)
		}
	}
	sp.set = set
	for b := range sp.since {
		if !slices.Contains(set, b) {
			delete(sp.since, b)
			delete(sp.loaded, b)
		}
	}
	for _, b := range set {
		if _, ok := sp.since[b]; !ok {
			sp.since[b] = e
		}
	}
}

// usableAt reports whether b could enter a replica set, or be preferred,
// at epoch e: it had joined, not departed, not been declared failed since
// the region's creation, and not been marked draining.
func (rc *regionChains) usableAt(b ids.NodeID, e ids.Epoch, w *walkCtx) bool {
	sp := w.span[b]
	return sp.joined <= e && e < sp.until && e < sp.drained
}

// drainingAt reports whether b is marked draining at epoch e and has not
// departed or been declared failed since the region's creation: it stays
// in a replica set it is in.
func (rc *regionChains) drainingAt(b ids.NodeID, e ids.Epoch, w *walkCtx) bool {
	sp := w.span[b]
	return sp.joined <= e && e < sp.until && e >= sp.drained
}

// firstFailure is the first epoch e after the region's creation for which
// ev says b was declared failed between the creation and e (never: no
// such verdict). failedBetween only grows with its upper bound, so a
// binary search finds it.
func (rc *regionChains) firstFailure(b ids.NodeID, ev eventsOf) ids.Epoch {
	lo := rc.r.Epoch
	if !ev.failedBetween(b, lo, never) {
		return never
	}
	if d := ev.departedAt(b); d != 0 && (d <= lo || !ev.failedBetween(b, lo, d-1)) {
		return never // no verdict before its departure, which the walk takes
	}
	hi := never // failedBetween(b, lo, hi) holds; lo's does not
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if ev.failedBetween(b, rc.r.Epoch, mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// place returns the placement of shard s under ev (its chain is empty for
// a region without homes), from the cache when ev's generation has it, and
// otherwise resumed from the cached placement when ev is a later view
// (resume), so that a view change costs each shard its new events only.
func (rc *regionChains) place(s placement.Shard, ev eventsOf) *shardPlace {
	gen, _ := ev.incarnations()
	var from *shardPlace
	if gen != 0 {
		rc.mu.Lock()
		e, ok := rc.places[s.Index]
		rc.mu.Unlock()
		if ok && e.gen == gen {
			return e.sp
		}
		if ok && e.sp.known != 0 && ev.known() > e.sp.known {
			from = e.sp
		}
	}
	var sp *shardPlace
	if from != nil {
		sp = rc.resume(from, s, ev)
	} else {
		sp = rc.walk(s, ev)
	}
	if gen != 0 {
		rc.mu.Lock()
		if _, ok := rc.places[s.Index]; !ok && len(rc.places) >= maxCachedChains {
			evictOne(rc.places)
		}
		rc.places[s.Index] = placeEntry{gen, sp}
		rc.mu.Unlock()
	}
	return sp
}

// shardHome is the home of shard s under ev.
func (rc *regionChains) shardHome(s placement.Shard, ev eventsOf) ids.NodeID {
	sp := rc.place(s, ev)
	if len(sp.c) == 0 {
		return ids.None
	}
	return sp.c[sp.hi]
}

// maxDigestShards bounds the regions homesDigest covers: it places every
// shard.
const maxDigestShards = 4096

// homesDigest is a short hash of every shard's home under ev, or "" for a
// region of more than maxDigestShards shards. The placement is a function
// of the protocol epoch, so two members' digests for one epoch must be
// equal: dsmd logs it with each epoch ("region members changed", homes),
// and the chaos harness compares them across nodes.
func (rc *regionChains) homesDigest(ev eventsOf) string {
	n := rc.r.Shards()
	if n > maxDigestShards {
		return ""
	}
	home := rc.homeOf(ev) // as the engine is told
	h := fnv.New64a()
	var b [4]byte
	for i := range n {
		binary.LittleEndian.PutUint32(b[:], uint32(home(ids.PageNo(i*rc.r.PagesPerShard()))))
		h.Write(b[:])
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

// backups are the backups of the shard: the first Backups members usable
// now after its home, and its extra backup (the preferred member, when it
// is neither home nor one of those). The caller must not modify it.
func (sp *shardPlace) backups() []ids.NodeID {
	if len(sp.set) == 0 {
		return nil
	}
	return sp.set[1:]
}

// shardBackups are the backups of shard s under ev: the first Backups
// members of its chain after its home that have not departed and were
// never declared failed since the region's creation, complete or not, and
// the extra backup (shardPlace.backups).
func (rc *regionChains) shardBackups(s placement.Shard, ev eventsOf) []ids.NodeID {
	return rc.place(s, ev).backups()
}

// completeBackups counts the backups of shard s under ev that are
// complete now, and returns the others (those a fill must complete).
func (rc *regionChains) completeBackups(s placement.Shard, ev eventsOf) (complete int, incomplete []ids.NodeID) {
	sp := rc.place(s, ev)
	for _, b := range sp.backups() {
		if rc.completeAt(sp, b, s, never, ev) {
			complete++
		} else {
			incomplete = append(incomplete, b)
		}
	}
	return complete, incomplete
}

// usable reports whether b can be a backup of the region: it has not
// departed, and no failure verdict since the region's creation dropped it
// (it may have missed releases, and the protocol epoch does not move when
// it comes back: it stays out until it restarts, as a new incarnation).
func (rc *regionChains) usable(b ids.NodeID, ev eventsOf) bool {
	return ev.departedAt(b) == 0 && ev.drainedAt(b) == 0 && !ev.failedBetween(b, rc.r.Epoch, never)
}

// complete reports whether member b of a creation chain still holds every
// release of the region: it has not departed, and no failure verdict since
// the region's creation dropped it from the backups.
func (rc *regionChains) complete(b ids.NodeID, ev eventsOf) bool {
	return rc.usable(b, ev)
}

// homeOf and backupsOf are the placement of the region's pages under ev.
func (rc *regionChains) homeOf(ev eventsOf) func(ids.PageNo) ids.NodeID {
	if !rc.anyDeparted(ev) {
		// Every shard at the first of its chain: no chain is built.
		return func(p ids.PageNo) ids.NodeID { return rc.protos[placement.Home(rc.r.ShardOf(p), rc.nodes)] }
	}
	return func(p ids.PageNo) ids.NodeID { return rc.shardHome(rc.r.ShardOf(p), ev) }
}

func (rc *regionChains) backupsOf(ev eventsOf) func(ids.PageNo) []ids.NodeID {
	return func(p ids.PageNo) []ids.NodeID { return rc.shardBackups(rc.r.ShardOf(p), ev) }
}

// maxExactTargets bounds the shards whose homes are compared one by one to
// find the targets of a move; a larger region names every chain member
// still there as a possible target (each one then answers every member's
// count, and nothing else changes).
const maxExactTargets = 1 << 16

// targets are the new homes, under now, of the shards whose home differs
// from the one under last and is still there (nil: nothing moved), or,
// for a region too large to compare shard by shard or with promotion
// records, every member still there.
func (rc *regionChains) targets(last, now eventsOf) []ids.NodeID {
	if !rc.anyDeparted(now) {
		return nil
	}
	var out []ids.NodeID
	add := func(h ids.NodeID) {
		if !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	// With promotions, a home can gain a shard in an epoch and lose it in
	// a later one (a promotion, then another, or a departure): a member
	// that skipped those epochs sees no difference, yet must wait for
	// that home's count (the simulator's promote-crash seed 5). Every
	// member still there is named then.
	n := rc.r.Shards()
	if n > maxExactTargets || rc.promoted(now) {
		_, ins := now.incarnations()
		for _, in := range ins {
			if now.departedAt(in.proto) == 0 {
				add(in.proto)
			}
		}
		for _, p := range rc.protos {
			if now.departedAt(p) == 0 {
				add(p)
			}
		}
	} else {
		for i := range n {
			s := placement.Shard{Region: rc.r.ID, Index: i}
			// A shard whose new home departed too is lost, not moved:
			// no target (coherence: the page's home is no member).
			if h := rc.shardHome(s, now); h != rc.shardHome(s, last) && h != ids.None && now.departedAt(h) == 0 {
				add(h)
			}
		}
	}
	slices.Sort(out)
	return out
}

// homedAt counts the shards whose home under ev is protocol id p, or
// returns -1 for a region of more than maxExactTargets shards (too many to
// place one by one on every epoch).
func (rc *regionChains) homedAt(p ids.NodeID, ev eventsOf) int {
	n := rc.r.Shards()
	if n > maxExactTargets {
		return -1
	}
	c := 0
	for i := range n {
		if rc.shardHome(placement.Shard{Region: rc.r.ID, Index: i}, ev) == p {
			c++
		}
	}
	return c
}

// needing returns the shards of the region that need member p: those it
// is home of, and those whose replica set holds it. It places every shard:
// the caller leaves out regions of more than maxExactTargets shards.
func (rc *regionChains) needing(p ids.NodeID, ev eventsOf) []uint64 {
	var out []uint64
	for i := range rc.r.Shards() {
		sp := rc.place(placement.Shard{Region: rc.r.ID, Index: i}, ev)
		if len(sp.c) > 0 && (sp.c[sp.hi] == p || slices.Contains(sp.set, p)) {
			out = append(out, i)
		}
	}
	return out
}

// handOver counts, of shards (needing's, when member p was marked
// draining), those that still need p before it can leave without moving
// any and without thinning any replica set (docs/failover.md §11): p is
// still their home while another member is usable (the shard's preferred
// member, which proposes its promotion once complete), or a backup of
// theirs other than p is incomplete (a replacement of p, or the backup a
// promotion gave the new home, which its home fills).
func (rc *regionChains) handOver(p ids.NodeID, ev eventsOf, shards []uint64) int {
	c := 0
	for _, i := range shards {
		s := placement.Shard{Region: rc.r.ID, Index: i}
		sp := rc.place(s, ev)
		switch {
		case len(sp.c) == 0 || ev.departedAt(sp.c[sp.hi]) != 0:
		case sp.c[sp.hi] == p:
			if sp.preferred != ids.None {
				c++
			}
		default:
			for _, b := range sp.backups() {
				if b != p && !rc.completeAt(sp, b, s, never, ev) {
					c++
					break
				}
			}
		}
	}
	return c
}

// anyEvent reports whether a home at the region's creation departed, or
// failed since, or a promotion was recorded, under ev (otherwise every
// shard is at the first of its chain, with all its backups).
func (rc *regionChains) anyEvent(ev eventsOf) bool {
	if rc.promoted(ev) {
		return true
	}
	for _, p := range rc.protos {
		if !rc.complete(p, ev) {
			return true
		}
	}
	return false
}

// anyDeparted reports whether a home at the region's creation departed,
// or a promotion was recorded, under ev (otherwise every shard is at the
// first of its chain).
func (rc *regionChains) anyDeparted(ev eventsOf) bool {
	if rc.promoted(ev) {
		return true
	}
	for _, p := range rc.protos {
		if ev.departedAt(p) != 0 {
			return true
		}
	}
	return false
}

// promoted reports whether ev records a promotion of the region, or a
// checkpoint, which may have dropped promotion records.
func (rc *regionChains) promoted(ev eventsOf) bool {
	at, _ := ev.checkpoint(rc.r.ID)
	return at != 0 || len(ev.promoteRecords(rc.r.ID)) > 0
}

// noEvents is a view in which nothing departed or failed and nobody
// joined: every shard at the first of its chain.
type noEvents struct{}

func (noEvents) known() ids.Epoch                                    { return 0 }
func (noEvents) checkpoint(ids.RegionID) (ids.Epoch, []byte)         { return 0, nil }
func (noEvents) incarnation(ids.NodeID) (protoInc, bool)             { return protoInc{}, false }
func (noEvents) departedAt(ids.NodeID) ids.Epoch                     { return 0 }
func (noEvents) drainedAt(ids.NodeID) ids.Epoch                      { return 0 }
func (noEvents) failedBetween(ids.NodeID, ids.Epoch, ids.Epoch) bool { return false }
func (noEvents) incarnations() (ids.Epoch, []protoInc)               { return 0, nil }
func (noEvents) fillRecords(ids.RegionID) []directory.FillRecord     { return nil }
func (noEvents) promoteRecords(ids.RegionID) []directory.PromoteRecord {
	return nil
}

// checkpointIn is the region's placement checkpoint in ev, decoded (nil:
// none). The directory commits only checkpoints that decode for the
// region (directory.RecordCheckpoint), so one that does not cannot come;
// it would be ignored.
func (rc *regionChains) checkpointIn(ev eventsOf) *placement.Checkpoint {
	at, data := ev.checkpoint(rc.r.ID)
	if at == 0 {
		return nil
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, cp := range rc.cps {
		if cp != nil && cp.At == at {
			return cp
		}
	}
	cp, err := placement.DecodeCheckpoint(data, rc.r.Shards())
	if err != nil || cp.At != at {
		return nil
	}
	switch {
	case rc.cps[0] == nil || at > rc.cps[0].At:
		rc.cps[0], rc.cps[1] = cp, rc.cps[0]
	case rc.cps[1] == nil || at > rc.cps[1].At:
		rc.cps[1] = cp
	}
	return cp
}

// checkpointState is sp as a checkpoint keeps it (placement.ShardState).
func checkpointState(sp *shardPlace) placement.ShardState {
	entered := func(m map[ids.NodeID]ids.Epoch) []placement.Entered {
		var es []placement.Entered
		for p, e := range m {
			es = append(es, placement.Entered{Proto: p, At: e})
		}
		slices.SortFunc(es, func(a, b placement.Entered) int { return cmp.Compare(a.Proto, b.Proto) })
		return es
	}
	return placement.ShardState{Chain: slices.Clone(sp.c), Home: sp.hi, Since: entered(sp.since), Loaded: entered(sp.loaded),
		LostAt: sp.lostAt, Candidates: slices.Clone(sp.cands), Reset: sp.reset, Last: sp.last}
}

// checkpoint is the placement of every shard of the region under ev, a
// view whose every event is known (ev.known), as a checkpoint.
func (rc *regionChains) checkpoint(ev eventsOf) *placement.Checkpoint {
	cp := &placement.Checkpoint{At: ev.known()}
	seen := map[string]uint32{}
	for i := range rc.r.Shards() {
		cp.Add(checkpointState(rc.place(placement.Shard{Region: rc.r.ID, Index: i}, ev)), seen)
	}
	return cp
}

// walkFrom is walk from checkpoint cp (taken in a view of the same
// directory, before ev's): shard s's state there, and every event after
// cp.At. Records of incarnations that had departed by cp.At are not read.
func (rc *regionChains) walkFrom(cp *placement.Checkpoint, s placement.Shard, ev eventsOf) *shardPlace {
	st := cp.State(s.Index)
	sp := &shardPlace{c: slices.Clone(st.Chain), hi: st.Home, since: make(map[ids.NodeID]ids.Epoch, len(st.Since)),
		lostAt: st.LostAt, cands: slices.Clone(st.Candidates), reset: st.Reset, region: rc.r.ID, last: st.Last, known: cp.At}
	for _, e := range st.Since {
		sp.since[e.Proto] = e.At
	}
	if len(st.Loaded) > 0 {
		sp.loaded = make(map[ids.NodeID]ids.Epoch, len(st.Loaded))
		for _, e := range st.Loaded {
			sp.loaded[e.Proto] = e.At
		}
	}
	rc.advance(sp, s, ev, cp.At)
	return sp
}
