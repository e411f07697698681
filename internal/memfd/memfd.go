//go:build linux

package memfd

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Sentinel errors.
var (
	// ErrNotMemfd: a descriptor handed to FromFD is not a memfd.
	ErrNotMemfd = errors.New("memfd: file descriptor is not a memfd")
	// ErrRange: an offset or length outside the file, or not page aligned.
	ErrRange = errors.New("memfd: range out of bounds or not page aligned")
	// ErrClosed: the File or Mapping was closed.
	ErrClosed = errors.New("memfd: closed")
)

// File is a memfd of a fixed size: the page cache of one region. It is sparse:
// pages cost memory only once written (or installed by UFFDIO_COPY).
type File struct {
	f    *os.File
	size int64
}

// FixedSeals are the seals Create applies: the size can never change (a
// client that shrank the file would make every other mapping SIGBUS), and no
// further seal can be added (F_SEAL_WRITE would forbid punching holes).
const FixedSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// Create makes a memfd of size bytes (a multiple of the page size; it may be
// far larger than memory: nothing is allocated until touched), close-on-exec,
// not executable, and sealed with FixedSeals. The name shows in
// /proc/PID/maps as "/memfd:name".
func Create(name string, size int64) (*File, error) {
	if size <= 0 || size%int64(os.Getpagesize()) != 0 {
		return nil, fmt.Errorf("%w: size %d", ErrRange, size)
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_NOEXEC_SEAL)
	if errors.Is(err, unix.EINVAL) {
		// MFD_NOEXEC_SEAL is Linux 6.3; older kernels get a plain sealable memfd.
		fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd: create %q: %w", name, err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("memfd: size %q to %d: %w", name, size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, FixedSeals); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("memfd: seal %q: %w", name, err)
	}
	return &File{f: os.NewFile(uintptr(fd), "memfd:"+name), size: size}, nil
}

// FromFD adopts a memfd received from another process (taking ownership of
// fd, closing it on error). It checks that fd is a memfd and that its size
// can no longer shrink (F_SEAL_SHRINK), so mapping it cannot SIGBUS later.
func FromFD(fd int) (*File, error) {
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil || !strings.HasPrefix(link, "/memfd:") {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: fd %d (%q)", ErrNotMemfd, fd, link)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: fd %d is not sealed against shrinking (seals %#x, %v)", ErrNotMemfd, fd, seals, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("memfd: fstat fd %d: %w", fd, err)
	}
	return &File{f: os.NewFile(uintptr(fd), link), size: st.Size}, nil
}

// Size is the file's size in bytes.
func (m *File) Size() int64 { return m.size }

// Fd returns the descriptor (for passing to another process), valid until
// Close.
func (m *File) Fd() int { return int(m.f.Fd()) }

// Close closes the descriptor. Mappings stay valid until unmapped; the memory
// is freed when the last descriptor and mapping are gone.
func (m *File) Close() error { return m.f.Close() }

func (m *File) check(off, length int64) error {
	ps := int64(os.Getpagesize())
	if off < 0 || length <= 0 || off%ps != 0 || length%ps != 0 || off > m.size || length > m.size-off {
		return fmt.Errorf("%w: [%d, +%d) of %d", ErrRange, off, length, m.size)
	}
	return nil
}

// PunchHole drops the pages of [off, off+length) from the page cache and
// from every mapping of the file in every process (FALLOC_FL_PUNCH_HOLE,
// keeping the size). The next access to them finds no page: a MISSING fault
// where the range is registered with userfaultfd, a fresh zero page
// otherwise.
func (m *File) PunchHole(off, length int64) error {
	if err := m.check(off, length); err != nil {
		return err
	}
	if err := unix.Fallocate(m.Fd(), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length); err != nil {
		return fmt.Errorf("memfd: punch [%d, +%d): %w", off, length, err)
	}
	return nil
}

// CachedPages returns how many pages of [off, off+length) hold data in the
// page cache, found with lseek(SEEK_DATA/SEEK_HOLE). It does not touch the
// pages (so it does not fault anything in) and ignores whether any process
// maps them.
func (m *File) CachedPages(off, length int64) (int64, error) {
	if err := m.check(off, length); err != nil {
		return 0, err
	}
	ps := int64(os.Getpagesize())
	end := off + length
	var pages int64
	fd := m.Fd()
	for pos := off; pos < end; {
		data, err := unix.Seek(fd, pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || (err == nil && data >= end) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("memfd: SEEK_DATA: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return 0, fmt.Errorf("memfd: SEEK_HOLE: %w", err)
		}
		hole = min(hole, end)
		pages += (hole - data + ps - 1) / ps
		pos = hole
	}
	return pages, nil
}

// Prot is the protection of a mapping.
type Prot int

// Protections.
const (
	ReadWrite Prot = unix.PROT_READ | unix.PROT_WRITE
	ReadOnly  Prot = unix.PROT_READ
)

// Map maps [off, off+length) of the file MAP_SHARED: stores are stores into
// the file, seen by every other mapping. Mapping costs no memory by itself.
func (m *File) Map(off, length int64, prot Prot) (*Mapping, error) {
	if err := m.check(off, length); err != nil {
		return nil, err
	}
	return MapFD(m.Fd(), off, length, prot)
}

// MapFD maps [off, off+length) of any file descriptor MAP_SHARED.
func MapFD(fd int, off, length int64, prot Prot) (*Mapping, error) {
	b, err := unix.Mmap(fd, off, int(length), int(prot), unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("memfd: mmap [%d, +%d): %w", off, length, err)
	}
	return &Mapping{b: b}, nil
}
