package directory

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
)

// cmdType is the kind of a replicated command.
type cmdType uint8

const (
	cmdCreateRegion cmdType = 1 + iota
	cmdDeleteRegion
	cmdPutMember
	cmdSetMemberState
	cmdSetRegionAccess
	cmdSetDraining
	cmdFilled
	cmdPromote
	cmdCheckpoint
)

// commandVersion is the first byte of every encoded command.
const commandVersion = 1

// maxCommandSize bounds a command; larger input is refused before decoding.
// The largest is a checkpoint (MaxCheckpointSize, in base64), which also
// fits in an rpc frame (maxFrame) once more in base64.
const maxCommandSize = 600 << 10

// MaxCheckpointSize bounds an encoded placement checkpoint
// (RecordCheckpoint).
const MaxCheckpointSize = 384 << 10

// command is one entry of the Raft log. Every command is idempotent, so a
// proposer may retry one whose outcome it did not learn.
type command struct {
	Type cmdType `json:"t"`
	// cmdCreateRegion
	Spec      *RegionSpec `json:"spec,omitempty"`
	CreatedAt int64       `json:"at,omitempty"` // unix nanoseconds, stamped by the proposer
	// cmdCreateRegion (the region's access if it is created) and
	// cmdSetRegionAccess (nil: open).
	Access *Access `json:"access,omitempty"`
	// cmdDeleteRegion, cmdSetRegionAccess
	Name string `json:"name,omitempty"`
	// cmdPutMember
	Member *Member `json:"member,omitempty"`
	// KeepDescriptors leaves the stored descriptors alone (gossip-driven
	// updates know addresses, not descriptors).
	KeepDescriptors bool `json:"keep,omitempty"`
	// cmdSetMemberState, cmdSetDraining (ID and Nonce)
	ID    ids.NodeID  `json:"id,omitempty"`
	State MemberState `json:"state,omitempty"`
	// Nonce, if not 0, names the incarnation the new state is for: the
	// command changes nothing if another incarnation holds the node id.
	Nonce uint64 `json:"nonce,omitempty"`
	// HandOver (cmdSetDraining): the mark is one the data plane places by
	// (Member.DrainingAt); false in the commands of versions before
	// hand-overs, which replay as they applied then.
	HandOver bool `json:"handover,omitempty"`
	// cmdFilled (with ID and Nonce: the incarnation filled), cmdPromote
	// (Region and Shards, with ID and Nonce: the incarnation promoted)
	Region ids.RegionID `json:"region,omitempty"`
	Since  ids.Epoch    `json:"since,omitempty"`
	Shards []ShardRange `json:"shards,omitempty"`
	// cmdCheckpoint (with Region): placement.Checkpoint, encoded.
	Checkpoint []byte `json:"checkpoint,omitempty"`
}

func encodeCommand(c command) []byte {
	b, err := json.Marshal(c)
	if err != nil {
		// Every field is a plain value; marshalling cannot fail.
		panic("directory: encode command: " + err.Error())
	}
	return append([]byte{commandVersion}, b...)
}

// decodeCommand parses and validates a command. It never panics; every
// failure wraps ErrBadCommand (or ErrInvalidRegion / ErrInvalidMember for a
// well-formed command with bad content).
func decodeCommand(b []byte) (command, error) {
	var c command
	if len(b) == 0 {
		return c, fmt.Errorf("%w: empty", ErrBadCommand)
	}
	if len(b) > maxCommandSize {
		return c, fmt.Errorf("%w: %d bytes", ErrBadCommand, len(b))
	}
	if b[0] != commandVersion {
		return c, fmt.Errorf("%w: version %d", ErrBadCommand, b[0])
	}
	dec := json.NewDecoder(bytes.NewReader(b[1:]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return command{}, fmt.Errorf("%w: %v", ErrBadCommand, err)
	}
	if dec.More() {
		return command{}, fmt.Errorf("%w: trailing data", ErrBadCommand)
	}
	if c.Access != nil && c.Type != cmdCreateRegion && c.Type != cmdSetRegionAccess {
		return command{}, fmt.Errorf("%w: access in a command of type %d", ErrBadCommand, c.Type)
	}
	if _, err := c.Access.Normalize(); err != nil {
		return command{}, err
	}
	switch c.Type {
	case cmdCreateRegion:
		if c.Spec == nil {
			return command{}, fmt.Errorf("%w: create without spec", ErrBadCommand)
		}
		if _, err := c.Spec.Normalize(); err != nil {
			return command{}, err
		}
	case cmdDeleteRegion, cmdSetRegionAccess:
		if err := validName(c.Name); err != nil {
			return command{}, err
		}
	case cmdPutMember:
		if c.Member == nil {
			return command{}, fmt.Errorf("%w: put without member", ErrBadCommand)
		}
		if err := c.Member.validate(); err != nil {
			return command{}, err
		}
		if c.Member.State != StateAlive {
			return command{}, fmt.Errorf("%w: put of a %v member", ErrInvalidMember, c.Member.State)
		}
	case cmdSetMemberState:
		if c.ID == ids.None {
			return command{}, fmt.Errorf("%w: zero id", ErrInvalidMember)
		}
		if c.State != StateLeft && c.State != StateFailed && c.State != StateAlive {
			return command{}, fmt.Errorf("%w: cannot set state %v", ErrInvalidMember, c.State)
		}
	case cmdSetDraining:
		if c.ID == ids.None || c.Nonce == 0 {
			return command{}, fmt.Errorf("%w: draining needs an id and a nonce", ErrInvalidMember)
		}
	case cmdFilled, cmdPromote:
		if c.ID == ids.None || c.Nonce == 0 || c.Region == 0 {
			return command{}, fmt.Errorf("%w: a fill or promotion record needs a region, an id and a nonce", ErrBadCommand)
		}
		if err := validShardRanges(c.Shards, 0); err != nil {
			return command{}, err
		}
		if c.Type == cmdPromote && (c.Since != 0 || len(c.Shards) == 0) {
			return command{}, fmt.Errorf("%w: a promotion names shards and no fill epoch", ErrBadCommand)
		}
	case cmdCheckpoint:
		if c.Region == 0 || len(c.Checkpoint) == 0 || len(c.Checkpoint) > MaxCheckpointSize || c.ID != ids.None || c.Since != 0 || c.Shards != nil {
			return command{}, fmt.Errorf("%w: a checkpoint names a region and carries up to %d bytes", ErrBadCommand, MaxCheckpointSize)
		}
	default:
		return command{}, fmt.Errorf("%w: type %d", ErrBadCommand, c.Type)
	}
	if c.Type != cmdFilled && c.Type != cmdPromote && c.Type != cmdCheckpoint && (c.Region != 0 || c.Since != 0 || c.Shards != nil) {
		return command{}, fmt.Errorf("%w: fill fields in a command of type %d", ErrBadCommand, c.Type)
	}
	if c.Type != cmdCheckpoint && c.Checkpoint != nil {
		return command{}, fmt.Errorf("%w: a checkpoint in a command of type %d", ErrBadCommand, c.Type)
	}
	return c, nil
}

func createRegionCmd(spec RegionSpec, at time.Time) command {
	return command{Type: cmdCreateRegion, Spec: &spec, CreatedAt: at.UnixNano()}
}
