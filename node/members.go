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
// under its id; a region's pages are homed and backed up by the
// incarnations alive at its creation (Region.Homes and HomeIncarnations),
// and move along their chains when a home departs (placement.go).

// incarnation is one protocol id's process.
type incarnation struct {
	node ids.NodeID
	inc  uint64
	// departed: the incarnation is gone for good (restarted, left, or
	// declared failed: a verdict is final, and a process that lived on
	// behind a partition comes back as a new incarnation).
	departed bool
	// why says what happened to it, for errors (a verb phrase), when it
	// departed or failed; event the same without what it means for the
	// pages it was home of.
	why, event string
	// leftAt is the directory epoch of its departure (0: a member);
	// failedAt and lastFailed those in which it was first and last
	// declared failed, failures how often (0: never).
	leftAt, failedAt, lastFailed ids.Epoch
	failures                     uint32
	// joinedAt is the directory epoch in which it joined (0: unknown);
	// drainedAt that of its drain mark (0: none), from which it hands its
	// shards over (placement.go).
	joinedAt, drainedAt ids.Epoch
	// nonce is a member's process nonce (0 for a departed one).
	nonce uint64
}

// protoMap is the protocol's view of one directory view.
type protoMap struct {
	byProto map[ids.NodeID]incarnation
	// members are the protocol ids that take part: every incarnation in
	// the member table that did not depart (leave, or a failure verdict).
	// Sorted.
	members []ids.NodeID
	// epoch is the protocol epoch of members: coherenceEpoch plus the
	// number of ids ever given out, plus the number departed, plus the
	// failure verdicts ever given (each a departure; before verdicts were
	// final, each dropped a member from the backups), plus the promotion
	// records ever committed (directory.View.Promotions), plus the drain
	// marks ever made (directory.View.Drains).
	// Ids are given out and depart once each, verdicts only add up, and
	// every node computes this from the same table, so one epoch names
	// one member set and one placement on every node, whichever views it
	// skipped.
	epoch ids.Epoch
	// ins are every incarnation of byProto, sorted by protocol id.
	ins []protoInc
	// fills are the regions' completeness records.
	fills map[ids.RegionID][]directory.FillRecord
	// proms are the regions' promotion records.
	proms map[ids.RegionID][]directory.PromoteRecord
	// cps are the regions' placement checkpoints (directory.Region.Checkpoint).
	cps map[ids.RegionID]regionCheckpoint
	// promotions counts the promotions ever committed (View.Promotions):
	// unlike the records, which a checkpoint drops, it only grows.
	promotions uint64
	// dirEpoch is the directory epoch of the view (0 in tests).
	dirEpoch ids.Epoch
	// comeBack: an incarnation that is a member again after a failure
	// verdict (recorded by a version before verdicts were final).
	comeBack bool
}

// incarnations implements eventsOf: the set of incarnations is a
// function of the protocol epoch.
func (pm *protoMap) incarnations() (ids.Epoch, []protoInc) { return pm.epoch, pm.ins }

// fillRecords implements eventsOf.
func (pm *protoMap) fillRecords(r ids.RegionID) []directory.FillRecord { return pm.fills[r] }

// promoteRecords implements eventsOf.
func (pm *protoMap) promoteRecords(r ids.RegionID) []directory.PromoteRecord { return pm.proms[r] }

// regionCheckpoint is a region's placement checkpoint, encoded.
type regionCheckpoint struct {
	at   ids.Epoch
	data []byte
}

// checkpoint implements eventsOf.
func (pm *protoMap) checkpoint(r ids.RegionID) (ids.Epoch, []byte) {
	cp := pm.cps[r]
	return cp.at, cp.data
}

// known implements eventsOf: the directory epoch of the view, or 0 (walks
// do not resume) for a view that has an incarnation declared failed and
// alive again, which versions before final verdicts recorded:
// failedBetween keeps only its first and last verdicts, so a later one
// could change what it said of an epoch before.
func (pm *protoMap) known() ids.Epoch {
	if pm.comeBack {
		return 0
	}
	return pm.dirEpoch
}

// incarnation implements eventsOf.
func (pm *protoMap) incarnation(p ids.NodeID) (protoInc, bool) {
	in, ok := pm.byProto[p]
	return protoInc{proto: p, node: in.node, inc: in.inc, joined: in.joinedAt}, ok
}

// departedAt implements eventsOf.
func (pm *protoMap) departedAt(p ids.NodeID) ids.Epoch { return pm.byProto[p].leftAt }

// drainedAt implements eventsOf.
func (pm *protoMap) drainedAt(p ids.NodeID) ids.Epoch { return pm.byProto[p].drainedAt }

// failedBetween implements eventsOf. Only the first and the last verdict
// are recorded: when a verdict in the range cannot be ruled out, it says
// there was one.
func (pm *protoMap) failedBetween(p ids.NodeID, after, upTo ids.Epoch) bool {
	in := pm.byProto[p]
	switch {
	case in.failures == 0 || in.lastFailed <= after:
		return false
	case in.lastFailed <= upTo:
		return true
	case in.failedAt > after:
		return in.failedAt <= upTo
	}
	return true // a verdict after `after`, maybe one before upTo too
}

func newProtoMap(v *directory.View) *protoMap {
	pm := buildProtoMap(v.Members(), v.Quarantine())
	pm.dirEpoch = v.Epoch
	// Every promotion moves the protocol epoch too: the shards it hands
	// over move in an epoch of their own (the count only grows).
	pm.epoch += ids.Epoch(v.Promotions())
	pm.promotions = v.Promotions()
	// So does every drain mark: the marked member leaves the backups it
	// was not in yet, and is nobody's preferred member.
	pm.epoch += ids.Epoch(v.Drains())
	for _, r := range v.Regions() {
		if r.CheckpointAt != 0 {
			if pm.cps == nil {
				pm.cps = map[ids.RegionID]regionCheckpoint{}
			}
			pm.cps[r.ID] = regionCheckpoint{r.CheckpointAt, r.Checkpoint}
		}
		if len(r.Filled) > 0 {
			if pm.fills == nil {
				pm.fills = map[ids.RegionID][]directory.FillRecord{}
			}
			pm.fills[r.ID] = r.Filled
		}
		if len(r.Promoted) > 0 {
			if pm.proms == nil {
				pm.proms = map[ids.RegionID][]directory.PromoteRecord{}
			}
			pm.proms[r.ID] = r.Promoted
		}
	}
	return pm
}

// buildProtoMap is newProtoMap of a view's member table and quarantine.
func buildProtoMap(members []directory.Member, quarantine []directory.Quarantined) *protoMap {
	pm := &protoMap{byProto: map[ids.NodeID]incarnation{}}
	departed, failed := 0, 0
	byNode := map[ids.NodeID]directory.Member{}
	for _, m := range members {
		byNode[m.ID] = m
		if m.Proto == ids.None {
			continue
		}
		in := incarnation{node: m.ID, inc: m.Incarnation, failedAt: m.FailedAt, lastFailed: m.LastFailedAt, failures: m.Failures,
			joinedAt: m.JoinedAt, drainedAt: m.DrainingAt, nonce: m.Nonce}
		switch m.State {
		case directory.StateLeft:
			in.departed, in.why = true, fmt.Sprintf("left the cluster in epoch %d", m.DepartedAt())
			if m.Failures > 0 {
				in.why = fmt.Sprintf("failed in epoch %d", m.DepartedAt())
			}
			in.event = in.why
			in.leftAt = m.DepartedAt()
			departed++
		case directory.StateFailed:
			// A failure verdict is a departure: the directory never puts
			// this incarnation alive again (a process that lived on comes
			// back as a new one), so its homes move to their backups and
			// the homes repair the words that name it.
			in.departed, in.why = true, fmt.Sprintf("failed in epoch %d", m.DepartedAt())
			in.event = in.why
			if in.failures == 0 {
				// Recorded before failures were counted.
				in.failedAt, in.lastFailed, in.failures = max(m.Epoch, 1), max(m.Epoch, 1), 1
			}
			in.leftAt = m.DepartedAt()
			departed++
		default:
			pm.members = append(pm.members, m.Proto)
			pm.comeBack = pm.comeBack || m.Failures > 0
		}
		pm.byProto[m.Proto] = in
	}
	for _, q := range quarantine {
		event := fmt.Sprintf("restarted in epoch %d (incarnation %d was replaced)", q.LeftAt, q.Incarnation)
		why := event + ": the pages it was home of and nobody backed up were lost with that process"
		if m, ok := byNode[q.Node]; ok && m.Incarnation > q.Incarnation {
			event = fmt.Sprintf("restarted (incarnation %d, epoch %d)", m.Incarnation, q.LeftAt)
			why = event + ": the pages it was home of and nobody backed up were lost with its previous process"
		}
		pm.byProto[q.Proto] = incarnation{node: q.Node, inc: q.Incarnation, departed: true, why: why, event: event,
			leftAt: max(q.LeftAt, 1), failedAt: q.FailedAt, lastFailed: q.LastFailedAt, failures: q.Failures, joinedAt: q.JoinedAt,
			drainedAt: q.DrainingAt}
		departed++
	}
	for p, in := range pm.byProto {
		failed += int(in.failures)
		pm.ins = append(pm.ins, protoInc{proto: p, node: in.node, inc: in.inc, joined: in.joinedAt})
	}
	slices.SortFunc(pm.ins, func(a, b protoInc) int { return int(a.proto) - int(b.proto) })
	slices.Sort(pm.members)
	pm.epoch = coherenceEpoch + ids.Epoch(len(pm.byProto)+departed+failed)
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
