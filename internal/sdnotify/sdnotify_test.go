package sdnotify

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// listen opens a datagram socket like systemd's notify socket.
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func receive(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

func TestNotifyPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	c := listen(t, path)
	t.Setenv(Env, path)
	sent, err := Notify(Ready, Status("serving"))
	if err != nil || !sent {
		t.Fatalf("Notify: %v, %v", sent, err)
	}
	if got, want := receive(t, c), "READY=1\nSTATUS=serving"; got != want {
		t.Fatalf("received %q, want %q", got, want)
	}
	if sent, err := Notify(Stopping); err != nil || !sent {
		t.Fatalf("Notify: %v, %v", sent, err)
	}
	if got := receive(t, c); got != "STOPPING=1" {
		t.Fatalf("received %q", got)
	}
}

func TestNotifyAbstract(t *testing.T) {
	name := fmt.Sprintf("@dsm-sdnotify-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	c := listen(t, name)
	if sent, err := NotifySocket(name, Ready); err != nil || !sent {
		t.Fatalf("NotifySocket: %v, %v", sent, err)
	}
	if got := receive(t, c); got != "READY=1" {
		t.Fatalf("received %q", got)
	}
}

func TestNotifyWithoutSocket(t *testing.T) {
	t.Setenv(Env, "")
	if sent, err := Notify(Ready); sent || err != nil {
		t.Fatalf("without $%s: %v, %v; want false, nil", Env, sent, err)
	}
}

func TestNotifyErrors(t *testing.T) {
	if _, err := NotifySocket("relative/path", Ready); err == nil {
		t.Error("a relative path was accepted")
	}
	if _, err := NotifySocket(filepath.Join(t.TempDir(), "absent"), Ready); err == nil {
		t.Error("a socket nobody listens on was accepted")
	}
}

func TestStatusIsOneLine(t *testing.T) {
	if got := Status("a\nb"); got != "STATUS=a b" {
		t.Fatalf("Status: %q", got)
	}
}
