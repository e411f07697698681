package tests

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble"

	"github.com/dsmkit/dsm/dsm"
)

// BenchmarkDurableSync measures what Sync of a Durable region costs
// against the same Sync of a Memory region, and against pebble itself, on
// a real three-node cluster (one backup per shard) from a client of n1
// (docs/benchmarks.md, make bench-durable):
//
//   - Sync1MiB/memory, Sync1MiB/durable: each iteration dirties 256 pages
//     (1 MiB), 8 in each of the region's 32 shards, so that every node is
//     home of some, through Bytes() (timer stopped), then times Sync: the
//     write-backs to the homes and their backups, and for the durable
//     region their synced batches in each node's page store.
//   - Sync1MiB/raw-pebble: the same 256 pages of 4 KiB as one pebble batch
//     committed with pebble.Sync into a store on the file system of the
//     nodes' data directories: one synced write of the bytes, no network.
//   - Sync1MiB/raw-pebble-x2: that batch committed into two stores at
//     once: the bytes a Sync with one backup persists (a copy at the home
//     and one at the backup), on the one disk of this machine.
//
// MB/s counts the bytes of the dirty pages once per Sync.
func BenchmarkDurableSync(b *testing.B) {
	const (
		size   = 64 << 20 // 32 shards of 2 MiB
		ps     = 4096
		pages  = size / ps
		dirty  = 256
		stride = pages / dirty
	)
	c := startCluster(b, 3)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cl, err := dsm.Dial(ctx, c.nodes[0].socket)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cl.Close() })

	for _, d := range []struct {
		name string
		d    dsm.Durability
	}{{"memory", dsm.Memory}, {"durable", dsm.Durable}} {
		name := "sync-" + d.name
		if err := cl.CreateRegion(ctx, name, size, dsm.WithDurability(d.d)); err != nil {
			b.Fatal(err)
		}
		r, err := cl.Map(ctx, name)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { r.Close() })
		b.Run("Sync1MiB/"+d.name, func(b *testing.B) {
			b.SetBytes(dirty * ps)
			mem := r.Bytes()
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				for j := range dirty {
					page := (j*stride + i%stride) % pages
					binary.LittleEndian.PutUint64(mem[page*ps:], uint64(i)<<32|uint64(j))
				}
				b.StartTimer()
				if err := r.Sync(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}

	// The raw rows: one store (raw-pebble), and two stores committing the
	// same batch at once (raw-pebble-x2: the bytes a Sync with one backup
	// persists, a copy at the home and one at the backup, here on one
	// disk as on the cluster).
	for _, stores := range []int{1, 2} {
		name := "Sync1MiB/raw-pebble"
		if stores > 1 {
			name += fmt.Sprintf("-x%d", stores)
		}
		b.Run(name, func(b *testing.B) {
			dbs := make([]*pebble.DB, stores)
			for k := range dbs {
				db, err := pebble.Open(b.TempDir(), &pebble.Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer db.Close()
				dbs[k] = db
			}
			b.SetBytes(dirty * ps)
			for i := 0; b.Loop(); i++ {
				var wg sync.WaitGroup
				errs := make([]error, stores)
				for k, db := range dbs {
					wg.Go(func() { errs[k] = commitPages(db, i, dirty, stride, ps) })
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// commitPages commits the pages of a Sync1MiB iteration i into db as one
// batch with pebble.Sync: dirty pages of ps bytes, stride pages apart.
func commitPages(db *pebble.DB, i, dirty, stride, ps int) error {
	batch := db.NewBatch()
	defer batch.Close()
	val := make([]byte, ps)
	key := make([]byte, 20)
	for j := range dirty {
		binary.BigEndian.PutUint32(key, 1)
		binary.BigEndian.PutUint64(key[4:], uint64(j*stride+i%stride))
		binary.BigEndian.PutUint64(key[12:], uint64(i))
		binary.LittleEndian.PutUint64(val, uint64(i)<<32|uint64(j))
		if err := batch.Set(key, val, nil); err != nil {
			return err
		}
	}
	return batch.Commit(pebble.Sync)
}

// BenchmarkDurableRestart measures a whole-cluster restart with a large
// Durable region (DSM_RESTART_BYTES, 1 GiB by default; docs/benchmarks.md,
// make bench-durable): the region is written in full through WriteAt and
// synced from a client of n1 (fill-MB/s), then each iteration kills every
// dsmd with kill -9 and starts them again, and reports the seconds from the
// restart until n1 lists every member alive at a new incarnation
// (alive-s), until no shard waits for
// a page store to load it (revived-s), until a client of n1 has
// read the whole region back and found every page's mark (read-all-s: a
// third of it local to n1, the rest remote misses), and until every node
// says healthy (healthy-s: every shard has its complete backups again).
func BenchmarkDurableRestart(b *testing.B) {
	size := envInt(b, "DSM_RESTART_BYTES", 1<<30)
	const (
		ps    = 4096
		chunk = 4 << 20
	)
	if size%chunk != 0 {
		b.Fatalf("DSM_RESTART_BYTES=%d: want a multiple of %d", size, chunk)
	}
	c := startCluster(b, 3)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	mark := func(buf []byte, off int64) {
		for p := 0; p < len(buf); p += ps {
			binary.LittleEndian.PutUint64(buf[p:], uint64(off)+uint64(p)+1)
		}
	}

	cl, err := dsm.Dial(ctx, c.nodes[0].socket)
	if err != nil {
		b.Fatal(err)
	}
	if err := cl.CreateRegion(ctx, "restart", int64(size), dsm.WithDurability(dsm.Durable)); err != nil {
		b.Fatal(err)
	}
	r, err := cl.Map(ctx, "restart")
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, chunk)
	start := time.Now()
	for off := int64(0); off < int64(size); off += chunk {
		mark(buf, off)
		if _, err := r.WriteAt(buf, off); err != nil {
			b.Fatal(err)
		}
		if (off+chunk)%(64<<20) == 0 || off+chunk == int64(size) {
			if err := r.Sync(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	fill := time.Since(start)
	r.Close()
	cl.Close()

	b.Logf("filled and synced %d MiB in %v (%.1f MB/s)", size>>20, fill.Round(time.Millisecond), float64(size)/fill.Seconds()/1e6)
	var info struct {
		ShardCount uint32 `json:"shard_count"`
	}
	c.ctlJSON(1, &info, "region", "info", "restart")

	var alive, revived, readAll, healthy time.Duration
	for b.Loop() {
		before, err := c.incarnations(1)
		if err != nil {
			b.Fatal(err)
		}
		c.killAndRestart(b, 1, 2, 3)
		restarted := time.Now()
		eventually(b, "n1 lists every node at a new incarnation", 5*time.Minute, func() error {
			now, err := c.incarnations(1)
			if err != nil {
				return err
			}
			for node, inc := range now {
				if inc <= before[node] {
					return fmt.Errorf("n1 lists n%d at incarnation %d", node, inc)
				}
			}
			return nil
		})
		c.waitAllAlive(1)
		alive += time.Since(restarted)
		c.waitRevived(1, info.ShardCount, 30*time.Minute)
		revived += time.Since(restarted)
		readBackMarks(b, ctx, c.nodes[0].socket, "restart", size, chunk)
		readAll += time.Since(restarted)
		b.Logf("restart: every member alive after %v, every shard loaded from a page store after %v, the region read back after %v",
			alive.Round(time.Millisecond), revived.Round(time.Millisecond), readAll.Round(time.Millisecond))
		// Healthy: every shard has its complete backups again, which
		// the homes fill from their pages (all of them, at this size).
		for i := 1; i <= 3; i++ {
			c.waitHealthyWithin(i, 30*time.Minute)
		}
		healthy += time.Since(restarted)
	}
	b.ReportMetric(float64(size)/fill.Seconds()/1e6, "fill-MB/s")
	b.ReportMetric(alive.Seconds()/float64(b.N), "alive-s")
	b.ReportMetric(revived.Seconds()/float64(b.N), "revived-s")
	b.ReportMetric(readAll.Seconds()/float64(b.N), "read-all-s")
	b.ReportMetric(healthy.Seconds()/float64(b.N), "healthy-s")
}

// readBackMarks maps region through the dsmd at socket and reads all of it
// in chunks, requiring that every page starts with its mark (its offset
// plus one, little-endian).
func readBackMarks(b *testing.B, ctx context.Context, socket, region string, size int64, chunk int) {
	b.Helper()
	cl, err := dsm.Dial(ctx, socket)
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	r, err := cl.Map(ctx, region)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	buf := make([]byte, chunk)
	for off := int64(0); off < size; off += int64(chunk) {
		if _, err := r.ReadAt(buf, off); err != nil {
			b.Fatal(err)
		}
		for p := 0; p < chunk; p += 4096 {
			if got, want := binary.LittleEndian.Uint64(buf[p:]), uint64(off)+uint64(p)+1; got != want {
				b.Fatalf("page at %d reads mark %d after the restart, want %d", off+int64(p), got, want)
			}
		}
	}
}
