//go:build linux

package localcache

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/fdpass"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/localsock"
	"github.com/dsmkit/dsm/internal/mapproto"
	"github.com/dsmkit/dsm/internal/uffd"
)

// HandshakeTimeout bounds the exchange that attaches a client; a client
// that stalls in it is dropped.
const HandshakeTimeout = 30 * time.Second

// Listen serves local client sessions (package mapproto) on a Unix
// SOCK_SEQPACKET socket at path until Close. A stale socket file left by a
// dead daemon is replaced; a live one is ErrAddrInUse.
func (c *Cache) Listen(path string) error {
	ln, err := listen(path, c.perm)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		ln.Close()
		return ErrClosed
	}
	c.listeners[ln] = struct{}{}
	c.wg.Add(1)
	c.mu.Unlock()
	go c.accept(ln)
	return nil
}

// ErrAddrInUse: another live daemon serves the socket path.
var ErrAddrInUse = errors.New("localcache: socket path in use by a live daemon")

func listen(path string, perm localsock.Perm) (*localsock.Listener, error) {
	if perm.Mode == 0 {
		perm.Mode = 0o600
	}
	ln, err := localsock.Listen("unixpacket", path, perm)
	if errors.Is(err, localsock.ErrInUse) {
		return nil, fmt.Errorf("%w: %s", ErrAddrInUse, path)
	}
	if err != nil {
		return nil, fmt.Errorf("localcache: listen %s: %w", path, err)
	}
	return ln, nil
}

func (c *Cache) accept(ln *localsock.Listener) {
	defer c.wg.Done()
	defer ln.Close()
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			if c.ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				c.log.Error("accept failed; no longer serving", "err", err)
			}
			return
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			conn.Close()
			return
		}
		c.sessions[conn] = struct{}{}
		c.wg.Add(1)
		c.mu.Unlock()
		go c.session(conn)
	}
}

// sessionError is a refusal sent to the client before the session ends.
type sessionError struct {
	code mapproto.Code
	err  error
}

func (e *sessionError) Error() string { return e.err.Error() }
func (e *sessionError) Unwrap() error { return e.err }

func refuse(code mapproto.Code, format string, args ...any) error {
	return &sessionError{code, fmt.Errorf(format, args...)}
}

// session runs one client session: the handshake that attaches its mapping,
// then a read that returns when the client closes the socket or dies.
func (c *Cache) session(conn *net.UnixConn) {
	defer c.wg.Done()
	defer func() {
		c.mu.Lock()
		delete(c.sessions, conn)
		c.mu.Unlock()
		conn.Close()
	}()
	var peer *localsock.Addr
	pid := peerPID(conn)
	if c.admit != nil {
		peer = c.admit(conn)
	}
	cl, err := c.handshake(conn, pid, peer)
	if err != nil {
		if errors.Is(err, io.EOF) || c.ctx.Err() != nil {
			return
		}
		c.st.sessionErrors.Add(1)
		c.log.Info("session refused", "pid", pid, "err", err)
		var se *sessionError
		code := mapproto.CodeInternal
		if errors.As(err, &se) {
			code = se.code
		}
		if b, eerr := mapproto.Encode(mapproto.Msg{Type: mapproto.TypeError, Code: code, Text: err.Error()}); eerr == nil {
			conn.SetWriteDeadline(time.Now().Add(time.Second))
			conn.Write(b)
		}
		return
	}
	defer c.detach(cl)
	defer c.watchPID(pid, cl, conn)()
	// Nothing more is expected: any message is a protocol error, and end of
	// stream (the client closed its mapping or died) ends the session.
	buf := make([]byte, mapproto.MaxMsg)
	_, fds, err := fdpass.Recv(conn, buf, 0)
	if err != nil {
		if !errors.Is(err, io.EOF) && c.ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
			c.log.Debug("session ended", "client", cl.id, "err", err)
		}
		return
	}
	closeFDs(fds)
	c.st.sessionErrors.Add(1)
	c.log.Info("unexpected message after registration; detaching", "client", cl.id)
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func (c *Cache) handshake(conn *net.UnixConn, pid int, peer *localsock.Addr) (*client, error) {
	conn.SetDeadline(time.Now().Add(HandshakeTimeout))
	defer conn.SetDeadline(time.Time{})
	buf := make([]byte, mapproto.MaxMsg)

	n, fds, err := fdpass.Recv(conn, buf, 0)
	if err != nil {
		if errors.Is(err, fdpass.ErrTooManyFDs) || errors.Is(err, fdpass.ErrTruncated) {
			return nil, refuse(mapproto.CodeBadRequest, "map request: %v", err)
		}
		return nil, err
	}
	closeFDs(fds)
	if n >= 2 && buf[0] == mapproto.Version && mapproto.IsControl(mapproto.Type(buf[1])) {
		return nil, c.controlSession(conn, peer, buf[:n])
	}
	req, err := mapproto.Decode(buf[:n])
	if err != nil {
		return nil, refuse(mapproto.CodeBadRequest, "%v", err)
	}
	if req.Type != mapproto.TypeMap {
		return nil, refuse(mapproto.CodeBadRequest, "expected map, got %s", req.Type)
	}
	// A refused peer learns why in answer to its first message (an answer
	// sent before it would meet a peer still writing, as EPIPE).
	if peer != nil && peer.Err != nil {
		return nil, refuse(mapproto.CodePermissionDenied, "%s", deniedText(peer.Err))
	}
	c.mu.Lock()
	r := c.byName[req.Name]
	closed, draining := c.closed, c.draining
	c.mu.Unlock()
	switch {
	case draining != "":
		return nil, refuse(mapproto.CodeUnavailable, "%s", draining)
	case closed:
		return nil, refuse(mapproto.CodeUnavailable, "%v", ErrClosed)
	case r == nil:
		return nil, refuse(mapproto.CodeUnknownRegion, "%v: %q", ErrUnknownRegion, req.Name)
	case req.Size != 0 && req.Size != uint64(r.size):
		return nil, refuse(mapproto.CodeSizeMismatch, "region %q has %d bytes, not %d", req.Name, r.size, req.Size)
	}
	if peer != nil && c.mayMap != nil {
		if err := c.mayMap(peer.Identity, req.Name); err != nil {
			return nil, refuse(mapproto.CodePermissionDenied, "%s", deniedText(err))
		}
	}
	reply, err := mapproto.Encode(mapproto.Msg{Type: mapproto.TypeMapped, Region: r.id, Size: uint64(r.size), PageSize: uint32(r.pageSize)})
	if err != nil {
		return nil, err
	}
	fds = []int{r.mf.Fd()}
	if req.Features&mapproto.FeatureLeasePage != 0 && c.lease != nil {
		fds = append(fds, c.lease.fd)
	}
	if err := fdpass.Send(conn, reply, fds...); err != nil {
		return nil, err
	}

	n, fds, err = fdpass.Recv(conn, buf, 1)
	if err != nil {
		if errors.Is(err, fdpass.ErrTooManyFDs) || errors.Is(err, fdpass.ErrTruncated) {
			return nil, refuse(mapproto.CodeBadRequest, "register: %v", err)
		}
		return nil, err
	}
	if len(fds) != 1 {
		closeFDs(fds)
		return nil, refuse(mapproto.CodeBadRequest, "register carries %d descriptors, want the userfaultfd", len(fds))
	}
	reg, err := mapproto.Decode(buf[:n])
	if err != nil || reg.Type != mapproto.TypeRegister {
		closeFDs(fds)
		if err == nil {
			err = fmt.Errorf("expected register, got %s", reg.Type)
		}
		return nil, refuse(mapproto.CodeBadRequest, "%v", err)
	}
	sys := uint64(os.Getpagesize())
	if reg.Addr == 0 || reg.Addr%sys != 0 || reg.Len != uint64(r.size) || reg.Addr+reg.Len < reg.Addr {
		closeFDs(fds)
		return nil, refuse(mapproto.CodeBadRequest, "register [%#x, +%#x): want a page-aligned mapping of the whole region (%d bytes)", reg.Addr, reg.Len, r.size)
	}
	u, err := uffd.FromFD(fds[0])
	if err != nil {
		return nil, refuse(mapproto.CodeBadRequest, "%v", err)
	}
	cl, err := c.attach(r, u, conn, reg.Addr, pid, peer, req.FaultTimeout)
	if errors.Is(err, ErrUnknownRegion) {
		return nil, refuse(mapproto.CodeUnknownRegion, "region %q (%s) was deleted", r.name, r.id)
	}
	if err != nil {
		return nil, refuse(mapproto.CodeUnavailable, "%v", err)
	}
	var token uint64
	if req.Features&mapproto.FeatureSession != 0 {
		token = c.sessionToken(cl)
	}
	ack, _ := mapproto.Encode(mapproto.Msg{Type: mapproto.TypeRegistered, Session: token})
	if _, err := conn.Write(ack); err != nil {
		c.detach(cl)
		return nil, err
	}
	return cl, nil
}

// deniedText is a refusal's text without the "permission denied: " that
// the code says already.
func deniedText(err error) string {
	return strings.TrimPrefix(err.Error(), "permission denied: ")
}

// peerPID is the client's process id from SO_PEERCRED (0 if unavailable).
func peerPID(conn *net.UnixConn) int {
	rc, err := conn.SyscallConn()
	if err != nil {
		return 0
	}
	var pid int
	rc.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}

// watchPID ends the session when the client process exits, even if the
// socket outlives it (a child that inherited the descriptor keeps it
// open). It returns the function that stops watching. Without pidfd
// (Linux 5.3; PIDFD_NONBLOCK 5.10) only end of stream is watched.
func (c *Cache) watchPID(pid int, cl *client, conn *net.UnixConn) (stop func()) {
	if pid <= 0 {
		return func() {}
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			conn.Close() // gone already
		}
		return func() {}
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return func() {}
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		// A pidfd polls readable once the process has exited.
		err := rc.Read(func(fd uintptr) bool {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, _ := unix.Poll(pfd, 0)
			return n > 0
		})
		if err == nil {
			c.log.Debug("client process exited", "client", cl.id, "pid", pid)
			conn.Close()
		}
	}()
	return func() { f.Close() }
}

// Session tokens name a mapping session in the whole cluster: the
// protocol id of this dsmd's incarnation in the high 32 bits, the client's
// number in this process in the low 32. Protocol ids are never given to
// two incarnations (docs/failover.md), so a token is never reused while
// that holds.
const tokenSeqBits = 32

// sessionToken is cl's token, 0 when this dsmd has no protocol id (yet)
// or has handed out more sessions than a token counts.
func (c *Cache) sessionToken(cl *client) uint64 {
	if c.proto == nil || cl.id >= 1<<tokenSeqBits {
		return 0
	}
	p := c.proto()
	if p == ids.None {
		return 0
	}
	return uint64(p)<<tokenSeqBits | cl.id
}

// TokenProto is the protocol id of the dsmd that handed out token.
func TokenProto(token uint64) ids.NodeID { return ids.NodeID(token >> tokenSeqBits) }

// SessionAlive reports whether the mapping session named by token, one
// that this dsmd handed out, is still served: false once the client closed
// it, its process exited or the session was detached for any reason.
// A token of another dsmd is never alive here.
func (c *Cache) SessionAlive(token uint64) bool {
	if c.proto == nil || TokenProto(token) != c.proto() || TokenProto(token) == ids.None {
		return false
	}
	id := token & (1<<tokenSeqBits - 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	for cl := range c.clients { // detach removes a client from the set
		if cl.id == id {
			return true
		}
	}
	return false
}
