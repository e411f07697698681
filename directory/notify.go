package directory

import (
	"slices"
	"sync"

	"github.com/dsmkit/dsm/internal/ids"
)

// Change tells a subscriber that the directory moved from Prev to Cur.
// Changes coalesce: a slow subscriber sees one Change spanning everything it
// missed, never a stale one, and the applier never waits for it.
type Change struct {
	Prev *View // what this subscriber saw last (an empty view at first)
	Cur  *View
}

// EpochChanged reports whether membership or placement changed.
func (c Change) EpochChanged() bool { return c.Prev.Epoch != c.Cur.Epoch }

// Joined returns members alive in Cur but not in Prev.
func (c Change) Joined() []ids.NodeID { return minus(c.Cur.alive, c.Prev.alive) }

// Departed returns members alive in Prev but not in Cur: their shards moved
// to their backups.
func (c Change) Departed() []ids.NodeID { return minus(c.Prev.alive, c.Cur.alive) }

// Failed returns the members whose incarnation in Cur was declared failed
// since Prev (or is failed, and Prev did not hold it failed): a departure
// without a write-back, as a crash is.
func (c Change) Failed() []ids.NodeID {
	var out []ids.NodeID
	for _, m := range c.Cur.members {
		if m.State != StateFailed {
			continue
		}
		if p, ok := c.Prev.Member(m.ID); ok && p.State == StateFailed && p.Nonce == m.Nonce {
			continue
		}
		out = append(out, m.ID)
	}
	return out
}

// Restarted returns members alive in both Prev and Cur under different
// incarnations: the process was replaced (its memory with it), though the
// node id stayed alive. Neither Joined nor Departed lists them.
func (c Change) Restarted() []ids.NodeID {
	var out []ids.NodeID
	for _, id := range c.Cur.alive {
		if _, ok := slices.BinarySearch(c.Prev.alive, id); !ok {
			continue
		}
		a, _ := c.Prev.Member(id)
		b, _ := c.Cur.Member(id)
		if a.Incarnation != b.Incarnation {
			out = append(out, id)
		}
	}
	return out
}

func minus(a, b []ids.NodeID) []ids.NodeID {
	var out []ids.NodeID
	for _, x := range a {
		if _, ok := slices.BinarySearch(b, x); !ok {
			out = append(out, x)
		}
	}
	return out
}

// notifier fans views out to subscribers without ever blocking the
// publisher: each subscriber has a one-slot channel, and a pending Change is
// replaced by a wider one.
type notifier struct {
	mu     sync.Mutex
	subs   map[*subscriber]struct{}
	closed bool
}

type subscriber struct {
	ch   chan Change
	last *View
}

func newNotifier() *notifier { return &notifier{subs: map[*subscriber]struct{}{}} }

func (n *notifier) subscribe(cur *View) (<-chan Change, func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := &subscriber{ch: make(chan Change, 1), last: &View{}}
	if n.closed {
		close(s.ch)
		return s.ch, func() {}
	}
	n.subs[s] = struct{}{}
	n.deliver(s, cur)
	cancel := func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if _, ok := n.subs[s]; ok {
			delete(n.subs, s)
			close(s.ch)
		}
	}
	return s.ch, cancel
}

// deliver sends v to s, merging with an undelivered Change. Only deliver
// sends on s.ch, always under n.mu, so after the non-blocking drain the send
// cannot block.
func (n *notifier) deliver(s *subscriber, v *View) {
	prev := s.last
	select {
	case old := <-s.ch:
		prev = old.Prev
	default:
	}
	s.ch <- Change{Prev: prev, Cur: v}
	s.last = v
}

func (n *notifier) publish(v *View) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for s := range n.subs {
		n.deliver(s, v)
	}
}

func (n *notifier) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	for s := range n.subs {
		close(s.ch)
		delete(n.subs, s)
	}
}
