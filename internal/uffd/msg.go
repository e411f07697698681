package uffd

import (
	"encoding/binary"
	"fmt"
)

// Event is the kind of a userfaultfd message (UFFD_EVENT_*). The kernel
// numbers them from 0x12 on, so the zero value is invalid.
type Event uint8

// The events of the kernel ABI.
const (
	EventPagefault Event = 0x12 // a thread faulted on a registered range
	EventFork      Event = 0x13 // the process forked (needs FeatureEventFork)
	EventRemap     Event = 0x14 // mremap moved a range (needs FeatureEventRemap)
	EventRemove    Event = 0x15 // madvise dropped a range (needs FeatureEventRemove)
	EventUnmap     Event = 0x16 // munmap of a range (needs FeatureEventUnmap)
)

func (e Event) String() string {
	switch e {
	case EventPagefault:
		return "pagefault"
	case EventFork:
		return "fork"
	case EventRemap:
		return "remap"
	case EventRemove:
		return "remove"
	case EventUnmap:
		return "unmap"
	}
	return fmt.Sprintf("event(%#x)", uint8(e))
}

// FaultFlags qualify a page fault (UFFD_PAGEFAULT_FLAG_*).
type FaultFlags uint64

// Fault flags.
const (
	// FlagWrite: the access was a write. Absent for reads, and for a MINOR or
	// MISSING fault it tells which kind of mapping the faulter wants.
	FlagWrite FaultFlags = 1 << 0
	// FlagWP: a write hit a write-protected PTE (resolve with WriteProtect off).
	FlagWP FaultFlags = 1 << 1
	// FlagMinor: the page is in the page cache but not mapped here (resolve
	// with Continue). Without FlagWP or FlagMinor the fault is MISSING.
	FlagMinor FaultFlags = 1 << 2
)

func (f FaultFlags) String() string {
	s := "read"
	if f&FlagWrite != 0 {
		s = "write"
	}
	switch {
	case f&FlagWP != 0:
		s += "|wp"
	case f&FlagMinor != 0:
		s += "|minor"
	default:
		s += "|missing"
	}
	if rest := f &^ (FlagWrite | FlagWP | FlagMinor); rest != 0 {
		s += fmt.Sprintf("|%#x", uint64(rest))
	}
	return s
}

// Msg is one decoded struct uffd_msg. Which fields are meaningful depends on
// Event; the others are zero.
type Msg struct {
	Event Event

	// EventPagefault.
	Flags   FaultFlags
	Address uint64 // in the faulting process; page aligned unless FeatureExactAddress
	TID     uint32 // faulting thread, with FeatureThreadID

	// EventFork: a userfaultfd for the child, already installed as a file
	// descriptor in the reading process. The reader owns it and must close it.
	ForkFD uint32

	// EventRemap.
	From, To, Len uint64

	// EventRemove and EventUnmap: the range [Start, End) in the faulting
	// process.
	Start, End uint64
}

// Kind names the fault of an EventPagefault message: missing, minor or wp.
func (m Msg) Kind() FaultKind {
	switch {
	case m.Event != EventPagefault:
		return 0
	case m.Flags&FlagWP != 0:
		return FaultWP
	case m.Flags&FlagMinor != 0:
		return FaultMinor
	default:
		return FaultMissing
	}
}

// Write reports whether a page fault was a write access.
func (m Msg) Write() bool { return m.Flags&FlagWrite != 0 }

func (m Msg) String() string {
	switch m.Event {
	case EventPagefault:
		return fmt.Sprintf("pagefault %s addr=%#x tid=%d", m.Flags, m.Address, m.TID)
	case EventFork:
		return fmt.Sprintf("fork fd=%d", m.ForkFD)
	case EventRemap:
		return fmt.Sprintf("remap from=%#x to=%#x len=%#x", m.From, m.To, m.Len)
	case EventRemove, EventUnmap:
		return fmt.Sprintf("%s [%#x,%#x)", m.Event, m.Start, m.End)
	}
	return m.Event.String()
}

// FaultKind classifies a page fault by how it is resolved.
type FaultKind uint8

// Fault kinds; the zero value means "not a page fault".
const (
	FaultMissing FaultKind = 1 + iota // no page in the page cache: Copy or ZeroPage (or fill the memfd, then Continue)
	FaultMinor                        // page cached, not mapped here: Continue
	FaultWP                           // write to a write-protected PTE: WriteProtect(off)
)

func (k FaultKind) String() string {
	switch k {
	case FaultMissing:
		return "missing"
	case FaultMinor:
		return "minor"
	case FaultWP:
		return "wp"
	}
	return "none"
}

// DecodeMsg decodes one message from the first 32 bytes of b. It never panics:
// a short buffer is ErrShortMsg, an event this package does not know is
// ErrUnknownEvent (with the raw event in the error). The reserved bytes are
// ignored, as the kernel may use them in later versions.
func DecodeMsg(b []byte) (Msg, error) {
	if len(b) < msgSize {
		return Msg{}, fmt.Errorf("%w: %d bytes", ErrShortMsg, len(b))
	}
	le := binary.NativeEndian // the kernel writes its own byte order
	ev := Event(b[0])
	arg := b[8:msgSize]
	m := Msg{Event: ev}
	switch ev {
	case EventPagefault:
		m.Flags = FaultFlags(le.Uint64(arg[0:]))
		m.Address = le.Uint64(arg[8:])
		m.TID = le.Uint32(arg[16:])
	case EventFork:
		m.ForkFD = le.Uint32(arg[0:])
	case EventRemap:
		m.From = le.Uint64(arg[0:])
		m.To = le.Uint64(arg[8:])
		m.Len = le.Uint64(arg[16:])
	case EventRemove, EventUnmap:
		m.Start = le.Uint64(arg[0:])
		m.End = le.Uint64(arg[8:])
	default:
		return Msg{}, fmt.Errorf("%w: %#x", ErrUnknownEvent, uint8(ev))
	}
	return m, nil
}

// DecodeMsgs decodes the whole messages of b into dst (at most len(dst))
// and returns how many it stored. A message it cannot decode is skipped, not
// fatal: the ones after it are still decoded (each is a fault some thread
// waits on), and the first such error is returned along with n. Trailing
// bytes that do not make a whole message are ErrShortMsg.
func DecodeMsgs(dst []Msg, b []byte) (int, error) {
	n := 0
	var first error
	for n < len(dst) && len(b) > 0 {
		m, err := DecodeMsg(b)
		if err != nil {
			if first == nil {
				first = err
			}
			if len(b) < msgSize {
				break
			}
		} else {
			dst[n] = m
			n++
		}
		b = b[msgSize:]
	}
	return n, first
}
