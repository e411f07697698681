package coherence

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/dsmkit/dsm/internal/ids"
)

// ---- introspection (tests, the node layer's status pages) ----

// PageInfo is a snapshot of one page at this node.
type PageInfo struct {
	State    State
	Version  uint16 // tenure of the copy
	Data     []byte // S, M: the copy (do not modify)
	Phase    string
	Pending  int // queued local requests
	Awaiting []ids.NodeID
	// Unit reports that the node's sharer unit is in the word, added at
	// tenure UnitVersion.
	Unit        bool
	UnitVersion uint16
	// Tenure reports that the node holds, or may hold, the page's tenure
	// and the only up-to-date data: M, a release under way, or a release
	// interrupted by the failure of the home.
	Tenure bool
	// Frozen reports that the page's home moved and the new home has not
	// rebuilt the word yet.
	Frozen bool
	// Word is the page's coherence word as this node last observed it
	// (its holder and reservation say whom a blocked request waits for).
	Word Word
}

// Page describes page no at this node.
func (n *Node) Page(no ids.PageNo) PageInfo {
	p := n.pages[no]
	if p == nil {
		return PageInfo{Phase: phIdle.String()}
	}
	info := PageInfo{State: p.state, Version: p.copyVer, Data: p.data, Phase: p.ph.String(), Pending: len(p.queue),
		Unit: p.unitCounted, UnitVersion: p.unitVer,
		Tenure: p.state == Modified || p.inRelease(), Frozen: p.frozen, Word: p.guess}
	if len(p.awaiting) > 0 { // the simulator asks after every step
		for m := range p.awaiting {
			info.Awaiting = append(info.Awaiting, m)
		}
		slices.Sort(info.Awaiting)
	}
	return info
}

// Copy returns the state and the bytes of the local copy of page no
// (nil when Invalid) without allocating.
func (n *Node) Copy(no ids.PageNo) (State, []byte) {
	p := n.pages[no]
	if p == nil {
		return Invalid, nil
	}
	return p.state, p.data
}

// Releases lists, in increasing order, the pages of [first, end) whose
// tenure this node may still hold without holding them Modified: a release
// under way (the answer to a recall, an eviction, a downgrade), the
// resolution of a release batch of unknown outcome, or a release that a
// move interrupted and the new home has not rebuilt yet. Data this node
// wrote and gave up is at the page's home and backups once the page is in
// none of these (or the node holds it Modified again, reclaimed).
//
// It looks at the active set only: a page in one of these is not settled,
// hence active.
func (n *Node) Releases(first, end ids.PageNo) []ids.PageNo {
	var out []ids.PageNo
	for _, p := range n.active {
		if p.no >= first && p.no < end && p.inRelease() {
			out = append(out, p.no)
		}
	}
	slices.Sort(out)
	return out
}

// Releasing reports whether page no is one of Releases.
func (n *Node) Releasing(no ids.PageNo) bool {
	p := n.pages[no]
	return p != nil && p.inRelease()
}

// Joining reports whether the node joined (Config.Joining) and still waits
// for every member's acknowledgement of its epoch: its requests queue and
// nothing is posted meanwhile.
func (n *Node) Joining() bool { return n.joining }

// Home is the home of page no in the node's current epoch (ids.None when
// the placement names none).
func (n *Node) Home(no ids.PageNo) ids.NodeID { return n.homeOf(no) }

// Members is the node's current member list, sorted.
func (n *Node) Members() []ids.NodeID { return slices.Clone(n.members) }

// Quiet reports whether the node has nothing in progress: no queued
// request, no batch in flight, no transition under way, no home repair.
//
// It looks at the active sets only: a page or duty outside them is
// settled, hence quiet.
func (n *Node) Quiet() bool {
	for _, p := range n.active {
		if p.ph != phIdle || p.inflight != 0 || len(p.queue) > 0 || p.granted || p.frozen {
			return false
		}
	}
	for _, h := range n.activeHomes {
		if n.homeIdx[h.no] != h {
			continue // dropped (demote)
		}
		if h.pending || h.inflight != 0 || h.granted != ids.None || len(h.queue) > 0 || h.rebuilding || h.passUnsure != ids.None || len(h.fills) > 0 || h.fillHeld {
			return false
		}
	}
	if len(n.owed) > 0 || n.target {
		return false // a move under way
	}
	if n.clearNeed > n.clearAsked {
		return false // probes for a clear (clear.go), sent again on ticks
	}
	return n.synced || !n.probing
}

// DumpPage describes page no at this node in one line, for logs: the
// client side as Dump writes it, with the word last seen, and, when this
// node is the page's home and has a duty for it, the home side (its
// operation, word, reservation queue, fills, rebuild).
func (n *Node) DumpPage(no ids.PageNo) string {
	var b strings.Builder
	if p := n.pages[no]; p != nil {
		n.dumpPage(&b, p)
		fmt.Fprintf(&b, " word=%v home=%v inflight=%d attempts=%d", p.guess, p.home, p.inflight, p.attempts)
	} else {
		fmt.Fprintf(&b, "%v %v: not known here", n.cfg.ID, no)
	}
	if h := n.homeIdx[no]; h != nil {
		fmt.Fprintf(&b, "; home duty: op=%v word=%v inflight=%d pending=%t rebuilding=%t queue=%v granted=%v fills=%d",
			h.op, h.guess, h.inflight, h.pending, h.rebuilding, h.queue, h.granted, len(h.fills))
	}
	fmt.Fprintf(&b, "; epoch %v, home %v", n.epoch, n.homeOf(no))
	return b.String()
}

// Dump is a one-line-per-page description of the node's state, stable for
// transcripts.
func (n *Node) Dump() string {
	var b strings.Builder
	ps := slices.Clone(n.order)
	sort.Slice(ps, func(i, j int) bool { return ps[i].no < ps[j].no })
	for _, p := range ps {
		n.dumpPage(&b, p)
		b.WriteString("\n")
	}
	return b.String()
}

// dumpPage writes Dump's line of page p, without the newline.
func (n *Node) dumpPage(b *strings.Builder, p *page) {
	fmt.Fprintf(b, "%v %v: %v v=%d %v", n.cfg.ID, p.no, p.state, p.copyVer, p.ph)
	if p.ph == phResolve {
		fmt.Fprintf(b, "(%v)", p.resolving)
	}
	if p.unitCounted {
		fmt.Fprintf(b, " unit@%d", p.unitVer)
	}
	if p.ph == phWaitAcks {
		fmt.Fprintf(b, " awaiting=%v", n.Page(p.no).Awaiting)
	}
	if p.recall {
		fmt.Fprintf(b, " recall(v=%d write=%t)", p.recallVer, p.recallWrite)
	}
	if p.frozen {
		b.WriteString(" frozen")
	}
	if p.frozenM {
		b.WriteString(" (M?)")
	}
	if p.granted {
		b.WriteString(" granted")
	}
	if p.downgrade {
		b.WriteString(" downgrade")
	}
	if len(p.queue) > 0 {
		fmt.Fprintf(b, " queued=%d", len(p.queue))
	}
	if p.state != Invalid && len(p.data) >= 8 {
		fmt.Fprintf(b, " data[0]=%d", p.load(0))
	}
}
