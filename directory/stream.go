package directory

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/tlsconf"
)

// tlsStream is Raft's stream layer over mutual TLS 1.3: it accepts only
// peers with a node certificate of the cluster CA and dials only listeners
// that present one. A connection is raft's once the handshake is done.
type tlsStream struct {
	net.Listener // TLS over TCP
	m            *tlsconf.Manager
	// nodeAt names the node whose Raft address addr is, when known; the
	// dialer then requires that node's certificate. Set once the
	// directory can answer; until then any node certificate is accepted.
	nodeAt atomic.Pointer[func(addr string) (ids.NodeID, bool)]
}

var _ raft.StreamLayer = (*tlsStream)(nil)

// handshakeTimeout bounds the TLS handshake of an accepted Raft
// connection.
const handshakeTimeout = 10 * time.Second

// newTLSStream listens on addr for the peers accept accepts.
func newTLSStream(addr string, m *tlsconf.Manager, accept tlsconf.Check) (*tlsStream, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("directory: raft listen %s: %w", addr, err)
	}
	return &tlsStream{Listener: tls.NewListener(ln, m.ServerConfig(accept)), m: m}, nil
}

// Accept returns the next connection. Its TLS handshake runs on raft's
// first read, bounded by handshakeTimeout: a peer without a valid
// certificate has its connection closed there, before raft reads a byte
// of it.
func (s *tlsStream) Accept() (net.Conn, error) {
	c, err := s.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &handshaking{Conn: c.(*tls.Conn)}, nil
}

// Dial implements raft.StreamLayer: TCP and the TLS handshake, within
// timeout. The listener's certificate must name the member whose Raft
// address it is (the member table, else gossip), or any node when the
// address is nobody's yet.
func (s *tlsStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	check := tlsconf.AnyNode
	if f := s.nodeAt.Load(); f != nil {
		if id, ok := (*f)(string(address)); ok {
			check = tlsconf.Node(id)
		}
	}
	d := tls.Dialer{Config: s.m.ClientConfig(check)}
	return d.DialContext(ctx, "tcp", string(address))
}

// handshaking is an accepted TLS connection whose first Read or Write
// completes the handshake under a deadline.
type handshaking struct {
	*tls.Conn
	once sync.Once
	err  error
}

func (h *handshaking) handshake() error {
	h.once.Do(func() {
		_ = h.SetDeadline(time.Now().Add(handshakeTimeout))
		if err := h.Handshake(); err != nil {
			h.Close()
			h.err = fmt.Errorf("directory: raft connection from %s refused: %w", h.RemoteAddr(), err)
			return
		}
		h.err = h.SetDeadline(time.Time{})
	})
	return h.err
}

func (h *handshaking) Read(b []byte) (int, error) {
	if err := h.handshake(); err != nil {
		return 0, err
	}
	return h.Conn.Read(b)
}

func (h *handshaking) Write(b []byte) (int, error) {
	if err := h.handshake(); err != nil {
		return 0, err
	}
	return h.Conn.Write(b)
}

// nodeAtRaftAddr names the node whose Raft address addr is: in the member
// table, else in gossip.
func (d *Directory) nodeAtRaftAddr(addr string) (ids.NodeID, bool) {
	for _, m := range d.View().Members() {
		if m.RaftAddr == addr {
			return m.ID, true
		}
	}
	g := d.gossipRef.Load()
	if g == nil {
		return ids.None, false
	}
	for id, e := range g.snapshot() {
		if e.meta.RaftAddr == addr {
			return id, true
		}
	}
	return ids.None, false
}

// CheckPeer accepts the certificate identity of a node that the member
// table or gossip knows, and refuses clients and unknown nodes: the
// forwarding RPC and Raft's listener serve only them. dsmd's gRPC listener
// uses it for node certificates.
func (d *Directory) CheckPeer(id tlsconf.Identity) error { return d.knownNode(id) }

func (d *Directory) knownNode(id tlsconf.Identity) error {
	if err := tlsconf.AnyNode(id); err != nil {
		return err
	}
	// gossipRef is set once the replica's state exists (Open).
	g := d.gossipRef.Load()
	if g == nil {
		return fmt.Errorf("%w: %v: the directory is still starting", tlsconf.ErrIdentity, id)
	}
	if _, ok := d.View().Member(id.Node); ok {
		return nil
	}
	if _, ok := g.lookup(id.Node); ok {
		return nil
	}
	return fmt.Errorf("%w: %v is not a member of the cluster", tlsconf.ErrIdentity, id)
}
