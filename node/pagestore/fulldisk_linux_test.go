package pagestore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestRealFullDisk fills a real file system: a tmpfs of 8 MiB mounted for
// the test.
func TestRealFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount an 8 MiB tmpfs; run as root to test a really full file system")
	}
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=8m"); err != nil {
		t.Skipf("cannot mount a tmpfs (%v); the full-disk test needs mount rights", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	dir := filepath.Join(mnt, "db")
	s := openTest(t, Options{Dir: dir, Logger: testLogger(t)})
	var old []Page
	for no := range uint64(8) {
		old = append(old, page(1, no, 1))
	}
	mustWrite(t, s, old...)

	filler := filepath.Join(mnt, "filler")
	fill(t, filler)

	var err error
	written := 0
	for no := range uint64(4096) { // 16 MiB: more than the file system holds
		if err = s.Write(context.Background(), []Page{page(2, no, 1)}); err != nil {
			break
		}
		written++
	}
	if !errors.Is(err, ErrDiskFull) || !errors.Is(err, ErrNotPersisted) {
		t.Fatalf("Write on a full disk (after %d pages went in) = %v; want ErrDiskFull", written, err)
	}
	t.Logf("full after %d more pages: %v", written, err)
	for _, p := range old {
		wantPage(t, s, p)
	}
	if err := s.Write(context.Background(), []Page{page(3, 0, 1)}); !errors.Is(err, ErrDiskFull) {
		t.Fatalf("second Write on a full disk = %v; want ErrDiskFull", err)
	}
	for _, p := range old {
		wantPage(t, s, p)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	later := page(3, 1, 1)
	mustWrite(t, s, later)
	wantPage(t, s, later)
	for _, p := range old {
		wantPage(t, s, p)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openTest(t, Options{Dir: dir})
	for _, p := range append(old, later) {
		wantPage(t, s2, p)
	}
	for no := range uint64(written) {
		wantPage(t, s2, page(2, no, 1))
	}
}

// fill writes name until the file system is full.
func fill(t *testing.T, name string) {
	t.Helper()
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte{0xa5}, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v", name, err)
			}
			break
		}
	}
	// The last partial chunk may have left a few bytes; take them too.
	for {
		if _, err := f.Write([]byte{0}); err != nil {
			return
		}
	}
}
