//go:build linux

package uffd

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/fdpass"
	"github.com/dsmkit/dsm/internal/memfd"
)

// hangDeadline bounds every wait of the cross-process tests. It only catches
// hangs; nothing is asserted about how long anything takes.
const hangDeadline = 60 * time.Second

// client is the parent's handle on one child process: its socket, its
// userfaultfd (received from it), and the address of its mapping.
type client struct {
	t       testing.TB
	name    string
	cmd     *exec.Cmd
	conn    *net.UnixConn
	u       *UFFD
	base    uint64 // the child's mapping of the memfd starts here
	ioctls  Ioctls // what the child's Register returned
	feat    Feature
	replies chan string
	faults  []Msg // every fault message read, in order (for the log)
}

// startClient runs a child that maps mf and registers it with mode.
func startClient(t testing.TB, name string, mf *memfd.File, mode Mode) *client {
	t.Helper()
	conn, theirs := socketpair(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+strconv.FormatUint(uint64(mode), 10),
		// A race-enabled child would otherwise linger a second at exit.
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	c := &client{t: t, name: name, cmd: cmd, conn: conn, replies: make(chan string, 1)}
	t.Cleanup(c.stop)
	conn.SetDeadline(time.Now().Add(hangDeadline))
	if err := fdpass.Send(conn, []byte("memfd"), mf.Fd()); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	n, fds, err := fdpass.Recv(conn, buf, 1)
	if err != nil || len(fds) != 1 {
		t.Fatalf("%s: receiving its userfaultfd: %v (%d fds)", name, err, len(fds))
	}
	var ioctls, feat uint64
	if _, err := fmt.Sscanf(string(buf[:n]), "ready %d %d %d", &c.base, &ioctls, &feat); err != nil {
		t.Fatalf("%s: hello %q: %v", name, buf[:n], err)
	}
	c.ioctls, c.feat = Ioctls(ioctls), Feature(feat)
	if c.u, err = FromFD(fds[0]); err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Time{})
	go func() {
		defer close(c.replies)
		b := make([]byte, 256)
		for {
			n, err := conn.Read(b)
			if err != nil {
				return
			}
			c.replies <- string(b[:n])
		}
	}()
	return c
}

// stop ends the child (asking it nicely first) and releases everything.
func (c *client) stop() {
	c.exit()
	c.conn.Close()
	for range c.replies {
	}
	if c.u != nil {
		c.u.Close()
	}
}

// exit ends the child process and waits for it; the parent keeps its
// userfaultfd.
func (c *client) exit() {
	if c.cmd.ProcessState == nil {
		c.conn.Write([]byte("exit"))
		done := make(chan error, 1)
		go func() { done <- c.cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(hangDeadline):
			c.cmd.Process.Kill()
			<-done
		}
	}
}

// page returns the child's address of page p.
func (c *client) page(p int) uint64 { return c.base + uint64(p)*uint64(os.Getpagesize()) }

// want is one fault a command is expected to raise, and how the parent
// resolves it.
type want struct {
	kind    FaultKind
	page    int
	write   bool
	resolve func(m Msg) error
}

// do sends cmd to the child and serves its faults until it answers. The
// faults must be exactly wants, in order; a fault that repeats one already
// resolved (re-delivered after a signal interrupted the child's wait) is
// resolved again, which must be harmless. Any other fault fails the test.
// It returns the child's answer.
func (c *client) do(cmd string, wants ...want) string {
	c.t.Helper()
	if _, err := c.conn.Write([]byte(cmd)); err != nil {
		c.t.Fatalf("%s: send %q: %v", c.name, cmd, err)
	}
	deadline := time.Now().Add(hangDeadline)
	var done []want
	msgs := make([]Msg, 8)
	for {
		select {
		case r, ok := <-c.replies:
			if !ok {
				c.t.Fatalf("%s: %q: child gone", c.name, cmd)
			}
			if len(wants) > 0 {
				c.t.Fatalf("%s: %q answered %q with faults still expected: %+v", c.name, cmd, r, wants)
			}
			if strings.HasPrefix(r, "err") {
				c.t.Fatalf("%s: %q: %s", c.name, cmd, r)
			}
			return r
		default:
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: %q: no answer and no fault within %v (still expected %+v)", c.name, cmd, hangDeadline, wants)
		}
		pfd := []unix.PollFd{{Fd: int32(c.u.Fd()), Events: unix.POLLIN}}
		if _, err := unix.Poll(pfd, 20); err != nil && !errors.Is(err, unix.EINTR) {
			c.t.Fatal(err)
		}
		if pfd[0].Revents&unix.POLLIN == 0 {
			continue
		}
		c.u.SetReadDeadline(time.Now().Add(time.Second))
		n, err := c.u.Read(msgs)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if err != nil {
			c.t.Fatalf("%s: read faults: %v", c.name, err)
		}
	next:
		for _, m := range msgs[:n] {
			c.faults = append(c.faults, m)
			c.t.Logf("%s: %q -> %s (page %d)", c.name, cmd, m, c.pageOf(m.Address))
			for _, w := range done {
				if w.matches(c, m) {
					if err := w.resolve(m); err != nil {
						c.t.Fatalf("%s: resolving re-delivered %s again: %v", c.name, m, err)
					}
					continue next
				}
			}
			if len(wants) == 0 || !wants[0].matches(c, m) {
				c.t.Fatalf("%s: %q raised unexpected %s (page %d); expected %+v", c.name, cmd, m, c.pageOf(m.Address), wants)
			}
			if err := wants[0].resolve(m); err != nil {
				c.t.Fatalf("%s: resolving %s: %v", c.name, m, err)
			}
			done, wants = append(done, wants[0]), wants[1:]
		}
	}
}

func (c *client) pageOf(addr uint64) int { return int((addr - c.base) / uint64(os.Getpagesize())) }

func (w want) matches(c *client, m Msg) bool {
	return m.Event == EventPagefault && m.Kind() == w.kind && m.Write() == w.write && m.Address == c.page(w.page)
}

func (w want) String() string {
	rw := "read"
	if w.write {
		rw = "write"
	}
	return fmt.Sprintf("%s %s fault on page %d", rw, w.kind, w.page)
}

// filled returns a page of byte v.
func filled(v byte) []byte { return bytes.Repeat([]byte{v}, os.Getpagesize()) }

// answer is the child's reply to a read of a page filled with v.
func answer(v byte) string { return fmt.Sprintf("ok %02x %02x", v, v) }

// rawCopy issues one UFFDIO_COPY of a page of v at page p and returns the
// kernel's errno, without the wrapper's EEXIST handling.
func (c *client) rawCopy(p int, v byte) syscall.Errno {
	src := filled(v)
	arg := &uffdioCopy{dst: c.page(p), src: unsafe.Pointer(&src[0]), len: uint64(len(src)), mode: copyModeDontWake}
	return c.u.ioctlErrno(reqCopy, unsafe.Pointer(arg))
}

// rawContinue issues one UFFDIO_CONTINUE of page p and returns the errno.
func (c *client) rawContinue(p int) syscall.Errno {
	arg := &uffdioContinue{rng: uffdioRange{c.page(p), uint64(os.Getpagesize())}, mode: continueModeDontWake}
	return c.u.ioctlErrno(reqContinue, unsafe.Pointer(arg))
}
