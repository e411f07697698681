//go:build ofi

package ofi

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// Errors of the wire format and of addresses.
var (
	// ErrBadFrame is a two-sided message that does not decode.
	ErrBadFrame = errors.New("ofi: malformed control frame")
	// ErrBadAddr is an address that is not one this backend produced.
	ErrBadAddr = errors.New("ofi: malformed address")
	// ErrProviderMismatch is a peer address on another provider.
	ErrProviderMismatch = errors.New("ofi: peer uses another provider")
)

// Every two-sided message starts with this header: version, kind, two zero
// bytes, the sender's node id, the sender's incarnation nonce and the
// incarnation of the receiver it is meant for (0: any), little-endian.
// Version 1 had neither nonce: its frames are refused.
const (
	hdrLen     = 24
	wireV3     = 3
	maxNameLen = 256
)

// frameKind is the kind of a two-sided message. The zero value is invalid.
type frameKind uint8

const (
	// frameUser carries a caller's message to the handler.
	frameUser frameKind = 1 + iota
	// frameQuery asks the target for the descriptor of a key.
	frameQuery
	// frameReply answers a query.
	frameReply
	// frameBye says that the sender is closing its endpoint; the receiver
	// answers with a frameReply once it handled every frame and request
	// the sender issued before it.
	frameBye
	// frameRevoke says that the sender deregistered a key; the receiver
	// answers with a frameReply (not found) once it will no longer issue
	// operations on that key.
	frameRevoke
)

const (
	queryLen  = 16 // reqID, key
	replyLen  = 42 // reqID, key, len, base, found, access, access key
	revokeLen = 16 // reqID, key
	byeLen    = 8  // reqID
)

// frame is a decoded two-sided message. Payload aliases the input.
type frame struct {
	Kind frameKind
	From ids.NodeID
	// FromNonce is the sender's incarnation; ToNonce the receiver's
	// incarnation the sender means to reach (0: any).
	FromNonce uint64
	ToNonce   uint64
	ReqID     uint64
	Key       uint64
	Len       uint64
	Base      uint64
	Found     bool
	Access    rdma.Access
	// AccessKey is the fabric key a reply grants the requester's
	// incarnation for Key (see Transport.Fence).
	AccessKey uint64
	Payload   []byte
}

// putHdr writes a header with both nonces zero; the transport stamps them
// (stampNonces) when it sends the frame.
func putHdr(b []byte, k frameKind, from ids.NodeID) {
	b[0] = wireV3
	b[1] = byte(k)
	b[2], b[3] = 0, 0
	binary.LittleEndian.PutUint32(b[4:], uint32(from))
	clear(b[8:hdrLen])
}

// stampNonces sets the nonces of an encoded frame's header: the sender's
// incarnation, and the receiver's incarnation it is meant for (0: any),
// unless the frame already names one (a reply names the requester's).
func stampNonces(b []byte, from, to uint64) {
	binary.LittleEndian.PutUint64(b[8:], from)
	if binary.LittleEndian.Uint64(b[16:]) == 0 {
		binary.LittleEndian.PutUint64(b[16:], to)
	}
}

// encodeQuery, encodeReply, encodeRevoke and encodeBye write a control frame
// into b, which is large enough, and return its length.
func encodeQuery(b []byte, from ids.NodeID, reqID, key uint64) int {
	putHdr(b, frameQuery, from)
	binary.LittleEndian.PutUint64(b[hdrLen:], reqID)
	binary.LittleEndian.PutUint64(b[hdrLen+8:], key)
	return hdrLen + queryLen
}

func encodeReply(b []byte, from ids.NodeID, f *frame) int {
	putHdr(b, frameReply, from)
	// A reply goes to the incarnation that asked (f.ToNonce).
	binary.LittleEndian.PutUint64(b[16:], f.ToNonce)
	binary.LittleEndian.PutUint64(b[hdrLen:], f.ReqID)
	binary.LittleEndian.PutUint64(b[hdrLen+8:], f.Key)
	binary.LittleEndian.PutUint64(b[hdrLen+16:], f.Len)
	binary.LittleEndian.PutUint64(b[hdrLen+24:], f.Base)
	b[hdrLen+32] = 0
	if f.Found {
		b[hdrLen+32] = 1
	}
	b[hdrLen+33] = byte(f.Access)
	binary.LittleEndian.PutUint64(b[hdrLen+34:], f.AccessKey)
	return hdrLen + replyLen
}

func encodeRevoke(b []byte, from ids.NodeID, reqID, key uint64) int {
	putHdr(b, frameRevoke, from)
	binary.LittleEndian.PutUint64(b[hdrLen:], reqID)
	binary.LittleEndian.PutUint64(b[hdrLen+8:], key)
	return hdrLen + revokeLen
}

func encodeBye(b []byte, from ids.NodeID, reqID uint64) int {
	putHdr(b, frameBye, from)
	binary.LittleEndian.PutUint64(b[hdrLen:], reqID)
	return hdrLen + byeLen
}

// decodeFrame parses a two-sided message. It never panics: any input that
// is not exactly a frame of this version gets ErrBadFrame.
func decodeFrame(b []byte, f *frame) error {
	if len(b) < hdrLen {
		return fmt.Errorf("%w: %d bytes", ErrBadFrame, len(b))
	}
	if b[0] != wireV3 || b[2] != 0 || b[3] != 0 {
		return fmt.Errorf("%w: header %x", ErrBadFrame, b[:4])
	}
	*f = frame{Kind: frameKind(b[1]), From: ids.NodeID(binary.LittleEndian.Uint32(b[4:])),
		FromNonce: binary.LittleEndian.Uint64(b[8:]), ToNonce: binary.LittleEndian.Uint64(b[16:])}
	if f.From == ids.None {
		return fmt.Errorf("%w: no sender", ErrBadFrame)
	}
	body := b[hdrLen:]
	want := -1
	switch f.Kind {
	case frameUser:
		if len(body) > rdma.MaxMessage {
			return fmt.Errorf("%w: %d-byte message", ErrBadFrame, len(body))
		}
		f.Payload = body
		return nil
	case frameQuery:
		want = queryLen
	case frameReply:
		want = replyLen
	case frameBye:
		want = byeLen
	case frameRevoke:
		want = revokeLen
	default:
		return fmt.Errorf("%w: kind %d", ErrBadFrame, b[1])
	}
	if len(body) != want {
		return fmt.Errorf("%w: %d-byte body for kind %d", ErrBadFrame, len(body), b[1])
	}
	switch f.Kind {
	case frameQuery, frameRevoke:
		f.ReqID = binary.LittleEndian.Uint64(body)
		f.Key = binary.LittleEndian.Uint64(body[8:])
	case frameBye:
		f.ReqID = binary.LittleEndian.Uint64(body)
	case frameReply:
		f.ReqID = binary.LittleEndian.Uint64(body)
		f.Key = binary.LittleEndian.Uint64(body[8:])
		f.Len = binary.LittleEndian.Uint64(body[16:])
		f.Base = binary.LittleEndian.Uint64(body[24:])
		switch body[32] {
		case 0:
		case 1:
			f.Found = true
		default:
			return fmt.Errorf("%w: found flag %d", ErrBadFrame, body[32])
		}
		f.Access = rdma.Access(body[33])
		if f.Access&^rdma.AccessAll != 0 {
			return fmt.Errorf("%w: access %#x", ErrBadFrame, body[33])
		}
		f.AccessKey = binary.LittleEndian.Uint64(body[34:])
	}
	return nil
}

// An address is "ofi:" + provider + ":" + hex of the endpoint name that
// fi_getname returned. The provider is part of it because an endpoint name
// only means something to the provider that made it.
const addrPrefix = "ofi:"

func formatAddr(prov string, name []byte) string {
	return addrPrefix + prov + ":" + hex.EncodeToString(name)
}

// parseAddr splits an address into provider and endpoint name.
func parseAddr(s string) (prov string, name []byte, err error) {
	rest, ok := strings.CutPrefix(s, addrPrefix)
	if !ok {
		return "", nil, fmt.Errorf("%w: %q", ErrBadAddr, s)
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 {
		return "", nil, fmt.Errorf("%w: %q", ErrBadAddr, s)
	}
	prov, h := rest[:i], rest[i+1:]
	if len(h) == 0 || len(h) > 2*maxNameLen {
		return "", nil, fmt.Errorf("%w: name of %d hex digits", ErrBadAddr, len(h))
	}
	name, err = hex.DecodeString(h)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %v", ErrBadAddr, err)
	}
	return prov, name, nil
}
