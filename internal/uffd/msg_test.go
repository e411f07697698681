package uffd

import (
	"encoding/binary"
	"errors"
	"testing"
)

func rawMsg(ev Event, words ...uint64) []byte {
	b := make([]byte, msgSize)
	b[0] = byte(ev)
	for i, w := range words {
		binary.NativeEndian.PutUint64(b[8+8*i:], w)
	}
	return b
}

func TestDecodeMsg(t *testing.T) {
	pf := rawMsg(EventPagefault, uint64(FlagWrite|FlagWP), 0x7f0000001000, 1234)
	m, err := DecodeMsg(pf)
	if err != nil {
		t.Fatal(err)
	}
	if m.Event != EventPagefault || m.Flags != FlagWrite|FlagWP || m.Address != 0x7f0000001000 || m.TID != 1234 {
		t.Fatalf("decoded %+v", m)
	}
	if m.Kind() != FaultWP || !m.Write() {
		t.Fatalf("kind %s write %v", m.Kind(), m.Write())
	}
	for _, tc := range []struct {
		flags FaultFlags
		kind  FaultKind
	}{{0, FaultMissing}, {FlagWrite, FaultMissing}, {FlagMinor, FaultMinor}, {FlagWP | FlagWrite, FaultWP}} {
		m, err := DecodeMsg(rawMsg(EventPagefault, uint64(tc.flags), 0x1000))
		if err != nil || m.Kind() != tc.kind {
			t.Errorf("flags %s: kind %s, %v; want %s", tc.flags, m.Kind(), err, tc.kind)
		}
	}
	if m, _ := DecodeMsg(rawMsg(EventFork, 7)); m.ForkFD != 7 || m.Kind() != 0 {
		t.Errorf("fork: %+v", m)
	}
	if m, _ := DecodeMsg(rawMsg(EventRemap, 1, 2, 3)); m.From != 1 || m.To != 2 || m.Len != 3 {
		t.Errorf("remap: %+v", m)
	}
	for _, ev := range []Event{EventRemove, EventUnmap} {
		if m, _ := DecodeMsg(rawMsg(ev, 0x1000, 0x3000)); m.Event != ev || m.Start != 0x1000 || m.End != 0x3000 {
			t.Errorf("%s: %+v", ev, m)
		}
	}
	if _, err := DecodeMsg(pf[:31]); !errors.Is(err, ErrShortMsg) {
		t.Errorf("31 bytes: %v, want ErrShortMsg", err)
	}
	if _, err := DecodeMsg(rawMsg(0)); !errors.Is(err, ErrUnknownEvent) {
		t.Errorf("event 0: %v, want ErrUnknownEvent", err)
	}
}

func TestDecodeMsgs(t *testing.T) {
	b := append(rawMsg(EventPagefault, 0, 0x1000), rawMsg(EventPagefault, uint64(FlagMinor), 0x2000)...)
	dst := make([]Msg, 4)
	n, err := DecodeMsgs(dst, b)
	if err != nil || n != 2 || dst[1].Address != 0x2000 || dst[1].Kind() != FaultMinor {
		t.Fatalf("n=%d err=%v %+v", n, err, dst[:n])
	}
	n, err = DecodeMsgs(dst, b[:msgSize+5])
	if n != 1 || !errors.Is(err, ErrShortMsg) {
		t.Fatalf("trailing bytes: n=%d err=%v", n, err)
	}
	// An unknown event is skipped; the faults around it are kept.
	n, err = DecodeMsgs(dst, append(append(rawMsg(0x99), rawMsg(EventUnmap, 1, 2)...), rawMsg(EventPagefault, 0, 0x3000)...))
	if n != 2 || !errors.Is(err, ErrUnknownEvent) || dst[0].Event != EventUnmap || dst[1].Address != 0x3000 {
		t.Fatalf("unknown first: n=%d err=%v %+v", n, err, dst[:n])
	}
	if n, _ := DecodeMsgs(dst[:1], b); n != 1 {
		t.Fatalf("dst of one: decoded %d", n)
	}
}

// FuzzDecodeMsgs: any bytes decode without panicking, and what decodes
// re-encodes to the same fields.
func FuzzDecodeMsgs(f *testing.F) {
	f.Add(rawMsg(EventPagefault, uint64(FlagWrite), 0x1000, 5))
	f.Add(rawMsg(EventFork, 3))
	f.Add(append(rawMsg(EventRemove, 1, 2), 0x12))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		dst := make([]Msg, 4)
		n, err := DecodeMsgs(dst, b)
		if n < 0 || n > len(dst) || n*msgSize > len(b) {
			t.Fatalf("decoded %d from %d bytes", n, len(b))
		}
		if err == nil && n < len(dst) && n*msgSize != len(b) {
			t.Fatalf("no error, but %d of %d bytes left", len(b)-n*msgSize, len(b))
		}
		if err == nil {
			for i, m := range dst[:n] {
				if byte(m.Event) != b[i*msgSize] {
					t.Fatalf("event %s from byte %#x", m.Event, b[i*msgSize])
				}
			}
		}
		for _, m := range dst[:n] {
			if m.Event < EventPagefault || m.Event > EventUnmap {
				t.Fatalf("decoded unknown event %s", m.Event)
			}
			_ = m.String()
		}
	})
}
