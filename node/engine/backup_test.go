package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/mem"
	"github.com/dsmkit/dsm/rdma/tcp"
)

// backupCluster starts four engines over tcp on loopback: page p is homed
// at node 2 and backed up at nodes 3.. (backups of them). Node 1 is the
// writer.
func backupCluster(tb testing.TB, backups int, opts ...func(*Config)) map[ids.NodeID]*Engine {
	tb.Helper()
	members := []ids.NodeID{1, 2, 3, 4}
	eps := map[ids.NodeID]*tcp.Transport{}
	for _, id := range members {
		ep, err := tcp.Listen(id, "127.0.0.1:0", tcp.Config{})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = ep.Close() })
		for pid, p := range eps {
			if err := ep.AddPeer(pid, p.Addr()); err != nil {
				tb.Fatal(err)
			}
			if err := p.AddPeer(id, ep.Addr()); err != nil {
				tb.Fatal(err)
			}
		}
		eps[id] = ep
	}
	var bk []ids.NodeID
	for i := range backups {
		bk = append(bk, ids.NodeID(3+i))
	}
	engines := map[ids.NodeID]*Engine{}
	descs := map[ids.NodeID]rdma.Descriptor{}
	for _, id := range members {
		cfg := Config{
			ID: id, Region: testRegion, NumPages: testPages, PageSize: 4096,
			Epoch: 16, Members: members, Transport: eps[id], Tick: time.Millisecond,
			HomeOf:  func(ids.PageNo) ids.NodeID { return 2 },
			Backups: func(ids.PageNo) []ids.NodeID { return bk },
		}
		for _, o := range opts {
			o(&cfg)
		}
		e, err := New(cfg)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() {
			if err := e.Close(); err != nil {
				tb.Error(err)
			}
		})
		engines[id], descs[id] = e, e.Descriptor()
	}
	for _, e := range engines {
		e.Start(descs)
	}
	return engines
}

// slot returns page p's slot (its word, then the page) in e's registration.
func slot(e *Engine, p ids.PageNo) (coherence.Word, []byte) {
	off := SlotOffset(p, e.cfg.PageSize)
	return coherence.Word(rdma.LoadWord(e.mem, off)), e.mem[off+8 : off+8+uint64(e.cfg.PageSize)]
}

// A write-back reaches every backup (the data, and a stamp of the released
// tenure's version) before the home releases the tenure: when Evict
// returns, the backups hold what the home holds.
func TestWriteBackReachesBackups(t *testing.T) {
	es := backupCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const p = ids.PageNo(3)
	for round := range 3 {
		page := bytes.Repeat([]byte{byte(round + 1)}, 4096)
		if err := es[1].WriteMiss(ctx, testRegion, p, nil); err != nil {
			t.Fatal(err)
		}
		if err := es[1].Evict(ctx, testRegion, p, page); err != nil {
			t.Fatal(err)
		}
		hw, home := slot(es[2], p)
		if hw.Holder() != ids.None || !bytes.Equal(home, page) {
			t.Fatalf("round %d: home word %v, data %x..., want no holder and the page", round, hw, home[:4])
		}
		for _, b := range []ids.NodeID{3, 4} {
			w, data := slot(es[b], p)
			if w != coherence.Stamp(hw.Version()) || !bytes.Equal(data, page) {
				t.Fatalf("round %d: backup n%d holds word %v and %x..., want %v and the page", round, b, w, data[:4], coherence.Stamp(hw.Version()))
			}
		}
		// A node that is no backup holds nothing in the slot.
		if w, data := slot(es[1], p); w != 0 || !bytes.Equal(data, make([]byte, 4096)) {
			t.Fatalf("round %d: n1, no backup, holds word %v in the slot", round, w)
		}
	}
	// The version stamped is the tenure's: read the word back as a number.
	if v := binary.LittleEndian.Uint64(es[3].mem[SlotOffset(p, 4096):]); coherence.Word(v).Holder() != coherence.NotHome {
		t.Fatalf("backup word %#x names holder %v, want NotHome", v, coherence.Word(v).Holder())
	}
}

// A writer that is its page's backup writes the backup into its own slot
// when a read recall downgrades it (the data the cache gave up, not the
// state machine's older copy).
func TestWriterIsItsOwnBackup(t *testing.T) {
	net := mem.NewNetwork()
	nodes := clusterOver(t, func(id ids.NodeID) (rdma.Transport, error) { return net.Endpoint(id) }, func(c *Config) {
		c.Backups = func(p ids.PageNo) []ids.NodeID { return []ids.NodeID{testHome(p)%3 + 1} }
	})
	ctx := testCtx(t)
	for p := ids.PageNo(0); p < testPages; p++ {
		h := testHome(p)
		b := h%3 + 1
		data := bytes.Repeat([]byte{byte(p + 1)}, testPageSize)
		if err := nodes[b].pages.Write(ctx, nodes[b].e, testRegion, p, testPageSize, 0, data); err != nil {
			t.Fatal(err)
		}
		got, err := nodes[h].pages.Read(ctx, nodes[h].e, testRegion, p, testPageSize)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("home read %x %v", got, err)
		}
		w, slotData := slot(nodes[b].e, p)
		if w.Holder() != coherence.NotHome || !bytes.Equal(slotData, data) {
			t.Fatalf("p%d: backup n%d (the writer) holds word %v data %x, want the data", p, b, w, slotData)
		}
	}
}

// A backup that enters the set later is filled by the home: Populated
// lists the pages written (and only those), Fill copies each with its
// stamp, and every page ends in Config.Filled; a fill to a node that is no
// backup is abandoned.
func TestFillNewBackup(t *testing.T) {
	var mu sync.Mutex
	var filled []coherence.FillDone
	es := backupCluster(t, 1, func(c *Config) {
		if c.ID == 2 {
			c.Filled = func(d []coherence.FillDone) {
				mu.Lock()
				filled = append(filled, d...)
				mu.Unlock()
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	written := []ids.PageNo{1, 3, 4}
	for _, p := range written {
		page := bytes.Repeat([]byte{byte(p + 1)}, 4096)
		if err := es[1].WriteMiss(ctx, testRegion, p, nil); err != nil {
			t.Fatal(err)
		}
		if err := es[1].Evict(ctx, testRegion, p, page); err != nil {
			t.Fatal(err)
		}
	}
	if got := es[2].Populated(0, testPages); !slices.Equal(got, written) {
		t.Fatalf("populated %v, want %v", got, written)
	}
	for _, e := range es {
		e.Reconfigure(coherence.Reconfigure{Epoch: 17, Members: []ids.NodeID{1, 2, 3, 4},
			Backups: func(ids.PageNo) []ids.NodeID { return []ids.NodeID{3, 4} }})
	}
	es[2].Fill(written, 4)
	es[2].Fill([]ids.PageNo{1}, 1) // n1 is no backup
	for {
		mu.Lock()
		n := len(filled)
		mu.Unlock()
		if n == len(written)+1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("fills reported: %v", filled)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, f := range filled {
		if (f.To == 1) != errors.Is(f.Err, coherence.ErrFillAbandoned) || f.To == 4 && f.Err != nil {
			t.Fatalf("fill %v", f)
		}
	}
	for _, p := range written {
		hw, home := slot(es[2], p)
		w, data := slot(es[4], p)
		if w != coherence.Stamp(hw.Version()) || !bytes.Equal(data, home) {
			t.Fatalf("p%d: the new backup holds %v and %x..., the home %v and %x...", p, w, data[:4], hw, home[:4])
		}
	}
}

// BenchmarkWriteBack measures a write miss and the write-back of one 4 KiB
// page homed on another node, over tcp on loopback, with 0, 1 and 2
// backups: the cost of backups is the ratio of the rows (compare with
// benchstat).
func BenchmarkWriteBack(b *testing.B) {
	for _, k := range []int{0, 1, 2} {
		b.Run(fmt.Sprintf("backups=%d", k), func(b *testing.B) {
			es := backupCluster(b, k)
			ctx := context.Background()
			page := bytes.Repeat([]byte{7}, 4096)
			b.SetBytes(4096)
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				p := ids.PageNo(i % testPages)
				if err := es[1].WriteMiss(ctx, testRegion, p, nil); err != nil {
					b.Fatal(err)
				}
				if err := es[1].Evict(ctx, testRegion, p, page); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Persist hands over, from the home, the page's data as its last release
// left it and the version in the word (docs/durability.md §2); a page
// never written comes back as version 0 and zeros, and a Persist at a
// node that is not the home is given up.
func TestPersistStableCopy(t *testing.T) {
	var mu sync.Mutex
	got := map[ids.NodeID][]coherence.PersistDone{}
	es := backupCluster(t, 1, func(c *Config) {
		id := c.ID
		c.Persisted = func(d []coherence.PersistDone) {
			mu.Lock()
			got[id] = append(got[id], d...)
			mu.Unlock()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	page := bytes.Repeat([]byte{0xd5}, 4096)
	if err := es[1].WriteMiss(ctx, testRegion, 3, nil); err != nil {
		t.Fatal(err)
	}
	if err := es[1].Evict(ctx, testRegion, 3, page); err != nil {
		t.Fatal(err)
	}
	es[2].Persist([]ids.PageNo{3, 5})
	es[1].Persist([]ids.PageNo{3}) // n2 is the home
	for {
		mu.Lock()
		n, m := len(got[2]), len(got[1])
		mu.Unlock()
		if n == 2 && m == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("persists reported: %v", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if d := got[1][0]; !errors.Is(d.Err, coherence.ErrPersistAbandoned) {
		t.Fatalf("a Persist away from the home: %v", d)
	}
	for _, d := range got[2] {
		w, _ := slot(es[2], d.Page)
		switch {
		case d.Err != nil:
			t.Fatalf("p%d: %v", d.Page, d.Err)
		case d.Page == 3 && (d.Version != w.Version() || d.Version == 0 || !bytes.Equal(d.Data, page)):
			t.Fatalf("p3: copy v%d %x..., want v%d (the word %v) and %x...", d.Version, d.Data[:4], w.Version(), w, page[:4])
		case d.Page == 5 && (d.Version != 0 || !bytes.Equal(d.Data, make([]byte, 4096))):
			t.Fatalf("p5, never written: copy v%d %x...", d.Version, d.Data[:4])
		}
	}
}

// StampLeftBehind turns the home words of a node's populated slots into
// the stamps they stand for: a released page's word into the stamp of its
// version, a held page's into the stamp of the tenure before; slots never
// written stay zero.
func TestStampLeftBehind(t *testing.T) {
	es := backupCluster(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	page := bytes.Repeat([]byte{0x5a}, 4096)
	if err := es[1].WriteMiss(ctx, testRegion, 3, nil); err != nil {
		t.Fatal(err)
	}
	if err := es[1].Evict(ctx, testRegion, 3, page); err != nil {
		t.Fatal(err)
	}
	if err := es[1].WriteMiss(ctx, testRegion, 1, nil); err != nil { // held by n1
		t.Fatal(err)
	}
	w3, _ := slot(es[2], 3)
	w1, _ := slot(es[2], 1)
	if w3.Holder() != ids.None || w1.Holder() != 1 {
		t.Fatalf("before: p3 %v, p1 %v", w3, w1)
	}
	if n := es[2].StampLeftBehind(0, testPages); n != 2 {
		t.Fatalf("StampLeftBehind changed %d words, want 2", n)
	}
	if w, data := slot(es[2], 3); w != coherence.Stamp(w3.Version()) || !bytes.Equal(data, page) {
		t.Fatalf("p3 after: %v and %x..., want %v beside its data", w, data[:4], coherence.Stamp(w3.Version()))
	}
	if w, _ := slot(es[2], 1); w != coherence.Stamp(w1.Version()-1) {
		t.Fatalf("p1 after: %v, want %v", w, coherence.Stamp(w1.Version()-1))
	}
	if w, _ := slot(es[2], 2); w != 0 {
		t.Fatalf("p2, never written: %v", w)
	}
	if n := es[2].StampLeftBehind(0, testPages); n != 0 {
		t.Fatalf("a second StampLeftBehind changed %d words", n)
	}
}

// Config.Released is told of every page the node gives up Modified, with
// the version of the tenure it releases: the version the home's word
// shows once that release landed. Through an eviction (a Sync's
// write-back) and through a recall by another node's write.
func TestReleasedReportsTenure(t *testing.T) {
	type rel struct {
		p ids.PageNo
		v uint16
	}
	var mu sync.Mutex
	got := map[ids.NodeID][]rel{}
	es := backupCluster(t, 1, func(c *Config) {
		id := c.ID
		c.Released = func(p ids.PageNo, v uint16) {
			mu.Lock()
			got[id] = append(got[id], rel{p, v})
			mu.Unlock()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	page := bytes.Repeat([]byte{0x3c}, 4096)
	// An eviction of a Modified page at n1.
	if err := es[1].WriteMiss(ctx, testRegion, 3, nil); err != nil {
		t.Fatal(err)
	}
	if err := es[1].Evict(ctx, testRegion, 3, page); err != nil {
		t.Fatal(err)
	}
	w3, _ := slot(es[2], 3)
	// A recall: n1 holds page 4 Modified, n4 writes it.
	if err := es[1].WriteMiss(ctx, testRegion, 4, nil); err != nil {
		t.Fatal(err)
	}
	if err := es[4].WriteMiss(ctx, testRegion, 4, nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got[1]) != 2 || got[1][0] != (rel{3, w3.Version()}) || got[1][0].v == 0 || got[1][1].p != 4 || got[1][1].v == 0 {
		t.Fatalf("n1 reported releases %v; want page 3 at v%d, then page 4", got[1], w3.Version())
	}
	if w4, _ := slot(es[2], 4); int16(w4.Version()-got[1][1].v) <= 0 {
		t.Fatalf("page 4 released at v%d by n1, the word after n4's grant is %v: not newer", got[1][1].v, w4)
	}
	if len(got[4]) != 0 || len(got[2]) != 0 {
		t.Fatalf("nodes that gave nothing up reported releases: %v", got)
	}
}
