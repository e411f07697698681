package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
	"github.com/dsmkit/dsm/internal/tlsconf"
	"github.com/dsmkit/dsm/node/engine"
	"github.com/dsmkit/dsm/node/localcache"
)

// RegionInfo lists shards a page at a time: DefaultListedShards unless the
// request asks for fewer, at most MaxListedShards (a 16 TiB region has 8M
// shards of 2 MiB).
const (
	DefaultListedShards = 4096
	MaxListedShards     = 1 << 16
)

// statusError maps an error of the directory, the page cache or an engine
// to the codes of types.proto.
func statusError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	msg := err.Error()
	var se *directory.SpecError
	var ue *engine.UnavailableError
	switch {
	case errors.As(err, &ue):
		return unavailableStatus(ue)
	case errors.As(err, &se):
		return status.Error(codes.InvalidArgument, specMessage(se))
	case errors.Is(err, directory.ErrNoSpace):
		return status.Error(codes.ResourceExhausted, strings.TrimPrefix(msg, "directory: ")+"; delete regions first")
	case errors.Is(err, directory.ErrInvalidRegion), errors.Is(err, directory.ErrPageOutOfRange),
		errors.Is(err, directory.ErrInvalidAccess), errors.Is(err, directory.ErrGossipKey):
		return status.Error(codes.InvalidArgument, msg)
	case errors.Is(err, directory.ErrNoEncryption), errors.Is(err, directory.ErrKeyNotInstalled), errors.Is(err, directory.ErrPrimaryKey):
		return status.Error(codes.FailedPrecondition, msg)
	case errors.Is(err, directory.ErrRegionExists):
		return status.Error(codes.AlreadyExists, msg)
	case errors.Is(err, directory.ErrNoRegion):
		return status.Error(codes.NotFound, msg)
	case errors.Is(err, directory.ErrTooManyRegions):
		return status.Error(codes.ResourceExhausted, msg)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, msg)
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, msg)
	case errors.Is(err, directory.ErrNoLeader), errors.Is(err, directory.ErrNotLeader),
		errors.Is(err, directory.ErrNoMembers), errors.Is(err, directory.ErrClosed):
		return status.Error(codes.Unavailable, msg)
	case errors.Is(err, directory.ErrBadCommand), errors.Is(err, directory.ErrBadSnapshot):
		return status.Error(codes.Internal, msg)
	// The page cache and the engines (memory calls).
	case errors.Is(err, localcache.ErrUnknownRegion), errors.Is(err, engine.ErrUnknownRegion):
		return status.Error(codes.NotFound, "the region is not set up on this node yet, or was deleted ("+msg+")")
	case errors.Is(err, ErrNotServed):
		return status.Error(codes.FailedPrecondition, msg)
	case errors.Is(err, localcache.ErrPageRange):
		return status.Error(codes.InvalidArgument, msg)
	case errors.Is(err, localcache.ErrClosed), errors.Is(err, engine.ErrClosed):
		return status.Error(codes.Unavailable, msg)
	}
	// Anything else came from talking to the leader: a retry may succeed.
	return status.Error(codes.Unavailable, msg)
}

// PageUnavailableReason is the google.rpc.ErrorInfo reason of an
// UNAVAILABLE status for a page that waits for a node that is down or
// unreachable (types.proto).
const (
	PageUnavailableReason = "PAGE_UNAVAILABLE"
	ErrorDomain           = "dsm.v1"
)

// unavailableStatus is the status of a call that gave up on a page.
func unavailableStatus(ue *engine.UnavailableError) error {
	st := status.New(codes.Unavailable, ue.Error())
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: PageUnavailableReason, Domain: ErrorDomain,
		Metadata: map[string]string{"page": strconv.FormatUint(uint64(ue.Page), 10), "node": ue.Node.String(),
			"role": ue.Role, "why": ue.Why}}); err == nil {
		st = d
	}
	return st.Err()
}

// specMessage says what is wrong with a region spec in the user's words.
func specMessage(se *directory.SpecError) string {
	field := map[string]string{"Name": "name", "Size": "size", "PageSize": "page size",
		"ShardSize": "shard size", "Backups": "backup count", "Durability": "durability"}[se.Field]
	if field == "" {
		field = se.Field
	}
	return "bad region " + field + ": " + se.Reason
}

// regionPBIn is regionPB with what the data plane's placement says of
// the region in view v: whether it lost its contents at a restart of the
// whole cluster.
func (n *Node) regionPBIn(v *directory.View, r directory.Region) *dsmpb.Region {
	pb := regionPB(r)
	pb.ContentsLost = n.contentsLost(v, r)
	return pb
}

// contentsLost reports whether a shard of memory region r started over
// empty in view v (placement.go, revive): every process that could hold a
// copy of it had departed. A durable region comes back from its stores
// and never says so.
func (n *Node) contentsLost(v *directory.View, r directory.Region) bool {
	if r.Durability == directory.DurabilitySynced || len(r.Homes) == 0 || len(r.Promoted) == 0 && r.CheckpointAt == 0 {
		return false // a shard starts over only by a promotion record (a checkpoint may have dropped it)
	}
	pm := newProtoMap(v)
	var rc *regionChains
	if n.eng != nil {
		if re, err := n.eng.get(r.ID); err == nil {
			rc = re.chains
		}
	}
	if rc == nil {
		protos, err := pm.homeProtos(r)
		if err != nil {
			return false
		}
		rc = newRegionChains(r, protos)
	}
	return rc.contentsLost(pm)
}

func regionPB(r directory.Region) *dsmpb.Region {
	d := dsmpb.Durability_DURABILITY_DURABLE
	if r.Durability == directory.DurabilityMemory {
		d = dsmpb.Durability_DURABILITY_MEMORY
	}
	// created_epoch is 0 for a region recorded before the directory kept
	// it.
	return &dsmpb.Region{Name: r.Name, Id: uint32(r.ID), Size: r.Size, PageSize: r.PageSize, CreatedEpoch: uint64(r.Epoch),
		Durability: d, Shards: uint32(min(r.Shards(), uint64(^uint32(0)))), Access: accessPB(r.Access),
		FillRecords: uint32(len(r.Filled)), PromotionRecords: uint32(len(r.Promoted)),
		CheckpointEpoch: uint64(r.CheckpointAt), CheckpointBytes: uint32(len(r.Checkpoint))}
}

func (n *Node) createRegion(ctx context.Context, req *dsmpb.CreateRegionRequest) (*dsmpb.CreateRegionResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "region name is empty")
	}
	spec := directory.RegionSpec{Name: req.Name, Size: req.Size, PageSize: req.PageSize}
	switch req.Durability {
	case dsmpb.Durability_DURABILITY_UNSPECIFIED, dsmpb.Durability_DURABILITY_MEMORY:
		spec.Durability = directory.DurabilityMemory
	case dsmpb.Durability_DURABILITY_DURABLE:
		spec.Durability = directory.DurabilitySynced
	default:
		return nil, status.Errorf(codes.InvalidArgument, "unknown durability %d", req.Durability)
	}
	if req.Size == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "region %q: size is zero", req.Name)
	}
	r, created, err := n.dir.EnsureRegionAccess(ctx, spec, accessOf(req.GetAccess()))
	if err != nil {
		return nil, statusError(err)
	}
	if created {
		n.log.Info("region created", "region", r.Name, "id", r.ID, "size", r.Size)
	}
	return &dsmpb.CreateRegionResponse{Region: regionPB(r), Existed: !created}, nil
}

// deleteRegion deletes a region from the directory; every member then
// removes it (engines.remove). Unless forced, it refuses while any process
// on an alive member maps the region, or while a member cannot say. The
// check and the delete are not atomic: a process that maps the region
// between them sees its mapping die as with force.
func (n *Node) deleteRegion(ctx context.Context, req *dsmpb.DeleteRegionRequest) (*dsmpb.DeleteRegionResponse, error) {
	r, err := n.freshRegion(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	if err := checkRegion(ctx, r, "delete", true); err != nil {
		return nil, err
	}
	var mapped uint64
	var who, unknown []string
	for _, nm := range n.mappings(ctx, r, true).Nodes {
		if nm.Error != "" {
			unknown = append(unknown, nm.Error)
			continue
		}
		mapped += uint64(len(nm.Pids))
		for _, pid := range nm.Pids {
			who = append(who, fmt.Sprintf("pid %d on n%d", pid, nm.NodeId))
		}
	}
	if !req.GetForce() {
		if mapped > 0 {
			return nil, status.Errorf(codes.FailedPrecondition, "region %q is mapped by %d process(es) (%s); stop them, or delete with force",
				r.Name, mapped, strings.Join(who, ", "))
		}
		if len(unknown) > 0 {
			return nil, status.Errorf(codes.FailedPrecondition, "cannot tell whether region %q is mapped: %s; delete with force to go ahead",
				r.Name, strings.Join(unknown, "; "))
		}
	}
	if err := n.dir.DeleteRegion(ctx, r.Name); err != nil {
		return nil, statusError(err)
	}
	n.log.Info("region deleted", "region", r.Name, "id", r.ID, "mappings_cut", mapped, "forced", req.GetForce())
	return &dsmpb.DeleteRegionResponse{Id: uint32(r.ID), Mappings: mapped}, nil
}

// freshRegion looks a region up in a view that includes every change
// committed before the call.
func (n *Node) freshRegion(ctx context.Context, name string) (directory.Region, error) {
	if name == "" {
		return directory.Region{}, status.Error(codes.InvalidArgument, "region name is empty")
	}
	r, ok := n.freshView(ctx).Region(name)
	if !ok {
		return directory.Region{}, status.Errorf(codes.NotFound, "region %q not found", name)
	}
	return r, nil
}

func (n *Node) region(name string) (directory.Region, error) {
	if name == "" {
		return directory.Region{}, status.Error(codes.InvalidArgument, "region name is empty")
	}
	r, ok := n.dir.Region(name)
	if !ok {
		return directory.Region{}, status.Errorf(codes.NotFound, "region %q not found", name)
	}
	return r, nil
}

// adminServer is the Admin service.
type adminServer struct {
	dsmpb.UnimplementedAdminServer
	n *Node
}

func memberStatePB(s directory.MemberState, gossip directory.MemberState, inGossip bool) dsmpb.MemberState {
	switch s {
	case directory.StateAlive:
		if inGossip && gossip != directory.StateAlive {
			return dsmpb.MemberState_MEMBER_STATE_SUSPECT
		}
		return dsmpb.MemberState_MEMBER_STATE_ALIVE
	case directory.StateSuspect:
		return dsmpb.MemberState_MEMBER_STATE_SUSPECT
	case directory.StateFailed:
		return dsmpb.MemberState_MEMBER_STATE_DEAD
	case directory.StateLeft:
		return dsmpb.MemberState_MEMBER_STATE_LEFT
	}
	return dsmpb.MemberState_MEMBER_STATE_UNSPECIFIED
}

// memberRow is one member with what gossip says of it.
type memberRow struct {
	directory.Member
	Gossip     directory.GossipMember
	InGossip   bool
	InDir      bool
	StatePB    dsmpb.MemberState
	GossipAddr string
}

// members joins the replicated member table with this node's gossip view:
// alive members that gossip doubts are suspect, gossip members not yet in
// the table are joining.
func (n *Node) members(v *directory.View) []memberRow {
	gossip := map[ids.NodeID]directory.GossipMember{}
	for _, g := range n.dir.GossipMembers() {
		gossip[g.ID] = g
	}
	var rows []memberRow
	for _, m := range v.Members() {
		g, ok := gossip[m.ID]
		if m.ID == n.dir.NodeID() {
			g, ok = directory.GossipMember{ID: m.ID, Addr: n.addrs.Gossip, State: directory.StateAlive}, true
		}
		rows = append(rows, memberRow{Member: m, Gossip: g, InGossip: ok, InDir: true,
			StatePB: memberStatePB(m.State, g.State, ok), GossipAddr: g.Addr})
		delete(gossip, m.ID)
	}
	for _, g := range gossip {
		if g.State != directory.StateAlive {
			continue
		}
		rows = append(rows, memberRow{Member: directory.Member{ID: g.ID}, Gossip: g, InGossip: true,
			StatePB: dsmpb.MemberState_MEMBER_STATE_JOINING, GossipAddr: g.Addr})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].ID < rows[j].ID })
	return rows
}

// placementHealth says which regions want more backups than there are
// alive members (short) and which have shards without a home (homeless: no
// member is alive). Every shard of a region has a home as soon as one
// member is alive, so one shard per region tells.
func placementHealth(v *directory.View) (short, homeless []string) {
	alive := len(v.Alive())
	for _, r := range v.Regions() {
		if alive < 1+r.Backups {
			short = append(short, fmt.Sprintf("region %q wants %d backups per shard; %d members alive", r.Name, r.Backups, alive))
		}
		if p, err := v.ShardPlacement(placement.Shard{Region: r.ID, Index: 0}, r.Backups); err != nil || p.Home == ids.None {
			homeless = append(homeless, r.Name)
		}
	}
	return short, homeless
}

// protoIDsLow is the number of protocol ids left below which the cluster
// is degraded.
const protoIDsLow = 64

// protoIDsHealth warns when few protocol ids are left.
func protoIDsHealth(left int) []string {
	if left >= protoIDsLow {
		return nil
	}
	return []string{fmt.Sprintf("only %d protocol ids are left for new incarnations: every restart of a dsmd takes one, and they are not reused yet (docs/failover.md); at 0, a restarted dsmd cannot take part", left)}
}

// homesHealth names the regions whose pages are lost, unavailable or
// short of backups in the data plane (node/placement.go): a shard whose
// home departed (left, restarted or declared failed) with no complete
// backup left is lost (its pages fail with PAGE_UNAVAILABLE for good);
// one with fewer complete backups than its region asks for survives fewer
// failures until its home has filled the new ones (fills.go).
func homesHealth(v *directory.View, ds *dataSummary) []string {
	var out []string
	for _, r := range v.Regions() {
		rs := ds.regions[r.ID]
		if rs == nil {
			continue
		}
		if len(rs.lost) > 0 {
			out = append(out, fmt.Sprintf("region %q lost the pages of %s: no complete backup was left when the home departed; they fail as unavailable",
				r.Name, shardsAt(rs.lost, ds.why)))
		}
		if len(rs.awaited) > 0 {
			out = append(out, fmt.Sprintf("region %q: the pages of %s wait until a node whose page store holds them loads them (the region is durable; a call on them waits, then fails as unavailable)",
				r.Name, shardsAt(rs.awaited, ds.event)))
		}
		if rs.thin > 0 {
			out = append(out, fmt.Sprintf("region %q: %d of %d shards have fewer than %d complete backups (a backup failed, departed or became home; their homes are filling new ones)",
				r.Name, rs.thin, r.Shards(), r.Backups))
		}
		if len(rs.only) > 0 && len(r.Homes) > 1 {
			var parts []string
			for i, h := range slices.Sorted(maps.Keys(rs.only)) {
				if i == 0 {
					parts = append(parts, fmt.Sprintf("%v holds the only copy of %d shards", h, rs.only[h]))
				} else {
					parts = append(parts, fmt.Sprintf("%v of %d", h, rs.only[h]))
				}
			}
			out = append(out, fmt.Sprintf("region %q: %s: stopping or restarting such a node before their homes have filled new backups loses them",
				r.Name, strings.Join(parts, ", ")))
		}
	}
	return out
}

// shardsAt says "N shards homed at nX (why), ...".
func shardsAt(m map[ids.NodeID]uint64, why map[ids.NodeID]string) string {
	var parts []string
	for _, h := range slices.Sorted(maps.Keys(m)) {
		s := fmt.Sprintf("%d shards homed at %v", m[h], h)
		if w := why[h]; w != "" {
			s += " (" + w + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// dataSummary is where the data plane has every region's shards in one
// view (node/placement.go): the homes the engines use, not the placement
// over the members alive now.
type dataSummary struct {
	// homes counts, per node, the shards its current incarnation is home
	// of over every region.
	homes   map[ids.NodeID]uint32
	regions map[ids.RegionID]*regionSummary
	// why says what happened to the departed homes of lost shards, and
	// event the same for those of awaited ones.
	why, event map[ids.NodeID]string
}

type regionSummary struct {
	// lost counts shards by home node: departed (left, restarted or
	// declared failed) with no complete backup. awaited counts those of
	// a durable region instead: a node whose page store holds them loads
	// them again (placement.go, revive).
	lost, awaited map[ids.NodeID]uint64
	// thin counts the shards with fewer complete backups than asked;
	// only counts, by node, those whose only copy is that node's.
	thin uint64
	only map[ids.NodeID]uint64
}

// shardCounter computes the dataSummary of a view. It is exact (the chain
// of every shard: about a second for the 16M shards of MaxTotalSize in 2
// MiB shards over 3 members, on a 2-core VM), so it is kept for the last
// view asked about: views are immutable and change only with the
// directory.
type shardCounter struct {
	mu sync.Mutex
	v  *directory.View
	ds *dataSummary
}

func (sc *shardCounter) count(v *directory.View) *dataSummary {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.v == v {
		return sc.ds
	}
	pm := newProtoMap(v)
	ds := &dataSummary{homes: map[ids.NodeID]uint32{}, regions: map[ids.RegionID]*regionSummary{}, why: map[ids.NodeID]string{},
		event: map[ids.NodeID]string{}}
	for _, r := range v.Regions() {
		if len(r.Homes) == 0 {
			continue
		}
		protos, err := pm.homeProtos(r)
		if err != nil {
			continue
		}
		rc := newRegionChains(r, protos)
		rs := &regionSummary{lost: map[ids.NodeID]uint64{}, awaited: map[ids.NodeID]uint64{}, only: map[ids.NodeID]uint64{}}
		want := min(r.Backups, len(r.Homes)-1)
		if !rc.anyEvent(pm) {
			// Every shard at the first of its chain, with every backup:
			// only the homes are counted (no chain is built).
			for i := uint64(0); i < r.Shards(); i++ {
				h := placement.Home(placement.Shard{Region: r.ID, Index: i}, r.Homes)
				ds.homes[h]++
			}
			ds.regions[r.ID] = rs
			continue
		}
		for i := uint64(0); i < r.Shards(); i++ {
			s := placement.Shard{Region: r.ID, Index: i}
			sp := rc.place(s, pm)
			in := pm.byProto[sp.c[sp.hi]]
			switch {
			case in.departed && r.Durability == directory.DurabilitySynced:
				rs.awaited[in.node]++
				ds.event[in.node] = in.event
			case in.departed:
				rs.lost[in.node]++
				ds.why[in.node] = in.why
			default:
				ds.homes[in.node]++
			}
			if in.departed {
				continue
			}
			// Complete backups: creation members never failed since,
			// replacements with a completeness record (placement.go).
			if backups, _ := rc.completeBackups(s, pm); backups < want {
				rs.thin++
				if backups == 0 {
					rs.only[in.node]++
				}
			}
		}
		ds.regions[r.ID] = rs
	}
	sc.v, sc.ds = v, ds
	return ds
}

// Health is the verdict of Status and its reasons, worst first.
type Health struct {
	Verdict dsmpb.Health_Verdict
	Reasons []string
}

// judge computes the health verdict from what this node knows.
func (n *Node) judge(v *directory.View, rs directory.RaftStats, rows []memberRow, homeless, short []string) Health {
	var bad, warn []string
	if rs.Leader == ids.None {
		bad = append(bad, fmt.Sprintf("no Raft leader known to n%d (state %s, term %d)", n.cfg.ID, rs.State, rs.Term))
	}
	voters := map[ids.NodeID]bool{}
	for _, id := range rs.Voters {
		voters[id] = true
	}
	aliveVoters := 0
	for _, r := range rows {
		switch r.StatePB {
		case dsmpb.MemberState_MEMBER_STATE_DEAD:
			warn = append(warn, fmt.Sprintf("member n%d failed (%s)", r.ID, r.VerbsAddr))
		case dsmpb.MemberState_MEMBER_STATE_SUSPECT:
			warn = append(warn, fmt.Sprintf("member n%d is suspect: gossip says %s", r.ID, r.Gossip.State))
		case dsmpb.MemberState_MEMBER_STATE_JOINING:
			warn = append(warn, fmt.Sprintf("member n%d is in gossip but not yet in the directory", r.ID))
		case dsmpb.MemberState_MEMBER_STATE_ALIVE:
			if voters[r.ID] {
				aliveVoters++
			}
			if r.Draining {
				warn = append(warn, fmt.Sprintf("member n%d is draining: it writes back its dirty pages and leaves", r.ID))
			}
		}
	}
	if len(rs.Voters) > 0 && aliveVoters < len(rs.Voters)/2+1 {
		bad = append(bad, fmt.Sprintf("only %d of %d Raft voters alive: no quorum", aliveVoters, len(rs.Voters)))
	}
	if len(v.Alive()) == 0 {
		bad = append(bad, "no alive members in the directory")
	}
	for _, r := range homeless {
		bad = append(bad, fmt.Sprintf("region %q has a shard with no live home", r))
	}
	warn = append(warn, homesHealth(v, n.shards.count(v))...)
	warn = append(warn, short...)
	warn = append(warn, protoIDsHealth(v.ProtoIDsLeft())...)
	switch {
	case len(bad) > 0:
		return Health{dsmpb.Health_VERDICT_UNHEALTHY, append(bad, warn...)}
	case len(warn) > 0:
		return Health{dsmpb.Health_VERDICT_DEGRADED, warn}
	}
	return Health{Verdict: dsmpb.Health_VERDICT_HEALTHY}
}

func (s *adminServer) Status(ctx context.Context, _ *dsmpb.StatusRequest) (*dsmpb.StatusResponse, error) {
	n := s.n
	v := n.dir.View()
	rs := n.dir.RaftStats()
	rows := n.members(v)
	short, homeless := placementHealth(v)
	homes := n.shards.count(v).homes
	h := n.judge(v, rs, rows, homeless, short)
	voters := map[ids.NodeID]bool{}
	for _, id := range rs.Voters {
		voters[id] = true
	}
	resp := &dsmpb.StatusResponse{
		NodeId: uint32(n.cfg.ID), LeaderId: uint32(rs.Leader), Term: rs.Term, Epoch: uint64(v.Epoch),
		RegionCount: uint32(len(v.Regions())), Version: Version,
		Health: &dsmpb.Health{Verdict: h.Verdict, Reasons: h.Reasons},
	}
	for _, r := range rows {
		ns := &dsmpb.NodeStatus{NodeId: uint32(r.ID), Addr: r.GRPCAddr, State: r.StatePB,
			Voter: voters[r.ID], HomedShards: homes[r.ID], Draining: r.Draining && r.State == directory.StateAlive}
		if r.ID == ids.NodeID(n.cfg.ID) {
			n.cacheFigures(ns)
		}
		resp.Nodes = append(resp.Nodes, ns)
	}
	if !localOnly(ctx) {
		n.askPeers(ctx, resp.Nodes)
	}
	return resp, nil
}

// cacheFigures fills this node's cache use into ns.
func (n *Node) cacheFigures(ns *dsmpb.NodeStatus) {
	ns.CacheCapacityBytes = uint64(n.cfg.CacheSize)
	if n.cache != nil {
		st := n.cache.Stats()
		ns.CacheBytes = uint64(st.ResidentBytes)
		ns.DirtyPages = uint64(st.DirtyPages)
	}
}

// statusLocalKey marks a Status call from a peer's Status: answer for
// yourself, ask nobody.
const statusLocalKey = "dsm-status-local"

func localOnly(ctx context.Context) bool {
	md, ok := metadata.FromIncomingContext(ctx)
	return ok && len(md.Get(statusLocalKey)) > 0
}

// peerTimeout bounds one peer's answer to Status.
const peerTimeout = time.Second

// askPeers fills in the cache figures of the other alive members by asking
// each, in parallel, over its published gRPC address. A peer that does not
// answer keeps its row with the reason in Error.
func (n *Node) askPeers(ctx context.Context, nodes []*dsmpb.NodeStatus) {
	var wg sync.WaitGroup
	for _, ns := range nodes {
		if ns.NodeId == n.cfg.ID {
			continue
		}
		if ns.State != dsmpb.MemberState_MEMBER_STATE_ALIVE || ns.Addr == "" {
			ns.Error = fmt.Sprintf("n%d not asked: %s", ns.NodeId, memberWord(ns.State))
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.askPeer(ctx, ns); err != nil {
				ns.Error = fmt.Sprintf("n%d did not answer: %s", ns.NodeId, status.Convert(err).Message())
			}
		}()
	}
	wg.Wait()
}

func memberWord(s dsmpb.MemberState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "MEMBER_STATE_"))
}

// dialPeer makes a gRPC client of member id at its published gRPC address
// (a Unix socket, or TCP with mutual TLS when this node runs TLS).
func (n *Node) dialPeer(addr string, id ids.NodeID) (*grpc.ClientConn, error) {
	target := addr
	creds := insecure.NewCredentials()
	if !strings.HasPrefix(target, "unix://") {
		target = "passthrough:///" + target
		if n.tls != nil {
			// The peer's gRPC TCP listener is mutual TLS: present this
			// node's certificate, require the peer's.
			creds = credentials.NewTLS(n.tls.ClientConfig(tlsconf.Node(id)))
		}
	}
	return grpc.NewClient(target, grpc.WithTransportCredentials(creds))
}

func (n *Node) askPeer(ctx context.Context, ns *dsmpb.NodeStatus) error {
	conn, err := n.dialPeer(ns.Addr, ids.NodeID(ns.NodeId))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, peerTimeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, statusLocalKey, "1")
	st, err := dsmpb.NewAdminClient(conn).Status(ctx, &dsmpb.StatusRequest{})
	if err != nil {
		return err
	}
	for _, p := range st.Nodes {
		if p.NodeId == ns.NodeId {
			ns.CacheBytes, ns.CacheCapacityBytes, ns.DirtyPages = p.CacheBytes, p.CacheCapacityBytes, p.DirtyPages
			return nil
		}
	}
	return fmt.Errorf("its answer has no line for itself (node id %d answered)", st.NodeId)
}

func (s *adminServer) Members(ctx context.Context, _ *dsmpb.MembersRequest) (*dsmpb.MembersResponse, error) {
	v := s.n.dir.View()
	resp := &dsmpb.MembersResponse{Epoch: uint64(v.Epoch), ProtoIdsLeft: uint32(v.ProtoIDsLeft())}
	for _, r := range s.n.members(v) {
		pm := &dsmpb.Member{
			NodeId: uint32(r.ID), Name: r.ID.String(), State: r.StatePB,
			GossipAddr: r.GossipAddr, RaftAddr: r.RaftAddr, VerbsAddr: r.VerbsAddr, GrpcAddr: r.GRPCAddr,
			Incarnation: r.Incarnation, ProtoId: uint32(r.Proto), Draining: r.Draining && r.State == directory.StateAlive,
		}
		switch {
		case r.ID == s.n.dir.NodeID():
			pm.LastSeenUnixNano = time.Now().UnixNano()
		case !r.Gossip.LastSeen.IsZero():
			pm.LastSeenUnixNano = r.Gossip.LastSeen.UnixNano()
		}
		resp.Members = append(resp.Members, pm)
	}
	return resp, nil
}

// RemoveMember declares a failed member gone for good (an operator's act:
// only root and dsmd's user may, over the Unix socket).
func (s *adminServer) RemoveMember(ctx context.Context, req *dsmpb.RemoveMemberRequest) (*dsmpb.RemoveMemberResponse, error) {
	if a, ok := localPeer(ctx); ok && !privileged(a.Identity) {
		return nil, status.Errorf(codes.PermissionDenied, "permission denied: uid %d (pid %d) may not remove members: only root and dsmd's user (uid %d) may",
			a.UID, a.PID, os.Geteuid())
	}
	id := ids.NodeID(req.GetNodeId())
	if id == ids.None {
		return nil, status.Error(codes.InvalidArgument, "node id 0")
	}
	if id == ids.NodeID(s.n.cfg.ID) {
		return nil, status.Errorf(codes.FailedPrecondition, "n%d is this node: it is alive; stop its dsmd with SIGTERM to take it out", id)
	}
	epoch, err := s.n.dir.RemoveMember(ctx, id)
	switch {
	case errors.Is(err, directory.ErrNoMember):
		return nil, status.Error(codes.NotFound, err.Error())
	case errors.Is(err, directory.ErrNotFailed):
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	case err != nil:
		return nil, statusError(err)
	}
	s.n.log.Warn("member removed by an operator: its homes move to their backups", "member", id, "epoch", epoch)
	return &dsmpb.RemoveMemberResponse{Epoch: uint64(epoch)}, nil
}

func (s *adminServer) Raft(ctx context.Context, _ *dsmpb.RaftRequest) (*dsmpb.RaftResponse, error) {
	rs := s.n.dir.RaftStats()
	v := s.n.dir.View()
	resp := &dsmpb.RaftResponse{
		NodeId: uint32(s.n.cfg.ID), Role: strings.ToLower(rs.State), LeaderId: uint32(rs.Leader),
		LeaderAddr: rs.LeaderAddr, Term: rs.Term, LastIndex: rs.LastIndex, CommitIndex: rs.CommitIndex,
		AppliedIndex: rs.AppliedIndex,
	}
	add := func(id ids.NodeID, suf dsmpb.RaftServer_Suffrage) {
		srv := &dsmpb.RaftServer{NodeId: uint32(id), Suffrage: suf}
		if m, ok := v.Member(id); ok {
			srv.Addr = m.RaftAddr
		}
		resp.Configuration = append(resp.Configuration, srv)
	}
	for _, id := range rs.Voters {
		add(id, dsmpb.RaftServer_SUFFRAGE_VOTER)
	}
	for _, id := range rs.NonVoters {
		add(id, dsmpb.RaftServer_SUFFRAGE_NONVOTER)
	}
	return resp, nil
}

// freshView is a view that includes every change committed before the
// call, so that an operator who created a region on one node sees it on
// another; without a leader to confirm it, the local replica.
func (n *Node) freshView(ctx context.Context) *directory.View {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if v, err := n.dir.LinearizableView(ctx); err == nil {
		return v
	}
	return n.dir.View()
}

func (s *adminServer) Regions(ctx context.Context, _ *dsmpb.RegionsRequest) (*dsmpb.RegionsResponse, error) {
	v := s.n.freshView(ctx)
	resp := &dsmpb.RegionsResponse{Epoch: uint64(v.Epoch)}
	for _, r := range v.Regions() {
		resp.Regions = append(resp.Regions, s.n.regionPBIn(v, r))
	}
	return resp, nil
}

func (s *adminServer) RegionInfo(ctx context.Context, req *dsmpb.RegionInfoRequest) (*dsmpb.RegionInfoResponse, error) {
	v := s.n.freshView(ctx)
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "region name is empty")
	}
	r, ok := v.Region(req.Name)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "region %q not found", req.Name)
	}
	limit := uint64(req.GetMaxShards())
	switch {
	case limit == 0:
		limit = DefaultListedShards
	case limit > MaxListedShards:
		return nil, status.Errorf(codes.InvalidArgument, "max_shards %d is more than %d; page with first_shard", limit, MaxListedShards)
	}
	total := r.Shards()
	first := req.GetFirstShard()
	if first > total {
		return nil, status.Errorf(codes.InvalidArgument, "first_shard %d is past the region's %d shards", first, total)
	}
	end := min(total, first+limit)
	resp := &dsmpb.RegionInfoResponse{Region: s.n.regionPBIn(v, r), Epoch: uint64(v.Epoch), ShardCount: total, NextShard: end}
	pps := r.PagesPerShard()
	// The data plane's placement (node/placement.go); a region recorded
	// without homes shows the placement over the members alive now.
	pm := newProtoMap(v)
	var rc *regionChains
	if protos, err := pm.homeProtos(r); err == nil && len(r.Homes) > 0 {
		rc = newRegionChains(r, protos)
	}
	for i := first; i < end; i++ {
		shard := placement.Shard{Region: r.ID, Index: i}
		fp := i * pps
		sh := &dsmpb.Shard{Index: uint32(i), FirstPage: fp, PageCount: min(pps, r.Pages()-fp)}
		if rc != nil {
			home := pm.byProto[rc.shardHome(shard, pm)]
			sh.Home, sh.HomeLost = uint32(home.node), home.departed
			for _, b := range rc.shardBackups(shard, pm) {
				sh.Backups = append(sh.Backups, uint32(pm.byProto[b].node))
			}
		} else {
			p, err := v.ShardPlacement(shard, r.Backups)
			if err != nil {
				return nil, statusError(err)
			}
			sh.Home = uint32(p.Home)
			for _, b := range p.Backups {
				sh.Backups = append(sh.Backups, uint32(b))
			}
		}
		resp.Shards = append(resp.Shards, sh)
	}
	return resp, nil
}

// Mappings lists the processes that map a region, here and, when asked,
// on every alive member (a member that does not answer keeps its row with
// the reason).
func (s *adminServer) Mappings(ctx context.Context, req *dsmpb.MappingsRequest) (*dsmpb.MappingsResponse, error) {
	r, err := s.n.freshRegion(ctx, req.GetRegion())
	if err != nil {
		return nil, err
	}
	return s.n.mappings(ctx, r, req.GetAllNodes() && !localOnly(ctx)), nil
}

func (n *Node) mappings(ctx context.Context, r directory.Region, all bool) *dsmpb.MappingsResponse {
	resp := &dsmpb.MappingsResponse{RegionId: uint32(r.ID)}
	local := &dsmpb.NodeMappings{NodeId: n.cfg.ID}
	if pids, err := n.cache.Mappings(r.ID); err == nil {
		for _, pid := range pids {
			local.Pids = append(local.Pids, int32(pid))
		}
	}
	resp.Nodes = append(resp.Nodes, local)
	if !all {
		return resp
	}
	var mu sync.Mutex
	n.eachMember(ctx, func(ctx context.Context, id uint32, adm dsmpb.AdminClient, err error) {
		nm := &dsmpb.NodeMappings{NodeId: id}
		if err == nil {
			var pr *dsmpb.MappingsResponse
			pr, err = adm.Mappings(ctx, &dsmpb.MappingsRequest{Region: r.Name})
			switch {
			case err == nil && pr.RegionId != uint32(r.ID):
				err = fmt.Errorf("it knows region %q as r%d, not %v", r.Name, pr.RegionId, r.ID)
			case err == nil:
				for _, p := range pr.Nodes {
					if p.NodeId == id {
						nm.Pids = p.Pids
					}
				}
			case status.Code(err) == codes.NotFound:
				err = nil // not in its replica yet: it maps nothing
			}
		}
		if err != nil {
			nm.Error = fmt.Sprintf("n%d did not answer: %s", id, status.Convert(err).Message())
		}
		mu.Lock()
		resp.Nodes = append(resp.Nodes, nm)
		mu.Unlock()
	})
	sort.Slice(resp.Nodes, func(i, j int) bool { return resp.Nodes[i].NodeId < resp.Nodes[j].NodeId })
	return resp
}

func (s *adminServer) CreateRegion(ctx context.Context, req *dsmpb.CreateRegionRequest) (*dsmpb.CreateRegionResponse, error) {
	return s.n.createRegion(ctx, req)
}

func (s *adminServer) DeleteRegion(ctx context.Context, req *dsmpb.DeleteRegionRequest) (*dsmpb.DeleteRegionResponse, error) {
	return s.n.deleteRegion(ctx, req)
}

// clientServer is the Client service: region calls now, memory calls once
// the coherence engine exists.
type clientServer struct {
	dsmpb.UnimplementedClientServer
	n *Node
}

func (s *clientServer) CreateRegion(ctx context.Context, req *dsmpb.CreateRegionRequest) (*dsmpb.CreateRegionResponse, error) {
	return s.n.createRegion(ctx, req)
}

func (s *clientServer) DeleteRegion(ctx context.Context, req *dsmpb.DeleteRegionRequest) (*dsmpb.DeleteRegionResponse, error) {
	return s.n.deleteRegion(ctx, req)
}

func (s *clientServer) ListRegions(ctx context.Context, _ *dsmpb.ListRegionsRequest) (*dsmpb.ListRegionsResponse, error) {
	resp := &dsmpb.ListRegionsResponse{}
	v := s.n.freshView(ctx)
	for _, r := range v.Regions() {
		resp.Regions = append(resp.Regions, s.n.regionPBIn(v, r))
	}
	return resp, nil
}

func (s *clientServer) GetRegion(ctx context.Context, req *dsmpb.GetRegionRequest) (*dsmpb.GetRegionResponse, error) {
	r, err := s.n.region(req.GetName())
	if status.Code(err) == codes.NotFound {
		// Created through another node a moment ago? Ask the leader.
		if fr, ok := s.n.freshView(ctx).Region(req.GetName()); ok {
			r, err = fr, nil
		}
	}
	if err != nil {
		return nil, err
	}
	resp := &dsmpb.GetRegionResponse{Region: s.n.regionPBIn(s.n.dir.View(), r)}
	if s.n.eng != nil {
		if why := s.n.eng.refusedRegion(r.ID); why != "" {
			resp.NotServed = fmt.Sprintf("region %q is not served on n%d: %s", r.Name, s.n.cfg.ID, why)
		}
	}
	return resp, nil
}

func (s *clientServer) Session(context.Context, *dsmpb.SessionRequest) (*dsmpb.SessionResponse, error) {
	r := &dsmpb.SessionResponse{NodeId: s.n.cfg.ID, Version: Version}
	if s.n.cache != nil {
		r.MapSocket = s.n.addrs.MapSocket
	}
	return r, nil
}
