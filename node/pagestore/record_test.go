package pagestore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

func TestRecordRoundTrip(t *testing.T) {
	for _, data := range [][]byte{nil, {}, {7}, pageData(3, 9, 2, 4096), pageData(1, 1, 1, 65536)} {
		for _, version := range []uint16{0, 1, 0x7fff, 0xffff} {
			v := appendRecord([]byte("prefix"), version, data)[len("prefix"):]
			gotV, gotD, err := decodeRecord(v)
			if err != nil {
				t.Fatalf("decodeRecord(version %d, %d bytes): %v", version, len(data), err)
			}
			if gotV != version || !bytes.Equal(gotD, data) {
				t.Fatalf("decodeRecord = version %d, %d bytes; want %d, %d", gotV, len(gotD), version, len(data))
			}
		}
	}
}

func TestDecodeRecordRejects(t *testing.T) {
	good := appendRecord(nil, 5, []byte("page data"))
	flip := func(i int) []byte {
		b := bytes.Clone(good)
		b[i] ^= 0x10
		return b
	}
	long := bytes.Clone(good)
	binary.BigEndian.PutUint32(long[3:], 0xffffffff)
	for name, v := range map[string][]byte{
		"empty":            nil,
		"short header":     good[:headerLen-1],
		"header only":      good[:headerLen],
		"truncated data":   good[:len(good)-1],
		"trailing byte":    append(bytes.Clone(good), 0),
		"format":           flip(0),
		"version bit":      flip(1),
		"length bit":       flip(4),
		"checksum bit":     flip(8),
		"data bit":         flip(headerLen + 2),
		"huge length":      long,
		"zero value":       make([]byte, 64),
		"header of format": {recordFormat},
	} {
		if _, _, err := decodeRecord(v); !errors.Is(err, errRecord) {
			t.Errorf("%s: decodeRecord = %v; want errRecord", name, err)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(appendRecord(nil, 1, []byte("data")))
	f.Add(appendRecord(nil, 0xffff, nil))
	f.Add(appendRecord(nil, 7, pageData(1, 2, 7, 64)))
	f.Add([]byte{recordFormat, 0, 1, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, v []byte) {
		version, data, err := decodeRecord(v)
		if err != nil {
			if !errors.Is(err, errRecord) {
				t.Fatalf("error %v does not wrap errRecord", err)
			}
			return
		}
		// Whatever decodes encodes back to the same bytes.
		if again := appendRecord(nil, version, data); !bytes.Equal(again, v) {
			t.Fatalf("re-encoding differs: %x, was %x", again, v)
		}
	})
}

func TestKeyRoundTripAndOrder(t *testing.T) {
	keys := [][]byte{pageKey(0, 0), pageKey(0, 1), pageKey(0, 256), pageKey(1, 0), pageKey(0xffffffff, ^uint64(0))}
	for i, k := range keys {
		if i > 0 && bytes.Compare(keys[i-1], k) >= 0 {
			t.Fatalf("key %x does not sort after %x", k, keys[i-1])
		}
	}
	r, no, err := decodeKey(pageKey(0xdeadbeef, 0x0102030405060708))
	if err != nil || r != 0xdeadbeef || no != 0x0102030405060708 {
		t.Fatalf("decodeKey = %d, %d, %v", r, no, err)
	}
	if _, _, err := decodeKey([]byte("p123")); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("decodeKey(short) = %v; want ErrCorrupt", err)
	}
	lo, hi := regionBounds(0xffffffff)
	if bytes.Compare(lo, pageKey(0xffffffff, ^uint64(0))) > 0 || bytes.Compare(pageKey(0xffffffff, ^uint64(0)), hi) >= 0 {
		t.Fatalf("regionBounds of the last region [%x, %x) miss its last page", lo, hi)
	}
}

func TestNewerWraps(t *testing.T) {
	for _, c := range []struct {
		a, b uint16
		want bool
	}{
		{2, 1, true}, {1, 2, false}, {1, 1, false},
		{0, 0xffff, true}, {0xffff, 0, false},
		{5, 0xfff0, true}, {0x7fff, 0, true}, {0x8000, 0, false},
	} {
		if got := Newer(c.a, c.b); got != c.want {
			t.Errorf("Newer(%#x, %#x) = %v; want %v", c.a, c.b, got, c.want)
		}
	}
}
