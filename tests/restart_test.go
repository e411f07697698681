package tests

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestWholeClusterRestart kills every dsmd of a three-node cluster with
// kill -9 at once and restarts them all from their data directories
// (docs/durability.md §4), DSM_DURABLE_ROUNDS times (1 by default; make
// durable-rounds runs 20). Each round, a client of the Go library on
// every node writes a Durable region through its mapping and Syncs after
// every three writes, then writes a few pages that no Sync follows; a
// Memory region gets synced writes too. After the restart every
// page of the durable region reads, on every node, as the last synced
// image, except that a page written without Sync since may also show that
// write (an unsynced write may survive through one copy, never half of
// it); the memory region reads zeros and `region info` says "contents
// lost at restart" for it and not for the durable one.
func TestWholeClusterRestart(t *testing.T) {
	rounds := int(envInt(t, "DSM_DURABLE_ROUNDS", 1))
	seed := uint64(envInt(t, "DSM_DURABLE_SEED", time.Now().UnixNano()))
	t.Logf("%d rounds, seed %d (DSM_DURABLE_SEED replays it)", rounds, seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	const (
		durSize = 8 << 20 // 4 shards of 2 MiB: homes on every node
		memSize = 4 << 20
		synced  = 12 // Syncs a round (of three writes each)
		loose   = 4  // unsynced writes a round
	)
	c := startClusterWith(t, 3, nil)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	c.mustCtl(t, 1, "region", "create", "dur", "8MiB", "--durable")
	c.mustCtl(t, 1, "region", "create", "mem", "4MiB")
	image := make([]byte, durSize) // the last synced image
	readAll := func(node int, region string, size int) []byte {
		t.Helper()
		var got string
		eventually(t, fmt.Sprintf("n%d reads all of %s", node, region), 90*time.Second, func() error {
			out, errs, code := c.ctl(node, "get", region, "0", strconv.Itoa(size), "--raw")
			if code != 0 {
				return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
			}
			if len(out) != size {
				return fmt.Errorf("%d bytes", len(out))
			}
			got = out
			return nil
		})
		return []byte(got)
	}
	put := func(node int, region string, off int, data string, sync bool) {
		t.Helper()
		args := []string{"put", region, strconv.Itoa(off), data}
		if sync {
			args = append(args, "--sync")
		}
		// A Sync while the cluster moves shards after a restart may fail
		// with a line that says to retry it; the write is the same again.
		eventually(t, fmt.Sprintf("put %s at %d on n%d", region, off, node), 60*time.Second, func() error {
			if _, errs, code := c.ctl(node, args...); code != 0 {
				return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
			}
			return nil
		})
	}
	type write struct {
		off  int
		data string
	}
	for round := 1; round <= rounds; round++ {
		// Every node's client writes through its mapping and Syncs every
		// few writes; a write is in the synced image once its Sync
		// returned. Then a few writes that no Sync follows.
		clients := make([]*clientProc, 3)
		for i := range clients {
			clients[i] = c.startClient(t, i+1, "dur", "repl")
		}
		store := func(cl *clientProc, w write) {
			t.Helper()
			if got := cl.call(t, fmt.Sprintf("put-bytes %d %x", w.off, w.data)); got != "ok" {
				t.Fatalf("put-bytes on n%d: %s", cl.node, got)
			}
		}
		for batch := range synced / 3 {
			for i, cl := range clients {
				var ws []write
				for j := range 3 {
					off := rng.IntN(durSize/4096)*4096 + rng.IntN(4000)
					ws = append(ws, write{off, fmt.Sprintf("round %d batch %d node %d write %d %x", round, batch, i+1, j, rng.Uint64())})
					store(cl, ws[j])
				}
				// A Sync while the cluster moves shards after a restart
				// may fail with a line that says to retry it.
				eventually(t, fmt.Sprintf("a Sync on n%d", cl.node), 60*time.Second, func() error {
					if _, err := io.WriteString(cl.stdin, "sync\n"); err != nil {
						t.Fatalf("dsmclient on n%d: %v: %s", cl.node, err, cl.stderrString())
					}
					if got := cl.next(t); got != "ok" {
						return fmt.Errorf("%s", got)
					}
					return nil
				})
				for _, w := range ws {
					copy(image[w.off:], w.data)
				}
			}
		}
		var unsynced []write
		for i := range loose {
			off := rng.IntN(durSize/4096)*4096 + rng.IntN(4000)
			w := write{off, fmt.Sprintf("round %d unsynced %d %x", round, i, rng.Uint64())}
			store(clients[i%3], w)
			unsynced = append(unsynced, w)
		}
		for i := range 3 {
			put(i+1, "mem", rng.IntN(memSize/4096)*4096, fmt.Sprintf("memory round %d node %d", round, i+1), true)
		}

		c.killAndRestart(t, 1, 2, 3)
		for _, cl := range clients {
			cl.kill(t)
		}
		restarted := time.Now()
		// Until a page store has loaded a shard again, a read of it
		// waits, and fails, if it does, as unavailable: the region is
		// durable, so its pages are never lost.
		eventually(t, fmt.Sprintf("round %d: n1 reads the durable region as soon as it serves", round), 90*time.Second, func() error {
			_, errs, code := c.ctl(1, "get", "dur", "0", strconv.Itoa(durSize), "--raw")
			if code != 0 && strings.Contains(errs, "lost") {
				t.Fatalf("round %d: a read of the durable region after the restart: %s", round, strings.TrimSpace(errs))
			}
			if code != 0 {
				return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
			}
			return nil
		})
		t.Logf("round %d: n1 read the durable region %v after the restart", round, time.Since(restarted).Round(100*time.Millisecond))
		for i := 1; i <= 3; i++ {
			c.waitHealthy(i)
		}
		got := readAll(1, "dur", durSize)
		t.Logf("round %d: the durable region read back %v after the restart", round, time.Since(restarted).Round(100*time.Millisecond))
		// Each unsynced write either survived whole or not at all.
		for _, w := range unsynced {
			at := got[w.off : w.off+len(w.data)]
			if string(at) == w.data {
				copy(image[w.off:], w.data)
				t.Logf("round %d: the unsynced write at %d survived", round, w.off)
			}
		}
		for p := 0; p < durSize; p += 4096 {
			if !bytes.Equal(got[p:p+4096], image[p:p+4096]) {
				t.Fatalf("round %d: page %d of the durable region reads %.48q, the last synced image %.48q (seed %d)",
					round, p/4096, strings.Trim(string(got[p:p+4096]), "\x00"), strings.Trim(string(image[p:p+4096]), "\x00"), seed)
			}
		}
		for i := 2; i <= 3; i++ {
			if other := readAll(i, "dur", durSize); !bytes.Equal(other, got) {
				t.Fatalf("round %d: n%d reads the durable region otherwise than n1", round, i)
			}
		}
		if mem := readAll(round%3+1, "mem", memSize); !bytes.Equal(mem, make([]byte, memSize)) {
			t.Fatalf("round %d: the memory region does not read zeros after the restart", round)
		}
		var info struct {
			Region struct {
				ContentsLost bool `json:"contents_lost"`
			} `json:"region"`
		}
		c.ctlJSON(2, &info, "region", "info", "mem")
		if !info.Region.ContentsLost {
			t.Fatalf("round %d: region info --json of the memory region lacks contents_lost", round)
		}
		if out := c.mustCtl(t, 3, "region", "info", "mem"); !strings.Contains(out, "contents lost at restart") {
			t.Fatalf("round %d: region info of the memory region does not say contents lost at restart:\n%s", round, out)
		}
		info.Region.ContentsLost = false
		c.ctlJSON(2, &info, "region", "info", "dur")
		if info.Region.ContentsLost {
			t.Fatalf("round %d: the durable region says contents lost", round)
		}
	}
}

// TestDurableShardOutlivesItsCopies kills the home and the backup of a
// shard of a Durable region with kill -9 and restarts both, while the third
// node lives on: no copy of the shard is left in memory, which loses a
// memory region's shard (TestUnavailablePageFails). The shard comes back
// from the page store of the node that held it complete when it was lost
// (docs/durability.md §4): the page synced before the kill reads back on
// every node, a page written and synced after reads back too, and `region
// info` does not say contents lost.
func TestDurableShardOutlivesItsCopies(t *testing.T) {
	longTest(t)
	c := startClusterWith(t, 3, nil)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	c.mustCtl(t, 1, "region", "create", "dur", "16MiB", "--durable")
	for i := 1; i <= 3; i++ {
		eventually(t, fmt.Sprintf("n%d serves dur", i), 30*time.Second, func() error {
			if _, errs, code := c.ctl(i, "get", "dur", "0", "1"); code != 0 {
				return fmt.Errorf("exit %d: %s", code, errs)
			}
			return nil
		})
	}
	first, home, backup, survivor := c.firstShardCopies(t, "dur")
	off := strconv.FormatUint(first*4096, 10)
	next := strconv.FormatUint((first+1)*4096, 10)
	t.Logf("page %d: home n%d, backup n%d; n%d lives on", first, home, backup, survivor)
	c.mustCtl(t, survivor, "put", "dur", off, "synced-before-the-kill", "--sync")
	c.killAndRestart(t, home, backup)
	for i := 1; i <= 3; i++ {
		eventually(t, fmt.Sprintf("n%d reads the synced page", i), 90*time.Second, func() error {
			out, errs, code := c.ctl(i, "get", "dur", off, "22", "--raw")
			if code != 0 {
				return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
			}
			if out != "synced-before-the-kill" {
				t.Fatalf("n%d reads %q after the home and the backup restarted; want the synced page", i, out)
			}
			return nil
		})
	}
	eventually(t, "a synced write after the restart", 60*time.Second, func() error {
		if _, errs, code := c.ctl(home, "put", "dur", next, "synced-after", "--sync"); code != 0 {
			return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
		}
		return nil
	})
	if out := c.mustCtl(t, survivor, "get", "dur", next, "12", "--raw"); out != "synced-after" {
		t.Fatalf("n%d reads %q; want synced-after", survivor, out)
	}
	var info struct {
		Region struct {
			ContentsLost bool `json:"contents_lost"`
		} `json:"region"`
	}
	c.ctlJSON(survivor, &info, "region", "info", "dur")
	if info.Region.ContentsLost {
		t.Fatal("the durable region says contents lost")
	}
}
