//go:build linux

package localsock

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// ErrRefused: the peer may not use the socket.
var ErrRefused = errors.New("localsock: permission denied")

// Policy says who may use a socket: root, Owner (dsmd's uid), and, when
// HasGroup, the members of Group.
type Policy struct {
	// Socket is the socket's path, for messages.
	Socket string
	// Owner is dsmd's uid.
	Owner uint32
	// HasGroup lets Group's members in.
	HasGroup bool
	Group    uint32
	// GroupName is Group's name for messages ("" says the number).
	GroupName string
}

// RefusedError says who was refused and who is allowed. It matches
// ErrRefused.
type RefusedError struct {
	Socket string
	Who    Cred
	// Allowed lists, in words, who may connect.
	Allowed string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("permission denied: %s may not use dsmd's socket %s: only %s may",
		e.Who, e.Socket, e.Allowed)
}

// Unwrap makes errors.Is(err, ErrRefused) hold.
func (e *RefusedError) Unwrap() error { return ErrRefused }

// Admit returns nil if id may use the socket, a *RefusedError if not.
func (p Policy) Admit(id Identity) error {
	switch {
	case id.UID == 0, id.UID == p.Owner:
		return nil
	case p.HasGroup && id.InGroup(p.Group):
		return nil
	}
	return &RefusedError{Socket: p.Socket, Who: id.Cred, Allowed: p.allowed()}
}

func (p Policy) allowed() string {
	who := "root"
	if p.Owner != 0 {
		who += fmt.Sprintf(", dsmd's user (uid %d)", p.Owner)
	}
	if !p.HasGroup {
		return who + " (dsmd --socket-group lets a group in)"
	}
	g := fmt.Sprintf("gid %d", p.Group)
	if p.GroupName != "" {
		g = fmt.Sprintf("%s (gid %d)", p.GroupName, p.Group)
	}
	return who + " and members of group " + g
}

// Addr is the RemoteAddr of a connection accepted by an Admit listener:
// the peer and the verdict on it.
type Addr struct {
	Identity
	// Err is why the peer may not use the socket (a *RefusedError, or the
	// failure to read its credentials); nil when admitted.
	Err error
}

// Network implements net.Addr.
func (a *Addr) Network() string { return "unix" }

func (a *Addr) String() string { return a.Cred.String() }

// conn is an accepted connection that reports its peer as an *Addr.
type conn struct {
	net.Conn
	addr *Addr
}

func (c *conn) RemoteAddr() net.Addr { return c.addr }

type admitListener struct {
	net.Listener
	policy   Policy
	onRefuse func(*Addr)
}

// Admit wraps a Unix stream listener: each accepted connection reports an
// *Addr as its RemoteAddr, with the peer's identity and the policy's
// verdict. A refused peer is still accepted, so that the server can tell
// it why in its own protocol before closing (gRPC: an interceptor answers
// every call with PERMISSION_DENIED); onRefuse, if not nil, is called for
// each refusal.
func Admit(ln net.Listener, p Policy, onRefuse func(*Addr)) net.Listener {
	return &admitListener{Listener: ln, policy: p, onRefuse: onRefuse}
}

func (l *admitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, addr: l.Judge(c)}, nil
}

// Judge identifies the peer of c and applies the policy.
func (p Policy) Judge(c net.Conn) *Addr {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return &Addr{Err: fmt.Errorf("%w: %T carries no peer credentials", ErrRefused, c)}
	}
	id, err := Identify(sc)
	if err != nil {
		return &Addr{Err: fmt.Errorf("%w: %v", ErrRefused, err)}
	}
	return &Addr{Identity: id, Err: p.Admit(id)}
}

// Judge applies the listener's policy to c, reporting a refusal.
func (l *admitListener) Judge(c net.Conn) *Addr {
	a := l.policy.Judge(c)
	if a.Err != nil && l.onRefuse != nil {
		l.onRefuse(a)
	}
	return a
}

// FromAddr returns the *Addr of a connection accepted by an Admit
// listener, and false for any other address (a TCP peer).
func FromAddr(a net.Addr) (*Addr, bool) {
	x, ok := a.(*Addr)
	return x, ok
}
