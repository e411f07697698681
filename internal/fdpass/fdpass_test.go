//go:build linux

package fdpass

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func pair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conv := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "sock")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conv(fds[0]), conv(fds[1])
}

// openFDs counts this process's descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func pipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

func TestSendRecv(t *testing.T) {
	a, b := pair(t)
	r, w := pipe(t)
	if err := Send(a, []byte("pipe ends"), int(r.Fd()), int(w.Fd())); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, fds, err := Recv(b, buf, 2)
	if err != nil {
		t.Fatal(err)
	}
	if string(buf[:n]) != "pipe ends" || len(fds) != 2 {
		t.Fatalf("got %q with %d fds", buf[:n], len(fds))
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	// The received write end writes into the original pipe.
	if _, err := unix.Write(fds[1], []byte("x")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 1)
	if _, err := r.Read(got); err != nil || got[0] != 'x' {
		t.Fatalf("read %q %v", got, err)
	}
	if flags, _ := unix.FcntlInt(uintptr(fds[0]), unix.F_GETFD, 0); flags&unix.FD_CLOEXEC == 0 {
		t.Fatal("received descriptor is not close-on-exec")
	}

	// A message without descriptors.
	if err := Send(a, []byte("bare")); err != nil {
		t.Fatal(err)
	}
	if n, fds, err := Recv(b, buf, 1); err != nil || string(buf[:n]) != "bare" || len(fds) != 0 {
		t.Fatalf("bare message: %q %v %v", buf[:n], fds, err)
	}
}

// More descriptors than the receiver allows: every one is closed.
func TestRecvClosesExcess(t *testing.T) {
	a, b := pair(t)
	r, _ := pipe(t)
	before := openFDs(t)
	if err := Send(a, []byte("three"), int(r.Fd()), int(r.Fd()), int(r.Fd())); err != nil {
		t.Fatal(err)
	}
	_, fds, err := Recv(b, make([]byte, 16), 1)
	if !errors.Is(err, ErrTooManyFDs) || fds != nil {
		t.Fatalf("got %v %v, want ErrTooManyFDs and no descriptors", fds, err)
	}
	if after := openFDs(t); after != before {
		t.Fatalf("%d descriptors before, %d after refusing the message", before, after)
	}
	// Far more than fit in the control buffer: the kernel truncates and
	// drops the rest; the ones that arrived are closed too.
	many := make([]int, 20)
	for i := range many {
		many[i] = int(r.Fd())
	}
	if err := Send(a, []byte("many"), many...); err != nil {
		t.Fatal(err)
	}
	_, _, err = Recv(b, make([]byte, 16), 2)
	if !errors.Is(err, ErrTooManyFDs) {
		t.Fatalf("twenty fds into room for three: %v", err)
	}
	if after := openFDs(t); after != before {
		t.Fatalf("%d descriptors before, %d after a truncated message", before, after)
	}
}

func TestRecvTruncatedPayload(t *testing.T) {
	a, b := pair(t)
	r, _ := pipe(t)
	before := openFDs(t)
	if err := Send(a, []byte("a long payload"), int(r.Fd())); err != nil {
		t.Fatal(err)
	}
	if _, fds, err := Recv(b, make([]byte, 4), 1); !errors.Is(err, ErrTruncated) || fds != nil {
		t.Fatalf("short buffer: %v %v", fds, err)
	}
	if after := openFDs(t); after != before {
		t.Fatalf("descriptor of a truncated message leaked (%d -> %d)", before, after)
	}
}

func TestRecvEOF(t *testing.T) {
	a, b := pair(t)
	a.Close()
	if _, _, err := Recv(b, make([]byte, 4), 1); !errors.Is(err, io.EOF) {
		t.Fatalf("recv after peer close: %v, want EOF", err)
	}
}

func TestSendLimits(t *testing.T) {
	a, _ := pair(t)
	if err := Send(a, nil, 0); err == nil {
		t.Fatal("empty payload accepted")
	}
	if err := Send(a, []byte("x"), make([]int, MaxFDs+1)...); !errors.Is(err, ErrTooManyFDs) {
		t.Fatalf("%d fds: %v", MaxFDs+1, err)
	}
}

func TestParseRights(t *testing.T) {
	oob := append(unix.UnixRights(3, 4), unix.UnixRights(5)...)
	fds, err := ParseRights(oob)
	if err != nil || len(fds) != 3 || fds[0] != 3 || fds[2] != 5 {
		t.Fatalf("got %v %v", fds, err)
	}
	if fds, err := ParseRights(nil); err != nil || fds != nil {
		t.Fatalf("empty: %v %v", fds, err)
	}
	// Truncated header, length past the end, length below the header.
	for _, bad := range [][]byte{oob[:10], oob[:20], func() []byte {
		b := append([]byte(nil), oob...)
		b[0] = 4
		return b
	}()} {
		if _, err := ParseRights(bad); !errors.Is(err, ErrBadControl) {
			t.Errorf("% x: %v, want ErrBadControl", bad, err)
		}
	}
	// Rights before a malformation are still reported, for closing.
	fds, err = ParseRights(append(unix.UnixRights(7), 1, 2, 3))
	if !errors.Is(err, ErrBadControl) || len(fds) != 1 || fds[0] != 7 {
		t.Fatalf("got %v %v", fds, err)
	}
	// Credentials are not rights.
	cred := unix.UnixCredentials(&unix.Ucred{Pid: 1})
	fds, err = ParseRights(append(cred, unix.UnixRights(8)...))
	if !errors.Is(err, ErrUnexpectedControl) || len(fds) != 1 || fds[0] != 8 {
		t.Fatalf("credentials then rights: %v %v", fds, err)
	}
}

// FuzzParseRights: arbitrary control data never panics, and every
// descriptor reported is non-negative and came from the input.
func FuzzParseRights(f *testing.F) {
	f.Add(unix.UnixRights(3, 4))
	f.Add(append(unix.UnixRights(1), unix.UnixCredentials(&unix.Ucred{})...))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, oob []byte) {
		fds, _ := ParseRights(oob)
		if len(fds)*4 > len(oob) {
			t.Fatalf("%d descriptors from %d bytes", len(fds), len(oob))
		}
		for _, fd := range fds {
			if fd < 0 {
				t.Fatalf("negative descriptor %d", fd)
			}
		}
	})
}
