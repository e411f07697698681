//go:build linux

package mapclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/fdpass"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/mapproto"
	"github.com/dsmkit/dsm/internal/memfd"
	"github.com/dsmkit/dsm/internal/uffd"
)

// DefaultTimeout bounds the handshake of Map when ctx has no deadline.
const DefaultTimeout = 30 * time.Second

// Client is a handle on the local dsmd's session socket. Each Map opens a
// session of its own.
type Client struct {
	path string

	mu     sync.Mutex
	closed bool
	maps   map[*Mapping]struct{}
}

// Connect checks that dsmd accepts sessions at socketPath and returns a
// Client for it.
func Connect(ctx context.Context, socketPath string) (*Client, error) {
	conn, err := dial(ctx, socketPath)
	if err != nil {
		return nil, err
	}
	conn.Close()
	return &Client{path: socketPath, maps: make(map[*Mapping]struct{})}, nil
}

func dial(ctx context.Context, path string) (*net.UnixConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return c.(*net.UnixConn), nil
}

// Close closes every mapping made by this Client.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	maps := make([]*Mapping, 0, len(c.maps))
	for m := range c.maps {
		maps = append(maps, m)
	}
	c.mu.Unlock()
	var errs []error
	for _, m := range maps {
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
}

// Mapping states.
const (
	live    int32 = iota
	dead          // the session ended under us (dsmd went away)
	deleted       // dsmd ended the session because the region was deleted
	closed        // Close was called
)

// Mapping is this process's coherent mapping of one region. Plain loads and
// stores through Bytes() are coherent; misses are served by dsmd.
type Mapping struct {
	c    *Client
	name string
	// faultTimeout is Options.FaultTimeout: it also bounds how long an
	// access waits for the lease watchdog to let the mapping go.
	faultTimeout time.Duration
	region       ids.RegionID
	pageSize     int64
	session      uint64 // dsmd's token for this session; 0: none
	mp           *memfd.Mapping
	b            []byte
	conn         *net.UnixConn
	// u is this process's own copy of the userfaultfd it gave dsmd, kept
	// until Close and never read: while it is open the kernel keeps the
	// range registered, so a fault that nobody answers waits instead of
	// being filled with zeros or the memfd's stale pages when dsmd's copy
	// goes away.
	u *uffd.UFFD

	state atomic.Int32
	// why is what Err returns once the state is dead or deleted; written
	// once, before the state leaves live.
	why     error
	endOnce sync.Once
	done    chan struct{} // closed when the mapping stops being live
	mon     chan struct{} // closed when the monitor goroutine has returned

	// mu is held shared by ReadAt and WriteAt and exclusively by Close
	// for munmap, so the memory never goes away under a copy.
	mu       sync.RWMutex
	unmapped bool

	// pmu guards poisoned and pchanged.
	pmu sync.Mutex
	// poisoned holds the pages dsmd poisoned in this mapping (mapproto
	// Unavailable), with why, until dsmd says they are served again
	// (Available) and the marker is gone.
	poisoned map[ids.PageNo]string
	// pchanged is closed (and replaced) whenever poisoned changes.
	pchanged chan struct{}

	// prot is the protection the mapping was made with, which the
	// watchdog gives back when it lets go.
	prot int
	// wd is the lease watchdog (watchdog_linux.go); nil when dsmd gave no
	// lease page.
	wd *watchdog
	// wmu orders the changes of protection: the watchdog's (leaseFence)
	// and end's fence, after which the watchdog changes nothing. It
	// guards held (the watchdog made the mapping PROT_NONE), wgen and
	// heldCount (changes of held, and those to true) and wchanged (closed
	// and replaced at each change).
	wmu       sync.Mutex
	wfirst    chan struct{} // closed after the watchdog's first look at the page
	held      bool
	wgen      uint64
	heldCount uint64
	wchanged  chan struct{}
}

// Options tune MapWith.
type Options struct {
	// FaultTimeout, when positive, asks dsmd to give up on a fault of this
	// mapping that waits longer than that for a page the cluster cannot
	// serve (its home is down or unreachable): the page is poisoned in
	// this process, so a plain access gets SIGBUS and ReadAt, WriteAt,
	// Populate and Word fail with ErrPageUnavailable, until dsmd serves it
	// again. It also bounds how long ReadAt, WriteAt, Populate and Word
	// wait for the lease watchdog to give the mapping back (a dsmd stopped
	// or stuck past its lease): after it they fail with ErrPageUnavailable
	// and the mapping lives on. Zero or negative: faults wait as long as
	// it takes. It needs a dsmd that knows it (an older one refuses the
	// Map as a bad request).
	FaultTimeout time.Duration
	// Session asks dsmd for the session's token (Mapping.Session). It
	// needs a dsmd that knows it (an older one refuses the Map as a bad
	// request).
	Session bool
	// NoWatchdog maps without asking for dsmd's lease page, so without
	// the watchdog that makes the mapping inaccessible when dsmd's lease
	// runs out (see the package doc). Every Map asks for it otherwise, and
	// a dsmd that has none, or predates it, maps without it.
	NoWatchdog bool
}

// Map maps the region name and hands its faults to dsmd, with faults that
// wait as long as it takes. ctx bounds the handshake only, and, with a
// lease watchdog, the wait for dsmd's lease: Map returns a mapping only
// once dsmd holds a lease (a dsmd that starts, or that lost its lease, has
// none for a while), and fails with ErrUnavailable if it still has none
// when ctx ends (after DefaultTimeout if ctx has no deadline).
func (c *Client) Map(ctx context.Context, name string) (*Mapping, error) {
	return c.MapWith(ctx, name, Options{})
}

// MapWith is Map with options.
func (c *Client) MapWith(ctx context.Context, name string, opts Options) (*Mapping, error) {
	c.mu.Lock()
	isClosed := c.closed
	c.mu.Unlock()
	if isClosed {
		return nil, ErrClosed
	}
	conn, err := dial(ctx, c.path)
	if err != nil {
		return nil, err
	}
	m, err := handshake(ctx, conn, name, opts)
	var se *ServerError
	if !opts.NoWatchdog && errors.As(err, &se) && se.Code == mapproto.CodeBadRequest && strings.Contains(se.Text, "unknown features") {
		// A dsmd older than the lease page refuses the Map that asks for
		// it: map again without.
		conn.Close()
		opts.NoWatchdog = true
		if conn, err = dial(ctx, c.path); err != nil {
			return nil, err
		}
		m, err = handshake(ctx, conn, name, opts)
	}
	if err != nil {
		conn.Close()
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("mapclient: map %q: %w (%v)", name, cerr, err)
		}
		return nil, err
	}
	m.c = c
	go m.monitor()
	if m.wd != nil {
		go m.watch()
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		m.Close()
		return nil, ErrClosed
	}
	c.maps[m] = struct{}{}
	c.mu.Unlock()
	if err := m.waitLease(ctx); err != nil {
		m.Close()
		return nil, fmt.Errorf("mapclient: map %q: %w", name, err)
	}
	return m, nil
}

func handshake(ctx context.Context, conn *net.UnixConn, name string, opts Options) (m *Mapping, err error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultTimeout)
	}
	conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	var features mapproto.Features
	if opts.Session {
		features |= mapproto.FeatureSession
	}
	maxFDs := 1
	if !opts.NoWatchdog {
		features |= mapproto.FeatureLeasePage
		maxFDs = 2
	}
	req, err := mapproto.Encode(mapproto.Msg{Type: mapproto.TypeMap, Name: name, FaultTimeout: opts.FaultTimeout, Features: features})
	if err != nil {
		return nil, err
	}
	if err := fdpass.Send(conn, req); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	buf := make([]byte, mapproto.MaxMsg)
	reply, fds, err := recv(conn, buf, maxFDs)
	if err != nil {
		return nil, err
	}
	if reply.Type != mapproto.TypeMapped || len(fds) < 1 {
		closeFDs(fds)
		return nil, fmt.Errorf("%w: %s with %d descriptors in answer to map", ErrProtocol, reply.Type, len(fds))
	}
	var wd *watchdog
	if len(fds) == 2 {
		if wd, err = newWatchdog(fds[1]); err != nil {
			closeFDs(fds[:1])
			return nil, err
		}
		defer func() {
			if err != nil {
				wd.release()
			}
		}()
	}
	mf, err := memfd.FromFD(fds[0])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	defer mf.Close() // the mapping keeps the memory
	ps := int64(reply.PageSize)
	sys := int64(os.Getpagesize())
	if ps <= 0 || ps%sys != 0 || reply.Size == 0 || uint64(mf.Size()) != reply.Size || mf.Size()%ps != 0 {
		return nil, fmt.Errorf("%w: region of %d bytes (memfd %d), page size %d", ErrProtocol, reply.Size, mf.Size(), ps)
	}
	mp, err := mf.Map(0, mf.Size(), memfd.ReadWrite)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			mp.Unmap()
		}
	}()
	if err := mp.DontFork(); err != nil {
		return nil, err
	}
	// FeaturePoison, where the kernel has it (Linux 6.6), lets dsmd fail a
	// fault that waits too long (Options.FaultTimeout).
	u, err := uffd.Open(uffd.Options{Optional: uffd.DefaultOptional | uffd.FeaturePoison})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			u.Close()
		}
	}()
	if _, err := u.Register(mp.Addr(), uint64(mp.Len()), uffd.ModeMissing|uffd.ModeWP|uffd.ModeMinor); err != nil {
		return nil, err
	}
	reg, err := mapproto.Encode(mapproto.Msg{Type: mapproto.TypeRegister, Addr: mp.Addr(), Len: uint64(mp.Len())})
	if err != nil {
		return nil, err
	}
	if err := fdpass.Send(conn, reg, u.Fd()); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	ack, _, err := recv(conn, buf, 0)
	if err != nil {
		return nil, err
	}
	if ack.Type != mapproto.TypeRegistered {
		return nil, fmt.Errorf("%w: %s in answer to register", ErrProtocol, ack.Type)
	}
	conn.SetDeadline(time.Time{})
	return &Mapping{
		name: name, region: reply.Region, pageSize: ps, session: ack.Session, faultTimeout: opts.FaultTimeout,
		mp: mp, b: mp.Bytes(), conn: conn, u: u,
		done: make(chan struct{}), mon: make(chan struct{}),
		poisoned: make(map[ids.PageNo]string), pchanged: make(chan struct{}),
		prot: int(memfd.ReadWrite), wd: wd, wchanged: make(chan struct{}), wfirst: make(chan struct{}),
	}, nil
}

// recv reads one message; an Error message becomes a *ServerError.
func recv(conn *net.UnixConn, buf []byte, maxFDs int) (mapproto.Msg, []int, error) {
	n, fds, err := fdpass.Recv(conn, buf, maxFDs)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return mapproto.Msg{}, nil, fmt.Errorf("%w: session closed during the handshake", ErrUnavailable)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return mapproto.Msg{}, nil, fmt.Errorf("%w: handshake: %v", ErrUnavailable, err)
		}
		return mapproto.Msg{}, nil, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	msg, err := mapproto.Decode(buf[:n])
	if err != nil {
		closeFDs(fds)
		return msg, nil, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	if msg.Type == mapproto.TypeError {
		closeFDs(fds)
		return msg, nil, &ServerError{Code: msg.Code, Text: msg.Text}
	}
	return msg, fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		os.NewFile(uintptr(fd), "").Close()
	}
}

// monitor waits for the end of the session. After the handshake dsmd
// sends Unavailable and Available about poisoned pages (see poison), and
// at most one Error, Error{CodeUnknownRegion} when the region is deleted
// or Error{CodePermissionDenied} when its access list no longer lets this
// process in, before it closes the session; any other end (end of stream, an error,
// another Error) means that dsmd went away.
func (m *Mapping) monitor() {
	defer close(m.mon)
	buf := make([]byte, mapproto.MaxMsg)
	for {
		n, fds, err := fdpass.Recv(m.conn, buf, 0)
		closeFDs(fds)
		if err != nil {
			m.end(dead, ErrDaemonGone)
			return
		}
		msg, err := mapproto.Decode(buf[:n])
		switch {
		case err != nil:
			m.end(dead, fmt.Errorf("%w: undecodable message from dsmd: %v", ErrDaemonGone, err))
		case msg.Type == mapproto.TypeError && msg.Code == mapproto.CodeUnknownRegion:
			m.end(deleted, fmt.Errorf("%w: %s", ErrRegionDeleted, msg.Text))
		case msg.Type == mapproto.TypeError && msg.Code == mapproto.CodePermissionDenied:
			// The region's access list no longer lets this process in.
			m.end(dead, fmt.Errorf("%w: %s", ErrPermissionDenied, msg.Text))
		case msg.Type == mapproto.TypeError:
			m.end(dead, fmt.Errorf("%w: %s: %s", ErrDaemonGone, msg.Code, msg.Text))
		case msg.Type == mapproto.TypeUnavailable:
			m.poison(msg.Page, msg.Text)
			continue
		case msg.Type == mapproto.TypeAvailable:
			m.unpoison(msg.Page)
			continue
		case msg.Type == mapproto.TypePoison:
			m.poisonMapped(msg.Page)
			continue
		default:
			continue // nothing else is defined after the handshake; ignore
		}
		return
	}
}

// poison records that dsmd poisoned page p of the mapping (it is about
// to, or did): accesses to it fail until unpoison.
func (m *Mapping) poison(p ids.PageNo, why string) {
	if int64(p) >= int64(len(m.b))/m.pageSize {
		return
	}
	if why == "" {
		why = "dsmd gave no reason"
	}
	m.pmu.Lock()
	defer m.pmu.Unlock()
	m.poisoned[p] = why
	close(m.pchanged)
	m.pchanged = make(chan struct{})
}

// unpoison removes the poison markers of page p, which dsmd serves again:
// madvise(MADV_DONTNEED) of the page in this process drops them (and the
// page's mapping, which the next access faults back in from dsmd), then
// the record goes. The monitor calls it, so Close has not unmapped yet.
func (m *Mapping) unpoison(p ids.PageNo) {
	if int64(p) >= int64(len(m.b))/m.pageSize {
		return
	}
	off := int64(p) * m.pageSize
	// An error leaves the marker: the page stays poisoned for this
	// mapping (accesses fail as before); nothing better can be done.
	_ = unix.Madvise(m.b[off:off+m.pageSize], unix.MADV_DONTNEED)
	m.pmu.Lock()
	defer m.pmu.Unlock()
	if _, ok := m.poisoned[p]; ok {
		delete(m.poisoned, p)
		close(m.pchanged)
		m.pchanged = make(chan struct{})
	}
}

// poisonMapped poisons page p of this mapping itself, as dsmd asks when it
// cannot (a write fault on a page mapped read-only here: UFFDIO_POISON
// refuses a page-table entry that is not empty). madvise(MADV_DONTNEED)
// drops the mapping but leaves a write-protect marker (the page was
// write-protected), which POISON refuses too; clearing the protection of
// the unmapped page removes it (DontWake); then POISON, with this
// process's own copy of the userfaultfd, installs the marker and wakes
// the faulting thread, which gets SIGBUS. dsmd maps nothing on the page
// meanwhile. A write-protect marker that dsmd sets again in between (a
// remote request on the page) is cleared again, a few times. If it does
// not take, the faulting thread waits until the page is available again.
func (m *Mapping) poisonMapped(p ids.PageNo) {
	if int64(p) >= int64(len(m.b))/m.pageSize {
		return
	}
	off := int64(p) * m.pageSize
	addr, n := m.mp.Addr()+uint64(off), uint64(m.pageSize)
	if err := unix.Madvise(m.b[off:off+m.pageSize], unix.MADV_DONTNEED); err != nil {
		return
	}
	for range 10 {
		if err := m.u.WriteProtect(addr, n, false, uffd.DontWake); err != nil {
			return
		}
		if err := m.u.Poison(addr, n, 0); !errors.Is(err, unix.EEXIST) {
			return
		}
	}
}

// notifyWait bounds how long an access that found a poisoned page waits
// for dsmd's message saying why (dsmd sends it before it poisons, so it is
// normally there already).
const notifyWait = 5 * time.Second

// unavailable is the error of an access to [lo, hi) that hit a poison
// marker: a *PageError naming the first poisoned page of the range and
// dsmd's reason, waiting for dsmd's message if it has not been read yet.
func (m *Mapping) unavailable(lo, hi int64) error {
	t := time.NewTimer(notifyWait)
	defer t.Stop()
	for {
		changed, err := m.lookupPoisoned(lo, hi)
		if err != nil {
			return err
		}
		select {
		case <-changed:
		case <-m.done:
			if err := m.Err(); err != nil {
				return err
			}
		case <-t.C:
			return fmt.Errorf("%w: a page in [%#x, %#x) is poisoned and dsmd did not say why", ErrPageUnavailable, lo, hi)
		}
	}
}

// poisonedIn is the *PageError of the first page of [lo, hi) known to be
// poisoned, or nil.
func (m *Mapping) poisonedIn(lo, hi int64) error {
	_, err := m.lookupPoisoned(lo, hi)
	return err
}

func (m *Mapping) lookupPoisoned(lo, hi int64) (<-chan struct{}, error) {
	m.pmu.Lock()
	defer m.pmu.Unlock()
	var found *PageError
	for p, why := range m.poisoned {
		po := int64(p) * m.pageSize
		if po < hi && po+m.pageSize > lo && (found == nil || p < found.Page) {
			found = &PageError{Page: p, Offset: po, Why: why}
		}
	}
	if found == nil {
		return m.pchanged, nil
	}
	return m.pchanged, found
}

// FaultErr explains a fault of an access at off through Bytes() (a
// recovered panic of a goroutine with debug.SetPanicOnFault): Err's error
// if the mapping is no longer served; else ErrPageUnavailable if the lease
// watchdog holds the mapping inaccessible; else a *PageError if dsmd poisoned
// the page, waiting for dsmd's message if the library has not read it yet
// (it is sent before the poison, but the thread can fault before the
// library has read it); else, after a few seconds, an ErrPageUnavailable
// that says dsmd gave no reason. Call it only for a fault: on a page that
// is not poisoned it waits those seconds.
func (m *Mapping) FaultErr(off int64) error {
	if err := m.Err(); err != nil {
		return err
	}
	if _, held, _ := m.Watchdog(); held {
		return fmt.Errorf("%w: dsmd holds no lease: the watchdog keeps the mapping inaccessible until it does", ErrPageUnavailable)
	}
	lo := off / m.pageSize * m.pageSize
	return m.unavailable(lo, lo+m.pageSize)
}

// PageStatus is a page that dsmd poisoned in a mapping, and why.
type PageStatus struct {
	Page   ids.PageNo
	Offset int64 // of its first byte
	Why    string
}

// Unavailable lists the pages poisoned in the mapping now (see
// Options.FaultTimeout), by page number, as far as the library has read
// dsmd's messages: a thread may fault on a page shortly before it is
// listed (FaultErr waits for it).
func (m *Mapping) Unavailable() []PageStatus {
	m.pmu.Lock()
	defer m.pmu.Unlock()
	out := make([]PageStatus, 0, len(m.poisoned))
	for p, why := range m.poisoned {
		out = append(out, PageStatus{Page: p, Offset: int64(p) * m.pageSize, Why: why})
	}
	slices.SortFunc(out, func(a, b PageStatus) int { return int(a.Page - b.Page) })
	return out
}

// end leaves the live state for to (dead, deleted or closed), once: it
// sets the state, fences the mapping, then closes Done. why is what Err
// reports for dead and deleted.
func (m *Mapping) end(to int32, why error) {
	m.endOnce.Do(func() {
		m.why = why
		m.state.Store(to)
		// Fence before Done closes: whoever sees Done closed finds the
		// mapping inaccessible already. Under wmu, after the state: the
		// watchdog never opens it again.
		m.wmu.Lock()
		m.fence()
		m.wmu.Unlock()
		if m.wd != nil {
			m.wd.stop()
		}
		close(m.done)
	})
	if to == closed {
		m.state.Store(closed)
	}
}

// fence makes the whole mapping inaccessible (PROT_NONE) and only then
// wakes the threads that wait on its faults. Their retry, like every
// later access, then fails: a plain load or store raises SIGSEGV (a panic
// where the goroutine has debug.SetPanicOnFault, else a crash), a ReadAt,
// WriteAt or Populate gets EFAULT and reports the state. No access ever
// completes on memory dsmd no longer serves: not on a page the kernel
// would fill with zeros, not on the memfd's cached pages (stale once dsmd
// is gone, or another region's after a delete), not on pages this
// mapping held. The state is set before, so whoever sees a failure finds
// it.
//
// If the kernel refuses the mprotect (it has no reason to: it covers the
// whole mapping, so nothing is split), the waiters are left waiting
// rather than let through; Close unmaps before it closes the userfaultfd,
// so they fault then.
func (m *Mapping) fence() {
	if err := unix.Mprotect(m.b, unix.PROT_NONE); err != nil {
		return
	}
	m.u.Wake(m.mp.Addr(), uint64(len(m.b)))
}

// Name is the region's name.
func (m *Mapping) Name() string { return m.name }

// Region is the region's id.
func (m *Mapping) Region() ids.RegionID { return m.region }

// Session is dsmd's token for this mapping session (Options.Session), by
// which any process of the cluster can ask whether it is still served; 0
// when none was asked for or dsmd has none to give.
func (m *Mapping) Session() uint64 { return m.session }

// PageSize is the region's page size: the unit of coherence.
func (m *Mapping) PageSize() int64 { return m.pageSize }

// Len is the region's size in bytes.
func (m *Mapping) Len() int64 { return int64(len(m.b)) }

// Bytes returns the coherent mapping: plain loads and stores. A load or
// store that misses blocks its OS thread in the kernel until dsmd answers
// (the Go runtime cannot preempt it meanwhile). Once the mapping is no
// longer served (Done is closed: dsmd gone, region deleted, or Close) it
// is inaccessible: every access, including one that was waiting for a
// fault, raises SIGSEGV, which crashes a Go program unless the goroutine
// has debug.SetPanicOnFault(true), which makes it a panic. After Close
// the memory is unmapped.
func (m *Mapping) Bytes() []byte { return m.b }

// Done is closed when the mapping stops being served (dsmd gone, region
// deleted, or Close).
func (m *Mapping) Done() <-chan struct{} { return m.done }

// Err is nil while the mapping is served; after the session ended it
// matches ErrDaemonGone, or ErrRegionDeleted when dsmd ended it because
// the region was deleted; after Close it is ErrClosed.
func (m *Mapping) Err() error {
	switch m.state.Load() {
	case dead, deleted:
		return m.why
	case closed:
		return ErrClosed
	}
	return nil
}

// chunk is how many bytes ReadAt and WriteAt populate at a time.
const chunk = 1 << 20

// populateWays is how many threads populate one chunk at once, each a part
// of at least populatePart bytes (whole region pages): the kernel faults a
// populate's pages in one after the other, each a round trip to dsmd and,
// on a miss, to the page's home, so a large ReadAt or WriteAt has up to
// populateWays misses under way instead of one.
const (
	populateWays = 8
	populatePart = 64 << 10
)

// ReadAt copies len(p) bytes at off into p (io.ReaderAt). The pages are
// faulted in from the madvise(MADV_POPULATE_READ) syscall first, so a miss
// waits in a syscall, not in a load. If the mapping dies before the copy is
// done, it returns the bytes copied before that and Err's error
// (ErrDaemonGone, ErrRegionDeleted or ErrClosed), never bytes it cannot
// vouch for. Reading past the end returns io.EOF.
func (m *Mapping) ReadAt(p []byte, off int64) (int, error) {
	return m.rw(p, off, false)
}

// WriteAt copies p into the mapping at off (io.WriterAt), faulting the
// pages in for writing from madvise(MADV_POPULATE_WRITE) first. A write
// that would pass the end is ErrOutOfRange and writes nothing. If the
// mapping dies meanwhile it returns Err's error: the bytes after the
// reported count may or may not have reached dsmd.
func (m *Mapping) WriteAt(p []byte, off int64) (int, error) {
	return m.rw(p, off, true)
}

func (m *Mapping) rw(p []byte, off int64, write bool) (int, error) {
	if err := m.rlockLive(); err != nil {
		return 0, err
	}
	defer m.mu.RUnlock()
	size := int64(len(m.b))
	if off < 0 || off > size {
		return 0, fmt.Errorf("%w: offset %d of %d", ErrOutOfRange, off, size)
	}
	want := len(p)
	if int64(want) > size-off {
		if write {
			return 0, fmt.Errorf("%w: %d bytes at %d of %d", ErrOutOfRange, want, off, size)
		}
		want = int(size - off)
	}
	done := 0
	for done < want {
		start := off + int64(done)
		end := min(off+int64(want), (start/chunk+1)*chunk)
		if err := m.populateParts(start, end-start, write); err != nil {
			return done, err
		}
		gen := m.watchGen()
		n, err := copyMapped(m.b, p[done:done+int(end-start)], start, write)
		// A release of the faults happens only after the state changed, so
		// checking it after the copy catches every unserved page.
		if serr := m.Err(); serr != nil {
			return done, serr
		}
		if err != nil {
			retry, werr := m.waitWatchdog(gen)
			if werr != nil {
				return done, werr
			}
			if retry {
				// The lease watchdog held the mapping: copy the rest
				// again once it lets go (what was copied stays copied).
				done += n
				continue
			}
		}
		if err != nil {
			if perr := m.poisonedIn(start, end); perr != nil {
				return done, perr
			}
			return done, fmt.Errorf("mapclient: copy at %d: %w", start, err)
		}
		done += n
	}
	if done < len(p) {
		return done, io.EOF
	}
	return done, nil
}

// populateParts populates [off, off+length) in up to populateWays parts at
// once (see populateWays) and returns the error of the part that failed
// first in the range, if any.
func (m *Mapping) populateParts(off, length int64, write bool) error {
	part := max(populatePart, m.pageSize)
	if length < 2*part {
		return m.populate(off, length, write)
	}
	part = max(part, (length+populateWays-1)/populateWays)
	part = (part + m.pageSize - 1) / m.pageSize * m.pageSize
	var wg sync.WaitGroup
	errs := make([]error, (length+part-1)/part)
	for i := range errs {
		lo := off + int64(i)*part
		n := min(part, off+length-lo)
		wg.Go(func() { errs[i] = m.populate(lo, n, write) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// rlockLive takes m.mu shared for a call that reads or writes the mapped
// memory, after checking that the mapping is still served. On success the
// caller releases m.mu with RUnlock.
func (m *Mapping) rlockLive() error {
	if err := m.Err(); err != nil {
		return err
	}
	m.mu.RLock()
	if m.unmapped {
		m.mu.RUnlock()
		return ErrClosed
	}
	return nil
}

// Close detaches the mapping from dsmd and unmaps it. Plain accesses
// through Bytes() must have stopped; ReadAt and WriteAt calls still waiting
// return ErrClosed.
func (m *Mapping) Close() error {
	m.end(closed, nil)
	m.conn.Close()
	<-m.mon
	if m.wd != nil {
		<-m.wd.done // it mprotects nothing after end, and unmaps the lease page
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.c != nil {
		m.c.mu.Lock()
		delete(m.c.maps, m)
		m.c.mu.Unlock()
	}
	if m.unmapped {
		return nil
	}
	m.unmapped = true
	// Unmap first: closing the last copy of the userfaultfd wakes any
	// thread still waiting on a fault, which must then find no mapping.
	err := m.mp.Unmap()
	m.u.Close()
	return err
}
