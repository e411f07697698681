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
	{Type: TypeMap, Name: "kv", Features: FeatureSession | FeatureLeasePage},
	{Type: TypeMap, Name: "kv", Features: FeatureLeasePage},
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

var ctlSamples = []Ctl{
	{Type: TypeCreate, Name: "kv", Size: 1 << 30},
	{Type: TypeCreate, Name: "kv", Size: 1 << 20, PageSize: 65536, Durability: DurabilityDurable},
	{Type: TypeLookup, Name: strings.Repeat("n", MaxName)},
	{Type: TypeDelete, Name: "kv", Force: true},
	{Type: TypeDelete, Name: "kv"},
	{Type: TypeSync, Name: "kv", Offset: 4096, Len: 8192},
	{Type: TypeSessionsAlive, Tokens: []uint64{3<<32 | 1, 0}},
	{Type: TypeRegion, Region: 4, Size: 1 << 20, PageSize: 4096, Durability: DurabilityMemory, Existed: true},
	{Type: TypeDone, Count: 3},
	{Type: TypeStates, States: []SessionState{SessionAlive, SessionDead, SessionUnknown}},
}

func TestCtlRoundTrip(t *testing.T) {
	for _, m := range ctlSamples {
		b, err := EncodeCtl(m)
		if err != nil {
			t.Fatalf("encode %+v: %v", m, err)
		}
		got, err := DecodeCtl(b)
		if err != nil {
			t.Fatalf("decode %+v: %v", m, err)
		}
		again, _ := EncodeCtl(got)
		if !bytes.Equal(again, b) || got.Type != m.Type || got.Name != m.Name {
			t.Fatalf("%+v decodes as %+v", m, got)
		}
		// A control message is no mapping message, and the other way round.
		if _, err := Decode(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("Decode of %s: %v, want ErrMalformed", m.Type, err)
		}
	}
	for _, m := range samples {
		b, _ := Encode(m)
		if _, err := DecodeCtl(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("DecodeCtl of %s: %v, want ErrMalformed", m.Type, err)
		}
	}
}

func TestCtlRefused(t *testing.T) {
	le := binary.LittleEndian
	tooMany := le.AppendUint16([]byte{Version, byte(TypeSessionsAlive)}, MaxTokens+1)
	for range MaxTokens + 1 {
		tooMany = le.AppendUint64(tooMany, 1)
	}
	bad := map[string][]byte{
		"no tokens":        {Version, byte(TypeSessionsAlive), 0, 0},
		"too many tokens":  tooMany,
		"short token list": {Version, byte(TypeSessionsAlive), 2, 0, 1, 0, 0, 0, 0, 0, 0, 0},
		"force 2":          {Version, byte(TypeDelete), 1, 0, 'k', 2},
		"empty name":       {Version, byte(TypeLookup), 0, 0},
		"bad durability":   append(le.AppendUint32(le.AppendUint64([]byte{Version, byte(TypeCreate), 1, 0, 'k'}, 4096), 0), 3),
		"state 0":          {Version, byte(TypeStates), 1, 0, 0},
		"trailing":         {Version, byte(TypeDone), 1, 0, 0, 0, 0, 0, 0, 0, 9},
		"unknown type":     {Version, byte(ctlRequestEnd)},
	}
	for name, b := range bad {
		if _, err := DecodeCtl(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	if _, err := DecodeCtl([]byte{2, byte(TypeLookup)}); !errors.Is(err, ErrVersion) {
		t.Errorf("version 2: %v", err)
	}
}

// FuzzDecodeCtl: DecodeCtl never panics, and what it accepts encodes back
// to the same bytes.
func FuzzDecodeCtl(f *testing.F) {
	for _, m := range ctlSamples {
		b, _ := EncodeCtl(m)
		f.Add(b)
	}
	f.Add([]byte{Version, byte(TypeSessionsAlive), 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeCtl(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		again, err := EncodeCtl(m)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding %+v: %x, want %x", m, again, b)
		}
	})
}
