package placement

import (
	"errors"
	"reflect"
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
)

func sampleCheckpoint() *Checkpoint {
	c := &Checkpoint{At: 41}
	seen := map[string]uint32{}
	a := ShardState{Chain: []ids.NodeID{3, 7, 9}, Home: 1, Since: []Entered{{7, 12}, {9, 30}}, Last: 40}
	b := ShardState{Chain: []ids.NodeID{5, 2}, Home: 0, Since: []Entered{{5, 3}}, Loaded: []Entered{{5, 3}},
		LostAt: 0, Candidates: []ids.NodeID{2, 4}, Reset: true, Last: 38}
	for _, st := range []ShardState{a, b, a, a, b} {
		c.Add(st, seen)
	}
	return c
}

// A checkpoint decodes to what was encoded, each distinct state once.
func TestCheckpointRoundTrip(t *testing.T) {
	c := sampleCheckpoint()
	if len(c.States) != 2 {
		t.Fatalf("%d states stored for 2 distinct ones", len(c.States))
	}
	got, err := DecodeCheckpoint(c.Encode(), 5)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, c) {
		t.Fatalf("decoded %+v, want %+v", got, c)
	}
	if st := got.State(3); st.Home != 1 || st.Chain[st.Home] != 7 {
		t.Fatalf("shard 3: %+v", st)
	}
}

// Malformed bytes are an error, never a panic or a wrong checkpoint.
func TestCheckpointRefusesMalformed(t *testing.T) {
	good := sampleCheckpoint().Encode()
	if _, err := DecodeCheckpoint(good, 4); !errors.Is(err, ErrBadCheckpoint) {
		t.Fatalf("another shard count: %v", err)
	}
	for i := range good {
		if _, err := DecodeCheckpoint(good[:i], 5); err == nil {
			t.Fatalf("truncated to %d bytes: decoded", i)
		}
	}
	bad := ShardState{Chain: []ids.NodeID{3}, Home: 2}
	c := &Checkpoint{At: 1}
	c.Add(bad, map[string]uint32{})
	if _, err := DecodeCheckpoint(c.Encode(), 1); !errors.Is(err, ErrBadCheckpoint) {
		t.Fatalf("home out of the chain: %v", err)
	}
	c = &Checkpoint{At: 1}
	c.Add(ShardState{Chain: []ids.NodeID{3}, Since: []Entered{{4, 1}}}, map[string]uint32{})
	if _, err := DecodeCheckpoint(c.Encode(), 1); !errors.Is(err, ErrBadCheckpoint) {
		t.Fatalf("a set member outside the chain: %v", err)
	}
	if _, err := DecodeCheckpoint(append(good, 0), 5); !errors.Is(err, ErrBadCheckpoint) {
		t.Fatalf("a byte after the end: %v", err)
	}
}

// FuzzDecodeCheckpoint: no input makes the decoder panic, and what
// decodes encodes back to the same bytes.
func FuzzDecodeCheckpoint(f *testing.F) {
	f.Add(sampleCheckpoint().Encode(), uint64(5))
	f.Add([]byte{1, 0, 0, 0}, uint64(0))
	f.Add([]byte{1, 5, 1, 1, 1, 3, 0, 0, 0, 0, 0, 0, 9, 0}, uint64(1))
	f.Fuzz(func(t *testing.T, b []byte, shards uint64) {
		c, err := DecodeCheckpoint(b, shards)
		if err != nil {
			if !errors.Is(err, ErrBadCheckpoint) {
				t.Fatalf("error %v is not ErrBadCheckpoint", err)
			}
			return
		}
		if uint64(len(c.Shards)) != shards {
			t.Fatalf("%d shards decoded, %d asked for", len(c.Shards), shards)
		}
		for i := range c.Shards {
			st := c.State(uint64(i))
			if st.Home < 0 || st.Home >= len(st.Chain) {
				t.Fatalf("shard %d: home %d of %d", i, st.Home, len(st.Chain))
			}
		}
		again, err := DecodeCheckpoint(c.Encode(), shards)
		if err != nil || !reflect.DeepEqual(again, c) {
			t.Fatalf("re-encoded: %v, %+v, want %+v", err, again, c)
		}
	})
}
