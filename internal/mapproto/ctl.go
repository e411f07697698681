package mapproto

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// Control messages: region calls for clients that do not speak gRPC (the C
// library). A connection whose first message is a control request is a
// control session: every request gets one answer (a control reply, or an
// Error, after which the session goes on), until the client closes the
// socket. See the package documentation.
const (
	// TypeCreate creates the region Name (Size bytes, PageSize, 0: the
	// default, Durability) unless one of that spec exists; answered by
	// Region (Existed says which).
	TypeCreate Type = 32 + iota
	// TypeLookup asks for the region Name; answered by Region.
	TypeLookup
	// TypeDelete deletes the region Name (Force: even while it is mapped);
	// answered by Done (Count: the mappings cut).
	TypeDelete
	// TypeSync writes back [Offset, Offset+Len) of region Name (Len 0: to
	// the end) from this node's cache; answered by Done (Count: pages
	// written).
	TypeSync
	// TypeSessionsAlive asks about mapping sessions by their tokens;
	// answered by States, one per token, in order.
	TypeSessionsAlive
	ctlRequestEnd
)

// Control replies.
const (
	// TypeRegion describes a region: Region, Size, PageSize, Durability
	// and, in answer to Create, Existed.
	TypeRegion Type = 48 + iota
	// TypeDone acknowledges Delete or Sync with a Count.
	TypeDone
	// TypeStates answers SessionsAlive.
	TypeStates
	ctlReplyEnd
)

// MaxTokens is the most tokens one SessionsAlive may carry.
const MaxTokens = 256

// Durability of a region in control messages. The zero value, in Create,
// asks for the default (DurabilityMemory).
type Durability uint8

const (
	DurabilityMemory  Durability = 1 + iota // lost when its holders die, unless synced
	DurabilityDurable                       // persisted when synced
	durabilityEnd
)

// SessionState is what dsmd knows of a mapping session. The zero value is
// invalid.
type SessionState uint8

const (
	SessionUnknown SessionState = 1 + iota // dsmd cannot tell (a member unreachable)
	SessionAlive                           // still served
	SessionDead                            // over for good
	sessionStateEnd
)

// IsControl reports whether t is a control request or reply.
func IsControl(t Type) bool {
	return t >= TypeCreate && t < ctlRequestEnd || t >= TypeRegion && t < ctlReplyEnd
}

// Ctl is one control message. Which fields are meaningful depends on Type:
//
//	Create:        Name, Size, PageSize, Durability
//	Lookup:        Name
//	Delete:        Name, Force
//	Sync:          Name, Offset, Len
//	SessionsAlive: Tokens (1 to MaxTokens)
//	Region:        Region, Size, PageSize, Durability, Existed
//	Done:          Count
//	States:        States (1 to MaxTokens)
type Ctl struct {
	Type       Type
	Name       string
	Size       uint64
	PageSize   uint32
	Durability Durability
	Force      bool
	Offset     uint64
	Len        uint64
	Tokens     []uint64
	Region     uint32
	Existed    bool
	Count      uint64
	States     []SessionState
}

// EncodeCtl returns the wire form of m; it fails on a message DecodeCtl
// would refuse.
func EncodeCtl(m Ctl) ([]byte, error) {
	b := make([]byte, 0, 64)
	b = append(b, Version, byte(m.Type))
	le := binary.LittleEndian
	switch m.Type {
	case TypeCreate, TypeLookup, TypeDelete, TypeSync:
		if len(m.Name) == 0 || len(m.Name) > MaxName || !utf8.ValidString(m.Name) {
			return nil, fmt.Errorf("%w: region name %q", ErrMalformed, m.Name)
		}
		b = appendString(b, m.Name)
	}
	switch m.Type {
	case TypeCreate:
		if m.Durability >= durabilityEnd {
			return nil, fmt.Errorf("%w: durability %d", ErrMalformed, m.Durability)
		}
		b = le.AppendUint64(b, m.Size)
		b = le.AppendUint32(b, m.PageSize)
		b = append(b, byte(m.Durability))
	case TypeLookup:
	case TypeDelete:
		b = append(b, boolByte(m.Force))
	case TypeSync:
		b = le.AppendUint64(b, m.Offset)
		b = le.AppendUint64(b, m.Len)
	case TypeSessionsAlive:
		if len(m.Tokens) == 0 || len(m.Tokens) > MaxTokens {
			return nil, fmt.Errorf("%w: %d tokens", ErrMalformed, len(m.Tokens))
		}
		b = le.AppendUint16(b, uint16(len(m.Tokens)))
		for _, t := range m.Tokens {
			b = le.AppendUint64(b, t)
		}
	case TypeRegion:
		if m.Durability == 0 || m.Durability >= durabilityEnd {
			return nil, fmt.Errorf("%w: durability %d", ErrMalformed, m.Durability)
		}
		b = le.AppendUint32(b, m.Region)
		b = le.AppendUint64(b, m.Size)
		b = le.AppendUint32(b, m.PageSize)
		b = append(b, byte(m.Durability), boolByte(m.Existed))
	case TypeDone:
		b = le.AppendUint64(b, m.Count)
	case TypeStates:
		if len(m.States) == 0 || len(m.States) > MaxTokens {
			return nil, fmt.Errorf("%w: %d states", ErrMalformed, len(m.States))
		}
		b = le.AppendUint16(b, uint16(len(m.States)))
		for _, s := range m.States {
			if s == 0 || s >= sessionStateEnd {
				return nil, fmt.Errorf("%w: session state %d", ErrMalformed, s)
			}
			b = append(b, byte(s))
		}
	default:
		return nil, fmt.Errorf("%w: control type %s", ErrMalformed, m.Type)
	}
	return b, nil
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// DecodeCtl parses one control message. It never panics; any defect is an
// error wrapping ErrMalformed (or ErrVersion). A message of the mapping
// session (Map, Error, ...) is malformed here.
func DecodeCtl(b []byte) (Ctl, error) {
	if len(b) < 2 {
		return Ctl{}, fmt.Errorf("%w: %d bytes", ErrMalformed, len(b))
	}
	if b[0] != Version {
		return Ctl{}, fmt.Errorf("%w: %d (want %d)", ErrVersion, b[0], Version)
	}
	m := Ctl{Type: Type(b[1])}
	if !IsControl(m.Type) {
		return Ctl{}, fmt.Errorf("%w: %s is no control message", ErrMalformed, m.Type)
	}
	d := decoder{b: b[2:]}
	switch m.Type {
	case TypeCreate, TypeLookup, TypeDelete, TypeSync:
		m.Name = d.str()
		if d.err == nil && (len(m.Name) == 0 || len(m.Name) > MaxName) {
			d.fail("region name of %d bytes", len(m.Name))
		}
	}
	switch m.Type {
	case TypeCreate:
		m.Size = d.u64()
		m.PageSize = d.u32()
		m.Durability = Durability(d.u8())
		if d.err == nil && m.Durability >= durabilityEnd {
			d.fail("durability %d", m.Durability)
		}
	case TypeLookup:
	case TypeDelete:
		m.Force = d.flag()
	case TypeSync:
		m.Offset = d.u64()
		m.Len = d.u64()
	case TypeSessionsAlive:
		n := d.count()
		for i := 0; i < n && d.err == nil; i++ {
			m.Tokens = append(m.Tokens, d.u64())
		}
	case TypeRegion:
		m.Region = d.u32()
		m.Size = d.u64()
		m.PageSize = d.u32()
		m.Durability = Durability(d.u8())
		if d.err == nil && (m.Durability == 0 || m.Durability >= durabilityEnd) {
			d.fail("durability %d", m.Durability)
		}
		m.Existed = d.flag()
	case TypeDone:
		m.Count = d.u64()
	case TypeStates:
		n := d.count()
		for i := 0; i < n && d.err == nil; i++ {
			s := SessionState(d.u8())
			if d.err == nil && (s == 0 || s >= sessionStateEnd) {
				d.fail("session state %d", s)
			}
			m.States = append(m.States, s)
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes after %s", len(d.b), m.Type)
	}
	if d.err != nil {
		return Ctl{}, d.err
	}
	return m, nil
}

func (d *decoder) u8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

// flag reads a boolean byte: 0 or 1.
func (d *decoder) flag() bool {
	v := d.u8()
	if d.err == nil && v > 1 {
		d.fail("flag %d", v)
	}
	return v == 1
}

// count reads the length of a list: 1 to MaxTokens, each element at least
// one byte of what is left.
func (d *decoder) count() int {
	n := int(d.u16())
	if d.err == nil && (n == 0 || n > MaxTokens || n > len(d.b)) {
		d.fail("list of %d elements", n)
		return 0
	}
	return n
}

func (d Durability) String() string {
	switch d {
	case DurabilityMemory:
		return "memory"
	case DurabilityDurable:
		return "durable"
	}
	return fmt.Sprintf("durability(%d)", uint8(d))
}

func (s SessionState) String() string {
	switch s {
	case SessionUnknown:
		return "unknown"
	case SessionAlive:
		return "alive"
	case SessionDead:
		return "dead"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}
