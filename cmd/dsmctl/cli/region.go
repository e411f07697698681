package cli

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dsmkit/dsm/internal/ids"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

type regionJSON struct {
	Name         string `json:"name"`
	ID           uint32 `json:"id"`
	Size         uint64 `json:"size"`
	PageSize     uint32 `json:"page_size"`
	Pages        uint64 `json:"pages"`
	Durability   string `json:"durability"`
	Shards       uint32 `json:"shards"`
	CreatedEpoch uint64 `json:"created_epoch"`
	// Access is the region's access list; absent when it has none.
	Access *accessJSON `json:"access,omitempty"`
	// ContentsLost: a Memory region brought back empty after a restart
	// of the whole cluster.
	ContentsLost bool `json:"contents_lost,omitempty"`
	// The placement's records: completeness and promotion records, and
	// the placement checkpoint's epoch (0: none) and size.
	FillRecords      uint32 `json:"fill_records"`
	PromotionRecords uint32 `json:"promotion_records"`
	CheckpointEpoch  uint64 `json:"checkpoint_epoch,omitempty"`
	CheckpointBytes  uint32 `json:"checkpoint_bytes,omitempty"`
}

func regionView(r *dsmpb.Region) regionJSON {
	v := regionJSON{Name: r.GetName(), ID: r.GetId(), Size: r.GetSize(), PageSize: r.GetPageSize(),
		Durability: durability(r.GetDurability()), Shards: r.GetShards(), CreatedEpoch: r.GetCreatedEpoch(),
		Access: accessView(r.GetAccess()), ContentsLost: r.GetContentsLost(),
		FillRecords: r.GetFillRecords(), PromotionRecords: r.GetPromotionRecords(),
		CheckpointEpoch: r.GetCheckpointEpoch(), CheckpointBytes: r.GetCheckpointBytes()}
	if v.PageSize != 0 {
		v.Pages = (v.Size + uint64(v.PageSize) - 1) / uint64(v.PageSize)
	}
	return v
}

func (a *app) regionCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "region",
		Short:   "Create, list, describe, delete, export and import regions",
		Example: "  dsmctl region create feat 64GiB --durable\n  dsmctl region ls\n  dsmctl region info feat\n  dsmctl region access feat --allow-gid ml\n  dsmctl region rm feat",
		Args:    args(0, 0, "a subcommand (create, ls, info, access, rm)"),
		RunE:    needSubcommand,
	}
	c.AddCommand(a.regionCreateCmd(), a.regionLsCmd(), a.regionRmCmd(), a.regionInfoCmd(), a.regionAccessCmd(),
		a.regionExportCmd(), a.regionImportCmd())
	return c
}

func (a *app) regionCreateCmd() *cobra.Command {
	var pageSize string
	var durable bool
	var access accessFlags
	c := &cobra.Command{
		Use:   "create NAME SIZE",
		Short: "Create a region of SIZE bytes (units: KiB, MiB, GiB, TiB; kB, MB... are decimal)",
		Long: `create adds a region to the cluster directory. SIZE takes units (4KiB, 64GiB,
1TiB) and must be a whole number of pages. Regions are sparse: an untouched
page costs nothing.

If a region of that name exists with the same size, page size and
durability, create says so and succeeds (exit 0) without touching it; with
another spec it fails.

--durable makes the region durable: Sync writes dirty pages back to their
homes and backups, as for every region, then waits until they are on disk
there (each node's DATA_DIR/pages) and fails, naming the node, when a disk
cannot take them. This build does not load them again: a restarted node
rejoins empty, and a restart of the whole cluster loses the region's
pages, durable or not.

--allow-uid, --allow-gid, --read-only-uid and --read-only-gid give the new
region an access list (see dsmctl region access --help); without them it is
open to every process allowed on dsmd's socket. A region that exists keeps
its own list.`,
		Example: "  dsmctl region create feat 64GiB\n  dsmctl region create graph 1TiB --page-size 64KiB --durable\n" +
			"  dsmctl region create secrets 1GiB --allow-uid alice --read-only-gid auditors",
		Args: args(2, 2, "NAME and SIZE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			size, err := ParseSize(argv[1])
			if err != nil {
				return usageError{err: err}
			}
			ps, err := ParseSize(pageSize)
			if err != nil {
				return usagef("--page-size: %v", err)
			}
			switch {
			case ps > 1<<31 || ps&(ps-1) != 0 || ps == 0:
				return usagef("--page-size %s is not a power of two from 4KiB to 2MiB", pageSize)
			case size == 0:
				return usagef("SIZE is zero: a region has at least one page")
			case size%ps != 0:
				return usagef("SIZE %s is not a whole number of %s pages", argv[1], FormatSize(ps))
			}
			acc, err := access.access()
			if err != nil {
				return err
			}
			d := dsmpb.Durability_DURABILITY_MEMORY
			if durable {
				d = dsmpb.Durability_DURABILITY_DURABLE
			}
			cl, err := a.admin()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd)
			defer cancel()
			r, err := cl.CreateRegion(ctx, &dsmpb.CreateRegionRequest{
				Name: argv[0], Size: size, PageSize: uint32(ps), Durability: d, Access: acc})
			if status.Code(err) == codes.AlreadyExists {
				return hintError{err, "`dsmctl region info " + argv[0] + "` shows its spec"}
			}
			if err != nil {
				return err
			}
			v := regionView(r.GetRegion())
			if a.json {
				return a.printJSON(struct {
					regionJSON
					Existed bool `json:"existed"`
				}{v, r.Existed})
			}
			if r.Existed {
				_, err = fmt.Fprintf(a.env.Stdout, "region %s exists (%s), same spec\n", v.Name, ids.RegionID(v.ID))
				return err
			}
			_, err = fmt.Fprintf(a.env.Stdout, "created region %s (%s): %s in %s pages, %s, %d shard%s\n",
				v.Name, ids.RegionID(v.ID), FormatSize(v.Size), FormatSize(uint64(v.PageSize)),
				v.Durability, v.Shards, plural(int(v.Shards)))
			if err == nil && v.Access != nil {
				_, err = fmt.Fprintf(a.env.Stdout, "access: %s\n", accessLine(v.Access))
			}
			return err
		},
	}
	c.Flags().StringVar(&pageSize, "page-size", "4KiB", "page size, a power of two from 4KiB to 2MiB")
	c.Flags().BoolVar(&durable, "durable", false, "make Sync persist the pages on disk at their homes and backups (not loaded again after a restart yet)")
	access.add(c.Flags())
	return c
}

func (a *app) regionLsCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the regions",
		Example: "  dsmctl region ls\n  dsmctl region ls --json | jq -r '.regions[].name'",
		Args:    args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := a.admin()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd)
			defer cancel()
			rs, err := cl.Regions(ctx, &dsmpb.RegionsRequest{})
			if err != nil {
				return err
			}
			list := append([]*dsmpb.Region(nil), rs.Regions...)
			sort.Slice(list, func(i, j int) bool { return list[i].GetName() < list[j].GetName() })
			if a.json {
				v := struct {
					Epoch   uint64       `json:"epoch"`
					Regions []regionJSON `json:"regions"`
				}{Epoch: rs.Epoch, Regions: []regionJSON{}}
				for _, r := range list {
					v.Regions = append(v.Regions, regionView(r))
				}
				return a.printJSON(v)
			}
			if len(list) == 0 {
				_, err := fmt.Fprintln(a.env.Stdout, "no regions; create one with `dsmctl region create NAME SIZE`")
				return err
			}
			t := newTable("NAME", "ID", "SIZE", "PAGE", "PAGES", "DURABILITY", "SHARDS")
			for _, r := range list {
				v := regionView(r)
				t.row(v.Name, ids.RegionID(v.ID), FormatSize(v.Size), FormatSize(uint64(v.PageSize)),
					v.Pages, v.Durability, v.Shards)
			}
			return t.write(a.env.Stdout)
		},
	}
}

func (a *app) regionRmCmd() *cobra.Command {
	var force bool
	c := &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"delete"},
		Short:   "Delete a region and free its pages on every node",
		Long: `rm deletes a region: every node stops serving it and frees its page cache
and home memory. Its data is gone; a region created again under the same
name is a new, empty region with a new id.

While processes on any alive member map the region, dsmd refuses and says
who maps it. --force deletes it anyway: those mappings are cut off, and
their next access fails (the dsm library reports an unknown region).`,
		Example:           "  dsmctl region rm feat\n  dsmctl region rm feat --force   # even while processes map it",
		Args:              args(1, 1, "NAME"),
		ValidArgsFunction: a.completeRegion,
		RunE: func(cmd *cobra.Command, argv []string) error {
			cl, err := a.admin()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd)
			defer cancel()
			r, err := cl.DeleteRegion(ctx, &dsmpb.DeleteRegionRequest{Name: argv[0], Force: force})
			if status.Code(err) == codes.FailedPrecondition && !force {
				return hintError{err, "`dsmctl region rm " + argv[0] + " --force` deletes it anyway and cuts the mappings off"}
			}
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(struct {
					Deleted  string `json:"deleted"`
					ID       uint32 `json:"id"`
					Mappings uint64 `json:"mappings_cut_off"`
				}{argv[0], r.Id, r.Mappings})
			}
			var b strings.Builder
			fmt.Fprintf(&b, "deleted region %s", argv[0])
			if r.Id != 0 {
				fmt.Fprintf(&b, " (%s)", ids.RegionID(r.Id))
			}
			switch r.Mappings {
			case 0:
			case 1:
				b.WriteString("; 1 mapping was cut off")
			default:
				fmt.Fprintf(&b, "; %d mappings were cut off", r.Mappings)
			}
			b.WriteByte('\n')
			_, err = io.WriteString(a.env.Stdout, b.String())
			return err
		},
	}
	c.Flags().BoolVar(&force, "force", false, "delete even while processes map the region; their mappings are cut off")
	return c
}

type shardJSON struct {
	Index     uint32   `json:"index"`
	FirstPage uint64   `json:"first_page"`
	PageCount uint64   `json:"page_count"`
	Home      uint32   `json:"home"`
	Backups   []uint32 `json:"backups"`
	// HomeLost: the home restarted or left since the region was created;
	// the shard's pages are lost (they fail as unavailable).
	HomeLost bool `json:"home_lost"`
}

type homeJSON struct {
	Node         uint32 `json:"node_id"`
	Shards       int    `json:"shards"`
	Pages        uint64 `json:"pages"`
	BackupShards int    `json:"backup_shards"`
	BackupPages  uint64 `json:"backup_pages"`
	// Lost: the node's incarnation of the region's creation is gone, and
	// with it the pages of its home shards.
	Lost bool `json:"lost"`
}

// regionInfoJSON is the output of region info --json.
type regionInfoJSON struct {
	Region regionJSON `json:"region"`
	Epoch  uint64     `json:"epoch"`
	// ShardCount is the region's number of shards; Shards lists those
	// asked for (--shards), NextShard is the first after them
	// (ShardCount when the listing reaches the end).
	ShardCount uint64 `json:"shard_count"`
	// Homes sums placement per node: over every shard when HomesComplete,
	// else over the listed shards only (regions of more than
	// maxListedShards shards).
	Homes         []homeJSON  `json:"homes"`
	HomesComplete bool        `json:"homes_complete"`
	Shards        []shardJSON `json:"shards"`
	NextShard     uint64      `json:"next_shard"`
	// Mappings are the processes that map the region, per node; null with
	// MappingsError set when dsmd could not say.
	Mappings      []nodeMappingsJSON `json:"mappings"`
	MappingsError string             `json:"mappings_error,omitempty"`
}

type nodeMappingsJSON struct {
	Node  uint32  `json:"node_id"`
	PIDs  []int32 `json:"pids"`
	Error string  `json:"error,omitempty"`
}

// maxListedShards is the most shards one RegionInfo request may ask for
// (dsmd's MaxListedShards).
const maxListedShards = 65536

// regionShards asks dsmd for the shards first to end of region name (END
// excluded; to the last shard when open), at most maxListedShards a
// request. It returns the first answer (region, epoch, shard count), the
// shards and the first shard not listed. A dsmd older than paging answers
// every shard at once without a count; the range is cut from that.
func (a *app) regionShards(cmd *cobra.Command, cl dsmpb.AdminClient, name string, first, end uint64, open bool) (
	head *dsmpb.RegionInfoResponse, shards []*dsmpb.Shard, next uint64, err error) {
	next = first
	for {
		want := uint64(maxListedShards)
		if !open {
			want = min(want, end-next)
		}
		ctx, cancel := a.call(cmd)
		ri, err := cl.RegionInfo(ctx, &dsmpb.RegionInfoRequest{Name: name, FirstShard: next, MaxShards: uint32(want)})
		cancel()
		if err != nil {
			return nil, nil, 0, err
		}
		if head == nil {
			head = ri
			if ri.ShardCount == 0 && ri.NextShard == 0 && len(ri.Shards) > 0 { // an older dsmd: every shard
				head.ShardCount = uint64(len(ri.Shards))
				if open || end > head.ShardCount {
					end = head.ShardCount
				}
				if first >= end {
					return nil, nil, 0, usagef("--shards: region %s has %d shards (0:%d)", name, head.ShardCount, head.ShardCount)
				}
				return head, ri.Shards[first:end], end, nil
			}
			if first >= ri.ShardCount {
				return nil, nil, 0, usagef("--shards: region %s has %d shards (0:%d)", name, ri.ShardCount, ri.ShardCount)
			}
		}
		shards = append(shards, ri.Shards...)
		if ri.NextShard <= next { // no progress: do not ask forever
			return head, shards, next + uint64(len(ri.Shards)), nil
		}
		next = ri.NextShard
		if next >= head.ShardCount || !open && next >= end {
			return head, shards, next, nil
		}
	}
}

// homes sums placement per node over shards.
func homes(shards []*dsmpb.Shard) []homeJSON {
	m := map[uint32]*homeJSON{}
	get := func(n uint32) *homeJSON {
		if m[n] == nil {
			m[n] = &homeJSON{Node: n}
		}
		return m[n]
	}
	for _, s := range shards {
		h := get(s.Home)
		h.Shards++
		h.Pages += s.PageCount
		h.Lost = h.Lost || s.HomeLost
		for _, b := range s.Backups {
			h := get(b)
			h.BackupShards++
			h.BackupPages += s.PageCount
		}
	}
	list := []homeJSON{}
	for _, h := range m {
		list = append(list, *h)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Node < list[j].Node })
	return list
}

// pidList writes at most 8 pids, then how many more; 0 (unknown) as "?".
func pidList(pids []int32) string {
	if len(pids) == 0 {
		return "-"
	}
	var parts []string
	for i, p := range pids {
		if i == 8 {
			parts = append(parts, fmt.Sprintf("+%d more", len(pids)-i))
			break
		}
		if p == 0 {
			parts = append(parts, "?")
		} else {
			parts = append(parts, fmt.Sprint(p))
		}
	}
	return strings.Join(parts, ",")
}

func (a *app) regionInfoCmd() *cobra.Command {
	var span string
	c := &cobra.Command{
		Use:   "info NAME",
		Short: "Describe a region: placement per home, the processes that map it, and its shards",
		Long: `info shows a region's spec, its number of shards, how many shards and pages
each node homes and backs up, the processes that map it on each node, and
a listing of its shards (pages, home, backups).

A region can have millions of shards (a 16 TiB region in 2 MiB shards has
8388608), so the listing shows --shards FIRST:END only, END excluded (the
first 64 by default), and says how many more there are. The per-node sums
cover every shard of a region of up to 65536 shards; of a larger region
they cover the listed shards only, and say so.`,
		Example: "  dsmctl region info feat\n" +
			"  dsmctl region info feat --shards 64:128     # the next 64 shards\n" +
			"  dsmctl region info feat --shards 0: --json | jq '.shards | length'   # all of them\n" +
			"  dsmctl region info feat --json | jq '.homes'",
		Args:              args(1, 1, "NAME"),
		ValidArgsFunction: a.completeRegion,
		RunE: func(cmd *cobra.Command, argv []string) error {
			first, end, open, err := parseSpan("--shards", "shard", span)
			if err != nil {
				return err
			}
			cl, err := a.admin()
			if err != nil {
				return err
			}
			head, shards, next, err := a.regionShards(cmd, cl, argv[0], first, end, open)
			if err != nil {
				return err
			}
			count := head.ShardCount
			v := regionInfoJSON{Region: regionView(head.GetRegion()), Epoch: head.Epoch, ShardCount: count,
				Shards: []shardJSON{}, NextShard: next}
			for _, s := range shards {
				v.Shards = append(v.Shards, shardJSON{s.Index, s.FirstPage, s.PageCount, s.Home,
					append([]uint32{}, s.Backups...), s.HomeLost})
			}
			all := shards
			switch {
			case first == 0 && next >= count:
				v.HomesComplete = true
			case count <= maxListedShards:
				if _, all, _, err = a.regionShards(cmd, cl, argv[0], 0, count, false); err != nil {
					return err
				}
				v.HomesComplete = true
			}
			v.Homes = homes(all)
			ctx, cancel := a.call(cmd)
			m, err := cl.Mappings(ctx, &dsmpb.MappingsRequest{Region: argv[0], AllNodes: true})
			cancel()
			switch {
			case status.Code(err) == codes.Unimplemented:
				v.MappingsError = "this dsmd does not report mappings (older than dsmctl)"
			case err != nil:
				v.MappingsError = a.describe(err)
			default:
				v.Mappings = []nodeMappingsJSON{}
				for _, n := range m.Nodes {
					v.Mappings = append(v.Mappings, nodeMappingsJSON{n.NodeId, append([]int32{}, n.Pids...), n.Error})
				}
			}
			if a.json {
				return a.printJSON(v)
			}
			return a.renderRegionInfo(v, first)
		},
	}
	c.Flags().StringVar(&span, "shards", "0:64", "shards to list, FIRST:END (END excluded; either may be omitted)")
	return c
}

func (a *app) renderRegionInfo(v regionInfoJSON, first uint64) error {
	var w strings.Builder
	r := v.Region
	fmt.Fprintf(&w, "region %s (%s) · %s · %d pages of %s · %s · %d shard%s · epoch %d\n\n",
		r.Name, ids.RegionID(r.ID), FormatSize(r.Size), r.Pages, FormatSize(uint64(r.PageSize)),
		r.Durability, v.ShardCount, plural(int(min(v.ShardCount, 2))), v.Epoch)
	if r.Access != nil {
		fmt.Fprintf(&w, "access: %s\n\n", accessLine(r.Access))
	}
	if r.ContentsLost {
		fmt.Fprintf(&w, "contents lost at restart: every copy of some of its pages was in processes that all departed; they read as zeros\n\n")
	}
	checkpoint := "no placement checkpoint"
	if r.CheckpointEpoch != 0 {
		checkpoint = fmt.Sprintf("placement checkpoint of epoch %d (%s)", r.CheckpointEpoch, FormatSize(uint64(r.CheckpointBytes)))
	}
	fmt.Fprintf(&w, "placement records: %d completeness, %d promotion%s; %s\n\n", r.FillRecords, r.PromotionRecords,
		plural(int(min(r.PromotionRecords, 2))), checkpoint)
	if !v.HomesComplete && len(v.Shards) > 0 {
		fmt.Fprintf(&w, "placement of the listed shards %d-%d only (of %d):\n", first, v.NextShard-1, v.ShardCount)
	}
	t := newTable("NODE", "HOME SHARDS", "HOME PAGES", "BACKUP SHARDS", "BACKUP PAGES")
	for _, h := range v.Homes {
		name := node(h.Node)
		if h.Lost {
			name += " (lost: restarted or left; its home pages fail as unavailable)"
		}
		t.row(name, h.Shards, h.Pages, h.BackupShards, h.BackupPages)
	}
	t.write(&w)
	w.WriteByte('\n')
	mapped, asked := false, []uint32{}
	for _, m := range v.Mappings {
		mapped = mapped || m.Error != "" || len(m.PIDs) > 0
		asked = append(asked, m.Node)
	}
	switch {
	case v.Mappings == nil:
		fmt.Fprintf(&w, "mappings: unknown: %s\n", v.MappingsError)
	case !mapped:
		fmt.Fprintf(&w, "mapped by no process (asked %s)\n", nodes(asked))
	default:
		t = newTable("NODE", "MAPPINGS", "PIDS")
		for _, m := range v.Mappings {
			if m.Error != "" {
				t.row(node(m.Node), "?", userMessage(m.Error))
				continue
			}
			t.row(node(m.Node), len(m.PIDs), pidList(m.PIDs))
		}
		t.write(&w)
	}
	w.WriteByte('\n')
	t = newTable("SHARD", "PAGES", "HOME", "BACKUPS")
	for _, s := range v.Shards {
		t.row(s.Index, fmt.Sprintf("%d-%d", s.FirstPage, s.FirstPage+s.PageCount-1), node(s.Home), nodes(s.Backups))
	}
	t.write(&w)
	if more := v.ShardCount - min(v.NextShard, v.ShardCount); more > 0 {
		n := min(uint64(len(v.Shards)), more)
		fmt.Fprintf(&w, "%d more shard%s: list the next %d with --shards %d:%d, all with --shards %d:\n",
			more, plural(int(min(more, 2))), n, v.NextShard, v.NextShard+n, v.NextShard)
	}
	_, err := io.WriteString(a.env.Stdout, w.String())
	return err
}
