//go:build linux

package localcache

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/mapclient"
	"github.com/dsmkit/dsm/internal/mapproto"
	"github.com/dsmkit/dsm/internal/uffd"
)

const (
	regionR  ids.RegionID = 1
	ps                    = DefaultPageSize
	testSize              = 64 * ps
)

// testHome is the in-test coherence engine: a single local home with a
// backing store (MemHome) that counts the calls and can hold a page's
// misses at a gate until the test opens it.
type testHome struct {
	MemHome
	mu                                 sync.Mutex
	reads, writes, upgrades, evictions int
	writebacks                         int
	perPage                            map[ids.PageNo]int // misses per page
	gates                              map[ids.PageNo]chan struct{}
	honourCtx                          bool // a gated miss also ends when ctx does
	entered                            chan ids.PageNo
	// remote, when set, is held by the test while it plays a remote node's
	// request (Invalidate or Downgrade, then the write-back to the home).
	// Following the lock-order contract, a miss or eviction that finds it
	// held fails with errBusy instead of waiting.
	remote *sync.Mutex
	busy   int
	// fail makes the misses of a page fail with that error, at once.
	fail map[ids.PageNo]error
	// onEvict, when set, runs at the start of every Evict, outside mu.
	onEvict func()
}

// setFail makes the misses of page p fail with err (nil: succeed again).
func (h *testHome) setFail(p ids.PageNo, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		delete(h.fail, p)
		return
	}
	h.fail[p] = err
}

var errBusy = fmt.Errorf("test home: busy with a remote request: %w", ErrBusy)

// enter fails with errBusy while a remote request is in progress; done
// must be called after the call's work.
func (h *testHome) enter() (done func(), err error) {
	if h.remote == nil {
		return func() {}, nil
	}
	if !h.remote.TryLock() {
		h.mu.Lock()
		h.busy++
		h.mu.Unlock()
		return nil, errBusy
	}
	return h.remote.Unlock, nil
}

func newTestHome() *testHome {
	return &testHome{perPage: map[ids.PageNo]int{}, gates: map[ids.PageNo]chan struct{}{}, entered: make(chan ids.PageNo, 16),
		fail: map[ids.PageNo]error{}}
}

// gate makes misses of page p wait until the returned function is called.
func (h *testHome) gate(p ids.PageNo) (open func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan struct{})
	h.gates[p] = ch
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

func (h *testHome) wait(ctx context.Context, p ids.PageNo) error {
	h.mu.Lock()
	if err := h.fail[p]; err != nil {
		h.mu.Unlock()
		return err
	}
	h.perPage[p]++
	ch := h.gates[p]
	honour := h.honourCtx
	h.mu.Unlock()
	if ch == nil {
		return nil
	}
	h.entered <- p
	if honour {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}
	<-ch
	return nil
}

func (h *testHome) ReadMiss(ctx context.Context, r ids.RegionID, p ids.PageNo, buf []byte) error {
	h.mu.Lock()
	h.reads++
	h.mu.Unlock()
	if err := h.wait(ctx, p); err != nil {
		return err
	}
	done, err := h.enter()
	if err != nil {
		return err
	}
	defer done()
	return h.MemHome.ReadMiss(ctx, r, p, buf)
}

func (h *testHome) WriteMiss(ctx context.Context, r ids.RegionID, p ids.PageNo, buf []byte) error {
	h.mu.Lock()
	h.writes++
	if buf == nil {
		h.upgrades++
	}
	h.mu.Unlock()
	if err := h.wait(ctx, p); err != nil {
		return err
	}
	done, err := h.enter()
	if err != nil {
		return err
	}
	defer done()
	return h.MemHome.WriteMiss(ctx, r, p, buf)
}

func (h *testHome) Evict(ctx context.Context, r ids.RegionID, p ids.PageNo, dirty []byte) error {
	done, err := h.enter()
	if err != nil {
		return err
	}
	defer done()
	h.mu.Lock()
	onEvict := h.onEvict
	h.mu.Unlock()
	if onEvict != nil {
		onEvict()
	}
	h.mu.Lock()
	h.evictions++
	if dirty != nil {
		h.writebacks++
	}
	h.mu.Unlock()
	return h.MemHome.Evict(ctx, r, p, dirty)
}

type homeCounts struct{ reads, writes, upgrades, evictions, writebacks int }

func (h *testHome) counts() homeCounts {
	h.mu.Lock()
	defer h.mu.Unlock()
	return homeCounts{h.reads, h.writes, h.upgrades, h.evictions, h.writebacks}
}

func (h *testHome) misses(p ids.PageNo) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.perPage[p]
}

// waitEntered waits for a gated miss of page p to begin.
func (h *testHome) waitEntered(t testing.TB, p ids.PageNo) {
	t.Helper()
	select {
	case got := <-h.entered:
		if got != p {
			t.Fatalf("gated miss of %s, want %s", got, p)
		}
	case <-time.After(hangDeadline):
		t.Fatalf("no miss of %s", p)
	}
}

// daemon is the test process in the role of dsmd: a Cache serving region
// "r" (64 pages) on a socket.
type daemon struct {
	t    testing.TB
	c    *Cache
	home *testHome
	sock string
}

func newDaemon(t testing.TB, capacity int) *daemon {
	t.Helper()
	if _, err := uffd.Probe(); err != nil {
		t.Skipf("no userfaultfd: %v", err)
	}
	home := newTestHome()
	c, err := New(Config{Coherence: home, CapacityPages: capacity})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	if err := c.AddRegion(RegionSpec{ID: regionR, Name: "r", Size: testSize}); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "dsmd.sock")
	if err := c.Listen(sock); err != nil {
		t.Fatal(err)
	}
	return &daemon{t: t, c: c, home: home, sock: sock}
}

// client starts a client process that maps region name.
func (d *daemon) client(name, region string) *proc {
	d.t.Helper()
	p := startProc(d.t, name, d.sock)
	p.ok("map %s", region)
	return p
}

// eventually polls cond until it holds (it catches hangs only).
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// quiesce waits until no fault is being resolved, then checks that the
// pages held match what the memfd holds (pages set aside by Suspend are
// held, and in their aside file instead).
func (d *daemon) quiesce(rid ids.RegionID) Stats {
	d.t.Helper()
	eventually(d.t, "no fault in flight", func() bool { return d.c.Stats().FaultsInFlight == 0 })
	s := d.c.Stats()
	cached, err := d.c.CachedPages(rid)
	if err != nil {
		d.t.Fatal(err)
	}
	if cached != s.ResidentPages-s.AsidePages {
		d.t.Fatalf("memfd holds %d pages, the Cache holds %d (%d set aside)", cached, s.ResidentPages, s.AsidePages)
	}
	return s
}

func (d *daemon) state(p ids.PageNo) State { return d.c.PageState(regionR, p) }

func off(p ids.PageNo) int64 { return int64(p) * ps }

// Two processes on one node share a written page: after both have it
// writable, each sees the other's stores at once, with no fault and no
// coherence call (one physical page in the memfd).
func TestSameNodeSharing(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	b := d.client("B", "r")
	const p = 5
	a.store(off(p), 0x1111)
	if s := d.state(p); s != Modified {
		t.Fatalf("after A's store the page is %s, want M", s)
	}
	if got := b.load(off(p)); got != 0x1111 {
		t.Fatalf("B loads %#x, want A's 0x1111", got)
	}
	if hc := d.home.counts(); hc.writes != 1 || hc.reads != 0 {
		t.Fatalf("coherence calls %+v; want only A's write miss", hc)
	}
	b.store(off(p)+8, 0xbbbb) // B's page came in writable (the page is M here)
	a.store(off(p)+16, 0xaaaa)
	s0, h0 := d.quiesce(regionR), d.home.counts()
	for i := uint64(0); i < 20; i++ {
		a.store(off(p), 0x2000+i)
		if got := b.load(off(p)); got != 0x2000+i {
			t.Fatalf("B loads %#x, want %#x", got, 0x2000+i)
		}
		b.store(off(p)+8, 0x3000+i)
		if got := a.load(off(p) + 8); got != 0x3000+i {
			t.Fatalf("A loads %#x, want %#x", got, 0x3000+i)
		}
	}
	s1, h1 := d.c.Stats(), d.home.counts()
	if s1.Faults() != s0.Faults() || h1 != h0 {
		t.Fatalf("sharing a writable page cost %d faults and coherence calls %+v -> %+v",
			s1.Faults()-s0.Faults(), h0, h1)
	}
	// The daemon's copy is the same page: a downgrade hands the engine
	// the latest stores.
	dst := make([]byte, ps)
	if was, err := d.c.Downgrade(context.Background(), regionR, p, dst); err != nil || was != Modified {
		t.Fatalf("Downgrade: %s, %v", was, err)
	}
	if v := binary.LittleEndian.Uint64(dst[8:]); v != 0x3013 {
		t.Fatalf("downgraded data holds %#x at 8, want 0x3013", v)
	}
}

func TestReadAtWriteAt(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	b := d.client("B", "r")
	msg := []byte("a message across a page boundary")
	at := off(4) - 10
	a.ok("writeat %x %x", at, msg)
	got := b.ok("readat %x %x", at-2, len(msg)+4)
	want := append(append([]byte{0, 0}, msg...), 0, 0)
	if got != hexOf(want) {
		t.Fatalf("B reads %s, want %s", got, hexOf(want))
	}
	if r := a.do("readat %x 10", testSize-4); !strings.HasPrefix(r, "err other") && !strings.Contains(r, "EOF") {
		t.Fatalf("ReadAt across the end: %s", r)
	}
	if r := a.do("writeat %x 0102", testSize-1); !strings.HasPrefix(r, "err range") {
		t.Fatalf("WriteAt across the end: %s", r)
	}
	if s := d.state(3); s != Modified {
		t.Fatalf("written page is %s", s)
	}
	d.quiesce(regionR)
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	var sb strings.Builder
	for _, c := range b {
		sb.WriteByte(digits[c>>4])
		sb.WriteByte(digits[c&15])
	}
	return sb.String()
}

// A store to a page held Shared goes through Coherence.WriteMiss (an
// upgrade, no data); another client's later store is then local.
func TestWriteToSharedUpgrades(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	b := d.client("B", "r")
	const p = 7
	d.home.Put(regionR, p, le64(0x77))
	a.ok("readat %x 8", off(p))
	if got := b.load(off(p)); got != 0x77 {
		t.Fatalf("B loads %#x", got)
	}
	if s, hc := d.state(p), d.home.counts(); s != Shared || hc.reads != 1 || hc.writes != 0 {
		t.Fatalf("after two reads: %s, %+v; want S after one read miss", s, hc)
	}
	a.ok("writeat %x %s", off(p), hexOf(le64(0x78)))
	if s, hc := d.state(p), d.home.counts(); s != Modified || hc.writes != 1 || hc.upgrades != 1 {
		t.Fatalf("after A's write: %s, %+v; want M after one upgrade", s, hc)
	}
	if got := b.load(off(p)); got != 0x78 {
		t.Fatalf("B loads %#x after A's write", got)
	}
	wp := d.c.Stats().FaultsWP
	b.store(off(p), 0x79) // read-only in B: one WP fault, resolved locally
	if hc := d.home.counts(); hc.writes != 1 {
		t.Fatalf("B's store on a page held M called the engine: %+v", hc)
	}
	// At least one WP fault: a thread waiting in a userfault that a signal
	// wakes (the Go runtime preempts with SIGURG) runs the store again and
	// the kernel reports the fault a second time; it resolves locally.
	if s := d.c.Stats(); s.FaultsWP < wp+1 || s.Upgrades != 1 {
		t.Fatalf("WP faults %d -> %d, upgrades %d", wp, s.FaultsWP, s.Upgrades)
	}
	if got := a.load(off(p)); got != 0x79 {
		t.Fatalf("A loads %#x", got)
	}
}

func le64(v uint64) []byte {
	b := make([]byte, ps)
	binary.LittleEndian.PutUint64(b, v)
	return b
}

// Invalidate punches the page out of every mapping: the next access
// faults and fetches the engine's current data.
func TestInvalidate(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	b := d.client("B", "r")
	ctx := context.Background()
	const p = 9
	a.store(off(p), 0x91)
	b.load(off(p))
	dst := make([]byte, ps)
	was, err := d.c.Invalidate(ctx, regionR, p, dst)
	if err != nil || was != Modified || binary.LittleEndian.Uint64(dst) != 0x91 {
		t.Fatalf("Invalidate of a written page: %s, %v, data %#x", was, err, binary.LittleEndian.Uint64(dst))
	}
	if s := d.quiesce(regionR); s.ResidentPages != 0 || d.state(p) != Invalid {
		t.Fatalf("after Invalidate: %d pages held, page %s", s.ResidentPages, d.state(p))
	}
	d.home.Put(regionR, p, le64(0x92)) // another node wrote meanwhile
	reads := d.home.counts().reads
	if got := a.load(off(p)); got != 0x92 {
		t.Fatalf("A loads %#x after the invalidation, want the new 0x92", got)
	}
	if got := b.load(off(p)); got != 0x92 {
		t.Fatalf("B loads %#x after the invalidation, want the new 0x92", got)
	}
	if hc := d.home.counts(); hc.reads != reads+1 || d.state(p) != Shared {
		t.Fatalf("read misses %d -> %d, state %s; want one miss, S", reads, hc.reads, d.state(p))
	}
	// Shared: no data comes back; the next read misses again.
	if was, err := d.c.Invalidate(ctx, regionR, p, nil); err != nil || was != Shared {
		t.Fatalf("Invalidate of a shared page: %s, %v", was, err)
	}
	d.home.Put(regionR, p, le64(0x93))
	if got := b.load(off(p)); got != 0x93 {
		t.Fatalf("B loads %#x, want 0x93", got)
	}
	if was, err := d.c.Invalidate(ctx, regionR, 12, nil); err != nil || was != Invalid {
		t.Fatalf("Invalidate of a page not held: %s, %v", was, err)
	}
	// Modified needs room for the data; nothing changes without it.
	a.store(off(p), 0x94)
	if _, err := d.c.Invalidate(ctx, regionR, p, nil); !errors.Is(err, ErrShortBuffer) || d.state(p) != Modified {
		t.Fatalf("Invalidate of M without a buffer: %v, state %s", err, d.state(p))
	}
	if _, err := d.c.Invalidate(ctx, 99, p, dst); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("unknown region: %v", err)
	}
	if _, err := d.c.Invalidate(ctx, regionR, 64, dst); !errors.Is(err, ErrPageRange) {
		t.Fatalf("page past the end: %v", err)
	}
}

// Downgrade write-protects the page everywhere: reads go on without a
// fault, the next store faults and goes through the engine.
func TestDowngrade(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	b := d.client("B", "r")
	const p = 11
	a.store(off(p), 0xd1)
	b.store(off(p)+8, 0xd2)
	dst := make([]byte, ps)
	if was, err := d.c.Downgrade(context.Background(), regionR, p, dst); err != nil || was != Modified {
		t.Fatalf("Downgrade: %s, %v", was, err)
	}
	if binary.LittleEndian.Uint64(dst) != 0xd1 || binary.LittleEndian.Uint64(dst[8:]) != 0xd2 {
		t.Fatalf("downgraded data %x", dst[:16])
	}
	if s := d.state(p); s != Shared {
		t.Fatalf("after Downgrade: %s", s)
	}
	s0, h0 := d.c.Stats(), d.home.counts()
	if a.load(off(p)+8) != 0xd2 || b.load(off(p)) != 0xd1 {
		t.Fatal("reads after the downgrade")
	}
	if s := d.c.Stats(); s.Faults() != s0.Faults() {
		t.Fatalf("reads of a downgraded page faulted %d times", s.Faults()-s0.Faults())
	}
	b.store(off(p), 0xd3)
	// One upgrade; the kernel may report the fault more than once (a
	// signal that wakes the waiting thread makes it fault again).
	if s, hc := d.c.Stats(), d.home.counts(); s.FaultsWP < s0.FaultsWP+1 || hc.upgrades != h0.upgrades+1 {
		t.Fatalf("store after downgrade: WP faults %d -> %d, upgrades %d -> %d", s0.FaultsWP, s.FaultsWP, h0.upgrades, hc.upgrades)
	}
	if got := a.load(off(p)); got != 0xd3 {
		t.Fatalf("A loads %#x", got)
	}
	if was, err := d.c.Downgrade(context.Background(), regionR, 30, dst); err != nil || was != Invalid {
		t.Fatalf("Downgrade of a page not held: %s, %v", was, err)
	}
}

// A tiny cache evicts (writing Modified pages back first) and the data
// stays right.
func TestEviction(t *testing.T) {
	const capacity = 4
	d := newDaemon(t, capacity)
	a := d.client("A", "r")
	b := d.client("B", "r")
	a.ok("fill %x %x %x", 0, 28, ps)
	b.ok("fill %x %x %x", 28, 24, ps)
	a.ok("check %x %x %x", 0, 34, ps)
	b.ok("check %x %x %x", 0, 52, ps)
	s := d.quiesce(regionR)
	hc := d.home.counts()
	if s.Evictions == 0 || s.Writebacks == 0 || hc.writebacks != int(s.Writebacks) {
		t.Fatalf("evictions %d, write-backs %d (engine saw %d)", s.Evictions, s.Writebacks, hc.writebacks)
	}
	if s.ResidentPages > capacity {
		t.Fatalf("%d pages held with a capacity of %d", s.ResidentPages, capacity)
	}
	if s.ResidentPages != int64(len(residentList(d.c))) {
		t.Fatalf("resident count %d, list %d", s.ResidentPages, len(residentList(d.c)))
	}
}

func residentList(c *Cache) []*page {
	c.lruMu.Lock()
	defer c.lruMu.Unlock()
	var l []*page
	for e := c.lru.Front(); e != nil; e = e.Next() {
		l = append(l, e.Value.(*page))
	}
	return l
}

// Remote invalidations and downgrades (with their write-backs to the
// home) race with two clients' writes and reads and with evictions; every
// value written is read back, by its writer and by the other client.
func TestRemoteActionsUnderLoad(t *testing.T) {
	d := newDaemon(t, 12)
	d.home.remote = new(sync.Mutex)
	a := d.client("A", "r")
	b := d.client("B", "r")
	ctx := context.Background()
	stop := make(chan struct{})
	errc := make(chan error, 1)
	var actions, dirty int
	go func() {
		dst := make([]byte, ps)
		var err error
		defer func() { errc <- err }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p := ids.PageNo(i * 7 % 32)
			d.home.remote.Lock()
			var was State
			if i%3 == 0 {
				was, err = d.c.Downgrade(ctx, regionR, p, dst)
			} else {
				was, err = d.c.Invalidate(ctx, regionR, p, dst)
			}
			if was == Modified {
				d.home.Put(regionR, p, dst)
				dirty++
			}
			d.home.remote.Unlock()
			if err != nil {
				return
			}
			actions++
			time.Sleep(50 * time.Microsecond)
		}
	}()
	for gen := 1; gen <= 6; gen++ {
		a.send("fill %x %x %x %x", 0, 16, ps, gen)
		b.send("fill %x %x %x %x", 16, 16, ps, gen)
		for _, pr := range []*proc{a, b} {
			if r := pr.reply(); r != "ok" {
				t.Fatalf("%s: fill %d: %s", pr.name, gen, r)
			}
		}
		a.ok("check %x %x %x %x", 0, 32, ps, gen)
		b.ok("check %x %x %x %x", 0, 32, ps, gen)
	}
	close(stop)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	s := d.quiesce(regionR)
	d.home.mu.Lock()
	busy := d.home.busy
	d.home.mu.Unlock()
	t.Logf("%d remote actions (%d with dirty data), %d misses refused as busy, %d evictions", actions, dirty, busy, s.Evictions)
	if actions == 0 || s.Invalidations == 0 {
		t.Fatalf("no remote action ran: %d actions, %d invalidations", actions, s.Invalidations)
	}
	a.ok("check %x %x %x %x", 0, 32, ps, 6)
}

// A client killed while its fault waits in the engine does not wedge the
// daemon: it is detached at once, other clients go on, and the stuck
// resolution ends without harm when the engine answers.
func TestClientKilledMidFault(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	b := d.client("B", "r")
	const p = 13
	d.home.Put(regionR, p, le64(0x1313))
	open := d.home.gate(p)
	defer open()
	a.send("load %x", off(p))
	d.home.waitEntered(t, p)
	a.kill()
	eventually(t, "the dead client detached", func() bool { return d.c.Stats().Clients == 1 })
	b.store(off(20), 0x2020)
	if got := b.load(off(20)); got != 0x2020 {
		t.Fatalf("B loads %#x", got)
	}
	c := d.client("C", "r")
	if got := c.load(off(20)); got != 0x2020 {
		t.Fatalf("new client C loads %#x", got)
	}
	// Only the dead client's fault is left, stuck in the engine.
	eventually(t, "one fault in flight", func() bool { return d.c.Stats().FaultsInFlight == 1 })
	open()
	d.quiesce(regionR)
	if got := b.load(off(p)); got != 0x1313 {
		t.Fatalf("B loads %#x from the page the dead client was waiting for", got)
	}
	if n := d.home.misses(p); n != 1 {
		t.Fatalf("%d misses of the page, want 1", n)
	}
}

// A client process that dies while another process still holds its
// session socket is detached anyway: the daemon watches the process
// (pidfd), not only the socket.
func TestClientDeathWithSocketHeldElsewhere(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	a.store(0, 1)
	hpid, err := strconv.ParseInt(a.ok("hold"), 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	holder, err := os.FindProcess(int(hpid))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		holder.Kill()
		holder.Wait()
	}()
	a.kill()
	eventually(t, "the dead client detached", func() bool { return d.c.Stats().Clients == 0 })
}

// Faults of several clients on one page are resolved by one miss.
func TestConcurrentFaultsOneMiss(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	b := d.client("B", "r")
	c := d.client("C", "r")
	const p = 17
	d.home.Put(regionR, p, le64(0x1717))
	open := d.home.gate(p)
	defer open()
	before := d.c.Stats().FaultsMissing
	a.send("readat %x 8", off(p))
	d.home.waitEntered(t, p)
	b.send("load %x", off(p))
	c.send("readat %x 8", off(p))
	eventually(t, "three faults read", func() bool { return d.c.Stats().FaultsMissing >= before+3 })
	open()
	for _, pr := range []*proc{a, c} {
		if r := pr.reply(); r != "ok "+hexOf(le64(0x1717)[:8]) {
			t.Fatalf("%s: %s", pr.name, r)
		}
	}
	if r := b.reply(); r != "ok 1717" {
		t.Fatalf("B: %s", r)
	}
	if n := d.home.misses(p); n != 1 {
		t.Fatalf("%d misses for three clients' faults, want 1", n)
	}
}

// Two threads of one client faulting on one page: the second message
// arrives while the first is being resolved and is answered by a second,
// local resolution; the engine sees one miss.
func TestSameClientTwoThreadsOneMiss(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	const p = 19
	open := d.home.gate(p)
	defer open()
	before := d.c.Stats()
	a.send("readat2 %x 8", off(p))
	d.home.waitEntered(t, p)
	eventually(t, "both faults read", func() bool { return d.c.Stats().FaultsMissing >= before.FaultsMissing+2 })
	open()
	if r := a.reply(); r != "ok" {
		t.Fatalf("A: %s", r)
	}
	s := d.quiesce(regionR)
	if n := d.home.misses(p); n != 1 || s.LocalResolves < before.LocalResolves+1 {
		t.Fatalf("%d misses, %d local resolutions; want 1 miss and a local one", n, s.LocalResolves-before.LocalResolves)
	}
}

// When the daemon's side goes away (here: the Cache closes, dropping the
// session and the userfaultfd), a client's ReadAt waiting on a fault and
// every later one fail with ErrDaemonGone; no zero page is returned.
func TestDaemonGoneSeenByClient(t *testing.T) {
	d := newDaemon(t, 0)
	d.home.honourCtx = true
	a := d.client("A", "r")
	a.store(off(2), 0x22)
	const p = 15
	d.home.Put(regionR, p, le64(0x1515))
	open := d.home.gate(p)
	defer open()
	a.send("readat %x 8", off(p))
	d.home.waitEntered(t, p)
	if err := d.c.Close(); err != nil {
		t.Fatal(err)
	}
	if r := a.reply(); !strings.HasPrefix(r, "err gone") {
		t.Fatalf("waiting ReadAt after the daemon went away: %s", r)
	}
	if r := a.do("readat %x 8", off(2)); !strings.HasPrefix(r, "err gone") {
		t.Fatalf("ReadAt of a present page after the daemon went away: %s", r)
	}
	if r := a.do("writeat 0 01"); !strings.HasPrefix(r, "err gone") {
		t.Fatalf("WriteAt after the daemon went away: %s", r)
	}
	a.ok("close")
}

// A daemon process killed with SIGKILL while a client's ReadAt waits on a
// fault: the ReadAt fails with ErrDaemonGone (the kernel would have let it
// read a zero page), and so does every later access.
func TestDaemonKilled(t *testing.T) {
	if _, err := uffd.Probe(); err != nil {
		t.Skipf("no userfaultfd: %v", err)
	}
	sock := filepath.Join(t.TempDir(), "dsmd.sock")
	dm := startRole(t, "daemon", daemonEnv, sock)
	if r := dm.reply(); r != "ready" {
		t.Fatalf("daemon: %s", r)
	}
	a := startProc(t, "A", sock)
	a.ok("map r")
	a.ok("writeat %x 2a", off(1))
	a.send("readat %x 8", off(3))
	if r := dm.reply(); r != "entered 3" {
		t.Fatalf("daemon: %s", r)
	}
	dm.kill()
	if r := a.reply(); !strings.HasPrefix(r, "err gone") {
		t.Fatalf("waiting ReadAt after the daemon was killed: %s", r)
	}
	if r := a.do("readat %x 1", off(1)); !strings.HasPrefix(r, "err gone") {
		t.Fatalf("ReadAt after the daemon was killed: %s", r)
	}
	a.ok("close")
}

// A 1 TiB region maps and touches a few pages at the cost of those pages.
func TestTerabyteRegion(t *testing.T) {
	d := newDaemon(t, 0)
	const big ids.RegionID = 2
	const size = int64(1) << 40
	if err := d.c.AddRegion(RegionSpec{ID: big, Name: "big", Size: size}); err != nil {
		t.Fatal(err)
	}
	a := d.client("A", "big")
	offs := []int64{0, size / 2, size - 8}
	for i, o := range offs {
		a.store(o, uint64(i+1)*0x1111)
	}
	for i, o := range offs {
		if got := a.load(o); got != uint64(i+1)*0x1111 {
			t.Fatalf("load at %#x: %#x", o, got)
		}
	}
	if s := d.quiesce(big); s.ResidentPages != int64(len(offs)) {
		t.Fatalf("%d pages held, want %d", s.ResidentPages, len(offs))
	}
}

// Bad sessions are refused with a clear error and do not disturb the
// daemon.
func TestSessionRefusals(t *testing.T) {
	d := newDaemon(t, 0)
	ctx := context.Background()
	mc, err := mapclient.Connect(ctx, d.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	if _, err := mc.Map(ctx, "nope"); !errors.Is(err, mapclient.ErrUnknownRegion) {
		t.Fatalf("unknown region: %v", err)
	}
	for name, msg := range map[string][]byte{
		"garbage":     {1, 2, 3},
		"wrong first": mustEncode(t, mapproto.Msg{Type: mapproto.TypeRegistered}),
		"size":        mustEncode(t, mapproto.Msg{Type: mapproto.TypeMap, Name: "r", Size: 12345}),
	} {
		conn, err := net.Dial("unixpacket", d.sock)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(hangDeadline))
		conn.Write(msg)
		buf := make([]byte, mapproto.MaxMsg)
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		reply, err := mapproto.Decode(buf[:n])
		if err != nil || reply.Type != mapproto.TypeError {
			t.Fatalf("%s: answer %v, %v", name, reply, err)
		}
		if _, err := conn.Read(buf); err == nil {
			t.Fatalf("%s: session not closed after the refusal", name)
		}
		conn.Close()
	}
	if s := d.c.Stats(); s.SessionErrors < 3 {
		t.Fatalf("%d session errors counted", s.SessionErrors)
	}
	a := d.client("A", "r")
	a.store(0, 1)
	if err := d.c.AddRegion(RegionSpec{ID: regionR, Name: "other", Size: ps}); !errors.Is(err, ErrRegionExists) {
		t.Fatalf("duplicate region id: %v", err)
	}
	if err := d.c.AddRegion(RegionSpec{ID: 3, Name: "odd", Size: ps + 1}); !errors.Is(err, ErrBadRegion) {
		t.Fatalf("unaligned region: %v", err)
	}
	if err := d.c.Listen(d.sock); !errors.Is(err, ErrAddrInUse) {
		t.Fatalf("second listener on a live socket: %v", err)
	}
}

// A socket file left by a dead daemon is replaced; Close removes it.
func TestListenReplacesStaleSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "dsmd.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("no stale socket file: %v", err)
	}
	c, err := New(Config{Coherence: &MemHome{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Listen(sock); err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	if _, err := mapclient.Connect(context.Background(), sock); err != nil {
		t.Fatalf("Connect: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file after Close: %v", err)
	}
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c2, _ := New(Config{Coherence: &MemHome{}})
	defer c2.Close()
	if err := c2.Listen(sock); err == nil {
		t.Fatal("Listen replaced a regular file")
	}
}

func mustEncode(t *testing.T, m mapproto.Msg) []byte {
	t.Helper()
	b, err := mapproto.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Install places a page without a fault; installing over a held page is
// refused.
func TestInstall(t *testing.T) {
	d := newDaemon(t, 0)
	ctx := context.Background()
	if err := d.c.Install(ctx, regionR, 21, le64(0x2121), Shared); err != nil {
		t.Fatal(err)
	}
	if err := d.c.Install(ctx, regionR, 21, le64(1), Modified); !errors.Is(err, ErrPageValid) {
		t.Fatalf("install over a held page: %v", err)
	}
	a := d.client("A", "r")
	if got := a.load(off(21)); got != 0x2121 {
		t.Fatalf("A loads %#x", got)
	}
	if hc := d.home.counts(); hc.reads != 0 {
		t.Fatalf("an installed page missed: %+v", hc)
	}
	if !bytes.Equal(d.c.regions[regionR].bytes(21)[:8], le64(0x2121)[:8]) {
		t.Fatal("memfd does not hold the installed page")
	}
}

// failingEvict is a MemHome whose write-backs fail while fail is set.
type failingEvict struct {
	MemHome
	mu   sync.Mutex
	fail bool
}

func (h *failingEvict) Evict(ctx context.Context, r ids.RegionID, p ids.PageNo, dirty []byte) error {
	h.mu.Lock()
	fail := h.fail
	h.mu.Unlock()
	if fail && dirty != nil {
		return errors.New("home unreachable")
	}
	return h.MemHome.Evict(ctx, r, p, dirty)
}

// Eviction without clients: Modified pages are written back before they
// are dropped, and kept (still Modified) when the write-back fails.
func TestEvictionWriteBack(t *testing.T) {
	home := &failingEvict{}
	c, err := New(Config{Coherence: home, CapacityPages: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.AddRegion(RegionSpec{ID: regionR, Name: "r", Size: testSize}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for p := ids.PageNo(0); p < 8; p++ {
		if err := c.Install(ctx, regionR, p, le64(0x100+uint64(p)), Modified); err != nil {
			t.Fatal(err)
		}
	}
	s := c.Stats()
	if s.ResidentPages != 3 || s.DirtyPages != 3 || s.Evictions != 5 || s.Writebacks != 5 {
		t.Fatalf("after 8 installs with room for 3: %+v", s)
	}
	buf := make([]byte, ps)
	for p := ids.PageNo(0); p < 5; p++ {
		if st := c.PageState(regionR, p); st != Invalid {
			t.Fatalf("evicted page %s is %s", p, st)
		}
		home.Get(regionR, p, buf)
		if v := binary.LittleEndian.Uint64(buf); v != 0x100+uint64(p) {
			t.Fatalf("home holds %#x for %s", v, p)
		}
	}
	if n, _ := c.CachedPages(regionR); n != 3 {
		t.Fatalf("memfd holds %d pages", n)
	}
	home.mu.Lock()
	home.fail = true
	home.mu.Unlock()
	if err := c.Install(ctx, regionR, 9, le64(0x109), Shared); err != nil {
		t.Fatal(err)
	}
	// The dirty pages cannot go: the clean one just installed does.
	s = c.Stats()
	if s.ResidentPages != 3 || s.DirtyPages != 3 || s.EvictErrors != 3 || s.Evictions != 6 || c.PageState(regionR, 9) != Invalid {
		t.Fatalf("with write-backs failing: %+v, page 9 %s", s, c.PageState(regionR, 9))
	}
	dst := make([]byte, ps)
	for p := ids.PageNo(5); p < 8; p++ {
		if was, err := c.Downgrade(ctx, regionR, p, dst); err != nil || was != Modified || binary.LittleEndian.Uint64(dst) != 0x100+uint64(p) {
			t.Fatalf("kept page %s: %s, %v, %#x", p, was, err, binary.LittleEndian.Uint64(dst))
		}
	}
	if n, _ := c.CachedPages(regionR); n != 3 {
		t.Fatalf("memfd holds %d pages, want 3", n)
	}
}

// The byte counters count each page at its region's page size.
func TestByteCounters(t *testing.T) {
	d := newDaemon(t, 0)
	const wide ids.RegionID = 3
	if err := d.c.AddRegion(RegionSpec{ID: wide, Name: "wide", Size: 1 << 20, PageSize: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	a := d.client("A", "r")
	a.store(0, 1)
	b := d.client("B", "wide")
	b.store(0, 2)
	b.store(3<<16+8, 3)
	eventually(t, "no fault in flight", func() bool { return d.c.Stats().FaultsInFlight == 0 })
	s := d.c.Stats()
	want := int64(4096 + 2<<16)
	if s.DirtyPages != 3 || s.DirtyBytes != want || s.ResidentBytes != want {
		t.Fatalf("dirty %d pages, %d bytes, resident %d bytes; want 3 pages, %d bytes", s.DirtyPages, s.DirtyBytes, s.ResidentBytes, want)
	}
	b.ok("close")
	if err := d.c.RemoveRegion(context.Background(), wide, "test"); err != nil {
		t.Fatal(err)
	}
	if s := d.c.Stats(); s.DirtyBytes != 4096 || s.ResidentBytes != 4096 {
		t.Fatalf("after removing the region: dirty %d bytes, resident %d bytes; want 4096", s.DirtyBytes, s.ResidentBytes)
	}
	a.ok("close")
}
