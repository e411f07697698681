package dsm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dsmkit/dsm/internal/mapclient/mapclienttest"
	"github.com/dsmkit/dsm/internal/uffd"
	"github.com/dsmkit/dsm/node"
	"github.com/dsmkit/dsm/node/localcache"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hang bounds waits that only catch hangs; nothing is asserted about time.
const hang = 30 * time.Second

// testConfig is a single-node cluster in dir on free loopback ports.
func testConfig(dir string) node.Config {
	cfg := node.Default()
	cfg.ID, cfg.DataDir, cfg.BootstrapExpect = 1, dir, 1
	cfg.GossipAddr, cfg.RaftAddr, cfg.RPCAddr, cfg.VerbsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.CacheSize = 64 << 20
	return cfg
}

// startNode starts an in-process dsmd that serves mappings (MemHome is the
// single node's backing store). It is closed at the end of the test.
func startNode(t testing.TB, cfg node.Config) *node.Node {
	t.Helper()
	if _, err := uffd.Probe(); err != nil {
		t.Skipf("no userfaultfd: %v", err)
	}
	n, err := node.New(cfg, node.Options{Coherence: &localcache.MemHome{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	t.Cleanup(cancel)
	return ctx
}

func dial(t testing.TB, ctx context.Context, addr string) *Client {
	t.Helper()
	c, err := Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// setup starts a node, dials it and maps a new region of size bytes.
func setup(t testing.TB, size int64) (*node.Node, *Client, *Region) {
	t.Helper()
	n := startNode(t, testConfig(t.TempDir()))
	ctx := ctxT(t)
	c := dial(t, ctx, n.Addrs().Socket)
	if err := c.CreateRegion(ctx, "r", size); err != nil {
		t.Fatal(err)
	}
	r, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	return n, c, r
}

// Plain accesses through Bytes() are made only after Prefault: the dsmd of
// these tests runs in the test process, and a Go load that waits for a
// fault that this same process must resolve can deadlock its runtime.
func TestBytesReadAtWriteAt(t *testing.T) {
	_, _, r := setup(t, 64<<10)
	if r.Len() != 64<<10 || r.PageSize() != 4096 || r.Name() != "r" {
		t.Fatalf("region %q: len %d, page size %d", r.Name(), r.Len(), r.PageSize())
	}
	if err := r.Prefault(0, 4096, true); err != nil {
		t.Fatal(err)
	}
	b := r.Bytes()
	copy(b[100:], "stored")
	got := make([]byte, 6)
	if n, err := r.ReadAt(got, 100); err != nil || n != 6 || string(got) != "stored" {
		t.Fatalf("ReadAt after a store = %d %q %v", n, got, err)
	}

	if n, err := r.WriteAt([]byte("written"), 8190); err != nil || n != 7 {
		t.Fatalf("WriteAt = %d %v", n, err)
	}
	if err := r.Prefault(8190, 7, false); err != nil {
		t.Fatal(err)
	}
	if s := string(b[8190:8197]); s != "written" {
		t.Fatalf("Bytes after WriteAt = %q", s)
	}

	// Past the end: a short read with io.EOF, a write refused whole.
	tail := make([]byte, 10)
	if n, err := r.ReadAt(tail, r.Len()-4); n != 4 || err != io.EOF {
		t.Fatalf("ReadAt across the end = %d %v, want 4 io.EOF", n, err)
	}
	if n, err := r.WriteAt([]byte("xxxxxxxx"), r.Len()-4); n != 0 || !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("WriteAt across the end = %d %v, want ErrOutOfRange", n, err)
	}
	if _, err := r.ReadAt(tail, -1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("ReadAt at -1: %v, want ErrOutOfRange", err)
	}
	if err := r.Prefault(r.Len()-4096, 8192, false); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("Prefault across the end: %v, want ErrOutOfRange", err)
	}
}

func TestTwoMappingsShareMemory(t *testing.T) {
	_, c, r1 := setup(t, 16<<10)
	ctx := ctxT(t)
	r2, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if _, err := r1.WriteAt([]byte("shared"), 5000); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 6)
	if _, err := r2.ReadAt(got, 5000); err != nil || string(got) != "shared" {
		t.Fatalf("second mapping reads %q %v", got, err)
	}
}

func TestAtomics(t *testing.T) {
	_, _, r := setup(t, 16<<10)
	ctx := ctxT(t)

	const workers, adds = 8, 1000
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range adds {
				if _, err := r.AddUint64(ctx, 8, 1); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if v, err := r.LoadUint64(ctx, 8); err != nil || v != workers*adds {
		t.Fatalf("after %d adds the word is %d (%v)", workers*adds, v, err)
	}
	if nv, err := r.AddUint64(ctx, 8, ^uint64(0)); err != nil || nv != workers*adds-1 {
		t.Fatalf("Add(-1) = %d %v", nv, err)
	}

	// Store and Load on a word in another page; the bytes are little-endian
	// in the mapping.
	if err := r.StoreUint64(ctx, 4096+24, 0x0102030405060708); err != nil {
		t.Fatal(err)
	}
	if v, err := r.LoadUint64(ctx, 4096+24); err != nil || v != 0x0102030405060708 {
		t.Fatalf("Load after Store = %#x %v", v, err)
	}
	raw := make([]byte, 8)
	if _, err := r.ReadAt(raw, 4096+24); err != nil || binary.LittleEndian.Uint64(raw) != 0x0102030405060708 {
		t.Fatalf("ReadAt of the stored word = %x %v", raw, err)
	}

	// CompareAndSwap swaps only on a match.
	if ok, err := r.CompareAndSwapUint64(ctx, 4096+24, 1, 2); err != nil || ok {
		t.Fatalf("CAS with a wrong old value = %v %v", ok, err)
	}
	if ok, err := r.CompareAndSwapUint64(ctx, 4096+24, 0x0102030405060708, 42); err != nil || !ok {
		t.Fatalf("CAS with the right old value = %v %v", ok, err)
	}
	if v, _ := r.LoadUint64(ctx, 4096+24); v != 42 {
		t.Fatalf("after CAS the word is %d", v)
	}

	// A done context is refused before anything is done.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := r.AddUint64(cctx, 8, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Add with a cancelled ctx: %v", err)
	}
	if v, _ := r.LoadUint64(ctx, 8); v != workers*adds-1 {
		t.Fatalf("a refused Add changed the word to %d", v)
	}
}

// A counter incremented with plain, non-atomic loads and stores under the
// Mutex, from goroutines on two mappings of the region, loses no update.
func TestMutex(t *testing.T) {
	_, c, r1 := setup(t, 16<<10)
	ctx := ctxT(t)
	r2, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()

	const lockOff, counterOff = 64, 64 + MutexSize
	const perMap, rounds = 3, 300
	var wg sync.WaitGroup
	errs := make(chan error, 2*perMap)
	for _, r := range []*Region{r1, r2} {
		for range perMap {
			wg.Add(1)
			go func() {
				defer wg.Done()
				mu := r.Mutex(lockOff)
				for range rounds {
					if err := mu.Lock(ctx); err != nil {
						errs <- err
						return
					}
					// The plain accesses must not miss: this test's dsmd
					// runs in this process.
					if err := r.Prefault(counterOff, 8, true); err != nil {
						errs <- err
						return
					}
					w := r.Bytes()[counterOff : counterOff+8]
					binary.LittleEndian.PutUint64(w, binary.LittleEndian.Uint64(w)+1)
					if err := mu.Unlock(); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if v, err := r1.LoadUint64(ctx, counterOff); err != nil || v != 2*perMap*rounds {
		t.Fatalf("counter = %d (%v), want %d", v, err, 2*perMap*rounds)
	}

	mu := r1.Mutex(lockOff)
	if err := mu.Unlock(); !errors.Is(err, ErrNotLocked) {
		t.Fatalf("Unlock of a free lock: %v, want ErrNotLocked", err)
	}
	if ok, err := mu.TryLock(ctx); err != nil || !ok {
		t.Fatalf("TryLock of a free lock = %v %v", ok, err)
	}
	if ok, err := r2.Mutex(lockOff).TryLock(ctx); err != nil || ok {
		t.Fatalf("TryLock of a held lock = %v %v", ok, err)
	}
	if err := mu.Unlock(); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := mu.Lock(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock with a cancelled ctx: %v", err)
	}
	if ok, err := mu.TryLock(ctx); err != nil || !ok {
		t.Fatalf("a refused Lock left the lock taken: TryLock = %v %v", ok, err)
	}
	if err := mu.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := r1.Mutex(4).Lock(ctx); !errors.Is(err, ErrUnaligned) {
		t.Fatalf("Mutex at 4: %v, want ErrUnaligned", err)
	}
	if err := r1.Mutex(r1.Len() - 8).Lock(ctx); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("Mutex on the last word: %v, want ErrOutOfRange", err)
	}
}

func TestErrors(t *testing.T) {
	n, c, r := setup(t, 16<<10)
	ctx := ctxT(t)

	if _, err := c.Map(ctx, "nope"); !errors.Is(err, ErrUnknownRegion) || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("Map of an unknown region: %v", err)
	}
	if _, err := r.LoadUint64(ctx, 4); !errors.Is(err, ErrUnaligned) {
		t.Fatalf("Load at 4: %v, want ErrUnaligned", err)
	}
	for _, off := range []int64{-8, r.Len(), r.Len() + 8} {
		if _, err := r.AddUint64(ctx, off, 1); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("Add at %d: %v, want ErrOutOfRange", off, err)
		}
	}
	if err := c.CreateRegion(ctx, "r", 16<<10); err != nil {
		t.Fatalf("CreateRegion with the same spec: %v", err)
	}
	if err := c.CreateRegion(ctx, "r", 32<<10); !errors.Is(err, ErrExists) {
		t.Fatalf("CreateRegion with another spec: %v, want ErrExists", err)
	}
	if err := c.CreateRegion(ctx, "odd", 5000); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("CreateRegion of 5000 bytes: %v, want ErrInvalidArgument", err)
	}
	if err := c.CreateRegion(ctx, "bad", 4096, WithDurability(0)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("CreateRegion with durability 0: %v, want ErrInvalidArgument", err)
	}
	if err := c.DeleteRegion(ctx, "nope"); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("DeleteRegion of an unknown region: %v", err)
	}

	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.AddUint64(ctx, 0, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Add after Close: %v, want ErrClosed", err)
	}
	if _, err := r.ReadAt(make([]byte, 8), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("ReadAt after Close: %v, want ErrClosed", err)
	}
	if err := r.Sync(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Sync after Close: %v, want ErrClosed", err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Map(ctx, "r"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Map after Client.Close: %v, want ErrClosed", err)
	}
	if _, err := c.Regions(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Regions after Client.Close: %v, want ErrClosed", err)
	}

	// A Dial to nothing says where it tried.
	missing := filepath.Join(t.TempDir(), "none.sock")
	if _, err := Dial(ctx, missing); !errors.Is(err, ErrDaemonUnavailable) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Dial of %s: %v", missing, err)
	}
	t.Setenv(AddrEnv, "unix://"+n.Addrs().Socket)
	c2, err := Dial(ctx, "")
	if err != nil {
		t.Fatalf("Dial with $%s: %v", AddrEnv, err)
	}
	if c2.NodeID() != 1 {
		t.Errorf("NodeID = %d", c2.NodeID())
	}
	c2.Close()
}

func TestRegionsAndDelete(t *testing.T) {
	n := startNode(t, testConfig(t.TempDir()))
	ctx := ctxT(t)
	c := dial(t, ctx, n.Addrs().Socket)
	if err := c.CreateRegion(ctx, "b", 2<<20, WithPageSize(2<<20), WithDurability(Durable)); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateRegion(ctx, "a", 8192); err != nil {
		t.Fatal(err)
	}
	infos, err := c.Regions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Name != "a" || infos[1].Name != "b" {
		t.Fatalf("Regions = %+v", infos)
	}
	if a := infos[0]; a.Size != 8192 || a.PageSize != 4096 || a.Durability != Memory || a.ID == 0 {
		t.Errorf("a = %+v", a)
	}
	if b := infos[1]; b.Size != 2<<20 || b.PageSize != 2<<20 || b.Durability != Durable {
		t.Errorf("b = %+v", b)
	}
	if err := c.DeleteRegion(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	infos, err = c.Regions(ctx)
	if err != nil || len(infos) != 1 || infos[0].Name != "b" {
		t.Fatalf("Regions after delete = %+v %v", infos, err)
	}
	if _, err := c.Map(ctx, "a"); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("Map of a deleted region: %v", err)
	}
}

// Deleting a region that a process maps is ErrInUse without Force; with
// Force, dsmd ends the mapping: it dies with ErrRegionDeleted and plain
// accesses fault. A region created again under the name is a new, empty
// one, and Map gives that one.
func TestDeleteMappedRegion(t *testing.T) {
	_, c, r := setup(t, 16<<10)
	ctx := ctxT(t)
	if _, err := r.WriteAt([]byte("old data"), 0); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteRegion(ctx, "r"); !errors.Is(err, ErrInUse) {
		t.Fatalf("DeleteRegion of a mapped region: %v, want ErrInUse", err)
	}
	if err := c.DeleteRegion(ctx, "r", Force()); err != nil {
		t.Fatalf("DeleteRegion with Force: %v", err)
	}
	select {
	case <-r.Done():
	case <-time.After(hang):
		t.Fatal("the mapping of a deleted region is still served")
	}
	if err := r.Err(); !errors.Is(err, ErrRegionDeleted) || !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("Err after the delete: %v, want ErrRegionDeleted", err)
	}
	if faulted, v := touch(t, r.Bytes(), 0, false); !faulted {
		t.Errorf("load of a page held before the delete: no fault (read %#x)", v)
	}
	if faulted, _ := touch(t, r.Bytes(), 8192, true); !faulted {
		t.Errorf("store to a page never held after the delete: no fault")
	}
	if _, err := r.ReadAt(make([]byte, 8), 0); !errors.Is(err, ErrRegionDeleted) {
		t.Fatalf("ReadAt after the delete: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateRegion(ctx, "r", 16<<10); err != nil {
		t.Fatal(err)
	}
	r2, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	got := make([]byte, 8)
	if _, err := r2.ReadAt(got, 0); err != nil || !bytes.Equal(got, make([]byte, 8)) {
		t.Fatalf("the region created again reads %q, %v; want zeros", got, err)
	}
}

func TestSync(t *testing.T) {
	_, _, r := setup(t, 16<<10)
	ctx := ctxT(t)
	if _, err := r.WriteAt([]byte("sync me"), 0); err != nil {
		t.Fatal(err)
	}
	if err := r.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// The page left the cache for the home; reading brings it back.
	got := make([]byte, 7)
	if _, err := r.ReadAt(got, 0); err != nil || string(got) != "sync me" {
		t.Fatalf("ReadAt after Sync = %q, %v", got, err)
	}
}

// TestThroughEngine: a dsmd with its coherence engine (no test stand-in)
// serves mappings; bytes and atomics go through the protocol.
func TestThroughEngine(t *testing.T) {
	cfg := testConfig(t.TempDir())
	n, err := node.New(cfg, node.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := ctxT(t)
	c := dial(t, ctx, n.Addrs().Socket)
	if err := c.CreateRegion(ctx, "r", 1<<20); err != nil {
		t.Fatal(err)
	}
	r, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.WriteAt([]byte("through the engine"), 4090); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 18)
	if _, err := r.ReadAt(got, 4090); err != nil || string(got) != "through the engine" {
		t.Fatalf("ReadAt = %q, %v", got, err)
	}
	if v, err := r.AddUint64(ctx, 64, 3); err != nil || v != 3 {
		t.Fatalf("AddUint64 = %d, %v", v, err)
	}
	if err := r.Sync(ctx); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if v, err := r.LoadUint64(ctx, 64); err != nil || v != 3 {
		t.Fatalf("LoadUint64 after Sync = %d, %v", v, err)
	}
}

// When dsmd dies, access fails with ErrDaemonUnavailable instead of
// hanging or reading zeros; once a dsmd is back on the same data directory
// and socket, Map works again.
func TestDaemonRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	n := startNode(t, cfg)
	ctx := ctxT(t)
	c := dial(t, ctx, n.Addrs().Socket)
	if err := c.CreateRegion(ctx, "r", 16<<10); err != nil {
		t.Fatal(err)
	}
	r, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.AddUint64(ctx, 0, 5); err != nil {
		t.Fatal(err)
	}
	// Page 1 is in the node's cache (the memfd) through another mapping,
	// but not mapped in r; pages 2 and 3 were never held.
	other, err := c.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.WriteAt([]byte("cached"), 4096); err != nil {
		t.Fatal(err)
	}

	// The same addresses, so that the restarted node finds its Raft peer
	// (itself) where its log says.
	a := n.Addrs()
	cfg.GossipAddr, cfg.RaftAddr, cfg.RPCAddr, cfg.VerbsAddr = a.Gossip, a.Raft, a.RPC, a.Verbs
	if err := n.Close(); err != nil {
		t.Logf("Close: %v", err)
	}
	select {
	case <-r.Done():
	case <-time.After(hang):
		t.Fatal("the mapping did not notice that dsmd is gone")
	}
	if err := r.Err(); !errors.Is(err, ErrDaemonUnavailable) {
		t.Fatalf("Err after dsmd died: %v", err)
	}
	// Plain accesses fault instead of reading or writing memory nobody
	// serves any more.
	for _, a := range []struct {
		what  string
		off   int
		store bool
	}{
		{"load of a page held before", 8, false},
		{"load of a page cached on the node, not mapped here", 4096 + 1, false},
		{"load of a page never held", 2*4096 + 2, false},
		{"store to a page never held", 3*4096 + 3, true},
	} {
		if faulted, v := touch(t, r.Bytes(), a.off, a.store); !faulted {
			t.Errorf("%s after dsmd died: no fault (read %#x)", a.what, v)
		}
	}
	if _, err := r.LoadUint64(ctx, 0); !errors.Is(err, ErrDaemonUnavailable) {
		t.Fatalf("Load after dsmd died: %v", err)
	}
	if _, err := r.ReadAt(make([]byte, 8), 0); !errors.Is(err, ErrDaemonUnavailable) {
		t.Fatalf("ReadAt after dsmd died: %v", err)
	}
	if _, err := c.Map(ctx, "r"); !errors.Is(err, ErrDaemonUnavailable) {
		t.Fatalf("Map while dsmd is down: %v", err)
	}
	if err := r.Close(); err != nil && !errors.Is(err, ErrDaemonUnavailable) {
		t.Fatalf("Close of a dead region: %v", err)
	}

	n2 := startNode(t, cfg)
	c2 := dial(t, ctx, n2.Addrs().Socket)
	// The restarted directory replica has the region once it has replayed
	// its Raft log.
	for {
		infos, err := c2.Regions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the restarted node never listed the region: %+v", infos)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r2, err := c2.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	// MemHome keeps pages in memory only: the new node starts from zeros.
	if _, err := r2.AddUint64(ctx, 0, 1); err != nil {
		t.Fatal(err)
	}
	r2.Close()

	// The first Client works again too once gRPC has reconnected.
	for {
		r3, err := c.Map(ctx, "r")
		if err == nil {
			if _, err := r3.WriteAt([]byte("back"), 0); err != nil {
				t.Fatal(err)
			}
			r3.Close()
			break
		}
		if !errors.Is(err, ErrDaemonUnavailable) || ctx.Err() != nil {
			t.Fatalf("Map with the first Client after the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	got := make([]byte, 4)
	rr, err := c2.Map(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Close()
	if _, err := rr.ReadAt(got, 0); err != nil || !bytes.Equal(got, []byte("back")) {
		t.Fatalf("ReadAt = %q %v", got, err)
	}
}

// touch loads b[off] (stores to it if store) with memory faults turned
// into panics and reports whether the access faulted at that address, or
// else the byte it read. An access that never returns fails t after hang.
func touch(t *testing.T, b []byte, off int, store bool) (faulted bool, v byte) {
	t.Helper()
	r := mapclienttest.Touch(b, off, store, hang)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	return r.Faulted, r.V
}

// Closing a Region while atomics run on it makes them fail with ErrClosed
// (or complete before), never crash the process.
func TestCloseDuringAtomics(t *testing.T) {
	_, _, r := setup(t, 16<<10)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, err := r.AddUint64(ctx, 0, 1); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	time.Sleep(10 * time.Millisecond) // let them run; correctness does not depend on it
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Add during Close: %v, want ErrClosed", err)
		}
	}
}

// The library finds dsmd where dsmd puts its socket by default.
func TestDefaultAddr(t *testing.T) {
	if DefaultAddr != node.DefaultSocket {
		t.Fatalf("DefaultAddr %q, dsmd's default socket %q", DefaultAddr, node.DefaultSocket)
	}
}

// A Lock whose ctx ends while it waits gives its ticket up and reports
// ctx's error at once; the holder's Unlock passes the ticket given up, so
// the lock is free right after.
func TestMutexCancelWhileWaiting(t *testing.T) {
	_, _, r := setup(t, 16<<10)
	ctx := ctxT(t)
	mu := r.Mutex(0)
	if err := mu.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- r.Mutex(0).Lock(wctx) }()
	// Wait until the waiter has recorded ticket 1 in its owner word.
	for {
		v, err := r.LoadUint64(ctx, 16+8)
		if err != nil {
			t.Fatal(err)
		}
		if tk, st, _ := ownerOf(v); tk == 1 && st == ownerWaiting {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the waiter never recorded its ticket")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case err := <-res:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Lock: %v, want context.Canceled", err)
		}
	case <-time.After(hang):
		t.Fatal("the cancelled Lock did not return while the lock was held")
	}
	if err := mu.Unlock(); err != nil {
		t.Fatal(err)
	}
	if ok, err := mu.TryLock(ctx); err != nil || !ok {
		t.Fatalf("the lock is not free after the cancelled Lock gave its ticket up: %v %v", ok, err)
	}
	if err := mu.Unlock(); err != nil {
		t.Fatal(err)
	}
}

// shortLockWaits makes the Mutex look at a stalled head after 10 ms per
// ticket, and skip an unrecorded one after 50 ms.
func shortLockWaits(t *testing.T) {
	check, unrec := lockCheckAfter, lockUnrecorded
	lockCheckAfter, lockUnrecorded = 10*time.Millisecond, 50*time.Millisecond
	t.Cleanup(func() { lockCheckAfter, lockUnrecorded = check, unrec })
}

// A ticket taken by a process that died before recording itself is
// skipped silently: the next Lock gets the lock without ErrOwnerDied.
func TestMutexSkipsAnUnrecordedTicket(t *testing.T) {
	shortLockWaits(t)
	_, _, r := setup(t, 16<<10)
	ctx := ctxT(t)
	if _, err := r.AddUint64(ctx, 0, 1); err != nil { // ticket 0, never recorded
		t.Fatal(err)
	}
	mu := r.Mutex(0)
	if err := mu.Lock(ctx); err != nil {
		t.Fatalf("Lock behind an unrecorded ticket: %v", err)
	}
	if err := mu.Unlock(); err != nil {
		t.Fatal(err)
	}
	if tk, st, _ := ownerOf(mustLoad(t, r, 16)); tk != 0 || st != ownerSkipped {
		t.Fatalf("owner word of ticket 0: ticket %d state %d, want skipped", tk, st)
	}
}

// A holder found dead (its owner word marked so by the waiter that
// skipped it, which stopped before moving the now-serving word) makes the
// next acquirer's Lock return ErrOwnerDied with the lock held; the one
// after it gets the lock plainly.
func TestMutexReportsADeadHolder(t *testing.T) {
	shortLockWaits(t)
	_, _, r := setup(t, 16<<10)
	ctx := ctxT(t)
	if _, err := r.AddUint64(ctx, 0, 1); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.CompareAndSwapUint64(ctx, 16, 0, ownerWord(0, ownerDied, 7<<32|1)); err != nil || !ok {
		t.Fatalf("owner word: %v %v", ok, err)
	}
	mu := r.Mutex(0)
	if err := mu.Lock(ctx); !errors.Is(err, ErrOwnerDied) {
		t.Fatalf("Lock after a dead holder: %v, want ErrOwnerDied", err)
	}
	if ok, err := r.Mutex(0).TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock while held after ErrOwnerDied: %v %v", ok, err)
	}
	if err := mu.Unlock(); err != nil {
		t.Fatalf("Unlock after ErrOwnerDied: %v", err)
	}
	if err := mu.Lock(ctx); err != nil {
		t.Fatalf("the Lock after: %v", err)
	}
	if err := mu.Unlock(); err != nil {
		t.Fatal(err)
	}
	if sw := mustLoad(t, r, 8); sw != 3 {
		t.Fatalf("now-serving word %#x, want 3 (died bit cleared)", sw)
	}
}

func mustLoad(t *testing.T, r *Region, off int64) uint64 {
	t.Helper()
	v, err := r.LoadUint64(context.Background(), off)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// An UNAVAILABLE status about a page (dsmd's PAGE_UNAVAILABLE detail) is
// ErrUnavailable; one without it is dsmd itself.
func TestPageUnavailableStatus(t *testing.T) {
	st, err := status.New(codes.Unavailable, "page p3 of region fo (r1) unavailable: its home n3 failed in epoch 7").
		WithDetails(&errdetails.ErrorInfo{Reason: "PAGE_UNAVAILABLE", Domain: "dsm.v1"})
	if err != nil {
		t.Fatal(err)
	}
	got := rpcErr("sync", "fo", st.Err())
	if !errors.Is(got, ErrUnavailable) || errors.Is(got, ErrDaemonUnavailable) || !strings.Contains(got.Error(), "home n3") {
		t.Fatalf("page status: %v", got)
	}
	got = rpcErr("sync", "fo", status.Error(codes.Unavailable, "no Raft leader"))
	if !errors.Is(got, ErrDaemonUnavailable) || errors.Is(got, ErrUnavailable) {
		t.Fatalf("plain UNAVAILABLE: %v", got)
	}
}
