package placement

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/dsmkit/dsm/internal/ids"
)

// A Checkpoint is the placement of every shard of a region after every
// event up to a directory epoch, as the data plane's placement walk left
// it (node/placement.go): for each shard its chain of protocol ids (the
// members alive then, and a lost shard's departed home), the index of its
// home, the epoch since which each member of its replica set has been in
// it, and what a loss recorded. A walk that starts from a checkpoint and
// takes the events after its epoch places every shard as a walk from the
// region's creation does, without the records of the incarnations that
// had departed by then; so the directory can drop those records once a
// checkpoint is committed (docs/failover.md, "Forgetting departed
// incarnations").
//
// The encoding is the directory's, carried in a Raft command and in
// snapshots, so it is decoded from untrusted bytes (FuzzDecodeCheckpoint):
//
//	version u8 (1), at uvarint, shards uvarint, states uvarint,
//	states x state, shards x (state index uvarint)
//	state: chain (count uvarint, count x proto uvarint), home uvarint,
//	       since (count uvarint, count x (proto uvarint, epoch uvarint)),
//	       loaded (likewise), lost-at uvarint,
//	       candidates (count uvarint, count x node uvarint),
//	       reset u8 (0 or 1), last uvarint
//
// Equal states are stored once: most shards of a large region share one
// of a few.
type Checkpoint struct {
	// At is the directory epoch up to which the states took every event.
	At ids.Epoch
	// States are the distinct shard states; Shards gives each shard's
	// index among them.
	States []ShardState
	Shards []uint32
}

// ShardState is one shard's placement in a Checkpoint. Its slices are
// shared: do not modify them.
type ShardState struct {
	Chain []ids.NodeID // protocol ids
	Home  int          // index in Chain
	// Since are the members of the replica set with the epoch they
	// entered it, Loaded the members that became home of a lost shard by
	// a revival, with its epoch; both sorted by protocol id.
	Since, Loaded []Entered
	// LostAt is the epoch in which the shard's home departed with no
	// complete member after it (0: not lost); Candidates are then the
	// nodes (node ids) whose stores hold the shard.
	LostAt     ids.Epoch
	Candidates []ids.NodeID
	// Reset: the shard started over empty (contents lost at restart).
	Reset bool
	// Last is the epoch of the latest event the walk took.
	Last ids.Epoch
}

// Entered is a member of a shard's replica set and an epoch.
type Entered struct {
	Proto ids.NodeID
	At    ids.Epoch
}

// State is the state of shard i.
func (c *Checkpoint) State(i uint64) *ShardState { return &c.States[c.Shards[i]] }

// checkpointVersion is the first byte of an encoded Checkpoint.
const checkpointVersion = 1

// maxChain bounds a chain's and a list's length in a decoded checkpoint:
// a protocol id names one of at most 1022 incarnations (coherence's
// MaxNodeID), and a chain holds each once.
const maxChain = 1024

// Add appends shard state st as the next shard's, stored once with every
// equal state added before (seen indexes them by their encoding; pass the
// same map to every Add of one checkpoint).
func (c *Checkpoint) Add(st ShardState, seen map[string]uint32) {
	key := string(appendState(nil, st))
	i, ok := seen[key]
	if !ok {
		i = uint32(len(c.States))
		seen[key] = i
		c.States = append(c.States, st)
	}
	c.Shards = append(c.Shards, i)
}

// Encode is the checkpoint's encoding.
func (c *Checkpoint) Encode() []byte {
	b := []byte{checkpointVersion}
	b = binary.AppendUvarint(b, uint64(c.At))
	b = binary.AppendUvarint(b, uint64(len(c.Shards)))
	b = binary.AppendUvarint(b, uint64(len(c.States)))
	for _, st := range c.States {
		b = appendState(b, st)
	}
	for _, i := range c.Shards {
		b = binary.AppendUvarint(b, uint64(i))
	}
	return b
}

func appendState(b []byte, st ShardState) []byte {
	b = binary.AppendUvarint(b, uint64(len(st.Chain)))
	for _, p := range st.Chain {
		b = binary.AppendUvarint(b, uint64(p))
	}
	b = binary.AppendUvarint(b, uint64(st.Home))
	for _, es := range [][]Entered{st.Since, st.Loaded} {
		b = binary.AppendUvarint(b, uint64(len(es)))
		for _, e := range es {
			b = binary.AppendUvarint(b, uint64(e.Proto))
			b = binary.AppendUvarint(b, uint64(e.At))
		}
	}
	b = binary.AppendUvarint(b, uint64(st.LostAt))
	b = binary.AppendUvarint(b, uint64(len(st.Candidates)))
	for _, n := range st.Candidates {
		b = binary.AppendUvarint(b, uint64(n))
	}
	reset := byte(0)
	if st.Reset {
		reset = 1
	}
	b = append(b, reset)
	return binary.AppendUvarint(b, uint64(st.Last))
}

// ErrBadCheckpoint: bytes that are no checkpoint of the region.
var ErrBadCheckpoint = errors.New("placement: malformed checkpoint")

// DecodeCheckpoint decodes a checkpoint of a region of `shards` shards. It
// checks every count against the bytes present and every index against
// what it indexes, and never panics.
func DecodeCheckpoint(b []byte, shards uint64) (*Checkpoint, error) {
	d := decoder{b: b}
	if v := d.byte(); d.err == nil && v != checkpointVersion {
		return nil, fmt.Errorf("%w: version %d", ErrBadCheckpoint, v)
	}
	c := &Checkpoint{At: ids.Epoch(d.uvarint())}
	n, ns := d.uvarint(), d.uvarint()
	switch {
	case d.err != nil:
		return nil, d.err
	case n != shards:
		return nil, fmt.Errorf("%w: %d shards, the region has %d", ErrBadCheckpoint, n, shards)
	case ns == 0 && n > 0 || ns > n || ns > uint64(len(d.b)):
		return nil, fmt.Errorf("%w: %d states for %d shards in %d bytes", ErrBadCheckpoint, ns, n, len(d.b))
	case n > uint64(len(d.b)):
		return nil, fmt.Errorf("%w: %d shards in %d bytes", ErrBadCheckpoint, n, len(d.b))
	}
	c.States = make([]ShardState, 0, ns)
	for range ns {
		c.States = append(c.States, d.state())
		if d.err != nil {
			return nil, d.err
		}
	}
	c.Shards = make([]uint32, 0, n)
	for range n {
		i := d.uvarint()
		if d.err == nil && i >= ns {
			d.fail("shard state %d of %d", i, ns)
		}
		if d.err != nil {
			return nil, d.err
		}
		c.Shards = append(c.Shards, uint32(i))
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the end", ErrBadCheckpoint, len(d.b))
	}
	return c, nil
}

// decoder reads an encoding, keeping the first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrBadCheckpoint}, args...)...)
	}
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail("truncated")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("truncated or overlong number")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a list's length, at most maxChain.
func (d *decoder) count() int {
	n := d.uvarint()
	if n > maxChain {
		d.fail("a list of %d", n)
		return 0
	}
	return int(n)
}

// id reads a protocol or node id.
func (d *decoder) id() ids.NodeID {
	v := d.uvarint()
	if v == 0 || v > uint64(^uint32(0)) {
		d.fail("id %d", v)
		return 0
	}
	return ids.NodeID(v)
}

func (d *decoder) state() ShardState {
	var st ShardState
	n := d.count()
	if n == 0 && d.err == nil {
		d.fail("an empty chain")
	}
	for range n {
		st.Chain = append(st.Chain, d.id())
	}
	if h := d.uvarint(); d.err == nil && h >= uint64(len(st.Chain)) {
		d.fail("home %d of a chain of %d", h, len(st.Chain))
	} else {
		st.Home = int(h)
	}
	for _, es := range []*[]Entered{&st.Since, &st.Loaded} {
		n := d.count()
		for range n {
			e := Entered{Proto: d.id(), At: ids.Epoch(d.uvarint())}
			if d.err == nil && !slices.Contains(st.Chain, e.Proto) {
				d.fail("%v is in no chain position", e.Proto)
			}
			*es = append(*es, e)
		}
	}
	st.LostAt = ids.Epoch(d.uvarint())
	n = d.count()
	for range n {
		st.Candidates = append(st.Candidates, d.id())
	}
	switch r := d.byte(); {
	case d.err != nil:
	case r > 1:
		d.fail("reset %d", r)
	default:
		st.Reset = r == 1
	}
	st.Last = ids.Epoch(d.uvarint())
	if d.err != nil {
		return ShardState{}
	}
	return st
}
