package tests

import (
	"bytes"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/node/pagestore"
)

// dataDir is the --data-dir of node p.
func dataDir(t *testing.T, p *proc) string {
	t.Helper()
	i := slices.Index(p.args, "--data-dir")
	if i < 0 || i+1 >= len(p.args) {
		t.Fatalf("n%d has no --data-dir among %v", p.id, p.args)
	}
	return p.args[i+1]
}

// storedPage reads one page from the page store in a stopped node's data
// directory.
func storedPage(t *testing.T, p *proc, region uint32, no uint64) (version uint16, data []byte, ok bool) {
	t.Helper()
	s, err := pagestore.Open(pagestore.Options{Dir: filepath.Join(dataDir(t, p), "pages")})
	if err != nil {
		t.Fatalf("n%d's page store: %v", p.id, err)
	}
	defer s.Close()
	version, data, ok, err = s.Get(ids.RegionID(region), no)
	if err != nil {
		t.Fatalf("n%d's page store: page %d of region %d: %v", p.id, no, region, err)
	}
	return version, data, ok
}

// storedCount counts the pages of region in a stopped node's page store.
func storedCount(t *testing.T, p *proc, region uint32) int {
	t.Helper()
	s, err := pagestore.Open(pagestore.Options{Dir: filepath.Join(dataDir(t, p), "pages")})
	if err != nil {
		t.Fatalf("n%d's page store: %v", p.id, err)
	}
	defer s.Close()
	n := 0
	if err := s.Scan(ids.RegionID(region), 0, 1<<40, func(pagestore.Page) error { n++; return nil }); err != nil {
		t.Fatalf("n%d's page store: region %d: %v", p.id, region, err)
	}
	return n
}

// TestDurableSyncReachesDisk runs the persist requests of a durable
// region's Sync through three dsmd processes (one backup per shard):
// a page synced from the node that is neither its home nor its backup is
// in the page store of the home and of the backup; the home is killed
// with kill -9 and the next Sync of the page (retried while the failover
// is under way, each failure one clear line) persists at the promoted
// backup. A memory region's synced pages reach no store. Every dsmd is
// then killed and the stores are opened from the data directories.
func TestDurableSyncReachesDisk(t *testing.T) {
	longTest(t)
	c := startClusterWith(t, 3, nil)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	c.mustCtl(t, 1, "region", "create", "dur", "16MiB", "--durable")
	c.mustCtl(t, 1, "region", "create", "mem", "16MiB")
	var info struct {
		Region struct {
			ID         uint32 `json:"id"`
			Durability string `json:"durability"`
		} `json:"region"`
	}
	c.ctlJSON(1, &info, "region", "info", "dur")
	dur := info.Region.ID
	if info.Region.Durability != "durable" {
		t.Fatalf("region dur is %q", info.Region.Durability)
	}
	c.ctlJSON(1, &info, "region", "info", "mem")
	mem := info.Region.ID
	for i := 1; i <= 3; i++ {
		for _, r := range []string{"dur", "mem"} {
			eventually(t, fmt.Sprintf("n%d serves %s", i, r), 30*time.Second, func() error {
				if _, errs, code := c.ctl(i, "get", r, "0", "1"); code != 0 {
					return fmt.Errorf("exit %d: %s", code, errs)
				}
				return nil
			})
		}
	}
	first, home, backup, other := c.firstShardCopies(t, "dur")
	off := strconv.FormatUint(first*4096, 10)
	t.Logf("page %d: home n%d, backup n%d; written from n%d", first, home, backup, other)
	c.mustCtl(t, other, "put", "dur", off, "synced-v1", "--sync")
	c.mustCtl(t, other, "put", "mem", off, "memory-only", "--sync")

	victim := c.nodes[home-1]
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	<-victim.done
	var failures []string
	eventually(t, "a Sync after the home's kill persists", 90*time.Second, func() error {
		_, errs, code := c.ctl(other, "--timeout", "40s", "put", "dur", off, "synced-v2", "--sync")
		if code == 0 {
			return nil
		}
		line := strings.TrimSpace(errs)
		if strings.Contains(line, "\n") {
			t.Errorf("a Sync during the failover failed in several lines: %q", line)
		}
		failures = append(failures, line)
		return fmt.Errorf("exit %d: %s", code, line)
	})
	t.Logf("the Sync after the kill returned %v after it (%d failed before: %q)", time.Since(killed).Round(100*time.Millisecond),
		len(failures), failures)

	for _, p := range c.nodes {
		if p == victim {
			continue
		}
		if err := p.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-p.done
	}
	want := func(p *proc, data string) {
		t.Helper()
		v, got, ok := storedPage(t, p, dur, first)
		if !ok || v == 0 || !bytes.HasPrefix(got, []byte(data)) || len(got) != 4096 {
			t.Fatalf("n%d's page store: page %d of dur is %v, version %d, %.12q; want %q", p.id, first, ok, v, got, data)
		}
		t.Logf("n%d's store: page %d at version %d, %q", p.id, first, v, got[:len(data)])
	}
	want(victim, "synced-v1")
	want(c.nodes[backup-1], "synced-v2")
	for _, p := range c.nodes {
		if n := storedCount(t, p, mem); n != 0 {
			t.Fatalf("n%d stores %d pages of the memory region", p.id, n)
		}
	}
}
