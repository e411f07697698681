package directory

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"

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
// view and command give the same result on every replica.
func applyCommand(v *View, c command) (*View, applyResult) {
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
		r := Region{ID: v.nextRegion, RegionSpec: spec, CreatedAt: time.Unix(0, c.CreatedAt).UTC(), Homes: slices.Clone(v.alive)}
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
	case cmdPutMember:
		m := *c.Member
		m.Descriptors = slices.Clone(m.Descriptors)
		old, ok := v.Member(m.ID)
		if ok && c.KeepDescriptors {
			m.Descriptors = old.Descriptors
		}
		if ok && old.State == m.State && old.sameAddrs(m) && string(old.Descriptors) == string(m.Descriptors) {
			return &next, applyResult{}
		}
		next.Epoch++
		m.Epoch = next.Epoch
		next.setMember(m)
		return &next, applyResult{changed: true}
	case cmdSetMemberState:
		old, ok := v.Member(c.ID)
		if !ok || old.State == c.State {
			return &next, applyResult{}
		}
		next.Epoch++
		old.State = c.State
		old.Epoch = next.Epoch
		next.setMember(old)
		return &next, applyResult{changed: true}
	}
	return &next, applyResult{Err: fmt.Errorf("%w: type %d", ErrBadCommand, c.Type)}
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
	Version    int          `json:"version"`
	Epoch      ids.Epoch    `json:"epoch"`
	Index      uint64       `json:"index"`
	NextRegion ids.RegionID `json:"next_region"`
	Members    []Member     `json:"members"`
	Regions    []Region     `json:"regions"`
}

const snapshotVersion = 1

// maxSnapshotSize bounds what Restore reads.
const maxSnapshotSize = 1 << 30

func encodeSnapshot(v *View) ([]byte, error) {
	return json.Marshal(snapshotState{
		Version: snapshotVersion, Epoch: v.Epoch, Index: v.Index, NextRegion: v.nextRegion,
		Members: v.members, Regions: v.regions,
	})
}

// decodeSnapshot parses and validates a snapshot: sorted unique members and
// regions, valid specs and members, region ids below the next id.
func decodeSnapshot(b []byte) (*View, error) {
	var s snapshotState
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	if s.Version != snapshotVersion {
		return nil, fmt.Errorf("%w: version %d", ErrBadSnapshot, s.Version)
	}
	for i, m := range s.Members {
		if err := m.validate(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadSnapshot, err)
		}
		if i > 0 && s.Members[i-1].ID >= m.ID {
			return nil, fmt.Errorf("%w: members out of order", ErrBadSnapshot)
		}
	}
	seenID := map[ids.RegionID]bool{}
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
		seenID[r.ID] = true
	}
	v := &View{Epoch: s.Epoch, Index: s.Index, nextRegion: s.NextRegion, members: s.Members, alive: aliveOf(s.Members)}
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
