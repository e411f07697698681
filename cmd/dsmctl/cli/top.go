package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

type topNodeJSON struct {
	Node          uint32  `json:"node_id"`
	FaultsPerS    float64 `json:"faults_per_s"`
	MissesPerS    float64 `json:"misses_per_s"`
	InvalSentPerS float64 `json:"invalidations_sent_per_s"`
	InvalRecvPerS float64 `json:"invalidations_received_per_s"`
	BytesInPerS   float64 `json:"bytes_in_per_s"`
	BytesOutPerS  float64 `json:"bytes_out_per_s"`
	MissP50NS     uint64  `json:"miss_p50_ns"`
	MissP99NS     uint64  `json:"miss_p99_ns"`
	MissP999NS    uint64  `json:"miss_p999_ns"`
	CacheBytes    uint64  `json:"cache_bytes"`
	CacheCapacity uint64  `json:"cache_capacity_bytes"`
	DirtyPages    uint64  `json:"dirty_pages"`
	Error         string  `json:"error,omitempty"`
}

type topFrameJSON struct {
	IntervalNS int64         `json:"interval_ns"`
	Nodes      []topNodeJSON `json:"nodes"`
}

func (a *app) topCmd() *cobra.Command {
	var interval time.Duration
	var count int
	var once bool
	c := &cobra.Command{
		Use:   "top",
		Short: "Live per-node rates: faults, misses, invalidations, bytes moved, miss latency",
		Long: `top asks every node for its counters each --interval and shows the rates
over the last interval, per node: faults/s, misses/s, invalidations sent and
received per second, bytes in and out per second, miss latency percentiles
(since the node started), cache use and dirty pages. Rates come from the
nodes' own timestamps. On a terminal the screen is redrawn; elsewhere each
frame follows the last. --json prints one JSON object per line per frame.
Stop with Ctrl-C, or give --count or --once.`,
		Example: "  dsmctl top\n  dsmctl top --once\n  dsmctl top --count 10 --interval 500ms --json > rates.jsonl",
		Args:    args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if once {
				count = 1
			}
			if interval <= 0 || count < 0 {
				return usagef("--interval must be positive and --count at least 0")
			}
			cl, err := a.admin()
			if err != nil {
				return err
			}
			prev, err := a.stats(cmd.Context(), cl)
			if err != nil {
				return err
			}
			for frame := 0; count == 0 || frame < count; frame++ {
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(interval):
				}
				cur, err := a.stats(cmd.Context(), cl)
				if cmd.Context().Err() != nil {
					return nil // interrupted: not an error
				}
				if err != nil {
					return err
				}
				f := topFrame(prev, cur, interval)
				prev = cur
				if a.json {
					if err := a.printJSONLine(f); err != nil {
						return err
					}
					continue
				}
				if a.env.StdoutTTY {
					io.WriteString(a.env.Stdout, "\x1b[H\x1b[2J")
				} else if frame > 0 {
					io.WriteString(a.env.Stdout, "\n")
				}
				if err := a.renderTop(f); err != nil {
					return err
				}
			}
			return nil
		},
	}
	c.Flags().DurationVar(&interval, "interval", time.Second, "time between frames")
	c.Flags().IntVar(&count, "count", 0, "stop after this many frames (0: until interrupted)")
	c.Flags().BoolVar(&once, "once", false, "print one frame and exit (same as --count 1)")
	return c
}

func (a *app) stats(ctx context.Context, cl dsmpb.AdminClient) (map[uint32]*dsmpb.NodeStats, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	r, err := cl.Stats(ctx, &dsmpb.StatsRequest{AllNodes: true})
	if err != nil {
		return nil, err
	}
	m := make(map[uint32]*dsmpb.NodeStats, len(r.Nodes))
	for _, n := range r.Nodes {
		m[n.NodeId] = n
	}
	return m, nil
}

func sumFaults(n *dsmpb.NodeStats) uint64 {
	var s uint64
	for _, v := range n.Faults {
		s += v
	}
	return s
}

// topFrame computes the rates between two snapshots. A node without a
// usable earlier snapshot (new, restarted, or in error) gets rates of zero
// and its gauges.
func topFrame(prev, cur map[uint32]*dsmpb.NodeStats, interval time.Duration) topFrameJSON {
	f := topFrameJSON{IntervalNS: int64(interval), Nodes: []topNodeJSON{}}
	keys := make([]uint32, 0, len(cur))
	for k := range cur {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	for _, k := range keys {
		c := cur[k]
		v := topNodeJSON{Node: k, CacheBytes: c.CacheBytes, CacheCapacity: c.CacheCapacityBytes,
			DirtyPages: c.DirtyPages, Error: c.Error,
			MissP50NS: c.GetMissLatency().GetP50Ns(), MissP99NS: c.GetMissLatency().GetP99Ns(),
			MissP999NS: c.GetMissLatency().GetP999Ns()}
		p := prev[k]
		if p != nil && p.Error == "" && c.Error == "" && c.TimeUnixNano > p.TimeUnixNano {
			secs := float64(c.TimeUnixNano-p.TimeUnixNano) / 1e9
			r := func(now, before uint64) float64 {
				if now < before { // counters reset: the node restarted
					return 0
				}
				return float64(now-before) / secs
			}
			v.FaultsPerS = r(sumFaults(c), sumFaults(p))
			v.MissesPerS = r(c.Misses, p.Misses)
			v.InvalSentPerS = r(c.InvalidationsSent, p.InvalidationsSent)
			v.InvalRecvPerS = r(c.InvalidationsReceived, p.InvalidationsReceived)
			v.BytesInPerS = r(c.BytesIn, p.BytesIn)
			v.BytesOutPerS = r(c.BytesOut, p.BytesOut)
		}
		f.Nodes = append(f.Nodes, v)
	}
	return f
}

func (a *app) renderTop(f topFrameJSON) error {
	w := a.env.Stdout
	fmt.Fprintf(w, "dsmctl top · %d node%s · every %v\n\n", len(f.Nodes), plural(len(f.Nodes)), time.Duration(f.IntervalNS))
	t := newTable("NODE", "FAULTS/S", "MISSES/S", "INV TX/S", "INV RX/S", "IN/S", "OUT/S",
		"MISS P50", "P99", "P99.9", "CACHE", "DIRTY")
	for _, n := range f.Nodes {
		if n.Error != "" {
			t.row(node(n.Node), paint(a.color(), "31", "? "+userMessage(n.Error)))
			continue
		}
		t.row(node(n.Node), rate(n.FaultsPerS), rate(n.MissesPerS), rate(n.InvalSentPerS), rate(n.InvalRecvPerS),
			FormatSize(uint64(n.BytesInPerS)), FormatSize(uint64(n.BytesOutPerS)),
			latency(n.MissP50NS), latency(n.MissP99NS), latency(n.MissP999NS),
			FormatSize(n.CacheBytes)+" / "+FormatSize(n.CacheCapacity), n.DirtyPages)
	}
	return t.write(w)
}

// printJSONLine writes v as one line of JSON (JSON Lines, for streams).
func (a *app) printJSONLine(v any) error {
	var b strings.Builder
	if err := jsonEncode(&b, v); err != nil {
		return err
	}
	_, err := io.WriteString(a.env.Stdout, b.String())
	return err
}
