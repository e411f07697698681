package directory

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
)

// The forwarding RPC. Followers send writes and read-index requests to the
// leader over a small TCP protocol of their own: each frame is a 4-byte
// big-endian length followed by a JSON object, one request and one response
// per exchange, several exchanges per connection. With Config.TLS the
// connection is mutual TLS 1.3 and only node certificates of the cluster
// CA are served.

const maxFrame = 1 << 20

const (
	opApply     = "apply"     // Cmd: an encoded command; leader only
	opReadIndex = "readindex" // leader confirms leadership, returns applied index
	opLeave     = "leave"     // ID leaves gracefully; leader only
	opRemove    = "remove"    // an operator removes failed member ID; leader only
	opStatus    = "status"    // this node's local view, any node
	opLease     = "lease"     // ID at Nonce, applied Epoch, asks this voter for a lease grant
	opFence     = "fence"     // the leader has this voter fence ID at Nonce and wait out its grants
)

type rpcRequest struct {
	Op    string     `json:"op"`
	Cmd   []byte     `json:"cmd,omitempty"`
	ID    ids.NodeID `json:"id,omitempty"`
	Nonce uint64     `json:"nonce,omitempty"`
	Epoch ids.Epoch  `json:"epoch,omitempty"`
	// From is the requester's node id (opFence: the leader that fences).
	From ids.NodeID `json:"from,omitempty"`
}

type rpcResponse struct {
	Index  uint64    `json:"index,omitempty"`
	Epoch  ids.Epoch `json:"epoch,omitempty"`
	Region *Region   `json:"region,omitempty"`
	// Created: an apply of cmdCreateRegion made the region.
	Created bool           `json:"created,omitempty"`
	Status  *snapshotState `json:"status,omitempty"`
	Err     *wireError     `json:"err,omitempty"`
}

// wireError carries an error across the RPC with its identity.
type wireError struct {
	Code   string `json:"code"` // the text of a sentinel, or "" for others
	Msg    string `json:"msg"`
	Field  string `json:"field,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// RemoteError is an error returned by a peer that matches no sentinel.
type RemoteError struct{ Msg string }

func (e *RemoteError) Error() string { return "directory: remote: " + e.Msg }

var wireSentinels = []error{
	ErrInvalidRegion, ErrRegionExists, ErrNoRegion, ErrTooManyRegions, ErrNoSpace, ErrPageOutOfRange,
	ErrNoMembers, ErrInvalidMember, ErrNotLeader, ErrNoLeader, ErrClosed, ErrBadCommand,
	ErrBadFrame, ErrStaleIncarnation, ErrNoProtoIDs, ErrInvalidAccess, ErrNotFailed, ErrNoMember,
	ErrDeclaredFailed, ErrDeparted, ErrLeaseRefused, ErrNoFence,
}

func toWire(err error) *wireError {
	if err == nil {
		return nil
	}
	w := &wireError{Msg: err.Error()}
	var se *SpecError
	if errors.As(err, &se) {
		w.Code, w.Field, w.Reason = ErrInvalidRegion.Error(), se.Field, se.Reason
		return w
	}
	for _, s := range wireSentinels {
		if errors.Is(err, s) {
			w.Code = s.Error()
			break
		}
	}
	return w
}

func fromWire(w *wireError) error {
	if w == nil {
		return nil
	}
	if w.Code == ErrInvalidRegion.Error() && w.Field != "" {
		return &SpecError{Field: w.Field, Reason: w.Reason}
	}
	for _, s := range wireSentinels {
		if w.Code == s.Error() {
			if w.Msg == s.Error() {
				return s
			}
			return fmt.Errorf("%w (%s)", s, w.Msg)
		}
	}
	return &RemoteError{Msg: w.Msg}
}

func writeFrame(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("directory: encode frame: %w", err)
	}
	if len(b) > maxFrame {
		return fmt.Errorf("%w: %d bytes", ErrBadFrame, len(b))
	}
	buf := make([]byte, 4, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	_, err = w.Write(append(buf, b...))
	return err
}

// readFrame reads one frame and decodes it into v strictly. Input comes
// from the network: lengths are bounded and decode errors wrap ErrBadFrame.
func readFrame(r io.Reader, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > maxFrame {
		return fmt.Errorf("%w: length %d", ErrBadFrame, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	return decodeFrameBody(b, v)
}

func decodeFrameBody(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrBadFrame, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: trailing data", ErrBadFrame)
	}
	return nil
}

// rpcServer serves the forwarding RPC. Close stops the listener and every
// connection and waits for their goroutines.
type rpcServer struct {
	ln      net.Listener
	handle  func(context.Context, rpcRequest) rpcResponse
	log     *slog.Logger
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	timeout time.Duration
}

// newRPCServer listens on addr; with tlsCfg, every connection is TLS with
// that config, and its handshake must finish within timeout.
func newRPCServer(addr string, tlsCfg *tls.Config, handle func(context.Context, rpcRequest) rpcResponse, timeout time.Duration, log *slog.Logger) (*rpcServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("directory: rpc listen %s: %w", addr, err)
	}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &rpcServer{ln: ln, handle: handle, log: log, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}, timeout: timeout}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

func (s *rpcServer) addr() string { return s.ln.Addr().String() }

func (s *rpcServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.ctx.Err() != nil {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *rpcServer) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	if tc, ok := c.(*tls.Conn); ok {
		_ = tc.SetDeadline(time.Now().Add(s.timeout))
		if err := tc.HandshakeContext(s.ctx); err != nil {
			s.log.Warn("directory rpc: refused connection", "remote", c.RemoteAddr().String(), "err", err)
			return
		}
		_ = tc.SetDeadline(time.Time{})
	}
	r := bufio.NewReader(c)
	for {
		var req rpcRequest
		if err := readFrame(r, &req); err != nil {
			if errors.Is(err, ErrBadFrame) {
				s.log.Warn("directory rpc: bad frame", "remote", c.RemoteAddr().String(), "err", err)
				_ = writeFrame(c, rpcResponse{Err: toWire(err)})
			}
			return
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
		resp := s.handle(ctx, req)
		cancel()
		if err := writeFrame(c, resp); err != nil {
			return
		}
	}
}

func (s *rpcServer) close() {
	s.cancel()
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// callRPC makes one exchange with the directory at addr, over TLS with
// tlsCfg unless it is nil.
func callRPC(ctx context.Context, addr string, tlsCfg *tls.Config, req rpcRequest) (rpcResponse, error) {
	var c net.Conn
	var err error
	if tlsCfg != nil {
		d := tls.Dialer{Config: tlsCfg}
		c, err = d.DialContext(ctx, "tcp", addr)
	} else {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return rpcResponse{}, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := writeFrame(c, req); err != nil {
		return rpcResponse{}, err
	}
	var resp rpcResponse
	if err := readFrame(bufio.NewReader(c), &resp); err != nil {
		if ctx.Err() != nil {
			return rpcResponse{}, ctx.Err()
		}
		return rpcResponse{}, err
	}
	return resp, nil
}
