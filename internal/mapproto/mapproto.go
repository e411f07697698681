package mapproto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/dsmkit/dsm/internal/ids"
)

// Version is the protocol version this package speaks; it is the first byte
// of every message.
const Version = 1

// MaxMsg is the largest encoded message; receive buffers of this size never
// truncate a valid message.
const MaxMsg = 4096

// MaxName is the longest region name a Map may carry.
const MaxName = 255

// MaxText is the longest text an Error may carry; Encode truncates longer.
const MaxText = 1024

// Sentinel errors.
var (
	// ErrMalformed: bytes that are not a valid message of this version.
	ErrMalformed = errors.New("mapproto: malformed message")
	// ErrVersion: a message of another protocol version.
	ErrVersion = errors.New("mapproto: unsupported protocol version")
)

// Type is the kind of a message. The zero value is invalid.
type Type uint8

// Message types.
const (
	// TypeMap asks to map the region Name (client -> dsmd). Size, when not
	// zero, must equal the region's size. FaultTimeout, when not zero, asks
	// dsmd to poison a fault of this mapping that waits longer than that for
	// an unavailable page, and says that the client understands Unavailable
	// and Available.
	TypeMap Type = 1 + iota
	// TypeMapped answers Map with the region's id, size and page size; the
	// region's memfd travels with it, and, when the Map asked with
	// FeatureLeasePage and dsmd has one, the lease page's memfd after it
	// (dsmd -> client).
	TypeMapped
	// TypeRegister gives dsmd the client's mapping [Addr, Addr+Len) of the
	// whole region; the client's userfaultfd travels with it (client -> dsmd).
	TypeRegister
	// TypeRegistered acknowledges Register: dsmd serves the faults from now
	// on (dsmd -> client). It carries the session's token (Session) when
	// the Map asked for it (FeatureSession).
	TypeRegistered
	// TypeError refuses the request before it, or, after Registered with
	// CodeUnknownRegion, says that the region was deleted; dsmd closes the
	// session after sending it (dsmd -> client).
	TypeError
	// TypeUnavailable says, after Registered, that a fault on Page waited
	// longer than the mapping's FaultTimeout for a page the cluster cannot
	// serve now, and why (Text); dsmd is about to poison the page in the
	// client (dsmd -> client). Sent only to a client whose Map carried a
	// FaultTimeout.
	TypeUnavailable
	// TypeAvailable says, after Unavailable for Page, that the page is
	// served again: the client removes its poison marker (dsmd -> client).
	TypeAvailable
	// TypePoison asks, after Unavailable for Page, the client to poison
	// the page itself: dsmd cannot, because the client maps the page (a
	// write fault on a page it maps read-only), and only the client can
	// drop that mapping (dsmd -> client).
	TypePoison
	typeEnd
)

func (t Type) String() string {
	switch t {
	case TypeMap:
		return "map"
	case TypeMapped:
		return "mapped"
	case TypeRegister:
		return "register"
	case TypeRegistered:
		return "registered"
	case TypeError:
		return "error"
	case TypeUnavailable:
		return "unavailable"
	case TypeAvailable:
		return "available"
	case TypePoison:
		return "poison"
	case TypeCreate:
		return "create"
	case TypeLookup:
		return "lookup"
	case TypeDelete:
		return "delete"
	case TypeSync:
		return "sync"
	case TypeSessionsAlive:
		return "sessions-alive"
	case TypeRegion:
		return "region"
	case TypeDone:
		return "done"
	case TypeStates:
		return "states"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Code classifies an Error. The zero value is invalid.
type Code uint16

// Error codes.
const (
	CodeUnknownRegion    Code = 1 + iota // no region of that name; after Registered: the region was deleted
	CodeSizeMismatch                     // Map.Size is not the region's size
	CodeBadRequest                       // a message out of order, malformed, or with bad fields
	CodeUnavailable                      // dsmd cannot serve now (closing, out of resources)
	CodeInternal                         // anything else
	CodePermissionDenied                 // the peer may not use the socket, or not map that region
	CodeExists                           // Create: a region of that name exists with another spec
	CodeBusy                             // Delete: the region is mapped (or dsmd cannot tell)
	CodeNoSpace                          // Create: no room for the region in the cluster
)

func (c Code) String() string {
	switch c {
	case CodeUnknownRegion:
		return "unknown region"
	case CodeSizeMismatch:
		return "size mismatch"
	case CodeBadRequest:
		return "bad request"
	case CodeUnavailable:
		return "unavailable"
	case CodeInternal:
		return "internal error"
	case CodePermissionDenied:
		return "permission denied"
	case CodeExists:
		return "exists"
	case CodeBusy:
		return "busy"
	case CodeNoSpace:
		return "no space"
	}
	return fmt.Sprintf("code(%d)", uint16(c))
}

// Features are what a client's Map asks for beyond the first form of the
// protocol, as bits of Msg.Features.
type Features uint64

const (
	// FeatureSession asks dsmd to name the session in Registered: a token
	// unique in the cluster for as long as the directory's protocol ids
	// are not reused, by which any process can later ask whether the
	// session is still alive (the dsm Mutex records its holder with it).
	FeatureSession Features = 1 << iota
	// FeatureLeasePage asks dsmd for its lease page (lease.go): Mapped
	// then carries a second descriptor, a memfd whose record the client
	// maps read-only and watches. A dsmd that has no lease page to give
	// sends the region's memfd alone, as to a client that did not ask.
	FeatureLeasePage
	featuresKnown = FeatureSession | FeatureLeasePage
)

// Msg is one message. Which fields are meaningful depends on Type:
//
//	Map:         Name, Size, FaultTimeout, Features
//	Mapped:      Region, Size, PageSize
//	Register:    Addr, Len
//	Registered:  Session (only when the Map asked with FeatureSession)
//	Error:       Code, Text
//	Unavailable: Page, Text
//	Available:   Page
//	Poison:      Page
type Msg struct {
	Type     Type
	Name     string
	Size     uint64
	Region   ids.RegionID
	PageSize uint32
	Addr     uint64
	Len      uint64
	Code     Code
	Text     string
	// FaultTimeout is whole milliseconds on the wire: Encode rounds a
	// fraction up. Zero (or negative) is not sent: the fault waits forever.
	FaultTimeout time.Duration
	Page         ids.PageNo
	// Features (Map) are optional: a Map with features also carries
	// FaultTimeout on the wire, where 0 then means none.
	Features Features
	// Session (Registered) is the session's token; 0: none was asked for.
	Session uint64
}

func (m Msg) String() string {
	switch m.Type {
	case TypeMap:
		s := fmt.Sprintf("map %q size=%d", m.Name, m.Size)
		if m.FaultTimeout > 0 {
			s += fmt.Sprintf(" fault-timeout=%v", m.FaultTimeout)
		}
		if m.Features != 0 {
			s += fmt.Sprintf(" features=%#x", uint64(m.Features))
		}
		return s
	case TypeRegistered:
		if m.Session != 0 {
			return fmt.Sprintf("registered session=%#x", m.Session)
		}
		return "registered"
	case TypeMapped:
		return fmt.Sprintf("mapped %s size=%d page=%d", m.Region, m.Size, m.PageSize)
	case TypeRegister:
		return fmt.Sprintf("register [%#x, +%#x)", m.Addr, m.Len)
	case TypeError:
		return fmt.Sprintf("error %s: %s", m.Code, m.Text)
	case TypeUnavailable:
		return fmt.Sprintf("unavailable %s: %s", m.Page, m.Text)
	case TypeAvailable:
		return fmt.Sprintf("available %s", m.Page)
	case TypePoison:
		return fmt.Sprintf("poison %s", m.Page)
	}
	return m.Type.String()
}

// Encode returns the wire form of m. It fails on a message that Decode
// would refuse (an unknown type, a name too long or not UTF-8), so that a
// peer never receives one.
func Encode(m Msg) ([]byte, error) {
	b := make([]byte, 0, 64)
	b = append(b, Version, byte(m.Type))
	le := binary.LittleEndian
	switch m.Type {
	case TypeMap:
		if len(m.Name) == 0 || len(m.Name) > MaxName || !utf8.ValidString(m.Name) {
			return nil, fmt.Errorf("%w: region name %q", ErrMalformed, m.Name)
		}
		if m.Features&^featuresKnown != 0 {
			return nil, fmt.Errorf("%w: features %#x", ErrMalformed, uint64(m.Features))
		}
		b = appendString(b, m.Name)
		b = le.AppendUint64(b, m.Size)
		if m.FaultTimeout > 0 || m.Features != 0 {
			b = le.AppendUint64(b, uint64((max(m.FaultTimeout, 0)+time.Millisecond-1)/time.Millisecond))
		}
		if m.Features != 0 {
			b = le.AppendUint64(b, uint64(m.Features))
		}
	case TypeMapped:
		b = le.AppendUint32(b, uint32(m.Region))
		b = le.AppendUint64(b, m.Size)
		b = le.AppendUint32(b, m.PageSize)
	case TypeRegister:
		b = le.AppendUint64(b, m.Addr)
		b = le.AppendUint64(b, m.Len)
	case TypeRegistered:
		if m.Session != 0 {
			b = le.AppendUint64(b, m.Session)
		}
	case TypeError:
		b = le.AppendUint16(b, uint16(m.Code))
		b = appendString(b, cutText(m.Text))
	case TypeUnavailable:
		b = le.AppendUint64(b, uint64(m.Page))
		b = appendString(b, cutText(m.Text))
	case TypeAvailable, TypePoison:
		b = le.AppendUint64(b, uint64(m.Page))
	default:
		return nil, fmt.Errorf("%w: type %s", ErrMalformed, m.Type)
	}
	return b, nil
}

// cutText makes text sendable: at most MaxText bytes, valid UTF-8.
func cutText(text string) string {
	if len(text) > MaxText {
		text = text[:MaxText]
	}
	if !utf8.ValidString(text) {
		text = "(invalid UTF-8)"
	}
	return text
}

// maxTimeoutMS is the largest FaultTimeout on the wire that a
// time.Duration holds.
const maxTimeoutMS = uint64(1<<63-1) / uint64(time.Millisecond)

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// Decode parses one message. It never panics; any defect is an error
// wrapping ErrMalformed (or ErrVersion).
func Decode(b []byte) (Msg, error) {
	if len(b) < 2 {
		return Msg{}, fmt.Errorf("%w: %d bytes", ErrMalformed, len(b))
	}
	if b[0] != Version {
		return Msg{}, fmt.Errorf("%w: %d (want %d)", ErrVersion, b[0], Version)
	}
	m := Msg{Type: Type(b[1])}
	d := decoder{b: b[2:]}
	switch m.Type {
	case TypeMap:
		m.Name = d.str()
		m.Size = d.u64()
		if d.err == nil && (len(m.Name) == 0 || len(m.Name) > MaxName) {
			d.fail("region name of %d bytes", len(m.Name))
		}
		// FaultTimeout is optional: a client that predates it sends none.
		// Features follow it, optional too; with them, a FaultTimeout of
		// 0 means none.
		withFeatures := len(d.b) >= 16
		if d.err == nil && len(d.b) != 0 {
			switch ms := d.u64(); {
			case d.err != nil:
			case ms == 0 && withFeatures:
			case ms == 0:
				d.fail("fault timeout 0 is sent as no fault timeout")
			case ms > maxTimeoutMS:
				d.fail("fault timeout of %d ms", ms)
			default:
				m.FaultTimeout = time.Duration(ms) * time.Millisecond
			}
		}
		if d.err == nil && withFeatures {
			switch f := Features(d.u64()); {
			case d.err != nil:
			case f == 0:
				d.fail("features 0 are sent as no features")
			case f&^featuresKnown != 0:
				d.fail("unknown features %#x", uint64(f&^featuresKnown))
			default:
				m.Features = f
			}
		}
	case TypeMapped:
		m.Region = ids.RegionID(d.u32())
		m.Size = d.u64()
		m.PageSize = d.u32()
	case TypeRegister:
		m.Addr = d.u64()
		m.Len = d.u64()
	case TypeRegistered:
		if len(d.b) != 0 {
			if m.Session = d.u64(); d.err == nil && m.Session == 0 {
				d.fail("session 0 is sent as no session")
			}
		}
	case TypeError:
		m.Code = Code(d.u16())
		m.Text = d.text()
	case TypeUnavailable:
		m.Page = ids.PageNo(d.u64())
		m.Text = d.text()
	case TypeAvailable, TypePoison:
		m.Page = ids.PageNo(d.u64())
	default:
		return Msg{}, fmt.Errorf("%w: unknown type %d", ErrMalformed, b[1])
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes after %s", len(d.b), m.Type)
	}
	if d.err != nil {
		return Msg{}, d.err
	}
	return m, nil
}

// decoder reads fields in order and remembers the first failure; after it,
// every read returns zero.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
	}
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.fail("need %d bytes, have %d", n, len(d.b))
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u16() uint16 {
	if v := d.take(2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if v := d.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if v := d.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

// text reads a string of at most MaxText bytes.
func (d *decoder) text() string {
	s := d.str()
	if d.err == nil && len(s) > MaxText {
		d.fail("text of %d bytes", len(s))
	}
	return s
}

func (d *decoder) str() string {
	n := int(d.u16())
	v := d.take(n)
	if v == nil {
		return ""
	}
	if !utf8.Valid(v) {
		d.fail("string is not UTF-8")
		return ""
	}
	return string(v)
}
