package pagestore

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
)

const (
	crashChildEnv  = "DSM_PAGESTORE_CRASH_DIR"
	crashRoundEnv  = "DSM_PAGESTORE_CRASH_ROUND"
	crashWriters   = 4
	crashPagesEach = 40
)

// crashChild is the child process of TestKillNineKeepsAcknowledgedPages:
// writers store pages in a loop and print every acknowledged page as
// "region page version", until the parent kills the process.
func crashChild() {
	dir := os.Getenv(crashChildEnv)
	round, _ := strconv.Atoi(os.Getenv(crashRoundEnv))
	s, err := Open(Options{Dir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range crashWriters {
		wg.Go(func() {
			region := ids.RegionID(w%2 + 1)
			for i := 0; ; i++ {
				// Each page is written by one writer, with versions rising
				// from the round's base.
				version := uint16(round*4096 + i/crashPagesEach + 1)
				var pages []Page
				for k := range i%3 + 1 {
					no := uint64(w*1000 + (i+k*7)%crashPagesEach)
					if k > 0 && no == pages[0].No {
						continue
					}
					pages = append(pages, Page{Region: region, No: no, Version: version, Data: pageData(region, no, version, 4096)})
				}
				if err := s.Write(context.Background(), pages); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(2)
				}
				var line []byte
				for _, p := range pages {
					line = fmt.Appendf(line, "%d %d %d\n", p.Region, p.No, p.Version)
				}
				mu.Lock()
				_, err := os.Stdout.Write(line)
				mu.Unlock()
				if err != nil {
					os.Exit(2)
				}
			}
		})
	}
	wg.Wait()
}

type pageID struct {
	region ids.RegionID
	no     uint64
}

// TestKillNineKeepsAcknowledgedPages kills a writing child process at a
// random point, three times over the same directory, and checks that every
// page the child was told is written is there with its data, at its
// acknowledged version or a newer one, and that no record fails its
// checksum.
func TestKillNineKeepsAcknowledgedPages(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)
	dir := t.TempDir()
	acked := map[pageID]uint16{}
	for round := range 3 {
		kill := 50 + rng.IntN(1500)
		n := runCrashChild(t, dir, round, kill, acked)
		t.Logf("round %d: killed after %d acknowledged pages (target %d)", round, n, kill)

		s, err := Open(Options{Dir: dir})
		if err != nil {
			t.Fatalf("round %d: reopen after kill -9: %v", round, err)
		}
		for id, v := range acked {
			got, data, ok, err := s.Get(id.region, id.no)
			if err != nil || !ok {
				t.Fatalf("round %d: acknowledged region %d page %d version %d: ok %v, err %v", round, id.region, id.no, v, ok, err)
			}
			if Newer(v, got) {
				t.Fatalf("round %d: region %d page %d has version %d, older than the acknowledged %d", round, id.region, id.no, got, v)
			}
			if string(data) != string(pageData(id.region, id.no, got, 4096)) {
				t.Fatalf("round %d: region %d page %d version %d: wrong data", round, id.region, id.no, got)
			}
		}
		stored := 0
		for r := ids.RegionID(1); r <= 2; r++ {
			err := s.Scan(r, 0, ^uint64(0), func(p Page) error {
				stored++
				if string(p.Data) != string(pageData(p.Region, p.No, p.Version, 4096)) {
					return fmt.Errorf("region %d page %d version %d: wrong data", p.Region, p.No, p.Version)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("round %d: scan: %v", round, err)
			}
		}
		if stored < len(acked) {
			t.Fatalf("round %d: %d records stored, %d pages acknowledged", round, stored, len(acked))
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// runCrashChild runs the child until it has acknowledged kill pages, kills
// it with SIGKILL, and records every acknowledgement it printed in acked.
func runCrashChild(t *testing.T, dir string, round, kill int, acked map[pageID]uint16) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, crashRoundEnv+"="+strconv.Itoa(round))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n := 0
	killed := false
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var r ids.RegionID
		var no uint64
		var v uint16
		if _, err := fmt.Sscanf(sc.Text(), "%d %d %d", &r, &no, &v); err != nil {
			continue // a line cut by the kill
		}
		id := pageID{r, no}
		if old, ok := acked[id]; !ok || Newer(v, old) {
			acked[id] = v
		}
		n++
		if n >= kill && !killed {
			killed = true
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
		}
	}
	err = cmd.Wait()
	if !killed {
		t.Fatalf("child ended before the kill after %d pages: %v", n, err)
	}
	return n
}
