//go:build linux

// Package mapclienttest plays dsmd's side of the mapping session (package
// mapproto) for tests of package mapclient and of the libraries built on
// it, without a real dsmd.
//
// A Daemon listens on a socket in the test's temporary directory and
// serves the regions it was given, each session from a memfd of its own.
// It resolves the faults of a mapping itself, in the test process: a
// missing page is installed writable, every byte equal to its page number
// plus one. Resolving in the process that faults is only safe for faults
// taken inside a system call (ReadAt, WriteAt, Populate and the atomics
// of mapclient fault their pages in from madvise); a test must not make a
// plain load or store through Bytes() that this Daemon would have to
// resolve, because a Go program resolving its own faults can deadlock its
// runtime. Faults on held pages are never resolved, only reported (Faults),
// so plain accesses to held pages are safe.
//
// It also plays what dsmd does when it goes away (Die) and when a region
// is deleted (DeleteRegion), and can serve a region under a name with
// another id than before (SetRegion), as a page cache that lags behind the
// directory does. For fault timeouts it can map pages read-only
// (ReadOnly), send any message on a session (Send) and poison a page in a
// client (Poison), as dsmd does with a fault it gives up on.
package mapclienttest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/fdpass"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/mapproto"
	"github.com/dsmkit/dsm/internal/memfd"
	"github.com/dsmkit/dsm/internal/uffd"
)

// Region is a region that a Daemon serves.
type Region struct {
	Name  string
	ID    ids.RegionID
	Pages int // of the system page size
}

// Session is one session the Daemon accepted, as far as it got.
type Session struct {
	Region Region
	Memfd  *memfd.File
	Ended  bool // the session socket reached its end after Registered (the client closed it, or Die or DeleteRegion)
	// FaultTimeout is what the client's Map asked for (0: none).
	FaultTimeout time.Duration
}

// Daemon is a stand-in for dsmd's mapping sessions. Its methods are safe
// for concurrent use.
type Daemon struct {
	// Path is the SOCK_SEQPACKET socket to Connect to.
	Path string

	t      testing.TB
	ln     *net.UnixListener
	faults chan int
	wg     sync.WaitGroup

	mu       sync.Mutex
	regions  map[string]Region
	hold     map[int]bool
	readOnly map[int]bool
	reply    []byte // when set, replaces the answer to every Map
	sessions []*session
	lease    *LeasePage        // given to sessions that ask; nil: none
	refused  mapproto.Features // Maps asking for these are refused as unknown
}

type session struct {
	Session
	conn *net.UnixConn
	u    *uffd.UFFD
	addr uint64 // of the client's mapping, once registered
}

var ps = os.Getpagesize()

// New starts a Daemon that serves regions; it stops at the end of the
// test. It skips the test where this kernel or sandbox has no
// userfaultfd.
func New(t testing.TB, regions ...Region) *Daemon {
	t.Helper()
	if _, err := uffd.Probe(); err != nil {
		t.Skipf("no userfaultfd: %v", err)
	}
	d := &Daemon{t: t, faults: make(chan int, 64), regions: make(map[string]Region), hold: make(map[int]bool), readOnly: make(map[int]bool)}
	for _, r := range regions {
		d.regions[r.Name] = r
	}
	d.Path = filepath.Join(t.TempDir(), "dsmd.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: d.Path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	d.ln = ln
	d.wg.Add(1)
	go d.accept()
	t.Cleanup(d.stop)
	return d
}

// Hold makes faults on these pages (of any region) wait: they are reported
// on Faults and never resolved.
func (d *Daemon) Hold(pages ...int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range pages {
		d.hold[p] = true
	}
}

// ReadOnly makes the Daemon install these pages (of any region)
// write-protected when it resolves a missing fault on them, as dsmd maps a
// page it holds Shared; a write fault on them is then held (reported on
// Faults, never resolved).
func (d *Daemon) ReadOnly(pages ...int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range pages {
		d.readOnly[p] = true
	}
}

// Release undoes Hold and ReadOnly for these pages: later faults on them
// are resolved (faults already reported stay unresolved).
func (d *Daemon) Release(pages ...int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range pages {
		delete(d.hold, p)
		delete(d.readOnly, p)
	}
}

// Send sends m on the i-th session (in the order of Sessions), as dsmd
// sends Unavailable, Available and Poison after Registered.
func (d *Daemon) Send(i int, m mapproto.Msg) {
	d.t.Helper()
	s := d.session(i)
	b, err := mapproto.Encode(m)
	if err != nil {
		d.t.Fatal(err)
	}
	if _, err := s.conn.Write(b); err != nil {
		d.t.Fatalf("fake dsmd: sending %s: %v", m, err)
	}
}

// Poison poisons page p (of the system page size) in the i-th session's
// client with UFFDIO_POISON, as dsmd does with a fault it gives up on:
// the threads waiting on the page are woken and get SIGBUS. It returns
// the error (EEXIST: the client maps the page).
func (d *Daemon) Poison(i, p int) error {
	s := d.session(i)
	if s.u == nil {
		return errors.New("fake dsmd: the session is not registered")
	}
	return s.u.Poison(s.addr+uint64(p*ps), uint64(ps), 0)
}

// session is the i-th session answered with Mapped.
func (d *Daemon) session(i int) *session {
	d.t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.sessions {
		if s.Memfd == nil {
			continue
		}
		if i == 0 {
			return s
		}
		i--
	}
	d.t.Fatalf("fake dsmd: no session %d", i)
	return nil
}

// Faults reports the page of every fault on a held page.
func (d *Daemon) Faults() <-chan int { return d.faults }

// SetRegion serves r under its name from the next session on (adding it
// or replacing the region served under that name).
func (d *Daemon) SetRegion(r Region) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.regions[r.Name] = r
}

// SetReply makes the Daemon answer every later Map with b, whatever it is,
// and close the session.
func (d *Daemon) SetReply(b []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reply = b
}

// Sessions returns the sessions answered with Mapped so far, in the order
// they were accepted (sessions refused, or closed before asking, are left
// out).
func (d *Daemon) Sessions() []Session {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []Session
	for _, s := range d.sessions {
		if s.Memfd != nil {
			out = append(out, s.Session)
		}
	}
	return out
}

// RefuseFeatures makes the Daemon refuse, as a dsmd that predates them
// does, every later Map that asks for any of features (CodeBadRequest:
// unknown features).
func (d *Daemon) RefuseFeatures(features mapproto.Features) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refused = features
}

// Die closes every session socket and userfaultfd, as dsmd's exit does.
// It keeps listening, as a dsmd started again would.
func (d *Daemon) Die() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.sessions {
		s.conn.Close()
		if s.u != nil {
			s.u.Close()
		}
	}
}

// DeleteRegion ends every session of the region name as dsmd does when a
// region is deleted: Error{CodeUnknownRegion} after Registered, then the
// session and its userfaultfd closed and every page punched out of the
// memfd. The name is no longer served.
func (d *Daemon) DeleteRegion(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.regions[name]
	if !ok {
		return
	}
	delete(d.regions, name)
	b, err := mapproto.Encode(mapproto.Msg{Type: mapproto.TypeError, Code: mapproto.CodeUnknownRegion,
		Text: fmt.Sprintf("region %q (%s) was deleted", r.Name, r.ID)})
	if err != nil {
		d.t.Errorf("fake dsmd: %v", err)
		return
	}
	for _, s := range d.sessions {
		if s.Region != r || s.Memfd == nil {
			continue
		}
		s.conn.Write(b)
		s.conn.Close()
		if s.u != nil {
			s.u.Close()
		}
		if err := s.Memfd.PunchHole(0, s.Memfd.Size()); err != nil {
			d.t.Errorf("fake dsmd: %v", err)
		}
	}
}

// Fill writes page p of the i-th session's memfd with v behind the
// mapping's back, as another process's fault served by dsmd would: the
// page is then cached, and a first access to it through the mapping is a
// MINOR fault.
func (d *Daemon) Fill(i, p int, v byte) {
	mf := d.Sessions()[i].Memfd
	if _, err := unix.Pwrite(mf.Fd(), bytes.Repeat([]byte{v}, ps), int64(p*ps)); err != nil {
		d.t.Fatal(err)
	}
}

// Cached reports whether page p of the i-th session's memfd holds data.
func (d *Daemon) Cached(i, p int) bool {
	mf := d.Sessions()[i].Memfd
	n, err := mf.CachedPages(int64(p*ps), int64(ps))
	if err != nil {
		d.t.Fatal(err)
	}
	return n == 1
}

func (d *Daemon) accept() {
	defer d.wg.Done()
	for {
		conn, err := d.ln.AcceptUnix()
		if err != nil {
			return
		}
		s := &session{conn: conn}
		d.mu.Lock()
		d.sessions = append(d.sessions, s)
		d.mu.Unlock()
		d.wg.Add(1)
		go d.serve(s)
	}
}

func (d *Daemon) refuse(conn *net.UnixConn, code mapproto.Code, text string) {
	b, _ := mapproto.Encode(mapproto.Msg{Type: mapproto.TypeError, Code: code, Text: text})
	conn.Write(b)
}

func (d *Daemon) serve(s *session) {
	defer d.wg.Done()
	conn := s.conn
	buf := make([]byte, mapproto.MaxMsg)
	n, _, err := fdpass.Recv(conn, buf, 0)
	if err != nil {
		return
	}
	if n >= 2 && mapproto.IsControl(mapproto.Type(buf[1])) {
		// No control sessions, as in a dsmd that predates them (libdsm
		// then maps without looking the region up first).
		d.refuse(conn, mapproto.CodeBadRequest, fmt.Sprintf("mapproto: malformed message: unknown type %d", buf[1]))
		return
	}
	req, err := mapproto.Decode(buf[:n])
	if err != nil {
		d.t.Errorf("fake dsmd: %v", err)
		return
	}
	d.mu.Lock()
	reply := d.reply
	r, ok := d.regions[req.Name]
	lease, refused := d.lease, d.refused&req.Features
	d.mu.Unlock()
	if reply != nil {
		conn.Write(reply)
		return
	}
	if refused != 0 {
		d.refuse(conn, mapproto.CodeBadRequest, fmt.Sprintf("mapproto: malformed message: unknown features %#x", uint64(refused)))
		return
	}
	if !ok {
		d.refuse(conn, mapproto.CodeUnknownRegion, "no region "+req.Name)
		return
	}
	mf, err := memfd.Create("fake-"+r.Name, int64(r.Pages*ps))
	if err != nil {
		d.t.Errorf("fake dsmd: %v", err)
		return
	}
	d.mu.Lock()
	s.Region, s.Memfd, s.FaultTimeout = r, mf, req.FaultTimeout
	d.mu.Unlock()
	b, _ := mapproto.Encode(mapproto.Msg{Type: mapproto.TypeMapped, Region: r.ID, Size: uint64(mf.Size()), PageSize: uint32(ps)})
	sendFDs := []int{mf.Fd()}
	if lease != nil && req.Features&mapproto.FeatureLeasePage != 0 {
		sendFDs = append(sendFDs, lease.fd)
	}
	if err := fdpass.Send(conn, b, sendFDs...); err != nil {
		return
	}
	n, fds, err := fdpass.Recv(conn, buf, 1)
	if err != nil || len(fds) != 1 {
		return
	}
	reg, _ := mapproto.Decode(buf[:n])
	u, err := uffd.FromFD(fds[0])
	if err != nil {
		d.t.Errorf("fake dsmd: %v", err)
		return
	}
	d.mu.Lock()
	s.u, s.addr = u, reg.Addr
	d.mu.Unlock()
	b, _ = mapproto.Encode(mapproto.Msg{Type: mapproto.TypeRegistered})
	conn.Write(b)
	d.wg.Add(1)
	go d.watch(s)
	msgs := make([]uffd.Msg, 8)
	for {
		n, err := u.Read(msgs)
		if err != nil {
			return
		}
		for _, m := range msgs[:n] {
			p := int((m.Address - reg.Addr) / uint64(ps))
			d.mu.Lock()
			held, ro := d.hold[p], d.readOnly[p]
			d.mu.Unlock()
			if held || (ro && m.Kind() == uffd.FaultWP) {
				d.faults <- p
				continue
			}
			addr := reg.Addr + uint64(p*ps)
			var opt uffd.Opt
			if ro {
				opt = uffd.MapWP
			}
			switch m.Kind() {
			case uffd.FaultMissing:
				err = u.Copy(addr, bytes.Repeat([]byte{byte(p + 1)}, ps), opt)
			case uffd.FaultMinor:
				err = u.Continue(addr, uint64(ps), opt)
			case uffd.FaultWP:
				err = u.WriteProtect(addr, uint64(ps), false, 0)
			}
			if err != nil && !errors.Is(err, uffd.ErrProcessGone) {
				d.t.Errorf("fake dsmd: resolving %s: %v", m, err)
			}
		}
	}
}

// watch notes when the session ends.
func (d *Daemon) watch(s *session) {
	defer d.wg.Done()
	buf := make([]byte, mapproto.MaxMsg)
	for {
		if _, _, err := fdpass.Recv(s.conn, buf, 0); err != nil {
			break
		}
	}
	d.mu.Lock()
	s.Ended = true
	d.mu.Unlock()
}

func (d *Daemon) stop() {
	d.ln.Close()
	d.Die()
	d.wg.Wait()
	for _, s := range d.Sessions() {
		if s.Memfd != nil {
			s.Memfd.Close()
		}
	}
}
