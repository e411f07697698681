package chaos

import (
	"encoding/binary"
	"hash/crc64"
)

// The region every schedule uses, and where each workload keeps its data.
// Every item sits in a shard of its own (shards are 2 MiB, the default), so
// that rendezvous placement spreads them over the nodes' homes: a fault on
// one node hits some items' homes and not others.
const (
	regionName = "chaos"
	pageSize   = 4096
	shardSize  = 2 << 20
	// regionSize holds 32 shards.
	regionSize = 32 * shardSize
	// maxNodes bounds the node ids whose checksummed pages the layout has
	// room for (the base nodes and the spare that joins).
	maxNodes = 6
	// pagesPerNode is how many checksummed pages each node's writer owns.
	pagesPerNode = 4
)

// regWords are the registers: two words on one page and one on another.
var regWords = []int64{0, 8, 1 * shardSize}

// counterWords are the AddUint64 counters.
var counterWords = []int64{2 * shardSize, 3 * shardSize}

// The Mutex (dsm.MutexSize bytes) and the pair of words it protects, on another page.
const (
	mutexOff = 4 * shardSize
	pairA    = 5 * shardSize
	pairB    = 5*shardSize + 8
)

// pageOff is the offset of page j (0 <= j < pagesPerNode) of node's
// checksummed pages.
func pageOff(node, j int) int64 {
	return int64(6+(node-1)*pagesPerNode+j) * shardSize
}

// pageIndex is the page number of the checksummed page at off.
func pageIndex(off int64) uint64 { return uint64(off / pageSize) }

var crcTable = crc64.MakeTable(crc64.ECMA)

// A checksummed page is: seq (8 bytes), page number (8), writer node (8), a
// pattern derived from page number and seq, and the CRC-64 of everything
// before it in the last 8 bytes. A page of zeros is the initial page, seq 0.
const (
	hdrSeq  = 0
	hdrPage = 8
	hdrNode = 16
	bodyOff = 24
	sumOff  = pageSize - 8
)

// fillPage writes the content of (page, seq) written by node into p.
func fillPage(p []byte, page, seq uint64, node int) {
	binary.LittleEndian.PutUint64(p[hdrSeq:], seq)
	binary.LittleEndian.PutUint64(p[hdrPage:], page)
	binary.LittleEndian.PutUint64(p[hdrNode:], uint64(node))
	x := page*0x9e3779b97f4a7c15 ^ seq
	for o := bodyOff; o < sumOff; o += 8 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(p[o:], z^z>>31)
	}
	binary.LittleEndian.PutUint64(p[sumOff:], crc64.Checksum(p[:sumOff], crcTable))
}

// Page read verdicts.
const (
	pageOK    = "ok"    // a complete page as some writer wrote it
	pageZero  = "zero"  // the initial page
	pageTorn  = "torn"  // the checksum does not match: parts of different writes, or damage
	pageWrong = "wrong" // the checksum matches but the page says it is another page
)

// rmwNoLock is the status of a read-modify-write whose Lock failed: it
// wrote nothing.
const rmwNoLock = "no-lock"

// checkPage says what p, read at page number page, holds, and its seq.
func checkPage(p []byte, page uint64) (string, uint64) {
	seq := binary.LittleEndian.Uint64(p[hdrSeq:])
	zero := true
	for _, b := range p {
		if b != 0 {
			zero = false
			break
		}
	}
	if zero {
		return pageZero, 0
	}
	if crc64.Checksum(p[:sumOff], crcTable) != binary.LittleEndian.Uint64(p[sumOff:]) {
		return pageTorn, seq
	}
	if binary.LittleEndian.Uint64(p[hdrPage:]) != page {
		return pageWrong, seq
	}
	var want [pageSize]byte
	fillPage(want[:], page, seq, int(binary.LittleEndian.Uint64(p[hdrNode:])))
	if string(want[:]) != string(p) {
		return pageTorn, seq
	}
	return pageOK, seq
}
