// Package fault wraps any verbs transport and injects failures into what it
// sends: operations that fail as if the link broke (before or after the
// target executed them), delays, lost, duplicated and reordered messages,
// and partitions from chosen peers. Faults fire by
// rule (peer, kind of traffic, kind of operation) with a probability drawn
// from a seeded generator, so a failing run can be replayed.
//
// The wrapper acts on the side that initiates: to cut a pair of nodes apart,
// partition each from the other. Inbound messages from a partitioned peer
// are dropped too.
package fault

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// ErrInjected marks a failure that the wrapper made up. Injected failures of
// operations also match rdma.ErrPeerUnreachable, which is what the caller
// would see if the link had really broken.
var ErrInjected = errors.New("fault: injected failure")

// Traffic selects what a rule applies to. The zero value is invalid.
type Traffic uint8

const (
	// Ops is one-sided operations (Post).
	Ops Traffic = 1 + iota
	// Messages is two-sided messages (Send).
	Messages
)

// Action is what a rule does when it fires. The zero value is invalid.
type Action uint8

const (
	// Drop fails a batch (none of its operations executes) or loses a
	// message (Send still reports success, as a lost packet would).
	Drop Action = 1 + iota
	// Delay holds the batch or message for Rule.Delay before sending it.
	Delay
	// Duplicate sends a message twice. Not valid for Ops: a queue pair
	// never executes a work request twice.
	Duplicate
	// Reorder holds a message back until the next message to the same
	// peer has been sent (or Rule.Delay passed, 10ms by default). Not
	// valid for Ops.
	Reorder
	// LoseResponse executes the batch at the target and then fails it
	// with rdma.ErrOutcomeUnknown (and rdma.ErrPeerUnreachable), as when
	// the link broke after the target executed the batch and the peer
	// could not be reached again to learn its outcome. Only for Ops.
	LoseResponse
	// LoseRequest fails the batch with rdma.ErrOutcomeUnknown (and
	// rdma.ErrPeerUnreachable) without executing it: the link broke with
	// the request in flight, and it never arrived. Only for Ops.
	LoseRequest
)

// Rule is one kind of fault.
type Rule struct {
	Traffic Traffic
	Action  Action
	// Peer restricts the rule to one peer; ids.None means every peer.
	Peer ids.NodeID
	// Kind restricts an Ops rule to batches that contain an operation of
	// that kind; zero means every batch.
	Kind rdma.OpKind
	// Prob is the probability that the rule fires for a matching batch or
	// message: 1 always, 0 never.
	Prob float64
	// Delay is the delay of a Delay rule and the longest hold of a Reorder
	// rule.
	Delay time.Duration
}

func (r Rule) validate() error {
	switch {
	case r.Traffic != Ops && r.Traffic != Messages:
		return fmt.Errorf("fault: rule with traffic %d", r.Traffic)
	case r.Action < Drop || r.Action > LoseRequest:
		return fmt.Errorf("fault: rule with action %d", r.Action)
	case r.Traffic == Ops && (r.Action == Duplicate || r.Action == Reorder):
		return errors.New("fault: operations cannot be duplicated or reordered")
	case r.Traffic == Messages && (r.Action == LoseResponse || r.Action == LoseRequest):
		return errors.New("fault: only operations have responses to lose")
	case r.Prob < 0 || r.Prob > 1:
		return fmt.Errorf("fault: probability %v outside [0, 1]", r.Prob)
	case r.Action == Delay && r.Delay <= 0:
		return errors.New("fault: Delay rule without a delay")
	}
	return nil
}

// Transport is a fault-injecting rdma.Transport.
type Transport struct {
	rdma.Transport

	mu          sync.Mutex
	rng         *rand.Rand
	rules       []Rule
	partitioned map[ids.NodeID]bool
	held        map[ids.NodeID]*heldMsg // Reorder: one message held per peer
	stats       Stats
	closed      bool
	timers      sync.WaitGroup
}

type heldMsg struct {
	msg   []byte
	timer *time.Timer
}

// Stats counts the faults injected so far.
type Stats struct {
	DroppedBatches, DelayedBatches                                  uint64
	DroppedMessages, DelayedMessages, DuplicatedMsgs, ReorderedMsgs uint64
	Partitioned                                                     uint64
	// Batches failed with rdma.ErrOutcomeUnknown after they executed
	// (LoseResponse) and without executing (LoseRequest).
	LostResponses, LostRequests uint64
}

// Wrap returns a wrapper of inner whose random choices come from seed.
func Wrap(inner rdma.Transport, seed uint64) *Transport {
	t := &Transport{
		Transport:   inner,
		rng:         rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		partitioned: map[ids.NodeID]bool{},
		held:        map[ids.NodeID]*heldMsg{},
	}
	return t
}

// SetRules replaces the rules. An invalid rule is refused and nothing
// changes.
func (t *Transport) SetRules(rules ...Rule) error {
	for _, r := range rules {
		if err := r.validate(); err != nil {
			return err
		}
	}
	t.mu.Lock()
	t.rules = append([]Rule(nil), rules...)
	t.mu.Unlock()
	return nil
}

// Partition cuts this node off from peer: batches to it fail, messages to
// and from it are lost, until Heal.
func (t *Transport) Partition(peer ids.NodeID) {
	t.mu.Lock()
	t.partitioned[peer] = true
	t.mu.Unlock()
}

// Heal ends a partition from peer.
func (t *Transport) Heal(peer ids.NodeID) {
	t.mu.Lock()
	delete(t.partitioned, peer)
	t.mu.Unlock()
}

// Stats returns the faults injected so far.
func (t *Transport) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}

func injected(peer ids.NodeID, what string) error {
	return &rdma.PeerError{Peer: peer, Err: fmt.Errorf("%w (%s): %w", ErrInjected, what, rdma.ErrPeerUnreachable)}
}

// injectedUnknown is an injected failure whose outcome the caller cannot
// know.
func injectedUnknown(peer ids.NodeID, what string) error {
	return &rdma.PeerError{Peer: peer, Err: fmt.Errorf("%w (%s): %w: %w", ErrInjected, what, rdma.ErrOutcomeUnknown, rdma.ErrPeerUnreachable)}
}

// decide returns the actions that fire for one batch or message.
func (t *Transport) decide(traffic Traffic, peer ids.NodeID, ops []rdma.Op) (partitioned bool, fired []Rule) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.partitioned[peer] {
		t.stats.Partitioned++
		return true, nil
	}
	for _, r := range t.rules {
		if r.Traffic != traffic || (r.Peer != ids.None && r.Peer != peer) {
			continue
		}
		if r.Kind != 0 && !hasKind(ops, r.Kind) {
			continue
		}
		if r.Prob < 1 && t.rng.Float64() >= r.Prob {
			continue
		}
		fired = append(fired, r)
	}
	return false, fired
}

func hasKind(ops []rdma.Op, k rdma.OpKind) bool {
	for i := range ops {
		if ops[i].Kind == k {
			return true
		}
	}
	return false
}

func sleep(ctx context.Context, d time.Duration) error {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Post implements rdma.Transport.
func (t *Transport) Post(ctx context.Context, peer ids.NodeID, ops []rdma.Op) error {
	partitioned, fired := t.decide(Ops, peer, ops)
	if partitioned {
		err := injected(peer, "partitioned")
		rdma.FailAll(ops, err)
		return err
	}
	loseResponse := false
	for _, r := range fired {
		switch r.Action {
		case Drop:
			t.count(func(s *Stats) { s.DroppedBatches++ })
			err := injected(peer, "dropped batch")
			rdma.FailAll(ops, err)
			return err
		case Delay:
			t.count(func(s *Stats) { s.DelayedBatches++ })
			if err := sleep(ctx, r.Delay); err != nil {
				return err
			}
		case LoseRequest:
			t.count(func(s *Stats) { s.LostRequests++ })
			err := injectedUnknown(peer, "request lost")
			rdma.FailAll(ops, err)
			return err
		case LoseResponse:
			loseResponse = true
		}
	}
	if !loseResponse {
		return t.Transport.Post(ctx, peer, ops)
	}
	if err := t.Transport.Post(ctx, peer, ops); err != nil {
		return err
	}
	t.count(func(s *Stats) { s.LostResponses++ })
	err := injectedUnknown(peer, "response lost")
	rdma.FailAll(ops, err)
	return err
}

func (t *Transport) count(f func(*Stats)) {
	t.mu.Lock()
	f(&t.stats)
	t.mu.Unlock()
}

// Send implements rdma.Transport.
func (t *Transport) Send(ctx context.Context, peer ids.NodeID, msg []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msg) > rdma.MaxMessage {
		return t.Transport.Send(ctx, peer, msg) // the inner transport reports it
	}
	partitioned, fired := t.decide(Messages, peer, nil)
	if partitioned {
		return nil // lost on the wire
	}
	copies := 1
	var hold time.Duration
	for _, r := range fired {
		switch r.Action {
		case Drop:
			t.count(func(s *Stats) { s.DroppedMessages++ })
			return nil
		case Delay:
			t.count(func(s *Stats) { s.DelayedMessages++ })
			if err := sleep(ctx, r.Delay); err != nil {
				return err
			}
		case Duplicate:
			t.count(func(s *Stats) { s.DuplicatedMsgs++ })
			copies = 2
		case Reorder:
			hold = r.Delay
			if hold <= 0 {
				hold = 10 * time.Millisecond
			}
		}
	}
	if hold > 0 && t.holdBack(peer, msg, hold) {
		return nil
	}
	for i := 0; i < copies; i++ {
		if err := t.Transport.Send(ctx, peer, msg); err != nil {
			return err
		}
	}
	return t.releaseHeld(ctx, peer)
}

// holdBack keeps msg until the next message to peer went out, unless a
// message is already held for peer.
func (t *Transport) holdBack(peer ids.NodeID, msg []byte, d time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.held[peer] != nil || t.closed {
		return false
	}
	t.stats.ReorderedMsgs++
	h := &heldMsg{msg: append([]byte(nil), msg...)}
	t.timers.Add(1)
	h.timer = time.AfterFunc(d, func() {
		defer t.timers.Done()
		t.mu.Lock()
		if t.held[peer] != h {
			t.mu.Unlock()
			return
		}
		delete(t.held, peer)
		t.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = t.Transport.Send(ctx, peer, h.msg)
	})
	t.held[peer] = h
	return true
}

// releaseHeld sends the message held back for peer, if any, after a later
// one went out.
func (t *Transport) releaseHeld(ctx context.Context, peer ids.NodeID) error {
	t.mu.Lock()
	h := t.held[peer]
	if h != nil {
		delete(t.held, peer)
		if h.timer.Stop() {
			t.timers.Done()
		} else {
			h = nil // the timer fired and sends it
		}
	}
	t.mu.Unlock()
	if h == nil {
		return nil
	}
	return t.Transport.Send(ctx, peer, h.msg)
}

// SetHandler implements rdma.Transport: messages from partitioned peers are
// dropped on arrival.
func (t *Transport) SetHandler(h rdma.Handler) {
	if h == nil {
		t.Transport.SetHandler(nil)
		return
	}
	t.Transport.SetHandler(func(from ids.NodeID, msg []byte) {
		t.mu.Lock()
		cut := t.partitioned[from]
		t.mu.Unlock()
		if !cut {
			h(from, msg)
		}
	})
}

// Close implements rdma.Transport. Held messages are lost.
func (t *Transport) Close() error {
	t.mu.Lock()
	t.closed = true
	for p, h := range t.held {
		if h.timer.Stop() {
			t.timers.Done()
		}
		delete(t.held, p)
	}
	t.mu.Unlock()
	t.timers.Wait()
	return t.Transport.Close()
}
