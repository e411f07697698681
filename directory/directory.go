package directory

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"

	"github.com/dsmkit/dsm/directory/internal/raftstore"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/tlsconf"
)

// Directory is one replica of the cluster directory. Create it with Open;
// every method is safe for concurrent use.
type Directory struct {
	cfg Config
	log *slog.Logger

	store  *raftstore.Store
	logs   *raft.LogCache
	snaps  *raft.FileSnapshotStore
	trans  *patientTransport
	raft   *raft.Raft
	fsm    *fsm
	notify *notifier
	gossip *gossip
	// gossipRef is gossip for the TLS checks, which may run before Open
	// sets gossip.
	gossipRef atomic.Pointer[gossip]
	ml        *memberlist.Memberlist
	keys      *keyrings
	rpc       *rpcServer

	// grants is this replica's side of the leases as a voter, lease its
	// own lease (lease.go).
	grants *grantTable
	lease  *leaseHolder
	// lastVoterChange is when this leader last changed the Raft voters,
	// or became leader (on the lease clock): it makes no voter change
	// within the fence wait of the last (reconcileRaft).
	lastVoterChange atomic.Int64
	// confCache is the Raft configuration as leases last read it.
	confCache atomic.Pointer[raftConfig]

	gossipAddr string // bound gossip address

	// joined is set once a join of Config.Join (or saved peers) succeeded.
	// Bootstrap waits for it, so that a node sent to join an existing
	// cluster sees that cluster's state before it counts servers.
	joined atomic.Bool

	closeCh   chan struct{}
	closeOnce sync.Once
	closeErr  error
	wg        sync.WaitGroup

	// reconcileMu serializes the leader's member-table changes: the
	// reconciliation pass and graceful leaves.
	reconcileMu sync.Mutex

	// Owned by the run loop.
	bootstrapped bool
	absentSince  map[ids.NodeID]time.Time
	noProto      map[ids.NodeID]uint64   // nonce refused for want of protocol ids, by node
	unproven     map[ids.NodeID]unproven // gossip members whose certificate has not proven their id (TLS)
	savedPeers   []string
	join         []string // Config.Join plus the saved peers
}

// Addrs are the addresses a directory actually bound.
type Addrs struct {
	Gossip, Raft, RPC string
}

// Open starts a replica: opens (or creates) its Raft state in DataDir,
// starts Raft, the forwarding RPC and gossip, and joins the cluster in the
// background. It returns before the cluster has a leader.
func Open(cfg Config) (_ *Directory, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	d := &Directory{
		cfg: cfg, log: cfg.Logger.With("node", cfg.NodeID.String()),
		closeCh: make(chan struct{}), absentSince: map[ids.NodeID]time.Time{}, noProto: map[ids.NodeID]uint64{}, unproven: map[ids.NodeID]unproven{},
	}
	d.grants = newGrantTable(d.leaseParams(), leaseClock())
	d.lease = newLeaseHolder(d.leaseParams())
	var closers []func()
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}
	}()
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("directory: data dir: %w", err)
	}
	d.store, err = raftstore.Open(filepath.Join(cfg.DataDir, "raft"), raftstore.Options{Logger: d.log, Reserve: cfg.DiskReserve})
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { d.store.Close() })
	d.logs, err = raft.NewLogCache(512, d.store)
	if err != nil {
		return nil, fmt.Errorf("directory: log cache: %w", err)
	}
	d.snaps, err = raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, 2, hclogFor(d.log, "raft-snapshot"))
	if err != nil {
		return nil, fmt.Errorf("directory: snapshot store: %w", err)
	}
	var stream *tlsStream
	var trans *raft.NetworkTransport
	if cfg.TLS != nil {
		stream, err = newTLSStream(cfg.RaftAddr, cfg.TLS, d.knownNode)
		if err == nil {
			trans = raft.NewNetworkTransportWithLogger(stream, 3, 2*time.Second, hclogFor(d.log, "raft-net"))
		}
	} else {
		trans, err = raft.NewTCPTransportWithLogger(cfg.RaftAddr, nil, 3, 2*time.Second, hclogFor(d.log, "raft-net"))
	}
	if err != nil {
		return nil, fmt.Errorf("directory: raft transport %s: %w", cfg.RaftAddr, err)
	}
	d.trans = newPatientTransport(trans, cfg.Timing.RaftAppendPatience, d.log)
	closers = append(closers, func() { d.trans.Close() })
	hasState, err := raft.HasExistingState(d.logs, d.store, d.snaps)
	if err != nil {
		return nil, fmt.Errorf("directory: raft state: %w", err)
	}
	d.notify = newNotifier()
	d.fsm = newFSM(d.notify)
	closers = append(closers, d.notify.close)

	t := cfg.Timing
	rc := raft.DefaultConfig()
	rc.LocalID = serverID(cfg.NodeID)
	rc.HeartbeatTimeout = t.RaftHeartbeat
	rc.ElectionTimeout = t.RaftElection
	rc.LeaderLeaseTimeout = t.RaftLeaderLease
	rc.CommitTimeout = t.RaftCommit
	rc.SnapshotInterval = t.SnapshotInterval
	rc.SnapshotThreshold = t.SnapshotThreshold
	rc.TrailingLogs = t.TrailingLogs
	rc.ShutdownOnRemove = false // a removed member may come back and be re-added
	rc.Logger = hclogFor(d.log, "raft")
	d.raft, err = raft.NewRaft(rc, d.fsm, d.logs, d.store, d.snaps, d.trans)
	if err != nil {
		return nil, fmt.Errorf("directory: raft: %w", err)
	}
	closers = append(closers, func() { d.trans.stop(); _ = d.raft.Shutdown().Error() })
	d.bootstrapped = hasState

	var rpcTLS *tls.Config
	if cfg.TLS != nil {
		rpcTLS = cfg.TLS.ServerConfig(d.knownNode)
	}
	d.rpc, err = newRPCServer(cfg.RPCAddr, rpcTLS, d.handleRPC, t.RPCTimeout, d.log)
	if err != nil {
		return nil, err
	}
	closers = append(closers, d.rpc.close)

	d.gossip = newGossip(nodeMeta{
		ID: cfg.NodeID, GRPCAddr: cfg.GRPCAddr, VerbsAddr: cfg.VerbsAddr,
		RaftAddr: string(d.trans.LocalAddr()), RPCAddr: d.rpc.addr(),
		Expect: cfg.BootstrapExpect, HasState: hasState, Nonce: cfg.Nonce,
	}, d.log)
	d.gossipRef.Store(d.gossip)
	if stream != nil {
		f := d.nodeAtRaftAddr
		stream.nodeAt.Store(&f)
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name = nodeName(cfg.NodeID)
	host, port, _ := net.SplitHostPort(cfg.GossipAddr)
	mc.BindAddr, mc.AdvertiseAddr = host, host
	mc.BindPort, _ = strconv.Atoi(port)
	mc.AdvertisePort = mc.BindPort
	mc.ProbeInterval = t.GossipProbeInterval
	mc.ProbeTimeout = t.GossipProbeTimeout
	mc.GossipInterval = t.GossipInterval
	mc.SuspicionMult = t.GossipSuspicionMult
	mc.SuspicionMaxTimeoutMult = t.GossipSuspicionMaxMult
	mc.PushPullInterval = 10 * time.Second
	mc.TCPTimeout = 2 * time.Second
	mc.DeadNodeReclaimTime = time.Second
	mc.Delegate = d.gossip
	mc.Events = d.gossip
	mc.Ping = d.gossip
	mc.Logger = log.New(slogWriter{l: d.log, component: "memberlist"}, "", 0)
	kr, kept, err := openKeyring(cfg.DataDir, cfg.GossipKeys)
	if err != nil {
		return nil, err
	}
	if kept && len(cfg.GossipKeys) > 0 && !slices.ContainsFunc(kr.GetKeys(), func(k []byte) bool { return bytes.Equal(k, cfg.GossipKeys[0]) }) {
		d.log.Warn("directory: the gossip key given is not in the keyring kept in the data directory, which is used: remove " +
			filepath.Join(cfg.DataDir, KeyringFile) + " to start from the key given")
	}
	mc.Keyring = kr // nil: gossip is not encrypted
	mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	d.keys = &keyrings{kr: kr, dir: cfg.DataDir}
	d.gossip.onMsg = d.onUserMsg
	d.ml, err = memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("directory: gossip %s: %w", cfg.GossipAddr, err)
	}
	// memberlist wrote the port it bound (for port 0) back into mc.
	d.gossipAddr = net.JoinHostPort(mc.AdvertiseAddr, strconv.Itoa(mc.AdvertisePort))

	d.join = slices.Clone(cfg.Join)
	self := d.Addrs().Gossip
	for _, a := range loadPeers(cfg.DataDir) {
		if a != self && !slices.Contains(d.join, a) {
			d.join = append(d.join, a)
		}
	}
	d.wg.Add(3)
	go d.run()
	go d.reconnectLoop()
	go d.leaseLoop()
	if len(d.join) > 0 {
		d.wg.Add(1)
		go d.joinLoop()
	}
	return d, nil
}

func serverID(id ids.NodeID) raft.ServerID { return raft.ServerID(nodeName(id)) }

func parseServerID(s raft.ServerID) (ids.NodeID, bool) {
	n, err := strconv.ParseUint(string(s), 10, 32)
	return ids.NodeID(n), err == nil && n != 0
}

// NodeID is this replica's node id.
func (d *Directory) NodeID() ids.NodeID { return d.cfg.NodeID }

// Nonce is this process's incarnation nonce (Config.Nonce, or the one the
// directory drew). The member record with this nonce is this process's
// incarnation.
func (d *Directory) Nonce() uint64 { return d.cfg.Nonce }

// Addrs reports the bound addresses (useful with port 0).
func (d *Directory) Addrs() Addrs {
	return Addrs{Gossip: d.gossipAddr, Raft: string(d.trans.LocalAddr()), RPC: d.rpc.addr()}
}

func (d *Directory) joinLoop() {
	defer d.wg.Done()
	delay := 100 * time.Millisecond
	for {
		n, err := d.ml.Join(d.join)
		if n > 0 {
			d.joined.Store(true)
			select {
			case d.gossip.signal <- struct{}{}:
			default:
			}
			return
		}
		d.log.Info("directory: join failed, retrying", "join", d.join, "err", err)
		select {
		case <-d.closeCh:
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// Close stops the replica without telling anyone: peers see it fail. Its
// state stays in DataDir for a restart. Use Leave to go away gracefully.
func (d *Directory) Close() error {
	d.closeOnce.Do(func() {
		close(d.closeCh)
		d.trans.stop() // no AppendEntries retry holds Raft's Shutdown
		errs := []error{}
		if err := d.raft.Shutdown().Error(); err != nil {
			errs = append(errs, fmt.Errorf("raft shutdown: %w", err))
		}
		d.wg.Wait()
		d.rpc.close()
		if err := d.ml.Shutdown(); err != nil {
			errs = append(errs, fmt.Errorf("gossip shutdown: %w", err))
		}
		d.keys.close()
		// Close also the pooled outbound connections, so that peers'
		// handlers of them end.
		d.trans.CloseStreams()
		if err := d.trans.Close(); err != nil {
			errs = append(errs, fmt.Errorf("raft transport: %w", err))
		}
		if err := d.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("store: %w", err))
		}
		d.notify.close()
		d.closeErr = errors.Join(errs...)
	})
	return d.closeErr
}

func (d *Directory) closed() bool {
	select {
	case <-d.closeCh:
		return true
	default:
		return false
	}
}

// View returns the local, possibly stale, replica of the directory.
func (d *Directory) View() *View {
	v, _ := d.fsm.current()
	return v
}

// Epoch is the local replica's epoch.
func (d *Directory) Epoch() ids.Epoch { return d.View().Epoch }

// Regions returns the local replica's region table.
func (d *Directory) Regions() []Region { return d.View().Regions() }

// Region looks a region up by name in the local replica.
func (d *Directory) Region(name string) (Region, bool) { return d.View().Region(name) }

// Members returns the local replica's member table.
func (d *Directory) Members() []Member { return d.View().Members() }

// Placement returns the home and backups of page p of region r in the local
// replica.
func (d *Directory) Placement(r ids.RegionID, p ids.PageNo) (Placement, error) {
	return d.View().Placement(r, p)
}

// Subscribe returns a channel of changes to the local replica, starting with
// the current view, and a cancel function. The channel is closed by cancel
// or Close. Changes coalesce when the reader is slow; the directory never
// waits for a reader.
func (d *Directory) Subscribe() (<-chan Change, func()) {
	return d.notify.subscribe(d.View())
}

// CreateRegion creates a region, or returns the existing one with the same
// name and the same (normalized) spec. It fails with ErrRegionExists if the
// name is taken with another spec, and with a *SpecError (ErrInvalidRegion)
// on bad input. It retries through leader changes until ctx ends, and
// returns once the region is in the local replica.
func (d *Directory) CreateRegion(ctx context.Context, spec RegionSpec) (Region, error) {
	r, _, err := d.EnsureRegion(ctx, spec)
	return r, err
}

// EnsureRegion is CreateRegion that also reports whether this call created
// the region (false: it existed with the same spec). Beyond the spec's own
// limits, a region is refused with ErrNoSpace when the regions' sizes would
// add up to more than MaxTotalSize.
func (d *Directory) EnsureRegion(ctx context.Context, spec RegionSpec) (r Region, created bool, err error) {
	spec, err = spec.Normalize()
	if err != nil {
		return Region{}, false, err
	}
	res, err := d.apply(ctx, encodeCommand(createRegionCmd(spec, d.cfg.Now())))
	if err != nil {
		return Region{}, false, err
	}
	return res.Region, res.Created, res.Err
}

// DeleteRegion deletes a region by name; deleting a missing region succeeds.
func (d *Directory) DeleteRegion(ctx context.Context, name string) error {
	if err := validName(name); err != nil {
		return err
	}
	res, err := d.apply(ctx, encodeCommand(command{Type: cmdDeleteRegion, Name: name}))
	if err != nil {
		return err
	}
	return res.Err
}

// SetLocalMeta publishes this node's registered-memory descriptors (opaque
// bytes, at most 64 KiB) in the member table, in a new epoch.
func (d *Directory) SetLocalMeta(ctx context.Context, descriptors []byte) error {
	m := d.gossip.meta.Load().member()
	m.Descriptors = slices.Clone(descriptors)
	if err := m.validate(); err != nil {
		return err
	}
	res, err := d.apply(ctx, encodeCommand(command{Type: cmdPutMember, Member: &m}))
	if err != nil {
		return err
	}
	return res.Err
}

// SetDraining records that this incarnation is leaving gracefully, in an
// epoch of its own (Member.DrainingAt): it stays alive, and status shows
// it draining until it has left, but the data plane hands its shards to
// other members and places no new backup copy at it. The node calls it
// when a graceful leave begins, before it writes back what its clients
// wrote. Retrying it is harmless.
func (d *Directory) SetDraining(ctx context.Context) error {
	res, err := d.apply(ctx, encodeCommand(command{Type: cmdSetDraining, ID: d.cfg.NodeID, Nonce: d.cfg.Nonce, HandOver: true}))
	if err != nil {
		return err
	}
	return res.Err
}

// RecordFilled records that incarnation nonce of node holds a complete
// copy of region's shards in shards (sorted, apart): the shards' home
// filled it as a backup in the views from epoch since on. It is refused
// (ErrStaleIncarnation, ErrInvalidMember) when that incarnation is no
// longer the node's, is not alive, or was declared failed after since:
// its copy may have missed releases. Retrying a record is harmless.
func (d *Directory) RecordFilled(ctx context.Context, region ids.RegionID, node ids.NodeID, nonce uint64, since ids.Epoch, shards []ShardRange) error {
	res, err := d.apply(ctx, encodeCommand(command{Type: cmdFilled, Region: region, ID: node, Nonce: nonce, Since: since, Shards: shards}))
	if err != nil {
		return err
	}
	return res.Err
}

// Promote records the promotion of incarnation nonce of node for region's
// shards in shards (sorted, apart): every one must be covered by a fill
// record of that incarnation (RecordFilled), or held by it since the
// region's creation (one of its first 1+Backups homes for the shard). It
// is refused (ErrNoRegion, ErrStaleIncarnation, ErrInvalidMember) when the
// region is gone, the incarnation is no longer the node's, is not alive or
// is draining, or a shard is neither. It moves the epoch; retrying a promotion that was
// committed is harmless.
func (d *Directory) Promote(ctx context.Context, region ids.RegionID, node ids.NodeID, nonce uint64, shards []ShardRange) error {
	res, err := d.apply(ctx, encodeCommand(command{Type: cmdPromote, Region: region, ID: node, Nonce: nonce, Shards: shards}))
	if err != nil {
		return err
	}
	return res.Err
}

// RecordCheckpoint commits a placement checkpoint of region
// (placement.Checkpoint, encoded, at most 384 KiB): the placement of every
// shard after every event up to its epoch, which must lie between the
// region's creation and the current epoch and after the region's current
// checkpoint (ErrStaleCheckpoint otherwise). It drops the records that a
// walk from it does not read (Region.Checkpoint) and does not move the
// epoch; retrying one that was committed is harmless.
func (d *Directory) RecordCheckpoint(ctx context.Context, region ids.RegionID, checkpoint []byte) error {
	if len(checkpoint) > MaxCheckpointSize {
		return fmt.Errorf("%w: a checkpoint of %d bytes, more than %d", ErrBadCommand, len(checkpoint), MaxCheckpointSize)
	}
	res, err := d.apply(ctx, encodeCommand(command{Type: cmdCheckpoint, Region: region, Checkpoint: checkpoint}))
	if err != nil {
		return err
	}
	return res.Err
}

// LinearizableView returns a view that includes every change committed
// before the call: the leader confirms its leadership with a barrier and a
// heartbeat round, and this replica waits until it has applied as much.
func (d *Directory) LinearizableView(ctx context.Context) (*View, error) {
	var idx uint64
	err := d.retry(ctx, func(ctx context.Context) (bool, error) {
		if d.raft.State() == raft.Leader {
			i, err := d.readIndex(ctx)
			idx = i
			return retryable(err), err
		}
		resp, err := d.callLeader(ctx, rpcRequest{Op: opReadIndex})
		idx = resp.Index
		return retryable(err), err
	})
	if err != nil {
		return nil, err
	}
	return d.waitApplied(ctx, idx)
}

// readIndex runs on the leader: after the barrier every committed command is
// applied here, and VerifyLeader proves no newer leader exists.
func (d *Directory) readIndex(ctx context.Context) (uint64, error) {
	if err := raftErr(d.raft.Barrier(timeoutOf(ctx)).Error()); err != nil {
		return 0, err
	}
	if err := raftErr(d.raft.VerifyLeader().Error()); err != nil {
		return 0, err
	}
	return d.View().Index, nil
}

func (d *Directory) waitApplied(ctx context.Context, idx uint64) (*View, error) {
	for {
		v, ch := d.fsm.current()
		if v.Index >= idx {
			return v, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-d.closeCh:
			return nil, ErrClosed
		}
	}
}

func timeoutOf(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(time.Until(dl), time.Millisecond)
	}
	return 0
}

// raftErr maps raft's leadership errors onto ours.
func raftErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrEnqueueTimeout):
		return fmt.Errorf("%w: %v", ErrNotLeader, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrClosed
	}
	return err
}

func retryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrNotLeader) || errors.Is(err, ErrNoLeader) {
		return true
	}
	var ne net.Error
	var oe *net.OpError
	return errors.As(err, &ne) || errors.As(err, &oe)
}

// retry runs fn until it succeeds, fails for good, or ctx ends.
func (d *Directory) retry(ctx context.Context, fn func(context.Context) (bool, error)) error {
	delay := 10 * time.Millisecond
	for {
		if d.closed() {
			return ErrClosed
		}
		again, err := fn(ctx)
		if !again {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %v (last: %v)", ErrNoLeader, ctx.Err(), err)
		case <-d.closeCh:
			return ErrClosed
		case <-time.After(delay):
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// apply commits an encoded command through the leader, forwarding it when
// this replica is a follower, and waits until the local replica has applied
// it. Commands are idempotent, so a retry after an unknown outcome is safe.
func (d *Directory) apply(ctx context.Context, cmd []byte) (applyResult, error) {
	var res applyResult
	err := d.retry(ctx, func(ctx context.Context) (bool, error) {
		var err error
		if d.raft.State() == raft.Leader {
			res, err = d.applyLocal(ctx, cmd)
			return retryable(err), err
		}
		resp, err := d.callLeader(ctx, rpcRequest{Op: opApply, Cmd: cmd})
		if err != nil {
			return retryable(err), err
		}
		res = applyResult{Index: resp.Index, Epoch: resp.Epoch, Created: resp.Created, Err: fromWire(resp.Err)}
		if resp.Region != nil {
			res.Region = *resp.Region
		}
		return retryable(res.Err), nil
	})
	if err != nil {
		return applyResult{}, err
	}
	if res.Err != nil {
		return res, nil
	}
	if _, err := d.waitApplied(ctx, res.Index); err != nil {
		return applyResult{}, err
	}
	return res, nil
}

func (d *Directory) applyLocal(ctx context.Context, cmd []byte) (applyResult, error) {
	f := d.raft.Apply(cmd, timeoutOf(ctx))
	if err := raftErr(f.Error()); err != nil {
		return applyResult{}, err
	}
	d.announceCommit()
	res, ok := f.Response().(applyResult)
	if !ok {
		return applyResult{}, fmt.Errorf("directory: unexpected apply response %T", f.Response())
	}
	return res, nil
}

// announceCommit makes the leader tell the followers now that the command
// it has just applied is committed, instead of at its next idle append
// (Timing.RaftCommit, long so that an idle leader sleeps): hashicorp/raft
// sends the commit index only with an AppendEntries, and sends one at once
// only for a new log entry. The entry is a barrier, which no FSM sees; the
// AppendEntries that carries it carries a commit index that covers the
// command, so a follower waiting in apply or waitApplied wakes about one
// round trip later. The barrier's own commit travels with the next append.
// Nothing waits for it: a leader that lost its place fails it, harmlessly.
func (d *Directory) announceCommit() {
	_ = d.raft.Barrier(d.cfg.Timing.RPCTimeout)
}

// callLeader sends req to the current leader's forwarding port.
func (d *Directory) callLeader(ctx context.Context, req rpcRequest) (rpcResponse, error) {
	_, lid := d.raft.LeaderWithID()
	id, ok := parseServerID(lid)
	if !ok {
		return rpcResponse{}, ErrNoLeader
	}
	addr := ""
	if m, ok := d.View().Member(id); ok {
		addr = m.RPCAddr
	}
	if e, ok := d.gossip.lookup(id); ok && e.state == gossipAlive {
		addr = e.meta.RPCAddr
	}
	if addr == "" {
		return rpcResponse{}, fmt.Errorf("%w: address of leader %v unknown", ErrNoLeader, id)
	}
	cctx, cancel := context.WithTimeout(ctx, d.cfg.Timing.RPCTimeout)
	defer cancel()
	var cl *tls.Config
	if d.cfg.TLS != nil {
		cl = d.cfg.TLS.ClientConfig(tlsconf.Node(id))
	}
	resp, err := callRPC(cctx, addr, cl, req)
	if err != nil {
		if ctx.Err() == nil {
			// The leader may have died or moved; try again.
			return rpcResponse{}, fmt.Errorf("%w: leader %v at %s: %v", ErrNoLeader, id, addr, err)
		}
		return rpcResponse{}, err
	}
	if req.Op != opApply && resp.Err != nil {
		return resp, fromWire(resp.Err)
	}
	return resp, nil
}

// handleRPC serves one forwarded request.
func (d *Directory) handleRPC(ctx context.Context, req rpcRequest) rpcResponse {
	switch req.Op {
	case opApply:
		if d.raft.State() != raft.Leader {
			return rpcResponse{Err: toWire(ErrNotLeader)}
		}
		if _, err := decodeCommand(req.Cmd); err != nil {
			return rpcResponse{Err: toWire(err)}
		}
		res, err := d.applyLocal(ctx, req.Cmd)
		if err != nil {
			return rpcResponse{Err: toWire(err)}
		}
		resp := rpcResponse{Index: res.Index, Epoch: res.Epoch, Created: res.Created, Err: toWire(res.Err)}
		if res.Region.ID != 0 {
			r := res.Region
			resp.Region = &r
		}
		return resp
	case opReadIndex:
		if d.raft.State() != raft.Leader {
			return rpcResponse{Err: toWire(ErrNotLeader)}
		}
		idx, err := d.readIndex(ctx)
		return rpcResponse{Index: idx, Err: toWire(err)}
	case opLeave:
		if d.raft.State() != raft.Leader {
			return rpcResponse{Err: toWire(ErrNotLeader)}
		}
		return rpcResponse{Err: toWire(d.leaveMember(ctx, req.ID))}
	case opRemove:
		if d.raft.State() != raft.Leader {
			return rpcResponse{Err: toWire(ErrNotLeader)}
		}
		err := d.removeFailed(ctx, req.ID)
		return rpcResponse{Epoch: d.Epoch(), Err: toWire(err)}
	case opLease:
		return d.handleLease(req)
	case opFence:
		return d.handleFence(ctx, req)
	case opStatus:
		v := d.View()
		st := stateOf(v)
		return rpcResponse{Index: v.Index, Epoch: v.Epoch, Status: &st}
	}
	return rpcResponse{Err: toWire(fmt.Errorf("%w: unknown op %q", ErrBadFrame, req.Op))}
}

// RemoteView reads the local view of the replica whose forwarding RPC
// listens at rpcAddr (for operators and tests: no leader check).
func RemoteView(ctx context.Context, rpcAddr string) (*View, error) {
	return RemoteViewTLS(ctx, rpcAddr, nil)
}

// RemoteViewTLS is RemoteView over TLS with config cfg (a
// tlsconf.Manager's ClientConfig); nil: plain TCP.
func RemoteViewTLS(ctx context.Context, rpcAddr string, cfg *tls.Config) (*View, error) {
	resp, err := callRPC(ctx, rpcAddr, cfg, rpcRequest{Op: opStatus})
	if err != nil {
		return nil, fmt.Errorf("directory: status from %s: %w", rpcAddr, err)
	}
	if err := fromWire(resp.Err); err != nil {
		return nil, err
	}
	if resp.Status == nil {
		return nil, fmt.Errorf("%w: status without state", ErrBadFrame)
	}
	b, err := json.Marshal(resp.Status)
	if err != nil {
		return nil, err
	}
	return decodeSnapshot(b)
}

// Leave takes this node out of the cluster gracefully: it hands off Raft
// leadership, announces its departure in gossip, has the leader mark it left
// and remove it from Raft, then closes.
func (d *Directory) Leave(ctx context.Context) error {
	if d.raft.State() == raft.Leader && len(d.voters()) > 1 {
		if err := d.raft.LeadershipTransfer().Error(); err != nil {
			d.log.Warn("directory: leadership transfer before leave", "err", err)
		}
	}
	if err := d.ml.Leave(time.Second); err != nil {
		d.log.Warn("directory: gossip leave", "err", err)
	}
	err := d.retry(ctx, func(ctx context.Context) (bool, error) {
		if d.leftAlready() {
			// An earlier attempt's departure committed, and its answer
			// was lost (a leader that stepped down while it removed this
			// node from Raft, whose configuration without it may need a
			// voter that is down): the rest is reconcileRaft's.
			return false, nil
		}
		if d.raft.State() == raft.Leader {
			err := d.leaveMember(ctx, d.cfg.NodeID)
			return retryable(err), err
		}
		_, err := d.callLeader(ctx, rpcRequest{Op: opLeave, ID: d.cfg.NodeID})
		return retryable(err), err
	})
	if err != nil && d.leftAlready() {
		err = nil
	}
	return errors.Join(err, d.Close())
}

// leftAlready reports whether this incarnation is marked left in the
// view this replica applied.
func (d *Directory) leftAlready() bool {
	m, ok := d.View().Member(d.cfg.NodeID)
	return errors.Is(departure(m, ok, d.cfg.Nonce), ErrDeparted)
}

// leaveMember runs on the leader for a member that announced its departure:
// it is marked left and removed from Raft. Gossip is told first, so that a
// reconciliation working from older gossip cannot bring it back.
func (d *Directory) leaveMember(ctx context.Context, id ids.NodeID) error {
	if id == ids.None {
		return fmt.Errorf("%w: zero id", ErrInvalidMember)
	}
	d.reconcileMu.Lock()
	defer d.reconcileMu.Unlock()
	d.gossip.mark(id, gossipLeft)
	return d.removeMember(ctx, id, 0, StateLeft)
}

// RemoveMember declares a failed member gone for good: its incarnation
// is marked left (a departure: the data plane moves its homes to their
// backups and repairs the words naming it) and leaves Raft. It is for an
// operator who knows the process is dead; ErrNotFailed refuses a member
// the directory does not hold failed, ErrNoMember an unknown node. A
// removed incarnation never becomes alive again: only a new process
// rejoins. It returns the epoch the member departed in (or the current
// one, if it had departed already).
func (d *Directory) RemoveMember(ctx context.Context, id ids.NodeID) (ids.Epoch, error) {
	var epoch ids.Epoch
	err := d.retry(ctx, func(ctx context.Context) (bool, error) {
		if d.raft.State() == raft.Leader {
			err := d.removeFailed(ctx, id)
			epoch = d.Epoch()
			return retryable(err), err
		}
		resp, err := d.callLeader(ctx, rpcRequest{Op: opRemove, ID: id})
		epoch = resp.Epoch
		return retryable(err), err
	})
	return epoch, err
}

// removeFailed runs on the leader for RemoveMember.
func (d *Directory) removeFailed(ctx context.Context, id ids.NodeID) error {
	d.reconcileMu.Lock()
	defer d.reconcileMu.Unlock()
	m, ok := d.View().Member(id)
	switch {
	case !ok:
		return fmt.Errorf("%w: %v", ErrNoMember, id)
	case m.State == StateLeft:
		return nil
	case m.State != StateFailed:
		return fmt.Errorf("%w: %v is %v; a member that is alive leaves by itself (stop its dsmd with SIGTERM)", ErrNotFailed, id, m.State)
	}
	d.gossip.mark(id, gossipLeft)
	if err := d.removeMember(ctx, id, m.Nonce, StateLeft); err != nil {
		return err
	}
	d.log.Warn("directory: failed member removed by an operator", "member", id.String(), "incarnation", m.Incarnation, "epoch", d.Epoch().String())
	return nil
}

// voters returns the current Raft voters.
func (d *Directory) voters() []raft.Server {
	f := d.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	var out []raft.Server
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			out = append(out, s)
		}
	}
	return out
}

// RaftStats is a summary of this replica's Raft state.
type RaftStats struct {
	State             string // Follower, Candidate, Leader, Shutdown
	Leader            ids.NodeID
	LeaderAddr        string
	Term              uint64
	LastIndex         uint64
	CommitIndex       uint64
	AppliedIndex      uint64
	LastSnapshotIndex uint64
	Voters            []ids.NodeID
	NonVoters         []ids.NodeID
}

// RaftStats reports this replica's Raft state.
func (d *Directory) RaftStats() RaftStats {
	addr, lid := d.raft.LeaderWithID()
	leader, _ := parseServerID(lid)
	st := d.raft.Stats()
	num := func(k string) uint64 { n, _ := strconv.ParseUint(st[k], 10, 64); return n }
	s := RaftStats{
		State: d.raft.State().String(), Leader: leader, LeaderAddr: string(addr),
		Term: num("term"), LastIndex: d.raft.LastIndex(), CommitIndex: d.raft.CommitIndex(),
		AppliedIndex: d.raft.AppliedIndex(), LastSnapshotIndex: num("last_snapshot_index"),
	}
	if f := d.raft.GetConfiguration(); f.Error() == nil {
		for _, srv := range f.Configuration().Servers {
			id, ok := parseServerID(srv.ID)
			if !ok {
				continue
			}
			if srv.Suffrage == raft.Voter {
				s.Voters = append(s.Voters, id)
			} else {
				s.NonVoters = append(s.NonVoters, id)
			}
		}
	}
	slices.Sort(s.Voters)
	slices.Sort(s.NonVoters)
	return s
}

// TransferLeadership asks this replica, if it leads, to hand leadership to
// another voter (operators, tests).
func (d *Directory) TransferLeadership() error {
	return raftErr(d.raft.LeadershipTransfer().Error())
}

// Snapshot asks Raft to take a snapshot now (operators, tests).
func (d *Directory) Snapshot() error { return d.raft.Snapshot().Error() }

// GossipMember is a member as this node's gossip sees it right now.
type GossipMember struct {
	ID    ids.NodeID
	Addr  string      // gossip address
	State MemberState // alive, left or failed
	// LastSeen is when the member last answered this node's failure
	// detector or sent it an update; zero if never.
	LastSeen time.Time
}

// GossipMembers reports the local failure detector's latest verdicts, as
// delivered by gossip events. It is not replicated and may disagree with
// Members for a moment. (memberlist's own member list hands out pointers
// into its state that it keeps updating, so it is not read here.)
func (d *Directory) GossipMembers() []GossipMember {
	var out []GossipMember
	for id, e := range d.gossip.snapshot() {
		st := StateAlive
		switch e.state {
		case gossipDead:
			st = StateFailed
		case gossipLeft:
			st = StateLeft
		}
		out = append(out, GossipMember{ID: id, Addr: e.addr, State: st, LastSeen: d.gossip.lastSeen(id)})
	}
	slices.SortFunc(out, func(a, b GossipMember) int { return cmpID(a.ID, b.ID) })
	return out
}
