package directory

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
)

// member is node id's first process (nonce 100+id).
func member(id ids.NodeID) *Member {
	return &Member{ID: id, GRPCAddr: "127.0.0.1:1", VerbsAddr: "127.0.0.1:2", RaftAddr: "127.0.0.1:3", RPCAddr: "127.0.0.1:4", State: StateAlive, Nonce: 100 + uint64(id)}
}

func seedCommands() []command {
	return []command{
		createRegionCmd(RegionSpec{Name: "a", Size: 1 << 30}, time.Unix(1, 0)),
		createRegionCmd(RegionSpec{Name: "b", Size: 1 << 40, PageSize: 2 << 20, Backups: 2, Durability: DurabilityMemory}, time.Unix(2, 0)),
		{Type: cmdDeleteRegion, Name: "a"},
		{Type: cmdPutMember, Member: member(1)},
		{Type: cmdPutMember, Member: member(2), KeepDescriptors: true},
		{Type: cmdSetMemberState, ID: 2, State: StateFailed},
		{Type: cmdPutMember, Member: restartOf(2, 2)}, // incarnation 2, old id quarantined
		createRegionCmd(RegionSpec{Name: "c", Size: 1 << 30}, time.Unix(3, 0)),
		withAccess(createRegionCmd(RegionSpec{Name: "d", Size: 1 << 20}, time.Unix(4, 0)), &Access{Users: []uint32{1000}, ReadGroups: []uint32{50}}),
		{Type: cmdSetRegionAccess, Name: "c", Access: &Access{Groups: []uint32{7, 3}}},
		{Type: cmdFilled, Region: 3, ID: 1, Nonce: member(1).Nonce, Since: 4, Shards: []ShardRange{{0, 2}, {5, 9}}},
		{Type: cmdPromote, Region: 3, ID: 1, Nonce: member(1).Nonce, Shards: []ShardRange{{0, 2}}},
		{Type: cmdSetDraining, ID: 1, Nonce: member(1).Nonce},
	}
}

// TestFSMDraining: a draining member stays alive, is shown draining until
// it leaves, keeps the flag across a gossip update of the same
// incarnation, and loses it with a new incarnation; draining is refused
// for another incarnation and for a member that is not alive.
func TestFSMDraining(t *testing.T) {
	f := newFSM(newNotifier())
	one := member(1)
	res := applyAll(t, f, []command{
		{Type: cmdPutMember, Member: one},
		{Type: cmdSetDraining, ID: 1, Nonce: one.Nonce + 1},
		{Type: cmdSetDraining, ID: 1, Nonce: one.Nonce},
		{Type: cmdSetDraining, ID: 1, Nonce: one.Nonce},
		{Type: cmdPutMember, Member: member(1), KeepDescriptors: true},
	})
	if !errors.Is(res[1].Err, ErrStaleIncarnation) || res[2].Err != nil || res[2].Epoch != 2 || res[3].Epoch != 2 {
		t.Fatalf("results %+v", res)
	}
	v, _ := f.current()
	if m, _ := v.Member(1); !m.Draining || m.State != StateAlive || !slices.Contains(v.Alive(), 1) {
		t.Fatalf("member 1 after draining: %+v", m)
	}
	applyAll(t, f, []command{{Type: cmdPutMember, Member: restartOf(1, 2)}})
	v, _ = f.current()
	if m, _ := v.Member(1); m.Draining {
		t.Fatalf("a new incarnation inherited draining: %+v", m)
	}
	applyAll(t, f, []command{{Type: cmdSetMemberState, ID: 1, State: StateFailed}})
	if r := applyAll(t, f, []command{{Type: cmdSetDraining, ID: 1, Nonce: restartOf(1, 2).Nonce}}); !errors.Is(r[0].Err, ErrInvalidMember) {
		t.Fatalf("draining a failed member: %v", r[0].Err)
	}
}

// TestFSMDrainMark: a hand-over mark (SetDraining of this version)
// records its epoch and counts it; a mark replayed from a version before
// hand-overs does neither; a retry changes nothing; the epoch goes with
// the incarnation into the quarantine at its restart, and a snapshot with
// marks is version 4 and keeps them and the count. A promotion without a
// completeness record is kept for an incarnation that held the shard since
// the region's creation (one of its first 1+Backups homes) and refused
// for one that did not (the third home) and for a draining member. A
// region created meanwhile has no home at the draining member.
func TestFSMDrainMark(t *testing.T) {
	f := newFSM(newNotifier())
	one, two, three := member(1), member(2), member(3)
	res := applyAll(t, f, []command{
		{Type: cmdPutMember, Member: one},   // epoch 1
		{Type: cmdPutMember, Member: two},   // 2
		{Type: cmdPutMember, Member: three}, // 3
		createRegionCmd(RegionSpec{Name: "r", Size: 64 << 20, Backups: 1}, time.Unix(1, 0)),
		{Type: cmdSetDraining, ID: 3, Nonce: three.Nonce},               // 4: an old command: no mark
		{Type: cmdSetDraining, ID: 1, Nonce: one.Nonce, HandOver: true}, // 5: marked
		{Type: cmdSetDraining, ID: 1, Nonce: one.Nonce, HandOver: true}, // a retry
		{Type: cmdPutMember, Member: member(1), KeepDescriptors: true},  // the same incarnation's gossip
	})
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("command %d: %v", i, r.Err)
		}
	}
	v, _ := f.current()
	m1, _ := v.Member(1)
	m3, _ := v.Member(3)
	if m1.DrainingAt != 5 || !m1.Draining || m3.DrainingAt != 0 || !m3.Draining || v.Drains() != 1 || v.Epoch != 5 {
		t.Fatalf("marks: n1 %+v, n3 %+v, count %d, epoch %v", m1, m3, v.Drains(), v.Epoch)
	}
	if b, _ := encodeSnapshot(v); !bytes.Contains(b, []byte(`"version":4`)) {
		t.Fatalf("a snapshot with a mark: %s", b)
	}
	v2 := snapshotRoundTrip(t, v)
	if m, _ := v2.Member(1); m.DrainingAt != 5 || v2.Drains() != 1 {
		t.Fatalf("after a snapshot: %+v, count %d", m, v2.Drains())
	}
	// Promotions without records: n2 (the first home or backup of the
	// shards where it ranks first or second) is kept; where it ranks third
	// it held nothing from the start, and the draining n1 is refused.
	r, _ := v.Region("r")
	var held, notHeld uint64 = 1 << 62, 1 << 62
	for s := range r.Shards() {
		rank := placement.Rank(placement.Shard{Region: r.ID, Index: s}, r.Homes, 3)
		if rank[2] == 2 && notHeld > s {
			notHeld = s
		}
		if rank[2] != 2 && held > s {
			held = s
		}
	}
	promote := func(m *Member, s uint64) command {
		return command{Type: cmdPromote, Region: r.ID, ID: m.ID, Nonce: m.Nonce, Shards: []ShardRange{{s, s + 1}}}
	}
	res = applyAll(t, f, []command{promote(two, held), promote(two, notHeld), promote(one, held)})
	if res[0].Err != nil || !errors.Is(res[1].Err, ErrInvalidMember) || !errors.Is(res[2].Err, ErrInvalidMember) {
		t.Fatalf("promotions: %v, %v, %v", res[0].Err, res[1].Err, res[2].Err)
	}
	// A region created now has no home at the draining n1.
	res = applyAll(t, f, []command{createRegionCmd(RegionSpec{Name: "later", Size: 64 << 20}, time.Unix(2, 0))})
	if res[0].Err != nil || !slices.Equal(res[0].Region.Homes, []ids.NodeID{2, 3}) {
		t.Fatalf("a region created while n1 drains: %+v, %v", res[0].Region.Homes, res[0].Err)
	}
	// A restart takes the mark into the quarantine; the new incarnation
	// has none, and the count stays.
	applyAll(t, f, []command{{Type: cmdPutMember, Member: restartOf(1, 2)}})
	v, _ = f.current()
	q := v.Quarantine()
	if m, _ := v.Member(1); m.DrainingAt != 0 || m.Draining || len(q) != 1 || q[0].DrainingAt != 5 || v.Drains() != 1 {
		t.Fatalf("after the restart: %+v, quarantine %+v, count %d", m, q, v.Drains())
	}
	if v2 := snapshotRoundTrip(t, v); v2.Quarantine()[0].DrainingAt != 5 {
		t.Fatalf("the quarantine's mark after a snapshot: %+v", v2.Quarantine())
	}
}

// TestFSMFilled: a completeness record is kept for the current, alive
// incarnation that was not declared failed after the fills began, with
// the epoch it was committed in; it survives a snapshot, does not move the
// epoch, and a retry adds nothing.
func TestFSMFilled(t *testing.T) {
	f := newFSM(newNotifier())
	one, two := member(1), member(2)
	fill := func(id ids.NodeID, nonce uint64, since ids.Epoch, rs ...ShardRange) command {
		return command{Type: cmdFilled, Region: 1, ID: id, Nonce: nonce, Since: since, Shards: rs}
	}
	res := applyAll(t, f, []command{
		{Type: cmdPutMember, Member: one},                                                             // epoch 1
		createRegionCmd(RegionSpec{Name: "r", Size: 64 << 20}, time.Unix(1, 0)),                       // 32 shards, epoch 1
		{Type: cmdPutMember, Member: two},                                                             // epoch 2: 2 joins
		fill(2, two.Nonce, 2, ShardRange{0, 4}, ShardRange{8, 9}),                                     // 3: kept, at 2
		fill(2, two.Nonce, 2, ShardRange{0, 4}, ShardRange{8, 9}),                                     // 4: a retry
		fill(2, two.Nonce+1, 2, ShardRange{0, 4}),                                                     // 5: another incarnation
		fill(3, 103, 2, ShardRange{0, 4}),                                                             // 6: no member
		fill(2, two.Nonce, 2, ShardRange{30, 33}),                                                     // 7: beyond the region
		fill(2, two.Nonce, 3, ShardRange{0, 1}),                                                       // 8: since after the epoch
		{Type: cmdSetMemberState, ID: 2, State: StateFailed, Nonce: two.Nonce},                        // 9: epoch 3
		fill(2, two.Nonce, 2, ShardRange{4, 8}),                                                       // 10: failed
		{Type: cmdPutMember, Member: two},                                                             // 11: refused: a verdict is final
		{Type: cmdPutMember, Member: restartOf(2, 2)},                                                 // 12: epoch 4, incarnation 2
		fill(2, restartOf(2, 2).Nonce, 4, ShardRange{4, 8}),                                           // 13: kept, at 4
		{Type: cmdFilled, Region: 9, ID: 2, Nonce: two.Nonce, Since: 4, Shards: []ShardRange{{0, 1}}}, // 14: no region
		fill(2, two.Nonce, 4, ShardRange{4, 8}),                                                       // 15: the failed incarnation
	})
	for i, want := range []error{3: nil, 4: nil, 5: ErrStaleIncarnation, 6: ErrNoMember, 7: ErrBadCommand, 8: ErrBadCommand,
		10: ErrInvalidMember, 11: ErrDeclaredFailed, 13: nil, 14: ErrNoRegion, 15: ErrStaleIncarnation} {
		if i < 3 || i == 9 || i == 12 {
			continue
		}
		if !errors.Is(res[i].Err, want) || (want == nil && res[i].Err != nil) {
			t.Errorf("command %d: %v, want %v", i, res[i].Err, want)
		}
	}
	if res[3].Epoch != 2 || res[13].Epoch != 4 {
		t.Errorf("a fill record moved the epoch: %v %v", res[3].Epoch, res[13].Epoch)
	}
	v, _ := f.current()
	r, _ := v.Region("r")
	m2, _ := v.Member(2)
	want := []FillRecord{
		{Node: 2, Incarnation: 1, Proto: 2, Since: 2, At: 2, Shards: []ShardRange{{0, 4}, {8, 9}}},
		{Node: 2, Incarnation: 2, Proto: m2.Proto, Since: 4, At: 4, Shards: []ShardRange{{4, 8}}},
	}
	if !reflect.DeepEqual(r.Filled, want) {
		t.Fatalf("records %+v, want %+v", r.Filled, want)
	}
	if m2.JoinedAt != 4 {
		t.Errorf("incarnation 2 of member 2 joined in epoch %v, want 4", m2.JoinedAt)
	}
	for s, covered := range map[uint64]bool{0: true, 3: true, 4: false, 7: false, 8: true, 9: false} {
		if r.Filled[0].Covers(s) != covered {
			t.Errorf("record covers shard %d: %v", s, !covered)
		}
	}
	// A snapshot keeps the records and the join epochs.
	v2 := snapshotRoundTrip(t, v)
	r2, _ := v2.Region("r")
	if m, _ := v2.Member(2); !reflect.DeepEqual(r2.Filled, want) || m.JoinedAt != 4 {
		t.Fatalf("after a snapshot: records %+v, member %+v", r2.Filled, m)
	}
}

// TestFSMPromote: a promotion record is kept only for the current, alive
// incarnation and only for shards its fill records cover; it moves the
// epoch and the count of promotions, a retry changes nothing, and a
// snapshot keeps both, the count also after the region is deleted.
func TestFSMPromote(t *testing.T) {
	f := newFSM(newNotifier())
	one, two := member(1), member(2)
	promote := func(id ids.NodeID, nonce uint64, rs ...ShardRange) command {
		return command{Type: cmdPromote, Region: 1, ID: id, Nonce: nonce, Shards: rs}
	}
	res := applyAll(t, f, []command{
		{Type: cmdPutMember, Member: one},                                                             // epoch 1
		createRegionCmd(RegionSpec{Name: "r", Size: 64 << 20}, time.Unix(1, 0)),                       // 32 shards
		{Type: cmdPutMember, Member: two},                                                             // epoch 2
		promote(2, two.Nonce, ShardRange{0, 2}),                                                       // 3: no fill record
		{Type: cmdFilled, Region: 1, ID: 2, Nonce: two.Nonce, Since: 2, Shards: []ShardRange{{0, 4}}}, // 4
		promote(2, two.Nonce, ShardRange{0, 2}),                                                       // 5: kept, epoch 3
		promote(2, two.Nonce, ShardRange{0, 2}),                                                       // 6: a retry
		promote(2, two.Nonce, ShardRange{3, 5}),                                                       // 7: shard 4 not covered
		promote(2, two.Nonce+1, ShardRange{2, 3}),                                                     // 8: another incarnation
		promote(1, one.Nonce, ShardRange{0, 1}),                                                       // 9: no record, held since the creation: kept, epoch 4
		{Type: cmdPromote, Region: 9, ID: 2, Nonce: two.Nonce, Shards: []ShardRange{{0, 1}}},          // 10: no region
		promote(2, two.Nonce, ShardRange{2, 4}),                                                       // 11: kept, epoch 4
	})
	for i, want := range []error{3: ErrInvalidMember, 5: nil, 6: nil, 7: ErrInvalidMember, 8: ErrStaleIncarnation,
		9: nil, 10: ErrNoRegion, 11: nil} {
		if i < 3 || i == 4 {
			continue
		}
		if !errors.Is(res[i].Err, want) || (want == nil && res[i].Err != nil) {
			t.Errorf("command %d: %v, want %v", i, res[i].Err, want)
		}
	}
	if res[5].Epoch != 3 || res[6].Epoch != 3 || res[9].Epoch != 4 || res[11].Epoch != 5 {
		t.Errorf("epochs after the promotions: %v %v %v %v, want 3 3 4 5", res[5].Epoch, res[6].Epoch, res[9].Epoch, res[11].Epoch)
	}
	v, _ := f.current()
	r, _ := v.Region("r")
	want := []PromoteRecord{
		{Node: 2, Incarnation: 1, Proto: 2, At: 3, Shards: []ShardRange{{0, 2}}},
		{Node: 1, Incarnation: 1, Proto: 1, At: 4, Shards: []ShardRange{{0, 1}}},
		{Node: 2, Incarnation: 1, Proto: 2, At: 5, Shards: []ShardRange{{2, 4}}},
	}
	if !reflect.DeepEqual(r.Promoted, want) || v.Promotions() != 3 {
		t.Fatalf("records %+v (count %d), want %+v", r.Promoted, v.Promotions(), want)
	}
	if !r.Promoted[0].Covers(1) || r.Promoted[0].Covers(2) {
		t.Error("a promotion record covers the wrong shards")
	}
	res = applyAll(t, f, []command{{Type: cmdDeleteRegion, Name: "r"}})
	if res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	v, _ = f.current()
	v2 := snapshotRoundTrip(t, v)
	if v2.Promotions() != 3 {
		t.Fatalf("after the deletion and a snapshot, %d promotions counted, want 3", v2.Promotions())
	}
}

// snapshotRoundTrip is v encoded as a snapshot and decoded.
func snapshotRoundTrip(t *testing.T, v *View) *View {
	t.Helper()
	b, err := encodeSnapshot(v)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := decodeSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	return v2
}

func withAccess(c command, a *Access) command {
	c.Access = a
	return c
}

func applyAll(t *testing.T, f *fsm, cmds []command) []applyResult {
	t.Helper()
	var out []applyResult
	for i, c := range cmds {
		res := f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: encodeCommand(c)}).(applyResult)
		out = append(out, res)
	}
	return out
}

func TestFSMEpochRules(t *testing.T) {
	f := newFSM(newNotifier())
	res := applyAll(t, f, []command{
		{Type: cmdPutMember, Member: member(1)},                             // e1
		{Type: cmdPutMember, Member: member(1), KeepDescriptors: true},      // same: no epoch
		createRegionCmd(RegionSpec{Name: "r", Size: 4096}, time.Unix(5, 0)), // regions do not bump
		{Type: cmdPutMember, Member: member(2)},                             // e2
		{Type: cmdSetMemberState, ID: 2, State: StateFailed},                // e3
		{Type: cmdSetMemberState, ID: 2, State: StateFailed},                // same: no epoch
		{Type: cmdSetMemberState, ID: 9, State: StateFailed},                // unknown: no-op
		{Type: cmdPutMember, Member: &Member{ID: 1, RaftAddr: "x", RPCAddr: "y", State: StateAlive, Descriptors: []byte("d"), Nonce: 101}}, // e4
	})
	want := []ids.Epoch{1, 1, 1, 2, 3, 3, 3, 4}
	for i, r := range res {
		if r.Err != nil || r.Epoch != want[i] {
			t.Fatalf("command %d: epoch %v err %v, want epoch %v", i, r.Epoch, r.Err, want[i])
		}
	}
	v, _ := f.current()
	if got := v.Alive(); !reflect.DeepEqual(got, []ids.NodeID{1}) {
		t.Fatalf("alive %v", got)
	}
	m, _ := v.Member(1)
	if m.Epoch != 4 || string(m.Descriptors) != "d" {
		t.Fatalf("member 1: %+v", m)
	}
	// The region's homes are the members alive at its creation (node 1
	// only), whoever joins or fails later.
	if r, ok := v.Region("r"); !ok || !reflect.DeepEqual(r.Homes, []ids.NodeID{1}) {
		t.Fatalf("region r: %+v, want homes [1]", r)
	}
	// Gossip-driven puts keep the descriptors.
	f.Apply(&raft.Log{Index: 100, Type: raft.LogCommand, Data: encodeCommand(command{Type: cmdPutMember, Member: member(1), KeepDescriptors: true})})
	v, _ = f.current()
	if m, _ := v.Member(1); string(m.Descriptors) != "d" {
		t.Fatalf("descriptors lost by a gossip update: %+v", m)
	}
}

func TestFSMBadCommandChangesNothing(t *testing.T) {
	f := newFSM(newNotifier())
	applyAll(t, f, seedCommands())
	before, _ := f.current()
	res := f.Apply(&raft.Log{Index: 99, Type: raft.LogCommand, Data: []byte("\x01{not json")}).(applyResult)
	if !errors.Is(res.Err, ErrBadCommand) {
		t.Fatalf("bad command: %v", res.Err)
	}
	after, _ := f.current()
	if !reflect.DeepEqual(before, after) {
		t.Fatal("a malformed command changed the state")
	}
}

// TestSnapshotRoundTrip: Persist then Restore into a fresh FSM gives the
// same view, and a replica fed the same commands agrees. The seed has a
// restart: incarnations, the quarantine, the history and home
// incarnations are in the snapshot.
func TestSnapshotRoundTrip(t *testing.T) {
	f := newFSM(newNotifier())
	applyAll(t, f, seedCommands())
	if v, _ := f.current(); len(v.Quarantine()) != 1 || len(v.History(0)) != 6 || v.Promotions() != 1 {
		t.Fatalf("seed: quarantine %+v, history %+v, %d promotions", v.Quarantine(), v.History(0), v.Promotions())
	}
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	g := newFSM(newNotifier())
	if err := g.Restore(nopCloser{bytes.NewReader(sink.Bytes())}); err != nil {
		t.Fatal(err)
	}
	a, _ := f.current()
	b, _ := g.current()
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("restored view differs:\n%+v\n%+v", a, b)
	}
	h := newFSM(newNotifier())
	applyAll(t, h, seedCommands())
	c, _ := h.current()
	if !reflect.DeepEqual(a, c) {
		t.Fatal("two replicas applying the same log disagree")
	}
}

func TestNotifierCoalesces(t *testing.T) {
	n := newNotifier()
	v0 := &View{Epoch: 0}
	ch, cancel := n.subscribe(v0)
	defer cancel()
	for e := ids.Epoch(1); e <= 100; e++ {
		n.publish(&View{Epoch: e}) // nobody reads: must not block
	}
	c := <-ch
	if c.Prev.Epoch != 0 || c.Cur.Epoch != 100 {
		t.Fatalf("coalesced change %v -> %v, want 0 -> 100", c.Prev.Epoch, c.Cur.Epoch)
	}
	n.publish(&View{Epoch: 101})
	c = <-ch
	if c.Prev.Epoch != 100 || c.Cur.Epoch != 101 {
		t.Fatalf("next change %v -> %v", c.Prev.Epoch, c.Cur.Epoch)
	}
	n.close()
	if _, ok := <-ch; ok {
		t.Fatal("channel open after close")
	}
	cancel() // after close: harmless
}

func TestWireErrorsKeepIdentity(t *testing.T) {
	for _, err := range []error{ErrRegionExists, ErrNotLeader, &SpecError{Field: "Size", Reason: "zero"}, errors.New("other")} {
		back := fromWire(toWire(err))
		if errors.Is(err, ErrRegionExists) && !errors.Is(back, ErrRegionExists) ||
			errors.Is(err, ErrNotLeader) && !errors.Is(back, ErrNotLeader) {
			t.Fatalf("%v came back as %v", err, back)
		}
		var se *SpecError
		if errors.As(err, &se) {
			var se2 *SpecError
			if !errors.As(back, &se2) || *se2 != *se {
				t.Fatalf("spec error came back as %v", back)
			}
		}
		var re *RemoteError
		if err.Error() == "other" && !errors.As(back, &re) {
			t.Fatalf("unknown error came back as %T", back)
		}
	}
}

type memSink struct{ bytes.Buffer }

func (*memSink) ID() string    { return "mem" }
func (*memSink) Cancel() error { return nil }
func (*memSink) Close() error  { return nil }

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }

// Fuzz targets for every decoder of bytes that arrive from the network:
// Raft log entries (commands), snapshots, gossip metadata and RPC frames.

func FuzzDecodeCommand(f *testing.F) {
	for _, c := range seedCommands() {
		f.Add(encodeCommand(c))
	}
	f.Add([]byte{1, '{', '}'})
	f.Add([]byte{2})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCommand(b)
		if err != nil {
			return
		}
		c2, err := decodeCommand(encodeCommand(c))
		if err != nil || !reflect.DeepEqual(c, c2) {
			t.Fatalf("accepted command does not round-trip: %+v vs %+v (%v)", c, c2, err)
		}
		// Applying any accepted command never panics and is deterministic.
		v := &View{nextRegion: 1}
		a, ra := applyCommand(v, c)
		b2, rb := applyCommand(v, c)
		if !reflect.DeepEqual(a, b2) || (ra.Err == nil) != (rb.Err == nil) {
			t.Fatal("apply is not deterministic")
		}
	})
}

func FuzzDecodeSnapshot(f *testing.F) {
	g := newFSM(newNotifier())
	for i, c := range seedCommands() {
		g.Apply(&raft.Log{Index: uint64(i + 1), Data: encodeCommand(c)})
	}
	v, _ := g.current()
	b, _ := encodeSnapshot(v)
	f.Add(b)
	f.Add([]byte(`{"version":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeSnapshot(b)
		if err != nil {
			return
		}
		for _, r := range v.Regions() {
			if _, err := v.Placement(r.ID, ids.PageNo(r.Pages()-1)); err != nil && !errors.Is(err, ErrNoMembers) {
				t.Fatalf("placement in an accepted snapshot: %v", err)
			}
		}
	})
}

func FuzzDecodeMeta(f *testing.F) {
	f.Add(encodeMeta(nodeMeta{Proto: ProtoVersion, ID: 1, RaftAddr: "127.0.0.1:1", RPCAddr: "127.0.0.1:2", Expect: 3, Nonce: 0x1234}))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			return
		}
		m2, err := decodeMeta(encodeMeta(m))
		if err != nil || m2 != m {
			t.Fatalf("meta does not round-trip: %+v vs %+v (%v)", m, m2, err)
		}
	})
}

func FuzzReadFrame(f *testing.F) {
	frame := func(v any) []byte {
		var buf bytes.Buffer
		if err := writeFrame(&buf, v); err != nil {
			f.Fatal(err)
		}
		return buf.Bytes()
	}
	f.Add(frame(rpcRequest{Op: opApply, Cmd: encodeCommand(seedCommands()[0])}))
	f.Add(frame(rpcRequest{Op: opLeave, ID: 3}))
	f.Add(binary.BigEndian.AppendUint32(nil, 0xffffffff))
	f.Fuzz(func(t *testing.T, b []byte) {
		var req rpcRequest
		_ = readFrame(bytes.NewReader(b), &req)
		var resp rpcResponse
		_ = readFrame(bytes.NewReader(b), &resp)
	})
}

// A promotion of a member to shards it was promoted to before is a retry
// (applied once) unless another member was promoted to one of them since:
// then the member lost them and wins them back, and the record is applied
// again (otherwise its promotion would be refused for good).
func TestFSMPromoteAgainAfterAnother(t *testing.T) {
	f := newFSM(newNotifier())
	one, two := member(1), member(2)
	promote := func(m *Member, rs ...ShardRange) command {
		return command{Type: cmdPromote, Region: 1, ID: m.ID, Nonce: m.Nonce, Shards: rs}
	}
	filled := func(m *Member) command {
		return command{Type: cmdFilled, Region: 1, ID: m.ID, Nonce: m.Nonce, Since: 2, Shards: []ShardRange{{0, 4}}}
	}
	res := applyAll(t, f, []command{
		{Type: cmdPutMember, Member: one},                                       // epoch 1
		createRegionCmd(RegionSpec{Name: "r", Size: 64 << 20}, time.Unix(1, 0)), // 32 shards
		{Type: cmdPutMember, Member: two},                                       // epoch 2
		filled(two), filled(one),
		promote(two, ShardRange{0, 2}), // 5: epoch 3
		promote(two, ShardRange{0, 2}), // 6: a retry
		promote(one, ShardRange{1, 2}), // 7: epoch 4
		promote(two, ShardRange{0, 2}), // 8: won back: epoch 5
		promote(two, ShardRange{0, 2}), // 9: a retry of that
	})
	for i, want := range map[int]ids.Epoch{5: 3, 6: 3, 7: 4, 8: 5, 9: 5} {
		if res[i].Err != nil || res[i].Epoch != want {
			t.Errorf("command %d: epoch %v, %v; want epoch %v", i, res[i].Epoch, res[i].Err, want)
		}
	}
	v, _ := f.current()
	if v.Promotions() != 3 {
		t.Fatalf("%d promotions recorded, want 3", v.Promotions())
	}
}
