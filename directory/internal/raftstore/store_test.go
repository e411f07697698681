package raftstore

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func entry(i uint64) *raft.Log {
	return &raft.Log{
		Index: i, Term: i/10 + 1, Type: raft.LogCommand,
		Data:       []byte(fmt.Sprintf("data-%d", i)),
		Extensions: []byte(fmt.Sprintf("ext-%d", i)),
		AppendedAt: time.Unix(1700000000, int64(i)).UTC(),
	}
}

func TestEmptyStore(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	if i, err := s.FirstIndex(); err != nil || i != 0 {
		t.Fatalf("FirstIndex on empty = %d, %v", i, err)
	}
	if i, err := s.LastIndex(); err != nil || i != 0 {
		t.Fatalf("LastIndex on empty = %d, %v", i, err)
	}
	var l raft.Log
	if err := s.GetLog(1, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog missing: %v", err)
	}
	// raft compares these texts literally.
	if _, err := s.Get([]byte("CurrentTerm")); err == nil || err.Error() != "not found" {
		t.Fatalf("Get missing: %v", err)
	}
	if v, err := s.GetUint64([]byte("CurrentTerm")); err == nil || err.Error() != "not found" || v != 0 {
		t.Fatalf("GetUint64 missing: %d, %v", v, err)
	}
	// DeleteRange on an empty store is harmless.
	if err := s.DeleteRange(1, 10); err != nil {
		t.Fatal(err)
	}
}

func TestLogs(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	if err := s.StoreLog(entry(1)); err != nil {
		t.Fatal(err)
	}
	var batch []*raft.Log
	for i := uint64(2); i <= 300; i++ {
		batch = append(batch, entry(i))
	}
	if err := s.StoreLogs(batch); err != nil {
		t.Fatal(err)
	}
	// Index 256 crosses a byte boundary: big-endian keys must still sort.
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if first != 1 || last != 300 {
		t.Fatalf("first %d last %d, want 1 300", first, last)
	}
	for _, i := range []uint64{1, 255, 256, 257, 300} {
		var got raft.Log
		if err := s.GetLog(i, &got); err != nil {
			t.Fatal(err)
		}
		want := entry(i)
		if got.Index != want.Index || got.Term != want.Term || got.Type != want.Type ||
			string(got.Data) != string(want.Data) || string(got.Extensions) != string(want.Extensions) ||
			!got.AppendedAt.Equal(want.AppendedAt) {
			t.Fatalf("entry %d: got %+v want %+v", i, got, want)
		}
	}
	// Entry without data, extensions or timestamp round-trips as such.
	if err := s.StoreLog(&raft.Log{Index: 301, Term: 9, Type: raft.LogNoop}); err != nil {
		t.Fatal(err)
	}
	var noop raft.Log
	if err := s.GetLog(301, &noop); err != nil || noop.Data != nil || noop.Extensions != nil || !noop.AppendedAt.IsZero() || noop.Type != raft.LogNoop {
		t.Fatalf("noop entry %+v, %v", noop, err)
	}
	// Compaction from the front, as raft does after a snapshot.
	if err := s.DeleteRange(1, 100); err != nil {
		t.Fatal(err)
	}
	first, _ = s.FirstIndex()
	if first != 101 {
		t.Fatalf("first after compaction %d, want 101", first)
	}
	var l raft.Log
	if err := s.GetLog(100, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("compacted entry: %v", err)
	}
	// Truncation of the tail, as raft does on a conflicting append.
	if err := s.DeleteRange(251, 301); err != nil {
		t.Fatal(err)
	}
	last, _ = s.LastIndex()
	if last != 250 {
		t.Fatalf("last after truncation %d, want 250", last)
	}
	if err := s.DeleteRange(0, ^uint64(0)); err != nil {
		t.Fatal(err)
	}
	if first, _ = s.FirstIndex(); first != 0 {
		t.Fatalf("store not empty after deleting everything: first %d", first)
	}
	// Stable keys live in the same database and are untouched by log ranges.
	if err := s.SetUint64([]byte("CurrentTerm"), 7); err != nil {
		t.Fatal(err)
	}
	if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 7 {
		t.Fatalf("GetUint64 = %d, %v", v, err)
	}
	if err := s.Set([]byte("LastVoteCand"), []byte("n3")); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get([]byte("LastVoteCand")); err != nil || string(v) != "n3" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	if first, _ = s.FirstIndex(); first != 0 {
		t.Fatal("stable keys leak into the log index")
	}
}

func TestDecodeRejectsCorruption(t *testing.T) {
	good := encodeLog(nil, entry(5))
	var l raft.Log
	if err := decodeLog(good, &l); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"empty":     nil,
		"short":     good[:10],
		"version":   append([]byte{9}, good[1:]...),
		"truncated": good[:len(good)-1],
		"trailing":  append(append([]byte{}, good...), 0),
		"length":    append(append([]byte{}, good[:26]...), 0xff, 0xff, 0xff, 0xff, 0x0f),
	} {
		if err := decodeLog(b, &l); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

func FuzzDecodeLog(f *testing.F) {
	f.Add(encodeLog(nil, entry(5)))
	f.Add(encodeLog(nil, &raft.Log{Index: 1}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var l raft.Log
		if err := decodeLog(b, &l); err != nil {
			return
		}
		again := encodeLog(nil, &l)
		var l2 raft.Log
		if err := decodeLog(again, &l2); err != nil || l2.Index != l.Index || string(l2.Data) != string(l.Data) {
			t.Fatalf("re-encoding does not round-trip: %v", err)
		}
	})
}

// TestKillDuringWrites runs a writer process that appends batches and
// reports each batch after StoreLogs returns, kills it with SIGKILL in the
// middle, and checks that the reopened store has every reported entry and a
// contiguous, decodable log.
const writerEnv = "RAFTSTORE_TEST_WRITER"

func TestMain(m *testing.M) {
	if dir := os.Getenv(writerEnv); dir != "" {
		runWriter(dir)
		return
	}
	os.Exit(m.Run())
}

func runWriter(dir string) {
	s, err := Open(dir, Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// Stop when the test process goes away (stdin is a pipe from it).
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()
	next, _ := s.LastIndex()
	next++
	for term := uint64(1); ; term++ {
		var batch []*raft.Log
		for range 16 {
			batch = append(batch, entry(next))
			next++
		}
		if err := s.StoreLogs(batch); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if err := s.SetUint64([]byte("CurrentTerm"), term); err != nil {
			os.Exit(2)
		}
		fmt.Printf("%d %d\n", next-1, term)
	}
}

func TestKillDuringWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	dir := filepath.Join(t.TempDir(), "store")
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), writerEnv+"="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(out)
		var lastIdx, lastTerm uint64
		for range 50 + 37*round {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("writer: %v", err)
			}
			f := strings.Fields(line)
			lastIdx, _ = strconv.ParseUint(f[0], 10, 64)
			lastTerm, _ = strconv.ParseUint(f[1], 10, 64)
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()

		s := open(t, dir)
		first, _ := s.FirstIndex()
		last, _ := s.LastIndex()
		if first != 1 || last < lastIdx {
			t.Fatalf("round %d: store has [%d, %d], writer had stored up to %d", round, first, last, lastIdx)
		}
		for i := first; i <= last; i++ {
			var l raft.Log
			if err := s.GetLog(i, &l); err != nil {
				t.Fatalf("round %d: entry %d of [%d, %d]: %v", round, i, first, last, err)
			}
			if string(l.Data) != fmt.Sprintf("data-%d", i) {
				t.Fatalf("round %d: entry %d holds %q", round, i, l.Data)
			}
		}
		if term, err := s.GetUint64([]byte("CurrentTerm")); err != nil || term < lastTerm {
			t.Fatalf("round %d: term %d, %v; writer had stored %d", round, term, err, lastTerm)
		}
		s.Close()
	}
}
