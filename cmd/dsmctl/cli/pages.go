package cli

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dsmkit/dsm/internal/ids"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// maxCellsLimit is the most cells one Pages request may ask for (the
// Admin service refuses more).
const maxCellsLimit = 65536

// parseSpan reads FIRST:END, a half-open range of indexes of what (pages,
// shards) given to flag; either end may be left out. open says that END
// was: the range runs to the last index.
func parseSpan(flag, what, s string) (first, end uint64, open bool, err error) {
	lo, hi, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, false, usagef("%s %q: want FIRST:END, %s indexes, END excluded (0:1024, 4096:, :64)", flag, s, what)
	}
	if lo != "" {
		if first, err = strconv.ParseUint(lo, 0, 64); err != nil {
			return 0, 0, false, usagef("%s %q: %q is not a %s index", flag, s, lo, what)
		}
	}
	if hi == "" {
		return first, 0, true, nil
	}
	if end, err = strconv.ParseUint(hi, 0, 64); err != nil {
		return 0, 0, false, usagef("%s %q: %q is not a %s index", flag, s, hi, what)
	}
	if first >= end {
		return 0, 0, false, usagef("%s %q is empty", flag, s)
	}
	return first, end, false, nil
}

// parseRange reads --range A:B, a half-open range of page indexes; either
// end may be left out (A: to the end, :B from 0). total is the region's
// page count.
func parseRange(s string, total uint64) (first, count uint64, err error) {
	if s == "" {
		return 0, total, nil
	}
	first, end, open, err := parseSpan("--range", "page", s)
	if err != nil {
		return 0, 0, err
	}
	if open {
		end = total
	}
	if end > total {
		return 0, 0, usagef("--range %q: the region has %d pages (0:%d)", s, total, total)
	}
	if first >= end {
		return 0, 0, usagef("--range %q is empty", s)
	}
	return first, end - first, nil
}

type pageCellJSON struct {
	FirstPage  uint64   `json:"first_page"`
	Pages      uint64   `json:"pages"`
	Modified   uint64   `json:"modified"`
	Shared     uint64   `json:"shared"`
	Invalid    uint64   `json:"invalid"`
	Owners     []uint32 `json:"owners"`
	MaxSharers uint32   `json:"max_sharers"`
	Sharers    []uint32 `json:"sharers"`
	Local      string   `json:"local_state"`
	Dirty      uint64   `json:"dirty"`
	Symbol     string   `json:"symbol"`
}

func (a *app) pagesCmd() *cobra.Command {
	var rng string
	var width, maxCells int
	var local bool
	c := &cobra.Command{
		Use:   "pages REGION",
		Short: "Picture the MSI state of a region's pages across the cluster",
		Long: `pages draws a grid with one cell per page, or per group of pages when the
range has more pages than --max-cells. Each cell is a letter, digit or dot,
and on a terminal also a color:

  A, B, ...  Modified (M) at one node; the legend says which letter is which
  *          Modified at several nodes (a group of pages only)
  1-9, +     Shared (S) at that many nodes (+ for 10 or more)
  .          Invalid (I): no node holds a copy
  ?          unknown

A group of pages shows its strongest state: M over S over I. The state is
cluster-wide (read from the coherence words at the homes) unless --local
asks for this node's copies only.`,
		Example: `  dsmctl pages feat
  dsmctl pages feat --range 0:256
  dsmctl pages feat --range 4096: --max-cells 2048 --width 128
  dsmctl pages feat --json | jq '[.cells[] | select(.modified > 0)] | length'`,
		Args:              args(1, 1, "REGION"),
		ValidArgsFunction: a.completeRegion,
		RunE: func(cmd *cobra.Command, argv []string) error {
			if width < 1 || maxCells < 1 || maxCells > maxCellsLimit {
				return usagef("--width must be positive and --max-cells from 1 to %d", maxCellsLimit)
			}
			cl, err := a.admin()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd)
			defer cancel()
			// The region's size only: one shard, not the placement of millions.
			ri, err := cl.RegionInfo(ctx, &dsmpb.RegionInfoRequest{Name: argv[0], MaxShards: 1})
			if err != nil {
				return err
			}
			reg := regionView(ri.GetRegion())
			if reg.Pages == 0 {
				return fmt.Errorf("region %s has no pages", reg.Name)
			}
			first, count, err := parseRange(rng, reg.Pages)
			if err != nil {
				return err
			}
			// At most maxCells cells (the Pages RPC answers at most
			// maxCellsLimit), whatever the size of the region.
			group := count / uint64(maxCells)
			if count%uint64(maxCells) != 0 {
				group++
			}
			resp, err := cl.Pages(ctx, &dsmpb.PagesRequest{
				Region: argv[0], FirstPage: first, PageCount: count, Group: group, Cluster: !local})
			if err != nil {
				return err
			}
			g := newGrid(resp)
			if a.json {
				v := struct {
					Region    regionJSON        `json:"region"`
					Node      uint32            `json:"node_id"`
					FirstPage uint64            `json:"first_page"`
					PageCount uint64            `json:"page_count"`
					Group     uint64            `json:"group"`
					Cluster   bool              `json:"cluster"`
					Legend    map[string]string `json:"legend"`
					Cells     []pageCellJSON    `json:"cells"`
				}{regionView(resp.GetRegion()), resp.NodeId, resp.FirstPage, resp.PageCount,
					max(resp.Group, 1), resp.Cluster, g.legendMap(), []pageCellJSON{}}
				for _, c := range resp.Cells {
					v.Cells = append(v.Cells, pageCellJSON{c.FirstPage, c.Pages, c.Modified, c.Shared, c.Invalid,
						append([]uint32{}, c.Owners...), c.MaxSharers, append([]uint32{}, c.Sharers...),
						enumName(c.LocalState.String(), "PAGE_STATE_"), c.Dirty, string(g.symbol(c))})
				}
				return a.printJSON(v)
			}
			return g.render(a.env.Stdout, width, a.color())
		},
	}
	c.Flags().StringVar(&rng, "range", "", "pages FIRST:END (END excluded; either may be omitted)")
	c.Flags().IntVar(&width, "width", 64, "cells per row")
	c.Flags().IntVar(&maxCells, "max-cells", 1024, "group pages so that at most this many cells are drawn")
	c.Flags().BoolVar(&local, "local", false, "show only this node's copies, without asking the homes")
	return c
}

// grid draws a PagesResponse.
type grid struct {
	resp    *dsmpb.PagesResponse
	letters map[uint32]byte // owner node -> its letter, in node order
	owners  []uint32
}

// palette colors the M letters, one background per owner, in turn.
var palette = []string{"41", "44", "45", "43", "46", "101", "104", "105"}

func newGrid(resp *dsmpb.PagesResponse) *grid {
	g := &grid{resp: resp, letters: map[uint32]byte{}}
	seen := map[uint32]bool{}
	for _, c := range resp.Cells {
		if c.Modified == 0 || len(c.Owners) != 1 {
			continue
		}
		if !seen[c.Owners[0]] {
			seen[c.Owners[0]] = true
			g.owners = append(g.owners, c.Owners[0])
		}
	}
	sort.Slice(g.owners, func(i, j int) bool { return g.owners[i] < g.owners[j] })
	for i, n := range g.owners {
		if i < 26 {
			g.letters[n] = byte('A' + i)
		} else {
			g.letters[n] = '#'
		}
	}
	return g
}

func (g *grid) symbol(c *dsmpb.PageCell) byte {
	switch {
	case c.Modified > 0 && len(c.Owners) == 1:
		return g.letters[c.Owners[0]]
	case c.Modified > 0:
		return '*'
	case c.Shared > 0 && c.MaxSharers >= 10:
		return '+'
	case c.Shared > 0:
		return byte('0' + max(c.MaxSharers, 1))
	case c.Invalid > 0:
		return '.'
	}
	return '?'
}

func (g *grid) sgr(c *dsmpb.PageCell) string {
	switch s := g.symbol(c); {
	case s >= 'A' && s <= 'Z' || s == '#':
		i := sort.Search(len(g.owners), func(i int) bool { return g.owners[i] >= c.Owners[0] })
		return "1;97;" + palette[i%len(palette)]
	case s == '*':
		return "1;97;100"
	case s == '+' || s >= '5' && s <= '9':
		return "30;102"
	case s >= '1' && s <= '4':
		return "30;42"
	case s == '.':
		return "2"
	}
	return ""
}

func (g *grid) legendMap() map[string]string {
	m := map[string]string{
		"*": "M at several nodes", "1-9": "S at that many nodes", "+": "S at 10 or more nodes",
		".": "I: no copy", "?": "unknown",
	}
	for _, n := range g.owners {
		m[string(g.letters[n])] = "M at " + node(n)
	}
	return m
}

func (g *grid) render(w io.Writer, width int, color bool) error {
	r := g.resp
	reg := regionView(r.GetRegion())
	group := max(r.Group, 1)
	view := "cluster view"
	if !r.Cluster {
		view = "local view"
	}
	cell := "1 cell = 1 page"
	if group > 1 {
		cell = fmt.Sprintf("1 cell = %d pages", group)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "region %s (%s) · pages %d-%d of %d · %s pages · %s · %s from %s\n\n",
		reg.Name, ids.RegionID(reg.ID), r.FirstPage, r.FirstPage+r.PageCount-1, reg.Pages,
		FormatSize(uint64(reg.PageSize)), cell, view, node(r.NodeId))
	labelW := len(strconv.FormatUint(r.FirstPage+r.PageCount, 10))
	var mod, shared, inval, dirty uint64
	perOwner := map[uint32]uint64{}
	for i, c := range r.Cells {
		if i%width == 0 {
			if i > 0 {
				b.WriteByte('\n')
			}
			fmt.Fprintf(&b, "%*d ", labelW, c.FirstPage)
		}
		if i%width%8 == 0 {
			b.WriteByte(' ')
		}
		b.WriteString(paint(color, g.sgr(c), string(g.symbol(c))))
		mod += c.Modified
		shared += c.Shared
		inval += c.Invalid
		dirty += c.Dirty
		if len(c.Owners) == 1 {
			perOwner[c.Owners[0]] += c.Modified
		}
	}
	b.WriteString("\n\nlegend ")
	for _, n := range g.owners {
		fmt.Fprintf(&b, " %s M at %s ", paint(color, g.sgr(&dsmpb.PageCell{Modified: 1, Owners: []uint32{n}}),
			string(g.letters[n])), node(n))
	}
	fmt.Fprintf(&b, " %s M at several ", paint(color, "1;97;100", "*"))
	fmt.Fprintf(&b, " %s S at k nodes ", paint(color, "30;42", "1-9"))
	fmt.Fprintf(&b, " %s S at 10+ ", paint(color, "30;102", "+"))
	fmt.Fprintf(&b, " %s I ", paint(color, "2", "."))
	b.WriteString(" ? unknown\n")
	fmt.Fprintf(&b, "pages   M %d", mod)
	if len(g.owners) > 0 {
		var parts []string
		for _, n := range g.owners {
			parts = append(parts, fmt.Sprintf("%s %d", node(n), perOwner[n]))
		}
		fmt.Fprintf(&b, " (%s)", strings.Join(parts, ", "))
	}
	fmt.Fprintf(&b, " · S %d · I %d", shared, inval)
	if unknown := r.PageCount - min(r.PageCount, mod+shared+inval); unknown > 0 {
		fmt.Fprintf(&b, " · unknown %d", unknown)
	}
	fmt.Fprintf(&b, " · dirty on %s %d\n", node(r.NodeId), dirty)
	_, err := io.WriteString(w, b.String())
	return err
}
