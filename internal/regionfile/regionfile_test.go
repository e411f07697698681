package regionfile

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

var testHeader = Header{Name: "feat", PageSize: 4096, Size: 1 << 40, Durability: DurabilityDurable,
	Epoch: 12, ReadAt: time.Unix(1700000000, 5)}

// page is a page of size ps filled with a pattern of seed.
func page(ps int, seed byte) []byte {
	b := make([]byte, ps)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// encode writes h with the given pages (zero pages included as given).
func encode(t testing.TB, h Header, pages map[uint64][]byte, order []uint64) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	for _, no := range order {
		if _, err := w.WritePage(no, pages[no]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// small is a valid file of a sparse 1 TiB region with three written pages
// and a zero page that the writer drops.
func small(t testing.TB) []byte {
	pages := map[uint64][]byte{0: page(4096, 1), 5: make([]byte, 4096), 77: page(4096, 2), 1<<28 - 1: page(4096, 3)}
	return encode(t, testHeader, pages, []uint64{0, 5, 77, 1<<28 - 1})
}

func TestRoundTrip(t *testing.T) {
	f := small(t)
	want := headerFixed + len("feat") + 3*(8+4096) + trailerSize
	if len(f) != want {
		t.Fatalf("a 1 TiB region with 3 written pages encodes to %d bytes, want %d", len(f), want)
	}
	r, err := NewReader(bytes.NewReader(f))
	if err != nil {
		t.Fatal(err)
	}
	h := r.Header()
	if h.Name != testHeader.Name || h.PageSize != testHeader.PageSize || h.Size != testHeader.Size ||
		h.Durability != testHeader.Durability || h.Epoch != testHeader.Epoch || !h.ReadAt.Equal(testHeader.ReadAt) {
		t.Errorf("header %+v, want %+v", h, testHeader)
	}
	wantPages := []struct {
		no   uint64
		seed byte
	}{{0, 1}, {77, 2}, {1<<28 - 1, 3}}
	for _, w := range wantPages {
		no, data, err := r.Next()
		if err != nil {
			t.Fatalf("record of page %d: %v", w.no, err)
		}
		if no != w.no || !bytes.Equal(data, page(4096, w.seed)) {
			t.Errorf("record: page %d, want page %d with its data", no, w.no)
		}
	}
	if _, _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last record: %v, want io.EOF", err)
	}
	if _, _, err := r.Next(); err != io.EOF {
		t.Errorf("Next after io.EOF: %v, want io.EOF again", err)
	}
	if r.Pages() != 3 || r.Offset() != int64(len(f)) || !bytes.Equal(r.Sum(), f[len(f)-32:]) {
		t.Errorf("Pages %d Offset %d Sum %x: want 3, %d, the trailer's", r.Pages(), r.Offset(), r.Sum(), len(f))
	}
	if _, n, err := Verify(bytes.NewReader(f)); err != nil || n != 3 {
		t.Errorf("Verify = %d, %v; want 3 records", n, err)
	}
}

func TestEmptyRegion(t *testing.T) {
	h := testHeader
	h.ReadAt = time.Time{}
	f := encode(t, h, nil, nil)
	got, n, err := Verify(bytes.NewReader(f))
	if err != nil || n != 0 || !got.ReadAt.IsZero() {
		t.Fatalf("Verify of an empty region's file = %+v, %d, %v", got, n, err)
	}
}

// TestReaderAcceptsZeroPage: Writer drops all-zero pages, but a record of
// zeros is valid and read back as it is.
func TestReaderAcceptsZeroPage(t *testing.T) {
	h := Header{Name: "z", PageSize: 4096, Size: 3 * 4096, Durability: DurabilityMemory}
	var buf bytes.Buffer
	sum := sha256.New()
	w := io.MultiWriter(&buf, sum)
	b := make([]byte, headerFixed)
	copy(b, Magic)
	binary.BigEndian.PutUint16(b[8:], Version)
	b[10], b[11] = byte(DurabilityMemory), 1
	binary.BigEndian.PutUint32(b[12:], h.PageSize)
	binary.BigEndian.PutUint64(b[16:], h.Size)
	w.Write(append(b, 'z'))
	w.Write(binary.BigEndian.AppendUint64(nil, 2))
	w.Write(make([]byte, 4096))
	tr := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, endMarker), 1)
	buf.Write(sum.Sum(tr))
	got, n, err := Verify(&buf)
	if err != nil || n != 1 || got.Name != "z" || !got.ReadAt.IsZero() {
		t.Fatalf("Verify of a file with a zero record = %+v, %d, %v", got, n, err)
	}
}

func TestWriterRefuses(t *testing.T) {
	for _, h := range []Header{
		{Name: "a", PageSize: 3000, Size: 3000, Durability: DurabilityMemory},
		{Name: "a", PageSize: 4 << 20, Size: 4 << 20, Durability: DurabilityMemory},
		{Name: "a", PageSize: 4096, Size: 4097, Durability: DurabilityMemory},
		{Name: "a", PageSize: 4096, Size: 32 << 40, Durability: DurabilityMemory},
		{Name: "", PageSize: 4096, Size: 4096, Durability: DurabilityMemory},
		{Name: "a b", PageSize: 4096, Size: 4096, Durability: DurabilityMemory},
		{Name: strings.Repeat("a", 129), PageSize: 4096, Size: 4096, Durability: DurabilityMemory},
		{Name: "a", PageSize: 4096, Size: 4096},
		{Name: "a", Size: 4096, Durability: DurabilityMemory},
	} {
		if _, err := NewWriter(io.Discard, h); err == nil {
			t.Errorf("NewWriter(%+v) accepted it", h)
		}
	}
	w, err := NewWriter(io.Discard, Header{Name: "a", PageSize: 4096, Size: 4 * 4096, Durability: DurabilityMemory})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WritePage(0, make([]byte, 100)); err == nil {
		t.Error("WritePage of a short page accepted it")
	}
	if _, err := w.WritePage(4, page(4096, 1)); err == nil {
		t.Error("WritePage past the end accepted it")
	}
	if ok, err := w.WritePage(2, page(4096, 1)); !ok || err != nil {
		t.Fatalf("WritePage(2) = %v, %v", ok, err)
	}
	if _, err := w.WritePage(2, page(4096, 1)); err == nil {
		t.Error("WritePage of the same page twice accepted it")
	}
	if ok, err := w.WritePage(3, make([]byte, 4096)); ok || err != nil {
		t.Errorf("WritePage of a zero page = %v, %v; want dropped, no error", ok, err)
	}
	if w.Pages() != 1 {
		t.Errorf("Pages = %d, want 1", w.Pages())
	}
}

// put64 returns a copy of f with v at off.
func put64(f []byte, off int, v uint64) []byte {
	g := bytes.Clone(f)
	binary.BigEndian.PutUint64(g[off:], v)
	return g
}

func TestReaderErrors(t *testing.T) {
	f := small(t)
	hdr := headerFixed + len("feat")
	rec := 8 + 4096
	end := len(f) - trailerSize
	flip := func(off int) []byte { g := bytes.Clone(f); g[off] ^= 0x40; return g }
	cases := []struct {
		name string
		file []byte
		err  error
		want string // in the message
	}{
		{"empty", nil, ErrTruncated, "at byte 0"},
		{"magic", flip(3), ErrCorrupt, "not a region file"},
		{"version", flip(9), ErrCorrupt, "format version"},
		{"durability", flip(10), ErrCorrupt, "at byte 10: header: Durability"},
		{"name length 0", func() []byte { g := bytes.Clone(f); g[11] = 0; return g }(), ErrCorrupt, "name length 0"},
		{"page size", flip(14), ErrCorrupt, "at byte 12: header: PageSize"},
		{"size", put64(f, 16, 4097), ErrCorrupt, "at byte 16: header: Size"},
		{"name", func() []byte { g := bytes.Clone(f); g[headerFixed] = ' '; return g }(), ErrCorrupt, "at byte 40: header: Name"},
		{"header cut", f[:20], ErrTruncated, "at byte 20"},
		{"page past end", put64(f, hdr+rec, 1<<28), ErrCorrupt, "(page 268435456): page number past"},
		{"page order", put64(f, hdr+rec, 0), ErrCorrupt, "(page 0): page number not above"},
		{"data flipped", flip(hdr + rec + 8 + 100), ErrChecksum, "SHA-256"},
		{"record cut", f[:hdr+rec+50], ErrTruncated, "(page 77)"},
		{"no trailer", f[:end], ErrTruncated, "after 3 records, without a trailer"},
		{"trailer cut", f[:len(f)-1], ErrTruncated, "trailer"},
		{"count", put64(f, end+8, 2), ErrCorrupt, "counts 2 records, the file holds 3"},
		{"sum", flip(len(f) - 1), ErrChecksum, "SHA-256"},
		{"trailing bytes", append(bytes.Clone(f), 0), ErrCorrupt, "follow the trailer"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := Verify(bytes.NewReader(c.file))
			if !errors.Is(err, c.err) {
				t.Fatalf("Verify = %v, want %v", err, c.err)
			}
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Fatalf("%v is not a *FormatError", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
		})
	}
}

// FuzzReader feeds arbitrary bytes to the Reader: it must not panic, it
// must end in io.EOF or an error, and a file it accepts must re-encode to
// the same bytes (the format has one encoding per content).
func FuzzReader(f *testing.F) {
	valid := small(f)
	f.Add(valid)
	f.Add(valid[:len(valid)-1])
	f.Add(valid[:headerFixed+10])
	g := bytes.Clone(valid)
	g[headerFixed+4+8+200] ^= 1
	f.Add(g)
	f.Add(encode(f, Header{Name: "z", PageSize: 4096, Size: 8192, Durability: DurabilityMemory}, nil, nil))
	f.Add([]byte(Magic))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := NewReader(bytes.NewReader(b))
		if err != nil {
			return
		}
		h := r.Header()
		var out bytes.Buffer
		w, err := NewWriter(&out, h)
		if err != nil {
			t.Fatalf("the reader accepted a header the writer refuses: %+v: %v", h, err)
		}
		zeros := false
		for {
			no, data, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return
			}
			if uint64(len(data)) != uint64(h.PageSize) || no >= h.Pages() {
				t.Fatalf("record of page %d with %d bytes in a region of %d pages of %d", no, len(data), h.Pages(), h.PageSize)
			}
			zeros = zeros || IsZero(data)
			if _, err := w.WritePage(no, data); err != nil {
				t.Fatalf("re-encoding page %d: %v", no, err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if !zeros && !bytes.Equal(out.Bytes(), b) {
			t.Fatalf("an accepted file of %d bytes re-encodes to %d different bytes", len(b), out.Len())
		}
	})
}
