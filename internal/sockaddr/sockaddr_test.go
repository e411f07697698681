package sockaddr

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
)

func TestSplit(t *testing.T) {
	for _, c := range []struct{ in, network, addr string }{
		{"/run/dsm/dsmd.sock", "unix", "/run/dsm/dsmd.sock"},
		{"unix:///tmp/a.sock", "unix", "/tmp/a.sock"},
		{"unix:rel.sock", "unix", "rel.sock"},
		{"dsmd.sock", "unix", "dsmd.sock"},
		{"tcp://10.0.0.1:7950", "tcp", "10.0.0.1:7950"},
		{"10.0.0.1:7950", "tcp", "10.0.0.1:7950"},
	} {
		if n, a := Split(c.in); n != c.network || a != c.addr {
			t.Errorf("Split(%q) = %q, %q; want %q, %q", c.in, n, a, c.network, c.addr)
		}
	}
}

func TestDialReason(t *testing.T) {
	for err, want := range map[error]string{
		&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}:       "connection refused",
		fmt.Errorf("x: %w", syscall.ENOENT):                       "no socket there",
		context.DeadlineExceeded:                                  "connection timed out",
		&net.OpError{Op: "dial", Err: fmt.Errorf("odd\n  thing")}: "odd thing",
	} {
		if got := DialReason(err); got != want {
			t.Errorf("DialReason(%v) = %q, want %q", err, got, want)
		}
	}
}
