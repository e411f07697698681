package raftstore

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"
)

// ErrDiskFull is wrapped (with syscall.ENOSPC) by a write the store refused
// because the file system under it has too little free space left.
var ErrDiskFull = errors.New("raftstore: disk full")

// A full disk must not reach pebble's commit: a commit that fails to write
// its WAL leaves pebble's commit pipeline unusable (pebble v1.1.5 reports it
// through Logger.Fatalf, and the process ends), and hashicorp/raft panics
// when it cannot save its term or vote. The store therefore checks the free
// space before every write and keeps a reserve:
//
//   - a reserve file of Options.Reserve bytes, allocated beside the store
//     (DIR.reserve), is deleted as soon as the free space drops under
//     releaseBelow, which gives the Raft log (and whatever else shares the
//     file system) that much room; it is allocated again once the free
//     space exceeds the reserve by 2 x releaseBelow;
//   - a log write (StoreLogs) is refused with ErrDiskFull while less than
//     logFloor plus its size is free: raft fails the write (a leader steps
//     down, a follower rejects the entries) and retries, and the store
//     stays usable;
//   - a stable write (term, vote) and a log truncation, a few bytes each,
//     are refused only under stableFloor, so that elections keep working
//     after log writes stopped; and a second, small reserve (lastReserve,
//     DIR.reserve.last) is deleted before one is refused, so that raft,
//     which panics when it cannot save its term, keeps going for thousands
//     of elections after someone else took the whole disk.
const (
	releaseBelow = 16 << 20
	logFloor     = 4 << 20
	stableFloor  = 256 << 10
	lastReserve  = 1 << 20
	// remakeEvery bounds how often a missing reserve is tried again.
	remakeEvery = 10 * time.Second
)

// space is the free-space guard of a store.
type space struct {
	dir     string // the file system checked
	path    string // the reserve file; "" when no reserve is kept
	size    int64
	free    func(dir string) (uint64, error)
	log     *slog.Logger
	mu      sync.Mutex
	held    bool      // the reserve file exists
	last    bool      // the last reserve file (path + ".last") exists
	tried   time.Time // the last attempt to allocate them
	statErr bool      // a failed statfs was logged
	refused bool      // a refusal was logged since the last write that had room
}

func statfsFree(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}

func newSpace(dir string, o Options, log *slog.Logger) *space {
	sp := &space{dir: dir, size: o.Reserve, free: o.freeSpace, log: log}
	if sp.free == nil {
		sp.free = statfsFree
	}
	if o.Reserve > 0 {
		sp.path = dir + ".reserve"
		if _, err := os.Stat(sp.path); err == nil {
			sp.held = true
		}
		if _, err := os.Stat(sp.path + ".last"); err == nil {
			sp.last = true
		}
	}
	return sp
}

// beforeOpen releases the reserve if the disk is nearly full, so that
// opening the database (which replays and flushes its WAL) has room.
func (sp *space) beforeOpen() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if free, err := sp.free(sp.dir); err == nil && free < releaseBelow {
		sp.release(free)
	}
}

// afterOpen allocates the reserve if it is missing and there is room.
func (sp *space) afterOpen() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.path == "" || sp.held && sp.last {
		return
	}
	free, err := sp.free(sp.dir)
	if err != nil {
		return
	}
	if free < uint64(sp.size+lastReserve)+2*releaseBelow {
		sp.tried = time.Now()
		sp.log.Warn("raftstore: no room for the disk reserve of the Raft log; it is made once there is",
			"reserve_bytes", sp.size, "free_bytes", free, "path", sp.path)
		return
	}
	sp.remake()
}

// room reports whether a write of n bytes may go to pebble: nil, or an
// error wrapping ErrDiskFull. floor is the free space it must leave.
func (sp *space) room(n int, floor uint64) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	free, err := sp.free(sp.dir)
	if err != nil {
		if !sp.statErr {
			sp.statErr = true
			sp.log.Warn("raftstore: cannot read the free space under the Raft log; writes go on unchecked", "dir", sp.dir, "err", err)
		}
		return nil
	}
	if free < releaseBelow && sp.held {
		sp.release(free)
		if free, err = sp.free(sp.dir); err != nil {
			return nil
		}
	}
	if free < floor+uint64(n) && floor == stableFloor && sp.last {
		sp.releaseLast(free)
		if free, err = sp.free(sp.dir); err != nil {
			return nil
		}
	}
	if free < floor+uint64(n) {
		if !sp.refused {
			sp.refused = true
			sp.log.Error("raftstore: the disk under the Raft log is full: the directory's writes are refused until there is room (free space under --data-dir)",
				"free_bytes", free, "dir", sp.dir)
		}
		return fmt.Errorf("%w: %d bytes free under %s, a %d-byte write needs %d: %w", ErrDiskFull, free, sp.dir, n, floor+uint64(n), syscall.ENOSPC)
	}
	if sp.refused && free >= logFloor {
		sp.refused = false
		sp.log.Info("raftstore: the disk under the Raft log has room again", "free_bytes", free)
	}
	if sp.path != "" && (!sp.held || !sp.last) && free >= uint64(sp.size+lastReserve)+2*releaseBelow && time.Since(sp.tried) >= remakeEvery {
		sp.remake()
	}
	return nil
}

// release deletes the reserve file. sp.mu is held.
func (sp *space) release(free uint64) {
	if !sp.held {
		return
	}
	if err := os.Remove(sp.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		sp.log.Error("raftstore: cannot delete the disk reserve", "path", sp.path, "err", err)
		return
	}
	sp.held = false
	sp.tried = time.Now()
	sp.log.Error("raftstore: the disk under the Raft log is nearly full: released its reserve, which gives the directory room to keep working; free space under --data-dir",
		"free_bytes", free, "released_bytes", sp.size, "path", sp.path)
}

// releaseLast deletes the last reserve file. sp.mu is held.
func (sp *space) releaseLast(free uint64) {
	if err := os.Remove(sp.path + ".last"); err != nil && !errors.Is(err, os.ErrNotExist) {
		sp.log.Error("raftstore: cannot delete the last disk reserve", "path", sp.path+".last", "err", err)
		return
	}
	sp.last = false
	sp.tried = time.Now()
	sp.log.Error("raftstore: the disk under the Raft log is full: released its last reserve so that the directory can still save its Raft term and vote; free space under --data-dir now",
		"free_bytes", free, "released_bytes", lastReserve, "path", sp.path+".last")
}

// remake allocates the missing reserve files. sp.mu is held.
func (sp *space) remake() {
	sp.tried = time.Now()
	for _, r := range []struct {
		path string
		size int64
		held *bool
	}{{sp.path + ".last", lastReserve, &sp.last}, {sp.path, sp.size, &sp.held}} {
		if *r.held {
			continue
		}
		tmp := r.path + ".tmp"
		err := allocate(tmp, r.size)
		if err == nil {
			err = os.Rename(tmp, r.path)
		}
		if err != nil {
			os.Remove(tmp)
			sp.log.Warn("raftstore: cannot make the disk reserve of the Raft log; tried again later", "path", r.path, "reserve_bytes", r.size, "err", err)
			return
		}
		*r.held = true
	}
	sp.log.Info("raftstore: disk reserve of the Raft log in place", "path", sp.path, "reserve_bytes", sp.size+lastReserve)
}

// allocate creates path with size bytes allocated on disk and synced.
func allocate(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = syscall.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, syscall.EOPNOTSUPP) {
		err = writeZeros(f, size)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func writeZeros(f *os.File, size int64) error {
	buf := make([]byte, 1<<20)
	for size > 0 {
		n := min(size, int64(len(buf)))
		if _, err := f.Write(buf[:n]); err != nil {
			return err
		}
		size -= n
	}
	return nil
}
