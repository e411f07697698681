//go:build linux

package localcache

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/localsock"
	"github.com/dsmkit/dsm/internal/mapproto"
)

func ctlRoundTrip(t *testing.T, conn net.Conn, b []byte) []byte {
	t.Helper()
	conn.SetDeadline(time.Now().Add(hangDeadline))
	if _, err := conn.Write(b); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, mapproto.MaxMsg)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("no answer to %x: %v", b, err)
	}
	return buf[:n]
}

func mustEncodeCtl(t *testing.T, m mapproto.Ctl) []byte {
	t.Helper()
	b, err := mapproto.EncodeCtl(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestControlSession: control requests are answered in order by
// Config.Control, a refusal keeps the session, a malformed request ends
// it; without Control they are refused.
func TestControlSession(t *testing.T) {
	var seen atomic.Int32
	c, err := New(Config{Coherence: newTestHome(), Control: func(_ context.Context, _ localsock.Identity, req mapproto.Ctl) (mapproto.Ctl, error) {
		seen.Add(1)
		if req.Name == "r" {
			return mapproto.Ctl{Type: mapproto.TypeRegion, Region: 2, Size: 4096, PageSize: 4096, Durability: mapproto.DurabilityMemory}, nil
		}
		if req.Name == "bad" {
			return mapproto.Ctl{Type: mapproto.TypeStates}, nil // unencodable: no states
		}
		return mapproto.Ctl{}, Refuse(mapproto.CodeUnknownRegion, errors.New("no such region"))
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sock := filepath.Join(t.TempDir(), "map.sock")
	if err := c.Listen(sock); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("unixpacket", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reply := ctlRoundTrip(t, conn, mustEncodeCtl(t, mapproto.Ctl{Type: mapproto.TypeLookup, Name: "x"}))
	if m, err := mapproto.Decode(reply); err != nil || m.Code != mapproto.CodeUnknownRegion || m.Text != "no such region" {
		t.Fatalf("refused lookup: %+v %v", m, err)
	}
	reply = ctlRoundTrip(t, conn, mustEncodeCtl(t, mapproto.Ctl{Type: mapproto.TypeLookup, Name: "r"}))
	if m, err := mapproto.DecodeCtl(reply); err != nil || m.Type != mapproto.TypeRegion || m.Region != 2 {
		t.Fatalf("lookup: %+v %v", m, err)
	}
	reply = ctlRoundTrip(t, conn, mustEncodeCtl(t, mapproto.Ctl{Type: mapproto.TypeLookup, Name: "bad"}))
	if m, err := mapproto.Decode(reply); err != nil || m.Code != mapproto.CodeInternal {
		t.Fatalf("an answer that does not encode: %+v %v", m, err)
	}
	// A reply type sent as a request, then nothing more.
	reply = ctlRoundTrip(t, conn, mustEncodeCtl(t, mapproto.Ctl{Type: mapproto.TypeDone, Count: 1}))
	if m, err := mapproto.Decode(reply); err != nil || m.Code != mapproto.CodeBadRequest {
		t.Fatalf("reply as request: %+v %v", m, err)
	}
	if _, err := conn.Read(make([]byte, mapproto.MaxMsg)); err == nil {
		t.Fatal("the session goes on after a bad request")
	}
	if n := seen.Load(); n != 3 {
		t.Fatalf("Control saw %d requests, want 3", n)
	}

	// Without Control: refused.
	d := newDaemon(t, 0)
	conn2, err := net.Dial("unixpacket", d.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	reply = ctlRoundTrip(t, conn2, mustEncodeCtl(t, mapproto.Ctl{Type: mapproto.TypeLookup, Name: "r"}))
	if m, err := mapproto.Decode(reply); err != nil || m.Code != mapproto.CodeBadRequest {
		t.Fatalf("control without Control: %+v %v", m, err)
	}
}
