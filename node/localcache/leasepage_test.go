//go:build linux

package localcache

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/fdpass"
	"github.com/dsmkit/dsm/internal/mapproto"
	"github.com/dsmkit/dsm/internal/uffd"
)

// askLeasePage sends a Map that asks for the lease page to the Cache at
// sock and returns the descriptors of its Mapped (closing the session).
func askLeasePage(t *testing.T, sock string) []int {
	t.Helper()
	conn, err := net.Dial("unixpacket", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(hangDeadline))
	if _, err := conn.Write(mustEncode(t, mapproto.Msg{Type: mapproto.TypeMap, Name: "r", Features: mapproto.FeatureLeasePage})); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, mapproto.MaxMsg)
	n, fds, err := fdpass.Recv(conn.(*net.UnixConn), buf, 2)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := mapproto.Decode(buf[:n]); err != nil || m.Type != mapproto.TypeMapped {
		t.Fatalf("answer to a Map asking for the lease page: %v, %v", m, err)
	}
	t.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	return fds
}

// TestLeasePage: a Cache with Config.LeasePage gives its lease page to a
// client that asks, sealed so that the client can only map it read-only,
// and the page follows SetLease, Suspend, Resume, Drain and Close. A Cache
// without one answers the same Map with the region's memfd alone.
func TestLeasePage(t *testing.T) {
	if _, err := uffd.Probe(); err != nil {
		t.Skipf("no userfaultfd: %v", err)
	}
	c, err := New(Config{Coherence: newTestHome(), LeasePage: true})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			c.Close()
		}
	}()
	if err := c.AddRegion(RegionSpec{ID: regionR, Name: "r", Size: testSize}); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "dsmd.sock")
	if err := c.Listen(sock); err != nil {
		t.Fatal(err)
	}
	fds := askLeasePage(t, sock)
	if len(fds) != 2 {
		t.Fatalf("Mapped carries %d descriptors, want the region's and the lease page's", len(fds))
	}
	lfd := fds[1]
	if _, err := unix.Mmap(lfd, 0, int(ps), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); !errors.Is(err, unix.EPERM) {
		t.Fatalf("a writable shared mapping of the lease page in a client: %v, want EPERM (sealed)", err)
	}
	if _, err := unix.Pwrite(lfd, []byte{1}, 0); !errors.Is(err, unix.EPERM) {
		t.Fatalf("write(2) to the lease page: %v, want EPERM (sealed)", err)
	}
	mem, err := unix.Mmap(lfd, 0, int(ps), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	if err := unix.Mprotect(mem, unix.PROT_READ|unix.PROT_WRITE); err == nil {
		t.Fatal("the client's read-only mapping of the lease page became writable")
	}
	read := func(what string, want mapproto.Lease) {
		t.Helper()
		got, err := mapproto.LoadLease(mem)
		if err != nil || got != want {
			t.Fatalf("%s: the client reads %v, %v; want %v", what, got, err, want)
		}
		if own, ok := c.Lease(); !ok || own != want {
			t.Fatalf("%s: Lease() = %v, %v; want %v", what, own, ok, want)
		}
	}
	read("before any lease", mapproto.Lease{State: mapproto.LeaseSuspended})
	granted := mapproto.Lease{Incarnation: 0xabc, Deadline: 42 * time.Second, State: mapproto.LeaseServing, Epoch: 7}
	c.SetLease(0xabc, 42*time.Second, 7)
	read("after SetLease", granted)
	if _, err := c.Suspend(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Suspend finished: every access is revoked (and would wait here).
	read("suspended", mapproto.Lease{Incarnation: 0xabc, State: mapproto.LeaseRevoked, Epoch: 7})
	c.SetLease(0xabc, 43*time.Second, 8) // a grant while suspended changes nothing yet
	read("granted while suspended", mapproto.Lease{Incarnation: 0xabc, State: mapproto.LeaseRevoked, Epoch: 8})
	c.Resume()
	granted.Deadline, granted.Epoch = 43*time.Second, 8
	read("resumed", granted)
	c.Drain("test")
	granted.State = mapproto.LeaseDraining
	read("draining", granted)
	closed = true
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := mapproto.LoadLease(mem); err != nil || got.State != mapproto.LeaseSuspended || got.Deadline != 0 {
		t.Fatalf("after Close the client reads %v, %v; want suspended", got, err)
	}

	d := newDaemon(t, 0) // no lease page
	if fds := askLeasePage(t, d.sock); len(fds) != 1 {
		t.Fatalf("a Cache without a lease page answers with %d descriptors, want the region's alone", len(fds))
	}
}
