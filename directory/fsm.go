package directory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
)

// applyResult is what the FSM returns for each command through
// raft.ApplyFuture.Response.
type applyResult struct {
	Index  uint64
	Epoch  ids.Epoch
	Region Region // cmdCreateRegion, cmdDeleteRegion
	// Created: cmdCreateRegion made the region (it did not exist).
	Created bool
	Err     error

	changed bool // the command changed the table (not only the index)
}

// fsm is the replicated state machine. Apply is called by raft on one
// goroutine; readers take the current immutable *View without locking the
// applier for long. Every change publishes to the notifier, which never
// blocks.
type fsm struct {
	mu      sync.Mutex
	view    *View
	applied chan struct{} // closed and replaced on every new view
	notify  *notifier
}

func newFSM(n *notifier) *fsm {
	return &fsm{view: &View{nextRegion: 1}, applied: make(chan struct{}), notify: n}
}

// current returns the view and a channel closed when a newer one exists.
func (f *fsm) current() (*View, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.view, f.applied
}

func (f *fsm) set(v *View, changed bool) {
	f.mu.Lock()
	f.view = v
	close(f.applied)
	f.applied = make(chan struct{})
	f.mu.Unlock()
	if changed {
		f.notify.publish(v)
	}
}

// Apply implements raft.FSM.
func (f *fsm) Apply(l *raft.Log) any {
	cur, _ := f.current()
	c, err := decodeCommand(l.Data)
	if err != nil {
		// A command that does not decode was proposed by a buggy or hostile
		// peer; it changes nothing on any replica.
		return applyResult{Index: l.Index, Epoch: cur.Epoch, Err: err}
	}
	next, res := applyCommand(cur, c)
	next.Index = l.Index
	res.Index = l.Index
	res.Epoch = next.Epoch
	f.set(next, res.changed)
	return res
}

// applyCommand computes the view after c. It is deterministic: the same
// view and command give the same result on every replica. Every command
// that moves the epoch appends the new epoch's member set to the history.
func applyCommand(v *View, c command) (*View, applyResult) {
	next, res := applyCommandTable(v, c)
	if next.Epoch != v.Epoch {
		next.recordEpoch()
	}
	return next, res
}

func applyCommandTable(v *View, c command) (*View, applyResult) {
	next := *v
	switch c.Type {
	case cmdCreateRegion:
		spec, err := c.Spec.Normalize()
		if err != nil {
			return &next, applyResult{Err: err}
		}
		if r, ok := v.Region(spec.Name); ok {
			if r.RegionSpec != spec {
				return &next, applyResult{Region: r, Err: fmt.Errorf("%w: %q is %v", ErrRegionExists, r.Name, r.ID)}
			}
			return &next, applyResult{Region: r}
		}
		if v.nextRegion == 0 {
			return &next, applyResult{Err: ErrTooManyRegions}
		}
		if total := v.TotalSize(); total+spec.Size > MaxTotalSize {
			return &next, applyResult{Err: fmt.Errorf("%w: %q needs %s, and the %d regions take %s of the %s every member maps",
				ErrNoSpace, spec.Name, sizeString(spec.Size), len(v.regions), sizeString(total), sizeString(MaxTotalSize))}
		}
		access, err := c.Access.Normalize()
		if err != nil {
			return &next, applyResult{Err: err}
		}
		r := Region{ID: v.nextRegion, RegionSpec: spec, CreatedAt: time.Unix(0, c.CreatedAt).UTC(), Homes: v.homesForNew(), Access: access,
			Epoch: v.Epoch}
		for _, h := range r.Homes {
			m, _ := v.Member(h)
			r.HomeIncarnations = append(r.HomeIncarnations, m.Incarnation)
		}
		next.nextRegion++ // wraps to 0 after the last id: exhausted
		rs := slices.Clone(v.regions)
		i, _ := slices.BinarySearchFunc(rs, r.Name, func(r Region, n string) int { return cmpStr(r.Name, n) })
		next.setRegions(slices.Insert(rs, i, r))
		return &next, applyResult{Region: r, Created: true, changed: true}
	case cmdDeleteRegion:
		i, ok := slices.BinarySearchFunc(v.regions, c.Name, func(r Region, n string) int { return cmpStr(r.Name, n) })
		if !ok {
			return &next, applyResult{}
		}
		r := v.regions[i]
		next.setRegions(slices.Delete(slices.Clone(v.regions), i, i+1))
		return &next, applyResult{Region: r, changed: true}
	case cmdSetRegionAccess:
		i, ok := slices.BinarySearchFunc(v.regions, c.Name, func(r Region, n string) int { return cmpStr(r.Name, n) })
		if !ok {
			return &next, applyResult{Err: fmt.Errorf("%w: %q", ErrNoRegion, c.Name)}
		}
		access, err := c.Access.Normalize()
		if err != nil {
			return &next, applyResult{Err: err}
		}
		r := v.regions[i]
		if r.Access.Equal(access) {
			return &next, applyResult{Region: r}
		}
		r.Access = access
		rs := slices.Clone(v.regions)
		rs[i] = r
		next.setRegions(rs)
		return &next, applyResult{Region: r, changed: true}
	case cmdPutMember:
		return putMember(v, c)
	case cmdSetDraining:
		old, ok := v.Member(c.ID)
		switch {
		case !ok:
			return &next, applyResult{Err: fmt.Errorf("%w: %v", ErrNoMember, c.ID)}
		case c.Nonce != old.Nonce:
			return &next, applyResult{Err: fmt.Errorf("%w: %v draining for nonce %#x, the table has %#x", ErrStaleIncarnation, c.ID, c.Nonce, old.Nonce)}
		case old.State != StateAlive:
			return &next, applyResult{Err: fmt.Errorf("%w: %v is %v, not alive", ErrInvalidMember, c.ID, old.State)}
		case old.Draining:
			return &next, applyResult{}
		}
		next.Epoch++
		old.Draining = true
		old.Epoch = next.Epoch
		if c.HandOver {
			old.DrainingAt = next.Epoch
			next.drains++
		}
		next.setMember(old)
		return &next, applyResult{changed: true}
	case cmdFilled:
		return applyFilled(v, c)
	case cmdPromote:
		return applyPromote(v, c)
	case cmdCheckpoint:
		return applyCheckpoint(v, c)
	case cmdSetMemberState:
		old, ok := v.Member(c.ID)
		if !ok || old.State == c.State {
			return &next, applyResult{}
		}
		if c.Nonce != 0 && old.Nonce != 0 && c.Nonce != old.Nonce {
			// Meant for another incarnation: an older one (the verdict came
			// late) or a newer one not yet recorded (its own record will
			// replace this one).
			return &next, applyResult{Err: fmt.Errorf("%w: %v state %v for nonce %#x, the table has %#x", ErrStaleIncarnation, c.ID, c.State, c.Nonce, old.Nonce)}
		}
		if old.DepartedAt() != 0 && c.State == StateAlive {
			// Departures are final for an incarnation; a failed one may
			// still be recorded left (removed).
			return &next, applyResult{Err: fmt.Errorf("%w: %v incarnation %d is %v; only a new process rejoins", ErrStaleIncarnation, c.ID, old.Incarnation, old.State)}
		}
		if old.State == StateLeft {
			return &next, applyResult{} // left stays left
		}
		next.Epoch++
		old.State = c.State
		old.Epoch = next.Epoch
		if c.State == StateFailed {
			old.noteFailure(next.Epoch)
		}
		next.setMember(old)
		return &next, applyResult{changed: true}
	}
	return &next, applyResult{Err: fmt.Errorf("%w: type %d", ErrBadCommand, c.Type)}
}

// applyFilled applies cmdFilled: a completeness record for the current
// incarnation of c.ID, if it is that of c.Nonce, alive, and not declared
// failed after c.Since (it may have missed releases since). It does not
// move the epoch: it changes no member set, and the data plane counts it
// only for departures after it (node/placement.go).
func applyFilled(v *View, c command) (*View, applyResult) {
	next := *v
	i, r, m, err := recordSubject(v, c, "filled")
	switch {
	case err != nil:
		return &next, applyResult{Err: err}
	case m.Failures > 0 && m.LastFailedAt > c.Since:
		return &next, applyResult{Err: fmt.Errorf("%w: %v was declared failed in epoch %v, after the fills began (%v)", ErrInvalidMember, c.ID, m.LastFailedAt, c.Since)}
	case c.Since > v.Epoch || c.Since < r.Epoch:
		return &next, applyResult{Err: fmt.Errorf("%w: fills began in epoch %v, outside [%v, %v]", ErrBadCommand, c.Since, r.Epoch, v.Epoch)}
	}
	if err := validShardRanges(c.Shards, r.Shards()); err != nil {
		return &next, applyResult{Err: err}
	}
	rec := FillRecord{Node: m.ID, Incarnation: m.Incarnation, Proto: m.Proto, Since: c.Since, At: v.Epoch,
		Shards: slices.Clone(c.Shards)}
	for _, f := range r.Filled {
		if f.Proto == rec.Proto && f.Since == rec.Since && f.At == rec.At && slices.Equal(f.Shards, rec.Shards) {
			return &next, applyResult{Region: r} // a retry
		}
	}
	r.Filled = append(slices.Clone(r.Filled), rec)
	rs := slices.Clone(v.regions)
	rs[i] = r
	next.setRegions(rs)
	return &next, applyResult{Region: r, changed: true}
}

// applyPromote applies cmdPromote: a promotion record for the current,
// alive, not draining incarnation of c.ID, if a fill record of that
// incarnation covers every shard it names, or it held the shard from the
// region's creation (createdHolding). It moves the epoch (and the
// count of promotions, which the data plane's protocol epoch counts): the
// shards the data plane hands to it move in a protocol epoch of their own.
// A retry of a committed promotion (same incarnation, same shards) changes
// nothing.
func applyPromote(v *View, c command) (*View, applyResult) {
	next := *v
	i, r, m, err := recordSubject(v, c, "promoted")
	switch {
	case err != nil:
		return &next, applyResult{Err: err}
	case m.Draining:
		return &next, applyResult{Err: fmt.Errorf("%w: %v is draining", ErrInvalidMember, c.ID)}
	}
	if err := validShardRanges(c.Shards, r.Shards()); err != nil {
		return &next, applyResult{Err: err}
	}
	for _, sr := range c.Shards {
		for s := sr.First; s < sr.End; s++ {
			if !slices.ContainsFunc(r.Filled, func(f FillRecord) bool {
				return f.Proto == m.Proto && f.Incarnation == m.Incarnation && f.Covers(s)
			}) && !r.createdHolding(m, s) {
				return &next, applyResult{Err: fmt.Errorf("%w: %v incarnation %d holds no complete copy of shard %d of %q", ErrInvalidMember, c.ID, m.Incarnation, s, r.Name)}
			}
		}
	}
	for j, p := range r.Promoted {
		if p.Proto == m.Proto && p.Incarnation == m.Incarnation && slices.Equal(p.Shards, c.Shards) &&
			!promotedOthers(r.Promoted[j+1:], m.Proto, c.Shards) {
			return &next, applyResult{Region: r} // a retry
		}
	}
	next.Epoch++
	next.promotions++
	r.Promoted = append(slices.Clone(r.Promoted), PromoteRecord{Node: m.ID, Incarnation: m.Incarnation, Proto: m.Proto,
		At: next.Epoch, Shards: slices.Clone(c.Shards)})
	rs := slices.Clone(v.regions)
	rs[i] = r
	next.setRegions(rs)
	return &next, applyResult{Region: r, changed: true}
}

// createdHolding reports whether incarnation m was one of the region's
// homes at its creation and among the first 1+Backups of shard s's
// rendezvous order then: it held the shard complete from the start, with
// no completeness record (a shard's backup promoted in a drain's
// hand-over, docs/failover.md §11). The data plane's walk decides whether
// it still is (a failure verdict or a demotion since ends it).
func (r Region) createdHolding(m Member, s uint64) bool {
	if inc, ok := r.HomeIncarnation(m.ID); !ok || inc != m.Incarnation {
		return false
	}
	k := r.Backups
	if k == 0 {
		k = DefaultBackups
	}
	rank := placement.Rank(placement.Shard{Region: r.ID, Index: s}, r.Homes, len(r.Homes))
	i := slices.Index(rank, m.ID)
	return i >= 0 && i <= k
}

// applyCheckpoint applies cmdCheckpoint: region c.Region's placement
// checkpoint (placement.Checkpoint, which must decode for the region's
// shards) replaces an older one, and the records a walk from it does not
// read are dropped: the fill records of the incarnations that had departed
// by its epoch (a member record's departure, or a quarantined id's LeftAt,
// the epochs the data plane counts), and the promotion records up to it.
// A checkpoint of an epoch before the region's creation, after the view's,
// or not after the region's current one is refused; the same one again is
// a retry. It does not move the epoch: the placement does not change.
func applyCheckpoint(v *View, c command) (*View, applyResult) {
	next := *v
	i, ok := v.byID[c.Region]
	if !ok {
		return &next, applyResult{Err: fmt.Errorf("%w: %v", ErrNoRegion, c.Region)}
	}
	r := v.regions[i]
	cp, err := placement.DecodeCheckpoint(c.Checkpoint, r.Shards())
	switch {
	case err != nil:
		return &next, applyResult{Err: fmt.Errorf("%w: region %q: %v", ErrBadCommand, r.Name, err)}
	case cp.At == r.CheckpointAt && bytes.Equal(c.Checkpoint, r.Checkpoint):
		return &next, applyResult{Region: r} // a retry
	case cp.At <= r.CheckpointAt:
		return &next, applyResult{Region: r, Err: fmt.Errorf("%w: region %q: a checkpoint of epoch %v, not after the one of %v", ErrStaleCheckpoint, r.Name, cp.At, r.CheckpointAt)}
	case cp.At < r.Epoch || cp.At > v.Epoch:
		return &next, applyResult{Err: fmt.Errorf("%w: region %q: a checkpoint of epoch %v, outside [%v, %v]", ErrBadCommand, r.Name, cp.At, r.Epoch, v.Epoch)}
	}
	departed := func(p ids.NodeID) bool {
		d := v.departedAt(p)
		return d != 0 && d <= cp.At
	}
	r.Filled = slices.DeleteFunc(slices.Clone(r.Filled), func(f FillRecord) bool { return departed(f.Proto) })
	r.Promoted = slices.DeleteFunc(slices.Clone(r.Promoted), func(p PromoteRecord) bool { return p.At <= cp.At })
	r.Checkpoint, r.CheckpointAt = slices.Clone(c.Checkpoint), cp.At
	rs := slices.Clone(v.regions)
	rs[i] = r
	next.setRegions(rs)
	return &next, applyResult{Region: r, changed: true}
}

// departedAt is the epoch in which protocol id p departed, as the data
// plane counts it (node/members.go): a member record's departure (left or
// declared failed), or a quarantined id's LeftAt; 0 for a member alive or
// an unknown id.
func (v *View) departedAt(p ids.NodeID) ids.Epoch {
	for _, m := range v.members {
		if m.Proto == p {
			return m.DepartedAt()
		}
	}
	for _, q := range v.quarantine {
		if q.Proto == p {
			return max(q.LeftAt, 1)
		}
	}
	return 0
}

// promotedOthers reports whether one of recs promotes another member than
// proto to a shard of shards: a promotion of proto to the same shards
// after it is a new one (proto lost them and won them back), not a retry.
func promotedOthers(recs []PromoteRecord, proto ids.NodeID, shards []ShardRange) bool {
	for _, p := range recs {
		if p.Proto == proto {
			continue
		}
		for _, sr := range shards {
			for s := sr.First; s < sr.End; s++ {
				if p.Covers(s) {
					return true
				}
			}
		}
	}
	return false
}

// recordSubject finds what a record command (cmdFilled, cmdPromote) is
// about: region c.Region (its index and record) and the current
// incarnation of c.ID, which must be that of c.Nonce, alive and with a
// protocol id. did names the command in the error of another nonce.
func recordSubject(v *View, c command, did string) (int, Region, Member, error) {
	i, ok := v.byID[c.Region]
	if !ok {
		return 0, Region{}, Member{}, fmt.Errorf("%w: %v", ErrNoRegion, c.Region)
	}
	m, ok := v.Member(c.ID)
	switch {
	case !ok:
		return 0, Region{}, Member{}, fmt.Errorf("%w: %v", ErrNoMember, c.ID)
	case m.Nonce != c.Nonce:
		return 0, Region{}, Member{}, fmt.Errorf("%w: %v %s as nonce %#x, the table has %#x", ErrStaleIncarnation, c.ID, did, c.Nonce, m.Nonce)
	case m.State != StateAlive || m.Proto == ids.None:
		return 0, Region{}, Member{}, fmt.Errorf("%w: %v is %v", ErrInvalidMember, c.ID, m.State)
	}
	return i, v.regions[i], m, nil
}

// noteFailure records a failure verdict on m in epoch e.
func (m *Member) noteFailure(e ids.Epoch) {
	if m.FailedAt == 0 {
		m.FailedAt = e
	}
	m.LastFailedAt = e
	m.Failures++
}

// putMember applies cmdPutMember. The command's nonce decides whose record
// it is:
//
//   - no record yet: incarnation 1, the lowest free protocol id (for a
//     command without nonce, legacyProto);
//   - no nonce (0): a command of a version before incarnations, replayed
//     from an old log; it updates whichever incarnation holds the id, as it
//     did then, and leaves the nonce alone (this version never proposes
//     one: its gossip metadata and Config always have a nonce);
//   - the table's nonce (or the table's is 0, unknown since a version 1
//     snapshot or log, and this one is adopted, with a protocol id if the
//     record had none): an update of the same incarnation, in a new epoch
//     if the state, addresses, nonce or descriptors change;
//   - one of the node's past nonces: stale, refused;
//   - any other: a new process, so a new incarnation: Incarnation+1, a fresh
//     protocol id, the old id quarantined, the new addresses and
//     descriptors (never the old ones), state alive, one new epoch.
func putMember(v *View, c command) (*View, applyResult) {
	next := *v
	m := c.Member.clone()
	m.Incarnation, m.Proto, m.PastNonces, m.FailedAt, m.LastFailedAt, m.Failures, m.Draining = 0, 0, nil, 0, 0, 0, false
	m.DrainingAt = 0
	m.JoinedAt = 0
	old, ok := v.Member(m.ID)
	switch {
	case !ok && m.Nonce == 0:
		m.Incarnation = 1
		m.Proto = v.legacyProto(m.ID)
	case !ok:
		m.Incarnation = 1
		m.Proto = v.freeProto(ids.None)
		if m.Proto == ids.None {
			return &next, applyResult{Err: fmt.Errorf("%w: no id for the first incarnation of %v", ErrNoProtoIDs, m.ID)}
		}
	case old.State == StateLeft && m.Nonce != 0 && old.Nonce == m.Nonce:
		// A departed incarnation never comes back (its protocol id may not
		// name a member again): only a new process rejoins.
		return &next, applyResult{Err: fmt.Errorf("%w: %v incarnation %d left the cluster; only a new process rejoins", ErrStaleIncarnation, m.ID, old.Incarnation)}
	case old.State == StateFailed && m.Nonce != 0 && old.Nonce == m.Nonce:
		// A failure verdict is a departure from the data plane: the
		// incarnation's homes moved and the words naming it were repaired.
		// A process declared failed while alive (cut off, stopped) comes
		// back only as a new incarnation.
		return &next, applyResult{Err: fmt.Errorf("%w: %v incarnation %d was declared failed in epoch %v; only a new process rejoins",
			ErrDeclaredFailed, m.ID, old.Incarnation, old.DepartedAt())}
	case m.Nonce == 0 || old.Nonce == m.Nonce || old.Nonce == 0:
		if m.Nonce == 0 {
			m.Nonce = old.Nonce
		}
		m.Incarnation, m.Proto, m.PastNonces = old.Incarnation, old.Proto, old.PastNonces
		m.FailedAt, m.LastFailedAt, m.Failures = old.FailedAt, old.LastFailedAt, old.Failures
		m.JoinedAt = old.JoinedAt
		m.Draining = old.Draining && m.State == StateAlive
		m.DrainingAt = old.DrainingAt
		if m.Proto == ids.None && m.Nonce != 0 {
			m.Proto = v.freeProto(ids.None)
			if m.Proto == ids.None {
				return &next, applyResult{Err: fmt.Errorf("%w: no id for %v", ErrNoProtoIDs, m.ID)}
			}
		}
		if c.KeepDescriptors {
			m.Descriptors = old.Descriptors
		}
		if old.Nonce == m.Nonce && old.State == m.State && old.sameAddrs(m) && string(old.Descriptors) == string(m.Descriptors) {
			return &next, applyResult{}
		}
	case slices.Contains(old.PastNonces, m.Nonce):
		return &next, applyResult{Err: fmt.Errorf("%w: %v nonce %#x is of an incarnation before %d", ErrStaleIncarnation, m.ID, m.Nonce, old.Incarnation)}
	default:
		// A restart. The old incarnation departs and the new one joins in
		// this one epoch.
		// The old incarnation departs now, or departed when it left or
		// was declared failed.
		leftAt := v.Epoch + 1
		if d := old.DepartedAt(); d != 0 {
			leftAt = d
		}
		next.quarantine = append(slices.Clone(v.quarantine), Quarantined{
			Proto: old.Proto, LeftAt: leftAt, Node: old.ID, Incarnation: old.Incarnation,
			FailedAt: old.FailedAt, LastFailedAt: old.LastFailedAt, Failures: old.Failures, JoinedAt: old.JoinedAt,
			DrainingAt: old.DrainingAt})
		m.Proto = next.freeProto(old.Proto)
		if m.Proto == ids.None {
			// Nobody can take the node's place: the old incarnation still
			// departs (its process is gone), and the new one is not
			// admitted. Its id stays in its record, not in the quarantine.
			next.quarantine = v.quarantine
			if old.State != StateAlive {
				return &next, applyResult{Err: fmt.Errorf("%w: %v cannot start incarnation %d", ErrNoProtoIDs, m.ID, old.Incarnation+1)}
			}
			next.Epoch++
			old.State = StateFailed
			old.Epoch = next.Epoch
			old.noteFailure(next.Epoch)
			next.setMember(old)
			return &next, applyResult{changed: true, Err: fmt.Errorf("%w: %v cannot start incarnation %d; incarnation %d marked failed", ErrNoProtoIDs, m.ID, old.Incarnation+1, old.Incarnation)}
		}
		m.Incarnation = old.Incarnation + 1
		m.PastNonces = append(slices.Clone(old.PastNonces), old.Nonce)
		if len(m.PastNonces) > maxPastNonces {
			m.PastNonces = m.PastNonces[len(m.PastNonces)-maxPastNonces:]
		}
	}
	next.Epoch++
	m.Epoch = next.Epoch
	if m.Incarnation != old.Incarnation || !ok {
		m.JoinedAt = next.Epoch
	}
	next.setMember(m)
	return &next, applyResult{changed: true}
}

// freeProto returns the protocol id for a new incarnation: prefer if it is
// free, else the lowest free one; ids.None if none is free. An id is free
// when no member holds it and it is not quarantined.
func (v *View) freeProto(prefer ids.NodeID) ids.NodeID {
	var used [MaxProtoID + 1]bool
	for _, m := range v.members {
		if m.Proto <= MaxProtoID {
			used[m.Proto] = true
		}
	}
	for _, q := range v.quarantine {
		if q.Proto <= MaxProtoID {
			used[q.Proto] = true
		}
	}
	if prefer != ids.None && prefer <= MaxProtoID && !used[prefer] {
		return prefer
	}
	for p := ids.NodeID(1); p <= MaxProtoID; p++ {
		if !used[p] {
			return p
		}
	}
	return ids.None
}

// legacyProto is the protocol id of a record made before incarnations,
// from a version 1 snapshot or a command of that version replayed from an
// old log: its node id, or none (0) above MaxProtoID until the record's
// first nonce. Both paths must give the same answer, whatever the log
// index of the snapshot a replica restored: so it depends on the node id
// alone (in that era every protocol id is its member's node id, and a node
// id is free).
func (v *View) legacyProto(id ids.NodeID) ids.NodeID {
	if id > MaxProtoID {
		return ids.None
	}
	if _, taken := v.ByProto(id); taken || slices.ContainsFunc(v.quarantine, func(q Quarantined) bool { return q.Proto == id }) {
		return ids.None // not the legacy era; the first nonce gives an id
	}
	return id
}

// recordEpoch appends the member set of v's epoch to the history, keeping
// the last historyLen epochs.
func (v *View) recordEpoch() {
	rec := EpochRecord{Epoch: v.Epoch}
	for _, m := range v.members {
		if m.State == StateAlive {
			rec.Members = append(rec.Members, ProtoMember{Node: m.ID, Incarnation: m.Incarnation, Proto: m.Proto, State: m.State})
		}
	}
	h := v.history
	if len(h) >= historyLen {
		h = h[len(h)-historyLen+1:]
	}
	v.history = append(slices.Clone(h), rec)
}

// setMember replaces or inserts m in a copy of the member table and
// recomputes the alive list.
func (v *View) setMember(m Member) {
	ms := slices.Clone(v.members)
	i, ok := slices.BinarySearchFunc(ms, m.ID, func(x Member, id ids.NodeID) int { return cmpID(x.ID, id) })
	if ok {
		ms[i] = m
	} else {
		ms = slices.Insert(ms, i, m)
	}
	v.members = ms
	v.alive = aliveOf(ms)
}

// homesForNew are the homes of a region created in v: the alive members
// not marked draining (they are handing their shards over and leaving),
// or every alive member when all of them are.
func (v *View) homesForNew() []ids.NodeID {
	var out []ids.NodeID
	for _, id := range v.alive {
		if m, _ := v.Member(id); m.DrainingAt == 0 {
			out = append(out, id)
		}
	}
	if len(out) == 0 {
		return slices.Clone(v.alive)
	}
	return out
}

func aliveOf(ms []Member) []ids.NodeID {
	var out []ids.NodeID
	for _, m := range ms {
		if m.State == StateAlive {
			out = append(out, m.ID)
		}
	}
	return out
}

// snapshotState is the serialized form of a View.
type snapshotState struct {
	Version    int           `json:"version"`
	Epoch      ids.Epoch     `json:"epoch"`
	Index      uint64        `json:"index"`
	NextRegion ids.RegionID  `json:"next_region"`
	Members    []Member      `json:"members"`
	Regions    []Region      `json:"regions"`
	Quarantine []Quarantined `json:"quarantine,omitempty"` // version 2
	History    []EpochRecord `json:"history,omitempty"`    // version 2
	Promotions uint64        `json:"promotions,omitempty"` // version 2, written once promotions exist
	Drains     uint64        `json:"drains,omitempty"`     // version 4
}

// snapshotVersion 2 added incarnations: Member.Incarnation, Nonce, Proto
// and PastNonces, Region.HomeIncarnations, the quarantine and the epoch
// history. Version 1 still decodes (upgradeV1).
const snapshotVersion = 2

// snapshotVersionCheckpoints is the version of a snapshot in which a
// region has a placement checkpoint (Region.Checkpoint): the records it
// dropped are gone from it, so a dsmd of a version before checkpoints,
// which would walk the placement from the regions' creation without them,
// must refuse it rather than read it as version 2. Without checkpoints a
// snapshot stays version 2.
const snapshotVersionCheckpoints = 3

// snapshotVersionDrains is the version of a snapshot with a drain mark
// (Member.DrainingAt, View.Drains): a dsmd of a version before hand-overs
// would place the marked incarnation's shards as if it were not leaving.
// It may hold placement checkpoints too.
const snapshotVersionDrains = 4

// maxSnapshotSize bounds what Restore reads.
const maxSnapshotSize = 1 << 30

func stateOf(v *View) snapshotState {
	version := snapshotVersion
	for _, r := range v.regions {
		if r.CheckpointAt != 0 {
			version = snapshotVersionCheckpoints
		}
	}
	if v.drains > 0 {
		version = snapshotVersionDrains
	}
	return snapshotState{
		Version: version, Epoch: v.Epoch, Index: v.Index, NextRegion: v.nextRegion,
		Members: v.members, Regions: v.regions, Quarantine: v.quarantine, History: v.history,
		Promotions: v.promotions, Drains: v.drains,
	}
}

func encodeSnapshot(v *View) ([]byte, error) {
	return json.Marshal(stateOf(v))
}

// upgradeV1 gives the records of a version 1 snapshot the fields of
// version 2: every member is incarnation 1 with an unknown nonce (0: the
// first one seen is adopted without a new incarnation) and its node id as
// protocol id (legacyProto: none for node ids above MaxProtoID, which the
// engines never accepted, until their first nonce); every home of a region
// is incarnation 1. The quarantine is empty and the history holds the
// current epoch only, rebuilt from the member table: earlier epochs were
// never recorded. (So, for the first 64 epochs after an upgrade, replicas
// that restored version 1 snapshots of different indices may keep
// histories of different lengths; every record they both have is the
// same.)
func upgradeV1(s *snapshotState) {
	if len(s.Quarantine) > 0 || len(s.History) > 0 {
		// Not written by version 1; decodeSnapshot refuses it.
		return
	}
	v := &View{Epoch: s.Epoch}
	for i := range s.Members {
		m := &s.Members[i]
		m.Incarnation, m.Nonce, m.PastNonces = 1, 0, nil
		m.Proto = v.legacyProto(m.ID)
	}
	v.members = s.Members
	for i := range s.Regions {
		s.Regions[i].HomeIncarnations = nil
		for range s.Regions[i].Homes {
			s.Regions[i].HomeIncarnations = append(s.Regions[i].HomeIncarnations, 1)
		}
	}
	if s.Epoch > 0 {
		v.recordEpoch()
		s.History = v.history
	}
}

// decodeSnapshot parses and validates a snapshot: sorted unique members and
// regions, valid specs and members, region ids below the next id.
func decodeSnapshot(b []byte) (*View, error) {
	var s snapshotState
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	switch s.Version {
	case 1:
		if len(s.Quarantine) > 0 || len(s.History) > 0 {
			return nil, fmt.Errorf("%w: version 1 with a quarantine or a history", ErrBadSnapshot)
		}
		upgradeV1(&s)
	case snapshotVersion, snapshotVersionCheckpoints, snapshotVersionDrains:
	default:
		return nil, fmt.Errorf("%w: version %d", ErrBadSnapshot, s.Version)
	}
	if s.Drains > 0 && s.Version < snapshotVersionDrains {
		return nil, fmt.Errorf("%w: version %d with drain marks", ErrBadSnapshot, s.Version)
	}
	var marks uint64
	mark := func(at ids.Epoch) error {
		if at > s.Epoch {
			return fmt.Errorf("%w: a drain mark of epoch %v, after the snapshot's %v", ErrBadSnapshot, at, s.Epoch)
		}
		if at != 0 {
			marks++
		}
		return nil
	}
	protos := map[ids.NodeID]bool{}
	takeProto := func(p ids.NodeID) error {
		if p == ids.None || p > MaxProtoID || protos[p] {
			// Every protocol id is given once, and only a record from
			// before incarnations (no nonce yet) may have none.
			return fmt.Errorf("%w: protocol id %v missing, out of range or given twice", ErrBadSnapshot, p)
		}
		protos[p] = true
		return nil
	}
	for i, m := range s.Members {
		if err := m.validate(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadSnapshot, err)
		}
		if i > 0 && s.Members[i-1].ID >= m.ID {
			return nil, fmt.Errorf("%w: members out of order", ErrBadSnapshot)
		}
		if m.Incarnation == 0 {
			return nil, fmt.Errorf("%w: member %v without incarnation", ErrBadSnapshot, m.ID)
		}
		if err := mark(m.DrainingAt); err != nil {
			return nil, err
		}
		if m.Proto == ids.None && m.Nonce == 0 {
			continue // from before incarnations; an id comes with its first nonce
		}
		if err := takeProto(m.Proto); err != nil {
			return nil, err
		}
	}
	for _, q := range s.Quarantine {
		if err := takeProto(q.Proto); err != nil {
			return nil, err
		}
		if q.LeftAt > s.Epoch {
			return nil, fmt.Errorf("%w: protocol id %v left in epoch %v, after the snapshot's %v", ErrBadSnapshot, q.Proto, q.LeftAt, s.Epoch)
		}
		if err := mark(q.DrainingAt); err != nil {
			return nil, err
		}
	}
	if len(s.History) > historyLen {
		return nil, fmt.Errorf("%w: %d epochs of history, more than %d", ErrBadSnapshot, len(s.History), historyLen)
	}
	for i, h := range s.History {
		if h.Epoch == 0 || h.Epoch > s.Epoch || (i > 0 && s.History[i-1].Epoch >= h.Epoch) {
			return nil, fmt.Errorf("%w: history epoch %v", ErrBadSnapshot, h.Epoch)
		}
	}
	seenID := map[ids.RegionID]bool{}
	var promoted uint64
	for i, r := range s.Regions {
		n, err := r.RegionSpec.Normalize()
		if err != nil || n != r.RegionSpec {
			return nil, fmt.Errorf("%w: region %q: %v", ErrBadSnapshot, r.Name, err)
		}
		if i > 0 && s.Regions[i-1].Name >= r.Name {
			return nil, fmt.Errorf("%w: regions out of order", ErrBadSnapshot)
		}
		if r.ID == 0 || seenID[r.ID] || (s.NextRegion != 0 && r.ID >= s.NextRegion) {
			return nil, fmt.Errorf("%w: region id %v", ErrBadSnapshot, r.ID)
		}
		if a, err := r.Access.Normalize(); err != nil || !a.Equal(r.Access) {
			return nil, fmt.Errorf("%w: region %q: access lists unsorted or too long", ErrBadSnapshot, r.Name)
		}
		for _, f := range r.Filled {
			if err := validShardRanges(f.Shards, r.Shards()); err != nil || f.Proto == ids.None || f.Since > f.At || f.At > s.Epoch {
				return nil, fmt.Errorf("%w: region %q: a bad fill record", ErrBadSnapshot, r.Name)
			}
		}
		for _, p := range r.Promoted {
			if err := validShardRanges(p.Shards, r.Shards()); err != nil || len(p.Shards) == 0 || p.Proto == ids.None || p.At == 0 || p.At > s.Epoch {
				return nil, fmt.Errorf("%w: region %q: a bad promotion record", ErrBadSnapshot, r.Name)
			}
		}
		if r.Checkpoint != nil || r.CheckpointAt != 0 {
			cp, err := placement.DecodeCheckpoint(r.Checkpoint, r.Shards())
			if err != nil || cp.At != r.CheckpointAt || cp.At > s.Epoch || s.Version < snapshotVersionCheckpoints {
				return nil, fmt.Errorf("%w: region %q: a bad placement checkpoint (%v)", ErrBadSnapshot, r.Name, err)
			}
		}
		promoted += uint64(len(r.Promoted))
		if len(r.HomeIncarnations) != len(r.Homes) {
			return nil, fmt.Errorf("%w: region %q has %d homes and %d home incarnations", ErrBadSnapshot, r.Name, len(r.Homes), len(r.HomeIncarnations))
		}
		seenID[r.ID] = true
	}
	if promoted > s.Promotions {
		return nil, fmt.Errorf("%w: %d promotion records, a count of %d", ErrBadSnapshot, promoted, s.Promotions)
	}
	if marks > s.Drains {
		return nil, fmt.Errorf("%w: %d drain marks, a count of %d", ErrBadSnapshot, marks, s.Drains)
	}
	v := &View{Epoch: s.Epoch, Index: s.Index, nextRegion: s.NextRegion, members: s.Members, alive: aliveOf(s.Members),
		quarantine: s.Quarantine, history: s.History, promotions: s.Promotions, drains: s.Drains}
	v.setRegions(s.Regions)
	return v, nil
}

// Snapshot implements raft.FSM. The view is immutable, so the snapshot is
// just a reference to it.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	v, _ := f.current()
	return fsmSnapshot{v}, nil
}

// Restore implements raft.FSM.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxSnapshotSize+1))
	if err != nil {
		return fmt.Errorf("directory: read snapshot: %w", err)
	}
	if len(b) > maxSnapshotSize {
		return fmt.Errorf("%w: larger than %d bytes", ErrBadSnapshot, maxSnapshotSize)
	}
	v, err := decodeSnapshot(b)
	if err != nil {
		return err
	}
	f.set(v, true)
	return nil
}

type fsmSnapshot struct{ v *View }

func (s fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	b, err := encodeSnapshot(s.v)
	if err == nil {
		_, err = sink.Write(b)
	}
	if err != nil {
		return errors.Join(err, sink.Cancel())
	}
	return sink.Close()
}

func (fsmSnapshot) Release() {}
