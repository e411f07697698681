package pagestore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble"
	"github.com/cockroachdb/pebble/vfs"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/pebblefs"
)

var (
	// ErrCorrupt is wrapped by the error of a read that found a stored record
	// failing its checks; the error names the region and page.
	ErrCorrupt = errors.New("pagestore: corrupt record")
	// ErrNotPersisted is wrapped by the error of a Write or delete whose
	// batch failed to commit: it may or may not be on disk after a restart.
	ErrNotPersisted = errors.New("pagestore: write not persisted")
	// ErrDiskFull is wrapped, beside ErrNotPersisted, when the cause was a
	// full file system (ENOSPC).
	ErrDiskFull = errors.New("pagestore: disk full")
	// ErrWedged is wrapped, beside ErrNotPersisted, by every Write after
	// pebble panicked while holding its own lock (a WAL it could not close
	// while switching to a new one): that database cannot be closed or
	// reopened in this process, only read. A restart of the process
	// recovers every synced record.
	ErrWedged = errors.New("pagestore: pebble wedged by a disk fault; writes need a restart of the process")
	// ErrClosed is returned by calls after Close.
	ErrClosed = errors.New("pagestore: closed")
)

// DefaultMaxBatchBytes is the group commit cap when Options leaves it 0.
const DefaultMaxBatchBytes = 4 << 20

// memTableSize keeps every batch of up to several MaxBatchBytes under
// pebble's large-batch threshold (half the memtable), so that batches go
// through the ordinary WAL path.
const memTableSize = 32 << 20

// Options configure Open.
type Options struct {
	// Dir is the directory of the pebble database; it is created if needed.
	Dir string
	// FS is the file system; nil means vfs.Default. Tests wrap it to inject
	// faults.
	FS vfs.FS
	// MaxBatchBytes caps the encoded bytes of one group commit. A single
	// Write larger than the cap is committed alone. 0 means
	// DefaultMaxBatchBytes.
	MaxBatchBytes int
	// Logger receives the store's and pebble's messages; nil discards them.
	Logger *slog.Logger
}

// Page is one stored page.
type Page struct {
	Region  ids.RegionID
	No      uint64
	Version uint16
	Data    []byte
}

// Stats are counters since Open.
type Stats struct {
	Batches uint64 // batches committed with Sync
	Pages   uint64 // pages in those batches, after same-page merging
	Bytes   uint64 // encoded value bytes in those batches
	Writes  uint64 // Write calls whose batch committed
	Failed  uint64 // batches whose commit failed
	Reopens uint64 // times the database was closed and opened again
}

// Store keeps pages durably in a pebble database of its own. It is safe
// for concurrent use.
type Store struct {
	opts Options
	log  *slog.Logger
	plog *pebbleLogger

	// mu guards db, readOnly and dbErr. The committer goroutine is the only
	// writer of them (and Close, after the committer has exited); readers
	// hold mu.RLock while they use db.
	mu       sync.RWMutex
	db       *pebble.DB // nil after Close, or when no open succeeded
	readOnly bool       // db was opened read-only after a failed reopen
	dbErr    error      // why db is read-only or nil
	// wedged, once set, is the panic that left db unusable for writes; db
	// is kept for reads and never closed.
	wedged error
	closed bool

	qmu     sync.Mutex
	queue   []*request // in the order of the Write and delete calls
	qclosed bool
	wake    chan struct{} // capacity 1: the queue may be non-empty
	done    chan struct{} // closed when the committer has exited

	batches, pages, bytes, writes, failed, reopens atomic.Uint64
}

// request is one Write or delete waiting for the committer.
type request struct {
	recs []record
	size int
	// del marks a range delete of [lo, hi); it is always committed in a
	// batch of its own, so that it orders with the Writes around it.
	del    bool
	lo, hi []byte
	result chan error // capacity 1
}

// record is one encoded page of a request.
type record struct {
	key, val []byte
	version  uint16
}

// Open opens (creating if needed) the store in opts.Dir and starts its
// committer.
func Open(opts Options) (*Store, error) {
	if opts.FS == nil {
		opts.FS = vfs.Default
	}
	if opts.MaxBatchBytes <= 0 {
		opts.MaxBatchBytes = DefaultMaxBatchBytes
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{
		opts: opts,
		log:  log,
		plog: &pebbleLogger{log: log},
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
	db, err := s.openDB(false)
	if err != nil {
		return nil, err
	}
	s.db = db
	go s.run()
	return s, nil
}

func (s *Store) openDB(readOnly bool) (*pebble.DB, error) {
	db, err := pebblefs.Open(s.opts.Dir, &pebble.Options{ // a failed open leaves no file open
		FS:           s.opts.FS,
		Logger:       s.plog,
		MemTableSize: memTableSize,
		ReadOnly:     readOnly,
	})
	if err != nil {
		return nil, fmt.Errorf("pagestore: open %s: %w", s.opts.Dir, err)
	}
	return db, nil
}

// Close commits what is queued, stops the committer and closes the
// database. Calls after Close return ErrClosed.
func (s *Store) Close() error {
	s.qmu.Lock()
	if s.qclosed {
		s.qmu.Unlock()
		return ErrClosed
	}
	s.qclosed = true
	s.qmu.Unlock()
	s.signal()
	<-s.done

	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.wedged != nil {
		s.db = nil
		return fmt.Errorf("pagestore: close: database left open: %w: %w", ErrWedged, s.wedged)
	}
	if s.db == nil {
		return nil
	}
	err := s.closeDB()
	if err != nil {
		return fmt.Errorf("pagestore: close: %w", err)
	}
	return nil
}

// closeDB closes s.db and clears it. s.mu must be held.
func (s *Store) closeDB() error {
	db := s.db
	s.db = nil
	return db.Close()
}

// Stats returns the counters.
func (s *Store) Stats() Stats {
	return Stats{
		Batches: s.batches.Load(),
		Pages:   s.pages.Load(),
		Bytes:   s.bytes.Load(),
		Writes:  s.writes.Load(),
		Failed:  s.failed.Load(),
		Reopens: s.reopens.Load(),
	}
}

// Write stores pages and returns once they are in a pebble batch committed
// with Sync, together with the pages of other Writes queued at the same
// time. Writes are committed in the order of the calls; within one batch,
// of two records of the same page the one with the newer version (Newer)
// is kept, the later one on a tie. Across batches the later Write replaces
// the page whatever its version.
//
// The data is copied before Write returns. When ctx ends first, Write
// returns ctx.Err() and the pages may still be committed. An error
// wrapping ErrNotPersisted (and ErrDiskFull for ENOSPC, ErrWedged when
// writes need a restart of the process) means the batch failed; its pages
// may or may not be found after a reopen or a restart, and the earlier
// records are unharmed.
func (s *Store) Write(ctx context.Context, pages []Page) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	wait, err := s.Enqueue(pages)
	if err != nil {
		return err
	}
	return wait(ctx)
}

// Enqueue is the first half of Write: it checks and encodes pages (copying
// the data) and queues them, and returns at once. Calls of Enqueue and
// Write are committed in the order they were queued, so a caller that
// must order the writes of a page across goroutines queues them under its
// own lock and waits outside it. wait returns what Write would: nil once
// the batch holding the pages is committed with Sync, ctx.Err() when ctx
// ends first (the pages may still be committed), an error wrapping
// ErrNotPersisted when the batch failed. wait may be called once.
func (s *Store) Enqueue(pages []Page) (wait func(ctx context.Context) error, err error) {
	if len(pages) == 0 {
		return func(context.Context) error { return nil }, nil
	}
	size := 0
	for _, p := range pages {
		if len(p.Data) > MaxPageBytes {
			return nil, fmt.Errorf("pagestore: region %d page %d: %d bytes, at most %d", p.Region, p.No, len(p.Data), MaxPageBytes)
		}
		size += keyLen + headerLen + len(p.Data)
	}
	buf := make([]byte, 0, size)
	req := &request{recs: make([]record, len(pages)), size: size, result: make(chan error, 1)}
	for i, p := range pages {
		k := len(buf)
		buf = appendKey(buf, p.Region, p.No)
		v := len(buf)
		buf = appendRecord(buf, p.Version, p.Data)
		req.recs[i] = record{key: buf[k:v:v], val: buf[v:len(buf):len(buf)], version: p.Version}
	}
	if err := s.enqueue(req); err != nil {
		return nil, err
	}
	return req.wait, nil
}

// DeleteRange removes pages from through to-1 of region with one synced
// range delete, ordered with the Writes around it.
func (s *Store) DeleteRange(region ids.RegionID, from, to uint64) error {
	if to <= from {
		return nil
	}
	return s.submit(context.Background(), &request{del: true, lo: pageKey(region, from), hi: pageKey(region, to), result: make(chan error, 1)})
}

// DeleteRegion removes every page of region with one synced range delete.
func (s *Store) DeleteRegion(region ids.RegionID) error {
	lo, hi := regionBounds(region)
	return s.submit(context.Background(), &request{del: true, lo: lo, hi: hi, result: make(chan error, 1)})
}

func (s *Store) submit(ctx context.Context, req *request) error {
	if err := s.enqueue(req); err != nil {
		return err
	}
	return req.wait(ctx)
}

// enqueue queues req for the committer.
func (s *Store) enqueue(req *request) error {
	s.qmu.Lock()
	if s.qclosed {
		s.qmu.Unlock()
		return ErrClosed
	}
	s.queue = append(s.queue, req)
	s.qmu.Unlock()
	s.signal()
	return nil
}

// wait waits for req's result or ctx.
func (req *request) wait(ctx context.Context) error {
	select {
	case err := <-req.result:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Store) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run is the committer: it takes the queued requests, up to MaxBatchBytes,
// commits them as one synced batch and hands every request the result.
func (s *Store) run() {
	defer close(s.done)
	for {
		s.qmu.Lock()
		if len(s.queue) == 0 {
			closed := s.qclosed
			s.qmu.Unlock()
			if closed {
				return
			}
			<-s.wake
			continue
		}
		n, size := 1, s.queue[0].size
		if !s.queue[0].del {
			for n < len(s.queue) && !s.queue[n].del && size+s.queue[n].size <= s.opts.MaxBatchBytes {
				size += s.queue[n].size
				n++
			}
		}
		reqs := s.queue[:n:n]
		s.queue = s.queue[n:]
		if len(s.queue) == 0 {
			s.queue = nil
		}
		s.qmu.Unlock()

		err := s.commit(reqs)
		for _, r := range reqs {
			r.result <- err
		}
	}
}

// commit writes reqs as one batch committed with Sync. After a failed
// commit it reopens the database before returning.
func (s *Store) commit(reqs []*request) error {
	if err := s.ensureWritable(); err != nil {
		s.failed.Add(1)
		return notPersisted(err)
	}
	b := s.db.NewBatch()
	defer b.Close()
	var pages, bytes uint64
	err := func() error {
		if reqs[0].del {
			return b.DeleteRange(reqs[0].lo, reqs[0].hi, nil)
		}
		for _, r := range merge(reqs) {
			if err := b.Set(r.key, r.val, nil); err != nil {
				return err
			}
			pages++
			bytes += uint64(len(r.val))
		}
		return nil
	}()
	if err != nil {
		// Building the batch touched no file: nothing to reopen.
		s.failed.Add(1)
		return notPersisted(err)
	}
	if wedged, err := s.commitBatch(b); err != nil {
		s.failed.Add(1)
		if wedged {
			s.log.Error("pebble panicked in a commit; the database takes no more writes until the process restarts", "err", err, "pages", pages)
			s.mu.Lock()
			s.wedged = err
			s.mu.Unlock()
			return notPersisted(fmt.Errorf("%w: %w", ErrWedged, err))
		}
		s.log.Warn("batch commit failed; reopening the database", "err", err, "pages", pages)
		_ = s.reopen()
		return notPersisted(err)
	}
	s.batches.Add(1)
	s.pages.Add(pages)
	s.bytes.Add(bytes)
	if !reqs[0].del {
		s.writes.Add(uint64(len(reqs)))
	}
	return nil
}

// merge returns the records of reqs with one record per page: the newer
// version, or the later record on a tie.
func merge(reqs []*request) []record {
	n := 0
	for _, r := range reqs {
		n += len(r.recs)
	}
	out := make([]record, 0, n)
	at := make(map[string]int, n)
	for _, r := range reqs {
		for _, rec := range r.recs {
			i, ok := at[string(rec.key)]
			if !ok {
				at[string(rec.key)] = len(out)
				out = append(out, rec)
				continue
			}
			if !Newer(out[i].version, rec.version) {
				out[i] = rec
			}
		}
	}
	return out
}

// commitBatch commits b with Sync. pebble v1.1.5 reports a failed WAL write
// or fsync through Logger.Fatalf, which pebbleLogger turns into a
// commitFailure panic recovered here: no lock of pebble's is held then, and
// the database can be closed and reopened. pebble also panics with a bare
// error, among others when it cannot close the old WAL while switching to a
// new one (DB.rotateWAL), and then with DB.mu held: that database can
// neither be closed nor reopened in this process, so such a panic wedges
// the store (wedged is true). A panic that is not an error is not ours to
// handle.
func (s *Store) commitBatch(b *pebble.Batch) (wedged bool, err error) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		switch v := r.(type) {
		case commitFailure:
			err = v.err
		case error:
			err, wedged = v, true
		default:
			panic(r)
		}
	}()
	return false, b.Commit(pebble.Sync)
}

// ensureWritable reopens the database when a commit failed before, pebble
// reported a disk fault in the background, or it is open read-only.
func (s *Store) ensureWritable() error {
	if s.wedged != nil {
		return fmt.Errorf("%w: %w", ErrWedged, s.wedged)
	}
	if s.db != nil && !s.readOnly && !s.plog.faulted() {
		return nil
	}
	return s.reopen()
}

// reopen closes the database and opens it again for writing, which
// recovers every synced record from the WAL and drops what a failed commit
// left in the memtable. When that fails (a full disk may not leave room
// for a new WAL or MANIFEST), it opens the database read-only so that
// reads keep working, and the next batch tries again.
func (s *Store) reopen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reopens.Add(1)
	if s.db != nil {
		if err := s.closeDB(); err != nil {
			s.log.Warn("close before reopen", "err", err)
		}
	}
	s.plog.clearFault()
	db, err := s.openDB(false)
	if err == nil {
		s.db, s.readOnly, s.dbErr = db, false, nil
		s.log.Info("database reopened for writing", "dir", s.opts.Dir)
		return nil
	}
	s.plog.clearFault()
	s.log.Warn("reopen for writing failed; reads go to a read-only open", "err", err)
	ro, rerr := s.openDB(true)
	if rerr != nil {
		s.db, s.readOnly, s.dbErr = nil, false, errors.Join(err, rerr)
		return s.dbErr
	}
	s.db, s.readOnly, s.dbErr = ro, true, err
	return err
}

func notPersisted(err error) error {
	if pebblefs.IsDiskFull(err) {
		return fmt.Errorf("%w: %w: %w", ErrNotPersisted, ErrDiskFull, err)
	}
	return fmt.Errorf("%w: %w", ErrNotPersisted, err)
}

// Get returns the version and a copy of the data of one page; ok is false
// when the page is not stored. A record failing its checks is an error
// wrapping ErrCorrupt.
func (s *Store) Get(region ids.RegionID, no uint64) (version uint16, data []byte, ok bool, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.readable(); err != nil {
		return 0, nil, false, err
	}
	v, closer, err := s.db.Get(pageKey(region, no))
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil, false, nil
	}
	if err != nil {
		return 0, nil, false, fmt.Errorf("pagestore: get region %d page %d: %w", region, no, err)
	}
	defer closer.Close()
	version, data, err = decodeRecord(v)
	if err != nil {
		return 0, nil, false, corrupt(region, no, err)
	}
	return version, append([]byte(nil), data...), true, nil
}

// Scan calls fn for every stored page from through to-1 of region, in page
// order, with a copy of its data; an error from fn ends the scan and is
// returned. fn must not call the store's methods: Scan holds a read lock
// that a reopen after a failed commit waits for, and a Get inside fn would
// wait behind that reopen.
func (s *Store) Scan(region ids.RegionID, from, to uint64, fn func(Page) error) error {
	if to <= from {
		return nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.readable(); err != nil {
		return err
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: pageKey(region, from), UpperBound: pageKey(region, to)})
	if err != nil {
		return fmt.Errorf("pagestore: scan region %d: %w", region, err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		r, no, err := decodeKey(it.Key())
		if err == nil && r != region {
			err = fmt.Errorf("%w: key of region %d in region %d", ErrCorrupt, r, region)
		}
		if err != nil {
			it.Close()
			return err
		}
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return fmt.Errorf("pagestore: scan region %d page %d: %w", region, no, err)
		}
		version, data, err := decodeRecord(v)
		if err != nil {
			it.Close()
			return corrupt(region, no, err)
		}
		if err := fn(Page{Region: region, No: no, Version: version, Data: append([]byte(nil), data...)}); err != nil {
			it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("pagestore: scan region %d: %w", region, err)
	}
	return nil
}

// readable reports why reads cannot be served. s.mu must be held.
func (s *Store) readable() error {
	if s.closed {
		return ErrClosed
	}
	if s.db == nil {
		return fmt.Errorf("pagestore: database not open: %w", s.dbErr)
	}
	return nil
}

func corrupt(region ids.RegionID, no uint64, err error) error {
	return fmt.Errorf("%w: region %d page %d: %w", ErrCorrupt, region, no, err)
}
