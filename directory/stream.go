package directory

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dsmkit/dsm/internal/tlsconf"
)

// tlsStream is Raft's stream layer over mutual TLS 1.3: it accepts only
// peers with a node certificate of the cluster CA and dials only listeners
// that present one. A connection is raft's once the handshake is done.
type tlsStream struct {
	net.Listener // TLS over TCP
	dial         *tls.Config
}

var _ raft.StreamLayer = (*tlsStream)(nil)

// handshakeTimeout bounds the TLS handshake of an accepted Raft
// connection.
const handshakeTimeout = 10 * time.Second

func newTLSStream(addr string, m *tlsconf.Manager) (*tlsStream, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("directory: raft listen %s: %w", addr, err)
	}
	return &tlsStream{Listener: tls.NewListener(ln, m.ServerConfig(tlsconf.AnyNode)), dial: m.ClientConfig(tlsconf.AnyNode)}, nil
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
// timeout.
func (s *tlsStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d := tls.Dialer{Config: s.dial}
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
