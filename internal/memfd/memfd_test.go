//go:build linux

package memfd

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

var ps = int64(os.Getpagesize())

func create(t *testing.T, size int64) *File {
	t.Helper()
	m, err := Create("memfd-test", size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func mapAll(t *testing.T, m *File, prot Prot) *Mapping {
	t.Helper()
	mp, err := m.Map(0, m.Size(), prot)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mp.Unmap() })
	return mp
}

// blocksOf returns the memory the file really holds (st_blocks, 512 bytes).
func blocksOf(t *testing.T, m *File) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(m.Fd(), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// A 1 TiB region costs nothing until touched, and touching two pages costs
// two pages.
func TestSparseTerabyte(t *testing.T) {
	const tib = int64(1) << 40
	m := create(t, tib)
	if m.Size() != tib {
		t.Fatalf("size %d", m.Size())
	}
	mp := mapAll(t, m, ReadWrite)
	if mp.Len() != tib {
		t.Fatalf("mapping of %d bytes", mp.Len())
	}
	if used := blocksOf(t, m); used != 0 {
		t.Fatalf("untouched 1 TiB memfd holds %d bytes", used)
	}
	b := mp.Bytes()
	b[0] = 1
	b[tib-1] = 2
	if used := blocksOf(t, m); used != 2*ps {
		t.Fatalf("two touched pages hold %d bytes, want %d", used, 2*ps)
	}
	if n, err := m.CachedPages(0, tib); err != nil || n != 2 {
		t.Fatalf("cached pages %d, %v; want 2", n, err)
	}
	if n, err := m.CachedPages(ps, tib-2*ps); err != nil || n != 0 {
		t.Fatalf("cached pages between the two: %d, %v", n, err)
	}
}

func TestSealed(t *testing.T) {
	m := create(t, 4*ps)
	if err := unix.Ftruncate(m.Fd(), ps); !errors.Is(err, unix.EPERM) {
		t.Fatalf("shrink of a sealed memfd: %v, want EPERM", err)
	}
	if err := unix.Ftruncate(m.Fd(), 8*ps); !errors.Is(err, unix.EPERM) {
		t.Fatalf("grow of a sealed memfd: %v, want EPERM", err)
	}
	if _, err := unix.FcntlInt(uintptr(m.Fd()), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); !errors.Is(err, unix.EPERM) {
		t.Fatalf("adding a seal: %v, want EPERM", err)
	}
	if _, err := Create("x", ps+1); !errors.Is(err, ErrRange) {
		t.Fatalf("unaligned size: %v", err)
	}
}

// Punching a page takes it from every mapping: the next load of any
// mapping sees zeros (a new page), and the file holds no memory for it.
func TestPunchHoleDropsEveryMapping(t *testing.T) {
	m := create(t, 4*ps)
	a := mapAll(t, m, ReadWrite)
	b := mapAll(t, m, ReadOnly)
	a.Bytes()[ps] = 0x5a
	if b.Bytes()[ps] != 0x5a {
		t.Fatal("second mapping does not share the page")
	}
	if res, err := b.Resident(0, 4*ps); err != nil || !res[1] || res[0] {
		t.Fatalf("resident %v %v; want only page 1", res, err)
	}
	if err := m.PunchHole(ps, ps); err != nil {
		t.Fatal(err)
	}
	if n, _ := m.CachedPages(0, 4*ps); n != 0 {
		t.Fatalf("%d pages cached after the punch", n)
	}
	if res, _ := b.Resident(0, 4*ps); res[1] {
		t.Fatal("punched page still resident")
	}
	if b.Bytes()[ps] != 0 {
		t.Fatalf("read-only mapping still sees %#x after the punch", b.Bytes()[ps])
	}
	if m.Size() != 4*ps {
		t.Fatal("punch changed the size")
	}
	if err := m.PunchHole(3*ps, 2*ps); !errors.Is(err, ErrRange) {
		t.Fatalf("punch past the end: %v", err)
	}
}

func TestPopulate(t *testing.T) {
	m := create(t, 8*ps)
	mp := mapAll(t, m, ReadWrite)
	if err := mp.PopulateRead(0, 2*ps); err != nil {
		t.Fatal(err)
	}
	// Shared shmem mappings have no zero page: a read fault on a hole
	// allocates a page-cache page, so a read populate caches pages too.
	if n, _ := m.CachedPages(0, 2*ps); n != 2 {
		t.Fatalf("populate-read cached %d pages, want 2", n)
	}
	if err := mp.PopulateWrite(4*ps, 2*ps); err != nil {
		t.Fatal(err)
	}
	if n, _ := m.CachedPages(4*ps, 2*ps); n != 2 {
		t.Fatalf("populate-write cached %d pages, want 2", n)
	}
	if err := mp.PopulateWrite(7*ps, 2*ps); !errors.Is(err, ErrRange) {
		t.Fatalf("populate past the end: %v", err)
	}
	if err := mp.DontFork(); err != nil {
		t.Fatal(err)
	}
	ro := mapAll(t, m, ReadOnly)
	if err := ro.PopulateWrite(0, ps); err == nil {
		t.Fatal("populate-write of a read-only mapping succeeded")
	}
}

func TestFromFD(t *testing.T) {
	m := create(t, 2*ps)
	dup, err := unix.FcntlInt(uintptr(m.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	n, err := FromFD(dup)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.Size() != m.Size() {
		t.Fatalf("size %d, want %d", n.Size(), m.Size())
	}
	mp := mapAll(t, n, ReadWrite)
	mp.Bytes()[0] = 9
	if n, _ := m.CachedPages(0, ps); n != 1 {
		t.Fatal("store through the adopted descriptor not in the original's cache")
	}

	// An unsealed memfd is refused (it could shrink under a mapping).
	raw, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := FromFD(raw); !errors.Is(err, ErrNotMemfd) || !strings.Contains(err.Error(), "sealed") {
		t.Fatalf("unsealed memfd: %v", err)
	}
	f, err := os.CreateTemp(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	fd, _ := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	f.Close()
	if _, err := FromFD(fd); !errors.Is(err, ErrNotMemfd) {
		t.Fatalf("plain file: %v", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Fatal("refused descriptor left open")
	}
}

func TestMappingAfterUnmap(t *testing.T) {
	m := create(t, ps)
	mp, err := m.Map(0, ps, ReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	if mp.Addr() == 0 || mp.Addr()%uint64(ps) != 0 {
		t.Fatalf("address %#x", mp.Addr())
	}
	if err := mp.Unmap(); err != nil {
		t.Fatal(err)
	}
	if err := mp.Unmap(); err != nil {
		t.Fatalf("second unmap: %v", err)
	}
	if err := mp.PopulateRead(0, ps); !errors.Is(err, ErrClosed) {
		t.Fatalf("populate after unmap: %v", err)
	}
	if _, err := m.Map(ps, ps, ReadWrite); !errors.Is(err, ErrRange) {
		t.Fatalf("map past the end: %v", err)
	}
}
