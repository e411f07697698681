// Package pebblefs closes what a failed pebble.Open leaves open, and tells
// disk faults from pebble's own (IsDiskFault).
//
// pebble v1.1.5's Open does not close every file it opened when it fails
// part-way: a MANIFEST it created and could not write (a full disk) stays
// open, and so holds its blocks and its descriptor, after Open returned the
// error. A process that retries Open until the disk has room (dsmd waits
// for free space at start; the page store reopens its database before each
// batch after a disk fault) would leak one descriptor and one file's space
// per attempt. Open here runs pebble.Open over a file system that records
// the files opened during the call, and on failure closes those still open.
package pebblefs

import (
	"errors"
	"sync"
	"syscall"

	"github.com/cockroachdb/pebble"
	"github.com/cockroachdb/pebble/vfs"
)

// Open is pebble.Open(dir, opts) that, when it fails, closes every file it
// opened and left open. opts.FS nil means vfs.Default; opts is not changed.
// The files opened during a successful Open stay open, as pebble's.
func Open(dir string, opts *pebble.Options) (*pebble.DB, error) {
	o := *opts
	if o.FS == nil {
		o.FS = vfs.Default
	}
	t := &tracker{FS: o.FS, open: map[*file]struct{}{}}
	o.FS = t
	db, err := pebble.Open(dir, &o)
	if err != nil {
		t.closeLeft()
		return nil, err
	}
	t.stop()
	return db, nil
}

// tracker is a vfs.FS that records the files opened through it until stop.
type tracker struct {
	vfs.FS
	mu      sync.Mutex
	open    map[*file]struct{}
	stopped bool
}

// file is a file opened through a tracker; Close forgets it.
type file struct {
	vfs.File
	t *tracker
}

func (f *file) Close() error {
	f.t.mu.Lock()
	delete(f.t.open, f)
	f.t.mu.Unlock()
	return f.File.Close()
}

func (t *tracker) track(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return f, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return f, nil
	}
	w := &file{File: f, t: t}
	t.open[w] = struct{}{}
	return w, nil
}

// stop ends the recording: files opened from now on are the file system's
// own, and those opened so far stay open.
func (t *tracker) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	clear(t.open)
}

// closeLeft closes the files opened through t and not closed, and stops
// the recording.
func (t *tracker) closeLeft() {
	t.mu.Lock()
	left := make([]*file, 0, len(t.open))
	for f := range t.open {
		left = append(left, f)
	}
	t.stopped = true
	clear(t.open)
	t.mu.Unlock()
	for _, f := range left {
		f.File.Close() // a failed Open's leftovers: nothing to report
	}
}

func (t *tracker) Create(name string) (vfs.File, error) { return t.track(t.FS.Create(name)) }

func (t *tracker) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	return t.track(t.FS.Open(name, opts...))
}

func (t *tracker) OpenReadWrite(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	return t.track(t.FS.OpenReadWrite(name, opts...))
}

func (t *tracker) OpenDir(name string) (vfs.File, error) { return t.track(t.FS.OpenDir(name)) }

func (t *tracker) ReuseForWrite(oldname, newname string) (vfs.File, error) {
	return t.track(t.FS.ReuseForWrite(oldname, newname))
}

// IsDiskFault reports whether err is a fault of the disk or file system (a
// full disk, a quota, an I/O error, a read-only or too-large file) rather
// than of pebble's own state: what a store may report as an error and
// recover from, where pebble would end the process.
func IsDiskFault(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	switch errno {
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EIO, syscall.EROFS, syscall.EFBIG:
		return true
	}
	return false
}

// IsDiskFull reports whether err was caused by a full file system or a
// quota reached: a condition that freeing space clears.
func IsDiskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}
