package regionfile

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"time"

	"github.com/dsmkit/dsm/directory"
)

// Magic opens every region file.
const Magic = "DSMREGN1"

// Version is the format version this package writes and reads.
const Version = 1

// headerFixed is the size of the header before the name.
const headerFixed = 8 + 2 + 1 + 1 + 4 + 8 + 8 + 8

// endMarker stands where a page number would, to open the trailer.
const endMarker = ^uint64(0)

// trailerSize is the end marker, the record count and the SHA-256.
const trailerSize = 8 + 8 + sha256.Size

// Durability is the region's durability as recorded in a file.
type Durability uint8

const (
	// DurabilityMemory: the region's pages live in memory only.
	DurabilityMemory Durability = 1 + iota
	// DurabilityDurable: the region was created durable.
	DurabilityDurable
)

func (d Durability) String() string {
	switch d {
	case DurabilityMemory:
		return "memory"
	case DurabilityDurable:
		return "durable"
	}
	return fmt.Sprintf("Durability(%d)", uint8(d))
}

// Header describes the region a file is a copy of.
type Header struct {
	Name       string
	PageSize   uint32
	Size       uint64 // bytes, a multiple of PageSize
	Durability Durability
	// Epoch is the directory epoch the region was described in when the
	// read started; ReadAt is when it started (zero: not recorded). Pages
	// were read one after the other from then on.
	Epoch  uint64
	ReadAt time.Time
}

// Pages is the number of pages of the region.
func (h Header) Pages() uint64 { return h.Size / uint64(h.PageSize) }

// validate checks h against the limits of a region (directory.RegionSpec).
func (h Header) validate() error {
	_, err := h.check()
	return err
}

// check is validate, with the byte offset of the faulty field in the
// header.
func (h Header) check() (int64, error) {
	if h.Durability != DurabilityMemory && h.Durability != DurabilityDurable {
		return 10, fmt.Errorf("Durability: %d is neither memory (1) nor durable (2)", uint8(h.Durability))
	}
	if h.PageSize == 0 {
		return 12, errors.New("PageSize: zero")
	}
	if _, err := (directory.RegionSpec{Name: h.Name, Size: h.Size, PageSize: h.PageSize}).Normalize(); err != nil {
		var se *directory.SpecError
		if !errors.As(err, &se) {
			return 0, err
		}
		at := map[string]int64{"Name": headerFixed, "PageSize": 12, "Size": 16}[se.Field]
		return at, fmt.Errorf("%s: %s", se.Field, se.Reason)
	}
	return 0, nil
}

// Sentinel errors, under every *FormatError.
var (
	// ErrTruncated: the file ends before its trailer.
	ErrTruncated = errors.New("regionfile: truncated")
	// ErrChecksum: the SHA-256 of the trailer is not that of the file.
	ErrChecksum = errors.New("regionfile: checksum mismatch")
	// ErrCorrupt: a field holds a value the format does not allow.
	ErrCorrupt = errors.New("regionfile: corrupt")
)

// FormatError is a fault of a file: where it is and what is wrong.
type FormatError struct {
	// Offset is the byte offset in the file of the faulty field.
	Offset int64
	// Page is the page number of the record at fault, when HasPage.
	Page    uint64
	HasPage bool
	Reason  string
	Err     error // ErrTruncated, ErrChecksum or ErrCorrupt
}

func (e *FormatError) Error() string {
	what := "corrupt"
	switch e.Err {
	case ErrTruncated:
		what = "truncated"
	case ErrChecksum:
		what = "checksum mismatch"
	}
	if e.HasPage {
		return fmt.Sprintf("regionfile: %s at byte %d (page %d): %s", what, e.Offset, e.Page, e.Reason)
	}
	return fmt.Sprintf("regionfile: %s at byte %d: %s", what, e.Offset, e.Reason)
}

// Unwrap makes errors.Is(err, ErrTruncated) and the others hold.
func (e *FormatError) Unwrap() error { return e.Err }

// IsZero says whether every byte of b is zero.
func IsZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Writer writes a region file to an io.Writer: NewWriter writes the
// header, WritePage a record, Close the trailer.
type Writer struct {
	w     *bufio.Writer
	h     Header
	sum   hash.Hash
	pages uint64 // records written
	next  uint64 // the lowest page number WritePage accepts
	err   error  // the first error; every later call returns it
	done  bool
}

// NewWriter checks h and writes it to w.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	if err := h.validate(); err != nil {
		return nil, fmt.Errorf("regionfile: header: %w", err)
	}
	x := &Writer{w: bufio.NewWriterSize(w, 256<<10), h: h, sum: sha256.New()}
	b := make([]byte, headerFixed, headerFixed+len(h.Name))
	copy(b, Magic)
	binary.BigEndian.PutUint16(b[8:], Version)
	b[10] = byte(h.Durability)
	b[11] = byte(len(h.Name))
	binary.BigEndian.PutUint32(b[12:], h.PageSize)
	binary.BigEndian.PutUint64(b[16:], h.Size)
	binary.BigEndian.PutUint64(b[24:], h.Epoch)
	if !h.ReadAt.IsZero() {
		binary.BigEndian.PutUint64(b[32:], uint64(h.ReadAt.UnixNano()))
	}
	b = append(b, h.Name...)
	if x.write(b); x.err != nil {
		return nil, x.err
	}
	return x, nil
}

func (x *Writer) write(b []byte) {
	if x.err != nil {
		return
	}
	x.sum.Write(b)
	_, x.err = x.w.Write(b)
}

// WritePage writes page no with data (exactly the page size). Page numbers
// must increase from call to call. An all-zero page is not written; it
// counts in neither Pages nor the file. WritePage reports whether it wrote
// a record.
func (x *Writer) WritePage(no uint64, data []byte) (bool, error) {
	switch {
	case x.err != nil:
		return false, x.err
	case x.done:
		return false, errors.New("regionfile: WritePage after Close")
	case uint64(len(data)) != uint64(x.h.PageSize):
		return false, fmt.Errorf("regionfile: page %d: %d bytes, want the page size %d", no, len(data), x.h.PageSize)
	case no >= x.h.Pages():
		return false, fmt.Errorf("regionfile: page %d is past the region's %d pages", no, x.h.Pages())
	case no < x.next:
		return false, fmt.Errorf("regionfile: page %d after page %d: pages must increase", no, x.next-1)
	}
	x.next = no + 1
	if IsZero(data) {
		return false, nil
	}
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], no)
	x.write(n[:])
	x.write(data)
	if x.err != nil {
		return false, x.err
	}
	x.pages++
	return true, nil
}

// Pages is the number of records written so far.
func (x *Writer) Pages() uint64 { return x.pages }

// Sum is the file's SHA-256 (the trailer's) once Close has succeeded;
// nil before.
func (x *Writer) Sum() []byte {
	if !x.done || x.err != nil {
		return nil
	}
	return x.sum.Sum(nil)
}

// Close writes the trailer and flushes. It does not close the underlying
// writer.
func (x *Writer) Close() error {
	if x.err != nil || x.done {
		return x.err
	}
	x.done = true
	t := make([]byte, 16, trailerSize)
	binary.BigEndian.PutUint64(t, endMarker)
	binary.BigEndian.PutUint64(t[8:], x.pages)
	t = x.sum.Sum(t)
	if _, x.err = x.w.Write(t); x.err != nil {
		return x.err
	}
	x.err = x.w.Flush()
	return x.err
}

// Reader reads and validates a region file from an io.Reader.
type Reader struct {
	r     *bufio.Reader
	h     Header
	sum   hash.Hash
	off   int64  // bytes consumed
	pages uint64 // records read
	next  uint64 // the lowest page number the next record may have
	buf   []byte // one page
	err   error  // sticky: the first error, or io.EOF after the trailer
}

// NewReader reads and checks the header.
func NewReader(r io.Reader) (*Reader, error) {
	x := &Reader{r: bufio.NewReaderSize(r, 256<<10), sum: sha256.New()}
	b := make([]byte, headerFixed)
	if err := x.read(b[:8], "magic", false); err != nil {
		return nil, err
	}
	if string(b[:8]) != Magic {
		return nil, x.corrupt(0, fmt.Sprintf("magic %q, want %q: not a region file", b[:8], Magic))
	}
	if err := x.read(b[8:], "header", false); err != nil {
		return nil, err
	}
	if v := binary.BigEndian.Uint16(b[8:]); v != Version {
		return nil, x.corrupt(8, fmt.Sprintf("format version %d, this build reads version %d", v, Version))
	}
	h := Header{
		Durability: Durability(b[10]),
		PageSize:   binary.BigEndian.Uint32(b[12:]),
		Size:       binary.BigEndian.Uint64(b[16:]),
		Epoch:      binary.BigEndian.Uint64(b[24:]),
	}
	if ns := int64(binary.BigEndian.Uint64(b[32:])); ns != 0 {
		h.ReadAt = time.Unix(0, ns)
	}
	nameLen := int(b[11])
	if nameLen == 0 || nameLen > directory.MaxNameLen {
		return nil, x.corrupt(11, fmt.Sprintf("name length %d, want 1 to %d", nameLen, directory.MaxNameLen))
	}
	name := make([]byte, nameLen)
	if err := x.read(name, "region name", false); err != nil {
		return nil, err
	}
	h.Name = string(name)
	if at, err := h.check(); err != nil {
		return nil, x.corrupt(at, "header: "+err.Error())
	}
	x.h = h
	x.buf = make([]byte, h.PageSize)
	return x, nil
}

// Header is the file's header.
func (x *Reader) Header() Header { return x.h }

// Offset is the number of bytes read so far.
func (x *Reader) Offset() int64 { return x.off }

// Pages is the number of records read so far.
func (x *Reader) Pages() uint64 { return x.pages }

// read fills b from the file, into the checksum unless trailer is set.
func (x *Reader) read(b []byte, what string, trailer bool) error {
	n, err := io.ReadFull(x.r, b)
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return &FormatError{Offset: x.off + int64(n), Reason: fmt.Sprintf("the file ends %d bytes into the %d of the %s", n, len(b), what), Err: ErrTruncated}
	}
	if err != nil {
		return fmt.Errorf("regionfile: reading the %s at byte %d: %w", what, x.off+int64(n), err)
	}
	if !trailer {
		x.sum.Write(b)
	}
	x.off += int64(n)
	return nil
}

func (x *Reader) corrupt(at int64, reason string) error {
	return &FormatError{Offset: at, Reason: reason, Err: ErrCorrupt}
}

// Next returns the next record: its page number and data (valid until the
// next call). After the last record it checks the trailer and the end of
// the file and returns io.EOF; every fault is a *FormatError (or the
// underlying reader's error), and later calls return it again.
func (x *Reader) Next() (uint64, []byte, error) {
	if x.err != nil {
		return 0, nil, x.err
	}
	no, data, err := x.next1()
	x.err = err
	return no, data, err
}

func (x *Reader) next1() (uint64, []byte, error) {
	at := x.off
	var n [8]byte
	if _, err := io.ReadFull(x.r, n[:]); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return 0, nil, &FormatError{Offset: at, Reason: fmt.Sprintf("the file ends after %d records, without a trailer", x.pages), Err: ErrTruncated}
		}
		return 0, nil, fmt.Errorf("regionfile: reading at byte %d: %w", at, err)
	}
	no := binary.BigEndian.Uint64(n[:])
	if no == endMarker {
		x.off += 8
		return 0, nil, x.trailer(at)
	}
	x.sum.Write(n[:])
	x.off += 8
	switch {
	case no >= x.h.Pages():
		return 0, nil, &FormatError{Offset: at, Page: no, HasPage: true, Err: ErrCorrupt,
			Reason: fmt.Sprintf("page number past the region's %d pages", x.h.Pages())}
	case no < x.next:
		return 0, nil, &FormatError{Offset: at, Page: no, HasPage: true, Err: ErrCorrupt,
			Reason: fmt.Sprintf("page number not above the previous record's (%d)", x.next-1)}
	}
	if err := x.read(x.buf, fmt.Sprintf("data of page %d", no), false); err != nil {
		var fe *FormatError
		if errors.As(err, &fe) {
			fe.Page, fe.HasPage = no, true
		}
		return 0, nil, err
	}
	x.next = no + 1
	x.pages++
	return no, x.buf, nil
}

// trailer checks the rest of the trailer (the end marker at byte at has
// been read) and that the file ends there.
func (x *Reader) trailer(at int64) error {
	t := make([]byte, trailerSize-8)
	if err := x.read(t, "trailer", true); err != nil {
		return err
	}
	if c := binary.BigEndian.Uint64(t); c != x.pages {
		return x.corrupt(at+8, fmt.Sprintf("the trailer counts %d records, the file holds %d", c, x.pages))
	}
	if got := x.sum.Sum(nil); !bytes.Equal(got, t[8:]) {
		return &FormatError{Offset: at + 16, Err: ErrChecksum,
			Reason: fmt.Sprintf("SHA-256 of bytes 0-%d is %x, the trailer says %x", at-1, got, t[8:])}
	}
	var one [1]byte
	switch n, err := io.ReadFull(x.r, one[:]); {
	case n > 0:
		return x.corrupt(x.off, "bytes follow the trailer")
	case err != io.EOF:
		return fmt.Errorf("regionfile: reading at byte %d: %w", x.off, err)
	}
	return io.EOF
}

// Sum is the file's SHA-256 as its trailer states it, once Next has
// returned io.EOF (nil before).
func (x *Reader) Sum() []byte {
	if x.err != io.EOF {
		return nil
	}
	return x.sum.Sum(nil)
}

// Verify reads a whole file and checks it; it returns the header and the
// number of records of a valid file.
func Verify(r io.Reader) (Header, uint64, error) {
	x, err := NewReader(r)
	if err != nil {
		return Header{}, 0, err
	}
	for {
		if _, _, err := x.Next(); err == io.EOF {
			return x.h, x.pages, nil
		} else if err != nil {
			return x.h, x.pages, err
		}
	}
}
