//go:build linux

package uffd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/fdpass"
	"github.com/dsmkit/dsm/internal/memfd"
)

// childEnv, when set, turns the test binary into a client process for the
// cross-process tests (see child below); its value is the register mode.
const childEnv = "DSM_UFFD_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		if err := child(mode); err != nil {
			fmt.Fprintln(os.Stderr, "uffd test child:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// child plays an application process that maps a region: it receives the
// memfd over fd 3 (a seqpacket socket), maps it shared, registers the mapping
// with a userfaultfd of its own, sends that userfaultfd back and then obeys
// commands, one per message, answering each after the access is done:
//
//	read P         load the first and last byte of page P  -> "ok XX YY" (hex)
//	write P V      store V (hex) at the first and last byte of page P -> "ok"
//	popread P      madvise(MADV_POPULATE_READ) page P, then read it
//	popwrite P V   madvise(MADV_POPULATE_WRITE) page P, then write it
//	sweep N        load the first byte of pages 0..N-1 (hex N)
//	drop           madvise(MADV_DONTNEED) the whole mapping: PTEs go, the
//	               memfd keeps its pages
//	droppage P     madvise(MADV_DONTNEED) page P only
//	tryread P      as read, but a fault (SIGBUS, SIGSEGV) is recovered
//	               (debug.SetPanicOnFault) and answered "fault"
//	trypop P       as popread, but a failed madvise is answered
//	               "failed errno=N" (N in decimal)
//	prot none|r|rw mprotect the whole mapping PROT_NONE, PROT_READ or
//	               PROT_READ|PROT_WRITE
//	exit
//
// It never reads its own userfaultfd: every fault is resolved by the parent.
func child(modeArg string) error {
	mode, err := strconv.ParseUint(modeArg, 10, 64)
	if err != nil {
		return err
	}
	fc, err := net.FileConn(os.NewFile(3, "sock"))
	if err != nil {
		return err
	}
	conn := fc.(*net.UnixConn)
	defer conn.Close()
	buf := make([]byte, 256)
	_, fds, err := fdpass.Recv(conn, buf, 1)
	if err != nil || len(fds) != 1 {
		return fmt.Errorf("receiving the memfd: %v (%d fds)", err, len(fds))
	}
	mf, err := memfd.FromFD(fds[0])
	if err != nil {
		return err
	}
	mp, err := mf.Map(0, mf.Size(), memfd.ReadWrite)
	if err != nil {
		return err
	}
	if err := mp.DontFork(); err != nil {
		return err
	}
	u, err := Open(Options{Optional: DefaultOptional | FeaturePoison})
	if err != nil {
		return err
	}
	ioctls, err := u.Register(mp.Addr(), uint64(mp.Len()), Mode(mode))
	if err != nil {
		return err
	}
	hello := fmt.Sprintf("ready %d %d %d", mp.Addr(), uint64(ioctls), uint64(u.Features()))
	if err := fdpass.Send(conn, []byte(hello), u.Fd()); err != nil {
		return err
	}
	// The parent holds the userfaultfd now; this process keeps no copy, so
	// nothing here could read its own faults even by mistake.
	if err := u.Close(); err != nil {
		return err
	}
	b := mp.Bytes()
	ps := os.Getpagesize()
	for {
		n, err := conn.Read(buf)
		if err != nil {
			return err
		}
		f := strings.Fields(string(buf[:n]))
		if len(f) == 0 {
			return fmt.Errorf("empty command")
		}
		arg := func(i int) int {
			if i >= len(f) {
				return 0
			}
			v, _ := strconv.ParseUint(f[i], 16, 64)
			return int(v)
		}
		p := arg(1) * ps
		reply := "ok"
		switch f[0] {
		case "exit":
			return nil
		case "read":
			reply = fmt.Sprintf("ok %02x %02x", b[p], b[p+ps-1])
		case "write":
			b[p], b[p+ps-1] = byte(arg(2)), byte(arg(2))
		case "popread":
			if err := mp.PopulateRead(int64(p), int64(ps)); err != nil {
				reply = "err " + err.Error()
				break
			}
			reply = fmt.Sprintf("ok %02x %02x", b[p], b[p+ps-1])
		case "popwrite":
			if err := mp.PopulateWrite(int64(p), int64(ps)); err != nil {
				reply = "err " + err.Error()
				break
			}
			b[p], b[p+ps-1] = byte(arg(2)), byte(arg(2))
		case "sweep":
			var sum byte
			for i := 0; i < arg(1); i++ {
				sum += b[i*ps]
			}
			reply = fmt.Sprintf("ok %02x", sum)
		case "drop":
			if err := unix.Madvise(b, unix.MADV_DONTNEED); err != nil {
				reply = "err " + err.Error()
			}
		case "droppage":
			if err := unix.Madvise(b[p:p+ps], unix.MADV_DONTNEED); err != nil {
				reply = "err " + err.Error()
			}
		case "tryread":
			reply = tryRead(b[p : p+ps])
		case "prot":
			prot := map[string]int{"none": unix.PROT_NONE, "r": unix.PROT_READ, "rw": unix.PROT_READ | unix.PROT_WRITE}
			v, ok := prot[f[len(f)-1]]
			if !ok || len(f) != 2 {
				reply = "err prot none|r|rw"
				break
			}
			if err := unix.Mprotect(b, v); err != nil {
				reply = "err " + err.Error()
			}
		case "trypop":
			if err := mp.PopulateRead(int64(p), int64(ps)); err != nil {
				var errno syscall.Errno
				if !errors.As(err, &errno) {
					reply = "err " + err.Error()
					break
				}
				reply = fmt.Sprintf("failed errno=%d", int(errno))
				break
			}
			reply = fmt.Sprintf("ok %02x %02x", b[p], b[p+ps-1])
		default:
			reply = "err unknown command " + f[0]
		}
		if _, err := conn.Write([]byte(reply)); err != nil {
			return err
		}
	}
}

// tryRead loads the first and last byte of page, answering "fault" if
// the load faults.
func tryRead(page []byte) (reply string) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			reply = "fault"
		}
	}()
	return fmt.Sprintf("ok %02x %02x", page[0], page[len(page)-1])
}

// socketpair returns a connected pair of seqpacket sockets, one end wrapped
// for this process and the other as a file for a child's ExtraFiles.
func socketpair(t testing.TB) (*net.UnixConn, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine := os.NewFile(uintptr(fds[0]), "parent")
	defer mine.Close()
	fc, err := net.FileConn(mine)
	if err != nil {
		t.Fatal(err)
	}
	return fc.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "child")
}
