package node

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

func TestDescriptorsRoundTrip(t *testing.T) {
	m := map[ids.RegionID]rdma.Descriptor{
		1: {Node: 3, RKey: rdma.RKey{Key: 7, Base: 1 << 40}, Len: 1 << 30, Access: rdma.AccessAll},
		9: {Node: 3, RKey: rdma.RKey{Key: 8, Base: 4096}, Len: 4104, Access: rdma.AccessAll},
	}
	got, err := decodeDescriptors(3, encodeDescriptors(m))
	if err != nil || !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip: %v, %v; want %v", got, err, m)
	}
	if got, err := decodeDescriptors(3, encodeDescriptors(nil)); err != nil || len(got) != 0 {
		t.Fatalf("empty: %v, %v", got, err)
	}
	good := encodeDescriptors(m)
	for name, b := range map[string][]byte{
		"version":   append([]byte{2}, good[1:]...),
		"truncated": good[:len(good)-1],
		"region 0":  append([]byte{1}, make([]byte, descEntryLen)...),
		"duplicate": append(good, good[1:1+descEntryLen]...),
	} {
		if _, err := decodeDescriptors(3, b); !errors.Is(err, errBadDescriptors) {
			t.Errorf("%s: %v, want errBadDescriptors", name, err)
		}
	}
}

// FuzzDecodeDescriptors: any bytes in a member record decode or are
// refused, never panic, and what decodes encodes back to the same bytes.
func FuzzDecodeDescriptors(f *testing.F) {
	f.Add(encodeDescriptors(map[ids.RegionID]rdma.Descriptor{1: {RKey: rdma.RKey{Key: 1, Base: 2}, Len: 3, Access: 1}}))
	f.Add([]byte{1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeDescriptors(5, b)
		if err != nil || len(b) == 0 {
			return
		}
		if again := encodeDescriptors(m); string(again) != string(b) {
			// Entries come back sorted by region: only sorted input
			// round-trips byte for byte.
			m2, err := decodeDescriptors(5, again)
			if err != nil || !reflect.DeepEqual(m, m2) {
				t.Fatalf("re-encoding changed the descriptors: %v vs %v (%v)", m, m2, err)
			}
		}
	})
}

// Few protocol ids left make the cluster degraded, with the count.
func TestProtoIDsHealth(t *testing.T) {
	if w := protoIDsHealth(protoIDsLow); w != nil {
		t.Fatalf("%d ids left: %q, want no warning", protoIDsLow, w)
	}
	w := protoIDsHealth(protoIDsLow - 1)
	if len(w) != 1 || !strings.Contains(w[0], fmt.Sprintf("only %d protocol ids", protoIDsLow-1)) {
		t.Fatalf("%d ids left: %q", protoIDsLow-1, w)
	}
}
