package chaos

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// placements turns nodes that disagree about a region's homes into
// violations. The placement of a region's shards is a function of the
// protocol epoch (node/placement.go), and every dsmd logs a digest of the
// homes its engine is told with each epoch ("region members changed",
// homes=): two digests of one region and epoch that differ mean two nodes
// send one page's misses to different homes, and a copy that one home
// serves is never invalidated by an acquirer at the other (a stale read
// that lasts until the next epoch). Logs without digests (older dsmd)
// check nothing.
func (c *checker) placements(runDir string) {
	dirs, _ := filepath.Glob(filepath.Join(runDir, "nodes", "n*"))
	type key struct{ region, epoch string }
	type seen struct {
		node   int
		digest string
		t      time.Time
	}
	by := map[key][]seen{}
	for _, d := range dirs {
		node, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "n"))
		if err != nil {
			continue
		}
		f, err := os.Open(filepath.Join(d, "dsmd.log"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, `msg="region members changed"`) {
				continue
			}
			digest := field(line, "homes")
			if digest == "" {
				continue
			}
			t, _ := time.Parse(time.RFC3339Nano, field(line, "time"))
			k := key{field(line, "region"), field(line, "protocol_epoch")}
			by[k] = append(by[k], seen{node, digest, t})
		}
		f.Close()
	}
	keys := make([]key, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int { return strings.Compare(a.region+" "+a.epoch, b.region+" "+b.epoch) })
	for _, k := range keys {
		ss := by[k]
		differ := false
		for _, s := range ss[1:] {
			differ = differ || s.digest != ss[0].digest
		}
		if !differ {
			continue
		}
		slices.SortFunc(ss, func(a, b seen) int { return a.t.Compare(b.t) })
		var parts []string
		for _, s := range ss {
			parts = append(parts, fmt.Sprintf("n%d %s", s.node, s.digest))
		}
		last := ss[len(ss)-1]
		c.violate("placement", fmt.Sprintf("nodes disagree on the homes of region %s in protocol epoch %s: %s",
			k.region, k.epoch, strings.Join(parts, ", ")), last.t.UnixNano(), last.node)
	}
}
