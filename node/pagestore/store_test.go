package pagestore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble"

	"github.com/dsmkit/dsm/internal/ids"
)

func TestWriteGetScan(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, Options{Dir: dir})
	var all []Page
	for r := ids.RegionID(1); r <= 3; r++ {
		for no := uint64(0); no < 20; no++ {
			all = append(all, page(r, no*3, uint16(no)))
		}
	}
	small := Page{Region: 9, No: 1, Version: 0xffff, Data: []byte("short page")}
	empty := Page{Region: 9, No: 2, Version: 1, Data: []byte{}}
	all = append(all, small, empty)
	mustWrite(t, s, all...)
	for _, p := range all {
		wantPage(t, s, p)
	}
	if _, _, ok, err := s.Get(1, 1); ok || err != nil {
		t.Fatalf("Get of a page never written = ok %v, err %v", ok, err)
	}

	var got []uint64
	err := s.Scan(2, 6, 30, func(p Page) error {
		if p.Region != 2 || p.Version != uint16(p.No/3) || string(p.Data) != string(pageData(2, p.No, p.Version, 4096)) {
			return fmt.Errorf("scan returned region %d page %d version %d with wrong data", p.Region, p.No, p.Version)
		}
		got = append(got, p.No)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint64{6, 9, 12, 15, 18, 21, 24, 27}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Scan(2, 6, 30) pages %v; want %v", got, want)
	}
	stop := errors.New("stop")
	n := 0
	if err := s.Scan(1, 0, ^uint64(0), func(Page) error { n++; return stop }); err != stop || n != 1 {
		t.Fatalf("Scan with an error from fn = %v after %d pages; want stop after 1", err, n)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openTest(t, Options{Dir: dir})
	for _, p := range all {
		wantPage(t, s2, p)
	}
}

func TestWriteCopiesData(t *testing.T) {
	s := openTest(t, Options{})
	p := page(1, 1, 1)
	data := append([]byte(nil), p.Data...)
	mustWrite(t, s, Page{Region: 1, No: 1, Version: 1, Data: data})
	for i := range data {
		data[i] = 0
	}
	wantPage(t, s, p)
	_, got, _, _ := s.Get(1, 1)
	got[0] ^= 1
	wantPage(t, s, p)
}

func TestDeleteRangeAndRegion(t *testing.T) {
	s := openTest(t, Options{})
	for r := ids.RegionID(1); r <= 2; r++ {
		for no := uint64(0); no < 10; no++ {
			mustWrite(t, s, page(r, no, 1))
		}
	}
	mustWrite(t, s, page(0xffffffff, ^uint64(0)-1, 1))
	if err := s.DeleteRange(1, 3, 7); err != nil {
		t.Fatal(err)
	}
	for no := uint64(0); no < 10; no++ {
		_, _, ok, err := s.Get(1, no)
		if err != nil || ok != (no < 3 || no >= 7) {
			t.Fatalf("after DeleteRange(1, 3, 7): Get(1, %d) ok %v, err %v", no, ok, err)
		}
	}
	if err := s.DeleteRegion(1); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteRegion(0xffffffff); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, _ := s.Get(0xffffffff, ^uint64(0)-1); ok {
		t.Fatal("the last region's page survived DeleteRegion")
	}
	n := 0
	if err := s.Scan(1, 0, ^uint64(0), func(Page) error { n++; return nil }); err != nil || n != 0 {
		t.Fatalf("region 1 after DeleteRegion: %d pages, %v", n, err)
	}
	for no := uint64(0); no < 10; no++ {
		wantPage(t, s, page(2, no, 1))
	}
	// A Write after the delete lands after it.
	mustWrite(t, s, page(1, 4, 2))
	wantPage(t, s, page(1, 4, 2))
}

// held opens a store whose WAL syncs wait on a gate, and returns it with a
// release function: Writes made while the first batch's sync is held queue
// up for the next batch.
func held(t *testing.T, opts Options) (*Store, *faultFS) {
	t.Helper()
	ffs, fs := newFaultFS()
	opts.FS = fs
	s := openTest(t, opts)
	return s, ffs
}

// hold makes the next WAL sync wait; it returns once a batch is waiting on
// it, so that what is written next queues behind that batch.
func hold(t *testing.T, s *Store, ffs *faultFS, first Page) (release func(), firstDone <-chan error) {
	t.Helper()
	gate := make(chan struct{})
	ffs.set(func(f *faultFS) { f.gate = gate })
	done := make(chan error, 1)
	go func() { done <- s.Write(context.Background(), []Page{first}) }()
	<-ffs.holding
	ffs.set(func(f *faultFS) { f.gate = nil })
	return func() { close(gate) }, done
}

// waitQueued waits until n requests are queued behind the held batch.
func waitQueued(s *Store, n int) {
	for {
		s.qmu.Lock()
		q := len(s.queue)
		s.qmu.Unlock()
		if q >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func TestConcurrentWritesShareABatch(t *testing.T) {
	s, ffs := held(t, Options{})
	release, firstDone := hold(t, s, ffs, page(1, 1000, 1))
	const writers = 20
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for i := range writers {
		wg.Go(func() { errs <- s.Write(context.Background(), []Page{page(1, uint64(i), 1), page(2, uint64(i), 1)}) })
	}
	waitQueued(s, writers)
	release()
	wg.Wait()
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	if st.Batches != 2 || st.Writes != writers+1 || st.Pages != 2*writers+1 {
		t.Fatalf("Stats = %+v; want 2 batches of %d writes, %d pages", st, writers+1, 2*writers+1)
	}
	if want := uint64(2*writers+1) * (headerLen + 4096); st.Bytes != want {
		t.Fatalf("Stats.Bytes = %d; want %d", st.Bytes, want)
	}
	for i := range writers {
		wantPage(t, s, page(1, uint64(i), 1))
		wantPage(t, s, page(2, uint64(i), 1))
	}
}

func TestBatchCapSplitsQueuedWrites(t *testing.T) {
	// A cap of two records per batch.
	s, ffs := held(t, Options{MaxBatchBytes: 2 * (keyLen + headerLen + 4096)})
	release, firstDone := hold(t, s, ffs, page(1, 1000, 1))
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() { writeOrError(t, s, page(1, uint64(i), 1)) })
	}
	waitQueued(s, 6)
	release()
	wg.Wait()
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Batches != 4 || st.Pages != 7 {
		t.Fatalf("Stats = %+v; want 1 + 3 batches of 7 pages", st)
	}
}

func TestSamePageInOneBatchKeepsNewerVersion(t *testing.T) {
	s, ffs := held(t, Options{})
	release, firstDone := hold(t, s, ffs, page(1, 1000, 1))
	// Queued in this order, all in the next batch.
	writes := [][]Page{
		{page(1, 1, 5)}, {page(1, 1, 4)}, // older second: 5 stays
		{page(1, 2, 0xfffe)}, {page(1, 2, 1)}, // 1 is newer across the wrap
		{page(1, 3, 7)}, {page(1, 3, 7)}, // a tie
	}
	var wg sync.WaitGroup
	for i, w := range writes {
		waitQueued(s, i)
		wg.Go(func() { writeOrError(t, s, w...) })
	}
	waitQueued(s, len(writes))
	release()
	wg.Wait()
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Batches != 2 {
		t.Fatalf("Stats = %+v; want the six writes in one batch", st)
	}
	wantPage(t, s, page(1, 1, 5))
	wantPage(t, s, page(1, 2, 1))
	wantPage(t, s, page(1, 3, 7))

	// Across batches the later write replaces the page.
	mustWrite(t, s, page(1, 1, 3))
	wantPage(t, s, page(1, 1, 3))
}

func TestWriteReturnsOnCancel(t *testing.T) {
	s, ffs := held(t, Options{})
	release, firstDone := hold(t, s, ffs, page(1, 1000, 1))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Write(ctx, []Page{page(1, 1, 1)}) }()
	waitQueued(s, 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Write after cancel = %v; want context.Canceled", err)
	}
	release()
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	// The cancelled write was queued: it still lands.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openTest(t, Options{Dir: s.opts.Dir})
	wantPage(t, s2, page(1, 1, 1))
	if err := s2.Write(ctx, []Page{page(1, 2, 1)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Write with a cancelled ctx = %v", err)
	}
	if _, _, ok, _ := s2.Get(1, 2); ok {
		t.Fatal("a Write called with a cancelled ctx was stored")
	}
}

func TestCorruptRecordIsNamed(t *testing.T) {
	s := openTest(t, Options{})
	mustWrite(t, s, page(4, 1, 1), page(4, 3, 1))
	bad := appendRecord(nil, 2, []byte("payload"))
	bad[len(bad)-1] ^= 0xff
	if err := s.db.Set(pageKey(4, 2), bad, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	_, _, _, err := s.Get(4, 2)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "region 4 page 2") {
		t.Fatalf("Get of a corrupt record = %v; want ErrCorrupt naming region 4 page 2", err)
	}
	var seen []uint64
	err = s.Scan(4, 0, 10, func(p Page) error { seen = append(seen, p.No); return nil })
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "region 4 page 2") || fmt.Sprint(seen) != "[1]" {
		t.Fatalf("Scan over a corrupt record = %v after %v", err, seen)
	}
	wantPage(t, s, page(4, 3, 1))
}

func TestClosedStore(t *testing.T) {
	s := openTest(t, Options{})
	mustWrite(t, s, page(1, 1, 1))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(context.Background(), []Page{page(1, 2, 1)}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after Close = %v", err)
	}
	if _, _, _, err := s.Get(1, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Close = %v", err)
	}
	if err := s.DeleteRegion(1); !errors.Is(err, ErrClosed) {
		t.Fatalf("DeleteRegion after Close = %v", err)
	}
	if err := s.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close = %v", err)
	}
}

func TestOversizedPageRefused(t *testing.T) {
	s := openTest(t, Options{})
	err := s.Write(context.Background(), []Page{{Region: 1, No: 1, Data: make([]byte, MaxPageBytes+1)}})
	if err == nil || errors.Is(err, ErrNotPersisted) {
		t.Fatalf("Write of an oversized page = %v", err)
	}
	if _, _, ok, _ := s.Get(1, 1); ok {
		t.Fatal("oversized page stored")
	}
}

// TestEnqueueOrder: Enqueue queues at once and returns; its pages are
// committed in the order of the calls (within one batch the newer
// version of a page is kept, across batches the later call's), and wait
// reports the batch's outcome.
func TestEnqueueOrder(t *testing.T) {
	s := openTest(t, Options{})
	ctx := context.Background()
	w1, err := s.Enqueue([]Page{page(1, 0, 1), page(1, 1, 1)})
	if err != nil {
		t.Fatal(err)
	}
	w2, err := s.Enqueue([]Page{page(1, 0, 2)})
	if err != nil {
		t.Fatal(err)
	}
	if err := w2(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w1(ctx); err != nil {
		t.Fatal(err)
	}
	wantPage(t, s, page(1, 0, 2))
	wantPage(t, s, page(1, 1, 1))
	w3, err := s.Enqueue([]Page{page(1, 1, 0)})
	if err != nil || w3(ctx) != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	wantPage(t, s, page(1, 1, 0))
	if w, err := s.Enqueue(nil); err != nil || w(ctx) != nil {
		t.Fatalf("Enqueue(nil) = %v", err)
	}
	if _, err := s.Enqueue([]Page{{Region: 1, Data: make([]byte, MaxPageBytes+1)}}); err == nil {
		t.Fatal("Enqueue of an oversized page succeeded")
	}
}
