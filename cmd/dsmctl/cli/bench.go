package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// benchTarget is what the benchmark accesses. Today it is region memory
// through the Admin service (adminTarget), so each access is one RPC to the
// answering dsmd; once the dsm library exists, a mapped region takes its
// place and the same workloads measure what an application sees.
type benchTarget interface {
	Read(ctx context.Context, off uint64, n int) error
	Write(ctx context.Context, off uint64, p []byte) error
}

type adminTarget struct {
	cl      dsmpb.AdminClient
	region  string
	timeout time.Duration
}

func (t adminTarget) Read(ctx context.Context, off uint64, n int) error {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	r, err := t.cl.ReadMemory(ctx, &dsmpb.ReadMemoryRequest{Region: t.region, Offset: off, Length: uint32(n)})
	if err == nil && len(r.Data) != n {
		err = fmt.Errorf("read of %d bytes at %#x answered %d", n, off, len(r.Data))
	}
	return err
}

func (t adminTarget) Write(ctx context.Context, off uint64, p []byte) error {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	_, err := t.cl.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{Region: t.region, Offset: off, Data: p})
	return err
}

type latJSON struct {
	Count  int   `json:"count"`
	MeanNS int64 `json:"mean_ns"`
	P50NS  int64 `json:"p50_ns"`
	P90NS  int64 `json:"p90_ns"`
	P99NS  int64 `json:"p99_ns"`
	MaxNS  int64 `json:"max_ns"`
}

type workloadJSON struct {
	Region       string  `json:"region"`
	RegionSize   uint64  `json:"region_size"`
	PageSize     uint64  `json:"page_size"`
	AccessSize   uint64  `json:"access_size"`
	Threads      int     `json:"threads"`
	OpsPerThread int     `json:"ops_per_thread"`
	ReadRatio    float64 `json:"read_ratio"`
	SharingRatio float64 `json:"sharing_ratio"`
	Locality     float64 `json:"locality"`
	Skew         float64 `json:"skew"`
	Seed         uint64  `json:"seed"`
}

type benchJSON struct {
	Target    string       `json:"target"`
	Workload  workloadJSON `json:"workload"`
	Ops       int          `json:"ops"`
	ElapsedNS int64        `json:"elapsed_ns"`
	OpsPerS   float64      `json:"ops_per_s"`
	Read      latJSON      `json:"read"`
	Write     latJSON      `json:"write"`
	All       latJSON      `json:"all"`
}

func latStats(d []time.Duration) latJSON {
	if len(d) == 0 {
		return latJSON{}
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	q := func(p float64) int64 { return int64(d[min(len(d)-1, int(p*float64(len(d))))]) }
	return latJSON{Count: len(d), MeanNS: int64(sum) / int64(len(d)), P50NS: q(0.50), P90NS: q(0.90),
		P99NS: q(0.99), MaxNS: int64(d[len(d)-1])}
}

// runBench runs the workload on the target, one goroutine per thread, and
// reports each completed access to done (for the progress bar). The first
// error stops every thread and is returned.
func runBench(ctx context.Context, w Workload, targets []benchTarget, done *atomic.Int64) (benchJSON, error) {
	gens, err := w.Generators()
	if err != nil {
		return benchJSON{}, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	reads := make([][]time.Duration, w.Threads)
	writes := make([][]time.Duration, w.Threads)
	var wg sync.WaitGroup
	start := time.Now()
	for i, g := range gens {
		t := targets[i%len(targets)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, w.AccessSize)
			for range w.OpsPerThread {
				op := g.Next()
				t0 := time.Now()
				var err error
				if op.Write {
					buf[0]++
					err = t.Write(ctx, op.Offset, buf)
				} else {
					err = t.Read(ctx, op.Offset, int(w.AccessSize))
				}
				d := time.Since(t0)
				if err != nil {
					cancel(err)
					return
				}
				if op.Write {
					writes[i] = append(writes[i], d)
				} else {
					reads[i] = append(reads[i], d)
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := context.Cause(ctx); err != nil {
		return benchJSON{}, err
	}
	var rs, ws []time.Duration
	for i := range gens {
		rs, ws = append(rs, reads[i]...), append(ws, writes[i]...)
	}
	all := append(append([]time.Duration{}, rs...), ws...)
	r := benchJSON{Ops: len(all), ElapsedNS: int64(elapsed), Read: latStats(rs), Write: latStats(ws), All: latStats(all)}
	if elapsed > 0 {
		r.OpsPerS = float64(len(all)) / elapsed.Seconds()
	}
	return r, nil
}

// progressBar draws done/total as a bar of width cells.
func progressBar(done, total int64, width int) string {
	if total <= 0 {
		total = 1
	}
	done = min(max(done, 0), total)
	fill := int(done * int64(width) / total)
	return fmt.Sprintf("[%s%s] %3d%% %d/%d ops", strings.Repeat("=", fill), strings.Repeat(" ", width-fill),
		done*100/total, done, total)
}

func (a *app) benchCmd() *cobra.Command {
	var (
		w                      Workload
		region, size, pageSize string
		access, progress       string
		ops                    int
		keep, here             bool
	)
	c := &cobra.Command{
		Use:   "bench",
		Short: "Run one microbenchmark workload against the cluster and print its latencies",
		Long: `bench runs one workload of the DSM microbenchmark grid (read ratio x sharing
x locality x skew) from this client and prints its latency percentiles and
throughput: one point of the grid per run, set by the flags below; sweep
the grid with a loop over runs (see the examples).

--threads workers issue --ops accesses of --access-size bytes in all. The
region's first half is shared by every worker, the second half is split into
one private area per worker.

  --read-ratio     fraction of accesses that read (the rest write)
  --sharing-ratio  fraction of accesses to the shared area
  --locality       probability that an access stays on the worker's last page
  --skew           0 uniform; in (0,1) Zipfian over the pages of an area (0.99 = YCSB)

The region --region is used if it exists; otherwise it is created with
--size and --page-size and deleted afterwards (unless --keep), even while
processes map it (their mappings are cut off). Each access
is one ReadMemory or WriteMemory request: the threads are spread round-robin
over the alive members (thread i on the i-th member), so the shared area is
shared across nodes and the coherence protocol moves pages between them;
--here keeps every thread on the answering dsmd. This measures the protocol
as the admin path sees it (one RPC per access), not mapped memory. A
progress bar goes to stderr when it is a terminal.`,
		Example: `  dsmctl bench
  dsmctl bench --read-ratio 0.5 --sharing-ratio 1 --threads 8 --ops 100000
  dsmctl bench --skew 0.99 --locality 0 --json > run.json
  for r in 0.5 0.9 1; do for s in 0 0.5 1; do   # a 3 x 3 slice of the grid
    dsmctl bench --read-ratio $r --sharing-ratio $s --json; done; done > grid.jsonl`,
		Args: args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if w.AccessSize, err = ParseSize(access); err != nil {
				return usagef("--access-size: %v", err)
			}
			if ops < 1 || w.Threads < 1 {
				return usagef("--ops and --threads must be positive")
			}
			w.OpsPerThread = max(1, ops/w.Threads)
			cl, err := a.admin()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd)
			ri, err := cl.RegionInfo(ctx, &dsmpb.RegionInfoRequest{Name: region, MaxShards: 1})
			cancel()
			created := false
			switch status.Code(err) {
			case codes.OK:
			case codes.NotFound:
				sz, err := ParseSize(size)
				if err != nil {
					return usagef("--size: %v", err)
				}
				ps, err := ParseSize(pageSize)
				if err != nil || ps > 1<<31 {
					return usagef("--page-size %q is not a page size", pageSize)
				}
				ctx, cancel := a.call(cmd)
				cr, err := cl.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: region, Size: sz,
					PageSize: uint32(ps), Durability: dsmpb.Durability_DURABILITY_MEMORY})
				cancel()
				if err != nil {
					return err
				}
				// Existed: made with the same spec since RegionInfo by
				// someone else, whose region it is to keep.
				ri, created = &dsmpb.RegionInfoResponse{Region: cr.Region}, !cr.Existed
			default:
				return err
			}
			if created && !keep {
				defer func() {
					ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), a.timeout)
					defer cancel()
					if _, err := cl.DeleteRegion(ctx, &dsmpb.DeleteRegionRequest{Name: region, Force: true}); err != nil {
						fmt.Fprintf(a.env.Stderr, "dsmctl: bench region %s not deleted: %s\n", region, a.describe(err))
					}
				}()
			}
			w.RegionSize = ri.GetRegion().GetSize()
			w.PageSize = uint64(ri.GetRegion().GetPageSize())
			if err := w.Validate(); err != nil {
				return usageError{err: err}
			}
			var done atomic.Int64
			total := int64(w.OpsPerThread * w.Threads)
			show := progress == "always" || progress == "auto" && a.env.StderrTTY && !a.json
			stop := make(chan struct{})
			var drawn sync.WaitGroup
			if show {
				drawn.Add(1)
				go func() {
					defer drawn.Done()
					tick := time.NewTicker(100 * time.Millisecond)
					defer tick.Stop()
					for {
						select {
						case <-stop:
							fmt.Fprintf(a.env.Stderr, "\r%s\n", progressBar(done.Load(), total, 40))
							return
						case <-tick.C:
							fmt.Fprintf(a.env.Stderr, "\r%s", progressBar(done.Load(), total, 40))
						}
					}
				}()
			}
			targets, names, closeAll, err := a.benchTargets(cmd, cl, region, here)
			if err != nil {
				return err
			}
			defer closeAll()
			res, err := runBench(cmd.Context(), w, targets, &done)
			close(stop)
			drawn.Wait()
			if err != nil {
				return err
			}
			res.Target = "admin on " + names
			res.Workload = workloadJSON{region, w.RegionSize, w.PageSize, w.AccessSize, w.Threads,
				w.OpsPerThread, w.ReadRatio, w.SharingRatio, w.Locality, w.Skew, w.Seed}
			if a.json {
				return a.printJSON(res)
			}
			return renderBench(a.env.Stdout, res)
		},
	}
	f := c.Flags()
	f.StringVar(&region, "region", "dsmctl-bench", "region to run in (created and deleted if missing)")
	c.RegisterFlagCompletionFunc("region", func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		return a.completeRegion(cmd, nil, toComplete)
	})
	f.StringVar(&size, "size", "64MiB", "size of the region when bench creates it")
	f.StringVar(&pageSize, "page-size", "4KiB", "page size of the region when bench creates it")
	f.StringVar(&access, "access-size", "64B", "bytes per access (divides the page size)")
	f.IntVar(&ops, "ops", 10000, "accesses in all, split evenly across the threads")
	f.IntVar(&w.Threads, "threads", 4, "concurrent workers")
	f.Float64Var(&w.ReadRatio, "read-ratio", 0.9, "fraction of accesses that read")
	f.Float64Var(&w.SharingRatio, "sharing-ratio", 0.5, "fraction of accesses to the shared area")
	f.Float64Var(&w.Locality, "locality", 0.5, "probability that an access stays on the worker's last page")
	f.Float64Var(&w.Skew, "skew", 0, "Zipf exponent over pages, 0 (uniform) to <1")
	f.Uint64Var(&w.Seed, "seed", 1, "seed of the access sequence (same seed, same accesses)")
	f.BoolVar(&keep, "keep", false, "keep the region when bench created it")
	f.BoolVar(&here, "here", false, "run every thread through the answering dsmd instead of spreading them over the members")
	f.StringVar(&progress, "progress", "auto", "progress bar on stderr: auto (on a terminal), always, never")
	return c
}

// benchTargets returns one target per alive member with a gRPC address,
// each on a connection of its own, or only the answering node with here. names lists the nodes, e.g. "n1,n2,n3".
func (a *app) benchTargets(cmd *cobra.Command, cl dsmpb.AdminClient, region string, here bool) ([]benchTarget, string, func(), error) {
	self := []benchTarget{adminTarget{cl, region, a.timeout}}
	if here {
		return self, "the answering node", func() {}, nil
	}
	ctx, cancel := a.call(cmd)
	ms, err := cl.Members(ctx, &dsmpb.MembersRequest{})
	cancel()
	if err != nil {
		return nil, "", nil, err
	}
	var (
		targets []benchTarget
		names   []string
		conns   []*grpc.ClientConn
	)
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	for _, m := range ms.Members {
		if m.State != dsmpb.MemberState_MEMBER_STATE_ALIVE || m.GrpcAddr == "" {
			continue
		}
		target := m.GrpcAddr
		network := "unix"
		if !strings.HasPrefix(target, "unix://") {
			target, network = "passthrough:///"+target, "tcp"
		}
		creds, err := a.transportCreds(network)
		if err != nil {
			closeAll()
			return nil, "", nil, err
		}
		conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
		if err != nil {
			closeAll()
			return nil, "", nil, fmt.Errorf("n%d at %s: %w", m.NodeId, m.GrpcAddr, err)
		}
		conns = append(conns, conn)
		targets = append(targets, adminTarget{dsmpb.NewAdminClient(conn), region, a.timeout})
		names = append(names, fmt.Sprintf("n%d", m.NodeId))
	}
	if len(targets) == 0 {
		return self, "the answering node", closeAll, nil
	}
	return targets, strings.Join(names, ","), closeAll, nil
}

func renderBench(w io.Writer, r benchJSON) error {
	wl := r.Workload
	fmt.Fprintf(w, "bench on %s (%s, %s pages) through %s · %d threads · %s accesses\n",
		wl.Region, FormatSize(wl.RegionSize), FormatSize(wl.PageSize), r.Target, wl.Threads, FormatSize(wl.AccessSize))
	fmt.Fprintf(w, "read %.0f%% · shared %.0f%% · locality %.0f%% · skew %.2f · seed %d\n\n",
		wl.ReadRatio*100, wl.SharingRatio*100, wl.Locality*100, wl.Skew, wl.Seed)
	t := newTable("OP", "COUNT", "MEAN", "P50", "P90", "P99", "MAX")
	for _, x := range []struct {
		name string
		l    latJSON
	}{{"read", r.Read}, {"write", r.Write}, {"all", r.All}} {
		t.row(x.name, x.l.Count, latency(uint64(x.l.MeanNS)), latency(uint64(x.l.P50NS)), latency(uint64(x.l.P90NS)),
			latency(uint64(x.l.P99NS)), latency(uint64(x.l.MaxNS)))
	}
	if err := t.write(w); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\n%d ops in %v · %s ops/s\n", r.Ops, time.Duration(r.ElapsedNS).Round(time.Millisecond), rate(r.OpsPerS))
	return err
}
