// Package ids is the small shared vocabulary of the service: the identifiers
// of nodes, regions, pages and configuration epochs that every layer passes
// around. It has no behaviour beyond formatting and must stay tiny: anything
// with logic belongs to the package that owns the concept.
package ids

import "strconv"

// NodeID names one dsmd instance. It is stable across restarts of that node
// (it is configured, not generated per process). Zero means "no node".
type NodeID uint32

// None is the zero NodeID: no node.
const None NodeID = 0

func (n NodeID) String() string {
	if n == None {
		return "n-"
	}
	return "n" + strconv.FormatUint(uint64(n), 10)
}

// RegionID names one global region. Zero means "no region".
type RegionID uint32

func (r RegionID) String() string { return "r" + strconv.FormatUint(uint64(r), 10) }

// PageNo is the index of a page inside its region (byte offset / page size).
type PageNo uint64

func (p PageNo) String() string { return "p" + strconv.FormatUint(uint64(p), 10) }

// Epoch numbers a configuration of the cluster (membership and placement).
// It only grows; messages stamped with an older epoch than the receiver's are
// refused.
type Epoch uint64

func (e Epoch) String() string { return "e" + strconv.FormatUint(uint64(e), 10) }
