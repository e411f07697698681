//go:build linux

package mapclient

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/mapclient/mapclienttest"
	"github.com/dsmkit/dsm/internal/mapproto"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hangDeadline only catches hangs; nothing is asserted about time.
const hangDeadline = 30 * time.Second

var ps = os.Getpagesize()

// newFakeDaemon starts a stand-in for dsmd that serves region "r" (r9) of
// pages pages and holds the faults on the pages in hold. The tests touch
// the mapping only through ReadAt, WriteAt and Word, which wait in madvise,
// a syscall, except where faults are held (see package mapclienttest).
func newFakeDaemon(t *testing.T, pages int, hold ...int) *mapclienttest.Daemon {
	t.Helper()
	d := mapclienttest.New(t, mapclienttest.Region{Name: "r", ID: 9, Pages: pages})
	d.Hold(hold...)
	return d
}

func mapRegion(t *testing.T, d *mapclienttest.Daemon) (*Client, *Mapping) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hangDeadline)
	defer cancel()
	c, err := Connect(ctx, d.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	m, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	return c, m
}

// waitFault waits until the fake daemon reports a held fault on page p.
func waitFault(t *testing.T, d *mapclienttest.Daemon, p int) {
	t.Helper()
	select {
	case got := <-d.Faults():
		if got != p {
			t.Fatalf("held fault on page %d, want %d", got, p)
		}
	case <-time.After(hangDeadline):
		t.Fatalf("no fault on page %d", p)
	}
}

func TestReadWriteAt(t *testing.T) { testReadWriteAt(t) }

// TestReadWriteAtMemmove: the same where process_vm_readv is refused.
func TestReadWriteAtMemmove(t *testing.T) {
	noVMCopy = true
	defer func() { noVMCopy = false }()
	testReadWriteAt(t)
}

func testReadWriteAt(t *testing.T) {
	d := newFakeDaemon(t, 8)
	_, m := mapRegion(t, d)
	if m.Len() != int64(8*ps) || m.PageSize() != int64(ps) || m.Region() != 9 || m.Name() != "r" || m.Err() != nil {
		t.Fatalf("mapping: len %d page %d region %s name %q err %v", m.Len(), m.PageSize(), m.Region(), m.Name(), m.Err())
	}
	got := make([]byte, 10)
	if n, err := m.ReadAt(got, int64(2*ps+5)); n != 10 || err != nil {
		t.Fatalf("ReadAt: %d, %v", n, err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{3}, 10)) {
		t.Fatalf("ReadAt of page 2: %x, want the daemon's fill 03", got)
	}
	// Across a page boundary, into pages never touched.
	msg := []byte("hello, coherent world")
	off := int64(5*ps - 7)
	if n, err := m.WriteAt(msg, off); n != len(msg) || err != nil {
		t.Fatalf("WriteAt: %d, %v", n, err)
	}
	back := make([]byte, len(msg)+2)
	if n, err := m.ReadAt(back, off-1); n != len(back) || err != nil {
		t.Fatalf("ReadAt: %d, %v", n, err)
	}
	want := append(append([]byte{5}, msg...), 6)
	if !bytes.Equal(back, want) {
		t.Fatalf("read back %q, want %q", back, want)
	}
	// The pages are mapped now: plain loads see the same bytes.
	if !bytes.Equal(m.Bytes()[off:off+int64(len(msg))], msg) {
		t.Fatal("Bytes() does not show the write")
	}
}

func TestRanges(t *testing.T) {
	d := newFakeDaemon(t, 2)
	_, m := mapRegion(t, d)
	size := m.Len()
	p := make([]byte, 8)
	if _, err := m.ReadAt(p, -1); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("ReadAt(-1): %v", err)
	}
	if _, err := m.ReadAt(p, size+1); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("ReadAt past the end: %v", err)
	}
	if n, err := m.ReadAt(p, size); n != 0 || err != io.EOF {
		t.Errorf("ReadAt at the end: %d, %v; want 0, EOF", n, err)
	}
	if n, err := m.ReadAt(p, size-3); n != 3 || err != io.EOF {
		t.Errorf("ReadAt across the end: %d, %v; want 3, EOF", n, err)
	}
	if n, err := m.WriteAt(p, size-3); n != 0 || !errors.Is(err, ErrOutOfRange) {
		t.Errorf("WriteAt across the end: %d, %v", n, err)
	}
	if n, err := m.WriteAt(nil, size); n != 0 || err != nil {
		t.Errorf("empty WriteAt at the end: %d, %v", n, err)
	}
}

// TestDaemonGone: when dsmd goes away with a ReadAt waiting for a fault,
// the ReadAt fails with ErrDaemonGone instead of returning the zeros the
// kernel would hand it, and every later access fails the same way.
func TestDaemonGone(t *testing.T) {
	d := newFakeDaemon(t, 8, 3)
	c, m := mapRegion(t, d)
	if _, err := m.ReadAt(make([]byte, 1), 0); err != nil {
		t.Fatal(err)
	}
	type result struct {
		n   int
		err error
		b   []byte
	}
	res := make(chan result, 1)
	go func() {
		b := make([]byte, 16)
		n, err := m.ReadAt(b, int64(3*ps))
		res <- result{n, err, b}
	}()
	waitFault(t, d, 3)
	select {
	case r := <-res:
		t.Fatalf("ReadAt returned while its fault was held: %d %v", r.n, r.err)
	default:
	}
	d.Die()
	select {
	case r := <-res:
		if !errors.Is(r.err, ErrDaemonGone) || r.n != 0 {
			t.Fatalf("waiting ReadAt: %d, %v (%x); want 0, ErrDaemonGone", r.n, r.err, r.b)
		}
	case <-time.After(hangDeadline):
		t.Fatal("waiting ReadAt not released after the daemon died")
	}
	select {
	case <-m.Done():
	case <-time.After(hangDeadline):
		t.Fatal("Done not closed")
	}
	if _, err := m.ReadAt(make([]byte, 1), 0); !errors.Is(err, ErrDaemonGone) {
		t.Fatalf("ReadAt of a present page after death: %v", err)
	}
	if _, err := m.WriteAt([]byte{1}, 0); !errors.Is(err, ErrDaemonGone) {
		t.Fatalf("WriteAt after death: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ReadAt(make([]byte, 1), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("ReadAt after Close: %v", err)
	}
	// dsmd is back (here: still listening): Map again works.
	m2, err := c.Map(context.Background(), "r")
	if err != nil {
		t.Fatalf("Map after the daemon came back: %v", err)
	}
	b := make([]byte, 1)
	if _, err := m2.ReadAt(b, int64(ps)); err != nil || b[0] != 2 {
		t.Fatalf("ReadAt on the new mapping: %#x, %v", b[0], err)
	}
}

// wantFault fails t unless the access that reports on res faulted.
func wantFault(t *testing.T, what string, res <-chan mapclienttest.TouchResult) {
	t.Helper()
	select {
	case r := <-res:
		switch {
		case r.Err != nil:
			t.Errorf("%s: %v", what, r.Err)
		case !r.Faulted:
			t.Errorf("%s: no fault (read %#x)", what, r.V)
		}
	case <-time.After(hangDeadline):
		t.Fatalf("%s: the access did not return", what)
	}
}

func TestDeadMappingFaults(t *testing.T) {
	testUnservedFaults(t, (*mapclienttest.Daemon).Die, ErrDaemonGone)
}

func TestDeletedMappingFaults(t *testing.T) {
	testUnservedFaults(t, func(d *mapclienttest.Daemon) { d.DeleteRegion("r") }, ErrRegionDeleted)
}

// testUnservedFaults: once the session ends (end ends it), every plain
// access through Bytes() faults, whatever the page's state was: held,
// cached in the memfd but never mapped here, never held, or a load that
// was waiting for dsmd at that moment. None reads zeros, stale data or
// succeeds in storing. The other accesses fail with want, and Close works.
func testUnservedFaults(t *testing.T, end func(*mapclienttest.Daemon), want error) {
	d := newFakeDaemon(t, 8, 4)
	_, m := mapRegion(t, d)
	if _, err := m.ReadAt(make([]byte, 1), 0); err != nil {
		t.Fatal(err)
	}
	d.Fill(0, 1, 0xcc)
	// Resolving a plain load in this process would risk the runtime; this
	// one is never resolved (page 4 is held), only released by the end.
	waiter := mapclienttest.TouchAsync(m.Bytes(), 4*ps+4, false)
	waitFault(t, d, 4)

	end(d)
	select {
	case <-m.Done():
	case <-time.After(hangDeadline):
		t.Fatal("Done not closed")
	}
	if err := m.Err(); !errors.Is(err, want) {
		t.Fatalf("Err: %v, want %v", err, want)
	}
	wantFault(t, "a load waiting for dsmd", waiter)
	for _, a := range []struct {
		what  string
		off   int
		store bool
	}{
		{"load of a page held before", 8, false},
		{"load of a page cached in the memfd, not mapped here", ps + 1, false},
		{"load of a page never held", 2*ps + 2, false},
		{"store to a page never held", 3*ps + 3, true},
	} {
		wantFault(t, a.what, mapclienttest.TouchAsync(m.Bytes(), a.off, a.store))
	}
	if _, err := m.ReadAt(make([]byte, 1), 0); !errors.Is(err, want) {
		t.Errorf("ReadAt: %v, want %v", err, want)
	}
	if _, err := m.WriteAt([]byte{1}, 0); !errors.Is(err, want) {
		t.Errorf("WriteAt: %v, want %v", err, want)
	}
	if err := m.Populate(0, int64(ps), false); !errors.Is(err, want) {
		t.Errorf("Populate: %v, want %v", err, want)
	}
	if err := m.Word(0, true, func(w *uint64) { *w++ }); !errors.Is(err, want) {
		t.Errorf("Word: %v, want %v", err, want)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// TestCopyAfterEnd: a copy that reaches a mapping fenced after the end of
// its session fails with EFAULT, through a syscall or a memmove, instead
// of crashing the process.
func TestCopyAfterEnd(t *testing.T) {
	d := newFakeDaemon(t, 2)
	_, m := mapRegion(t, d)
	if _, err := m.WriteAt([]byte{1}, 0); err != nil {
		t.Fatal(err)
	}
	d.Die()
	<-m.Done()
	for _, memmove := range []bool{false, true} {
		noVMCopy = memmove
		for _, write := range []bool{false, true} {
			if n, err := copyMapped(m.Bytes(), make([]byte, 8), 0, write); n != 0 || !errors.Is(err, unix.EFAULT) {
				t.Errorf("copy (memmove %v, write %v) after the end: %d, %v; want 0, EFAULT", memmove, write, n, err)
			}
		}
	}
	noVMCopy = false
}

// TestCloseReleasesWaiter: Close does not wait for dsmd to answer a fault;
// the waiting ReadAt fails with ErrClosed.
func TestCloseReleasesWaiter(t *testing.T) {
	d := newFakeDaemon(t, 8, 5)
	c, m := mapRegion(t, d)
	res := make(chan error, 1)
	go func() {
		_, err := m.WriteAt([]byte{1, 2, 3}, int64(5*ps))
		res <- err
	}()
	waitFault(t, d, 5)
	if d.Cached(0, 5) {
		t.Fatal("page 5 cached before the fault was answered")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("waiting WriteAt: %v, want ErrClosed", err)
		}
	case <-time.After(hangDeadline):
		t.Fatal("Close did not release the waiting WriteAt")
	}
	if m.Err() != ErrClosed {
		t.Fatalf("Err after Close: %v", m.Err())
	}
	// The released WriteAt did not reach the memfd behind dsmd's back.
	if d.Cached(0, 5) {
		t.Fatal("a WriteAt cut short by Close allocated the page in the memfd")
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Map(context.Background(), "r"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Map on a closed client: %v", err)
	}
}

func TestRefusals(t *testing.T) {
	d := newFakeDaemon(t, 2)
	ctx := context.Background()
	c, err := Connect(ctx, d.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Map(ctx, "nope")
	var se *ServerError
	if !errors.Is(err, ErrUnknownRegion) || !errors.As(err, &se) || se.Code != mapproto.CodeUnknownRegion {
		t.Fatalf("unknown region: %v", err)
	}
	d.SetReply([]byte{mapproto.Version, 200})
	if _, err := c.Map(ctx, "r"); !errors.Is(err, ErrProtocol) {
		t.Fatalf("garbage answer: %v, want ErrProtocol", err)
	}
	ack, _ := mapproto.Encode(mapproto.Msg{Type: mapproto.TypeRegistered})
	d.SetReply(ack)
	if _, err := c.Map(ctx, "r"); !errors.Is(err, ErrProtocol) {
		t.Fatalf("answer without a memfd: %v, want ErrProtocol", err)
	}
	if _, err := Connect(ctx, filepath.Join(t.TempDir(), "none.sock")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no daemon: %v, want ErrUnavailable", err)
	}
}

// TestCopyFaultsInSyscall: the copy itself waits for a fault inside the
// process_vm_readv syscall (a page taken away after the populate).
func TestCopyFaultsInSyscall(t *testing.T) {
	if !vmCopyWorks() {
		t.Skip("process_vm_readv refused here")
	}
	d := newFakeDaemon(t, 8)
	_, m := mapRegion(t, d)
	buf := make([]byte, 2*ps)
	n, err := copyMapped(m.Bytes(), buf, int64(6*ps), false)
	if err != nil || n != len(buf) {
		t.Fatalf("copy: %d, %v", n, err)
	}
	if buf[0] != 7 || buf[ps] != 8 {
		t.Fatalf("copied %#x, %#x; want the daemon's fills 07, 08", buf[0], buf[ps])
	}
}

// TestReadAtFaultsPartsAtOnce: a large ReadAt populates its chunk in parts
// at once, so the faults on the first page of every part are under way
// together (the daemon holds them all), where one populate of the whole
// chunk would wait at the first. Close ends the call.
func TestReadAtFaultsPartsAtOnce(t *testing.T) {
	const parts = 4
	per := populatePart / ps
	var hold []int
	for i := range parts {
		hold = append(hold, i*per)
	}
	d := newFakeDaemon(t, parts*per, hold...)
	_, m := mapRegion(t, d)
	done := make(chan error, 1)
	go func() {
		_, err := m.ReadAt(make([]byte, parts*per*ps), 0)
		done <- err
	}()
	seen := map[int]bool{}
	for len(seen) < parts {
		select {
		case p := <-d.Faults():
			seen[p] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("held faults on pages %v; want the first page of each of the %d parts (%v) under way at once", seen, parts, hold)
		}
	}
	m.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("ReadAt after Close: %v, want ErrClosed", err)
		}
	case <-time.After(hangDeadline):
		t.Fatal("ReadAt still waits after Close")
	}
}
