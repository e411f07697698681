package node

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/ids"
)

// The coherence protocol names each process incarnation by its protocol id
// (directory.Member.Proto): a restarted dsmd is a new id, and a departed
// id never comes back. Every member takes part in every region's protocol
// under its id; a region's homes stay the incarnations alive at its
// creation (Region.Homes and HomeIncarnations: homes do not move yet, see
// docs/failover.md).

// incarnation is one protocol id's process.
type incarnation struct {
	node ids.NodeID
	inc  uint64
	// departed: the incarnation is gone for good (restarted, or left);
	// failed: the directory's failure detector says so (it may be alive
	// behind a partition, so it stays a member).
	departed, failed bool
	// why says what happened to it, for errors (a verb phrase), when it
	// departed or failed.
	why string
}

// protoMap is the protocol's view of one directory view.
type protoMap struct {
	byProto map[ids.NodeID]incarnation
	// members are the protocol ids that take part: every incarnation in
	// the member table that did not leave. Sorted.
	members []ids.NodeID
	// epoch is the protocol epoch of members: coherenceEpoch plus the
	// number of ids ever given out plus the number departed. Ids are
	// given out and depart once each, and every node computes this from
	// the same table, so one epoch names one member set on every node,
	// whichever views it skipped.
	epoch ids.Epoch
}

func newProtoMap(v *directory.View) *protoMap {
	pm := &protoMap{byProto: map[ids.NodeID]incarnation{}}
	departed := 0
	for _, m := range v.Members() {
		if m.Proto == ids.None {
			continue
		}
		in := incarnation{node: m.ID, inc: m.Incarnation}
		switch m.State {
		case directory.StateLeft:
			in.departed, in.why = true, fmt.Sprintf("left the cluster in epoch %d", m.Epoch)
			departed++
		case directory.StateFailed:
			in.failed, in.why = true, fmt.Sprintf("failed in epoch %d", m.Epoch)
			pm.members = append(pm.members, m.Proto)
		default:
			pm.members = append(pm.members, m.Proto)
		}
		pm.byProto[m.Proto] = in
	}
	for _, q := range v.Quarantine() {
		why := fmt.Sprintf("restarted in epoch %d (incarnation %d was replaced): the pages it was home of were lost with that process", q.LeftAt, q.Incarnation)
		if m, ok := v.Member(q.Node); ok && m.Incarnation > q.Incarnation {
			why = fmt.Sprintf("restarted (incarnation %d, epoch %d): the pages it was home of were lost with its previous process", m.Incarnation, q.LeftAt)
		}
		pm.byProto[q.Proto] = incarnation{node: q.Node, inc: q.Incarnation, departed: true, why: why}
		departed++
	}
	slices.Sort(pm.members)
	pm.epoch = coherenceEpoch + ids.Epoch(len(pm.byProto)+departed)
	return pm
}

// nodeOf maps a protocol id to its node (engine.Config.NodeOf).
func (pm *protoMap) nodeOf(p ids.NodeID) (ids.NodeID, bool) {
	in, ok := pm.byProto[p]
	return in.node, ok
}

// protoOf finds the protocol id of a node's incarnation.
func (pm *protoMap) protoOf(node ids.NodeID, inc uint64) (ids.NodeID, bool) {
	for p, in := range pm.byProto {
		if in.node == node && in.inc == inc {
			return p, true
		}
	}
	return ids.None, false
}

// homeProtos are the protocol ids of a region's homes, in Homes' order: the
// incarnations recorded at its creation. A region recorded without
// incarnations (before they existed) names incarnation 1.
func (pm *protoMap) homeProtos(r directory.Region) ([]ids.NodeID, error) {
	out := make([]ids.NodeID, len(r.Homes))
	for i, h := range r.Homes {
		inc, _ := r.HomeIncarnation(h)
		if inc == 0 {
			inc = 1
		}
		p, ok := pm.protoOf(h, inc)
		if !ok {
			return nil, fmt.Errorf("home %v (incarnation %d) has no protocol id in the directory", h, inc)
		}
		out[i] = p
	}
	return out, nil
}

// protoView is the current protoMap, swapped on every directory view and
// read by the engines' NodeOf and the message routing.
type protoView struct{ p atomic.Pointer[protoMap] }

func (pv *protoView) nodeOf(p ids.NodeID) (ids.NodeID, bool) {
	pm := pv.p.Load()
	if pm == nil {
		return ids.None, false
	}
	return pm.nodeOf(p)
}
