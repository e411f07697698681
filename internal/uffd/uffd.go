//go:build linux

package uffd

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// UFFD is one userfaultfd: the registration of ranges of one process's
// address space (the process that created it) and the queue of that
// process's faults. Any process that holds the descriptor can read the
// faults and resolve them; addresses are always in the registered process.
//
// Methods are safe for concurrent use. Read may block; Close unblocks it.
type UFFD struct {
	f        *os.File        // owns fd; pollable (O_NONBLOCK), so Read parks in the netpoller
	rc       syscall.RawConn // keeps fd valid during each ioctl, even against Close
	fd       int             // the raw descriptor, valid until Close
	features Feature         // as negotiated by UFFDIO_API (by us or by the creator)
	ioctls   Ioctls          // from UFFDIO_API; zero when adopted by FromFD
	pageSize uint64

	mu   sync.Mutex // serializes Read's buffer
	rbuf []byte
}

// Options tune Open.
type Options struct {
	// Optional features requested beyond Required, each only if the kernel
	// offers it. Zero means DefaultOptional; set NoOptional for none.
	Optional Feature
	// NoOptional requests Required only.
	NoOptional bool
}

// Probe reports the features this kernel offers, using a throwaway
// userfaultfd (UFFDIO_API can be issued once per descriptor).
func Probe() (Feature, error) {
	fd, err := newFD()
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	api := uffdioAPI{api: uffdAPI}
	if errno := rawIoctl(fd, reqAPI, unsafe.Pointer(&api)); errno != 0 {
		return 0, fmt.Errorf("%w: UFFDIO_API: %v", ErrUnsupported, errno)
	}
	return Feature(api.features), nil
}

// Open creates a userfaultfd for the calling process (O_CLOEXEC|O_NONBLOCK)
// and performs the UFFDIO_API handshake: it requests Required (failing with
// a *FeatureError that names the missing features and the kernel needed) plus
// the optional features the kernel offers.
func Open(opts Options) (*UFFD, error) {
	offered, err := Probe()
	if err != nil {
		return nil, err
	}
	if err := checkRequired(offered); err != nil {
		return nil, err
	}
	opt := opts.Optional
	if opt == 0 {
		opt = DefaultOptional
	}
	if opts.NoOptional {
		opt = 0
	}
	want := Required | opt&offered
	fd, err := newFD()
	if err != nil {
		return nil, err
	}
	api := uffdioAPI{api: uffdAPI, features: uint64(want)}
	if errno := rawIoctl(fd, reqAPI, unsafe.Pointer(&api)); errno != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: UFFDIO_API with features %s: %v", ErrUnsupported, want, errno)
	}
	u, err := wrap(fd, want)
	if err != nil {
		return nil, err
	}
	u.ioctls = Ioctls(api.ioctls)
	return u, nil
}

// newFD opens an uninitialized userfaultfd: the syscall first, then the
// /dev/userfaultfd device (which a system may allow when the syscall is
// restricted by vm.unprivileged_userfaultfd=0).
func newFD() (int, error) {
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if errno == 0 {
		return int(fd), nil
	}
	if errno == unix.ENOSYS {
		return -1, fmt.Errorf("%w: userfaultfd(2): %v (kernel built without CONFIG_USERFAULTFD)", ErrUnsupported, errno)
	}
	dfd, derr := openDev()
	if derr != nil {
		return -1, fmt.Errorf("%w: userfaultfd(2): %v (vm.unprivileged_userfaultfd=0 needs CAP_SYS_PTRACE); %v",
			ErrUnavailable, errno, derr)
	}
	return dfd, nil
}

// openDev creates a userfaultfd through /dev/userfaultfd (Linux 6.1).
func openDev() (int, error) {
	dev, err := unix.Open("/dev/userfaultfd", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("/dev/userfaultfd: %w", err)
	}
	defer unix.Close(dev)
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(dev), reqDevNew, unix.O_CLOEXEC|unix.O_NONBLOCK)
	if errno != 0 {
		return -1, fmt.Errorf("/dev/userfaultfd USERFAULTFD_IOC_NEW: %w", errno)
	}
	return int(fd), nil
}

// FromFD adopts a userfaultfd received from another process (the creator
// already did UFFDIO_API and registered its ranges). It takes ownership of fd
// (closing it on error), checks that it is a userfaultfd, makes it
// non-blocking and reads the negotiated features from /proc/self/fdinfo.
func FromFD(fd int) (*UFFD, error) {
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil || link != "anon_inode:[userfaultfd]" {
		unix.Close(fd)
		if err == nil {
			err = fmt.Errorf("it is %q", link)
		}
		return nil, fmt.Errorf("%w: fd %d: %v", ErrNotUserfaultfd, fd, err)
	}
	// O_NONBLOCK is a flag of the open file, so this also changes the
	// creator's copy; it does not read it. A blocking userfaultfd reports
	// EPOLLERR to poll, so non-blocking is required.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("uffd: fd %d: set non-blocking: %w", fd, err)
	}
	info, err := readFDInfo(fd)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	if !info.initialized {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: fd %d: UFFDIO_API was not done by its creator", ErrNotUserfaultfd, fd)
	}
	if missing := Required &^ info.features; missing != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: fd %d was set up without required features %s", ErrUnsupported, fd, missing)
	}
	return wrap(fd, info.features)
}

// featureInitialized is the kernel-internal feature bit fdinfo shows on an
// initialized userfaultfd.
const featureInitialized Feature = 1 << 31

// fdInfo is what the kernel shows about a userfaultfd in
// /proc/self/fdinfo/N ("pending:", "total:", "API:\tapi:features:ioctls").
type fdInfo struct {
	pending, total uint64 // faults not yet read; faults read and not yet woken, plus pending
	features       Feature
	initialized    bool
}

func readFDInfo(fd int) (fdInfo, error) {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return fdInfo{}, fmt.Errorf("uffd: fdinfo: %w", err)
	}
	return parseFDInfo(b)
}

func parseFDInfo(b []byte) (fdInfo, error) {
	var info fdInfo
	sawAPI := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, val, ok := bytes.Cut(sc.Bytes(), []byte(":"))
		if !ok {
			continue
		}
		val = bytes.TrimSpace(val)
		switch string(key) {
		case "pending":
			info.pending, _ = strconv.ParseUint(string(val), 10, 64)
		case "total":
			info.total, _ = strconv.ParseUint(string(val), 10, 64)
		case "API":
			f := bytes.Split(val, []byte(":"))
			if len(f) != 3 {
				return info, fmt.Errorf("%w: fdinfo API line %q", ErrNotUserfaultfd, val)
			}
			api, err1 := strconv.ParseUint(string(f[0]), 16, 64)
			feat, err2 := strconv.ParseUint(string(f[1]), 16, 64)
			if err1 != nil || err2 != nil {
				return info, fmt.Errorf("%w: fdinfo API line %q", ErrNotUserfaultfd, val)
			}
			sawAPI = true
			// Bit 31 is the kernel's private UFFD_FEATURE_INITIALIZED (set
			// once UFFDIO_API succeeded, Linux 6.x); older kernels show
			// the negotiated bits only.
			info.features = Feature(feat) &^ featureInitialized
			info.initialized = api == uffdAPI && feat != 0
		}
	}
	if !sawAPI {
		return info, fmt.Errorf("%w: fdinfo has no API line", ErrNotUserfaultfd)
	}
	return info, nil
}

func wrap(fd int, features Feature) (*UFFD, error) {
	f := os.NewFile(uintptr(fd), "userfaultfd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("uffd: %w", err)
	}
	return &UFFD{f: f, rc: rc, fd: fd, features: features, pageSize: uint64(os.Getpagesize())}, nil
}

// Features returns the negotiated feature set.
func (u *UFFD) Features() Feature { return u.features }

// APIIoctls returns the requests UFFDIO_API reported (zero after FromFD).
func (u *UFFD) APIIoctls() Ioctls { return u.ioctls }

// Fd returns the descriptor, valid until Close: for passing it to another
// process (fdpass) or for poll(2). Do not read it directly.
func (u *UFFD) Fd() int { return u.fd }

// PageSize is the base page size resolutions are aligned to.
func (u *UFFD) PageSize() uint64 { return u.pageSize }

// Pending returns the number of faults queued and not yet read, and the
// number of threads currently blocked on this userfaultfd (read or not),
// from /proc/self/fdinfo. It is for tests and diagnostics.
func (u *UFFD) Pending() (queued, blocked uint64, err error) {
	var info fdInfo
	cerr := u.rc.Control(func(fd uintptr) { info, err = readFDInfo(int(fd)) })
	if cerr != nil {
		return 0, 0, ErrClosed
	}
	return info.pending, info.total, err
}

// Close releases the descriptor. When the last copy (in any process) is
// closed the kernel unregisters every range and wakes blocked faulters,
// which then fault normally as if never registered.
func (u *UFFD) Close() error {
	if err := u.f.Close(); err != nil {
		return ErrClosed
	}
	return nil
}

// SetReadDeadline makes a blocked or later Read fail with an error matching
// os.ErrDeadlineExceeded at t (zero: no deadline).
func (u *UFFD) SetReadDeadline(t time.Time) error { return u.f.SetReadDeadline(t) }

// Read blocks until at least one message is available and decodes up to
// len(dst) of them into dst[:n]. It returns ErrClosed after Close. A message
// it cannot decode is skipped and reported as an error wrapping
// ErrUnknownEvent, returned together with the good messages: like an
// io.Reader, handle dst[:n] before looking at the error. With
// FeatureEventFork, a fork message carries a new descriptor that the caller
// must close.
func (u *UFFD) Read(dst []Msg) (int, error) {
	if len(dst) == 0 {
		return 0, nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if need := len(dst) * msgSize; len(u.rbuf) < need {
		u.rbuf = make([]byte, need)
	}
	n, err := u.f.Read(u.rbuf[:len(dst)*msgSize])
	if err != nil {
		if errors.Is(err, os.ErrClosed) {
			return 0, ErrClosed
		}
		return 0, fmt.Errorf("uffd: read: %w", err)
	}
	return DecodeMsgs(dst, u.rbuf[:n])
}

// Register asks for faults of [start, start+length) of the calling process
// (which must be the process that created u) to be reported in the given
// modes. It returns the resolving requests the kernel supports on the range.
func (u *UFFD) Register(start, length uint64, mode Mode) (Ioctls, error) {
	r := &uffdioRegister{rng: uffdioRange{start, length}, mode: uint64(mode)}
	if err := u.ioctl("register", reqRegister, unsafe.Pointer(r), start, length); err != nil {
		return 0, err
	}
	return Ioctls(r.ioctls), nil
}

// Unregister stops reporting faults of the range. Threads blocked on it are
// woken and retry their access as if the range were never registered.
func (u *UFFD) Unregister(start, length uint64) error {
	r := &uffdioRange{start, length}
	return u.ioctl("unregister", reqUnregister, unsafe.Pointer(r), start, length)
}

// Wake wakes threads blocked on faults in the range without resolving
// anything: they retry the access, and fault again if nothing changed.
func (u *UFFD) Wake(start, length uint64) error {
	r := &uffdioRange{start, length}
	return u.ioctl("wake", reqWake, unsafe.Pointer(r), start, length)
}

// Opt modifies a resolving operation.
type Opt uint8

const (
	// MapWP maps the installed pages write-protected (UFFDIO_COPY_MODE_WP,
	// UFFDIO_CONTINUE_MODE_WP): reads proceed, the first write raises a WP
	// fault. The range must be registered with ModeWP.
	MapWP Opt = 1 << iota
	// DontWake leaves the faulting threads blocked; wake them later with
	// Wake (to resolve several ranges before anyone runs).
	DontWake
)

// Copy installs src (a whole number of pages) at dst in the registered
// process: MISSING faults only. On shmem the pages go into the page cache of
// the file, so every mapping of it sees them.
//
// Idempotence: a page that is already present (EEXIST: another resolution, or
// a re-delivered fault) counts as done. Partial progress (EAGAIN with bytes
// copied) is continued. EAGAIN with no progress returns ErrMappingChanging;
// the caller reads pending events and retries the whole call, which is safe
// because of the EEXIST rule. Faulting threads are woken at the end unless
// DontWake.
func (u *UFFD) Copy(dst uint64, src []byte, opt Opt) error {
	n := uint64(len(src))
	if err := u.checkRange("copy", dst, n); err != nil {
		return err
	}
	var mode uint64
	if opt&MapWP != 0 {
		mode |= copyModeWP
	}
	if opt&DontWake != 0 {
		mode |= copyModeDontWake
	}
	skipped := false
	for off := uint64(0); off < n; {
		arg := &uffdioCopy{dst: dst + off, src: unsafe.Pointer(&src[off]), len: n - off, mode: mode}
		errno := u.ioctlErrno(reqCopy, unsafe.Pointer(arg))
		runtime.KeepAlive(src)
		next, err := u.step("copy", dst, n, off, arg.copy, errno)
		if err != nil {
			return err
		}
		skipped = skipped || errno == unix.EEXIST
		off = next
	}
	return u.wakeSkipped(dst, n, skipped, opt)
}

// wakeSkipped wakes the range when a resolution skipped present pages: the
// kernel wakes only the bytes it installed, and a thread may wait on a
// skipped page (a fault re-delivered, or resolved by DontWake elsewhere).
func (u *UFFD) wakeSkipped(start, length uint64, skipped bool, opt Opt) error {
	if !skipped || opt&DontWake != 0 {
		return nil
	}
	return u.Wake(start, length)
}

// ZeroPage installs zero pages in the range (MISSING faults only), with the
// same idempotence and retry contract as Copy.
func (u *UFFD) ZeroPage(start, length uint64, opt Opt) error {
	if err := u.checkRange("zeropage", start, length); err != nil {
		return err
	}
	if opt&MapWP != 0 {
		return &OpError{Op: "zeropage", Start: start, Len: length, Errno: unix.EINVAL}
	}
	var mode uint64
	if opt&DontWake != 0 {
		mode |= zeroPageModeDontWake
	}
	skipped := false
	for off := uint64(0); off < length; {
		arg := &uffdioZeroPage{rng: uffdioRange{start + off, length - off}, mode: mode}
		errno := u.ioctlErrno(reqZeroPage, unsafe.Pointer(arg))
		next, err := u.step("zeropage", start, length, off, arg.zeropage, errno)
		if err != nil {
			return err
		}
		skipped = skipped || errno == unix.EEXIST
		off = next
	}
	return u.wakeSkipped(start, length, skipped, opt)
}

// Continue maps the pages that are already in the page cache of the
// registered range's file (MINOR faults; also a MISSING fault once the page
// has been written into the file meanwhile). The range must be registered
// with ModeMinor. A page absent from the cache is ErrNotCached. Same
// idempotence and retry contract as Copy.
func (u *UFFD) Continue(start, length uint64, opt Opt) error {
	if err := u.checkRange("continue", start, length); err != nil {
		return err
	}
	var mode uint64
	if opt&MapWP != 0 {
		mode |= continueModeWP
	}
	if opt&DontWake != 0 {
		mode |= continueModeDontWake
	}
	skipped := false
	for off := uint64(0); off < length; {
		arg := &uffdioContinue{rng: uffdioRange{start + off, length - off}, mode: mode}
		errno := u.ioctlErrno(reqContinue, unsafe.Pointer(arg))
		next, err := u.step("continue", start, length, off, arg.mapped, errno)
		if err != nil {
			if errors.Is(err, unix.EFAULT) {
				err.(*OpError).Err = ErrNotCached
			}
			return err
		}
		skipped = skipped || errno == unix.EEXIST
		off = next
	}
	return u.wakeSkipped(start, length, skipped, opt)
}

// Poison resolves the faults in the range by installing poison markers
// (UFFDIO_POISON, Linux 6.6; FeaturePoison must have been negotiated by the
// descriptor's creator, else ErrUnsupported): the faulting threads are
// woken (unless DontWake) and get SIGBUS, as does every later access to
// the range, until the marker is removed. MADV_POPULATE_READ/WRITE over a
// marker fails (EHWPOISON on Linux 6.18). Nothing is allocated, nothing is
// written into the file, and nothing else is reported for the range: the
// marker lives in the registered process's page table only. That process
// removes it with madvise(MADV_DONTNEED) on the range (punching the file's
// page does not remove it on Linux 6.18); the next access then faults as
// before.
//
// Unlike Copy, a page of the range whose page-table entry is not empty
// (EEXIST: mapped, poisoned already, or even a write-protect marker) is not
// done: it stays as it is, and Poison fails with an *OpError whose errno
// is EEXIST once the rest of the range is poisoned. EAGAIN is handled as
// for Copy.
func (u *UFFD) Poison(start, length uint64, opt Opt) error {
	if err := u.checkRange("poison", start, length); err != nil {
		return err
	}
	if u.features&FeaturePoison == 0 {
		return &OpError{Op: "poison", Start: start, Len: length, Errno: unix.EINVAL, Err: ErrUnsupported}
	}
	if opt&MapWP != 0 {
		return &OpError{Op: "poison", Start: start, Len: length, Errno: unix.EINVAL}
	}
	var mode uint64
	if opt&DontWake != 0 {
		mode |= poisonModeDontWake
	}
	present := false
	for off := uint64(0); off < length; {
		arg := &uffdioPoison{rng: uffdioRange{start + off, length - off}, mode: mode}
		errno := u.ioctlErrno(reqPoison, unsafe.Pointer(arg))
		next, err := u.step("poison", start, length, off, arg.updated, errno)
		if err != nil {
			return err
		}
		present = present || errno == unix.EEXIST
		off = next
	}
	if present {
		return opError("poison", start, length, unix.EEXIST)
	}
	return nil
}

// WriteProtect sets (on) or clears write protection of the range's PTEs; the
// range must be registered with ModeWP. Clearing wakes the threads blocked on
// WP faults in the range unless DontWake. Setting it on a page with no PTE
// (never mapped in that process, or punched out) leaves a marker, so the
// protection holds when the page is mapped later. EAGAIN returns
// ErrMappingChanging, as for Copy.
func (u *UFFD) WriteProtect(start, length uint64, on bool, opt Opt) error {
	if err := u.checkRange("writeprotect", start, length); err != nil {
		return err
	}
	var mode uint64
	if on {
		mode |= writeProtectModeWP
	}
	if opt&DontWake != 0 {
		mode |= writeProtectModeDontWake
	}
	arg := &uffdioWriteProtect{rng: uffdioRange{start, length}, mode: mode}
	return u.ioctl("writeprotect", reqWriteProtect, unsafe.Pointer(arg), start, length)
}

// step interprets one round of a resolving ioctl that covered
// [start+off, start+length) and reported done bytes (or a negative errno),
// and returns the offset to continue from.
func (u *UFFD) step(op string, start, length, off uint64, done int64, errno syscall.Errno) (uint64, error) {
	switch {
	case errno == 0:
		return length, nil
	case errno == unix.EEXIST:
		// The first page of the remainder is already there: done by someone
		// else, or the fault was re-delivered. Skip it.
		return off + u.pageSize, nil
	case errno == unix.EAGAIN && done > 0:
		return off + uint64(done), nil
	case errno == unix.EINTR:
		return off, nil
	}
	return off, opError(op, start, length, errno)
}

func (u *UFFD) checkRange(op string, start, length uint64) error {
	if length == 0 || start%u.pageSize != 0 || length%u.pageSize != 0 || start+length < start {
		return &OpError{Op: op, Start: start, Len: length, Errno: unix.EINVAL}
	}
	return nil
}

func (u *UFFD) ioctl(op string, req uintptr, arg unsafe.Pointer, start, length uint64) error {
	for {
		errno := u.ioctlErrno(req, arg)
		switch errno {
		case 0:
			return nil
		case unix.EINTR:
			continue
		}
		return opError(op, start, length, errno)
	}
}

// errClosed is the errno ioctlErrno reports when the descriptor is closed.
const errClosed = unix.EBADF

func (u *UFFD) ioctlErrno(req uintptr, arg unsafe.Pointer) syscall.Errno {
	var errno syscall.Errno
	if err := u.rc.Control(func(fd uintptr) { errno = rawIoctl(int(fd), req, arg) }); err != nil {
		return errClosed
	}
	return errno
}

func rawIoctl(fd int, req uintptr, arg unsafe.Pointer) syscall.Errno {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	return errno
}
