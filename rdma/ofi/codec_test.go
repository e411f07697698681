//go:build ofi

package ofi

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

func TestFrameRoundTrip(t *testing.T) {
	var b [hdrLen + replyLen]byte
	var f frame

	n := encodeQuery(b[:], 7, 11, 0xabc)
	if err := decodeFrame(b[:n], &f); err != nil || f.Kind != frameQuery || f.From != 7 || f.ReqID != 11 || f.Key != 0xabc {
		t.Fatalf("query: %+v %v", f, err)
	}
	want := frame{ReqID: 3, Key: 9, Len: 4096, Base: 0x7f00_0000_1000, Found: true, Access: rdma.AccessRemoteRead, AccessKey: 0x1234_5678_9abc}
	n = encodeReply(b[:], 2, &want)
	if err := decodeFrame(b[:n], &f); err != nil {
		t.Fatal(err)
	}
	want.Kind, want.From = frameReply, 2
	if f.Kind != want.Kind || f.From != want.From || f.ReqID != want.ReqID || f.Key != want.Key ||
		f.Len != want.Len || f.Base != want.Base || f.Found != want.Found || f.Access != want.Access || f.AccessKey != want.AccessKey {
		t.Fatalf("reply: got %+v, want %+v", f, want)
	}
	want.ToNonce = 0x77
	n = encodeReply(b[:], 2, &want)
	stampNonces(b[:], 0x55, 0x99)
	if err := decodeFrame(b[:n], &f); err != nil || f.FromNonce != 0x55 || f.ToNonce != 0x77 {
		t.Fatalf("reply nonces: %+v %v, want from 0x55 to 0x77 (a reply keeps the requester's)", f, err)
	}
	n = encodeQuery(b[:], 7, 11, 0xabc)
	stampNonces(b[:], 0x55, 0x99)
	if err := decodeFrame(b[:n], &f); err != nil || f.FromNonce != 0x55 || f.ToNonce != 0x99 {
		t.Fatalf("query nonces: %+v %v", f, err)
	}
	n = encodeRevoke(b[:], 4, 5, 6)
	if err := decodeFrame(b[:n], &f); err != nil || f.Kind != frameRevoke || f.ReqID != 5 || f.Key != 6 {
		t.Fatalf("revoke: %+v %v", f, err)
	}
	n = encodeBye(b[:], 9, 12)
	if err := decodeFrame(b[:n], &f); err != nil || f.Kind != frameBye || f.From != 9 || f.ReqID != 12 {
		t.Fatalf("bye: %+v %v", f, err)
	}
	msg := append(b[:hdrLen:hdrLen], "hello"...)
	putHdr(msg, frameUser, 1)
	if err := decodeFrame(msg, &f); err != nil || f.Kind != frameUser || string(f.Payload) != "hello" {
		t.Fatalf("user: %+v %v", f, err)
	}
}

func TestFrameRejects(t *testing.T) {
	var q [hdrLen + queryLen]byte
	encodeQuery(q[:], 1, 1, 1)
	var r [hdrLen + replyLen]byte
	encodeReply(r[:], 1, &frame{Access: rdma.AccessAll})
	bad := map[string][]byte{
		"empty":         nil,
		"short header":  q[:hdrLen-1],
		"version 1":     append([]byte{1}, q[1:]...),
		"reserved":      append(append([]byte{}, q[:2]...), append([]byte{1, 0}, q[4:]...)...),
		"no sender":     append(append([]byte{}, q[:4]...), append([]byte{0, 0, 0, 0}, q[8:]...)...),
		"kind 0":        append([]byte{wireV3, 0}, q[2:]...),
		"kind 99":       append([]byte{wireV3, 99}, q[2:]...),
		"short query":   q[:len(q)-1],
		"long query":    append(append([]byte{}, q[:]...), 0),
		"found flag":    func() []byte { c := r; c[hdrLen+32] = 2; return c[:] }(),
		"access bits":   func() []byte { c := r; c[hdrLen+33] = 0x80; return c[:] }(),
		"huge user msg": append(append([]byte{}, q[:hdrLen]...), make([]byte, rdma.MaxMessage+1)...),
	}
	bad["huge user msg"][1] = byte(frameUser)
	for name, b := range bad {
		var f frame
		if err := decodeFrame(b, &f); !errors.Is(err, ErrBadFrame) {
			t.Errorf("%s: %v, want ErrBadFrame", name, err)
		}
	}
}

func TestAddr(t *testing.T) {
	name := []byte{2, 0, 0x1f, 0x90, 127, 0, 0, 1}
	s := formatAddr("tcp;ofi_rxm", name)
	prov, got, err := parseAddr(s)
	if err != nil || prov != "tcp;ofi_rxm" || !bytes.Equal(got, name) {
		t.Fatalf("parse %q: %q %x %v", s, prov, got, err)
	}
	for _, s := range []string{"", "ofi:", "ofi:shm", "ofi::00", "ofi:shm:", "ofi:shm:0g", "ofi:shm:abc", "tcp:127.0.0.1:1",
		"ofi:shm:" + string(bytes.Repeat([]byte("00"), maxNameLen+1))} {
		if _, _, err := parseAddr(s); !errors.Is(err, ErrBadAddr) {
			t.Errorf("parse %q: %v, want ErrBadAddr", s, err)
		}
	}
}

func TestAddPeerRejects(t *testing.T) {
	a, _ := pair(t, "sockets")
	for _, addr := range []string{"nonsense", "ofi:shm:00", "ofi:sockets:0200", formatAddr("sockets", make([]byte, 64))} {
		if err := a.AddPeer(5, addr); err == nil {
			t.Errorf("AddPeer(%q) succeeded", addr)
		}
	}
	if err := a.AddPeer(ids.None, a.Addr()); err == nil {
		t.Error("AddPeer of node 0 succeeded")
	}
}

// FuzzDecodeFrame feeds arbitrary bytes, as a peer could send them, to the
// frame decoder: it must not panic, and what it accepts must re-encode to
// the same bytes.
func FuzzDecodeFrame(f *testing.F) {
	var b [hdrLen + replyLen]byte
	f.Add(b[:encodeQuery(b[:], 1, 2, 3)])
	f.Add(b[:encodeReply(b[:], 1, &frame{ReqID: 1, Key: 2, Len: 3, Base: 4, Found: true, Access: rdma.AccessAll})])
	f.Add(b[:encodeRevoke(b[:], 1, 2, 3)])
	f.Add(b[:encodeBye(b[:], 1, 2)])
	f.Add(append([]byte{wireV3, 1, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0}, "hi"...))
	f.Fuzz(func(t *testing.T, in []byte) {
		var fr frame
		if err := decodeFrame(in, &fr); err != nil {
			return
		}
		var out [hdrLen + replyLen]byte
		var n int
		switch fr.Kind {
		case frameQuery:
			n = encodeQuery(out[:], fr.From, fr.ReqID, fr.Key)
		case frameReply:
			n = encodeReply(out[:], fr.From, &fr)
		case frameRevoke:
			n = encodeRevoke(out[:], fr.From, fr.ReqID, fr.Key)
		case frameBye:
			n = encodeBye(out[:], fr.From, fr.ReqID)
		case frameUser:
			if !bytes.Equal(fr.Payload, in[hdrLen:]) {
				t.Fatalf("payload differs")
			}
			return
		default:
			t.Fatalf("accepted kind %d", fr.Kind)
		}
		stampNonces(out[:], fr.FromNonce, fr.ToNonce)
		if !bytes.Equal(out[:n], in) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", in, out[:n])
		}
	})
}

// FuzzParseAddr feeds arbitrary addresses, as the directory could carry
// them, to the address parser.
func FuzzParseAddr(f *testing.F) {
	f.Add(formatAddr("sockets", []byte{2, 0, 1, 2, 127, 0, 0, 1}))
	f.Add("ofi:tcp;ofi_rxm:00")
	f.Fuzz(func(t *testing.T, s string) {
		prov, name, err := parseAddr(s)
		if err != nil {
			return
		}
		// Hex digits may come in either case; formatAddr writes lower case.
		if !strings.EqualFold(formatAddr(prov, name), s) {
			t.Fatalf("%q re-formats as %q", s, formatAddr(prov, name))
		}
	})
}
