package coherence

import (
	"fmt"

	"github.com/dsmkit/dsm/internal/ids"
)

// Word is the 64-bit coherence word of one page, kept in the home's
// registered memory immediately before the home copy of the page. The bit
// layout is described in doc.go; the constants below are its single
// definition.
type Word uint64

// Layout of the word, least significant bit first.
const (
	holderShift  = 0  // 10 bits: exclusive (M) holder, 0 = none
	resvShift    = 10 // 10 bits: reservation of a starving requester, 0 = none
	versionShift = 20 // 16 bits: tenure counter, +1 on every acquisition
	tagShift     = 36 // 4 bits: low bits of the configuration epoch
	exactShift   = 40 // 14 bits: one sharer bit per node 1..ExactSharers
	coarseShift  = 54 // 10 bits: count of sharers with ids above ExactSharers

	idBits      = 10
	idMask      = 1<<idBits - 1
	versionMask = 1<<16 - 1
	tagMask     = 1<<4 - 1
	exactMask   = 1<<ExactSharers - 1
	coarseMask  = 1<<10 - 1
)

const (
	// MaxNodeID is the largest node id the word can name. A cluster may
	// have up to MaxNodeID members; Config validation refuses larger ids.
	MaxNodeID = idMask - 1
	// NotHome, in the holder field, marks a slot that is not the page's
	// home slot: a backup copy, whose word is Stamp(v). No CAS of the
	// protocol expects it; the node layer turns a stamp into a home word
	// (InitialWord(e).WithVersion(v)) before a backup becomes home.
	NotHome ids.NodeID = idMask
	// HomeTurn is the reservation value that hands the turn back to the
	// home: the reserver is done, the home passes the reservation to the
	// next node in its queue (or clears it).
	HomeTurn ids.NodeID = idMask
	// ExactSharers is the number of nodes (ids 1..ExactSharers) that have
	// their own sharer bit. Nodes above are counted in the coarse counter
	// and invalidated by broadcast to every member above ExactSharers.
	ExactSharers = 14
)

// InitialWord is the word of a page that nobody caches, in epoch e. Homes
// initialise every word of the pages they serve to it.
func InitialWord(e ids.Epoch) Word { return Word(0).withTag(epochTag(e)) }

// Stamp is the word a release writes beside its data in a backup's slot:
// the page's data there is the data of tenure v (docs/failover.md §7).
func Stamp(v uint16) Word { return Word(0).withHolder(NotHome).withVersion(v) }

// StampOf is the stamp that stands for w, the word of a slot its node
// homes no more (docs/protocol.md, "Moves from live homes"): a word without
// a holder stands for the data of its version, one with a holder for the
// tenure before (the held tenure's data is not in the slot). A zero word
// (never written) and a stamp stay as they are.
func StampOf(w Word) Word {
	if w == 0 || w.Holder() == NotHome {
		return w
	}
	v := w.Version()
	if w.Holder() != ids.None {
		v--
	}
	return Stamp(v)
}

// WithVersion returns w with the version set to v. A home may start a
// page's word at any version (the simulator starts some near the wrap).
func (w Word) WithVersion(v uint16) Word { return w.withVersion(v) }

// Holder is the exclusive holder, or ids.None.
func (w Word) Holder() ids.NodeID { return ids.NodeID(w >> holderShift & idMask) }

// Reserved is the node that reserved the page against other writers.
func (w Word) Reserved() ids.NodeID { return ids.NodeID(w >> resvShift & idMask) }

// Version counts the exclusive tenures of the page (modulo 2^16).
func (w Word) Version() uint16 { return uint16(w >> versionShift & versionMask) }

// Tag is the epoch tag (the epoch modulo 16).
func (w Word) Tag() uint8 { return uint8(w >> tagShift & tagMask) }

// Exact is the bit vector of sharers 1..ExactSharers (bit i = node i+1).
func (w Word) Exact() uint16 { return uint16(w >> exactShift & exactMask) }

// Coarse is the number of sharer units of nodes above ExactSharers.
func (w Word) Coarse() uint16 { return uint16(w >> coarseShift & coarseMask) }

// HasSharers reports whether any sharer unit is recorded.
func (w Word) HasSharers() bool { return w.Exact() != 0 || w.Coarse() != 0 }

func (w Word) String() string {
	r := w.Reserved().String()
	if w.Reserved() == HomeTurn {
		r = "home"
	}
	return fmt.Sprintf("{M=%v R=%s v=%d t=%d S=%#x C=%d}", w.Holder(), r, w.Version(), w.Tag(), w.Exact(), w.Coarse())
}

func (w Word) withHolder(n ids.NodeID) Word {
	return w&^(idMask<<holderShift) | Word(uint64(n)&idMask)<<holderShift
}

func (w Word) withResv(n ids.NodeID) Word {
	return w&^(idMask<<resvShift) | Word(uint64(n)&idMask)<<resvShift
}

func (w Word) withVersion(v uint16) Word {
	return w&^(versionMask<<versionShift) | Word(v)<<versionShift
}

func (w Word) withTag(t uint8) Word {
	return w&^(tagMask<<tagShift) | Word(uint64(t)&tagMask)<<tagShift
}

func (w Word) withoutSharers() Word {
	return w &^ (exactMask<<exactShift | coarseMask<<coarseShift)
}

// unit is the amount a node adds to the word (with FAA or CAS) to record
// itself as a sharer, and subtracts to remove itself.
func unit(n ids.NodeID) uint64 {
	if n >= 1 && n <= ExactSharers {
		return 1 << (exactShift + uint(n) - 1)
	}
	return 1 << coarseShift
}

// isExact reports whether n has its own sharer bit.
func isExact(n ids.NodeID) bool { return n >= 1 && n <= ExactSharers }

// hasExactBit reports whether exact node n's bit is set.
func (w Word) hasExactBit(n ids.NodeID) bool {
	return isExact(n) && w.Exact()&(1<<(n-1)) != 0
}

func epochTag(e ids.Epoch) uint8 { return uint8(e & tagMask) }

// newer reports whether version a comes after b in serial-number order
// (RFC 1982 style over 16 bits).
func newer(a, b uint16) bool { return int16(a-b) > 0 }
