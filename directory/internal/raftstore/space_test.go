package raftstore

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestDiskReserve drives the free-space guard with a free-space reading
// the test sets: the reserve is allocated at open, deleted when the disk
// is nearly full (and the write goes on), log writes are refused with
// ErrDiskFull (and ENOSPC) under the log floor while term and vote writes
// still go through, every write is refused under the stable floor, the
// stored entries stay readable throughout, and once the disk has room the
// writes are taken and the reserve is allocated again.
func TestDiskReserve(t *testing.T) {
	dir := t.TempDir() + "/raft"
	var free atomic.Uint64
	free.Store(1 << 40)
	var logs logBuffer
	s, err := Open(dir, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Reserve: 1 << 20,
		freeSpace: func(string) (uint64, error) { return free.Load(), nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	reserve := dir + ".reserve"
	var st syscall.Stat_t
	if err := syscall.Stat(reserve, &st); err != nil || st.Blocks*512 < 1<<20 {
		t.Fatalf("reserve after open: %v, %d bytes allocated; want 1 MiB", err, st.Blocks*512)
	}
	if err := syscall.Stat(reserve+".last", &st); err != nil || st.Blocks*512 < lastReserve {
		t.Fatalf("last reserve after open: %v, %d bytes allocated; want %d", err, st.Blocks*512, lastReserve)
	}
	if err := s.StoreLogs([]*raft.Log{entry(1), entry(2)}); err != nil {
		t.Fatal(err)
	}

	// Nearly full: the reserve goes, the write is taken.
	free.Store(10 << 20)
	if err := s.StoreLogs([]*raft.Log{entry(3)}); err != nil {
		t.Fatalf("a log write with 10 MiB free: %v", err)
	}
	if _, err := os.Stat(reserve); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the reserve is still there with 10 MiB free: %v", err)
	}
	if !strings.Contains(logs.String(), "released its reserve") {
		t.Fatalf("the release is not logged:\n%s", logs.String())
	}

	// Under the log floor: log writes refused, stable writes taken.
	free.Store(3 << 20)
	err = s.StoreLogs([]*raft.Log{entry(4)})
	if !errors.Is(err, ErrDiskFull) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a log write with 3 MiB free: %v; want ErrDiskFull and ENOSPC", err)
	}
	if last, err := s.LastIndex(); err != nil || last != 3 {
		t.Fatalf("LastIndex after a refused write: %d, %v; want 3", last, err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 7); err != nil {
		t.Fatalf("a term write with 3 MiB free: %v", err)
	}
	if err := s.DeleteRange(3, 3); err != nil {
		t.Fatalf("a truncation with 3 MiB free: %v", err)
	}
	if _, err := os.Stat(reserve + ".last"); err != nil {
		t.Fatalf("the last reserve went with 3 MiB free: %v", err)
	}

	// Under the stable floor: everything refused, reads served.
	free.Store(100 << 10)
	if err := s.SetUint64([]byte("CurrentTerm"), 8); !errors.Is(err, ErrDiskFull) {
		t.Fatalf("a term write with 100 KiB free: %v; want ErrDiskFull", err)
	}
	if _, err := os.Stat(reserve + ".last"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the last reserve is still there after a refused term write: %v", err)
	}
	if !strings.Contains(logs.String(), "released its last reserve") {
		t.Fatalf("the release of the last reserve is not logged:\n%s", logs.String())
	}
	if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 7 {
		t.Fatalf("term after the refused write: %d, %v; want 7", v, err)
	}
	var l raft.Log
	if err := s.GetLog(2, &l); err != nil || string(l.Data) != "data-2" {
		t.Fatalf("GetLog(2) on a full disk: %q, %v", l.Data, err)
	}
	if n := strings.Count(logs.String(), "the directory's writes are refused"); n != 1 {
		t.Fatalf("the refusal logged %d times, want once until there is room", n)
	}

	// Room again: writes taken; the reserve comes back (at most every
	// remakeEvery; the test does not wait for it).
	free.Store(1 << 40)
	s.space.mu.Lock()
	s.space.tried = time.Time{}
	s.space.mu.Unlock()
	if err := s.StoreLogs([]*raft.Log{entry(3), entry(4)}); err != nil {
		t.Fatalf("a log write once the disk has room: %v", err)
	}
	for _, r := range []string{reserve, reserve + ".last"} {
		if err := syscall.Stat(r, &st); err != nil || st.Blocks*512 < 1<<20 {
			t.Fatalf("%s once the disk has room: %v, %d bytes allocated; want 1 MiB", r, err, st.Blocks*512)
		}
	}
	if !strings.Contains(logs.String(), "has room again") {
		t.Fatalf("the end of the refusals is not logged:\n%s", logs.String())
	}
}

// TestReserveReleasedAtOpen: a store opened on a nearly full disk deletes
// its reserve before pebble replays its WAL; one opened without room for a
// reserve opens anyway and says so.
func TestReserveReleasedAtOpen(t *testing.T) {
	dir := t.TempDir() + "/raft"
	var free atomic.Uint64
	free.Store(1 << 40)
	fs := func(string) (uint64, error) { return free.Load(), nil }
	s, err := Open(dir, Options{Reserve: 1 << 20, freeSpace: fs})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := os.Stat(dir + ".reserve"); err != nil {
		t.Fatal(err)
	}
	free.Store(1 << 20)
	var logs logBuffer
	s, err = Open(dir, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Reserve: 1 << 20, freeSpace: fs})
	if err != nil {
		t.Fatalf("open on a nearly full disk: %v", err)
	}
	defer s.Close()
	if _, err := os.Stat(dir + ".reserve"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the reserve survived an open on a nearly full disk: %v", err)
	}
	if !strings.Contains(logs.String(), "released its reserve") || !strings.Contains(logs.String(), "no room for the disk reserve") {
		t.Fatalf("logs:\n%s", logs.String())
	}
}
