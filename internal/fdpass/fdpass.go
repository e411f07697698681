//go:build linux

package fdpass

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"
)

// MaxFDs is the most descriptors one message may carry: the kernel's limit
// per SCM_RIGHTS message (SCM_MAX_FD).
const MaxFDs = 253

// Sentinel errors.
var (
	// ErrTooManyFDs: a message carried more descriptors than the receiver
	// allowed (or than MaxFDs on send). All of them were closed.
	ErrTooManyFDs = errors.New("fdpass: too many file descriptors")
	// ErrTruncated: the payload was larger than the receive buffer
	// (MSG_TRUNC). Descriptors that arrived were closed.
	ErrTruncated = errors.New("fdpass: message truncated")
	// ErrBadControl: malformed control data. Descriptors found before the
	// malformation are returned by ParseRights so they can be closed.
	ErrBadControl = errors.New("fdpass: malformed control message")
	// ErrUnexpectedControl: a control message other than SCM_RIGHTS.
	ErrUnexpectedControl = errors.New("fdpass: unexpected control message")
)

// Conn is what fdpass needs from a socket; *net.UnixConn has it. Use a
// SOCK_SEQPACKET ("unixpacket") socket so each payload is one message: on a
// stream socket a payload may be split or merged, and the descriptors travel
// with the first byte of the send that carried them.
type Conn interface {
	WriteMsgUnix(b, oob []byte, addr *net.UnixAddr) (n, oobn int, err error)
	ReadMsgUnix(b, oob []byte) (n, oobn, flags int, addr *net.UnixAddr, err error)
}

var _ Conn = (*net.UnixConn)(nil)

// Send writes payload with fds attached (SCM_RIGHTS) as one message. The
// caller keeps its descriptors; the receiver gets its own copies. A payload
// must not be empty (a zero-byte message cannot carry descriptors on every
// socket type).
func Send(c Conn, payload []byte, fds ...int) error {
	if len(payload) == 0 {
		return errors.New("fdpass: empty payload")
	}
	if len(fds) > MaxFDs {
		return fmt.Errorf("%w: %d > %d", ErrTooManyFDs, len(fds), MaxFDs)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(payload, oob, nil)
	if err != nil {
		return fmt.Errorf("fdpass: send: %w", err)
	}
	if n != len(payload) || oobn != len(oob) {
		return fmt.Errorf("fdpass: short send: %d/%d bytes, %d/%d control", n, len(payload), oobn, len(oob))
	}
	return nil
}

// Recv reads one message into buf and returns the payload length and the
// descriptors that came with it (close-on-exec; the caller owns them). A
// message with more than maxFDs descriptors is refused: every descriptor it
// carried is closed and the error is ErrTooManyFDs. On any error no
// descriptor is returned open. A payload larger than buf is ErrTruncated
// on a datagram or seqpacket socket.
func Recv(c Conn, buf []byte, maxFDs int) (int, []int, error) {
	if maxFDs < 0 || maxFDs > MaxFDs {
		maxFDs = MaxFDs
	}
	// Room for one more descriptor than allowed, so an excess is seen
	// (and closed) rather than silently truncated by the kernel.
	oob := make([]byte, unix.CmsgSpace((maxFDs+1)*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	fds, perr := ParseRights(oob[:oobn])
	switch {
	case err != nil:
		perr = fmt.Errorf("fdpass: recv: %w", err)
	case n == 0 && oobn == 0:
		perr = io.EOF // a seqpacket socket reads zero bytes at end of stream
	case perr != nil:
	case flags&unix.MSG_CTRUNC != 0:
		// The control buffer has room for more than maxFDs descriptors, and
		// rights are the only control data expected: it overflowed.
		perr = fmt.Errorf("%w: control data overflowed room for %d", ErrTooManyFDs, maxFDs+1)
	case flags&unix.MSG_TRUNC != 0:
		perr = fmt.Errorf("%w: payload larger than %d bytes", ErrTruncated, len(buf))
	case len(fds) > maxFDs:
		perr = fmt.Errorf("%w: got %d, want at most %d", ErrTooManyFDs, len(fds), maxFDs)
	}
	if perr != nil {
		closeAll(fds)
		return n, nil, perr
	}
	return n, fds, nil
}

// The parser below reads struct cmsghdr with a 64-bit length field.
var _ [unix.SizeofCmsghdr - 16]byte

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// ParseRights extracts the descriptors of the SCM_RIGHTS messages in oob,
// the control data of one recvmsg. It never panics and never closes
// anything: on error it still returns every descriptor it found, so the
// caller can close them. Control messages of other kinds are
// ErrUnexpectedControl (after collecting the rights around them).
func ParseRights(oob []byte) ([]int, error) {
	const hdr = unix.SizeofCmsghdr
	var fds []int
	var firstErr error
	for len(oob) > 0 {
		if len(oob) < hdr {
			return fds, fmt.Errorf("%w: %d trailing bytes", ErrBadControl, len(oob))
		}
		// struct cmsghdr { size_t len; int level; int type; } in host order.
		clen := binary.NativeEndian.Uint64(oob[0:8])
		level := int32(binary.NativeEndian.Uint32(oob[8:12]))
		typ := int32(binary.NativeEndian.Uint32(oob[12:16]))
		if clen < hdr || clen > uint64(len(oob)) {
			return fds, fmt.Errorf("%w: length %d with %d bytes left", ErrBadControl, clen, len(oob))
		}
		data := oob[hdr:clen]
		if level == unix.SOL_SOCKET && typ == unix.SCM_RIGHTS {
			if len(data)%4 != 0 {
				return fds, fmt.Errorf("%w: SCM_RIGHTS of %d bytes", ErrBadControl, len(data))
			}
			for i := 0; i+4 <= len(data); i += 4 {
				fd := int32(binary.NativeEndian.Uint32(data[i:]))
				if fd < 0 {
					return fds, fmt.Errorf("%w: negative descriptor %d", ErrBadControl, fd)
				}
				fds = append(fds, int(fd))
			}
		} else if firstErr == nil {
			firstErr = fmt.Errorf("%w: level %d type %d", ErrUnexpectedControl, level, typ)
		}
		// The next header starts at the aligned end of this one.
		next := (clen + 7) &^ 7
		if next > uint64(len(oob)) {
			next = uint64(len(oob))
		}
		oob = oob[next:]
	}
	return fds, firstErr
}
