package coherence

import "github.com/dsmkit/dsm/internal/ids"

// This file holds the clear of the backup slots a node entered anew
// (docs/failover.md §7, "A page promoted away before its new home rebuilt
// it").
//
// A fill skips a page never written at its home, counting on the
// backup's slot reading zero too. That holds for a member that enters a
// backup set with fresh memory, not for a home demoted by a promotion: it
// stays a backup of the pages that moved away, and its slots keep what
// they held. After a home died in the middle of a release that wrote one
// backup, promoted away before it rebuilt the page, that is a dead
// releaser's write beside a newer stamp, which the new home never had:
// the fill skips the page, counts the slot complete, and a later failure
// that brings the page back there hands the dead write out after readers
// saw the page without it.
//
// So the node layer says, in the Reconfigure, that such slots exist
// (ClearPending), and zeroes their data when the node asks it to
// (Ready.ClearSlots): once every member has acknowledged the epoch, or a
// later one, to this node (a member in it uses those slots as backup
// slots only, and its verbs of older epochs to this node are finished: a
// lagging reader that validated the home word before the stamp may still
// read the data beside it until then), and once this node's own batches
// of older epochs are finished. Until SlotsCleared, the node's epoch
// acknowledgements say Clearing, and a home starts no fill to it
// (fenced). Nothing waits on anything else: two nodes that clear at once
// acknowledge each other's probes all the same.

// checkClear hands the clear to the node layer once it is due, and probes
// the members whose acknowledgement it waits for.
func (n *Node) checkClear() {
	if n.clearNeed <= n.clearAsked {
		return
	}
	var ask []ids.NodeID
	for _, m := range n.members {
		if m != n.cfg.ID && n.ackedIn[m] < n.clearNeed {
			ask = append(ask, m)
		}
	}
	if len(ask) > 0 {
		if n.clearProbeAt == 0 || n.now-n.clearProbeAt >= uint64(2*n.cfg.RetransmitTicks) {
			n.clearProbeAt = max(n.now, 1)
			for _, m := range ask {
				n.send(MsgEpoch, m, 0, 0, false)
			}
		}
		return
	}
	for _, rec := range n.batches {
		if rec.epoch < n.clearNeed {
			return // stepDone checks again
		}
	}
	n.clearAsked = n.clearNeed
	n.rd.ClearSlots = n.clearNeed
}
