package directory

import (
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/ids"
)

// Leases (docs/failover.md §9). A node may grant local access to pages
// only while it holds a lease, and leases come from a majority of the Raft
// voters, not from the leader, so that an election does not take every
// node's lease away:
//
//   - every LeasePeriod each replica asks every voter for a grant. A voter
//     grants when the requester's incarnation is alive in its replica, it
//     has not fenced it, it is a voter itself, and it has been up for the
//     fence wait; it records the grant on its own clock;
//   - the requester read its clock when it sent, t_s. Once a majority of
//     the voters of its Raft configuration granted (each grant naming that
//     same configuration), its lease runs until t_s + L(1-ε) - R on its own
//     clock: L is Timing.LeaseLength, ε the drift bound (leaseDrift), R
//     Timing.LeaseRevoke, the time dsmd has to revoke local access once the
//     lease is over;
//   - before the leader commits an incarnation's departure (a failure
//     verdict, a leave, an operator's removal, a restart that replaces it),
//     it fences it at every voter: a voter stops granting it and answers
//     once its own clock shows L(1+ε) since its last grant to it. With a
//     majority of answers the leader commits.
//
// Any lease the node still believes in came from a majority that meets
// the fencing majority in at least one voter, which granted before it
// fenced and answered at least L(1+ε)/(1+ε) = L of real time after its
// grant; the node's lease lasted at most L(1-ε)/(1-ε) = L of real time
// after its send, which came before that grant. So the lease, revocation
// included, was over when the voter answered, and so before the commit.
//
// Clocks: every clock runs at a rate within 1±ε of real time, and
// intervals are measured on CLOCK_BOOTTIME (it keeps counting through a
// suspend, unlike Go's monotonic clock). No timestamp crosses the network.
//
// Configurations: a voter change is one server at a time, so the
// majorities of two consecutive configurations meet; the leader makes no
// change within the fence wait of the last one (reconcileRaft), so a live
// lease was granted under the current configuration or the one before it.

// leaseDrift is ε, the bound on every clock's rate error: far above a
// crystal's (10^-4) and NTP's slewing (5·10^-4).
const leaseDrift = 0.01

// leaseEpochLag is how far behind the voter's applied epoch a requester's
// may be and still be granted: a node that serves has seen every recent
// departure (the 4-bit tag alias of the coherence words, docs/protocol.md).
const leaseEpochLag = 8

// leaseClock reads CLOCK_BOOTTIME as a duration since boot.
func leaseClock() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic("directory: CLOCK_BOOTTIME: " + err.Error())
	}
	return time.Duration(ts.Nano())
}

// leaseParams are the lease's durations.
type leaseParams struct {
	Period, Length, Revoke time.Duration
}

// hold is how long after its send a majority's grants keep a lease:
// L(1-ε) - R.
func (p leaseParams) hold() time.Duration {
	return time.Duration(float64(p.Length)*(1-leaseDrift)) - p.Revoke
}

// fenceWait is how long after its last grant a voter waits before it
// answers a fence: L(1+ε).
func (p leaseParams) fenceWait() time.Duration {
	return time.Duration(float64(p.Length) * (1 + leaseDrift))
}

// expiry is how long the leader waits without granting an alive
// incarnation before it declares it failed: three lease lengths and one
// period. A member cut off from the voters suspends its local access
// after one lease (its own clock decides, whatever the leader does); the
// verdict only lets its pages fail over, and a shorter one would fail
// members that a loaded machine starved for a second or two (the leader
// itself may be the one starved).
func (p leaseParams) expiry() time.Duration { return 3*p.Length + p.Period }

// raftRetryCap is the longest wait of hashicorp/raft's leader between two
// attempts to replicate to a follower that failed (10 ms doubled ten
// times: its backoff with maxFailureScale 12), plus a margin.
const raftRetryCap = 11 * time.Second

// firstExpiry is expiry for an incarnation this voter never granted: a new
// incarnation asks for its first lease only once its own copy of the log
// shows it alive, and a dsmd restarted on a node that had been down gets
// the log's new entries only at the leader's next attempt to replicate to
// it, up to raftRetryCap after the restart, while gossip already holds it
// alive. With expiry alone such a restart was declared failed before it
// could ask, and started yet another incarnation.
func (p leaseParams) firstExpiry() time.Duration { return p.expiry() + raftRetryCap }

// grantRec is a voter's last grant to one node.
type grantRec struct {
	nonce uint64
	at    time.Duration
}

// grantTable is a voter's side of the lease: its grants and its fences,
// on its own clock. It is forgotten at a restart, which is why a voter
// grants nothing for the fence wait after it starts.
type grantTable struct {
	p       leaseParams
	started time.Duration

	mu     sync.Mutex
	last   map[ids.NodeID]grantRec
	fenced map[ids.NodeID]fenceRec
	// seen is when this voter first saw each incarnation alive (for the
	// leader's lease-expiry verdict: a member is judged only after it had
	// time to ask).
	seen map[ids.NodeID]seenRec
}

// seenRec is when a voter first saw an incarnation alive after its last
// failure verdict.
type seenRec struct {
	nonce    uint64
	admitted ids.Epoch
	at       time.Duration
}

func newGrantTable(p leaseParams, now time.Duration) *grantTable {
	return &grantTable{p: p, started: now, last: map[ids.NodeID]grantRec{}, fenced: map[ids.NodeID]fenceRec{}, seen: map[ids.NodeID]seenRec{}}
}

// fenceRec is a fence of one incarnation: its nonce and the voter's
// applied epoch when it fenced.
type fenceRec struct {
	nonce uint64
	epoch ids.Epoch
}

// leaseRefusal says why a voter did not grant.
type leaseRefusal string

const (
	refuseStarting leaseRefusal = "the voter started less than the fence wait ago"
	refuseFenced   leaseRefusal = "the incarnation is fenced"
)

// grant records a grant to (id, nonce) at now unless the voter is in its
// quiet period after a start or fenced that incarnation. The caller checks
// membership, suffrage and epochs. lastFailedAt is the epoch of the
// incarnation's last failure verdict: a fence followed by a verdict and a
// return to alive (a partition healed: the same incarnation put alive
// again) is lifted, since the departure the fence guarded has been
// committed and the member admitted again since.
func (g *grantTable) grant(now time.Duration, id ids.NodeID, nonce uint64, lastFailedAt ids.Epoch) leaseRefusal {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now-g.started < g.p.fenceWait() {
		return refuseStarting
	}
	if f, ok := g.fenced[id]; ok && f.nonce == nonce {
		if lastFailedAt <= f.epoch {
			return refuseFenced
		}
		delete(g.fenced, id)
	}
	g.last[id] = grantRec{nonce: nonce, at: now}
	return ""
}

// fence stops grants to (id, nonce) and returns the clock reading at
// which the voter may answer: the fence wait after its last grant to that
// incarnation, or the end of its quiet period, whichever is later (a
// voter that just started may have granted in its previous life). epoch is
// the voter's applied epoch: the departure the fence guards commits after
// it.
func (g *grantTable) fence(now time.Duration, id ids.NodeID, nonce uint64, epoch ids.Epoch) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.fenced[id] = fenceRec{nonce: nonce, epoch: epoch}
	until := g.started + g.p.fenceWait()
	if r, ok := g.last[id]; ok && r.nonce == nonce {
		until = max(until, r.at+g.p.fenceWait())
	}
	return max(until, now)
}

// expired reports whether the voter, up for at least the expiry itself,
// last granted the alive incarnation (id, nonce) longer than the expiry
// ago, counting from when it first saw that incarnation alive since its
// last failure verdict (admitted: the member's LastFailedAt); an
// incarnation it never granted has firstExpiry from then to ask.
func (g *grantTable) expired(now time.Duration, id ids.NodeID, nonce uint64, admitted ids.Epoch) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.seen[id]
	if !ok || s.nonce != nonce || s.admitted != admitted {
		g.seen[id] = seenRec{nonce: nonce, admitted: admitted, at: now}
		return false
	}
	from := max(s.at, g.started)
	if r, ok := g.last[id]; ok && r.nonce == nonce {
		return now-max(from, r.at) > g.p.expiry()
	}
	return now-from > g.p.firstExpiry()
}

// leaseHolder is a requester's side: the lease it holds, on its clock.
type leaseHolder struct {
	p  leaseParams
	mu sync.Mutex
	// until is the clock reading at which local access must start being
	// revoked (0: never held).
	until   time.Duration
	changed chan struct{}
	// departed, once set, says why this incarnation will never hold a
	// lease again (ErrDeclaredFailed or ErrDeparted).
	departed error
}

func newLeaseHolder(p leaseParams) *leaseHolder {
	return &leaseHolder{p: p, changed: make(chan struct{})}
}

// extend records that a majority granted a request sent at sentAt.
func (h *leaseHolder) extend(sentAt time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	u := sentAt + h.p.hold()
	if u <= h.until || h.departed != nil {
		return
	}
	h.until = u
	close(h.changed)
	h.changed = make(chan struct{})
}

// depart records that the incarnation departed (the first reason wins):
// no grant extends the lease any more.
func (h *leaseHolder) depart(why error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.departed != nil {
		return
	}
	h.departed = why
	close(h.changed)
	h.changed = make(chan struct{})
}

// get returns the lease's end, a channel closed at its next extension or
// at the departure, and the departure (nil while none is known).
func (h *leaseHolder) get() (time.Duration, <-chan struct{}, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.until, h.changed, h.departed
}
