// Package pagestore keeps the pages of durable regions on disk, in a
// pebble database of its own.
//
// # Why a database of its own
//
// The directory's Raft log (directory/internal/raftstore) is also pebble,
// but the page store is a separate instance in a separate directory:
//   - its fsync cadence (one per group commit of page write-backs) and its
//     compactions (pages are overwritten all the time) are independent of
//     the Raft log's;
//   - deleting a region's pages is one range delete that never touches the
//     Raft log;
//   - a page store that fills its disk, or stalls on compaction, cannot
//     stall the directory's commits.
//
// # Layout
//
// One record per page. The key is 'p', the region (4 bytes, big-endian)
// and the page number (8 bytes, big-endian), so a region's pages sort in
// page order and a region or a page range is one key range: overwriting a
// page is one Set, removing a region or a range is one DeleteRange. The
// value is a header of 11 bytes (format 1, the 16-bit tenure version, the
// data length as uint32, a CRC32-C over the first seven header bytes and
// the data) followed by the data. Page sizes are not assumed: each record
// carries its length. Every read decodes and checks the record; one that
// fails is an error wrapping ErrCorrupt that names the region and page.
//
// Tenure versions wrap: Newer compares them in serial arithmetic.
//
// # Group commit
//
// Write encodes its pages (copying the data) and queues them. One
// committer goroutine takes everything queued, up to Options.MaxBatchBytes
// (a single larger Write goes alone), builds one pebble batch, commits it
// with pebble.Sync and hands every caller of that batch the result: when
// Write returns nil, its pages survive a crash of the process or the
// machine. Batches are committed in queue order, which is the order of the
// Write calls; within a batch, of two records of one page the newer
// version is kept (the later on a tie). Across batches the later Write
// replaces the page whatever its version: the caller writes a page's
// versions in order. Deletes are queued like Writes and committed in
// batches of their own, so they order with the Writes around them. A Write
// whose ctx ends first returns ctx.Err(), but its pages are already queued
// and may still be committed. Enqueue is Write in two halves: it queues
// the pages and returns a wait for the outcome, so that a caller that must
// order the writes of a page made on several goroutines (dsmd's persist
// requests) queues them under its own lock and waits outside it, and they
// still share group commits. Stats counts batches, pages and bytes.
//
// # Disk faults
//
// A failed write or fsync of pebble's WAL, a full disk included, fails
// every Write of that batch with an error wrapping ErrNotPersisted, and
// ErrDiskFull too when the cause was ENOSPC or EDQUOT. Records committed
// before are unharmed and reads keep working.
//
// pebble v1.1.5 does not return such an error from Batch.Commit: DB.Apply
// passes it to Logger.Fatalf ("pebble: fatal commit error"), whose default
// implementation exits the process, and Apply returns nil if Fatalf
// returns. The failed batch has also been applied to the memtable, so
// reads of that DB would see it, and the WAL writer's error is sticky:
// every later commit of that DB fails. The store therefore gives pebble a
// logger whose Fatalf panics for a failed commit; the committer recovers
// that panic, fails the batch, and reopens the database: Close, then Open,
// which replays the WAL and so recovers every synced record and drops the
// failed batch from memory. The failed batch's pages may still reappear
// after a reopen or a restart if they reached the file before the fault:
// ErrNotPersisted means "not known to be durable", not "absent".
//
// Reopening for writing can itself fail on a full disk (replaying the WAL
// flushes it to an sstable). The database is then opened read-only, which
// replays the WAL into memory without writing, so reads keep working; each
// later batch first tries to reopen for writing, and succeeds once space
// has been freed. A disk fault pebble reports from a background flush or
// compaction (a failed MANIFEST write) is logged and makes the committer
// reopen the database before its next batch. Any other Fatalf (pebble's
// own invariants or corruption of its files) panics, as raftstore's does.
//
// One fault pebble v1.1.5 does not survive: when it switches to a new WAL
// (the memtable is full, every 32 MiB of writes, or one batch is larger than
// 16 MiB) and cannot close the old one, DB.rotateWAL panics while holding
// DB.mu. The committer recovers that panic too, but the database can then be
// neither closed nor reopened in this process: the store is wedged. The
// failed Write and every later one return an error wrapping ErrWedged and
// ErrNotPersisted, reads keep being served by the wedged database (they do
// not take DB.mu), and Close returns ErrWedged without closing it. A restart
// of the process recovers every synced record.
//
// Reopening takes the store's lock for writing, which waits for Gets and
// Scans in progress; a Scan's callback must therefore not call the store.
package pagestore
