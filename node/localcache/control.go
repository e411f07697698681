//go:build linux

package localcache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/dsmkit/dsm/internal/fdpass"
	"github.com/dsmkit/dsm/internal/localsock"
	"github.com/dsmkit/dsm/internal/mapproto"
)

// ControlTimeout bounds the answer to one control request.
const ControlTimeout = 30 * time.Second

// Refuse makes the error by which Config.Control answers a request with
// an Error of code.
func Refuse(code mapproto.Code, err error) error { return &sessionError{code, err} }

// controlSession answers the control requests of a connection whose first
// message, first, is one (mapproto "A control session"), until the client
// closes it: the error it returns is io.EOF then, or the refusal that ends
// the session (a malformed message, a refused peer).
func (c *Cache) controlSession(conn *net.UnixConn, peer *localsock.Addr, first []byte) error {
	if peer != nil && peer.Err != nil {
		return refuse(mapproto.CodePermissionDenied, "%s", deniedText(peer.Err))
	}
	if c.control == nil {
		return refuse(mapproto.CodeBadRequest, "this dsmd serves no control requests")
	}
	var id localsock.Identity
	if peer != nil {
		id = peer.Identity
	}
	buf := make([]byte, mapproto.MaxMsg)
	msg := first
	for {
		req, err := mapproto.DecodeCtl(msg)
		if err != nil {
			return refuse(mapproto.CodeBadRequest, "%v", err)
		}
		switch req.Type {
		case mapproto.TypeCreate, mapproto.TypeLookup, mapproto.TypeDelete, mapproto.TypeSync, mapproto.TypeSessionsAlive:
		default:
			return refuse(mapproto.CodeBadRequest, "%s is no control request", req.Type)
		}
		b, err := c.answer(id, req)
		if err != nil {
			return err
		}
		conn.SetWriteDeadline(time.Now().Add(ControlTimeout))
		if _, err := conn.Write(b); err != nil {
			return fmt.Errorf("%w: control reply: %v", io.EOF, err)
		}
		conn.SetReadDeadline(time.Time{}) // an idle control session may stay
		n, fds, err := fdpass.Recv(conn, buf, 0)
		if err != nil {
			if errors.Is(err, fdpass.ErrTooManyFDs) || errors.Is(err, fdpass.ErrTruncated) {
				return refuse(mapproto.CodeBadRequest, "control request: %v", err)
			}
			return err
		}
		closeFDs(fds)
		msg = buf[:n]
	}
}

// answer encodes the reply to req: Control's, or an Error.
func (c *Cache) answer(id localsock.Identity, req mapproto.Ctl) ([]byte, error) {
	ctx, cancel := context.WithTimeout(c.ctx, ControlTimeout)
	defer cancel()
	reply, err := c.control(ctx, id, req)
	if err == nil {
		b, eerr := mapproto.EncodeCtl(reply)
		if eerr == nil {
			return b, nil
		}
		err = eerr
	}
	code := mapproto.CodeInternal
	var se *sessionError
	if errors.As(err, &se) {
		code = se.code
	}
	c.log.Debug("control request refused", "request", req.Type, "name", req.Name, "pid", id.PID, "err", err)
	return mapproto.Encode(mapproto.Msg{Type: mapproto.TypeError, Code: code, Text: err.Error()})
}
