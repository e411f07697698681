//go:build linux

package uffd

import (
	"errors"
	"os"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/memfd"
)

// These tests register ranges of this process but never touch registered
// memory: a fault here would have to be resolved by this process itself,
// which is exactly what the service never does. Faults are exercised across
// processes in shmem_test.go.

func openOrSkip(t *testing.T, opts Options) *UFFD {
	t.Helper()
	u, err := Open(opts)
	if errors.Is(err, ErrUnsupported) || errors.Is(err, ErrUnavailable) {
		t.Skipf("no userfaultfd here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	return u
}

func mapRegion(t *testing.T, pages int) *memfd.Mapping {
	t.Helper()
	mf, err := memfd.Create("uffd-unit", int64(pages*os.Getpagesize()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mf.Close() })
	mp, err := mf.Map(0, mf.Size(), memfd.ReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mp.Unmap() })
	return mp
}

func TestOpenNegotiatesRequired(t *testing.T) {
	u := openOrSkip(t, Options{})
	if u.Features()&Required != Required {
		t.Fatalf("negotiated %s, lacking %s", u.Features(), Required&^u.Features())
	}
	offered, err := Probe()
	if err != nil {
		t.Fatal(err)
	}
	if want := Required | DefaultOptional&offered; u.Features() != want {
		t.Fatalf("negotiated %s, want %s", u.Features(), want)
	}
	for _, nr := range []uint{IoctlAPI, IoctlRegister, IoctlUnregister} {
		if !u.APIIoctls().Has(nr) {
			t.Errorf("UFFDIO_API reports %s, lacking %#x", u.APIIoctls(), nr)
		}
	}
	// The handshake is once per descriptor.
	again := uffdioAPI{api: uffdAPI}
	if errno := u.ioctlErrno(reqAPI, unsafe.Pointer(&again)); errno == 0 {
		t.Fatal("a second UFFDIO_API on the same descriptor succeeded")
	}
	// The fd is what fdinfo describes; FromFD on a duplicate agrees.
	dup, err := unix.FcntlInt(uintptr(u.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	v, err := FromFD(dup)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if v.Features() != u.Features() {
		t.Fatalf("FromFD sees %s, Open negotiated %s", v.Features(), u.Features())
	}
	if q, b, err := v.Pending(); err != nil || q != 0 || b != 0 {
		t.Fatalf("idle userfaultfd: pending %d blocked %d %v", q, b, err)
	}
}

func TestNoOptional(t *testing.T) {
	u := openOrSkip(t, Options{NoOptional: true})
	if u.Features() != Required {
		t.Fatalf("negotiated %s, want exactly %s", u.Features(), Required)
	}
}

// The /dev/userfaultfd path gives a descriptor that accepts the handshake.
func TestOpenDev(t *testing.T) {
	fd, err := openDev()
	if err != nil {
		t.Skipf("/dev/userfaultfd not usable here: %v", err)
	}
	defer unix.Close(fd)
	api := uffdioAPI{api: uffdAPI, features: uint64(Required)}
	if errno := rawIoctl(fd, reqAPI, unsafe.Pointer(&api)); errno != 0 {
		t.Fatalf("UFFDIO_API on a /dev/userfaultfd descriptor: %v", errno)
	}
	if Feature(api.features)&Required != Required {
		t.Fatalf("features %s", Feature(api.features))
	}
}

func TestRegisterWithoutFaulting(t *testing.T) {
	u := openOrSkip(t, Options{})
	mp := mapRegion(t, 4)
	ps := u.PageSize()
	ioctls, err := u.Register(mp.Addr(), uint64(mp.Len()), ModeMissing|ModeWP|ModeMinor)
	if err != nil {
		t.Fatal(err)
	}
	if !ioctls.Has(IoctlCopy) || !ioctls.Has(IoctlContinue) || !ioctls.Has(IoctlWriteProtect) {
		t.Fatalf("register offers %s", ioctls)
	}
	if err := u.WriteProtect(mp.Addr(), uint64(mp.Len()), true, 0); err != nil {
		t.Fatalf("write-protect an untouched range: %v", err)
	}
	if err := u.Wake(mp.Addr(), ps); err != nil {
		t.Fatalf("wake with nobody waiting: %v", err)
	}
	var oe *OpError
	if err := u.Continue(mp.Addr()+1, ps, 0); !errors.As(err, &oe) || !errors.Is(err, unix.EINVAL) {
		t.Fatalf("unaligned continue: %v", err)
	}
	if err := u.Copy(mp.Addr(), make([]byte, 10), 0); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("copy of a partial page: %v", err)
	}
	if err := u.ZeroPage(mp.Addr(), ps, MapWP); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("zeropage with WP: %v", err)
	}
	if err := u.Unregister(mp.Addr(), uint64(mp.Len())); err != nil {
		t.Fatal(err)
	}
	// Unregistered: the memory is plain shared memory again.
	mp.Bytes()[0] = 7
	if mp.Bytes()[0] != 7 {
		t.Fatal("store lost")
	}
	// WP on an unregistered range is refused.
	if err := u.WriteProtect(mp.Addr(), ps, true, 0); err == nil {
		t.Fatal("write-protect of an unregistered range succeeded")
	}
}

func TestCloseUnblocksRead(t *testing.T) {
	u := openOrSkip(t, Options{})
	done := make(chan error, 1)
	go func() {
		_, err := u.Read(make([]Msg, 1))
		done <- err
	}()
	// Whether the reader has blocked yet or not, it must come back.
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("read after close: %v, want ErrClosed", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close did not unblock Read")
	}
	if _, err := u.Register(0x10000, u.PageSize(), ModeMissing); !errors.Is(err, ErrClosed) {
		t.Fatalf("register after close: %v", err)
	}
	if err := u.Copy(0x10000, make([]byte, u.PageSize()), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("copy after close: %v", err)
	}
	if err := u.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
}

func TestReadDeadline(t *testing.T) {
	u := openOrSkip(t, Options{})
	u.SetReadDeadline(time.Now().Add(time.Millisecond))
	if _, err := u.Read(make([]Msg, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with nothing pending: %v", err)
	}
}

func TestFromFDRefusesOthers(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[1])
	if _, err := FromFD(p[0]); !errors.Is(err, ErrNotUserfaultfd) {
		t.Fatalf("FromFD(pipe): %v", err)
	}
	if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Fatalf("refused descriptor left open: %v", err)
	}
	// A userfaultfd whose creator never did UFFDIO_API.
	fd, err := newFD()
	if err != nil {
		t.Skip(err)
	}
	if _, err := FromFD(fd); !errors.Is(err, ErrNotUserfaultfd) {
		t.Fatalf("FromFD(uninitialized): %v", err)
	}
}

// The unmap event: munmap of a registered range blocks until the event is
// read. munmap runs in a syscall, so this process can read its own event.
func TestUnmapEvent(t *testing.T) {
	u := openOrSkip(t, Options{Optional: FeatureEventUnmap})
	if u.Features()&FeatureEventUnmap == 0 {
		t.Skip("no unmap events on this kernel")
	}
	mp := mapRegion(t, 2)
	start, length := mp.Addr(), uint64(mp.Len())
	if _, err := u.Register(start, length, ModeMissing|ModeMinor); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mp.Unmap() }()
	msgs := make([]Msg, 2)
	u.SetReadDeadline(time.Now().Add(time.Minute))
	n, err := u.Read(msgs)
	if err != nil || n != 1 {
		t.Fatalf("read: %d %v", n, err)
	}
	if m := msgs[0]; m.Event != EventUnmap || m.Start != start || m.End != start+length {
		t.Fatalf("got %s, want unmap [%#x,%#x)", m, start, start+length)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
