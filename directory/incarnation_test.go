package directory

import (
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/internal/ids"
)

// The directory hands out protocol ids the coherence word can name.
func TestMaxProtoIDIsCoherences(t *testing.T) {
	if MaxProtoID != coherence.MaxNodeID {
		t.Fatalf("MaxProtoID %d, coherence.MaxNodeID %d", MaxProtoID, coherence.MaxNodeID)
	}
}

// restartOf is node id's process number n (n > 1: a restart).
func restartOf(id ids.NodeID, n uint64) *Member {
	m := member(id)
	m.Nonce = 100*n + uint64(id)
	return m
}

func viewOf(f *fsm) *View {
	v, _ := f.current()
	return v
}

// First records get incarnation 1 and the lowest free protocol ids,
// whatever the node ids.
func TestProtoAllocation(t *testing.T) {
	f := newFSM(newNotifier())
	applyAll(t, f, []command{
		{Type: cmdPutMember, Member: member(7)},
		{Type: cmdPutMember, Member: member(3)},
		{Type: cmdPutMember, Member: member(5000)},
	})
	v := viewOf(f)
	want := map[ids.NodeID]ids.NodeID{7: 1, 3: 2, 5000: 3}
	for id, p := range want {
		m, _ := v.Member(id)
		if m.Incarnation != 1 || m.Proto != p || m.Nonce != 100+uint64(id) {
			t.Errorf("member %v: incarnation %d proto %v nonce %d, want 1, %v, %d", id, m.Incarnation, m.Proto, m.Nonce, p, 100+uint64(id))
		}
		if b, ok := v.ByProto(p); !ok || b.ID != id {
			t.Errorf("ByProto(%v) = %v %v, want %v", p, b.ID, ok, id)
		}
	}
	if got := v.ProtoIDsLeft(); got != int(MaxProtoID)-3 {
		t.Errorf("ProtoIDsLeft %d, want %d", got, MaxProtoID-3)
	}
	// A put never chooses its own incarnation or protocol id.
	bad := member(9)
	bad.Incarnation, bad.Proto, bad.PastNonces = 40, 7, []uint64{1}
	applyAll(t, f, []command{{Type: cmdPutMember, Member: bad}})
	if m, _ := viewOf(f).Member(9); m.Incarnation != 1 || m.Proto != 4 || m.PastNonces != nil {
		t.Errorf("member 9 chose its fields: %+v", m)
	}
}

// A record with a new nonce is a restart: the next incarnation, a fresh
// protocol id, the old one quarantined, the old descriptors gone, in one
// new epoch; whether the member was alive (a restart quicker than failure
// detection) or failed.
func TestRestartIsNewIncarnation(t *testing.T) {
	f := newFSM(newNotifier())
	withDesc := member(1)
	withDesc.Descriptors = []byte("old memory")
	applyAll(t, f, []command{
		{Type: cmdPutMember, Member: member(1)},
		{Type: cmdPutMember, Member: member(2)},
		{Type: cmdPutMember, Member: withDesc},
		createRegionCmd(RegionSpec{Name: "before", Size: 1 << 30}, time.Unix(1, 0)),
	})
	before := viewOf(f)
	e := before.Epoch

	// Node 1 restarts while alive; reconcile's put keeps descriptors, but
	// never across incarnations.
	res := applyAll(t, f, []command{{Type: cmdPutMember, Member: restartOf(1, 2), KeepDescriptors: true}})[0]
	if res.Err != nil || res.Epoch != e+1 {
		t.Fatalf("restart: epoch %v err %v, want epoch %v", res.Epoch, res.Err, e+1)
	}
	v := viewOf(f)
	m, _ := v.Member(1)
	if m.Incarnation != 2 || m.Proto != 3 || m.Nonce != 201 || m.State != StateAlive || m.Epoch != e+1 || m.JoinedAt != e+1 ||
		len(m.Descriptors) != 0 || !slices.Equal(m.PastNonces, []uint64{101}) {
		t.Fatalf("restarted member: %+v", m)
	}
	if q := v.Quarantine(); !reflect.DeepEqual(q, []Quarantined{{Proto: 1, LeftAt: e + 1, Node: 1, Incarnation: 1, JoinedAt: 1}}) {
		t.Fatalf("quarantine %+v", q)
	}
	if _, ok := v.ByProto(1); ok {
		t.Fatal("the old protocol id still names a member")
	}
	if got := v.ProtoIDsLeft(); got != int(MaxProtoID)-3 {
		t.Errorf("ProtoIDsLeft %d, want %d (two members, one quarantined)", got, MaxProtoID-3)
	}
	if got := (Change{Prev: before, Cur: v}).Restarted(); !slices.Equal(got, []ids.NodeID{1}) {
		t.Errorf("Restarted %v, want [n1]", got)
	}
	if c := (Change{Prev: before, Cur: v}); len(c.Joined()) != 0 || len(c.Departed()) != 0 {
		t.Errorf("a restart shows as joined %v departed %v", c.Joined(), c.Departed())
	}
	h := v.History(e)
	wantRec := EpochRecord{Epoch: e + 1, Members: []ProtoMember{
		{Node: 1, Incarnation: 2, Proto: 3, State: StateAlive}, {Node: 2, Incarnation: 1, Proto: 2, State: StateAlive}}}
	if len(h) != 1 || !reflect.DeepEqual(h[0], wantRec) {
		t.Fatalf("history after %v: %+v, want %+v", e, h, wantRec)
	}

	// The same process again changes nothing; its descriptors come in a
	// later epoch.
	res = applyAll(t, f, []command{{Type: cmdPutMember, Member: restartOf(1, 2), KeepDescriptors: true}})[0]
	if res.Err != nil || res.Epoch != e+1 {
		t.Fatalf("repeated put: epoch %v err %v", res.Epoch, res.Err)
	}

	// Regions record their homes' incarnations at creation.
	applyAll(t, f, []command{createRegionCmd(RegionSpec{Name: "after", Size: 1 << 30}, time.Unix(2, 0))})
	v = viewOf(f)
	rb, _ := v.Region("before")
	ra, _ := v.Region("after")
	if !slices.Equal(rb.HomeIncarnations, []uint64{1, 1}) || !slices.Equal(ra.HomeIncarnations, []uint64{2, 1}) {
		t.Fatalf("home incarnations: before %v after %v", rb.HomeIncarnations, ra.HomeIncarnations)
	}
	if inc, ok := ra.HomeIncarnation(1); !ok || inc != 2 {
		t.Fatalf("HomeIncarnation(1) of after: %d %v", inc, ok)
	}

	// Node 2 fails, then restarts: failed -> alive as incarnation 2 in one
	// epoch, with a new id.
	applyAll(t, f, []command{{Type: cmdSetMemberState, ID: 2, State: StateFailed, Nonce: 102}})
	e = viewOf(f).Epoch
	withDesc = restartOf(2, 2)
	withDesc.Descriptors = []byte("new memory")
	res = applyAll(t, f, []command{{Type: cmdPutMember, Member: withDesc}})[0] // SetLocalMeta first
	v = viewOf(f)
	m, _ = v.Member(2)
	if res.Err != nil || res.Epoch != e+1 || m.Incarnation != 2 || m.Proto != 4 || m.State != StateAlive || string(m.Descriptors) != "new memory" {
		t.Fatalf("failed member restarted: epoch %v err %v record %+v", res.Epoch, res.Err, m)
	}
	// The failure verdict was the old incarnation's departure: the
	// quarantine says it left in the epoch it failed in.
	if q := v.Quarantine(); len(q) != 2 || q[1] != (Quarantined{Proto: 2, LeftAt: e, Node: 2, Incarnation: 1, FailedAt: e, LastFailedAt: e, Failures: 1, JoinedAt: 2}) {
		t.Fatalf("quarantine %+v", q)
	}
}

// A late message of an earlier incarnation changes nothing: neither a
// SetLocalMeta of the old process nor a failure verdict about it.
func TestStaleNonceRefused(t *testing.T) {
	f := newFSM(newNotifier())
	applyAll(t, f, []command{
		{Type: cmdPutMember, Member: member(1)},
		{Type: cmdPutMember, Member: member(2)},
		{Type: cmdPutMember, Member: restartOf(1, 2)},
		{Type: cmdPutMember, Member: restartOf(1, 3)},
	})
	before := viewOf(f)
	if m, _ := before.Member(1); m.Incarnation != 3 || !slices.Equal(m.PastNonces, []uint64{101, 201}) {
		t.Fatalf("member 1 after two restarts: %+v", m)
	}
	late := restartOf(1, 1)
	late.Descriptors = []byte("stale")
	for _, c := range []command{
		{Type: cmdPutMember, Member: late},                                   // SetLocalMeta of process 1
		{Type: cmdPutMember, Member: restartOf(1, 2), KeepDescriptors: true}, // stale gossip of process 2
		{Type: cmdSetMemberState, ID: 1, State: StateFailed, Nonce: 201},     // verdict about process 2
	} {
		res := applyAll(t, f, []command{c})[0]
		if !errors.Is(res.Err, ErrStaleIncarnation) {
			t.Errorf("%+v: err %v, want ErrStaleIncarnation", c, res.Err)
		}
	}
	after := viewOf(f)
	if after.Epoch != before.Epoch || !reflect.DeepEqual(after.Members(), before.Members()) || !reflect.DeepEqual(after.Quarantine(), before.Quarantine()) {
		t.Fatal("a stale message changed the table")
	}
	// The current incarnation's own verdict applies.
	if res := applyAll(t, f, []command{{Type: cmdSetMemberState, ID: 1, State: StateFailed, Nonce: 301}})[0]; res.Err != nil || res.Epoch != before.Epoch+1 {
		t.Fatalf("verdict about the current incarnation: %v %v", res.Epoch, res.Err)
	}
}

// Commands without a nonce were written by the version before
// incarnations and are replayed from old logs: they apply as they did, to
// whichever incarnation holds the id, and the first nonce seen afterwards
// is adopted.
func TestLegacyCommandsWithoutNonce(t *testing.T) {
	f := newFSM(newNotifier())
	legacy := func(id ids.NodeID, desc string) *Member {
		m := member(id)
		m.Nonce, m.Descriptors = 0, []byte(desc)
		return m
	}
	res := applyAll(t, f, []command{
		{Type: cmdPutMember, Member: legacy(1, "a")},
		{Type: cmdSetMemberState, ID: 1, State: StateFailed},
		{Type: cmdPutMember, Member: legacy(1, "b")},
	})
	for i, r := range res {
		if r.Err != nil || r.Epoch != ids.Epoch(i+1) {
			t.Fatalf("legacy command %d: epoch %v err %v", i, r.Epoch, r.Err)
		}
	}
	m, _ := viewOf(f).Member(1)
	if m.Incarnation != 1 || m.Nonce != 0 || m.Proto != 1 || m.State != StateAlive || string(m.Descriptors) != "b" {
		t.Fatalf("after legacy commands: %+v", m)
	}
	// Protocol ids of that era depend on the node id alone, as in the
	// decode of a version 1 snapshot (TestSnapshotV1Decode), so a replica
	// that restored such a snapshot and one that replayed the commands
	// behind it agree.
	applyAll(t, f, []command{{Type: cmdPutMember, Member: legacy(1500, "x")}, {Type: cmdPutMember, Member: legacy(7, "y")}})
	for id, p := range map[ids.NodeID]ids.NodeID{1: 1, 1500: ids.None, 7: 7} {
		if m, _ := viewOf(f).Member(id); m.Proto != p {
			t.Fatalf("legacy member %v: proto %v, want %v", id, m.Proto, p)
		}
	}
	applyAll(t, f, []command{{Type: cmdPutMember, Member: member(1), KeepDescriptors: true}})
	m, _ = viewOf(f).Member(1)
	if m.Incarnation != 1 || m.Nonce != 101 || string(m.Descriptors) != "b" {
		t.Fatalf("first nonce after legacy commands: %+v", m)
	}
	// A legacy put now updates the current incarnation, keeping its nonce.
	applyAll(t, f, []command{{Type: cmdPutMember, Member: restartOf(1, 2)}, {Type: cmdPutMember, Member: legacy(1, "c")}})
	m, _ = viewOf(f).Member(1)
	if m.Incarnation != 2 || m.Nonce != 201 || string(m.Descriptors) != "c" {
		t.Fatalf("legacy put after a restart: %+v", m)
	}
}

// The view keeps the last 64 epochs' member sets.
func TestHistoryTrimmed(t *testing.T) {
	f := newFSM(newNotifier())
	cmds := []command{{Type: cmdPutMember, Member: member(1)}, {Type: cmdPutMember, Member: member(2)}}
	for i := range 98 {
		// Node 2 fails, and comes back as a new process.
		if i%2 == 0 {
			cmds = append(cmds, command{Type: cmdSetMemberState, ID: 2, State: StateFailed})
		} else {
			cmds = append(cmds, command{Type: cmdPutMember, Member: restartOf(2, uint64(i+1))})
		}
	}
	applyAll(t, f, cmds)
	v := viewOf(f)
	if v.Epoch != 100 {
		t.Fatalf("epoch %v", v.Epoch)
	}
	h := v.History(0)
	if len(h) != historyLen || h[0].Epoch != 37 || h[len(h)-1].Epoch != 100 {
		t.Fatalf("history of %d records, %v..%v", len(h), h[0].Epoch, h[len(h)-1].Epoch)
	}
	for _, r := range h {
		n := 2 // epochs 2, 4, ...: node 2 alive
		if r.Epoch%2 == 1 {
			n = 1
		}
		if len(r.Members) != n || r.Members[0] != (ProtoMember{Node: 1, Incarnation: 1, Proto: 1, State: StateAlive}) {
			t.Fatalf("epoch %v: members %+v", r.Epoch, r.Members)
		}
	}
	if got := v.History(95); len(got) != 5 || got[0].Epoch != 96 {
		t.Fatalf("History(95): %+v", got)
	}
	if got := v.History(100); len(got) != 0 {
		t.Fatalf("History(100): %+v", got)
	}
	if got := v.History(10); got[0].Epoch != 37 {
		t.Fatalf("History(10) starts at %v: the caller must see the gap", got[0].Epoch)
	}
}

// When every protocol id is used, a restart is refused and the old
// incarnation departs (its process is gone); a new node is refused.
func TestProtoIDsExhausted(t *testing.T) {
	f := newFSM(newNotifier())
	cmds := []command{{Type: cmdPutMember, Member: member(1)}}
	for n := uint64(2); n <= uint64(MaxProtoID); n++ {
		cmds = append(cmds, command{Type: cmdPutMember, Member: restartOf(1, n)})
	}
	res := applyAll(t, f, cmds)
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("command %d: %v", i, r.Err)
		}
	}
	v := viewOf(f)
	m, _ := v.Member(1)
	if m.Incarnation != uint64(MaxProtoID) || m.Proto != MaxProtoID || v.ProtoIDsLeft() != 0 || len(m.PastNonces) != maxPastNonces {
		t.Fatalf("after %d incarnations: %+v, %d left", MaxProtoID, m, v.ProtoIDsLeft())
	}
	e := v.Epoch
	r := applyAll(t, f, []command{{Type: cmdPutMember, Member: restartOf(1, 2000)}})[0]
	m, _ = viewOf(f).Member(1)
	if !errors.Is(r.Err, ErrNoProtoIDs) || m.State != StateFailed || m.Incarnation != uint64(MaxProtoID) || viewOf(f).Epoch != e+1 {
		t.Fatalf("restart without ids: err %v, %+v", r.Err, m)
	}
	r = applyAll(t, f, []command{{Type: cmdPutMember, Member: member(2)}})[0]
	if _, ok := viewOf(f).Member(2); !errors.Is(r.Err, ErrNoProtoIDs) || ok {
		t.Fatalf("new node without ids: err %v, admitted %v", r.Err, ok)
	}
}

// A version 1 snapshot (written before incarnations) decodes with every
// member incarnation 1 under its node id as protocol id (none above
// MaxProtoID), nonces unknown, homes incarnation 1, no quarantine, and a
// history of the current epoch. The first nonce seen for a member is
// adopted (with a protocol id if it had none); the next one is a restart.
func TestSnapshotV1Decode(t *testing.T) {
	v1 := `{"version":1,"epoch":7,"index":40,"next_region":3,
	 "members":[
	  {"ID":1,"GRPCAddr":"a:1","VerbsAddr":"a:2","RaftAddr":"a:3","RPCAddr":"a:4","State":1,"Descriptors":"ZGVzYw==","Epoch":5},
	  {"ID":2,"GRPCAddr":"b:1","VerbsAddr":"b:2","RaftAddr":"b:3","RPCAddr":"b:4","State":4,"Descriptors":null,"Epoch":7},
	  {"ID":3,"GRPCAddr":"c:1","VerbsAddr":"c:2","RaftAddr":"c:3","RPCAddr":"c:4","State":1,"Descriptors":null,"Epoch":3},
	  {"ID":2000,"GRPCAddr":"d:1","VerbsAddr":"d:2","RaftAddr":"d:3","RPCAddr":"d:4","State":1,"Descriptors":null,"Epoch":6}],
	 "regions":[
	  {"ID":1,"Name":"a","Size":1073741824,"PageSize":4096,"ShardSize":2097152,"Backups":1,"Durability":1,"CreatedAt":"1970-01-01T00:00:01Z","Homes":[1,2,3]},
	  {"ID":2,"Name":"old","Size":1073741824,"PageSize":4096,"ShardSize":2097152,"Backups":1,"Durability":1,"CreatedAt":"1970-01-01T00:00:01Z"}]}`
	v, err := decodeSnapshot([]byte(v1))
	if err != nil {
		t.Fatal(err)
	}
	wantProto := map[ids.NodeID]ids.NodeID{1: 1, 2: 2, 3: 3, 2000: ids.None}
	for _, m := range v.Members() {
		if m.Incarnation != 1 || m.Nonce != 0 || m.Proto != wantProto[m.ID] || m.PastNonces != nil {
			t.Errorf("member %v: %+v", m.ID, m)
		}
	}
	if m, _ := v.Member(1); string(m.Descriptors) != "desc" || m.Epoch != 5 {
		t.Errorf("member 1 lost its record: %+v", m)
	}
	if q := v.Quarantine(); len(q) != 0 {
		t.Errorf("quarantine %+v", q)
	}
	h := v.History(0)
	if len(h) != 1 || h[0].Epoch != 7 || len(h[0].Members) != 3 || h[0].Members[2] != (ProtoMember{Node: 2000, Incarnation: 1, State: StateAlive}) {
		t.Errorf("history %+v", h)
	}
	ra, _ := v.Region("a")
	ro, _ := v.Region("old")
	if !slices.Equal(ra.HomeIncarnations, []uint64{1, 1, 1}) || len(ro.HomeIncarnations) != 0 {
		t.Errorf("home incarnations %v and %v", ra.HomeIncarnations, ro.HomeIncarnations)
	}

	// It re-encodes as version 2 and decodes to the same view.
	b, err := encodeSnapshot(v)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := decodeSnapshot(b)
	if err != nil || !reflect.DeepEqual(v, v2) {
		t.Fatalf("v1 view through a v2 snapshot: %v\n%+v\n%+v", err, v, v2)
	}

	// Nonces: the first is adopted, the next is a restart.
	f := newFSM(newNotifier())
	f.set(v, true)
	first := &Member{ID: 1, GRPCAddr: "a:1", VerbsAddr: "a:2", RaftAddr: "a:3", RPCAddr: "a:4", State: StateAlive, Nonce: 555}
	res := applyAll(t, f, []command{{Type: cmdPutMember, Member: first, KeepDescriptors: true}})[0]
	m, _ := viewOf(f).Member(1)
	if res.Err != nil || m.Incarnation != 1 || m.Nonce != 555 || m.Proto != 1 || string(m.Descriptors) != "desc" || len(viewOf(f).Quarantine()) != 0 {
		t.Fatalf("first nonce of a v1 record: %v %+v", res.Err, m)
	}
	second := *first
	second.Nonce = 556
	applyAll(t, f, []command{{Type: cmdPutMember, Member: &second, KeepDescriptors: true}})
	m, _ = viewOf(f).Member(1)
	if m.Incarnation != 2 || m.Proto != 4 || len(m.Descriptors) != 0 {
		t.Fatalf("second nonce of a v1 record: %+v", m)
	}
	big := &Member{ID: 2000, GRPCAddr: "d:1", VerbsAddr: "d:2", RaftAddr: "d:3", RPCAddr: "d:4", State: StateAlive, Nonce: 777}
	applyAll(t, f, []command{{Type: cmdPutMember, Member: big, KeepDescriptors: true}})
	if m, _ = viewOf(f).Member(2000); m.Incarnation != 1 || m.Proto != 5 || m.Nonce != 777 {
		t.Fatalf("first nonce of a v1 record without protocol id: %+v", m)
	}

	// Malformed version 2 input is refused.
	for name, s := range map[string]string{
		"v1 with history":      `{"version":1,"epoch":1,"history":[{"Epoch":1}]}`,
		"proto twice":          `{"version":2,"epoch":1,"members":[{"ID":1,"State":1,"Incarnation":1,"Proto":1},{"ID":2,"State":1,"Incarnation":1,"Proto":1}]}`,
		"proto quarantined":    `{"version":2,"epoch":1,"members":[{"ID":1,"State":1,"Incarnation":1,"Proto":1}],"quarantine":[{"Proto":1,"LeftAt":1}]}`,
		"proto out of range":   `{"version":2,"epoch":1,"members":[{"ID":1,"State":1,"Incarnation":1,"Proto":1023}]}`,
		"no incarnation":       `{"version":2,"epoch":1,"members":[{"ID":1,"State":1,"Proto":1}]}`,
		"no proto with nonce":  `{"version":2,"epoch":1,"members":[{"ID":1,"State":1,"Incarnation":1,"Nonce":5}]}`,
		"history out of order": `{"version":2,"epoch":3,"history":[{"Epoch":2},{"Epoch":2}]}`,
		"history ahead":        `{"version":2,"epoch":3,"history":[{"Epoch":4}]}`,
		"homes mismatch":       `{"version":2,"epoch":1,"next_region":2,"regions":[{"ID":1,"Name":"a","Size":4096,"PageSize":4096,"ShardSize":2097152,"Backups":1,"Durability":1,"Homes":[1]}]}`,
		"version 5":            `{"version":5}`,
		"marks in version 3":   `{"version":3,"epoch":4,"drains":1,"members":[{"ID":1,"State":1,"Incarnation":1,"Proto":1,"DrainingAt":2}]}`,
		"marks over the count": `{"version":4,"epoch":4,"drains":1,"members":[{"ID":1,"State":1,"Incarnation":1,"Proto":1,"DrainingAt":2}],"quarantine":[{"Proto":2,"LeftAt":3,"DrainingAt":3}]}`,
		"mark ahead":           `{"version":4,"epoch":4,"drains":1,"members":[{"ID":1,"State":1,"Incarnation":1,"Proto":1,"DrainingAt":5}]}`,
	} {
		if _, err := decodeSnapshot([]byte(s)); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: %v, want ErrBadSnapshot", name, err)
		}
	}
}

// A failure verdict is final for an incarnation: the same process is not
// put alive again (neither by its gossip nor by a state change), it
// departed in the epoch of the verdict, which goes with it into the
// quarantine, and a new incarnation starts without it. A member that
// left and comes back departed when it left.
func TestFailedAtIsKeptPerIncarnation(t *testing.T) {
	f := newFSM(newNotifier())
	applyAll(t, f, []command{
		{Type: cmdPutMember, Member: member(1)},
		{Type: cmdPutMember, Member: member(2)},
		{Type: cmdPutMember, Member: member(3)},
		{Type: cmdPutMember, Member: member(4)},
	})
	applyAll(t, f, []command{{Type: cmdSetMemberState, ID: 2, State: StateFailed, Nonce: 102}})
	failed := viewOf(f).Epoch
	if m, _ := viewOf(f).Member(2); m.FailedAt != failed || m.DepartedAt() != failed {
		t.Fatalf("failed member: %+v, want FailedAt and DepartedAt %v", m, failed)
	}
	// The same process, alive again (a healed partition), is refused.
	back := member(2)
	back.FailedAt = 99 // a put cannot choose it
	res := applyAll(t, f, []command{
		{Type: cmdPutMember, Member: back},
		{Type: cmdSetMemberState, ID: 2, State: StateAlive, Nonce: 102},
		{Type: cmdSetMemberState, ID: 2, State: StateFailed, Nonce: 102},
	})
	if !errors.Is(res[0].Err, ErrDeclaredFailed) || !errors.Is(res[1].Err, ErrStaleIncarnation) || res[2].Err != nil {
		t.Fatalf("a failed incarnation put alive again: %v, %v, %v", res[0].Err, res[1].Err, res[2].Err)
	}
	if m, _ := viewOf(f).Member(2); m.State != StateFailed || m.FailedAt != failed || m.LastFailedAt != failed || m.Failures != 1 || viewOf(f).Epoch != failed {
		t.Fatalf("after the refusals: %+v in epoch %v, want failed in %v", m, viewOf(f).Epoch, failed)
	}
	// A new incarnation starts clean; the old one's failure goes into the
	// quarantine, and it left when it failed.
	applyAll(t, f, []command{{Type: cmdPutMember, Member: restartOf(2, 2)}})
	v := viewOf(f)
	if m, _ := v.Member(2); m.Incarnation != 2 || m.FailedAt != 0 || m.LastFailedAt != 0 || m.Failures != 0 || m.State != StateAlive {
		t.Fatalf("new incarnation: %+v", m)
	}
	if q := v.Quarantine(); len(q) != 1 || q[0].FailedAt != failed || q[0].LastFailedAt != failed || q[0].Failures != 1 || q[0].LeftAt != failed {
		t.Fatalf("quarantine %+v, want FailedAt and LeftAt %v", q, failed)
	}
	// Node 4 fails and is then removed (left): it still departed when it
	// failed, and a late "alive" changes nothing.
	applyAll(t, f, []command{{Type: cmdSetMemberState, ID: 4, State: StateFailed, Nonce: 104}})
	failed4 := viewOf(f).Epoch
	res = applyAll(t, f, []command{
		{Type: cmdSetMemberState, ID: 4, State: StateLeft, Nonce: 104},
		{Type: cmdSetMemberState, ID: 4, State: StateFailed, Nonce: 104},
		{Type: cmdSetMemberState, ID: 4, State: StateAlive, Nonce: 104},
	})
	if m, _ := viewOf(f).Member(4); m.State != StateLeft || m.DepartedAt() != failed4 || res[0].Err != nil || res[1].Err != nil || !errors.Is(res[2].Err, ErrStaleIncarnation) {
		t.Fatalf("failed, then removed: %+v (departed %v, want %v); %v %v %v", m, m.DepartedAt(), failed4, res[0].Err, res[1].Err, res[2].Err)
	}
	// Node 3 leaves, then comes back as a new process: its old id departed
	// in the epoch it left.
	applyAll(t, f, []command{{Type: cmdSetMemberState, ID: 3, State: StateLeft, Nonce: 103}})
	left := viewOf(f).Epoch
	applyAll(t, f, []command{{Type: cmdPutMember, Member: restartOf(3, 2)}})
	q := viewOf(f).Quarantine()
	if len(q) != 2 || q[1].Proto != 3 || q[1].LeftAt != left || q[1].FailedAt != 0 {
		t.Fatalf("quarantine %+v, want n3 left in %v", q, left)
	}
}
