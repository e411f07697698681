package cli

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// fakeAdmin is an in-memory Admin server with a fixed, deterministic
// cluster of three nodes: the state of page p is M at node (p/7)%3+1 when p
// is a multiple of 7, else S at (p%4)+1 nodes when p is a multiple of 3,
// else I. Stats advance every counter by a fixed step and the clock by one
// second per call. Memory is sparse, per page.
type fakeAdmin struct {
	dsmpb.UnimplementedAdminServer

	mu      sync.Mutex
	verdict dsmpb.Health_Verdict
	reasons []string
	regions map[string]*dsmpb.Region
	mem     map[string]map[uint64][]byte // region -> page -> bytes
	nextID  uint32
	statsN  int64
	reads   int
	writes  int
	synced  int // WriteMemory requests with sync set
	// failReadAt and failWriteAt, when not zero, fail ReadMemory and
	// WriteMemory requests at or past that offset as UNAVAILABLE.
	failReadAt, failWriteAt uint64
	deleted                 []string

	// maps[region][node] are the pids that map the region on the node;
	// mapErr[node] is the error of a node that does not answer Mappings.
	maps   map[string]map[uint32][]int32
	mapErr map[uint32]string
	// noMappings answers Mappings with UNIMPLEMENTED, as a dsmd older than
	// the RPC does; oldRegionInfo answers RegionInfo as a dsmd before
	// first_shard and max_shards: every shard, no shard_count.
	noMappings, oldRegionInfo bool
	// hidden is a region that RegionInfo does not find, as if it was
	// created between a RegionInfo and a CreateRegion.
	hidden string
	// raftFollower answers Raft as n2, a follower, instead of n1, the leader.
	raftFollower bool
	// infoReqs are the RegionInfo requests received.
	infoReqs []*dsmpb.RegionInfoRequest
	// forced are the DeleteRegion requests with force set, by name.
	forced []string
}

func newFakeAdmin() *fakeAdmin {
	f := &fakeAdmin{
		verdict: dsmpb.Health_VERDICT_HEALTHY,
		regions: map[string]*dsmpb.Region{},
		mem:     map[string]map[uint64][]byte{},
		nextID:  1,
		maps:    map[string]map[uint32][]int32{},
		mapErr:  map[uint32]string{},
	}
	feat := f.addRegion("feat", 1<<30, 4096, dsmpb.Durability_DURABILITY_DURABLE)
	feat.FillRecords, feat.PromotionRecords, feat.CheckpointEpoch, feat.CheckpointBytes = 5, 1, 11, 132
	f.addRegion("small", 100*4096, 4096, dsmpb.Durability_DURABILITY_MEMORY)
	return f
}

func (f *fakeAdmin) addRegion(name string, size uint64, ps uint32, d dsmpb.Durability) *dsmpb.Region {
	r := &dsmpb.Region{Name: name, Id: f.nextID, Size: size, PageSize: ps, Durability: d, CreatedEpoch: 3, Shards: 4}
	f.nextID++
	f.regions[name] = r
	f.mem[name] = map[uint64][]byte{}
	return r
}

func (f *fakeAdmin) region(name string) (*dsmpb.Region, error) {
	r := f.regions[name]
	if r == nil {
		return nil, status.Errorf(codes.NotFound, "region %q not found", name)
	}
	return r, nil
}

func (f *fakeAdmin) Status(context.Context, *dsmpb.StatusRequest) (*dsmpb.StatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := &dsmpb.StatusResponse{NodeId: 1, Version: "v0.0.0-test", LeaderId: 1, Term: 7, Epoch: 12, RegionCount: uint32(len(f.regions)),
		Health: &dsmpb.Health{Verdict: f.verdict, Reasons: f.reasons}}
	for i := uint32(1); i <= 3; i++ {
		n := &dsmpb.NodeStatus{NodeId: i, Addr: fmt.Sprintf("127.0.0.1:74%02d", i), State: dsmpb.MemberState_MEMBER_STATE_ALIVE,
			Voter: true, CacheBytes: uint64(i) << 28, CacheCapacityBytes: 4 << 30, DirtyPages: uint64(10 * i), HomedShards: 2}
		if i == 3 && f.verdict != dsmpb.Health_VERDICT_HEALTHY {
			n.State = dsmpb.MemberState_MEMBER_STATE_DEAD
			n.Error = "connection refused"
		}
		st.Nodes = append(st.Nodes, n)
	}
	return st, nil
}

// fakeNow is the clock of the fake cluster (and of the tests' Env.Now).
const fakeNow = int64(1_800_000_000_000_000_000)

func (f *fakeAdmin) Members(context.Context, *dsmpb.MembersRequest) (*dsmpb.MembersResponse, error) {
	m := &dsmpb.MembersResponse{Epoch: 12, ProtoIdsLeft: 1018}
	for i := uint32(1); i <= 3; i++ {
		m.Members = append(m.Members, &dsmpb.Member{NodeId: i, Name: fmt.Sprintf("host%d", i),
			State: dsmpb.MemberState_MEMBER_STATE_ALIVE, GossipAddr: fmt.Sprintf("127.0.0.1:73%02d", i),
			RaftAddr: fmt.Sprintf("127.0.0.1:75%02d", i), VerbsAddr: fmt.Sprintf("127.0.0.1:76%02d", i),
			GrpcAddr: fmt.Sprintf("127.0.0.1:74%02d", i), LastSeenUnixNano: fakeNow - int64(i)*1_500_000_000,
			Incarnation: 1, ProtoId: i})
	}
	m.Members[2].LastSeenUnixNano = 0                     // not reported, as dsmd does today
	m.Members[1].Incarnation, m.Members[1].ProtoId = 2, 4 // restarted once
	return m, nil
}

// RemoveMember removes n3, which the fake holds failed; n1 and n2 are
// alive.
func (f *fakeAdmin) RemoveMember(_ context.Context, req *dsmpb.RemoveMemberRequest) (*dsmpb.RemoveMemberResponse, error) {
	switch req.GetNodeId() {
	case 3:
		return &dsmpb.RemoveMemberResponse{Epoch: 13}, nil
	case 1, 2:
		return nil, status.Errorf(codes.FailedPrecondition, "directory: member is not failed: n%d is alive; a member that is alive leaves by itself (stop its dsmd with SIGTERM)", req.GetNodeId())
	}
	return nil, status.Errorf(codes.NotFound, "directory: no such member: n%d", req.GetNodeId())
}

func (f *fakeAdmin) Raft(context.Context, *dsmpb.RaftRequest) (*dsmpb.RaftResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	self, role := uint32(1), "leader"
	if f.raftFollower {
		self, role = 2, "follower"
	}
	return &dsmpb.RaftResponse{NodeId: self, Role: role, LeaderId: 1, LeaderAddr: "127.0.0.1:7501", Term: 7,
		LastIndex: 120, CommitIndex: 120, AppliedIndex: 119, ConfigurationIndex: 5,
		Configuration: []*dsmpb.RaftServer{
			{NodeId: 1, Addr: "127.0.0.1:7501", Suffrage: dsmpb.RaftServer_SUFFRAGE_VOTER},
			{NodeId: 2, Addr: "127.0.0.1:7502", Suffrage: dsmpb.RaftServer_SUFFRAGE_VOTER},
			{NodeId: 3, Addr: "127.0.0.1:7503", Suffrage: dsmpb.RaftServer_SUFFRAGE_VOTER},
			{NodeId: 4, Addr: "127.0.0.1:7504", Suffrage: dsmpb.RaftServer_SUFFRAGE_NONVOTER},
		}}, nil
}

func (f *fakeAdmin) Regions(context.Context, *dsmpb.RegionsRequest) (*dsmpb.RegionsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := &dsmpb.RegionsResponse{Epoch: 12}
	for _, x := range f.regions {
		r.Regions = append(r.Regions, x)
	}
	return r, nil
}

// fakeMaxListedShards is the most shards one RegionInfo lists, as dsmd's
// MaxListedShards.
const fakeMaxListedShards = 65536

func (f *fakeAdmin) RegionInfo(ctx context.Context, req *dsmpb.RegionInfoRequest) (*dsmpb.RegionInfoResponse, error) {
	switch req.Name {
	case "leaderless": // the cluster cannot answer now
		return nil, status.Error(codes.Unavailable, "no Raft leader: n1 lost its lease in epoch 12")
	case "slow": // the answer never comes before the caller's deadline
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.infoReqs = append(f.infoReqs, proto.Clone(req).(*dsmpb.RegionInfoRequest))
	r, err := f.region(req.Name)
	if err != nil {
		return nil, err
	}
	if req.Name == f.hidden {
		return nil, status.Errorf(codes.NotFound, "region %q not found", req.Name)
	}
	count := uint64(r.Shards)
	first, limit := req.FirstShard, uint64(req.MaxShards)
	switch {
	case f.oldRegionInfo:
		if count > fakeMaxListedShards {
			return nil, status.Errorf(codes.InvalidArgument, "region %q has %d shards; RegionInfo lists at most %d",
				r.Name, count, fakeMaxListedShards)
		}
		first, limit = 0, count
	case limit == 0:
		limit = 4096
	case limit > fakeMaxListedShards:
		return nil, status.Errorf(codes.InvalidArgument, "max_shards %d is more than %d", limit, fakeMaxListedShards)
	}
	if first > count && !f.oldRegionInfo {
		return nil, status.Errorf(codes.InvalidArgument, "first_shard %d is past the region's %d shards", first, count)
	}
	pages := r.Size / uint64(r.PageSize)
	per := (pages + count - 1) / count
	resp := &dsmpb.RegionInfoResponse{Region: r, Epoch: 12, ShardCount: count}
	if f.oldRegionInfo {
		resp.ShardCount = 0
	}
	i := min(first, count)
	for ; i < count && i-first < limit; i++ {
		home := uint32(i%3 + 1)
		resp.Shards = append(resp.Shards, &dsmpb.Shard{Index: uint32(i), FirstPage: i * per,
			PageCount: min(per, pages-i*per), Home: home, Backups: []uint32{home%3 + 1}})
	}
	if !f.oldRegionInfo {
		resp.NextShard = i
	}
	return resp, nil
}

func (f *fakeAdmin) Mappings(_ context.Context, req *dsmpb.MappingsRequest) (*dsmpb.MappingsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.noMappings {
		return nil, status.Error(codes.Unimplemented, "unknown method Mappings for service dsm.v1.Admin")
	}
	r, err := f.region(req.Region)
	if err != nil {
		return nil, err
	}
	resp := &dsmpb.MappingsResponse{RegionId: r.Id}
	last := uint32(3)
	if !req.AllNodes {
		last = 1
	}
	for n := uint32(1); n <= last; n++ {
		nm := &dsmpb.NodeMappings{NodeId: n, Error: f.mapErr[n]}
		if nm.Error == "" {
			nm.Pids = f.maps[req.Region][n]
		}
		resp.Nodes = append(resp.Nodes, nm)
	}
	return resp, nil
}

// CreateRegion checks a spec as dsmd's directory does, with the
// directory's own messages, as dsmd passed them on before it put them in
// user terms: dsmctl presents either way in user terms.
func (f *fakeAdmin) CreateRegion(_ context.Context, req *dsmpb.CreateRegionRequest) (*dsmpb.CreateRegionResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ps := req.PageSize
	if ps == 0 {
		ps = 4096
	}
	spec := func(field, format string, args ...any) error {
		return status.Errorf(codes.InvalidArgument, "directory: invalid region spec: %s: %s", field, fmt.Sprintf(format, args...))
	}
	d := req.Durability
	if d == dsmpb.Durability_DURABILITY_UNSPECIFIED {
		d = dsmpb.Durability_DURABILITY_MEMORY
	}
	switch {
	case req.Name == "":
		return nil, spec("Name", "empty")
	case ps < 4096 || ps > 2<<20 || ps&(ps-1) != 0:
		return nil, spec("PageSize", "%d is not a power of two in [4096, 2097152]", ps)
	case req.Size == 0:
		return nil, spec("Size", "zero")
	case req.Size > 16<<40:
		return nil, spec("Size", "%s is larger than the largest region, 16 TiB", FormatSize(req.Size))
	case req.Size%uint64(ps) != 0:
		return nil, spec("Size", "%d is not a multiple of the page size %d", req.Size, ps)
	}
	if r := f.regions[req.Name]; r != nil {
		if r.Size != req.Size || r.PageSize != ps || r.Durability != d {
			return nil, status.Error(codes.AlreadyExists, "directory: region exists with a different spec")
		}
		return &dsmpb.CreateRegionResponse{Region: r, Existed: true}, nil
	}
	return &dsmpb.CreateRegionResponse{Region: f.addRegion(req.Name, req.Size, ps, d)}, nil
}

// DeleteRegion refuses, without force, a region that processes map.
func (f *fakeAdmin) DeleteRegion(_ context.Context, req *dsmpb.DeleteRegionRequest) (*dsmpb.DeleteRegionResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.region(req.Name)
	if err != nil {
		return nil, err
	}
	var mappings uint64
	var where []string
	for n := uint32(1); n <= 3; n++ {
		for _, pid := range f.maps[req.Name][n] {
			mappings++
			where = append(where, fmt.Sprintf("pid %d on n%d", pid, n))
		}
	}
	if mappings > 0 && !req.Force {
		return nil, status.Errorf(codes.FailedPrecondition, "region %q is mapped by %d process(es) (%s); stop them, or delete with force",
			req.Name, mappings, strings.Join(where, ", "))
	}
	if req.Force {
		f.forced = append(f.forced, req.Name)
	}
	delete(f.regions, req.Name)
	delete(f.mem, req.Name)
	delete(f.maps, req.Name)
	f.deleted = append(f.deleted, req.Name)
	return &dsmpb.DeleteRegionResponse{Id: r.Id, Mappings: mappings}, nil
}

// pageState is the fake cluster's state of page p of a region of total
// pages. The region is cut into 16 stripes; stripe s is, by s%4: all M at
// node (s/4)%3+1; S at (p%3)+1 nodes; I; or a page-by-page mix (M at
// (p/7)%3+1 when p%7 == 0, else S at (p%4)+1 when p%3 == 0, else I), so
// that both a grid of single pages and one of groups have something to show.
func pageState(p, total uint64) (owner uint32, sharers int) {
	s := p / max(total/16, 1)
	switch s % 4 {
	case 0:
		return uint32(s/4%3 + 1), 0
	case 1:
		return 0, int(p%3) + 1
	case 2:
		return 0, 0
	}
	switch {
	case p%7 == 0:
		return uint32(p/7%3 + 1), 0
	case p%3 == 0:
		return 0, int(p%4) + 1
	}
	return 0, 0
}

func (f *fakeAdmin) Pages(_ context.Context, req *dsmpb.PagesRequest) (*dsmpb.PagesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.region(req.Region)
	if err != nil {
		return nil, err
	}
	total := r.Size / uint64(r.PageSize)
	count := req.PageCount
	if count == 0 && req.FirstPage < total {
		count = total - req.FirstPage
	}
	if req.FirstPage >= total || count > total-req.FirstPage {
		return nil, status.Errorf(codes.InvalidArgument, "pages %d+%d outside region %q of %d pages", req.FirstPage, count, req.Region, total)
	}
	group := max(req.Group, 1)
	if (count+group-1)/group > 65536 {
		return nil, status.Error(codes.InvalidArgument, "more than 65536 cells")
	}
	resp := &dsmpb.PagesResponse{NodeId: 1, Region: r, FirstPage: req.FirstPage, PageCount: count, Group: group, Cluster: req.Cluster}
	for first := req.FirstPage; first < req.FirstPage+count; first += group {
		c := &dsmpb.PageCell{FirstPage: first, Pages: min(group, req.FirstPage+count-first), LocalState: dsmpb.PageState_PAGE_STATE_INVALID}
		owners := map[uint32]bool{}
		addPages(c, owners, first, first+c.Pages, total, group)
		for n := uint32(1); n <= 3; n++ {
			if owners[n] {
				c.Owners = append(c.Owners, n)
			}
		}
		if !req.Cluster { // only this node's copies
			c.Modified, c.Shared, c.Invalid, c.Owners, c.MaxSharers, c.Sharers = 0, 0, 0, nil, 0, nil
			switch c.LocalState {
			case dsmpb.PageState_PAGE_STATE_MODIFIED:
				c.Modified, c.Owners = 1, []uint32{1}
			case dsmpb.PageState_PAGE_STATE_SHARED:
				c.Shared, c.MaxSharers = 1, 1
			default:
				c.Invalid = c.Pages
			}
		}
		resp.Cells = append(resp.Cells, c)
	}
	return resp, nil
}

// addPages adds pages [a, b) of a region of total pages to cell c, one
// page at a time, or in closed form for long runs inside a stripe (so that
// a picture of a 1 PiB region takes no longer than one of 1 GiB): the
// counts are the same either way.
func addPages(c *dsmpb.PageCell, owners map[uint32]bool, a, b, total, group uint64) {
	stripe := max(total/16, 1)
	// multiples counts the multiples of k in [lo, hi).
	multiples := func(k, lo, hi uint64) uint64 { return (hi+k-1)/k - (lo+k-1)/k }
	for a < b {
		s := a / stripe
		end := min(b, (s+1)*stripe)
		if n := end - a; n > 4096 {
			switch s % 4 {
			case 0:
				o := uint32(s/4%3 + 1)
				c.Modified += n
				owners[o] = true
				if o == 1 {
					c.LocalState = dsmpb.PageState_PAGE_STATE_MODIFIED
					c.Dirty += n
				}
			case 1:
				c.Shared += n
				c.MaxSharers = max(c.MaxSharers, 3)
				if c.LocalState != dsmpb.PageState_PAGE_STATE_MODIFIED {
					c.LocalState = dsmpb.PageState_PAGE_STATE_SHARED
				}
			case 2:
				c.Invalid += n
			case 3:
				m7, m21, m3 := multiples(7, a, end), multiples(21, a, end), multiples(3, a, end)
				c.Modified += m7
				owners[1], owners[2], owners[3] = true, true, true
				c.Dirty += m21 // M at n1: 7k with k%3 == 0
				c.LocalState = dsmpb.PageState_PAGE_STATE_MODIFIED
				c.Shared += m3 - m21
				c.MaxSharers = max(c.MaxSharers, 4)
				c.Invalid += n - m7 - (m3 - m21)
			}
			a = end
			continue
		}
		for p := a; p < end; p++ {
			o, sharers := pageState(p, total)
			switch {
			case o != 0:
				c.Modified++
				owners[o] = true
				if o == 1 {
					c.LocalState = dsmpb.PageState_PAGE_STATE_MODIFIED
					c.Dirty++
				}
			case sharers > 0:
				c.Shared++
				c.MaxSharers = max(c.MaxSharers, uint32(sharers))
				if group == 1 {
					for k := 1; k <= sharers; k++ {
						c.Sharers = append(c.Sharers, uint32(k))
					}
				}
				if c.LocalState != dsmpb.PageState_PAGE_STATE_MODIFIED {
					c.LocalState = dsmpb.PageState_PAGE_STATE_SHARED
				}
			default:
				c.Invalid++
			}
		}
		a = end
	}
}

func (f *fakeAdmin) Stats(context.Context, *dsmpb.StatsRequest) (*dsmpb.StatsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.statsN++
	k := uint64(f.statsN)
	resp := &dsmpb.StatsResponse{}
	for i := uint64(1); i <= 3; i++ {
		n := &dsmpb.NodeStats{NodeId: uint32(i), TimeUnixNano: fakeNow + f.statsN*1e9,
			Faults: map[string]uint64{"read": 100 * i * k, "write": 10 * i * k, "upgrade": i * k},
			Hits:   1000 * k, Misses: 50 * i * k, InvalidationsSent: 5 * i * k, InvalidationsReceived: 7 * i * k,
			BytesIn: 4096 * 50 * i * k, BytesOut: 4096 * 20 * i * k,
			CacheBytes: i << 28, CacheCapacityBytes: 4 << 30, CachePages: i << 16, DirtyPages: 10 * i,
			MissLatency: &dsmpb.Histogram{Count: 50 * i * k, P50Ns: 12_300 * i, P99Ns: 85_000 * i, P999Ns: 1_250_000 * i}}
		if i == 3 && f.verdict != dsmpb.Health_VERDICT_HEALTHY {
			n = &dsmpb.NodeStats{NodeId: 3, Error: "node n3 (127.0.0.1:7403): connection refused"}
		}
		resp.Nodes = append(resp.Nodes, n)
	}
	return resp, nil
}

// span checks a byte range of a region.
func (f *fakeAdmin) span(name string, off, n uint64) (*dsmpb.Region, error) {
	r, err := f.region(name)
	if err != nil {
		return nil, err
	}
	if n > 1<<20 {
		return nil, status.Errorf(codes.InvalidArgument, "%d bytes is more than 1 MiB", n)
	}
	if off > r.Size || n > r.Size-off {
		return nil, status.Errorf(codes.InvalidArgument, "bytes %d+%d are outside region %q of %d bytes", off, n, name, r.Size)
	}
	return r, nil
}

func (f *fakeAdmin) ReadMemory(_ context.Context, req *dsmpb.ReadMemoryRequest) (*dsmpb.ReadMemoryResponse, error) {
	if req.Region == "lost" { // a page whose home died
		st, err := status.New(codes.Unavailable, "page p1 of region lost (r9) unavailable: its home n3 failed in epoch 7").
			WithDetails(&errdetails.ErrorInfo{Reason: "PAGE_UNAVAILABLE", Domain: "dsm.v1"})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.span(req.Region, req.Offset, uint64(req.Length))
	if err != nil {
		return nil, err
	}
	if f.failReadAt != 0 && req.Offset >= f.failReadAt {
		return nil, status.Errorf(codes.Unavailable, "read at %d fails", req.Offset)
	}
	f.reads++
	ps := uint64(r.PageSize)
	out := make([]byte, req.Length)
	for i := range out {
		a := req.Offset + uint64(i)
		if pg := f.mem[req.Region][a/ps]; pg != nil {
			out[i] = pg[a%ps]
		}
	}
	return &dsmpb.ReadMemoryResponse{Data: out}, nil
}

func (f *fakeAdmin) WriteMemory(_ context.Context, req *dsmpb.WriteMemoryRequest) (*dsmpb.WriteMemoryResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.span(req.Region, req.Offset, uint64(len(req.Data)))
	if err != nil {
		return nil, err
	}
	if f.failWriteAt != 0 && req.Offset >= f.failWriteAt {
		return nil, status.Errorf(codes.Unavailable, "write at %d fails", req.Offset)
	}
	f.writes++
	if req.Sync {
		f.synced++
	}
	ps := uint64(r.PageSize)
	for i, b := range req.Data {
		a := req.Offset + uint64(i)
		pg := f.mem[req.Region][a/ps]
		if pg == nil {
			pg = make([]byte, ps)
			f.mem[req.Region][a/ps] = pg
		}
		pg[a%ps] = b
	}
	return &dsmpb.WriteMemoryResponse{Written: uint64(len(req.Data))}, nil
}

// serveFake serves a fresh fakeAdmin on a Unix socket in a new short
// temporary directory (socket paths are limited to 108 bytes) and returns
// it with the socket path. Cleanup stops it.
func serveFake(t testing.TB) (*fakeAdmin, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "dsmctl")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "dsmd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeAdmin()
	srv := grpc.NewServer()
	dsmpb.RegisterAdminServer(srv, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
		os.RemoveAll(dir)
	})
	return f, sock
}

// TestFakeAddPages checks the fake itself: its closed form for long runs
// counts what page by page counts.
func TestFakeAddPages(t *testing.T) {
	const total = 16 * 100_000
	for _, r := range [][2]uint64{{0, total}, {99_999, 700_001}, {300_000, 399_999}, {5, 1_000_003}} {
		var fast, slow dsmpb.PageCell
		fo, so := map[uint32]bool{}, map[uint32]bool{}
		addPages(&fast, fo, r[0], r[1], total, 2)
		for p := r[0]; p < r[1]; p += 4000 {
			addPages(&slow, so, p, min(p+4000, r[1]), total, 2)
		}
		if !proto.Equal(&fast, &slow) || len(fo) != len(so) {
			t.Errorf("pages %d-%d: closed form %v %v, page by page %v %v", r[0], r[1], &fast, fo, &slow, so)
		}
	}
}
