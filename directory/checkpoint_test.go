package directory

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
)

// checkpointOf is a checkpoint of epoch at for a region of n shards (each
// shard at protocol id 1: the FSM does not read the states).
func checkpointOf(at ids.Epoch, n int) []byte {
	cp := &placement.Checkpoint{At: at}
	seen := map[string]uint32{}
	for range n {
		cp.Add(placement.ShardState{Chain: []ids.NodeID{1}, Since: []placement.Entered{{Proto: 1, At: 1}}, Last: at}, seen)
	}
	return cp.Encode()
}

// TestFSMCheckpoint: a placement checkpoint drops the fill records of the
// incarnations that had departed by its epoch and the promotion records up
// to it, keeps everything else (the count of promotions included), moves
// no epoch, and survives a snapshot; a retry changes nothing; a checkpoint
// that is malformed, of another shard count, of an unknown region, of a
// future epoch, or not after the current one is refused.
func TestFSMCheckpoint(t *testing.T) {
	f := newFSM(newNotifier())
	one, two, three := member(1), member(2), member(3)
	three2 := member(3)
	three2.Nonce++
	filled := func(m *Member, since ids.Epoch, rs ...ShardRange) command {
		return command{Type: cmdFilled, Region: 1, ID: m.ID, Nonce: m.Nonce, Since: since, Shards: rs}
	}
	checkpoint := func(region ids.RegionID, b []byte) command {
		return command{Type: cmdCheckpoint, Region: region, Checkpoint: b}
	}
	res := applyAll(t, f, []command{
		{Type: cmdPutMember, Member: one},                                                    // 0: e1
		{Type: cmdPutMember, Member: two},                                                    // 1: e2
		{Type: cmdPutMember, Member: three},                                                  // 2: e3
		createRegionCmd(RegionSpec{Name: "r", Size: 64 << 20}, time.Unix(1, 0)),              // 3: 32 shards, created in e3
		filled(three, 3, ShardRange{0, 8}),                                                   // 4
		filled(two, 3, ShardRange{8, 16}),                                                    // 5
		{Type: cmdPromote, Region: 1, ID: 2, Nonce: two.Nonce, Shards: []ShardRange{{8, 9}}}, // 6: e4
		{Type: cmdPutMember, Member: three2},                                                 // 7: n3 restarts, e5
		filled(three2, 5, ShardRange{16, 20}),                                                // 8
		checkpoint(1, checkpointOf(6, 32)),                                                   // 9: future epoch
		checkpoint(1, checkpointOf(5, 31)),                                                   // 10: another shard count
		checkpoint(1, checkpointOf(5, 32)[:20]),                                              // 11: truncated
		checkpoint(2, checkpointOf(5, 32)),                                                   // 12: no region
		checkpoint(1, checkpointOf(2, 32)),                                                   // 13: before the region
		checkpoint(1, checkpointOf(5, 32)),                                                   // 14: kept
		checkpoint(1, checkpointOf(5, 32)),                                                   // 15: a retry
		checkpoint(1, checkpointOf(4, 32)),                                                   // 16: older
	})
	for i, want := range []error{9: ErrBadCommand, 10: ErrBadCommand, 11: ErrBadCommand, 12: ErrNoRegion, 13: ErrBadCommand,
		14: nil, 15: nil, 16: ErrStaleCheckpoint} {
		if i < 9 {
			if res[i].Err != nil {
				t.Fatalf("command %d: %v", i, res[i].Err)
			}
			continue
		}
		if !errors.Is(res[i].Err, want) || (want == nil && res[i].Err != nil) {
			t.Errorf("command %d: %v, want %v", i, res[i].Err, want)
		}
	}
	if res[14].Epoch != 5 {
		t.Errorf("the checkpoint moved the epoch to %v", res[14].Epoch)
	}
	v, _ := f.current()
	r, _ := v.Region("r")
	m3, _ := v.Member(3)
	wantFilled := []FillRecord{
		{Node: 2, Incarnation: 1, Proto: 2, Since: 3, At: 3, Shards: []ShardRange{{8, 16}}},
		{Node: 3, Incarnation: 2, Proto: m3.Proto, Since: 5, At: 5, Shards: []ShardRange{{16, 20}}},
	}
	if !reflect.DeepEqual(r.Filled, wantFilled) || len(r.Promoted) != 0 || v.Promotions() != 1 {
		t.Fatalf("after the checkpoint: fill records %+v, promotions %+v (count %d); want %+v and none (count 1)",
			r.Filled, r.Promoted, v.Promotions(), wantFilled)
	}
	if r.CheckpointAt != 5 || !reflect.DeepEqual(r.Checkpoint, checkpointOf(5, 32)) {
		t.Fatalf("the region's checkpoint: epoch %v, %d bytes", r.CheckpointAt, len(r.Checkpoint))
	}
	if st := stateOf(v); st.Version != snapshotVersionCheckpoints {
		t.Fatalf("a snapshot with a checkpoint is version %d", st.Version)
	}
	v2 := snapshotRoundTrip(t, v)
	if r2, _ := v2.Region("r"); r2.CheckpointAt != 5 || !reflect.DeepEqual(r2.Checkpoint, r.Checkpoint) || !reflect.DeepEqual(r2.Filled, wantFilled) {
		t.Fatalf("after a snapshot: %+v", r2)
	}
	// A checkpoint in a version 2 snapshot (which a version before
	// checkpoints would read) is refused.
	st := stateOf(v)
	st.Version = snapshotVersion
	if b, err := json.Marshal(st); err != nil {
		t.Fatal(err)
	} else if _, err := decodeSnapshot(b); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("a version 2 snapshot with a checkpoint: %v", err)
	}
	// A snapshot whose checkpoint does not decode is refused.
	bad := *v
	rs := append([]Region(nil), v.regions...)
	rs[0].Checkpoint = rs[0].Checkpoint[:10]
	bad.setRegions(rs)
	if b, err := encodeSnapshot(&bad); err != nil {
		t.Fatal(err)
	} else if _, err := decodeSnapshot(b); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("a snapshot with a truncated checkpoint: %v", err)
	}
}

// A checkpoint command carries a region and bytes, nothing else; no other
// command carries a checkpoint.
func TestDecodeCheckpointCommand(t *testing.T) {
	for _, c := range []command{
		{Type: cmdCheckpoint, Checkpoint: []byte{1}},
		{Type: cmdCheckpoint, Region: 1},
		{Type: cmdCheckpoint, Region: 1, Checkpoint: []byte{1}, ID: 2},
		{Type: cmdCheckpoint, Region: 1, Checkpoint: make([]byte, MaxCheckpointSize+1)},
		{Type: cmdPromote, Region: 1, ID: 2, Nonce: 3, Shards: []ShardRange{{0, 1}}, Checkpoint: []byte{1}},
	} {
		if _, err := decodeCommand(encodeCommand(c)); !errors.Is(err, ErrBadCommand) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	c := command{Type: cmdCheckpoint, Region: 1, Checkpoint: make([]byte, MaxCheckpointSize)}
	if _, err := decodeCommand(encodeCommand(c)); err != nil {
		t.Fatalf("a checkpoint of the largest size: %v", err)
	}
	// It reaches the leader in one rpc frame.
	if b, err := json.Marshal(rpcRequest{Op: opApply, Cmd: encodeCommand(c)}); err != nil || len(b) > maxFrame {
		t.Fatalf("the largest checkpoint's rpc request: %d bytes, more than %d (%v)", len(b), maxFrame, err)
	}
}
