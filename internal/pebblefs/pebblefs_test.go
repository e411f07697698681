package pebblefs

import (
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble"
	"github.com/cockroachdb/pebble/vfs"
)

// countingFS counts the files open through it, and fails every write to a
// MANIFEST with ENOSPC while full is set (a full disk at open).
type countingFS struct {
	vfs.FS
	mu   sync.Mutex
	open int
	full bool
}

type countedFile struct {
	vfs.File
	fs     *countingFS
	name   string
	closed bool
}

func (f *countedFile) Write(p []byte) (int, error) {
	f.fs.mu.Lock()
	full := f.fs.full
	f.fs.mu.Unlock()
	if full && strings.Contains(f.name, "MANIFEST") {
		return 0, &fsError{syscall.ENOSPC}
	}
	return f.File.Write(p)
}

func (f *countedFile) Close() error {
	f.fs.mu.Lock()
	if !f.closed {
		f.closed = true
		f.fs.open--
	}
	f.fs.mu.Unlock()
	return f.File.Close()
}

type fsError struct{ errno syscall.Errno }

func (e *fsError) Error() string { return "write: " + e.errno.Error() }
func (e *fsError) Unwrap() error { return e.errno }

func (c *countingFS) count(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return f, err
	}
	c.mu.Lock()
	c.open++
	c.mu.Unlock()
	return &countedFile{File: f, fs: c, name: name}, nil
}

func (c *countingFS) Create(name string) (vfs.File, error) {
	f, err := c.FS.Create(name)
	return c.count(name, f, err)
}

func (c *countingFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := c.FS.Open(name, opts...)
	return c.count(name, f, err)
}

func (c *countingFS) OpenReadWrite(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := c.FS.OpenReadWrite(name, opts...)
	return c.count(name, f, err)
}

func (c *countingFS) OpenDir(name string) (vfs.File, error) {
	f, err := c.FS.OpenDir(name)
	return c.count(name, f, err)
}

func (c *countingFS) ReuseForWrite(oldname, newname string) (vfs.File, error) {
	f, err := c.FS.ReuseForWrite(oldname, newname)
	return c.count(newname, f, err)
}

func (c *countingFS) openFiles() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open
}

// quietLogger returns from Fatalf (pebble then returns the error) rather
// than exiting, as dsmd's loggers do for a disk fault.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Fatalf(string, ...any) {}

// TestFailedOpenLeavesNothingOpen creates a database on a disk that is
// full: pebble.Open fails and leaves its MANIFEST open (the leak this
// package exists for); Open here fails the same way and leaves no file
// open; once the disk has room, Open succeeds and the database works.
func TestFailedOpenLeavesNothingOpen(t *testing.T) {
	fs := &countingFS{FS: vfs.NewMem(), full: true}
	if err := fs.MkdirAll("db", 0o755); err != nil {
		t.Fatal(err)
	}
	opts := &pebble.Options{FS: fs, Logger: quietLogger{}}

	if _, err := pebble.Open("db", opts); err == nil {
		t.Fatal("pebble.Open on a full disk succeeded")
	}
	leaked := fs.openFiles()
	t.Logf("pebble.Open on a full disk left %d files open", leaked)

	for i := range 3 {
		db, err := Open("db", opts)
		if err == nil {
			db.Close()
			t.Fatalf("attempt %d: Open on a full disk succeeded", i)
		}
		if !strings.Contains(err.Error(), syscall.ENOSPC.Error()) {
			t.Fatalf("attempt %d: Open on a full disk: %v", i, err)
		}
		if got := fs.openFiles(); got != leaked {
			t.Fatalf("attempt %d: %d files open after a failed Open, want %d as before it", i, got, leaked)
		}
	}
	if opts.FS != fs {
		t.Fatal("Open changed the caller's options")
	}

	fs.mu.Lock()
	fs.full = false
	fs.mu.Unlock()
	db, err := Open("db", opts)
	if err != nil {
		t.Fatalf("Open once the disk has room: %v", err)
	}
	for i := range 10 {
		if err := db.Set(fmt.Appendf(nil, "k%d", i), []byte("v"), pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	v, closer, err := db.Get([]byte("k7"))
	if err != nil || string(v) != "v" {
		t.Fatalf("Get after the reopen: %q, %v", v, err)
	}
	closer.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if got := fs.openFiles(); got != leaked {
		t.Fatalf("%d files open after Close, want %d (pebble.Open's leak only)", got, leaked)
	}
}
