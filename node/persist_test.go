package node

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/vfs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dsmkit/dsm/internal/ids"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
	"github.com/dsmkit/dsm/node/pagestore"
)

// walFaultFS fails every write and sync of pebble's WAL files with err
// while err is set: pagestore's disk-fault path (a failed commit), as a
// full disk shows it. (pebble's errorfs does not inject on SyncData and
// SyncTo, which the WAL writer calls; see pagestore's helpers_test.go.)
type walFaultFS struct {
	vfs.FS
	mu  sync.Mutex
	err error
}

func (f *walFaultFS) set(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

func (f *walFaultFS) check(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return &os.PathError{Op: "injected", Path: name, Err: f.err}
	}
	return nil
}

func (f *walFaultFS) Create(name string) (vfs.File, error) {
	file, err := f.FS.Create(name)
	return f.wrap(name, file), err
}

func (f *walFaultFS) ReuseForWrite(oldname, newname string) (vfs.File, error) {
	file, err := f.FS.ReuseForWrite(oldname, newname)
	return f.wrap(newname, file), err
}

func (f *walFaultFS) OpenReadWrite(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	file, err := f.FS.OpenReadWrite(name, opts...)
	return f.wrap(name, file), err
}

func (f *walFaultFS) wrap(name string, file vfs.File) vfs.File {
	if file == nil || !strings.HasSuffix(name, ".log") {
		return file
	}
	return &walFaultFile{File: file, fs: f, name: name}
}

type walFaultFile struct {
	vfs.File
	fs   *walFaultFS
	name string
}

func (f *walFaultFile) Write(p []byte) (int, error) {
	if err := f.fs.check(f.name); err != nil {
		return 0, err
	}
	return f.File.Write(p)
}

func (f *walFaultFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.fs.check(f.name); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}

func (f *walFaultFile) Sync() error {
	if err := f.fs.check(f.name); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f *walFaultFile) SyncData() error {
	if err := f.fs.check(f.name); err != nil {
		return err
	}
	return f.File.SyncData()
}

func (f *walFaultFile) SyncTo(length int64) (bool, error) {
	if err := f.fs.check(f.name); err != nil {
		return false, err
	}
	return f.File.SyncTo(length)
}

// placed names the home and the backups of page p of region r in m's
// engine's current view.
func placed(t *testing.T, m testMember, r ids.RegionID, p ids.PageNo) (home ids.NodeID, backups []ids.NodeID) {
	t.Helper()
	es := m.n.eng
	re, err := es.get(r)
	if err != nil {
		t.Fatal(err)
	}
	es.mu.RLock()
	defer es.mu.RUnlock()
	pm := re.last
	home, _ = pm.nodeOf(re.chains.homeOf(pm)(p))
	for _, b := range re.chains.backupsOf(pm)(p) {
		n, _ := pm.nodeOf(b)
		backups = append(backups, n)
	}
	return home, backups
}

// storedPages lists what node m's page store holds of region r.
func storedPages(t *testing.T, m testMember, r ids.RegionID) map[uint64]pagestore.Page {
	t.Helper()
	out := map[uint64]pagestore.Page{}
	err := m.n.pages.Scan(r, 0, 1<<40, func(p pagestore.Page) error {
		out[p.No] = p
		return nil
	})
	if err != nil {
		t.Fatalf("n%d: scan of region %v: %v", m.n.cfg.ID, r, err)
	}
	return out
}

// TestDurableSyncPersists runs the persist request of a durable region's
// Sync on three in-process nodes (backups=1): the page store of the home
// and of the backup hold the written pages at the version this node
// released, and the third node's holds nothing; a memory region's Sync
// writes nothing to any store; a full disk at the backup fails the Sync
// with an error naming the backup and the cause, while the previously
// stored pages stay intact and reads are served; the next Sync after the
// disk is freed persists the pages; deleting the region empties every
// store of its pages.
func TestDurableSyncPersists(t *testing.T) {
	faults := map[int]*walFaultFS{}
	ms := startClusterOpts(t, 3, func(i int, _ *Config) Options {
		f := &walFaultFS{FS: vfs.Default}
		faults[i] = f
		return Options{PageStoreFS: f}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const pages = 8
	rid, mid, home, backup := durableAndMemory(ctx, t, ms, pages)
	member := func(id ids.NodeID) testMember { return ms[id-1] }
	t.Logf("home %v, backup %v", home, backup)

	// The writer is the node that is neither home nor backup, so that
	// both the persist request and the persist-copies cross the network.
	var w testMember
	for _, m := range ms {
		if id := ids.NodeID(m.n.cfg.ID); id != home && id != backup {
			w = m
		}
	}
	t.Logf("writer n%d", w.n.cfg.ID)
	write := func(region string, round int) [][]byte {
		t.Helper()
		var want [][]byte
		for p := range uint64(pages) {
			data := bytes.Repeat([]byte(fmt.Sprintf("%s round %d page %d;", region, round, p)), 4096)[:4096]
			if _, err := w.adm.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{Region: region, Offset: p << 12, Data: data}); err != nil {
				t.Fatalf("write %s page %d: %v", region, p, err)
			}
			want = append(want, data)
		}
		return want
	}
	// released writes the writer's Modified pages back (the first half
	// of a Sync) and returns the versions its engine released.
	released := func() map[ids.PageNo]uint16 {
		t.Helper()
		if _, err := w.n.cache.Flush(ctx, rid, 0, pages); err != nil {
			t.Fatal(err)
		}
		out := map[ids.PageNo]uint16{}
		for _, p := range w.n.persist.recorded(rid, 0, pages) {
			out[p.No] = p.Version
		}
		if len(out) != pages {
			t.Fatalf("the writer recorded %v released pages; want %d", out, pages)
		}
		return out
	}
	wantStored := func(m testMember, want [][]byte, vers map[ids.PageNo]uint16) {
		t.Helper()
		got := storedPages(t, m, rid)
		for p := range uint64(pages) {
			g, ok := got[p]
			switch {
			case !ok:
				t.Fatalf("n%d's store lacks page %d", m.n.cfg.ID, p)
			case !bytes.Equal(g.Data, want[p]):
				t.Fatalf("n%d's store holds page %d as %.40q..., want %.40q...", m.n.cfg.ID, p, g.Data, want[p])
			case vers != nil && g.Version != vers[ids.PageNo(p)]:
				t.Fatalf("n%d's store holds page %d at version %d, the writer released %d", m.n.cfg.ID, p, g.Version, vers[ids.PageNo(p)])
			}
		}
	}

	// Round 1: written, synced, on disk at the home and the backup.
	want1 := write("d", 1)
	vers1 := released()
	if _, err := w.cli.Sync(ctx, &dsmpb.SyncRequest{Region: "d"}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	wantStored(member(home), want1, vers1)
	wantStored(member(backup), want1, vers1)
	for _, m := range ms {
		if id := ids.NodeID(m.n.cfg.ID); id != home && id != backup {
			if got := storedPages(t, m, rid); len(got) != 0 {
				t.Fatalf("n%d, neither home nor backup, stores %d pages", id, len(got))
			}
		}
	}
	if left := w.n.persist.recorded(rid, 0, pages); len(left) != 0 {
		t.Fatalf("after a successful Sync the writer still records %v", left)
	}

	// A memory region's Sync writes nothing to any store.
	var before []pagestore.Stats
	for _, m := range ms {
		before = append(before, m.n.pages.Stats())
	}
	write("m", 1)
	if _, err := w.cli.Sync(ctx, &dsmpb.SyncRequest{Region: "m"}); err != nil {
		t.Fatalf("Sync of the memory region: %v", err)
	}
	for i, m := range ms {
		if st := m.n.pages.Stats(); st != before[i] || len(storedPages(t, m, mid)) != 0 {
			t.Fatalf("n%d: a memory region's Sync changed the page store: %+v -> %+v", i+1, before[i], st)
		}
	}

	// Round 2 with the backup's disk full: Sync fails and names it.
	want2 := write("d", 2)
	faults[int(backup)].set(syscall.ENOSPC)
	_, err := w.cli.Sync(ctx, &dsmpb.SyncRequest{Region: "d"})
	if code(err) != codes.Unavailable || !strings.Contains(err.Error(), backup.String()+": page store:") ||
		!strings.Contains(err.Error(), "disk full") {
		t.Fatalf("Sync with a full disk at %v: %v; want Unavailable naming %v and the full disk", backup, err, backup)
	}
	t.Logf("Sync with a full disk: %v", err)
	// The backup's previous pages are intact, and reads are served.
	wantStored(member(backup), want1, vers1)
	for _, m := range ms {
		for p := range uint64(pages) {
			got, err := m.adm.ReadMemory(ctx, &dsmpb.ReadMemoryRequest{Region: "d", Offset: p << 12, Length: 4096})
			if err != nil || !bytes.Equal(got.GetData(), want2[p]) {
				t.Fatalf("n%d reads page %d with the backup's disk full: %v", m.n.cfg.ID, p, err)
			}
		}
	}
	// The pages stay recorded: the next Sync, with space again, persists them.
	if left := w.n.persist.recorded(rid, 0, pages); len(left) != pages {
		t.Fatalf("after a failed Sync the writer records %d pages, want %d", len(left), pages)
	}
	faults[int(backup)].set(nil)
	if _, err := w.cli.Sync(ctx, &dsmpb.SyncRequest{Region: "d"}); err != nil {
		t.Fatalf("Sync after the disk was freed: %v", err)
	}
	wantStored(member(home), want2, nil)
	wantStored(member(backup), want2, nil)
	if g1, g2 := storedPages(t, member(backup), rid)[0].Version, vers1[0]; !pagestore.Newer(g1, g2) {
		t.Fatalf("round 2 stored at version %d, round 1 at %d: not newer", g1, g2)
	}

	// Round 3 with the home's disk full: the error names the home; the
	// home keeps round 2.
	write("d", 3)
	faults[int(home)].set(syscall.ENOSPC)
	_, err = w.cli.Sync(ctx, &dsmpb.SyncRequest{Region: "d"})
	if code(err) != codes.Unavailable || !strings.Contains(err.Error(), home.String()+": page store:") ||
		!strings.Contains(err.Error(), "disk full") {
		t.Fatalf("Sync with a full disk at the home %v: %v; want Unavailable naming %v and the full disk", home, err, home)
	}
	wantStored(member(home), want2, nil)
	faults[int(home)].set(nil)
	want3 := write("d", 3)
	if _, err := w.cli.Sync(ctx, &dsmpb.SyncRequest{Region: "d"}); err != nil {
		t.Fatalf("Sync after the home's disk was freed: %v", err)
	}
	wantStored(member(home), want3, nil)
	wantStored(member(backup), want3, nil)

	// Deleting the region deletes its pages from every store.
	if _, err := w.cli.DeleteRegion(ctx, &dsmpb.DeleteRegionRequest{Name: "d", Force: true}); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		waitFor(ctx, t, fmt.Sprintf("n%d's store without region d", m.n.cfg.ID), func() bool {
			return len(storedPages(t, m, rid)) == 0
		})
	}
}

// TestDurableSyncRealFullDisk fills a real file system: each node's page
// store is on a tmpfs of 8 MiB mounted under its data directory, and the
// backup's is filled up. The Sync fails naming the backup and the full
// disk, the backup's stored pages stay intact, every node reads the
// written data, and the Sync succeeds once the space is freed.
func TestDurableSyncRealFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs under each node's data directory")
	}
	mounts := map[int]string{}
	var mountErr error
	ms := startClusterOpts(t, 3, func(i int, cfg *Config) Options {
		dir := cfg.DataDir + "/pages"
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=8m"); err != nil {
			mountErr = err
			return Options{}
		}
		mounts[i] = dir
		t.Cleanup(func() {
			if err := syscall.Unmount(dir, 0); err != nil {
				t.Errorf("unmount %s: %v", dir, err)
			}
		})
		return Options{}
	})
	if mountErr != nil {
		t.Skipf("cannot mount a tmpfs (%v)", mountErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cr, err := ms[0].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "full", Size: 64 << 12,
		Durability: dsmpb.Durability_DURABILITY_DURABLE})
	if err != nil {
		t.Fatal(err)
	}
	rid := ids.RegionID(cr.Region.Id)
	waitServed(ctx, t, ms, "full")
	home, backups := placed(t, ms[0], rid, 0)
	backup := backups[0]
	w := ms[0]
	for _, m := range ms {
		if id := ids.NodeID(m.n.cfg.ID); id != home && id != backup {
			w = m
		}
	}
	const pages = 8
	write := func(round int) [][]byte {
		t.Helper()
		var want [][]byte
		for p := range uint64(pages) {
			data := bytes.Repeat([]byte(fmt.Sprintf("round %d page %d;", round, p)), 4096)[:4096]
			if _, err := w.adm.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{Region: "full", Offset: p << 12, Data: data}); err != nil {
				t.Fatalf("write page %d: %v", p, err)
			}
			want = append(want, data)
		}
		return want
	}
	wantStored := func(m testMember, want [][]byte) {
		t.Helper()
		got := storedPages(t, m, rid)
		for p := range uint64(pages) {
			if !bytes.Equal(got[p].Data, want[p]) {
				t.Fatalf("n%d's store holds page %d as %.30q, want %.30q", m.n.cfg.ID, p, got[p].Data, want[p])
			}
		}
	}
	want1 := write(1)
	if _, err := w.cli.Sync(ctx, &dsmpb.SyncRequest{Region: "full"}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	wantStored(ms[backup-1], want1)

	filler := mounts[int(backup)] + "/filler"
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()
	want2 := write(2)
	var syncErr error
	for range 8 { // the WAL may have preallocated room for a few batches
		if _, syncErr = w.cli.Sync(ctx, &dsmpb.SyncRequest{Region: "full"}); syncErr != nil {
			break
		}
		want2 = write(2)
	}
	if code(syncErr) != codes.Unavailable || !strings.Contains(syncErr.Error(), backup.String()+": page store:") ||
		!strings.Contains(syncErr.Error(), "disk full") {
		t.Fatalf("Sync with the backup's file system full: %v; want Unavailable naming %v and the full disk", syncErr, backup)
	}
	t.Logf("Sync on a full file system: %v", syncErr)
	for _, m := range ms {
		got, err := m.adm.ReadMemory(ctx, &dsmpb.ReadMemoryRequest{Region: "full", Offset: 0, Length: 4096})
		if err != nil || !bytes.Equal(got.GetData(), want2[0]) {
			t.Fatalf("n%d reads page 0 with the backup's disk full: %v", m.n.cfg.ID, err)
		}
	}
	// What the backup stored before is intact (round 1, or round 2 from a
	// Sync that went through before the disk was full).
	got := storedPages(t, ms[backup-1], rid)
	for p := range uint64(pages) {
		if d := got[p].Data; !bytes.Equal(d, want1[p]) && !bytes.Equal(d, want2[p]) {
			t.Fatalf("the backup's store holds page %d as %.30q after the failed Sync", p, d)
		}
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := w.cli.Sync(ctx, &dsmpb.SyncRequest{Region: "full"}); err != nil {
		t.Fatalf("Sync after the space was freed: %v", err)
	}
	wantStored(ms[backup-1], want2)
	wantStored(ms[home-1], want2)
}

// TestDurableSyncLargePages: pages of 128 KiB do not fit in a
// persist-copy message; the home sends them to the backup in copy-parts,
// and both stores hold them whole.
func TestDurableSyncLargePages(t *testing.T) {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const ps, pages = 128 << 10, 3
	cr, err := ms[0].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "big", Size: 16 * ps, PageSize: ps,
		Durability: dsmpb.Durability_DURABILITY_DURABLE})
	if err != nil {
		t.Fatal(err)
	}
	rid := ids.RegionID(cr.Region.Id)
	waitServed(ctx, t, ms, "big")
	home, backups := placed(t, ms[0], rid, 0)
	w := ms[0]
	for _, m := range ms {
		if id := ids.NodeID(m.n.cfg.ID); id != home && !slices.Contains(backups, id) {
			w = m
		}
	}
	var want [][]byte
	for p := range uint64(pages) {
		data := make([]byte, ps)
		for i := range data {
			data[i] = byte(uint64(i)*7 + p*13 + uint64(i>>12))
		}
		if _, err := w.adm.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{Region: "big", Offset: p * ps, Data: data}); err != nil {
			t.Fatal(err)
		}
		want = append(want, data)
	}
	if _, err := w.cli.Sync(ctx, &dsmpb.SyncRequest{Region: "big"}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	for _, id := range append([]ids.NodeID{home}, backups...) {
		got := storedPages(t, ms[id-1], rid)
		for p := range uint64(pages) {
			if !bytes.Equal(got[p].Data, want[p]) || got[p].Version == 0 {
				t.Fatalf("%v's store holds page %d as %d bytes at version %d, not the %d bytes written", id, p, len(got[p].Data), got[p].Version, ps)
			}
		}
	}
	for _, id := range append([]ids.NodeID{home}, backups...) {
		ps := ms[id-1].n.persist
		ps.mu.Lock()
		left := len(ps.parts)
		ps.mu.Unlock()
		if left != 0 {
			t.Fatalf("%v keeps %d pages' pieces", id, left)
		}
	}
}

// TestPersistAwayFromHome: a persist request that reaches a node that is
// not the home of its pages is answered "retry" (the requester then asks
// the home of its current view), and one to a node that is no member
// fails at once instead of waiting.
func TestPersistAwayFromHome(t *testing.T) {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cr, err := ms[0].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "away", Size: 16 << 12,
		Durability: dsmpb.Durability_DURABILITY_DURABLE})
	if err != nil {
		t.Fatal(err)
	}
	rid := ids.RegionID(cr.Region.Id)
	waitServed(ctx, t, ms, "away")
	home, _ := placed(t, ms[0], rid, 0)
	var w, other testMember
	for _, m := range ms {
		if ids.NodeID(m.n.cfg.ID) != home {
			w, other = other, m
		}
	}
	if _, err := w.adm.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{Region: "away", Data: []byte("away")}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.n.cache.Flush(ctx, rid, 0, 1); err != nil {
		t.Fatal(err)
	}
	pages := w.n.persist.recorded(rid, 0, 1)
	if len(pages) != 1 {
		t.Fatalf("recorded %v", pages)
	}
	otherID := ids.NodeID(other.n.cfg.ID)
	code, msg := w.n.persist.askHome(ctx, otherID, rid, pages)
	if code != answerRetry || !strings.Contains(msg, "is not the home") {
		t.Fatalf("a persist request at %v, not the home %v: %v %q; want retry", otherID, home, code, msg)
	}
	start := time.Now()
	code, msg9 := w.n.persist.askHome(ctx, 9, rid, pages)
	if code != answerRetry || time.Since(start) > 5*time.Second {
		t.Fatalf("a persist request to n9, no member: %v %q after %v", code, msg9, time.Since(start))
	}
	t.Logf("at a node that is not the home: %q; at no member: %q", msg, msg9)
	if _, err := w.cli.Sync(ctx, &dsmpb.SyncRequest{Region: "away"}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if v, data, ok, err := ms[home-1].n.pages.Get(rid, 0); err != nil || !ok || v != pages[0].Version || !bytes.HasPrefix(data, []byte("away")) {
		t.Fatalf("the home's store: v%d %.8q %v %v; want v%d", v, data, ok, err, pages[0].Version)
	}
}

// durableAndMemory creates a durable region "d" and a memory region "m" of
// 64 pages of 4 KiB, waits until every member serves both, and returns
// their ids and the home and backup of d's first pages: the tests assume
// that pages [0, pages) are one shard with one backup.
func durableAndMemory(ctx context.Context, t *testing.T, ms []testMember, pages ids.PageNo) (rid, mid ids.RegionID, home, backup ids.NodeID) {
	t.Helper()
	cr, err := ms[0].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "d", Size: 64 << 12,
		Durability: dsmpb.Durability_DURABILITY_DURABLE})
	if err != nil {
		t.Fatal(err)
	}
	crm, err := ms[0].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "m", Size: 64 << 12,
		Durability: dsmpb.Durability_DURABILITY_MEMORY})
	if err != nil {
		t.Fatal(err)
	}
	rid, mid = ids.RegionID(cr.Region.Id), ids.RegionID(crm.Region.Id)
	waitServed(ctx, t, ms, "d")
	waitServed(ctx, t, ms, "m")
	home, backups := placed(t, ms[0], rid, 0)
	if len(backups) != 1 {
		t.Fatalf("page 0 of d: home %v, backups %v; want one backup", home, backups)
	}
	for p := ids.PageNo(1); p < pages; p++ {
		if h, b := placed(t, ms[0], rid, p); h != home || !slices.Equal(b, backups) {
			t.Fatalf("page %d is placed at %v %v, page 0 at %v %v: the test assumes one shard", p, h, b, home, backups)
		}
	}
	return rid, mid, home, backups[0]
}

// TestSyncReportsALostWriteOnce: when the home of a page holds an older
// version than the one this node released (the release was lost with the
// home and backups that held it, and the page's new home holds what
// survived), a Sync fails once with DATA_LOSS naming the page and both
// versions, persists the rest of its range, and the next Sync succeeds:
// before, every later Sync failed on that page for good. The loss is
// simulated by recording a later release than the home got.
func TestSyncReportsALostWriteOnce(t *testing.T) {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cr, err := ms[0].cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "lost", Size: 16 << 12,
		Durability: dsmpb.Durability_DURABILITY_DURABLE})
	if err != nil {
		t.Fatal(err)
	}
	rid := ids.RegionID(cr.Region.Id)
	waitServed(ctx, t, ms, "lost")
	home, _ := placed(t, ms[0], rid, 0)
	var w testMember
	for _, m := range ms {
		if ids.NodeID(m.n.cfg.ID) != home {
			w = m
		}
	}
	// Pages 0 and 1 written and given up; page 0's release is then
	// recorded three versions later than the home's copy.
	if _, err := w.adm.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{Region: "lost", Data: bytes.Repeat([]byte("L"), 2<<12)}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.n.cache.Flush(ctx, rid, 0, 2); err != nil {
		t.Fatal(err)
	}
	pages := w.n.persist.recorded(rid, 0, 2)
	if len(pages) != 2 {
		t.Fatalf("recorded %v", pages)
	}
	held := pages[0].Version
	w.n.persist.releasedFn(rid)(0, held+3)

	_, err = w.cli.Sync(ctx, &dsmpb.SyncRequest{Region: "lost"})
	if status.Code(err) != codes.DataLoss || !strings.Contains(err.Error(), fmt.Sprintf("page 0 (released at version %d, the home holds %d)", held+3, held)) {
		t.Fatalf("Sync after a lost write: %v; want DATA_LOSS naming page 0 and both versions", err)
	}
	t.Logf("Sync: %v", err)
	// The rest was persisted: page 1 at its home's store.
	if h1, _ := placed(t, ms[0], rid, 1); h1 == home {
		if v, _, ok, err := ms[home-1].n.pages.Get(rid, 1); err != nil || !ok || v != pages[1].Version {
			t.Fatalf("page 1 at its home's store: v%d %v %v; want v%d", v, ok, err, pages[1].Version)
		}
	}
	if _, err := w.cli.Sync(ctx, &dsmpb.SyncRequest{Region: "lost"}); err != nil {
		t.Fatalf("the Sync after the one that reported the loss: %v", err)
	}
	if got := w.n.persist.recorded(rid, 0, 2); len(got) != 0 {
		t.Fatalf("still recorded after the loss was reported: %v", got)
	}
}
