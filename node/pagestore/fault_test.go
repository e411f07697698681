package pagestore

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"

	"github.com/cockroachdb/pebble"
	"testing"
)

// A failed WAL fsync fails the Write with ErrNotPersisted (not
// ErrDiskFull), leaves the synced pages readable, and the next Write
// succeeds once the fault clears; everything acknowledged survives a
// reopen.
func TestFailedSyncIsAnError(t *testing.T) {
	testWALFault(t, func(f *faultFS) { f.failSync = errEIO }, false)
}

// A WAL write that finds the disk full fails with ErrDiskFull.
func TestFullDiskOnWALWriteIsDiskFull(t *testing.T) {
	testWALFault(t, func(f *faultFS) { f.failWrite = errENOSPC }, true)
}

// A WAL fsync that finds the disk full fails with ErrDiskFull.
func TestFullDiskOnWALSyncIsDiskFull(t *testing.T) {
	testWALFault(t, func(f *faultFS) { f.failSync = errENOSPC }, true)
}

func testWALFault(t *testing.T, inject func(*faultFS), diskFull bool) {
	dir := t.TempDir()
	ffs, fs := newFaultFS()
	s := openTest(t, Options{Dir: dir, FS: fs})
	old := []Page{page(1, 0, 1), page(1, 1, 1), page(2, 7, 3)}
	mustWrite(t, s, old...)

	ffs.set(inject)
	err := s.Write(t.Context(), []Page{page(1, 0, 2), page(1, 2, 1)})
	if !errors.Is(err, ErrNotPersisted) {
		t.Fatalf("Write under a WAL fault = %v; want ErrNotPersisted", err)
	}
	if errors.Is(err, ErrDiskFull) != diskFull {
		t.Fatalf("Write under a WAL fault = %v; ErrDiskFull %v, want %v", err, errors.Is(err, ErrDiskFull), diskFull)
	}
	// Reads work while the fault persists.
	for _, p := range old[1:] {
		wantPage(t, s, p)
	}
	if v, _, ok, err := s.Get(1, 0); err != nil || !ok || (v != 1 && v != 2) {
		t.Fatalf("Get(1, 0) under a fault = %d, %v, %v; want version 1 or 2", v, ok, err)
	}
	// Still failing while the fault is there.
	if err := s.Write(t.Context(), []Page{page(3, 0, 1)}); !errors.Is(err, ErrNotPersisted) {
		t.Fatalf("second Write under a WAL fault = %v; want ErrNotPersisted", err)
	}

	ffs.set(func(f *faultFS) { f.failSync, f.failWrite = nil, nil })
	later := page(1, 3, 9)
	mustWrite(t, s, later)
	wantPage(t, s, later)
	for _, p := range old[1:] {
		wantPage(t, s, p)
	}
	if st := s.Stats(); st.Failed < 2 || st.Reopens < 1 {
		t.Fatalf("Stats = %+v; want at least 2 failed batches and a reopen", st)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	s2 := openTest(t, Options{Dir: dir})
	for _, p := range append(old[1:], later) {
		wantPage(t, s2, p)
	}
	if err := s2.Scan(1, 0, ^uint64(0), func(Page) error { return nil }); err != nil {
		t.Fatalf("Scan after reopen: %v", err)
	}
}

// recordingLogger is a pebble logger whose Fatalf returns.
type recordingLogger struct{ fatal []string }

func (*recordingLogger) Infof(string, ...any) {}

func (l *recordingLogger) Fatalf(format string, _ ...any) { l.fatal = append(l.fatal, format) }

// TestPebbleReportsFailedCommitThroughFatalf pins the pebble v1.1.5
// behaviour commitBatch is built on: a failed WAL fsync reaches only
// Logger.Fatalf (with pebbleCommitFatal), Batch.Commit itself returns nil
// when Fatalf returns, and the failed batch is visible to reads of that DB.
func TestPebbleReportsFailedCommitThroughFatalf(t *testing.T) {
	ffs, fs := newFaultFS()
	l := &recordingLogger{}
	db, err := pebble.Open(t.TempDir(), &pebble.Options{FS: fs, Logger: l})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ffs.set(func(f *faultFS) { f.failSync = errEIO })
	b := db.NewBatch()
	if err := b.Set([]byte("k"), []byte("v"), nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatalf("Commit = %v; pebble now returns the error (commitBatch can be simplified)", err)
	}
	if len(l.fatal) != 1 || l.fatal[0] != pebbleCommitFatal {
		t.Fatalf("Fatalf calls %q; want one %q", l.fatal, pebbleCommitFatal)
	}
	v, closer, err := db.Get([]byte("k"))
	if err != nil {
		t.Fatalf("Get of the failed batch: %v; pebble no longer applies it", err)
	}
	if string(v) != "v" {
		t.Fatalf("Get = %q", v)
	}
	closer.Close()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestPebbleLoggerFatalf(t *testing.T) {
	l := &pebbleLogger{log: slog.New(slog.DiscardHandler)}
	full := &os.PathError{Op: "write", Path: "000002.log", Err: syscall.ENOSPC}

	func() {
		defer func() {
			f, ok := recover().(commitFailure)
			if !ok || !errors.Is(f.err, syscall.ENOSPC) {
				t.Fatalf("Fatalf(pebbleCommitFatal) raised %#v; want commitFailure wrapping ENOSPC", f)
			}
		}()
		l.Fatalf(pebbleCommitFatal, full)
	}()
	if l.faulted() {
		t.Fatal("a commit failure marked a background fault")
	}

	// A disk fault of a background MANIFEST write returns and is noted.
	l.Fatalf("%s", fmt.Errorf("MANIFEST sync failed: %w", full))
	if !l.faulted() {
		t.Fatal("a background disk fault was not noted")
	}
	l.clearFault()

	func() {
		defer func() {
			if r := recover(); r == nil {
				t.Fatal("Fatalf of a broken invariant returned")
			}
		}()
		l.Fatalf("L%d->L%d: %s already being compacted", 0, 6, "000007")
	}()
	if l.faulted() {
		t.Fatal("a broken invariant was noted as a disk fault")
	}
}

// A disk fault pebble reported in the background makes the next batch
// reopen the database first.
func TestBackgroundFaultReopensBeforeNextBatch(t *testing.T) {
	s := openTest(t, Options{})
	mustWrite(t, s, page(1, 1, 1))
	s.plog.Fatalf("%s", &os.PathError{Op: "sync", Path: "MANIFEST-000001", Err: syscall.EIO})
	mustWrite(t, s, page(1, 2, 1))
	if st := s.Stats(); st.Reopens != 1 || st.Batches != 2 {
		t.Fatalf("Stats = %+v; want one reopen and two batches", st)
	}
	wantPage(t, s, page(1, 1, 1))
	wantPage(t, s, page(1, 2, 1))
}

// When the disk is too full for pebble to reopen for writing (replaying
// the WAL writes an sstable), reads go to a read-only open, Writes keep
// failing with ErrDiskFull, and the first Write after space is freed
// reopens for writing and succeeds.
func TestReadOnlyWhileReopenFails(t *testing.T) {
	dir := t.TempDir()
	ffs, fs := newFaultFS()
	s := openTest(t, Options{Dir: dir, FS: fs})
	old := []Page{page(5, 0, 1), page(5, 1, 1)}
	mustWrite(t, s, old...)

	ffs.set(func(f *faultFS) { f.failWrite, f.failSST = errENOSPC, errENOSPC })
	for i := range 2 {
		if err := s.Write(t.Context(), []Page{page(5, 2, uint16(i))}); !errors.Is(err, ErrDiskFull) {
			t.Fatalf("Write %d with no room to reopen = %v; want ErrDiskFull", i, err)
		}
		s.mu.RLock()
		ro := s.readOnly
		s.mu.RUnlock()
		if !ro {
			t.Fatalf("after failed Write %d the database is not the read-only open", i)
		}
		for _, p := range old {
			wantPage(t, s, p)
		}
	}

	ffs.set(func(f *faultFS) { f.failWrite, f.failSST = nil, nil })
	later := page(5, 3, 1)
	mustWrite(t, s, later)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openTest(t, Options{Dir: dir})
	for _, p := range append(old, later) {
		wantPage(t, s2, p)
	}
}

// Writers, readers and WAL faults at once: every Write either fails with
// ErrNotPersisted or is acknowledged, every acknowledged page is found
// (at its version or a newer one), and reads never fail.
func TestFaultsUnderConcurrentWriters(t *testing.T) {
	ffs, fs := newFaultFS()
	s := openTest(t, Options{FS: fs})
	const writers, pagesEach, rounds = 6, 8, 60
	var (
		mu       sync.Mutex
		acked    = map[pageID]uint16{}
		failed   int
		outcomes int
		wg       sync.WaitGroup
		done     = make(chan struct{})
	)
	for w := range writers {
		wg.Go(func() {
			for i := range rounds {
				version := uint16(i + 1)
				no := uint64(w*100 + i%pagesEach)
				err := s.Write(t.Context(), []Page{page(7, no, version)})
				mu.Lock()
				switch {
				case err == nil:
					acked[pageID{7, no}] = version
				case errors.Is(err, ErrNotPersisted):
					failed++
				default:
					t.Errorf("Write: %v", err)
				}
				// Every 25 outcomes the fault switches on or off.
				outcomes++
				if outcomes%25 == 0 {
					on := outcomes/25%2 == 1
					ffs.set(func(f *faultFS) {
						f.failSync = nil
						if on {
							f.failSync = errEIO
						}
					})
				}
				mu.Unlock()
			}
		})
	}
	var readers sync.WaitGroup
	for r := range 3 {
		readers.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				no := uint64(r*100 + 3)
				v, data, ok, err := s.Get(7, no)
				if err != nil {
					t.Errorf("Get during faults: %v", err)
					return
				}
				if ok && string(data) != string(pageData(7, no, v, 4096)) {
					t.Errorf("Get(7, %d) version %d: wrong data", no, v)
					return
				}
				err = s.Scan(7, 0, ^uint64(0), func(p Page) error {
					if string(p.Data) != string(pageData(7, p.No, p.Version, 4096)) {
						return fmt.Errorf("page %d version %d: wrong data", p.No, p.Version)
					}
					return nil
				})
				if err != nil {
					t.Errorf("Scan during faults: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(done)
	readers.Wait()
	ffs.set(func(f *faultFS) { f.failSync = nil })
	t.Logf("%d pages acknowledged, %d writes failed, %+v", len(acked), failed, s.Stats())
	if failed == 0 {
		t.Fatal("no Write met a fault")
	}
	for id, v := range acked {
		got, data, ok, err := s.Get(id.region, id.no)
		if err != nil || !ok || Newer(v, got) || string(data) != string(pageData(id.region, id.no, got, 4096)) {
			t.Fatalf("page %d: version %d ok %v err %v; acknowledged %d", id.no, got, ok, err, v)
		}
	}
}

// A Write larger than half of pebble's memtable takes pebble's large-batch
// path: the batch becomes a memtable of its own, which switches to a new
// WAL. Under a WAL fault pebble cannot close the old WAL and panics holding
// DB.mu (DB.rotateWAL): the store reports ErrWedged, keeps serving reads,
// refuses writes, and a new process recovers everything acknowledged. The
// wedged database cannot be closed, so the scenario runs in a child
// process, out of the goroutine leak check.
func TestLargeWriteUnderFaultWedges(t *testing.T) {
	dir := os.Getenv(wedgeChildEnv)
	if dir == "" {
		dir = t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestLargeWriteUnderFaultWedges$", "-test.v")
		cmd.Env = append(os.Environ(), wedgeChildEnv+"="+dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		s := openTest(t, Options{Dir: dir})
		for no := range uint64(5) {
			v, data, ok, err := s.Get(8, no)
			// The failed Write may have reached the WAL before the fault.
			if err != nil || !ok || (v != 1 && v != 2) || string(data) != string(pageData(8, no, v, 4<<20)) {
				t.Fatalf("page %d in a new process: version %d, ok %v, err %v", no, v, ok, err)
			}
		}
		wantPage(t, s, page(8, 9, 1))
		return
	}

	ffs, fs := newFaultFS()
	s, err := Open(Options{Dir: dir, FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	big := func(version uint16) []Page {
		var pages []Page
		for no := range uint64(5) {
			pages = append(pages, Page{Region: 8, No: no, Version: version, Data: pageData(8, no, version, 4<<20)})
		}
		return pages
	}
	if 5*(4<<20) <= memTableSize/2 {
		t.Fatal("the large Write is not larger than pebble's large-batch threshold")
	}
	mustWrite(t, s, big(1)...)
	mustWrite(t, s, page(8, 9, 1))
	ffs.set(func(f *faultFS) { f.failSync = errEIO })
	if err := s.Write(t.Context(), big(2)); !errors.Is(err, ErrNotPersisted) || !errors.Is(err, ErrWedged) {
		t.Fatalf("large Write under a WAL fault = %v; want ErrNotPersisted and ErrWedged", err)
	}
	ffs.set(func(f *faultFS) { f.failSync = nil })
	if err := s.Write(t.Context(), []Page{page(8, 10, 1)}); !errors.Is(err, ErrWedged) {
		t.Fatalf("Write after the wedge = %v; want ErrWedged", err)
	}
	wantPage(t, s, page(8, 9, 1))
	for _, p := range big(1) {
		wantPage(t, s, p)
	}
	if err := s.Close(); !errors.Is(err, ErrWedged) {
		t.Fatalf("Close of a wedged store = %v; want ErrWedged", err)
	}
}
