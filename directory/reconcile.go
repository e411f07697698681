package directory

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/tlsconf"
)

// run is the replica's background loop: it drains gossip events, keeps the
// gossiped metadata current, bootstraps when the time has come and, on the
// leader, reconciles gossip with the member table and the Raft
// configuration.
func (d *Directory) run() {
	defer d.wg.Done()
	tick := time.NewTicker(d.cfg.Timing.ReconcileInterval)
	defer tick.Stop()
	leaderCh := d.raft.LeaderCh()
	for {
		select {
		case <-d.closeCh:
			return
		case <-d.gossip.signal:
		case isLeader := <-leaderCh:
			if isLeader {
				d.lastVoterChange.Store(int64(leaseClock()))
			}
		case <-tick.C:
		}
		if d.gossip.drain() {
			d.savePeers()
		}
		d.publishHasState()
		d.maybeBootstrap()
		if d.raft.State() == raft.Leader {
			d.reconcile()
		}
	}
}

// peersFile, in DataDir, lists the gossip addresses of the members last
// seen alive. A node that restarts joins them again (besides Config.Join):
// without it, a restarted seed node would sit alone in its own gossip
// cluster while the others consider it dead.
const peersFile = "gossip-peers.json"

func (d *Directory) savePeers() {
	var addrs []string
	for _, e := range d.gossip.snapshot() {
		if e.state == gossipAlive && e.meta.ID != d.cfg.NodeID && e.addr != "" {
			addrs = append(addrs, e.addr)
		}
	}
	slices.Sort(addrs)
	if slices.Equal(addrs, d.savedPeers) {
		return
	}
	b, _ := json.Marshal(addrs)
	tmp := filepath.Join(d.cfg.DataDir, peersFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		d.log.Warn("directory: save gossip peers", "err", err)
		return
	}
	if err := os.Rename(tmp, filepath.Join(d.cfg.DataDir, peersFile)); err != nil {
		d.log.Warn("directory: save gossip peers", "err", err)
		return
	}
	d.savedPeers = addrs
}

// loadPeers reads the addresses saved by savePeers; a missing or damaged
// file yields none.
func loadPeers(dir string) []string {
	b, err := os.ReadFile(filepath.Join(dir, peersFile))
	if err != nil {
		return nil
	}
	var addrs []string
	if json.Unmarshal(b, &addrs) != nil {
		return nil
	}
	return addrs
}

// publishHasState sets HasState in the gossiped metadata once this replica
// holds Raft state, so that nobody bootstraps a second cluster beside it.
func (d *Directory) publishHasState() {
	m := *d.gossip.meta.Load()
	if m.HasState || d.raft.LastIndex() == 0 {
		return
	}
	m.HasState = true
	d.gossip.meta.Store(&m)
	// UpdateNode waits for the broadcast to go out; bound the wait (zero
	// would mean forever).
	if err := d.ml.UpdateNode(d.cfg.Timing.GossipProbeInterval * 5); err != nil {
		d.log.Debug("directory: update gossip metadata", "err", err)
	}
}

// maybeBootstrap implements bootstrap-expect: when BootstrapExpect servers
// (including this one) are alive in gossip with the same setting and none
// has Raft state, the one with the lowest id bootstraps Raft with all of them
// as voters. The others are told by the new leader.
func (d *Directory) maybeBootstrap() {
	if d.bootstrapped || d.cfg.BootstrapExpect == 0 {
		return
	}
	if d.raft.LastIndex() > 0 {
		d.bootstrapped = true
		return
	}
	if len(d.cfg.Join) > 0 && !d.joined.Load() {
		return
	}
	var servers []nodeMeta
	for _, e := range d.gossip.snapshot() {
		if e.state != gossipAlive {
			continue
		}
		if e.meta.HasState {
			// A cluster exists: wait for its leader to add us.
			return
		}
		if e.meta.Expect == 0 {
			continue
		}
		if e.meta.Expect != d.cfg.BootstrapExpect {
			d.log.Warn("directory: bootstrap-expect mismatch, not bootstrapping", "peer", e.meta.ID.String(), "peer_expect", e.meta.Expect, "expect", d.cfg.BootstrapExpect)
			return
		}
		servers = append(servers, e.meta)
	}
	if len(servers) < d.cfg.BootstrapExpect {
		return
	}
	slices.SortFunc(servers, func(a, b nodeMeta) int { return cmpID(a.ID, b.ID) })
	servers = servers[:d.cfg.BootstrapExpect]
	if servers[0].ID != d.cfg.NodeID {
		return
	}
	var conf raft.Configuration
	for _, s := range servers {
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: serverID(s.ID), Address: raft.ServerAddress(s.RaftAddr)})
	}
	err := d.raft.BootstrapCluster(conf).Error()
	d.bootstrapped = true
	if err != nil {
		d.log.Warn("directory: bootstrap", "err", err)
		return
	}
	d.log.Info("directory: bootstrapped", "voters", len(conf.Servers))
}

// reconcile runs on the leader. Gossip is the truth about who is reachable;
// the member table and the Raft configuration are brought in line with it,
// each change a replicated command in its own epoch:
//
//  1. an alive gossip member missing from the table, not alive there, with
//     other addresses or with another incarnation nonce is put alive. A new
//     nonce is a restart, whether or not the old process was marked failed
//     first (a quick restart may beat failure detection): the FSM makes it
//     a new incarnation. Gossip that carries one of the node's past nonces
//     is stale (this leader's gossip has not caught up) and is ignored;
//  2. an alive table member that gossip reports dead is marked failed, one
//     that left is marked left, and one gossip has not known for ReapAfter
//     is marked failed. A verdict about a past incarnation counts as no
//     news; one about an incarnation newer than the table's applies to the
//     table's too (its process is gone);
//  3. Raft: servers of failed or left members are removed; alive members
//     missing from Raft are added, as voters while fewer than MaxVoters,
//     as non-voters beyond; non-voters are promoted when voters are missing.
func (d *Directory) reconcile() {
	d.reconcileMu.Lock()
	defer d.reconcileMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.Timing.RPCTimeout)
	defer cancel()
	go func() {
		select {
		case <-d.closeCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	d.gossip.drain()
	gs := d.gossip.snapshot()
	self := d.gossip.meta.Load()
	gs[self.ID] = gossipEntry{meta: *self, state: gossipAlive}

	for _, id := range sortedKeys(gs) {
		e := gs[id]
		if e.state != gossipAlive {
			continue
		}
		want := e.meta.member()
		m, ok := d.View().Member(id)
		if ok && m.State == StateAlive && m.sameAddrs(want) && m.Nonce == want.Nonce {
			continue
		}
		if ok && slices.Contains(m.PastNonces, want.Nonce) {
			continue // stale gossip about an earlier incarnation
		}
		if ok && (m.State == StateLeft || m.State == StateFailed) && m.Nonce == want.Nonce {
			// A departed incarnation (removed, or declared failed) never
			// comes back: its process learns it from a lease refusal and
			// starts a new incarnation (or stops, when removed).
			continue
		}
		if d.noProto[id] == want.Nonce {
			continue // refused for want of protocol ids; said once
		}
		if err := d.provePeer(ctx, want); err != nil {
			// Gossip's key authenticates the group, not the node: with
			// TLS, a node is recorded only once its certificate names it.
			// A node just started may not serve its RPC yet: said after
			// a while, once per incarnation.
			u := d.unproven[id]
			if u.nonce != want.Nonce {
				u = unproven{nonce: want.Nonce, since: time.Now()}
			}
			if !u.said && time.Since(u.since) >= unprovenSaidAfter {
				u.said = true
				d.log.Warn("directory: gossip member not recorded: its directory RPC did not prove the node id with a certificate of the cluster CA", "member", id.String(), "addr", want.RPCAddr, "err", err)
			}
			d.unproven[id] = u
			continue
		}
		delete(d.unproven, id)
		if ok && m.Nonce != 0 && m.Nonce != want.Nonce && m.State != StateLeft {
			// A restart: the old incarnation departs in the put's epoch,
			// so its leases must be over first.
			if err := d.fence(ctx, id, m.Nonce); err != nil {
				d.log.Warn("directory: reconcile: fence the previous incarnation of a restarted member", "member", id.String(), "err", err)
				return
			}
		}
		res, err := d.applyLocal(ctx, encodeCommand(command{Type: cmdPutMember, Member: &want, KeepDescriptors: true}))
		if err != nil {
			d.log.Warn("directory: reconcile put member", "member", id.String(), "err", err)
			return
		}
		if res.Err != nil {
			if errors.Is(res.Err, ErrNoProtoIDs) {
				d.noProto[id] = want.Nonce
			}
			d.log.Warn("directory: reconcile put member refused", "member", id.String(), "err", res.Err)
			continue
		}
		if now, _ := d.View().Member(id); ok && now.Incarnation != m.Incarnation {
			d.log.Info("directory: member restarted", "member", id.String(), "incarnation", now.Incarnation,
				"proto", now.Proto.String(), "old_proto", m.Proto.String(), "epoch", d.Epoch().String())
		} else {
			d.log.Info("directory: member alive", "member", id.String(), "incarnation", now.Incarnation, "epoch", d.Epoch().String())
		}
	}

	now := time.Now()
	// Only members in the Raft configuration know the voters to ask for a
	// lease; the others are not judged by it (they are added at once, or
	// as voters within a fence wait).
	inRaft := map[ids.NodeID]bool{}
	if f := d.raft.GetConfiguration(); f.Error() == nil {
		for _, s := range f.Configuration().Servers {
			if id, ok := parseServerID(s.ID); ok {
				inRaft[id] = true
			}
		}
	}
	for _, m := range d.View().members {
		if m.State != StateAlive {
			delete(d.absentSince, m.ID)
			continue
		}
		e, known := gs[m.ID]
		if known && m.Nonce != 0 && e.meta.Nonce != m.Nonce && slices.Contains(m.PastNonces, e.meta.Nonce) {
			// Gossip's latest word is about an earlier incarnation: this
			// one has not been heard of yet.
			known = false
		}
		var to MemberState
		expired := m.ID != d.cfg.NodeID && m.Nonce != 0 && inRaft[m.ID] && d.grants.expired(leaseClock(), m.ID, m.Nonce, m.LastFailedAt)
		switch {
		case known && e.state == gossipAlive && expired:
			// Gossip reaches it, the lease requests do not (a partition
			// of the directory's ports, a stuck dsmd): its pages cannot
			// wait on it.
			delete(d.absentSince, m.ID)
			d.log.Warn("directory: lease expired: no grant asked for by a member gossip holds alive", "member", m.ID.String(),
				"expiry", d.leaseParams().expiry().String(), "first_expiry", d.leaseParams().firstExpiry().String())
			to = StateFailed
		case known && e.state == gossipAlive:
			delete(d.absentSince, m.ID)
			continue
		case known && e.state == gossipLeft:
			to = StateLeft
		case known && e.state == gossipDead:
			to = StateFailed
		default:
			since, ok := d.absentSince[m.ID]
			if !ok {
				d.absentSince[m.ID] = now
				continue
			}
			if now.Sub(since) < d.cfg.Timing.ReapAfter {
				continue
			}
			to = StateFailed
		}
		if err := d.removeMember(ctx, m.ID, m.Nonce, to); errors.Is(err, ErrStaleIncarnation) {
			d.log.Info("directory: verdict about a replaced incarnation ignored", "member", m.ID.String(), "err", err)
			continue
		} else if err != nil {
			d.log.Warn("directory: reconcile remove member", "member", m.ID.String(), "err", err)
			return
		}
		d.log.Info("directory: member "+to.String(), "member", m.ID.String(), "epoch", d.Epoch().String())
	}
	d.reconcileRaft(ctx)
}

// removeMember marks a member left or failed (new epoch), once a majority
// of the voters fenced its incarnation (its leases are over). A member that
// left also leaves the Raft configuration (unless it is this node and the
// last voter); a failed one stays a voter until reconcileRaft can put an
// alive member in its place (see there). A non-zero nonce limits the
// change to that incarnation: if another one holds the node id by the time
// the command applies, nothing changes and the error is
// ErrStaleIncarnation.
func (d *Directory) removeMember(ctx context.Context, id ids.NodeID, nonce uint64, st MemberState) error {
	fenceNonce := nonce
	if m, ok := d.View().Member(id); ok && fenceNonce == 0 {
		fenceNonce = m.Nonce
	}
	if fenceNonce != 0 {
		if err := d.fence(ctx, id, fenceNonce); err != nil {
			return err
		}
	}
	res, err := d.applyLocal(ctx, encodeCommand(command{Type: cmdSetMemberState, ID: id, State: st, Nonce: nonce}))
	if err != nil {
		return err
	}
	if errors.Is(res.Err, ErrStaleIncarnation) {
		return res.Err // another incarnation holds the id: it stays, in Raft too
	}
	if st != StateLeft {
		return nil
	}
	f := d.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return raftErr(err)
	}
	voters := 0
	present := false
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters++
		}
		if s.ID == serverID(id) {
			present = true
		}
	}
	if !present || (id == d.cfg.NodeID && voters <= 1) {
		return nil
	}
	return raftErr(d.raft.RemoveServer(serverID(id), 0, timeoutOf(ctx)).Error())
}

// reconcileRaft brings the Raft configuration in line with the member
// table:
//
//   - servers of members that left (gracefully, or removed by an operator)
//     and failed non-voters are removed;
//   - a failed voter stays a voter while no alive member can take its
//     place. Taking it out would shrink the quorum that the next fault
//     needs without tolerating one more: three voters with one dead
//     survive no further fault, and neither do two; but the dead one, if
//     it was only cut off or paused, counts again the moment it is back,
//     while a removed one has to be added back by a leader, and after a
//     second fault there may be none (two voters cut apart elect nobody,
//     for good). An operator takes a machine that is gone for good out
//     with `dsmctl members remove`;
//   - alive members missing from Raft are added, as voters while fewer
//     than MaxVoters, as non-voters beyond; while a voter is failed, an
//     alive non-voter (or a newcomer) is promoted first and the failed
//     voter removed after, so the number of voters never drops.
//
// The voters change at most once per lease fence wait, counted from the
// commit of the last change and from gaining leadership, so that a lease
// still running was granted under the current voters or the ones just
// before (lease.go).
func (d *Directory) reconcileRaft(ctx context.Context) {
	f := d.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	servers := map[raft.ServerID]raft.Server{}
	voters := 0
	for _, s := range f.Configuration().Servers {
		servers[s.ID] = s
		if s.Suffrage == raft.Voter {
			voters++
		}
	}
	v := d.View()
	// One change of the voters per fence wait (lease.go): a lease granted
	// under the configuration before the last change is over by the next.
	voterChangeDue := func() bool {
		return leaseClock()-time.Duration(d.lastVoterChange.Load()) >= d.leaseParams().fenceWait()
	}
	voterChanged := func() { d.lastVoterChange.Store(int64(leaseClock())) }
	remove := func(sid raft.ServerID, id ids.NodeID, why string) bool {
		if servers[sid].Suffrage == raft.Voter && !voterChangeDue() {
			return false
		}
		if err := raftErr(d.raft.RemoveServer(sid, 0, timeoutOf(ctx)).Error()); err != nil {
			d.log.Warn("directory: remove raft server", "member", id.String(), "err", err)
			return false
		}
		if servers[sid].Suffrage == raft.Voter {
			voterChanged()
			voters--
		}
		delete(servers, sid)
		d.log.Info("directory: removed from raft", "member", id.String(), "why", why)
		return true
	}
	// failedVoters are the voters whose member failed, in the order of
	// their server ids: the first is replaced first.
	var failedVoters []ids.NodeID
	for _, sid := range slices.Sorted(maps.Keys(servers)) {
		id, ok := parseServerID(sid)
		if !ok || id == d.cfg.NodeID {
			continue
		}
		m, ok := v.Member(id)
		switch {
		case ok && m.State == StateLeft:
			if !remove(sid, id, "left") {
				return
			}
		case ok && m.State == StateFailed && servers[sid].Suffrage != raft.Voter:
			if !remove(sid, id, "failed non-voter") {
				return
			}
		case ok && m.State == StateFailed:
			failedVoters = append(failedVoters, id)
		}
	}
	// A failed voter whose replacement was promoted in an earlier pass.
	for voters > d.cfg.MaxVoters && len(failedVoters) > 0 {
		id := failedVoters[0]
		if !voterChangeDue() || !remove(serverID(id), id, "failed voter replaced") {
			return
		}
		failedVoters = failedVoters[1:]
	}
	// Add missing alive members; promote non-voters while voters are
	// short or failed.
	for _, m := range v.members {
		if m.State != StateAlive || m.RaftAddr == "" {
			continue
		}
		sid := serverID(m.ID)
		s, present := servers[sid]
		addr := raft.ServerAddress(m.RaftAddr)
		var fut raft.IndexFuture
		var replaces ids.NodeID
		suffrage := raft.Voter
		switch {
		case present && s.Address == addr && s.Suffrage == raft.Voter:
			continue
		case present && s.Suffrage == raft.Voter:
			fut = d.raft.AddVoter(sid, addr, 0, timeoutOf(ctx)) // address change
		case (voters < d.cfg.MaxVoters || len(failedVoters) > 0) && !voterChangeDue():
			return // a new voter, later
		case voters < d.cfg.MaxVoters:
			fut = d.raft.AddVoter(sid, addr, 0, timeoutOf(ctx))
			voters++
			voterChanged()
		case len(failedVoters) > 0:
			fut = d.raft.AddVoter(sid, addr, 0, timeoutOf(ctx))
			voters++
			voterChanged()
			replaces, failedVoters = failedVoters[0], failedVoters[1:]
		case present && s.Address == addr:
			continue
		default:
			fut = d.raft.AddNonvoter(sid, addr, 0, timeoutOf(ctx))
			suffrage = raft.Nonvoter
		}
		if err := raftErr(fut.Error()); err != nil {
			d.log.Warn("directory: add raft server", "member", m.ID.String(), "err", err)
			return
		}
		if suffrage == raft.Voter && !(present && s.Suffrage == raft.Voter) {
			voterChanged() // counted from the commit
		}
		servers[sid] = raft.Server{ID: sid, Address: addr, Suffrage: suffrage}
		d.log.Info("directory: raft configuration changed", "member", m.ID.String(), "voters", voters)
		if replaces != ids.None {
			return // the failed voter leaves at a later pass, a fence wait after this change
		}
	}
}

func sortedKeys[V any](m map[ids.NodeID]V) []ids.NodeID {
	out := make([]ids.NodeID, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// unproven is a gossip member whose certificate has not proven its node id
// yet (TLS): since when, for which incarnation, and whether it was said.
type unproven struct {
	nonce uint64
	since time.Time
	said  bool
}

// unprovenSaidAfter is how long a member may stay unproven before the
// leader logs it.
const unprovenSaidAfter = 10 * time.Second

// provePeer, with TLS on, dials m's directory RPC and asks for its status:
// the handshake succeeds only if its certificate, of the cluster CA, names
// m's node id. Without TLS, or for this node itself, there is nothing to
// prove.
func (d *Directory) provePeer(ctx context.Context, m Member) error {
	if d.cfg.TLS == nil || m.ID == d.cfg.NodeID {
		return nil
	}
	if m.RPCAddr == "" {
		return errors.New("no directory RPC address in its gossip metadata")
	}
	cctx, cancel := context.WithTimeout(ctx, d.cfg.Timing.RPCTimeout)
	defer cancel()
	_, err := callRPC(cctx, m.RPCAddr, d.cfg.TLS.ClientConfig(tlsconf.Node(m.ID)), rpcRequest{Op: opStatus})
	return err
}
