//go:build linux

package localcache

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
)

// asideWord is the first word of page p's aside copy (0 where there is
// none).
func (d *daemon) asideWord(p ids.PageNo) uint64 {
	d.t.Helper()
	r, err := d.c.region(regionR)
	if err != nil {
		d.t.Fatal(err)
	}
	f := r.asideNow()
	if f == nil {
		return 0
	}
	b := make([]byte, 8)
	if _, err := f.ReadAt(b, off(p)); err != nil {
		d.t.Fatal(err)
	}
	return binary.LittleEndian.Uint64(b)
}

// cached is how many pages of region r the memfd holds.
func (d *daemon) cached() int64 {
	d.t.Helper()
	n, err := d.c.CachedPages(regionR)
	if err != nil {
		d.t.Fatal(err)
	}
	return n
}

func (d *daemon) suspend() SuspendStats {
	d.t.Helper()
	st, err := d.c.Suspend(context.Background())
	if err != nil {
		d.t.Fatalf("Suspend: %v", err)
	}
	d.t.Logf("Suspend: %+v", st)
	return st
}

func hexU(t testing.TB, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return v
}

// unanswered fails if p has answered a command (a wrong Cache would have
// answered by now; a correct one never does while suspended).
func unanswered(t testing.TB, p *proc, what string) {
	t.Helper()
	time.Sleep(50 * time.Millisecond)
	select {
	case r := <-p.replies:
		t.Fatalf("%s while suspended: answered %q", what, r)
	default:
	}
}

// A client stores into a Modified page, without pause, while the Cache
// suspends. After Suspend: the memfd holds no page, the aside copy holds
// the client's last completed store (the value at the write protection)
// and nothing more lands anywhere; the next store waits, and so do loads
// of every page held, Shared and Modified, in every client, and so does a
// fault of a client whose FaultTimeout is longer than the suspension (it is
// not poisoned; TestFaultPoisonedWhileSuspended has a shorter one). Resume
// serves them: the Modified pages come back with their data and no
// Coherence call, the waiting store lands in the resumed page, and the
// Shared ones are misses.
func TestSuspendStopsStores(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	b := d.client("B", "r")
	c := startProc(t, "C", d.sock)
	c.ok("mapt r %s", "2710") // a FaultTimeout of 10 s
	e := d.client("E", "r")   // maps none of the pages before Suspend
	// Modified 1, 2, 3 (2 writable in A and B), Shared 5 and 6.
	a.store(off(1), 0x11)
	a.store(off(2), 0x22)
	a.store(off(3), 0x33)
	b.store(off(2)+8, 0x2b)
	d.home.Put(regionR, 5, le64(0x55))
	d.home.Put(regionR, 6, le64(0x66))
	if a.load(off(5)) != 0x55 || b.load(off(6)) != 0x66 {
		t.Fatal("shared pages")
	}
	a.ok("spin %x", off(2)+16)
	eventually(t, "A stores", func() bool { return hexU(t, a.ok("spun")) > 1000 })

	h0 := d.home.counts()
	st := d.suspend()
	if st.Aside != 3 || st.Punched != 5 || st.BytesCopied != 3*ps || st.WriteProtects != 2 || st.Punches != 1 {
		t.Fatalf("SuspendStats %+v: want 3 aside, write-protected in the clients that map them writable (A over pages 1 to 3, B over page 2), 5 punched in one call (the hole between them too)", st)
	}
	if n := d.cached(); n != 0 {
		t.Fatalf("the memfd holds %d pages after Suspend", n)
	}
	s := d.c.Stats()
	if !s.Suspended || s.AsidePages != 3 || s.DirtyPages != 3 || s.ResidentPages != 3 {
		t.Fatalf("Stats after Suspend: %+v", s)
	}
	for p, want := range map[ids.PageNo]State{1: Modified, 2: Modified, 3: Modified, 5: Invalid, 6: Invalid} {
		if got := d.state(p); got != want {
			t.Fatalf("page %d is %s, want %s", p, got, want)
		}
	}
	// A's next store faults and waits; its last completed one is in the
	// aside copy, and stays the last.
	r, _ := d.c.region(regionR)
	word := func(p ids.PageNo, at int64) uint64 {
		b := make([]byte, 8)
		if _, err := r.asideNow().ReadAt(b, off(p)+at); err != nil {
			t.Fatal(err)
		}
		return binary.LittleEndian.Uint64(b)
	}
	var last uint64
	eventually(t, "A's last completed store is the one in the aside copy", func() bool {
		last = hexU(t, a.ok("spun"))
		return last == word(2, 16)
	})
	if word(1, 0) != 0x11 || word(2, 0) != 0x22 || word(2, 8) != 0x2b || word(3, 0) != 0x33 {
		t.Fatal("aside copies")
	}
	b.send("load %x", off(1))        // Modified, aside
	c.send("load %x", off(5))        // was Shared
	e.send("store %x 3e", off(3)+24) // Modified, never write-protected in E
	eventually(t, "the loads and E's store wait", func() bool { return d.c.Stats().FaultsInFlight >= 4 })
	time.Sleep(600 * time.Millisecond)
	unanswered(t, b, "B's load of a Modified page")
	unanswered(t, c, "C's load of a Shared page")
	unanswered(t, e, "E's store to a Modified page")
	if got := hexU(t, a.ok("spun")); got != last || word(2, 16) != last || d.cached() != 0 {
		t.Fatalf("after Suspend: A's stores reached %d (was %d), the aside copy holds %d, the memfd %d pages",
			got, last, word(2, 16), d.cached())
	}
	if s := d.c.Stats(); s.Poisoned != 0 || s.MissErrors != 0 {
		t.Fatalf("while suspended: %d poisoned, %d miss errors", s.Poisoned, s.MissErrors)
	}
	if hc := d.home.counts(); hc != h0 {
		t.Fatalf("Coherence calls while suspended: %+v -> %+v", h0, hc)
	}

	d.c.Resume()
	if got := b.reply(); got != "ok 11" {
		t.Fatalf("B's load of page 1 after Resume: %q", got)
	}
	if got := c.reply(); got != "ok 55" {
		t.Fatalf("C's load of page 5 after Resume: %q", got)
	}
	if got := e.reply(); got != "ok" || a.load(off(3)+24) != 0x3e {
		t.Fatalf("E's store to page 3 after Resume: %q", got)
	}
	eventually(t, "A stores again", func() bool { return hexU(t, a.ok("spun")) > last+100 })
	final := hexU(t, a.ok("spinstop"))
	if got := b.load(off(2) + 16); got != final {
		t.Fatalf("page 2 holds %d, A's last store was %d", got, final)
	}
	if a.load(off(3)) != 0x33 || b.load(off(2)+8) != 0x2b || b.load(off(6)) != 0x66 {
		t.Fatal("data after Resume")
	}
	hc := d.home.counts()
	if hc.writes != h0.writes || hc.upgrades != h0.upgrades || hc.evictions != h0.evictions || hc.reads != h0.reads+2 {
		t.Fatalf("Coherence calls from Resume on: %+v -> %+v; want only the read misses of pages 5 and 6", h0, hc)
	}
	s = d.quiesce(regionR)
	if s.Suspended || s.AsidePages != 0 || s.Restores != 3 || s.DirtyPages != 3 {
		t.Fatalf("Stats after Resume: %+v", s)
	}
}

// Remote actions go on while suspended: an Invalidate or Downgrade of a
// page set aside answers with its data from the aside copy and leaves the
// page Invalid here, so after Resume it is a miss; of a page that was
// Shared, it finds it Invalid. Access waits for Resume; Install is
// refused.
func TestSuspendRemoteActions(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	ctx := context.Background()
	a.store(off(1), 0x10)
	a.store(off(2), 0x20)
	d.home.Put(regionR, 4, le64(0x40))
	a.load(off(4))
	d.suspend()

	dst := make([]byte, ps)
	if was, err := d.c.Invalidate(ctx, regionR, 1, dst); err != nil || was != Modified || binary.LittleEndian.Uint64(dst) != 0x10 {
		t.Fatalf("Invalidate of a page set aside: %s, %v, %#x", was, err, binary.LittleEndian.Uint64(dst))
	}
	d.home.Put(regionR, 1, le64(0x11)) // another node's write after the recall
	if was, err := d.c.Downgrade(ctx, regionR, 2, dst); err != nil || was != Modified || binary.LittleEndian.Uint64(dst) != 0x20 {
		t.Fatalf("Downgrade of a page set aside: %s, %v, %#x", was, err, binary.LittleEndian.Uint64(dst))
	}
	d.home.Put(regionR, 2, dst) // the engine's write-back
	if was, err := d.c.Invalidate(ctx, regionR, 4, nil); err != nil || was != Invalid {
		t.Fatalf("Invalidate of a page that was Shared: %s, %v", was, err)
	}
	if s := d.c.Stats(); s.AsidePages != 0 || s.ResidentPages != 0 || d.asideWord(1) != 0 || d.asideWord(2) != 0 {
		t.Fatalf("after the remote actions: %+v, aside %#x %#x", s, d.asideWord(1), d.asideWord(2))
	}
	if err := d.c.Install(ctx, regionR, 9, make([]byte, ps), Shared); !errors.Is(err, ErrSuspended) {
		t.Fatalf("Install while suspended: %v", err)
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err := d.c.Access(tctx, regionR, 4, false, func([]byte) {})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Access while suspended: %v, want it to wait until its context ends", err)
	}
	done := make(chan error, 1)
	var got uint64
	go func() {
		done <- d.c.Access(ctx, regionR, 2, false, func(b []byte) { got = binary.LittleEndian.Uint64(b) })
	}()
	h0 := d.home.counts()
	d.c.Resume()
	if err := <-done; err != nil || got != 0x20 {
		t.Fatalf("Access after Resume: %v, %#x", err, got)
	}
	if a.load(off(1)) != 0x11 || a.load(off(2)) != 0x20 {
		t.Fatal("data after Resume")
	}
	if hc := d.home.counts(); hc.reads != h0.reads+2 {
		t.Fatalf("read misses %d -> %d, want 2", h0.reads, hc.reads)
	}
	d.quiesce(regionR)
}

// DiscardSuspended drops the pages set aside and reports them; the
// clients stay mapped, and after Resume their faults, the one waiting
// included, go through Coherence afresh.
func TestDiscardSuspended(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	for p := ids.PageNo(1); p <= 3; p++ {
		a.store(off(p), uint64(p))
	}
	d.home.Put(regionR, 5, le64(0x55))
	a.load(off(5))
	if n := d.c.DiscardSuspended(); n != 0 {
		t.Fatalf("DiscardSuspended while serving: %d", n)
	}
	d.suspend()
	a.send("load %x", off(1))
	eventually(t, "the load waits", func() bool { return d.c.Stats().FaultsInFlight == 1 })
	if n := d.c.DiscardSuspended(); n != 3 {
		t.Fatalf("DiscardSuspended lost %d pages, want 3", n)
	}
	s := d.c.Stats()
	if s.LostPages != 3 || s.AsidePages != 0 || s.ResidentPages != 0 || s.DirtyPages != 0 || !s.Suspended || d.cached() != 0 {
		t.Fatalf("Stats after DiscardSuspended: %+v, %d cached", s, d.cached())
	}
	// The new incarnation: the cluster's values.
	d.home.Put(regionR, 1, le64(0x1001))
	h0 := d.home.counts()
	d.c.Resume()
	if got := a.reply(); got != "ok 1001" {
		t.Fatalf("the waiting load after Resume: %q", got)
	}
	a.store(off(2)+8, 7)
	if a.load(off(2)) != 0 || a.load(off(5)) != 0x55 {
		t.Fatal("data after DiscardSuspended")
	}
	if hc := d.home.counts(); hc.reads != h0.reads+2 || hc.writes != h0.writes+1 {
		t.Fatalf("Coherence calls after Resume: %+v -> %+v", h0, hc)
	}
	if s := d.quiesce(regionR); s.Restores != 0 {
		t.Fatalf("Restores %d", s.Restores)
	}
}

// Close while suspended returns, and the faults waiting end: the client
// sees the daemon gone.
func TestCloseWhileSuspended(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	a.store(off(3), 3)
	d.suspend()
	a.send("readat %x 8", off(3))
	eventually(t, "the ReadAt waits", func() bool { return d.c.Stats().FaultsInFlight == 1 })
	closed := make(chan error, 1)
	go func() { closed <- d.c.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hangDeadline):
		t.Fatal("Close while suspended hangs")
	}
	if r := a.reply(); !strings.HasPrefix(r, "err gone") {
		t.Fatalf("waiting ReadAt after Close: %s", r)
	}
}

// A miss in flight when Suspend begins is cancelled (an engine that
// honours ctx) and retried after Resume, uncounted as a failure; one that
// ignores ctx keeps Suspend waiting until Suspend's context ends, and a
// second Suspend revokes what it brought in.
func TestSuspendMissInFlight(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	b := d.client("B", "r")
	d.home.Put(regionR, 7, le64(0x77))
	d.home.Put(regionR, 8, le64(0x88))

	d.home.honourCtx = true
	open7 := d.home.gate(7)
	defer open7()
	a.send("load %x", off(7))
	d.home.waitEntered(t, 7)
	// The cancelled miss lets the page's lock go, before or after Suspend
	// comes to the page (then it waits for it).
	if st := d.suspend(); st.Waited > 1 || st.Punched != 0 {
		t.Fatalf("Suspend with a miss in flight: %+v", st)
	}
	open7()
	d.c.Resume()
	if got := a.reply(); got != "ok 77" {
		t.Fatalf("load after Resume: %q", got)
	}
	if s := d.c.Stats(); s.MissErrors != 0 {
		t.Fatalf("a cancelled miss counted as failed (%d)", s.MissErrors)
	}

	for len(d.home.entered) > 0 { // the retry's pass through page 7's gate
		<-d.home.entered
	}
	d.home.honourCtx = false
	open8 := d.home.gate(8)
	defer open8()
	b.send("load %x", off(8))
	d.home.waitEntered(t, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err := d.c.Suspend(ctx)
	cancel()
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !d.c.Suspended() {
		t.Fatalf("Suspend with a miss that ignores its context: %v", err)
	}
	open8()
	eventually(t, "the miss ends", func() bool { return d.state(8) == Shared })
	unanswered(t, b, "a load whose miss ended during the suspension")
	if st := d.suspend(); st.Punched != 1 || d.cached() != 0 {
		t.Fatalf("second Suspend: %+v, %d cached", st, d.cached())
	}
	d.c.Resume()
	if got := b.reply(); got != "ok 88" {
		t.Fatalf("load after Resume: %q", got)
	}
	d.quiesce(regionR)
}

// After Resume, pages set aside and not touched since are written back
// from their aside copy (Flush) and evicted like any Modified page.
func TestSuspendedPagesWrittenBack(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	for p := ids.PageNo(10); p < 14; p++ {
		a.store(off(p), 0x100+uint64(p))
	}
	d.suspend()
	d.c.Resume()
	n, err := d.c.Flush(context.Background(), regionR, 10, 2)
	if err != nil || n != 2 {
		t.Fatalf("Flush: %d, %v", n, err)
	}
	buf := make([]byte, ps)
	for p := ids.PageNo(10); p < 12; p++ {
		if d.home.Get(regionR, p, buf); binary.LittleEndian.Uint64(buf) != 0x100+uint64(p) {
			t.Fatalf("page %d written back as %#x", p, binary.LittleEndian.Uint64(buf))
		}
	}
	if s := d.c.Stats(); s.AsidePages != 2 || s.Restores != 0 || s.Writebacks != 2 {
		t.Fatalf("Stats after Flush: %+v", s)
	}
	if a.load(off(10)) != 0x10a || a.load(off(13)) != 0x10d {
		t.Fatal("data after the write-back")
	}
	if hc := d.home.counts(); hc.reads != 1 {
		t.Fatalf("read misses %d, want 1 (page 10, written back)", hc.reads)
	}
	d.quiesce(regionR)
}

// A Flush (a client's Sync) while suspended waits; when the incarnation
// is removed meanwhile (DiscardSuspended, then Close), it fails: it never
// reports pages written back that were discarded. A Flush that starts
// after the discard waits and fails the same way.
func TestFlushWhileSuspendedNeverLies(t *testing.T) {
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	for p := ids.PageNo(10); p < 14; p++ {
		a.store(off(p), 0x100+uint64(p))
	}
	d.suspend()
	type res struct {
		n   int
		err error
	}
	flush := func() chan res {
		ch := make(chan res, 1)
		go func() {
			n, err := d.c.Flush(context.Background(), regionR, 0, 0)
			ch <- res{n, err}
		}()
		return ch
	}
	before := flush()
	select {
	case r := <-before:
		t.Fatalf("Flush while suspended returned at once: %d, %v", r.n, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	if n := d.c.DiscardSuspended(); n != 4 {
		t.Fatalf("DiscardSuspended lost %d pages, want 4", n)
	}
	after := flush()
	select {
	case r := <-after:
		t.Fatalf("Flush after the discard returned at once: %d, %v", r.n, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := d.c.Close(); err != nil {
		t.Fatal(err)
	}
	for i, ch := range []chan res{before, after} {
		select {
		case r := <-ch:
			if r.err == nil || !errors.Is(r.err, ErrClosed) {
				t.Fatalf("Flush %d after the discard and Close: %d written, err %v; want ErrClosed", i, r.n, r.err)
			}
		case <-time.After(hangDeadline):
			t.Fatalf("Flush %d hangs after Close", i)
		}
	}
	buf := make([]byte, ps)
	for p := ids.PageNo(10); p < 14; p++ {
		if d.home.Get(regionR, p, buf); binary.LittleEndian.Uint64(buf) != 0 {
			t.Fatalf("page %d reached the home as %#x after its incarnation was removed", p, binary.LittleEndian.Uint64(buf))
		}
	}
}

// A call of dsmd's (Access, Flush) on a suspended Cache fails once it has
// waited SuspendedCallWait, with ErrUnavailable and ErrSuspended, instead
// of waiting for as long as the suspension lasts; after Resume the same
// calls succeed.
func TestCallsWhileSuspendedAreBounded(t *testing.T) {
	old := SuspendedCallWait
	SuspendedCallWait = 300 * time.Millisecond
	t.Cleanup(func() { SuspendedCallWait = old })
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	a.store(off(10), 0x1234)
	d.suspend()
	errs := make(chan error, 2)
	go func() {
		_, err := d.c.Flush(context.Background(), regionR, 0, 0)
		errs <- err
	}()
	go func() {
		errs <- d.c.Access(context.Background(), regionR, 11, false, func([]byte) {})
	}()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrSuspended) {
				t.Fatalf("a call while suspended: %v, want ErrUnavailable and ErrSuspended", err)
			}
		case <-time.After(hangDeadline):
			t.Fatal("a call while suspended waits for good")
		}
	}
	d.c.Resume()
	if _, err := d.c.Flush(context.Background(), regionR, 0, 0); err != nil {
		t.Fatalf("Flush after Resume: %v", err)
	}
	if err := d.c.Access(context.Background(), regionR, 11, false, func([]byte) {}); err != nil {
		t.Fatalf("Access after Resume: %v", err)
	}
}

// runsOf and merge: the ranges of one write protection or one punch.
func TestRevokeRanges(t *testing.T) {
	pages := func(nos ...ids.PageNo) []*page {
		var out []*page
		for _, no := range nos {
			out = append(out, &page{no: no})
		}
		return out
	}
	pgs := pages(1, 2, 3, 5, 6, 9, 30)
	runs := runsOf(pgs)
	if want := []run{{1, 0, 3, 3}, {5, 3, 2, 2}, {9, 5, 1, 1}, {30, 6, 1, 1}}; !slices.Equal(runs, want) {
		t.Fatalf("runsOf: %v, want %v", runs, want)
	}
	if got, want := merge(runs, 8, nil), []run{{1, 0, 9, 6}, {30, 6, 1, 1}}; !slices.Equal(got, want) {
		t.Fatalf("merge with gap 8: %v, want %v", got, want)
	}
	busy := []ids.PageNo{7}
	blocked := func(from, to ids.PageNo) bool {
		i, _ := slices.BinarySearch(busy, from)
		return i < len(busy) && busy[i] < to
	}
	if got, want := merge(runs, 8, blocked), []run{{1, 0, 6, 5}, {9, 5, 1, 1}, {30, 6, 1, 1}}; !slices.Equal(got, want) {
		t.Fatalf("merge around busy page 7: %v, want %v", got, want)
	}
	if got := merge(runs, 1, nil); !slices.Equal(got, runs) {
		t.Fatalf("merge with gap 1: %v", got)
	}
}

// EstimateSuspend measures something (its figure is not checked: a timing
// is a benchmark's business).
func TestEstimateSuspend(t *testing.T) {
	if d, err := EstimateSuspend(0, 0); err != nil || d != 0 {
		t.Fatalf("EstimateSuspend(0): %v, %v", d, err)
	}
	d, err := EstimateSuspend(100000, 0)
	if err != nil || d <= 0 {
		t.Fatalf("EstimateSuspend: %v, %v", d, err)
	}
	t.Logf("EstimateSuspend(100000 pages) = %v", d)
	if _, err := EstimateSuspend(10, 1000); !errors.Is(err, ErrBadRegion) {
		t.Fatalf("EstimateSuspend with a bad page size: %v", err)
	}
}

// Suspensions come and go while two clients write and read pages back,
// evictions make room in a small cache and remote invalidations and
// downgrades take pages (during the suspensions too): after every Suspend
// the memfd holds no page, and every value written is read back, by its
// writer and by the other client.
func TestSuspendUnderLoad(t *testing.T) {
	d := newDaemon(t, 12)
	d.home.remote = new(sync.Mutex)
	a := d.client("A", "r")
	b := d.client("B", "r")
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var remoteErr, suspendErr error
	var actions, suspensions int
	wg.Add(2)
	go func() { // the remote nodes
		defer wg.Done()
		dst := make([]byte, ps)
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
				was, remoteErr = d.c.Downgrade(ctx, regionR, p, dst)
			} else {
				was, remoteErr = d.c.Invalidate(ctx, regionR, p, dst)
			}
			if was == Modified {
				d.home.Put(regionR, p, dst)
			}
			d.home.remote.Unlock()
			if remoteErr != nil {
				return
			}
			actions++
			time.Sleep(200 * time.Microsecond)
		}
	}()
	go func() { // the lease
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
			}
			if _, suspendErr = d.c.Suspend(ctx); suspendErr != nil {
				return
			}
			suspensions++
			if n, err := d.c.CachedPages(regionR); err != nil || n != 0 {
				suspendErr = fmt.Errorf("the memfd holds %d pages after Suspend (%v)", n, err)
				d.c.Resume()
				return
			}
			time.Sleep(2 * time.Millisecond)
			d.c.Resume()
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
	wg.Wait()
	if remoteErr != nil || suspendErr != nil {
		t.Fatalf("remote actions: %v; suspensions: %v", remoteErr, suspendErr)
	}
	s := d.quiesce(regionR)
	t.Logf("%d suspensions, %d remote actions, %d evictions, %d pages restored", suspensions, actions, s.Evictions, s.Restores)
	if suspensions == 0 || s.Poisoned != 0 {
		t.Fatalf("%d suspensions, %d poisoned", suspensions, s.Poisoned)
	}
	a.ok("check %x %x %x %x", 0, 32, ps, 6)
}

// End, as dsmd calls it when its incarnation was declared failed while
// suspended: a client's ReadAt waiting in a fault and dsmd's own calls
// (Access, Flush) waiting for a lease fail at once with the reason, not
// after SuspendedCallWait nor at Close; new sessions and calls are refused
// with it too. Without End they waited for the whole suspension (the
// calls at most SuspendedCallWait, the fault until Close).
func TestEndFailsWhatWaits(t *testing.T) {
	old := SuspendedCallWait
	SuspendedCallWait = time.Hour // the calls must not end by the bound
	t.Cleanup(func() { SuspendedCallWait = old })
	d := newDaemon(t, 0)
	a := d.client("A", "r")
	a.store(off(3), 3)
	d.suspend()
	a.send("readat %x 8", off(3))
	eventually(t, "the ReadAt waits", func() bool { return d.c.Stats().FaultsInFlight == 1 })
	errs := make(chan error, 2)
	go func() {
		_, err := d.c.Flush(context.Background(), regionR, 0, 0)
		errs <- err
	}()
	go func() {
		errs <- d.c.Access(context.Background(), regionR, 11, false, func([]byte) {})
	}()
	time.Sleep(50 * time.Millisecond)
	const why = "incarnation 5 of n2 was declared failed in epoch 43"
	d.c.End(why)
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrEnded) || !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), why) {
				t.Fatalf("a call waiting at End: %v, want ErrEnded naming why", err)
			}
		case <-time.After(hangDeadline):
			t.Fatal("a call waiting at End waits on")
		}
	}
	if r := a.reply(); !strings.HasPrefix(r, "err gone") || !strings.Contains(r, why) {
		t.Fatalf("the client's ReadAt waiting at End: %s, want its session ended naming why", r)
	}
	// Calls after End fail at once, also once a Resume came (the lease
	// guard of the old incarnation may still run).
	d.c.Resume()
	if err := d.c.Access(context.Background(), regionR, 12, true, func([]byte) {}); !errors.Is(err, ErrEnded) {
		t.Fatalf("Access after End: %v, want ErrEnded", err)
	}
	b := startProc(t, "B", d.sock)
	if r := b.do("map r"); !strings.Contains(r, why) {
		t.Fatalf("a new session after End: %q, want it refused naming why", r)
	}
}
