package raftstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble"
	"github.com/hashicorp/raft"

	"github.com/dsmkit/dsm/internal/pebblefs"
)

// ErrKeyNotFound is returned by Get and GetUint64 for a key that was never
// set. Its text is what hashicorp/raft checks for.
var ErrKeyNotFound = errors.New("not found")

// ErrCorrupt reports a stored record that cannot be decoded.
var ErrCorrupt = errors.New("raftstore: corrupt record")

// ErrClosed is returned by calls after Close.
var ErrClosed = errors.New("raftstore: closed")

const (
	prefixLog    = 'l'
	prefixStable = 's'
)

// Store is a raft.LogStore and raft.StableStore on pebble. It is safe for
// concurrent use.
type Store struct {
	db    *pebble.DB
	space *space
}

var (
	_ raft.LogStore    = (*Store)(nil)
	_ raft.StableStore = (*Store)(nil)
)

// Options of a store.
type Options struct {
	// Logger receives pebble's messages and the store's; nil discards them.
	Logger *slog.Logger
	// Reserve is the size in bytes of the disk reserve kept beside the
	// store (space.go); 0 keeps none.
	Reserve int64

	freeSpace func(dir string) (uint64, error) // tests; nil: statfs
}

// Open opens (creating if needed) the store in dir.
func Open(dir string, o Options) (*Store, error) {
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	sp := newSpace(dir, o, logger)
	sp.beforeOpen()
	pl := pebbleLogger{l: logger, opening: new(atomic.Bool)}
	pl.opening.Store(true)
	db, err := pebblefs.Open(dir, &pebble.Options{Logger: pl}) // a failed open leaves no file open
	pl.opening.Store(false)
	if err != nil {
		return nil, fmt.Errorf("raftstore: open %s: %w", dir, err)
	}
	sp.afterOpen()
	return &Store{db: db, space: sp}, nil
}

// Close flushes nothing (every write was already synced) and releases the
// database.
func (s *Store) Close() error { return s.db.Close() }

func logKey(index uint64) []byte {
	k := make([]byte, 9)
	k[0] = prefixLog
	binary.BigEndian.PutUint64(k[1:], index)
	return k
}

func stableKey(key []byte) []byte {
	k := make([]byte, 1+len(key))
	k[0] = prefixStable
	copy(k[1:], key)
	return k
}

// logBounds returns the key range holding every log entry.
func logBounds() (lower, upper []byte) {
	return []byte{prefixLog}, []byte{prefixLog + 1}
}

// FirstIndex returns the first index stored, 0 when the log is empty.
func (s *Store) FirstIndex() (uint64, error) { return s.edgeIndex(true) }

// LastIndex returns the last index stored, 0 when the log is empty.
func (s *Store) LastIndex() (uint64, error) { return s.edgeIndex(false) }

func (s *Store) edgeIndex(first bool) (uint64, error) {
	lo, hi := logBounds()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return 0, fmt.Errorf("raftstore: iterator: %w", err)
	}
	var ok bool
	if first {
		ok = it.First()
	} else {
		ok = it.Last()
	}
	var idx uint64
	if ok {
		k := it.Key()
		if len(k) != 9 {
			it.Close()
			return 0, fmt.Errorf("%w: log key of %d bytes", ErrCorrupt, len(k))
		}
		idx = binary.BigEndian.Uint64(k[1:])
	}
	if err := it.Close(); err != nil {
		return 0, fmt.Errorf("raftstore: iterator: %w", err)
	}
	return idx, nil
}

// GetLog reads the entry at index into log; raft.ErrLogNotFound when absent.
func (s *Store) GetLog(index uint64, log *raft.Log) error {
	v, closer, err := s.db.Get(logKey(index))
	if errors.Is(err, pebble.ErrNotFound) {
		return raft.ErrLogNotFound
	}
	if err != nil {
		return fmt.Errorf("raftstore: get log %d: %w", index, err)
	}
	defer closer.Close()
	if err := decodeLog(v, log); err != nil {
		return err
	}
	if log.Index != index {
		return fmt.Errorf("%w: entry under index %d says %d", ErrCorrupt, index, log.Index)
	}
	return nil
}

// StoreLog stores one entry, synced.
func (s *Store) StoreLog(log *raft.Log) error { return s.StoreLogs([]*raft.Log{log}) }

// StoreLogs stores entries in one synced batch: all or none of them are
// durable after a crash.
func (s *Store) StoreLogs(logs []*raft.Log) error {
	b := s.db.NewBatch()
	defer b.Close()
	var buf []byte
	for _, l := range logs {
		buf = encodeLog(buf[:0], l)
		if err := b.Set(logKey(l.Index), buf, nil); err != nil {
			return fmt.Errorf("raftstore: batch: %w", err)
		}
	}
	if err := s.space.room(b.Len(), logFloor); err != nil {
		return fmt.Errorf("raftstore: store logs: %w", err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("raftstore: store logs: %w", err)
	}
	return nil
}

// DeleteRange deletes the entries min through max inclusive, synced.
func (s *Store) DeleteRange(min, max uint64) error {
	if max < min {
		return nil
	}
	end := []byte{prefixLog + 1}
	if max != ^uint64(0) {
		end = logKey(max + 1)
	}
	if err := s.space.room(64, stableFloor); err != nil {
		return fmt.Errorf("raftstore: delete range [%d,%d]: %w", min, max, err)
	}
	if err := s.db.DeleteRange(logKey(min), end, pebble.Sync); err != nil {
		return fmt.Errorf("raftstore: delete range [%d,%d]: %w", min, max, err)
	}
	return nil
}

// Set stores a stable value, synced.
func (s *Store) Set(key, val []byte) error {
	if err := s.space.room(len(key)+len(val)+16, stableFloor); err != nil {
		return fmt.Errorf("raftstore: set: %w", err)
	}
	if err := s.db.Set(stableKey(key), val, pebble.Sync); err != nil {
		return fmt.Errorf("raftstore: set: %w", err)
	}
	return nil
}

// Get returns a copy of a stable value; ErrKeyNotFound when never set.
func (s *Store) Get(key []byte) ([]byte, error) {
	v, closer, err := s.db.Get(stableKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, ErrKeyNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("raftstore: get: %w", err)
	}
	defer closer.Close()
	return append([]byte(nil), v...), nil
}

// SetUint64 stores a stable counter, synced.
func (s *Store) SetUint64(key []byte, val uint64) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], val)
	return s.Set(key, b[:])
}

// GetUint64 returns a stable counter; 0 and ErrKeyNotFound when never set.
func (s *Store) GetUint64(key []byte) (uint64, error) {
	v, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: uint64 value of %d bytes", ErrCorrupt, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// Log entry encoding, version 1:
//
//	version u8 | index u64 | term u64 | type u8 | appendedAt unix nanos i64 |
//	len(data) uvarint | data | len(extensions) uvarint | extensions
const logVersion = 1

func encodeLog(buf []byte, l *raft.Log) []byte {
	buf = append(buf, logVersion)
	buf = binary.BigEndian.AppendUint64(buf, l.Index)
	buf = binary.BigEndian.AppendUint64(buf, l.Term)
	buf = append(buf, byte(l.Type))
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	buf = binary.BigEndian.AppendUint64(buf, uint64(at))
	buf = binary.AppendUvarint(buf, uint64(len(l.Data)))
	buf = append(buf, l.Data...)
	buf = binary.AppendUvarint(buf, uint64(len(l.Extensions)))
	buf = append(buf, l.Extensions...)
	return buf
}

func decodeLog(b []byte, l *raft.Log) error {
	const fixed = 1 + 8 + 8 + 1 + 8
	if len(b) < fixed {
		return fmt.Errorf("%w: log entry of %d bytes", ErrCorrupt, len(b))
	}
	if b[0] != logVersion {
		return fmt.Errorf("%w: log entry version %d", ErrCorrupt, b[0])
	}
	l.Index = binary.BigEndian.Uint64(b[1:])
	l.Term = binary.BigEndian.Uint64(b[9:])
	l.Type = raft.LogType(b[17])
	at := int64(binary.BigEndian.Uint64(b[18:]))
	l.AppendedAt = time.Time{}
	if at != 0 {
		l.AppendedAt = time.Unix(0, at)
	}
	rest := b[fixed:]
	var err error
	if l.Data, rest, err = readBytes(rest); err != nil {
		return err
	}
	if l.Extensions, rest, err = readBytes(rest); err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(rest))
	}
	return nil
}

func readBytes(b []byte) (field, rest []byte, err error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, nil, fmt.Errorf("%w: bad field length", ErrCorrupt)
	}
	b = b[k:]
	if n == 0 {
		return nil, b, nil
	}
	return append([]byte(nil), b[:n]...), b[n:], nil
}

// pebbleLogger sends pebble's messages to slog and decides what pebble's
// Fatalf calls do. While the database opens, a disk fault that pebble
// reports through Fatalf (the MANIFEST it cannot write while it creates or
// replays the database on a full disk) is logged and returns: pebble then
// returns the error, Open fails with it, and dsmd waits for free space
// instead of dying. Any other Fatalf, and every one once the database is
// open (a failed commit leaves pebble's commit pipeline unusable; a failed
// MANIFEST write leaves its state inconsistent), panics as pebble's own
// default logger exits: the free-space guard (space.go) keeps a full disk
// from getting that far.
type pebbleLogger struct {
	l       *slog.Logger
	opening *atomic.Bool
}

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug(fmt.Sprintf(format, args...), "component", "pebble")
}

// pebbleCommitFatal is the format pebble v1.1.5's DB.Apply passes to
// Fatalf when a commit failed.
const pebbleCommitFatal = "pebble: fatal commit error: %v"

func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if format != pebbleCommitFatal && p.opening.Load() {
		for _, a := range args {
			if e, ok := a.(error); ok && pebblefs.IsDiskFault(e) {
				p.l.Error("pebble failed on a disk fault", "err", msg, "component", "pebble")
				return
			}
		}
	}
	p.l.Error(msg, "component", "pebble")
	panic("raftstore: pebble fatal: " + msg)
}

var _ io.Closer = (*Store)(nil)
