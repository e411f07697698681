package sim

import (
	"fmt"
	"slices"
	"strings"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma/mem"
)

// This file is the manual driver used by the interaction tests: every
// method is one deterministic step (or a deterministic sequence of them)
// chosen by the caller instead of the random scheduler.

// Filter selects pending deliveries. Zero fields match everything.
type Filter struct {
	From, To ids.NodeID
	Kind     mem.DeliveryKind
}

func (f Filter) match(d *mem.Delivery) bool {
	return (f.From == ids.None || d.From == f.From) && (f.To == ids.None || d.To == f.To) && (f.Kind == 0 || d.Kind == f.Kind)
}

// Action is what to do with the matching deliveries.
type Action uint8

const (
	// Deliver executes batches and hands messages to their receivers.
	Deliver Action = 1 + iota
	// Drop loses them (a batch fails and is retried by its node).
	Drop
	// Duplicate queues a second copy of each matching message.
	Duplicate
	// DeliverSplit delivers as Deliver, except that a batch stops in the
	// middle of its first READ of more than 8 bytes, after that READ's
	// last bytes (mem.Network.DeliverSplit): its rest waits in the
	// network as a delivery of its own, "(rest of #N)".
	DeliverSplit
)

// Deliveries applies act to at most limit (0: all) pending deliveries
// that match f, oldest first, and returns how many it touched.
func (s *Sim) Deliveries(f Filter, act Action, limit int) int {
	touched := 0
	for _, d := range s.net.Pending() {
		if !f.match(d) || (limit > 0 && touched >= limit) {
			continue
		}
		s.step++
		touched++
		switch act {
		case Deliver:
			s.deliverOne(d, false)
		case DeliverSplit:
			s.deliverSplit(d)
		case Drop:
			s.tracef("drop %v", d)
			_ = s.net.Drop(d)
		case Duplicate:
			if d.Kind == mem.MessageDelivery {
				s.tracef("duplicate %v", d)
				_ = s.net.Duplicate(d)
			}
		}
		s.check(false)
	}
	return touched
}

// Complete reports executed batches to their nodes (of node id only, when
// not None), oldest first, and returns how many.
func (s *Sim) Complete(id ids.NodeID) int {
	count := 0
	for i := 0; i < len(s.done); {
		if id != ids.None && s.done[i].node != id {
			i++
			continue
		}
		s.step++
		s.completeBatch(i)
		s.check(false)
		count++
	}
	return count
}

// CompleteUnknown reports the oldest batch of node id to it as of unknown
// outcome, and says which batch. executed=false: the oldest batch of id
// still in the network is lost (it never executes). executed=true: the
// oldest batch of id that executed and whose completion has not been
// reported loses its answer; when there is none, the oldest batch of id in
// the network executes first.
func (s *Sim) CompleteUnknown(id ids.NodeID, executed bool) (uint64, error) {
	s.step++
	defer s.check(false)
	if executed {
		for i, d := range s.done {
			if d.node == id && d.err == nil {
				s.stats.Unknown++
				s.stats.UnknownExecuted++
				s.tracef("%v: the answer of batch#%d is lost", id, d.batch.ID)
				s.done[i].err = errUnknown(d.batch.Home)
				s.completeBatch(i)
				return d.batch.ID, nil
			}
		}
	}
	d := s.oldestBatch(id)
	if d == nil {
		return 0, fmt.Errorf("sim: %v has no batch to complete", id)
	}
	k := 0
	if executed {
		k = len(d.Ops)
	}
	return s.completeUnknownOps(id, d, k)
}

// oldestBatch is node id's oldest batch in the network, or nil.
func (s *Sim) oldestBatch(id ids.NodeID) *mem.Delivery {
	for _, d := range s.net.Pending() {
		if d.Kind == mem.BatchDelivery && d.From == id {
			return d
		}
	}
	return nil
}

// completeUnknownOps executes the first k ops of d, a batch of node id,
// and reports it to id as of unknown outcome.
func (s *Sim) completeUnknownOps(id ids.NodeID, d *mem.Delivery, k int) (uint64, error) {
	s.unknownOutcome(d, k)
	i := len(s.done) - 1
	if i < 0 || s.done[i].node != id {
		return 0, fmt.Errorf("sim: the batch of %v left no completion", id)
	}
	b := s.done[i].batch.ID
	s.completeBatch(i)
	return b, nil
}

// CompleteUnknownPart executes the first k ops of node id's oldest batch
// in the network (0 < k < its length), drops the rest, and reports the
// batch to id as of unknown outcome (a connection that broke in the middle
// of it); it says which batch.
func (s *Sim) CompleteUnknownPart(id ids.NodeID, k int) (uint64, error) {
	s.step++
	defer s.check(false)
	d := s.oldestBatch(id)
	if d == nil {
		return 0, fmt.Errorf("sim: %v has no batch in the network", id)
	}
	if k <= 0 || k >= len(d.Ops) {
		return 0, fmt.Errorf("sim: %d of the %d ops of %v's oldest batch is no part of it", k, len(d.Ops), id)
	}
	return s.completeUnknownOps(id, d, k)
}

// Stabilize delivers, completes and ticks, oldest first, until nothing is
// in flight or maxSteps passed. It reports whether the cluster is quiet.
func (s *Sim) Stabilize(maxSteps int) bool {
	for i := 0; i < maxSteps && s.err == nil; i++ {
		if len(s.lagging) > 0 {
			s.step++
			s.reconfigureOne(0)
			s.check(false)
			continue
		}
		if p := s.net.Pending(); len(p) > 0 {
			s.step++
			s.deliverOne(p[0], false)
			s.check(false)
			continue
		}
		if len(s.done) > 0 {
			s.step++
			s.completeBatch(0)
			s.check(false)
			continue
		}
		if len(s.fillsDue) > 0 && s.Fill() {
			continue
		}
		if len(s.stampsDue) > 0 {
			s.step++
			ok := s.stampOne()
			s.check(false)
			if ok {
				continue
			}
		}
		if len(s.clearsDue)+len(s.clearAsk) > 0 {
			s.step++
			ok := s.clearOne()
			s.check(false)
			if ok {
				continue
			}
		}
		if !s.busy() {
			return true
		}
		s.Tick()
	}
	return !s.busy()
}

// Promote moves page p away from its live home to its complete backup to,
// in the next epoch (Options.Promotions): every node learns it at once, or
// only when Learn hands it over (async).
func (s *Sim) Promote(p ids.PageNo, to ids.NodeID, async bool) error {
	if !s.Opts.Fills {
		return fmt.Errorf("sim: promotions need fills")
	}
	if s.promotable(p) != to {
		return fmt.Errorf("sim: %v is not the first complete backup of %v", to, p)
	}
	s.step++
	s.promote[p] = to
	s.tracef("promote %v from live %v to %v", p, s.slots[p].home, to)
	s.reconfigure(async)
	s.check(false)
	return s.err
}

// Leave takes node id out as a graceful leave does once its hand-over is
// over: it must hold no page's tenure and home no page, and the departure
// reverts nothing (a crash reverts the pages it held to their home
// copies). The reconfiguration that removes it is the driver's next
// Reconfigure.
func (s *Sim) Leave(id ids.NodeID) error {
	s.step++
	return s.leave(id)
}

// Persist gives node id a Persist of page p (docs/durability.md §2), as one
// step.
func (s *Sim) Persist(id ids.NodeID, p ids.PageNo) error {
	if int(id) <= 0 || int(id) >= len(s.nodes) || !s.nodes[id].alive {
		return fmt.Errorf("sim: no live node %v", id)
	}
	s.step++
	n := s.nodes[id]
	s.tracef("%v persists %v", id, p)
	if err := n.sm.Step(coherence.Persist{Pages: []ids.PageNo{p}}); err != nil {
		return err
	}
	s.apply(n)
	s.check(false)
	return s.err
}

// Stamp makes the stamp that node id owes for the slot of page p it left
// behind (its node layer's CAS loop), once it has learnt the move.
func (s *Sim) Stamp(id ids.NodeID, p ids.PageNo) error {
	for i, d := range s.stampsDue {
		if d.page == p && d.node == id {
			if s.nodes[id].sm.Epoch() < d.epoch {
				return fmt.Errorf("sim: %v has not learnt the move of %v", id, p)
			}
			s.step++
			s.stampsDue = slices.Delete(s.stampsDue, i, i+1)
			s.stampSlot(p, id)
			s.check(false)
			return s.err
		}
	}
	return fmt.Errorf("sim: %v owes no stamp for %v", id, p)
}

// Pending lists the deliveries waiting in the network and the executed
// batches whose completion has not reached their node.
func (s *Sim) Pending() string {
	var b strings.Builder
	for _, d := range s.net.Pending() {
		fmt.Fprintf(&b, "net %v\n", s.describe(d))
	}
	for _, d := range s.done {
		fmt.Fprintf(&b, "completion %v batch#%d err=%v\n", d.node, d.batch.ID, d.err)
	}
	return b.String()
}

func (s *Sim) describe(d *mem.Delivery) string {
	if d.Kind == mem.MessageDelivery {
		if m, err := decode(d.Msg); err == nil {
			return m
		}
	}
	return d.String()
}

// TakeTrace returns the trace recorded since the last call.
func (s *Sim) TakeTrace() []string {
	t := s.trace
	s.trace = nil
	return t
}
