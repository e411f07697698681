package mapproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"
)

var samples = []Msg{
	{Type: TypeMap, Name: "kv", Size: 1 << 40},
	{Type: TypeMap, Name: strings.Repeat("n", MaxName)},
	{Type: TypeMap, Name: "kv", FaultTimeout: 30 * time.Second},
	{Type: TypeMap, Name: "kv", Size: 4096, FaultTimeout: time.Millisecond},
	{Type: TypeMapped, Region: 7, Size: 1 << 20, PageSize: 4096},
	{Type: TypeRegister, Addr: 0x7f0000000000, Len: 1 << 20},
	{Type: TypeRegistered},
	{Type: TypeRegistered, Session: 3<<32 | 17},
	{Type: TypeMap, Name: "kv", Features: FeatureSession},
	{Type: TypeMap, Name: "kv", Size: 4096, FaultTimeout: 30 * time.Second, Features: FeatureSession},
	{Type: TypeError, Code: CodeUnknownRegion, Text: `no region "kv"`},
	{Type: TypeUnavailable, Page: 513, Text: "page p513 of region fo (r1) unavailable: its home n3 failed in epoch 7"},
	{Type: TypeAvailable, Page: 1<<52 - 1},
	{Type: TypePoison, Page: 9},
}

// TestMapWithoutFaultTimeout: a Map as a client that predates FaultTimeout
// sends it (name and size only) still decodes, and a Map without one
// encodes as such a client's does.
func TestMapWithoutFaultTimeout(t *testing.T) {
	old := []byte{Version, byte(TypeMap), 2, 0, 'k', 'v', 0, 0x10, 0, 0, 0, 0, 0, 0}
	m, err := Decode(old)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Msg{Type: TypeMap, Name: "kv", Size: 4096}); m != want {
		t.Fatalf("decoded %+v, want %+v", m, want)
	}
	for _, ft := range []time.Duration{0, -time.Second} {
		b, err := Encode(Msg{Type: TypeMap, Name: "kv", Size: 4096, FaultTimeout: ft})
		if err != nil || !bytes.Equal(b, old) {
			t.Fatalf("Map with FaultTimeout %v encodes as %x (%v), want %x", ft, b, err, old)
		}
	}
	// A fraction of a millisecond is rounded up, never to "wait forever".
	b, _ := Encode(Msg{Type: TypeMap, Name: "kv", FaultTimeout: time.Microsecond})
	if m, err := Decode(b); err != nil || m.FaultTimeout != time.Millisecond {
		t.Fatalf("FaultTimeout 1us decodes as %v (%v)", m.FaultTimeout, err)
	}
}

// Features are optional after FaultTimeout, which they make present (0
// then meaning none); canonical forms only.
func TestMapFeatures(t *testing.T) {
	b, err := Encode(Msg{Type: TypeMap, Name: "kv", Features: FeatureSession})
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 + 2 + 2 + 8 + 8 + 8; len(b) != want {
		t.Fatalf("Map with features and no fault timeout: %d bytes, want %d", len(b), want)
	}
	le := binary.LittleEndian
	bad := map[string][]byte{
		"features 0":       le.AppendUint64(le.AppendUint64(slicesClone(b[:14]), 5), 0),
		"unknown features": le.AppendUint64(le.AppendUint64(slicesClone(b[:14]), 5), 1<<40),
		"trailing byte":    append(slicesClone(b), 0),
	}
	for name, m := range bad {
		if _, err := Decode(m); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	if _, err := Encode(Msg{Type: TypeMap, Name: "kv", Features: 1 << 40}); !errors.Is(err, ErrMalformed) {
		t.Errorf("encode of unknown features: %v", err)
	}
	// Registered without a session is the first form: two bytes.
	if b, _ := Encode(Msg{Type: TypeRegistered}); len(b) != 2 {
		t.Fatalf("Registered without a session: %x", b)
	}
	if _, err := Decode(le.AppendUint64([]byte{Version, byte(TypeRegistered)}, 0)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Registered with session 0: %v", err)
	}
}

func slicesClone(b []byte) []byte { return append([]byte(nil), b...) }

func TestRoundTrip(t *testing.T) {
	for _, m := range samples {
		b, err := Encode(m)
		if err != nil {
			t.Fatalf("encode %v: %v", m, err)
		}
		if len(b) > MaxMsg {
			t.Fatalf("%v encodes to %d bytes > MaxMsg", m, len(b))
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("decode %v: %v", m, err)
		}
		if got != m {
			t.Fatalf("round trip: got %+v, want %+v", got, m)
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	for _, m := range []Msg{
		{},
		{Type: typeEnd},
		{Type: TypeMap},
		{Type: TypeMap, Name: strings.Repeat("n", MaxName+1)},
		{Type: TypeMap, Name: "\xff"},
	} {
		if _, err := Encode(m); !errors.Is(err, ErrMalformed) {
			t.Errorf("Encode(%+v) = %v, want ErrMalformed", m, err)
		}
	}
	// Long error texts are cut, not refused.
	b, err := Encode(Msg{Type: TypeError, Code: CodeInternal, Text: strings.Repeat("x", 3*MaxText)})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := Decode(b); err != nil || len(m.Text) != MaxText {
		t.Fatalf("decoded long error: %d bytes, %v", len(m.Text), err)
	}
}

func TestDecodeRefuses(t *testing.T) {
	good, _ := Encode(Msg{Type: TypeMapped, Region: 1, Size: 4096, PageSize: 4096})
	cases := map[string][]byte{
		"empty":          nil,
		"one byte":       {Version},
		"unknown type":   {Version, byte(typeEnd)},
		"zero type":      {Version, 0},
		"short":          good[:len(good)-1],
		"trailing":       append(append([]byte{}, good...), 0),
		"empty name":     {Version, byte(TypeMap), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"name too short": {Version, byte(TypeMap), 9, 0, 'a'},
		"bad utf8":       {Version, byte(TypeMap), 1, 0, 0xff, 0, 0, 0, 0, 0, 0, 0, 0},
		"zero timeout":   {Version, byte(TypeMap), 1, 0, 'a', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"short timeout":  {Version, byte(TypeMap), 1, 0, 'a', 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0},
		"huge timeout":   binary.LittleEndian.AppendUint64([]byte{Version, byte(TypeMap), 1, 0, 'a', 0, 0, 0, 0, 0, 0, 0, 0}, 1<<63),
		"short page":     {Version, byte(TypeAvailable), 1, 0, 0},
		"no text":        {Version, byte(TypeUnavailable), 1, 0, 0, 0, 0, 0, 0, 0},
	}
	for name, b := range cases {
		if _, err := Decode(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	if _, err := Decode([]byte{Version + 1, byte(TypeRegistered)}); !errors.Is(err, ErrVersion) {
		t.Errorf("other version: %v, want ErrVersion", err)
	}
}

// FuzzDecode: Decode never panics, and what it accepts encodes back to the
// same bytes.
func FuzzDecode(f *testing.F) {
	for _, m := range samples {
		b, _ := Encode(m)
		f.Add(b)
	}
	f.Add([]byte{Version, byte(TypeMap), 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		again, err := Encode(m)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding %+v: %x, want %x", m, again, b)
		}
	})
}
