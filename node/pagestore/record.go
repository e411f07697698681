package pagestore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/dsmkit/dsm/internal/ids"
)

// Key layout: prefixPage | region u32 big-endian | page u64 big-endian.
const (
	prefixPage = 'p'
	keyLen     = 1 + 4 + 8
)

// Value layout, format 1:
//
//	format u8 | version u16 | len(data) u32 | crc32c u32 | data
//
// The checksum (Castagnoli) covers the first seven header bytes and the data.
const (
	recordFormat = 1
	headerLen    = 1 + 2 + 4 + 4
	// MaxPageBytes is the largest page Write accepts.
	MaxPageBytes = 1 << 24
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errRecord is wrapped by every decodeRecord error; callers name the page
// and wrap ErrCorrupt.
var errRecord = errors.New("bad record")

func pageKey(region ids.RegionID, no uint64) []byte {
	return appendKey(make([]byte, 0, keyLen), region, no)
}

func appendKey(b []byte, region ids.RegionID, no uint64) []byte {
	b = append(b, prefixPage)
	b = binary.BigEndian.AppendUint32(b, uint32(region))
	return binary.BigEndian.AppendUint64(b, no)
}

// decodeKey returns the region and page of a key written by appendKey.
func decodeKey(k []byte) (ids.RegionID, uint64, error) {
	if len(k) != keyLen || k[0] != prefixPage {
		return 0, 0, fmt.Errorf("%w: key %x", ErrCorrupt, k)
	}
	return ids.RegionID(binary.BigEndian.Uint32(k[1:])), binary.BigEndian.Uint64(k[5:]), nil
}

// regionBounds returns the key range [lower, upper) holding every page of
// region.
func regionBounds(region ids.RegionID) (lower, upper []byte) {
	lower = pageKey(region, 0)
	if region == ^ids.RegionID(0) {
		return lower, []byte{prefixPage + 1}
	}
	return lower, pageKey(region+1, 0)
}

// appendRecord appends the encoded value of one page to b.
func appendRecord(b []byte, version uint16, data []byte) []byte {
	start := len(b)
	b = append(b, recordFormat)
	b = binary.BigEndian.AppendUint16(b, version)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	crc := crc32.Update(0, castagnoli, b[start:start+7])
	crc = crc32.Update(crc, castagnoli, data)
	b = binary.BigEndian.AppendUint32(b, crc)
	return append(b, data...)
}

// decodeRecord checks one stored value and returns its version and data;
// data aliases v. It never panics: every malformed value is an error
// wrapping errRecord.
func decodeRecord(v []byte) (version uint16, data []byte, err error) {
	if len(v) < headerLen {
		return 0, nil, fmt.Errorf("%w: %d bytes, header needs %d", errRecord, len(v), headerLen)
	}
	if v[0] != recordFormat {
		return 0, nil, fmt.Errorf("%w: format %d", errRecord, v[0])
	}
	version = binary.BigEndian.Uint16(v[1:])
	n := binary.BigEndian.Uint32(v[3:])
	if uint64(n) != uint64(len(v)-headerLen) {
		return 0, nil, fmt.Errorf("%w: header says %d data bytes, value holds %d", errRecord, n, len(v)-headerLen)
	}
	want := binary.BigEndian.Uint32(v[7:])
	data = v[headerLen:]
	crc := crc32.Update(0, castagnoli, v[:7])
	crc = crc32.Update(crc, castagnoli, data)
	if crc != want {
		return 0, nil, fmt.Errorf("%w: checksum %08x, computed %08x", errRecord, want, crc)
	}
	return version, data, nil
}

// Newer reports whether tenure version a is newer than b in serial
// arithmetic: versions wrap, and a is newer when it is less than half the
// version space ahead of b.
func Newer(a, b uint16) bool { return int16(a-b) > 0 }
