package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// The JSON shapes below are dsmctl's stable output: fields are added, never
// renamed or removed. Node ids are numbers (1 for n1), sizes bytes,
// latencies nanoseconds.

type statusJSON struct {
	Node        uint32           `json:"node_id"`
	Version     string           `json:"version"`
	Leader      uint32           `json:"leader_id"`
	Term        uint64           `json:"term"`
	Epoch       uint64           `json:"epoch"`
	RegionCount uint32           `json:"region_count"`
	Health      string           `json:"health"`
	Reasons     []string         `json:"reasons"`
	Nodes       []nodeStatusJSON `json:"nodes"`
}

type nodeStatusJSON struct {
	Node          uint32 `json:"node_id"`
	Addr          string `json:"addr"`
	State         string `json:"state"`
	Voter         bool   `json:"voter"`
	CacheBytes    uint64 `json:"cache_bytes"`
	CacheCapacity uint64 `json:"cache_capacity_bytes"`
	DirtyPages    uint64 `json:"dirty_pages"`
	HomedShards   uint32 `json:"homed_shards"`
	Error         string `json:"error,omitempty"`
}

func healthName(v dsmpb.Health_Verdict) string {
	return enumName(v.String(), "VERDICT_")
}

// healthExit is the exit code of status for a verdict; an unknown verdict is
// unhealthy, so that a probe never passes on an answer it cannot read.
func healthExit(v dsmpb.Health_Verdict) int {
	switch v {
	case dsmpb.Health_VERDICT_HEALTHY:
		return ExitOK
	case dsmpb.Health_VERDICT_DEGRADED:
		return ExitDegraded
	}
	return ExitUnhealthy
}

func (a *app) statusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "The cluster at a glance, with a health verdict (exit code 0 only when healthy)",
		Long: `status shows the members with their state, the Raft leader and term, the
epoch, the number of regions, cache use and dirty pages per node, and a
health verdict with its reasons.

The exit code is the verdict: 0 healthy, 3 degraded (serving, with less
margin), 4 unhealthy or unknown, 1 when dsmd cannot be asked.`,
		Example: `  dsmctl status
  dsmctl status --json | jq .health
  until dsmctl status >/dev/null; do sleep 1; done   # wait for a healthy cluster`,
		Args: args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.admin()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd)
			defer cancel()
			st, err := c.Status(ctx, &dsmpb.StatusRequest{})
			if err != nil {
				return err
			}
			verdict := st.GetHealth().GetVerdict()
			a.exit = healthExit(verdict)
			if a.json {
				v := statusJSON{
					Node: st.NodeId, Version: st.Version, Leader: st.LeaderId, Term: st.Term, Epoch: st.Epoch,
					RegionCount: st.RegionCount, Health: healthName(verdict),
					Reasons: append([]string{}, st.GetHealth().GetReasons()...),
					Nodes:   []nodeStatusJSON{},
				}
				for _, n := range st.Nodes {
					v.Nodes = append(v.Nodes, nodeStatusJSON{
						Node: n.NodeId, Addr: n.Addr, State: stateOf(n.State, n.Draining), Voter: n.Voter,
						CacheBytes: n.CacheBytes, CacheCapacity: n.CacheCapacityBytes,
						DirtyPages: n.DirtyPages, HomedShards: n.HomedShards, Error: n.Error,
					})
				}
				return a.printJSON(v)
			}
			col := a.color()
			w := a.env.Stdout
			by := node(st.NodeId)
			if st.Version != "" {
				by += " (dsmd " + st.Version + ")"
			}
			fmt.Fprintf(w, "answered by %s · leader %s · term %d · epoch %d · %d region%s\n\n",
				by, node(st.LeaderId), st.Term, st.Epoch, st.RegionCount, plural(int(st.RegionCount)))
			t := newTable("NODE", "ADDR", "STATE", "VOTER", "CACHE", "DIRTY PAGES", "SHARDS")
			for _, n := range st.Nodes {
				cache := FormatSize(n.CacheBytes) + " / " + FormatSize(n.CacheCapacityBytes)
				dirty := fmt.Sprint(n.DirtyPages)
				if n.Error != "" {
					cache, dirty = "? ("+userMessage(n.Error)+")", "?"
				}
				t.row(node(n.NodeId), n.Addr, paint(col, stateColor(n.State, n.Draining), stateOf(n.State, n.Draining)),
					yesNo(n.Voter), cache, dirty, n.HomedShards)
			}
			if err := t.write(w); err != nil {
				return err
			}
			fmt.Fprintf(w, "\nhealth: %s\n", paint(col, verdictColor(verdict), healthName(verdict)))
			for _, r := range st.GetHealth().GetReasons() {
				fmt.Fprintf(w, "  - %s\n", oneLine(r))
			}
			return nil
		},
	}
}

func stateColor(s dsmpb.MemberState, draining bool) string {
	switch {
	case draining && s == dsmpb.MemberState_MEMBER_STATE_ALIVE:
		return "33"
	}
	switch s {
	case dsmpb.MemberState_MEMBER_STATE_ALIVE:
		return "32"
	case dsmpb.MemberState_MEMBER_STATE_SUSPECT, dsmpb.MemberState_MEMBER_STATE_JOINING:
		return "33"
	case dsmpb.MemberState_MEMBER_STATE_DEAD:
		return "31"
	}
	return ""
}

func verdictColor(v dsmpb.Health_Verdict) string {
	switch v {
	case dsmpb.Health_VERDICT_HEALTHY:
		return "1;32"
	case dsmpb.Health_VERDICT_DEGRADED:
		return "1;33"
	}
	return "1;31"
}

type memberJSON struct {
	Node       uint32 `json:"node_id"`
	Name       string `json:"name"`
	State      string `json:"state"`
	GossipAddr string `json:"gossip_addr"`
	RaftAddr   string `json:"raft_addr"`
	VerbsAddr  string `json:"verbs_addr"`
	GRPCAddr   string `json:"grpc_addr"`
	LastSeen   int64  `json:"last_seen_unix_nano"`
	// Incarnation counts the processes that held the node id (a restart
	// is the next one); ProtoID is the incarnation's protocol id.
	Incarnation uint64 `json:"incarnation"`
	ProtoID     uint32 `json:"proto_id"`
}

func (a *app) membersCmd() *cobra.Command {
	cmd := a.membersListCmd()
	cmd.AddCommand(a.membersRemoveCmd())
	return cmd
}

func (a *app) membersRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "remove NODE",
		Short: "Declare a failed member gone for good: its shards move to their backups",
		Long: `remove tells the cluster that a failed member's process is dead for good
(its machine is lost or powered off), so that it need not be restarted for
its pages to be served again: its incarnation departs, the shards it was home
of move to their backups (every page written back before the failure is
there), and the pages it held Modified go back to their last write-back.

Only a member the directory holds failed can be removed (see dsmctl
members); one that is alive leaves by itself when its dsmd is stopped with
SIGTERM. Remove only a member whose process you know is dead: until leases
exist (docs/failover.md §9), one cut off by a partition could still write
to its local copies. If it was alive after all, its dsmd exits when it
learns it was removed, and a restart rejoins as a new incarnation.`,
		Example: "  dsmctl members remove 3\n  dsmctl members remove n3",
		Args:    args(1, 1, "NODE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id, err := strconv.ParseUint(strings.TrimPrefix(argv[0], "n"), 10, 32)
			if err != nil || id == 0 {
				return usagef("NODE: %q is not a node id (3 or n3)", argv[0])
			}
			c, err := a.admin()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd)
			defer cancel()
			r, err := c.RemoveMember(ctx, &dsmpb.RemoveMemberRequest{NodeId: uint32(id)})
			if status.Code(err) == codes.FailedPrecondition {
				return hintError{err, "only a failed member can be removed: see `dsmctl members`"}
			}
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(struct {
					Node  uint64 `json:"node_id"`
					Epoch uint64 `json:"epoch"`
				}{id, r.Epoch})
			}
			fmt.Fprintf(a.env.Stdout, "n%d removed in epoch %d: the shards it was home of move to their backups\n", id, r.Epoch)
			return nil
		},
	}
}

func (a *app) membersListCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "members",
		Short:   "The members of the cluster with their state and addresses",
		Example: "  dsmctl members\n  dsmctl members --json\n  dsmctl members remove 3   # a failed member, gone for good",
		Args:    args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.admin()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd)
			defer cancel()
			m, err := c.Members(ctx, &dsmpb.MembersRequest{})
			if err != nil {
				return err
			}
			if a.json {
				v := struct {
					Epoch        uint64       `json:"epoch"`
					Members      []memberJSON `json:"members"`
					ProtoIDsLeft uint32       `json:"proto_ids_left"`
				}{Epoch: m.Epoch, Members: []memberJSON{}, ProtoIDsLeft: m.ProtoIdsLeft}
				for _, x := range m.Members {
					v.Members = append(v.Members, memberJSON{x.NodeId, x.Name, stateOf(x.State, x.Draining),
						x.GossipAddr, x.RaftAddr, x.VerbsAddr, x.GrpcAddr, x.LastSeenUnixNano, x.Incarnation, x.ProtoId})
				}
				return a.printJSON(v)
			}
			col := a.color()
			now := a.env.Now()
			t := newTable("NODE", "NAME", "STATE", "INC", "PROTO", "GOSSIP", "RAFT", "VERBS", "GRPC", "LAST SEEN")
			for _, x := range m.Members {
				inc, proto := "-", "-"
				if x.Incarnation != 0 {
					inc = fmt.Sprint(x.Incarnation)
				}
				if x.ProtoId != 0 {
					proto = fmt.Sprint(x.ProtoId)
				}
				t.row(node(x.NodeId), x.Name, paint(col, stateColor(x.State, x.Draining), stateOf(x.State, x.Draining)), inc, proto,
					x.GossipAddr, x.RaftAddr, x.VerbsAddr, x.GrpcAddr, age(now, x.LastSeenUnixNano))
			}
			fmt.Fprintf(a.env.Stdout, "epoch %d · %d member%s · %d protocol ids left\n\n", m.Epoch, len(m.Members), plural(len(m.Members)), m.ProtoIdsLeft)
			return t.write(a.env.Stdout)
		},
	}
}

type raftJSON struct {
	Node               uint32           `json:"node_id"`
	Role               string           `json:"role"`
	Leader             uint32           `json:"leader_id"`
	LeaderAddr         string           `json:"leader_addr"`
	Term               uint64           `json:"term"`
	LastIndex          uint64           `json:"last_index"`
	CommitIndex        uint64           `json:"commit_index"`
	AppliedIndex       uint64           `json:"applied_index"`
	ConfigurationIndex uint64           `json:"configuration_index"`
	LastContactMS      uint64           `json:"last_contact_ms"`
	Voters             []uint32         `json:"voters"`
	NonVoters          []uint32         `json:"non_voters"`
	Configuration      []raftServerJSON `json:"configuration"`
}

type raftServerJSON struct {
	Node     uint32 `json:"node_id"`
	Addr     string `json:"addr"`
	Suffrage string `json:"suffrage"`
}

func (a *app) raftCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "raft",
		Short:   "The Raft state of the directory: leader, term, indexes, configuration",
		Example: "  dsmctl raft\n  dsmctl raft --json | jq .leader_id",
		Args:    args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.admin()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd)
			defer cancel()
			r, err := c.Raft(ctx, &dsmpb.RaftRequest{})
			if err != nil {
				return err
			}
			v := raftJSON{
				Node: r.NodeId, Role: r.Role, Leader: r.LeaderId, LeaderAddr: r.LeaderAddr, Term: r.Term,
				LastIndex: r.LastIndex, CommitIndex: r.CommitIndex, AppliedIndex: r.AppliedIndex,
				ConfigurationIndex: r.ConfigurationIndex, LastContactMS: r.LastContactMs,
				Voters: []uint32{}, NonVoters: []uint32{}, Configuration: []raftServerJSON{},
			}
			for _, s := range r.Configuration {
				suf := enumName(s.Suffrage.String(), "SUFFRAGE_")
				v.Configuration = append(v.Configuration, raftServerJSON{s.NodeId, s.Addr, suf})
				if s.Suffrage == dsmpb.RaftServer_SUFFRAGE_VOTER {
					v.Voters = append(v.Voters, s.NodeId)
				} else {
					v.NonVoters = append(v.NonVoters, s.NodeId)
				}
			}
			if a.json {
				return a.printJSON(v)
			}
			w := a.env.Stdout
			addr := ""
			if r.LeaderAddr != "" {
				addr = " (" + r.LeaderAddr + ")"
			}
			switch {
			case r.LeaderId == 0:
				fmt.Fprintf(w, "%s is %s · leader %s · term %d\n", node(r.NodeId), r.Role, paint(a.color(), "1;31", "none"), r.Term)
			case r.LeaderId == r.NodeId:
				fmt.Fprintf(w, "%s is the leader%s · term %d\n", node(r.NodeId), addr, r.Term)
			default:
				fmt.Fprintf(w, "%s is %s · leader %s%s · term %d\n", node(r.NodeId), r.Role, node(r.LeaderId), addr, r.Term)
			}
			fmt.Fprintf(w, "last index %d · commit %d · applied %d · configuration index %d · last contact %d ms\n",
				r.LastIndex, r.CommitIndex, r.AppliedIndex, r.ConfigurationIndex, r.LastContactMs)
			fmt.Fprintf(w, "voters %s · non-voters %s\n\n", nodes(v.Voters), nodes(v.NonVoters))
			t := newTable("NODE", "ADDR", "SUFFRAGE", "ROLE")
			for _, s := range r.Configuration {
				role := ""
				if s.NodeId == r.LeaderId {
					role = "leader"
				}
				t.row(node(s.NodeId), s.Addr, enumName(s.Suffrage.String(), "SUFFRAGE_"), role)
			}
			return t.write(w)
		},
	}
}
