// Package regionfile is the file format of a region's copy: what
// `dsmctl region export` writes and `dsmctl region import` reads.
//
// A file is a header, then one record per populated page in increasing
// page order, then a trailer. Every integer is big-endian.
//
//	header   magic "DSMREGN1"                  8 bytes
//	         format version (1)                uint16
//	         durability (1 memory, 2 durable)  uint8
//	         name length (1..128)              uint8
//	         page size                         uint32  power of two, 4 KiB..2 MiB
//	         region size in bytes              uint64  a multiple of the page size, at most 16 TiB
//	         directory epoch of the read       uint64
//	         start of the read, Unix ns        int64
//	         name                              name length bytes
//	record   page number                       uint64  below size/page size, strictly increasing
//	         page data                         page size bytes
//	trailer  end marker 0xffffffffffffffff     uint64
//	         record count                      uint64
//	         SHA-256 of every byte before the end marker  32 bytes
//
// All-zero pages have no record: Writer drops them, so a sparse region's
// file holds its written pages only. A Reader accepts a record of zeros
// (it is a valid, if wasteful, file).
//
// The end marker cannot be a page number: the largest region has 2^32
// pages of the smallest size. Nothing may follow the trailer.
//
// A Reader validates as it goes and returns a *FormatError naming the
// byte offset and, inside a record, the page; errors.Is tells
// ErrTruncated, ErrChecksum and ErrCorrupt apart. The checksum is known
// good only when Next has returned io.EOF: a caller that must not act on
// a damaged file reads it through once (Verify) before acting on its
// pages.
package regionfile
