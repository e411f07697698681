package pagestore

import (
	"context"
	"encoding/binary"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/vfs"
	"go.uber.org/goleak"

	"github.com/dsmkit/dsm/internal/ids"
)

// wedgeChildEnv names the directory of TestLargeWriteUnderFaultWedges's
// child process.
const wedgeChildEnv = "DSM_PAGESTORE_WEDGE_DIR"

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		crashChild()
		return
	}
	if os.Getenv(wedgeChildEnv) != "" {
		// A wedged pebble keeps its goroutines: no leak check here.
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m)
}

// pageData derives a page's contents from its identity, so that a reader
// can check a record without knowing what was written.
func pageData(region ids.RegionID, no uint64, version uint16, size int) []byte {
	b := make([]byte, size)
	x := uint64(region)<<48 ^ no<<16 ^ uint64(version) ^ 0x9e3779b97f4a7c15
	for i := 0; i < size; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], x)
		copy(b[i:], w[:])
	}
	return b
}

func page(region ids.RegionID, no uint64, version uint16) Page {
	return Page{Region: region, No: no, Version: version, Data: pageData(region, no, version, 4096)}
}

func openTest(t *testing.T, opts Options) *Store {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	s, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mustWrite(t *testing.T, s *Store, pages ...Page) {
	t.Helper()
	if err := s.Write(context.Background(), pages); err != nil {
		t.Fatalf("Write: %v", err)
	}
}

// testLogger sends a store's messages to the test's log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// writeOrError is mustWrite for goroutines other than the test's.
func writeOrError(t *testing.T, s *Store, pages ...Page) {
	if err := s.Write(context.Background(), pages); err != nil {
		t.Errorf("Write: %v", err)
	}
}

// wantPage fails t unless the store holds p exactly.
func wantPage(t *testing.T, s *Store, p Page) {
	t.Helper()
	v, data, ok, err := s.Get(p.Region, p.No)
	if err != nil || !ok {
		t.Fatalf("Get(%d, %d) = ok %v, err %v; want version %d", p.Region, p.No, ok, err, p.Version)
	}
	if v != p.Version || string(data) != string(p.Data) {
		t.Fatalf("Get(%d, %d) = version %d, %d bytes; want version %d, %d bytes (equal data %v)",
			p.Region, p.No, v, len(data), p.Version, len(p.Data), string(data) == string(p.Data))
	}
}

func isWAL(path string) bool { return strings.HasSuffix(path, ".log") }

// faultFS injects faults into, or holds, writes and syncs of WAL files.
// pebble's errorfs (v1.1.5) cannot: it injects on File.Sync but not on
// SyncData and SyncTo, which are what pebble's WAL writer calls.
type faultFS struct {
	vfs.FS

	mu sync.Mutex
	// failSync, failWrite: the error every WAL sync or write returns while
	// set.
	failSync, failWrite error
	// failSST: the error every creation of an sstable returns while set.
	failSST error
	// gate, while non-nil, holds every WAL sync until it is closed.
	gate    chan struct{}
	holding chan struct{} // receives a value when a sync starts waiting on gate
}

func newFaultFS() (*faultFS, vfs.FS) {
	f := &faultFS{FS: vfs.Default, holding: make(chan struct{}, 1024)}
	return f, f
}

func (f *faultFS) Create(name string) (vfs.File, error) {
	f.mu.Lock()
	sstErr := f.failSST
	f.mu.Unlock()
	if sstErr != nil && strings.HasSuffix(name, ".sst") {
		return nil, &os.PathError{Op: "injected create", Path: name, Err: sstErr}
	}
	file, err := f.FS.Create(name)
	return f.wrap(name, file), err
}

func (f *faultFS) ReuseForWrite(oldname, newname string) (vfs.File, error) {
	file, err := f.FS.ReuseForWrite(oldname, newname)
	return f.wrap(newname, file), err
}

func (f *faultFS) OpenReadWrite(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	file, err := f.FS.OpenReadWrite(name, opts...)
	return f.wrap(name, file), err
}

func (f *faultFS) wrap(name string, file vfs.File) vfs.File {
	if file == nil || !isWAL(name) {
		return file
	}
	return &faultFile{File: file, fs: f, name: name}
}

// check returns the injected error for a write or sync, after waiting on
// the gate for a sync.
func (f *faultFS) check(name string, sync bool) error {
	f.mu.Lock()
	err, gate := f.failWrite, f.gate
	if sync {
		err = f.failSync
	}
	f.mu.Unlock()
	if err != nil {
		return &os.PathError{Op: "injected", Path: name, Err: err}
	}
	if sync && gate != nil {
		f.holding <- struct{}{}
		<-gate
	}
	return nil
}

func (f *faultFS) set(fn func(f *faultFS)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

type faultFile struct {
	vfs.File
	fs   *faultFS
	name string
}

func (f *faultFile) Write(p []byte) (int, error) {
	if err := f.fs.check(f.name, false); err != nil {
		return 0, err
	}
	return f.File.Write(p)
}

func (f *faultFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.fs.check(f.name, false); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}

func (f *faultFile) Sync() error {
	if err := f.fs.check(f.name, true); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f *faultFile) SyncData() error {
	if err := f.fs.check(f.name, true); err != nil {
		return err
	}
	return f.File.SyncData()
}

func (f *faultFile) SyncTo(length int64) (bool, error) {
	if err := f.fs.check(f.name, true); err != nil {
		return false, err
	}
	return f.File.SyncTo(length)
}

var (
	errEIO    error = syscall.EIO
	errENOSPC error = syscall.ENOSPC
)
