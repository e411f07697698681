package engine

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/node/localcache"
)

// ErrUnavailable fails a call on a page that waits for a node that is down
// (the directory says it failed, left or restarted as a new incarnation)
// or unreachable. It wraps localcache.ErrUnavailable. The error is an
// *UnavailableError that says which node and why.
var ErrUnavailable = fmt.Errorf("engine: page unavailable: %w", localcache.ErrUnavailable)

// DefaultUnavailableAfter is Config.UnavailableAfter's default.
const DefaultUnavailableAfter = 10 * time.Second

// UnavailableError is the error of a call that gave up on a page: the node
// the page waits for is down, or has been unreachable for
// Config.UnavailableAfter. Contention (other nodes taking turns on the
// page) is never unavailability.
type UnavailableError struct {
	Region ids.RegionID
	// Name is the region's name when the engine was given one.
	Name string
	Page ids.PageNo
	// Node is the node the page waits for (Proto, its protocol id: one
	// incarnation of Node); Role is what it is to the page:
	// "home" (it keeps the page's word and data), "holder" (it holds the
	// page's tenure, Modified), "reserver" (the page is reserved for it)
	// or "sharer" (its acknowledgement of an invalidation is awaited).
	Node  ids.NodeID
	Proto ids.NodeID
	Role  string
	// Why says what is wrong with Node, as a verb phrase: "failed in
	// epoch 41", "is unreachable: <the transport's error>".
	Why string
	// Epoch is the engine's (protocol) epoch; Waited how long the call
	// waited.
	Epoch  ids.Epoch
	Waited time.Duration
	// Lost: the page's home departed and the placement found no copy to
	// move it to; it will not come back (the error also matches
	// localcache.ErrLost).
	Lost bool
}

func (e *UnavailableError) Error() string {
	r := e.Region.String()
	if e.Name != "" {
		r = fmt.Sprintf("%s (%v)", e.Name, e.Region)
	}
	s := fmt.Sprintf("page %v of region %s unavailable", e.Page, r)
	if e.Waited > 0 {
		s += fmt.Sprintf(" for %v", e.Waited.Round(100*time.Millisecond))
	}
	return s + fmt.Sprintf(": its %s %v %s", e.Role, e.Node, e.Why)
}

// Unwrap makes the error match ErrUnavailable.
func (e *UnavailableError) Unwrap() []error {
	if e.Lost {
		return []error{ErrUnavailable, localcache.ErrLost}
	}
	return []error{ErrUnavailable}
}

// SetDown tells the engine that node id (a protocol id) is down (why, a verb phrase for
// errors: "failed in epoch 41"): calls on the pages it is home of
// fail at once with an *UnavailableError, batches to it are held back
// instead of retried, and a call that waits for it as the page's holder,
// reserver or sharer fails after Config.UnavailableAfter. It may be called
// before Start and again with a new reason.
func (e *Engine) SetDown(id ids.NodeID, why string) {
	e.availMu.Lock()
	defer e.availMu.Unlock()
	e.down[id] = why
	delete(e.awaited, id)
	e.kick()
}

// SetDownAwaited is SetDown for a departed node whose pages are expected
// back: the shards of a durable region it was still home of, which a node
// whose page store holds them loads again and becomes their home
// (docs/durability.md §4). A call on such a page waits, as for a move, and
// fails after Config.UnavailableAfter with an *UnavailableError that is not
// Lost; its batches are held back meanwhile.
func (e *Engine) SetDownAwaited(id ids.NodeID, why string) {
	e.availMu.Lock()
	defer e.availMu.Unlock()
	e.down[id] = why
	e.awaited[id] = true
	e.kick()
}

// SetUp undoes SetDown: the batches held back for id are posted.
func (e *Engine) SetUp(id ids.NodeID) {
	e.availMu.Lock()
	defer e.availMu.Unlock()
	if _, ok := e.down[id]; !ok {
		return
	}
	delete(e.down, id)
	delete(e.awaited, id)
	e.kick()
}

// Suspend stops this engine from posting verbs, to any node, its own
// slots included, until Resume: its node's lease is over (docs/failover.md
// §9, "Revoking local access"), and a majority may soon move its homes and
// tenures, after which a write of this incarnation must land nowhere. The
// batches the state machine makes meanwhile are held back, never posted,
// and posted at Resume (or failed as never posted when their home is set
// down or the configuration changes, as for a down home). A batch posted
// before Suspend goes on. The tcp transport refuses a fenced
// incarnation's verbs at the target as well; on a transport that cannot
// (ofi) Suspend keeps them from being posted, but a batch posted before
// it that the network holds past the departure still lands
// (docs/reliability.md, "Chaos on ofi"). Messages are still sent: a receiver judges them by epoch
// and membership, and answering invalidations lets the majority's writers
// go on. Calls wait as for a home that is unreachable.
func (e *Engine) Suspend() {
	e.availMu.Lock()
	defer e.availMu.Unlock()
	e.suspended = true
	e.kick()
}

// Resume undoes Suspend: the batches held back are posted.
func (e *Engine) Resume() {
	e.availMu.Lock()
	defer e.availMu.Unlock()
	if !e.suspended {
		return
	}
	e.suspended = false
	e.kick()
}

// Suspended says whether the engine holds its batches back (Suspend).
func (e *Engine) Suspended() bool {
	e.availMu.Lock()
	defer e.availMu.Unlock()
	return e.suspended
}

// Down returns the nodes set down and why.
func (e *Engine) Down() map[ids.NodeID]string {
	e.availMu.Lock()
	defer e.availMu.Unlock()
	out := make(map[ids.NodeID]string, len(e.down))
	for id, why := range e.down {
		out[id] = why
	}
	return out
}

// kick wakes the loop to apply a change of e.down (availMu held).
func (e *Engine) kick() {
	select {
	case e.availCh <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// downWhy says why id is down, or "".
func (e *Engine) downWhy(id ids.NodeID) string {
	e.availMu.Lock()
	defer e.availMu.Unlock()
	return e.down[id]
}

// postHold is downWhy, and whether the engine is suspended: what holds a
// batch for id back (one look under availMu on the way to every post).
func (e *Engine) postHold(id ids.NodeID) (why string, suspended bool) {
	e.availMu.Lock()
	defer e.availMu.Unlock()
	return e.down[id], e.suspended
}

// downAwaited is downWhy, and whether id's pages are awaited
// (SetDownAwaited).
func (e *Engine) downAwaited(id ids.NodeID) (string, bool) {
	e.availMu.Lock()
	defer e.availMu.Unlock()
	return e.down[id], e.awaited[id]
}

// unavailableErr is the error of a call on page p that waited waited for
// the node of protocol id proto, which is role to the page: why.
func (e *Engine) unavailableErr(p ids.PageNo, proto ids.NodeID, role, why string, waited time.Duration) *UnavailableError {
	node, ok := e.cfg.NodeOf(proto)
	if !ok {
		node = proto
	}
	return &UnavailableError{Region: e.cfg.Region, Name: e.cfg.Name, Page: p, Node: node, Proto: proto, Role: role, Why: why,
		Epoch: e.sm.Epoch(), Waited: waited}
}

// unavailable returns the error of a call on page p that has waited
// waited, or nil while the page may still be served. atStart: the call is
// being submitted (only a down home fails it then).
func (e *Engine) unavailable(p ids.PageNo, waited time.Duration, atStart bool) *UnavailableError {
	ue := func(proto ids.NodeID, role, why string) *UnavailableError {
		return e.unavailableErr(p, proto, role, why, waited)
	}
	home := e.homeOf(p)
	if why, awaited := e.downAwaited(home); awaited {
		if atStart || e.cfg.UnavailableAfter < 0 || waited < e.cfg.UnavailableAfter {
			return nil
		}
		return ue(home, "home", why)
	} else if why != "" {
		err := ue(home, "home", why)
		// A home that is no member departed, and the placement keeps a
		// page there only when no copy was left to move it to.
		err.Lost = !slices.Contains(e.sm.Members(), home)
		return err
	}
	if atStart || e.cfg.UnavailableAfter < 0 || waited < e.cfg.UnavailableAfter {
		return nil
	}
	if u, ok := e.unreach[home]; ok && e.now().Sub(u.since) >= e.cfg.UnavailableAfter {
		return ue(home, "home", "is unreachable: "+u.err.Error())
	}
	if f, ok := e.unanswered(p); ok {
		role := "home"
		if f.to != home {
			role = "backup"
		}
		return ue(f.to, role, fmt.Sprintf("has not answered a batch of verbs posted %v ago (its connection stalls)", e.now().Sub(f.since).Round(100*time.Millisecond)))
	}
	info := e.sm.Page(p)
	w := info.Word
	for _, c := range []struct {
		id   ids.NodeID
		role string
	}{{w.Holder(), "holder"}, {w.Reserved(), "reserver"}} {
		if c.id == ids.None || c.id == e.cfg.ID {
			continue
		}
		if why := e.downWhy(c.id); why != "" {
			return ue(c.id, c.role, why)
		}
	}
	for _, id := range info.Awaiting {
		if why := e.downWhy(id); why != "" {
			return ue(id, "sharer", why)
		}
	}
	if e.sm.Joining() {
		// This node acts once every member acknowledged its epoch: a
		// member that is down holds it back.
		for _, id := range e.sm.Members() {
			if why := e.downWhy(id); why != "" && id != e.cfg.ID {
				return ue(id, "member", why+", and this node, new to the region's protocol, waits for every member's acknowledgement before it acts")
			}
		}
	}
	return nil
}

// unreachable is a home whose batches fail: since the first failure of the
// current run of failures, and the last error.
type unreachable struct {
	since time.Time
	err   error
}

// flight is a batch posted and not answered yet: for page, to node to,
// since.
type flight struct {
	page  ids.PageNo
	to    ids.NodeID
	since time.Time
}

// unansweredFloor is the least time a batch must be in flight to count as
// unanswered, whatever UnavailableAfter: a slow machine may keep a batch a
// while (tests set UnavailableAfter to a millisecond to show that
// contention never counts), and that is not unavailability.
const unansweredFloor = time.Second

// unanswered returns the oldest batch for page p that has been in flight,
// with no answer and no error, for UnavailableAfter (and unansweredFloor)
// or longer. A verbs connection can stall with no error for far longer
// than that (TCP backs off its retransmissions after a loss up to minutes
// apart, and a Post waits for its answer for as long): the page's state
// machine posts nothing more for it meanwhile, so every call on the page
// would wait, with its home alive and never found unreachable. The chaos
// schedule of seed 660007 had calls wait 21 s so on a node that held its
// lease (docs/failover.md §10).
func (e *Engine) unanswered(p ids.PageNo) (flight, bool) {
	bound := max(e.cfg.UnavailableAfter, unansweredFloor)
	now := e.now()
	var oldest flight
	found := false
	for _, f := range e.flying {
		if f.page == p && now.Sub(f.since) >= bound && (!found || f.since.Before(oldest.since)) {
			oldest, found = f, true
		}
	}
	return oldest, found
}

// noteOutcome records whether a batch to home reached it.
func (e *Engine) noteOutcome(home ids.NodeID, err error) {
	if err == nil {
		delete(e.unreach, home)
		return
	}
	if u, ok := e.unreach[home]; ok {
		u.err = err
		e.unreach[home] = u
		return
	}
	e.unreach[home] = unreachable{since: e.now(), err: err}
}

// sweepInterval paces the loop's checks of waiting calls.
const sweepInterval = 100 * time.Millisecond

// sweep fails the waiting calls whose pages are unavailable, and posts the
// batches held back for homes that are up again. It runs on the loop.
func (e *Engine) sweep(now time.Time) {
	for id, bs := range e.parked {
		if why, suspended := e.postHold(id); why != "" || suspended {
			continue
		}
		delete(e.parked, id)
		for _, b := range bs {
			e.post(b)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(e.waiters)) {
		w := e.waiters[id]
		waited := now.Sub(w.start)
		if err := e.unavailable(w.page, waited, false); err != nil {
			e.failWaiter(id, w, err)
			continue
		}
		if err := e.stalled(w, now); err != nil {
			e.failWaiter(id, w, err)
			continue
		}
		if !w.reported && waited >= longWait {
			// Not unavailable, so contention or a peer that takes turns
			// slowly: neither fails the call. Say once what the page
			// looks like from here, for whoever finds the call stuck.
			w.reported = true
			e.log.Warn("a call has waited long for a page that is not unavailable (contention, or a peer that does not answer)",
				"region", e.cfg.Name, "page", w.page, "call", w.kind, "waited", waited.Round(time.Millisecond),
				"state", e.sm.DumpPage(w.page), "batches_in_flight", e.flyingFor(w.page))
		}
	}
	e.sweepReleaseWaits(now)
}

// minStallAfter is the least default Config.StallAfter.
const minStallAfter = 30 * time.Second

// stallKey is what a waiting call depends on, as this node sees it: the
// page's word's holder, reservation and version, and the members whose
// acknowledgements its tenure awaits.
type stallKey struct {
	holder, reserved ids.NodeID
	version          uint16
	awaiting         string
}

// stalled returns the error of call w when the member it waits for is not
// set down but has not moved the page for Config.StallAfter, or nil. It
// runs on the loop (sweep), which also notes what w waits on.
func (e *Engine) stalled(w *waiter, now time.Time) *UnavailableError {
	info := e.sm.Page(w.page)
	key := stallKey{holder: info.Word.Holder(), reserved: info.Word.Reserved(), version: info.Word.Version(), awaiting: fmt.Sprint(info.Awaiting)}
	if key != w.seen || w.seenSince.IsZero() {
		w.seen, w.seenSince = key, now
		return nil
	}
	still := now.Sub(w.seenSince)
	if e.cfg.StallAfter < 0 || still < e.cfg.StallAfter {
		return nil
	}
	d := still.Round(time.Second)
	for _, c := range []struct {
		id        ids.NodeID
		role, why string
	}{
		{info.Word.Holder(), "holder", fmt.Sprintf("has held the page's tenure for %v without releasing it to this node's recalls (it is alive to the directory, but its dsmd does not serve the page)", d)},
		{info.Word.Reserved(), "reserver", fmt.Sprintf("has held the page's reservation for %v without taking its turn (it is alive to the directory, but its dsmd does not serve the page)", d)},
	} {
		if c.id != ids.None && c.id != e.cfg.ID && c.id != coherence.HomeTurn && c.id != coherence.NotHome {
			return e.unavailableErr(w.page, c.id, c.role, c.why, now.Sub(w.start))
		}
	}
	if len(info.Awaiting) > 0 {
		return e.unavailableErr(w.page, info.Awaiting[0], "sharer", fmt.Sprintf("has not acknowledged an invalidation for %v (it is alive to the directory, but its dsmd does not answer)", d), now.Sub(w.start))
	}
	return nil
}

// longWait is how long a call waits before sweep logs it (a variable for
// the tests).
var longWait = 20 * time.Second

// flyingFor describes the batches of page p in flight: to whom, since when.
func (e *Engine) flyingFor(p ids.PageNo) string {
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(e.flying)) {
		if f := e.flying[id]; f.page == p {
			parts = append(parts, fmt.Sprintf("%d to %v for %v", id, f.to, e.now().Sub(f.since).Round(time.Millisecond)))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// failWaiter ends a waiting call with err. The request stays in the state
// machine, which completes it later into nothing (its waiter is gone).
func (e *Engine) failWaiter(id uint64, w *waiter, err error) {
	delete(e.waiters, id)
	if w.kind == evictOp {
		// complete will not see this call: undo its count now. The cache
		// dropped the page already; the state machine keeps the
		// write-back data (Engine.wb) until the release goes through.
		e.evicting[w.page]--
		if e.evicting[w.page] <= 0 {
			delete(e.evicting, w.page)
		}
	}
	w.ch <- result{err: err, taken: true}
}

// homeOf is the home of page p in the state machine's epoch (ids.None
// past the region's end).
func (e *Engine) homeOf(p ids.PageNo) ids.NodeID {
	if int64(p) >= int64(e.cfg.NumPages) {
		return ids.None
	}
	return e.sm.Home(p)
}

// errParked fails a batch for a node that is down, which was never posted:
// one held back when a new configuration came, or one for a node that is
// not the home of its page.
var errParked = errors.New("engine: batch for a node that is down, not posted")

// unpark fails every batch held back for a node that is down, after a new
// configuration: the state machine posts again what it still needs, to
// the node the configuration names (a page's new home, the backups that
// are left). Without it a write to a backup that departed, or that the
// directory declared failed, would wait forever.
func (e *Engine) unpark() {
	for id, bs := range e.parked {
		delete(e.parked, id)
		for _, b := range bs {
			d := coherence.VerbsDone{ID: b.ID, Err: fmt.Errorf("%w (%v)", errParked, id)}
			if err := e.sm.Step(d); err != nil {
				e.log.Debug("completion refused", "batch", b.ID, "err", err)
			}
		}
	}
}

// park holds back a batch to a home that is down, or reports false. A
// batch to a down node that is not its page's home in the state machine's
// epoch (a backup's, or one the state machine made before the page moved)
// fails at once instead, as never posted: the state machine decides again
// with its current backups and placement (a node that is down is dropped
// from the backups by the configuration that follows).
func (e *Engine) park(b coherence.Batch) bool {
	why, suspended := e.postHold(b.Home)
	if why == "" {
		if !suspended {
			return false
		}
		e.parked[b.Home] = append(e.parked[b.Home], b)
		return true
	}
	if len(b.Verbs) > 0 && e.homeOf(b.Verbs[0].Page) != b.Home {
		d := coherence.VerbsDone{ID: b.ID, Err: fmt.Errorf("%w (%v %s)", errParked, b.Home, why)}
		if err := e.sm.Step(d); err != nil {
			e.log.Debug("completion refused", "batch", b.ID, "err", err)
		}
		return true
	}
	e.parked[b.Home] = append(e.parked[b.Home], b)
	return true
}
