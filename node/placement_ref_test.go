package node

import (
	"slices"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
)

// walkReference is the walk as it was before advance (the version of
// session 11 to 16, which the engine simulation and the tests on real
// processes ran): the whole chain at once, every incarnation in it from
// the start, departed members kept. walk must place every shard as it
// does (TestWalkIsReference).
//
// It places shard s under ev: it starts from the shard's chain with its
// home first and the creation prefix in the set, and takes, in epoch order,
// every event that changes the set or the home: departures (a departed
// home's shard moves to the first member after it that was complete then,
// not draining if there is one: moveHome; with none, the shard stays at
// the departed home: it is lost), promotions (promote), and every change
// of a member's usability (a join, a departure, a failure verdict, a drain
// mark), after each of which the set is the home
// and the first Backups members after it usable then. A failure verdict
// before the region's creation does not count: the node was alive again
// when the region was created (its chain holds only the members alive
// then), and has had every release of it.
func (rc *regionChains) walkReference(s placement.Shard, ev eventsOf) *shardPlace {
	c, base := rc.chain(s, ev)
	sp := &shardPlace{c: c, since: make(map[ids.NodeID]ids.Epoch, base), region: rc.r.ID}
	if len(c) == 0 {
		return sp
	}
	created := rc.r.Epoch
	for _, b := range c[:base] {
		sp.since[b] = created
	}
	var proms []directory.PromoteRecord
	for _, p := range ev.promoteRecords(rc.r.ID) {
		if p.Covers(s.Index) {
			proms = append(proms, p)
		}
	}
	_, ins := ev.incarnations()
	w := &walkCtx{joined: make(map[ids.NodeID]ids.Epoch, len(c)), score: make(map[ids.NodeID]uint64, len(c)),
		recs: map[ids.NodeID][]directory.FillRecord{}, node: make(map[ids.NodeID]ids.NodeID, len(c))}
	for _, f := range ev.fillRecords(rc.r.ID) {
		if f.Covers(s.Index) {
			w.recs[f.Proto] = append(w.recs[f.Proto], f)
		}
	}
	node := make(map[ids.NodeID]ids.NodeID, len(ins))
	for _, in := range ins {
		w.joined[in.proto] = in.joined
		node[in.proto] = in.node
	}
	for n, p := range rc.protos {
		node[p] = n
	}
	for _, b := range c {
		n, ok := node[b]
		if !ok {
			n = b
		}
		w.node[b] = n
		w.score[b] = placement.Score(s, n)
	}
	last := created
	var es []ids.Epoch
	w.span = make(map[ids.NodeID]memberSpan, len(c))
	for _, b := range c {
		w.span[b], es = rc.spanOf(b, w.joined[b], ev, 0, es)
	}
	for _, p := range proms {
		es = append(es, p.At)
	}
	slices.Sort(es)
	es = slices.Compact(es)
	for _, e := range es {
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
	}
	rc.resetSet(sp, last, ev, w) // the set now (without events: the creation set)
	return sp
}
