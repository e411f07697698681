package node

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/vfs"
	"google.golang.org/grpc"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/localsock"
	"github.com/dsmkit/dsm/internal/pebblefs"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
	"github.com/dsmkit/dsm/internal/tlsconf"
	"github.com/dsmkit/dsm/node/engine"
	"github.com/dsmkit/dsm/node/localcache"
	"github.com/dsmkit/dsm/node/pagestore"
)

// Version is dsmd's build version, reported by Status. Set with
// -ldflags "-X github.com/dsmkit/dsm/node.Version=...".
var Version = "dev"

// ErrClosed is returned by a Node that was closed.
var ErrClosed = errors.New("node: closed")

// Options are the parts of a Node that are not settings: seams for tests and
// for the coherence engine once it exists.
type Options struct {
	// Logger; nil discards.
	Logger *slog.Logger
	// Timing of the directory; zero takes directory.LANTiming.
	Timing directory.Timing
	// Coherence, when set, replaces the coherence engines behind the page
	// cache (tests: localcache.MemHome makes a single-node dsmd with
	// every page in memory). Nil: one coherence engine per region, over
	// the verbs transport, as configured by the directory.
	Coherence localcache.Coherence
	// Reload, in Run, reloads the TLS files at each receive (dsmd: SIGHUP).
	Reload <-chan os.Signal
	// PageStoreFS, when set, is the file system of the page store
	// (tests wrap it to inject disk faults); nil: the real one.
	PageStoreFS vfs.FS
	// Notify, when set, is told the service states of Run: "READY=1" once
	// the node has started (its listeners and local sockets accept
	// connections and it has joined gossip), "STOPPING=1" when it begins
	// to leave. dsmd passes them to systemd (package internal/sdnotify).
	Notify func(states ...string)
}

// Node is one running dsmd: directory replica, verbs endpoint, gRPC services
// and metrics. Create it with New, then Start; Close or Shutdown it.
type Node struct {
	cfg   Config
	addrs Addrs
	opts  Options
	log   *slog.Logger

	tls   *tlsconf.Manager // nil without TLS
	verbs verbsEndpoint
	dir   *directory.Directory
	cache *localcache.Cache
	eng   *engines // nil when Options.Coherence replaces them
	// pages is the page store of durable regions (DATA_DIR/pages) and
	// persist the node's part in persisting them (persist.go); both nil
	// when Options.Coherence replaces the engines.
	pages   *pagestore.Store
	persist *persister
	stats   nodeStats
	shards  shardCounter  // Status's homed shards, kept per view
	publish chan struct{} // this node's descriptors changed

	ctx     context.Context // cancelled by Close
	grpc    *grpc.Server
	lns     []net.Listener
	metrics *http.Server
	mln     net.Listener

	stop    context.CancelFunc
	wg      sync.WaitGroup
	started bool
	// failed receives the error that makes this node unable to serve
	// (a cluster on another transport; this incarnation removed, which
	// wraps errRemoved): Run stops and returns it.
	failed chan error

	closeOnce sync.Once
	closeErr  error

	// leaving is set when a graceful leave begins.
	leaving atomic.Bool
}

// New checks cfg and prepares a node; nothing is bound until Start.
func New(cfg Config, opts Options) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.Logger == nil {
		opts.Logger = log
	}
	return &Node{cfg: cfg, addrs: cfg.Resolve(), opts: opts, log: log.With("node", ids.NodeID(cfg.ID)),
		failed: make(chan error, 1)}, nil
}

// Start binds every address and starts the services. On error everything
// started so far is stopped again.
func (n *Node) Start() (err error) {
	if n.started {
		return errors.New("node: already started")
	}
	n.started = true
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	if err := os.MkdirAll(n.cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("node: data dir: %w", err)
	}
	id := ids.NodeID(n.cfg.ID)
	sa, _ := n.cfg.SocketPerm() // validated by New
	ctx, cancel := context.WithCancel(context.Background())
	n.ctx, n.stop = ctx, cancel
	n.publish = make(chan struct{}, 1)

	if files, on := n.cfg.TLSFiles(); on {
		if n.tls, err = tlsconf.Load(files); err != nil {
			return fmt.Errorf("node: TLS: %w", err)
		}
		if self := n.tls.Self(); self.Node != id {
			return fmt.Errorf("node: TLS: the certificate %s names %v, but this is node %d (--id): make one with `dsmctl tls cert create --node %d`", files.Cert, self, id, id)
		}
	}
	n.verbs, err = n.listenVerbs(id)
	if err != nil {
		return fmt.Errorf("node: verbs transport (%s) on %s: %w", n.cfg.transport(), n.addrs.Verbs, err)
	}
	n.addrs.Verbs = n.verbs.Addr()

	// The gRPC listeners are bound before the directory opens, so that the
	// address published in the member table is the real one.
	if err := os.MkdirAll(filepath.Dir(n.addrs.Socket), 0o755); err != nil {
		return fmt.Errorf("node: socket dir: %w", err)
	}
	uln, err := n.listenLocal("unix", n.addrs.Socket)
	if err != nil {
		return err
	}
	rf := &refusals{log: n.log}
	n.lns = append(n.lns, localsock.Admit(uln, n.socketPolicy(n.addrs.Socket),
		func(a *localsock.Addr) { rf.report(n.addrs.Socket, a) }))
	published := "unix://" + n.addrs.Socket
	if n.addrs.GRPC != "" {
		tln, err := net.Listen("tcp", n.addrs.GRPC)
		if err != nil {
			return fmt.Errorf("node: grpc on %s: %w", n.addrs.GRPC, err)
		}
		n.addrs.GRPC = tln.Addr().String()
		if n.tls != nil {
			// Operators' clients (dsmctl) and known members may call;
			// gRPC speaks HTTP/2 only.
			gcfg := n.tls.ServerConfig(func(id tlsconf.Identity) error {
				if id.Client {
					return nil
				}
				// Serve starts after n.dir is set.
				return n.dir.CheckPeer(id)
			})
			gcfg.NextProtos = []string{"h2"}
			tln = tls.NewListener(tln, gcfg)
		}
		n.lns = append(n.lns, tln)
		published = n.addrs.GRPC
	}

	keys, _ := n.cfg.gossipKeys() // validated by New
	n.dir, err = directory.Open(directory.Config{
		GossipKeys: keys,
		NodeID:     id, DataDir: filepath.Join(n.cfg.DataDir, "directory"), DiskReserve: int64(n.cfg.DiskReserve),
		GossipAddr: n.addrs.Gossip, RaftAddr: n.addrs.Raft, RPCAddr: n.addrs.RPC,
		GRPCAddr: published, VerbsAddr: n.addrs.Verbs,
		Join: n.cfg.Join, BootstrapExpect: n.cfg.BootstrapExpect,
		// The directory's incarnation of this node is the verbs
		// transport's: peers reach this process only once the directory
		// names it (ExpectNonce below).
		Nonce:  n.verbs.Nonce(),
		Timing: n.opts.Timing, Logger: n.opts.Logger,
		TLS: n.tls,
	})
	if err != nil {
		return fmt.Errorf("node: directory: %w", err)
	}
	da := n.dir.Addrs()
	n.addrs.Gossip, n.addrs.Raft, n.addrs.RPC = da.Gossip, da.Raft, da.RPC

	coh := n.opts.Coherence
	if coh == nil {
		// The pages of durable regions go to a pebble database of their
		// own, beside the directory's Raft log store but not in it: its
		// group commits fsync on their own cadence, a region's pages are
		// deleted with one range delete that never touches the Raft log,
		// and a full disk or a stalled compaction of pages fails Syncs
		// without stalling the directory's commits (pagestore's doc).
		n.pages, err = pagestore.Open(pagestore.Options{Dir: filepath.Join(n.cfg.DataDir, "pages"),
			FS: n.opts.PageStoreFS, Logger: n.log.With("part", "pagestore")})
		if err != nil {
			return fmt.Errorf("node: page store: %w", err)
		}
		n.persist = newPersister(n, n.pages)
		n.eng = newEngines(n)
		n.verbs.SetHandler(n.eng.deliver)
		coh = n.eng
	}
	n.cache, err = localcache.New(localcache.Config{
		Coherence:     coh,
		CapacityPages: int(uint64(n.cfg.CacheSize) / localcache.DefaultPageSize),
		Logger:        n.log.With("part", "cache"),
		Proto:         n.proto,
		SocketPerm:    sa.Perm,
		Admit:         n.admitConn(n.socketPolicy(n.addrs.MapSocket), rf),
		MayMap:        n.mayMap,
		Control:       n.control,
		LeasePage:     true, // guardLease writes it
	})
	if err != nil {
		return fmt.Errorf("node: page cache: %w", err)
	}
	if err := n.cache.Listen(n.addrs.MapSocket); err != nil {
		return fmt.Errorf("node: map socket %s: %w", n.addrs.MapSocket, err)
	}

	n.wg.Add(3)
	go func() {
		defer n.wg.Done()
		n.follow(ctx)
	}()
	go func() {
		defer n.wg.Done()
		n.guardLease(ctx)
	}()
	go func() {
		defer n.wg.Done()
		n.publishLoop(ctx)
	}()

	n.grpc = grpc.NewServer(grpc.ChainUnaryInterceptor(admitUnary), grpc.ChainStreamInterceptor(admitStream))
	dsmpb.RegisterAdminServer(n.grpc, &adminServer{n: n})
	dsmpb.RegisterClientServer(n.grpc, &clientServer{n: n})
	for _, ln := range n.lns {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			if err := n.grpc.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				n.log.Error("grpc serve", "addr", ln.Addr(), "err", err)
			}
		}()
	}

	if n.cfg.MetricsAddr != "" {
		n.mln, err = net.Listen("tcp", n.cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("node: metrics on %s: %w", n.cfg.MetricsAddr, err)
		}
		n.metrics = &http.Server{Handler: n.metricsHandler(), ReadHeaderTimeout: 10 * time.Second}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			if err := n.metrics.Serve(n.mln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				n.log.Error("metrics serve", "err", err)
			}
		}()
	}
	if n.tls == nil {
		if name, a := n.addrs.exposed(); name != "" {
			// Validate let this pass: --insecure.
			n.wg.Add(1)
			go func() {
				defer n.wg.Done()
				n.warnInsecure(ctx, a)
			}()
		}
	} else {
		n.log.Info("TLS on", "certificate", n.tls.Self(), "expires", n.tls.Leaf().NotAfter, "verbs_plaintext", n.cfg.VerbsPlaintext)
	}
	n.log.Info("dsmd started", "gossip", n.addrs.Gossip, "raft", n.addrs.Raft, "rpc", n.addrs.RPC,
		"verbs", n.addrs.Verbs, "socket", n.addrs.Socket, "grpc", n.addrs.GRPC, "metrics", n.MetricsAddr(),
		"join", n.cfg.Join, "bootstrap_expect", n.cfg.BootstrapExpect, "page_cache", n.cache != nil)
	return nil
}

// warnInsecure logs, now and every minute until ctx ends, that addr is
// open to anyone who can reach it.
func (n *Node) warnInsecure(ctx context.Context, addr string) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		n.log.Warn("INSECURE: TLS is off and dsmd listens on a non-loopback address: anyone who reaches it can read and write the cluster's memory; see docs/security.md", "addr", addr)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ReloadTLS reads the TLS certificate, key and CA files again; every
// connection made afterwards uses them, the ones up keep going. On error
// the node keeps the files it had. Without TLS it does nothing.
func (n *Node) ReloadTLS() error {
	if n.tls == nil {
		return nil
	}
	if err := n.tls.Reload(); err != nil {
		return fmt.Errorf("node: TLS reload: %w", err)
	}
	n.log.Info("TLS reloaded", "certificate", n.tls.Self(), "serial", n.tls.Leaf().SerialNumber.Text(16), "expires", n.tls.Leaf().NotAfter)
	return nil
}

// incarnationKey names one incarnation: a node id and its nonce.
type incarnationKey struct {
	id    ids.NodeID
	nonce uint64
}

// fencer is a verbs transport that refuses the batches of departed
// incarnations at the target: tcp by the requester's nonce, ofi by closing
// the memory keys it granted that incarnation (and, on ofi_rxm, its
// connection; shm cannot, see package ofi).
type fencer interface {
	Fence(id ids.NodeID, nonce uint64)
}

// fenceDeparted has the verbs transport refuse, from now on, every batch
// of every incarnation the view says departed: a left or failed member's,
// and every past incarnation of a node. A process removed while it was cut off then
// executes nothing here when it comes back (docs/protocol.md, Departures
// and leases). done records what was fenced already.
func (n *Node) fenceDeparted(v *directory.View, done map[incarnationKey]bool) {
	f, ok := n.verbs.(fencer)
	if !ok {
		return
	}
	fence := func(id ids.NodeID, nonce uint64) {
		k := incarnationKey{id, nonce}
		if nonce == 0 || done[k] || (id == ids.NodeID(n.cfg.ID) && nonce == n.verbs.Nonce()) {
			return
		}
		done[k] = true
		f.Fence(id, nonce)
		n.log.Info("verbs: departed incarnation fenced", "peer", id, "nonce", fmt.Sprintf("%#x", nonce))
	}
	for _, m := range v.Members() {
		if m.DepartedAt() != 0 {
			fence(m.ID, m.Nonce)
		}
		for _, pn := range m.PastNonces {
			fence(m.ID, pn)
		}
	}
}

// follow keeps the verbs transport's peer table and the page cache's
// regions in step with the directory.
func (n *Node) follow(ctx context.Context) {
	changes, cancel := n.dir.Subscribe()
	defer cancel()
	peers := map[ids.NodeID]string{}
	nonces := map[ids.NodeID]uint64{}
	regions := map[ids.RegionID]bool{}
	access := map[ids.RegionID]*directory.Access{} // as last seen
	mixed := map[ids.NodeID]string{}               // members on another transport: their address
	fenced := map[incarnationKey]bool{}            // departed incarnations fenced at the transport
	// While members on another transport are known, the check is made
	// again now and then: the leader may not have been known at the
	// change that showed them.
	recheck := time.NewTicker(time.Second)
	defer recheck.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-recheck.C:
			if len(mixed) > 0 {
				if err := n.checkTransports(n.dir.View(), mixed); err != nil {
					n.fail(err)
				}
			}
		case ch, ok := <-changes:
			if !ok {
				return
			}
			cur := ch.Cur
			if ch.EpochChanged() {
				// Logged before the engines move to the epoch: a
				// failure verdict's time bounds what it lost (the
				// chaos checker reads "failed").
				n.log.Info("directory: epoch", "epoch", cur.Epoch, "joined", ch.Joined(), "departed", ch.Departed(),
					"failed", ch.Failed())
			}
			n.checkRemoved(cur)
			seen := map[ids.NodeID]bool{}
			if err := n.checkTransports(cur, mixed); err != nil {
				n.fail(err)
			}
			n.fenceDeparted(cur, fenced)
			for _, m := range cur.Members() {
				if m.ID == ids.NodeID(n.cfg.ID) || m.State != directory.StateAlive || m.VerbsAddr == "" {
					continue
				}
				if mixed[m.ID] != "" {
					continue // another transport: unreachable from here
				}
				seen[m.ID] = true
				if peers[m.ID] == m.VerbsAddr && nonces[m.ID] == m.Nonce {
					continue
				}
				if err := n.verbs.AddPeer(m.ID, m.VerbsAddr); err != nil {
					n.log.Warn("verbs: add peer", "peer", m.ID, "addr", m.VerbsAddr, "err", err)
					continue
				}
				// Only the incarnation the directory names is reached: a
				// restarted peer's new process is not, until its record
				// (and its descriptors) say it is the member.
				n.verbs.ExpectNonce(m.ID, m.Nonce)
				peers[m.ID], nonces[m.ID] = m.VerbsAddr, m.Nonce
				n.log.Info("verbs: peer", "peer", m.ID, "addr", m.VerbsAddr, "incarnation", m.Incarnation)
			}
			for id := range peers {
				if !seen[id] {
					n.verbs.RemovePeer(id)
					delete(peers, id)
					delete(nonces, id)
					n.log.Info("verbs: peer gone", "peer", id)
				}
			}
			if n.eng != nil {
				if n.eng.sync(cur) {
					select {
					case n.publish <- struct{}{}:
					default:
					}
				}
			} else if n.cache != nil {
				for id := range regions {
					if _, ok := cur.RegionByID(id); !ok {
						delete(regions, id)
						if err := n.cache.RemoveRegion(ctx, id, fmt.Sprintf("region %v was deleted", id)); err != nil {
							n.log.Warn("cache: remove region", "id", id, "err", err)
						}
					}
				}
				for _, r := range cur.Regions() {
					if regions[r.ID] {
						continue
					}
					err := n.cache.AddRegion(localcache.RegionSpec{ID: r.ID, Name: r.Name,
						Size: int64(r.Size), PageSize: int64(r.PageSize)})
					if err != nil {
						n.log.Warn("cache: add region", "region", r.Name, "err", err)
						continue
					}
					regions[r.ID] = true
				}
			}
			n.revokeMappings(cur, access)
		}
	}
}

// errRemoved is the error of a node whose incarnation was removed from the
// cluster: it has left already, so Run closes it without leaving again.
var errRemoved = errors.New("node: this incarnation was removed from the cluster")

// errDeclaredFailed is the error of a node whose incarnation the
// directory declared failed while the process lived on (cut off from the
// majority, stopped, stalled): its pages moved on and the words naming it
// were repaired, so it must serve nothing more. Run starts a new
// incarnation in the same process.
var errDeclaredFailed = errors.New("node: this incarnation was declared failed")

// checkRemoved notices that this incarnation departed without leaving: an
// operator removed it (RemoveMember) while it was cut off, or the
// directory declared it failed. Its homes have moved and the words naming
// it were repaired, so it must serve nothing more: Run stops the process
// when it was removed (a restart rejoins as a new incarnation), and starts
// a new incarnation when it was declared failed.
func (n *Node) checkRemoved(v *directory.View) {
	me, ok := v.Member(ids.NodeID(n.cfg.ID))
	if !ok || me.Nonce != n.verbs.Nonce() || n.leaving.Load() {
		return
	}
	switch me.State {
	case directory.StateLeft:
		n.departed(fmt.Errorf("%w: incarnation %d of n%d, in epoch %d (dsmctl members remove): its pages moved; restart dsmd to rejoin as a new incarnation",
			directory.ErrDeparted, me.Incarnation, n.cfg.ID, me.Epoch))
	case directory.StateFailed:
		n.departed(fmt.Errorf("%w: incarnation %d of n%d, in epoch %d", directory.ErrDeclaredFailed, me.Incarnation, n.cfg.ID, me.DepartedAt()))
	}
}

// departed stops serving for good once the directory says this
// incarnation departed (why wraps directory.ErrDeclaredFailed or
// ErrDeparted), from its log or from a voter's lease refusal.
func (n *Node) departed(why error) {
	if n.leaving.Load() {
		return // a graceful leave ends in a departure
	}
	if errors.Is(why, directory.ErrGaveUp) {
		if n.fail(fmt.Errorf("%w: %w", errDeclaredFailed, why)) {
			n.log.Error("this incarnation gave itself up: no majority of the voters would grant it a lease while the leader reached it; it serves nothing more, what it held Modified is lost, and a new incarnation rejoins", "err", why)
		}
		return
	}
	if errors.Is(why, directory.ErrDeclaredFailed) {
		if n.fail(fmt.Errorf("%w: %w", errDeclaredFailed, why)) {
			n.log.Error("declared failed by the cluster: this incarnation serves nothing more; its pages moved on, and what it held Modified is lost", "err", why)
		}
		return
	}
	if n.fail(fmt.Errorf("%w: %w", errRemoved, why)) {
		n.log.Error("removed from the cluster: serving nothing more", "err", why)
	}
}

// publishLoop publishes this node's home memory descriptors in the member
// table whenever they change, retrying until the directory takes them.
func (n *Node) publishLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.publish:
		}
		for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := n.dir.SetLocalMeta(cctx, n.eng.descriptors())
			cancel()
			if err == nil || ctx.Err() != nil {
				break
			}
			n.log.Warn("publish descriptors", "err", err, "retry_in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
		}
	}
}

// Addrs reports the addresses the node bound (after Start).
func (n *Node) Addrs() Addrs { return n.addrs }

// MetricsAddr is the bound metrics address, or "".
func (n *Node) MetricsAddr() string {
	if n.mln == nil {
		return ""
	}
	return n.mln.Addr().String()
}

// Directory is the node's directory replica (after Start).
func (n *Node) Directory() *directory.Directory { return n.dir }

// Shutdown leaves the cluster gracefully (hands off Raft leadership, tells
// gossip and the leader), then closes. ctx bounds the departure.
func (n *Node) Shutdown(ctx context.Context) error {
	return n.close(ctx, true)
}

// leaveReserve is the share of the leave's deadline kept for leaving the
// directory after the drain and the hand-over.
const leaveReserve = 3 * time.Second

// departMax bounds the departure from the directory (directory.Leave) at
// the end of a graceful leave.
const departMax = 10 * time.Second

// drain ends every client's mapping (no store lands after it) and writes
// back every page this node holds Modified, so that a graceful leave loses
// none of what this node's clients wrote. The shards this node is home of
// are handed over afterwards (handOver); those that are not move to their
// backups when it has left (every release wrote them there).
//
// The page cache's write-back sees only the pages it holds Modified: a page
// it gave up to a recall a moment before (a drop or a downgrade) has its
// release still on its way to the home and backups, and once this node has
// left, the members that learnt it refuse its verbs, and the new homes
// rebuild without its reports. So the drain then waits for every release
// of every region, as Sync does (awaitWriteBacks). (Found by the engine
// simulation's leave configurations: docs/failover.md, "Leaves in the
// engine simulation".)
func (n *Node) drain(ctx context.Context) {
	n.cache.Drain(fmt.Sprintf("dsmd on n%d is leaving the cluster", n.cfg.ID))
	n.writeBackAll(ctx, "drained: dirty pages written back")
}

// leaveCtx is ctx less leaveReserve, kept for the departure (when ctx
// leaves more than twice that).
func leaveCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) > 2*leaveReserve {
		return context.WithDeadline(ctx, dl.Add(-leaveReserve))
	}
	return context.WithCancel(ctx)
}

// writeBackAll writes back every page this node's cache holds Modified
// and waits for every release of every region (awaitAllWriteBacks),
// logging done when all of it is written back.
func (n *Node) writeBackAll(ctx context.Context, done string) {
	ctx, cancel := leaveCtx(ctx)
	defer cancel()
	start := time.Now()
	w, err := n.cache.FlushAll(ctx)
	if err != nil {
		n.log.Warn("drain: not every dirty page was written back; those are lost", "written", w, "err", err)
		return
	}
	more, err := n.awaitAllWriteBacks(ctx)
	if err != nil {
		n.log.Warn("drain: not every release under way reached its home; those are lost", "written", w+more, "err", err)
		return
	}
	n.log.Info(done, "pages", w+more, "took", time.Since(start).Round(time.Millisecond))
}

// handOver waits, after the drain's write-backs, until none of the
// shards of watch (those that needed this incarnation when it was marked
// draining: engines.handOverWatch) needs it any more in the latest view,
// and every engine has taken that view: the shards it was home of
// promoted to their preferred members, and every backup of those shards
// and of those it backed up, other than itself, complete
// (regionChains.handOver; docs/failover.md §11). Its departure then moves
// no shard, and accesses to its shards waited only for the promotions'
// freezes. Meanwhile it serves as any member: its engines answer the
// moves, and its fills fill the new homes' backups. It gives up at ctx's
// end (less leaveReserve), saying what is left: those shards move at the
// departure, as after a crash, with their data written back.
func (n *Node) handOver(ctx context.Context, watch map[ids.RegionID][]uint64) {
	ctx, cancel := leaveCtx(ctx)
	defer cancel()
	start := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	logged := time.Now()
	for {
		pm := n.protoView()
		left := n.eng.handOverLeft(pm, watch)
		if left == 0 && n.eng.applied.Load() >= uint64(pm.epoch) {
			n.log.Info("handed over: no shard needs this node", "took", time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(logged) > 2*time.Second {
			n.log.Info("hand-over under way", "shards", left, "waited", time.Since(start).Round(time.Millisecond))
			logged = time.Now()
		}
		select {
		case <-ctx.Done():
			n.log.Warn("hand-over not finished: those shards move to their backups at the departure (their data written back)", "shards", left,
				"waited", time.Since(start).Round(time.Millisecond))
			return
		case <-tick.C:
		}
	}
}

// protoView is the protocol view the engines follow (nil: none yet, or no
// engines).
func (n *Node) protoView() *protoMap {
	if n.eng == nil {
		return nil
	}
	return n.eng.pv.p.Load()
}

// awaitAllWriteBacks is awaitWriteBacks over every page of every region
// this node serves. It returns how many pages it wrote back itself and
// every error.
func (n *Node) awaitAllWriteBacks(ctx context.Context) (int, error) {
	if n.eng == nil {
		return 0, nil
	}
	n.eng.mu.RLock()
	regions := make([]directory.Region, 0, len(n.eng.byID))
	for _, re := range n.eng.byID {
		regions = append(regions, re.region)
	}
	n.eng.mu.RUnlock()
	slices.SortFunc(regions, func(a, b directory.Region) int { return cmp.Compare(a.ID, b.ID) })
	total := 0
	var errs []error
	for _, r := range regions {
		w, err := n.awaitWriteBacks(ctx, r.ID, 0, ids.PageNo(r.Pages()))
		total += w
		if err != nil && !errors.Is(err, engine.ErrUnknownRegion) && !errors.Is(err, localcache.ErrUnknownRegion) {
			errs = append(errs, fmt.Errorf("%s: %w", r.Name, err))
		}
	}
	return total, errors.Join(errs...)
}

// Close stops the node without leaving: peers see it fail, and it can
// restart from its data directory.
func (n *Node) Close() error {
	return n.close(context.Background(), false)
}

func (n *Node) close(ctx context.Context, leave bool) error {
	if leave {
		n.leaving.Store(true)
	}
	n.closeOnce.Do(func() {
		var errs []error
		var watch map[ids.RegionID][]uint64 // the shards to hand over (nil: none)
		if leave && n.dir != nil {
			// Others' status shows this node draining while it writes
			// back, hands its shards over and leaves; the mark starts the
			// hand-over (handOver).
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if err := n.dir.SetDraining(dctx); err != nil {
				n.log.Warn("leave: could not record this node as draining; its shards move at its departure", "err", err)
			} else if pm := n.protoView(); pm != nil {
				// The shards that need this node now: those it is home
				// of, and those whose replica sets hold it (its mark
				// changes neither).
				var uncounted int
				watch, uncounted = n.eng.handOverWatch(pm)
				if uncounted > 0 {
					n.log.Warn("hand-over: regions with more shards than are placed one by one move at the departure", "regions", uncounted)
				}
			}
			cancel()
		}
		if n.grpc != nil {
			// GracefulStop waits for RPCs in flight; bound it.
			done := make(chan struct{})
			go func() { n.grpc.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				n.grpc.Stop()
				<-done
			}
		} else {
			for _, ln := range n.lns {
				ln.Close()
			}
		}
		if n.metrics != nil {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			errs = append(errs, n.metrics.Shutdown(sctx))
			cancel()
		} else if n.mln != nil {
			n.mln.Close()
		}
		if leave && n.cache != nil {
			n.drain(ctx)
			if watch != nil {
				n.handOver(ctx, watch)
				// The moves of the hand-over may have given back a tenure
				// whose release they interrupted (a reclaimed grant), and
				// calls in flight may have ended since the drain: write
				// back once more before the departure.
				n.writeBackAll(ctx, "written back after the hand-over")
			}
		}
		if n.stop != nil {
			n.stop()
		}
		if n.dir != nil {
			if leave {
				// The departure itself gets at most departMax of what is
				// left: a cluster that lost its quorum (every node stopped
				// at once) never completes it, and its failure detector
				// ends this incarnation anyway.
				dctx, cancel := context.WithTimeout(ctx, departMax)
				errs = append(errs, n.dir.Leave(dctx))
				cancel()
			} else {
				errs = append(errs, n.dir.Close())
			}
		}
		n.wg.Wait()
		if n.persist != nil {
			n.persist.close()
		}
		if n.eng != nil {
			errs = append(errs, n.eng.close())
		}
		if n.pages != nil {
			if err := n.pages.Close(); err != nil {
				errs = append(errs, fmt.Errorf("node: page store: %w", err))
			}
		}
		if n.cache != nil {
			errs = append(errs, n.cache.Close())
		}
		if n.verbs != nil {
			errs = append(errs, n.verbs.Close())
		}
		n.closeErr = errors.Join(errs...)
		n.log.Info("dsmd stopped", "left", leave, "err", n.closeErr)
	})
	return n.closeErr
}

// Run starts a node and serves until ctx ends, then leaves the cluster
// gracefully (bounded by leaveTimeout) and closes. It is dsmd's main loop.
//
// When the directory declares the running incarnation failed (it was cut
// off, stopped or stalled for longer than the failure detector waits), Run
// closes it without leaving and starts a new incarnation in the same
// process: new transport nonce, empty page cache, its clients' mappings
// end (they map again). Nothing it held Modified survives: the cluster
// moved on without it.
func Run(ctx context.Context, cfg Config, opts Options, leaveTimeout time.Duration) error {
	notify := opts.Notify
	if notify == nil {
		notify = func(...string) {}
	}
	for incarnations := 0; ; incarnations++ {
		n, err := startIncarnation(ctx, cfg, opts, incarnations > 0)
		if err != nil {
			return err
		}
		if n == nil {
			return nil // ctx ended while a new incarnation could not start
		}
		if incarnations == 0 {
			notify("READY=1", fmt.Sprintf("STATUS=serving as n%d", cfg.ID))
		} else {
			notify(fmt.Sprintf("STATUS=serving as n%d (a new incarnation after a failure verdict)", cfg.ID))
		}
		again, err := n.serve(ctx, notify, leaveTimeout)
		if !again {
			return err
		}
		lost := 0
		if n.cache != nil {
			// What is tied to this incarnation ends now: its sessions and
			// the calls waiting in its cache fail with the verdict, rather
			// than when Close gets to the cache (after up to 5 s of
			// stopping the RPC server): docs/failover.md §10.
			n.cache.End(endReason(n.cfg.ID, err))
			lost = n.cache.DiscardSuspended()
		}
		n.log.Warn("starting a new incarnation of this node", "dirty_pages_lost", lost, "err", err)
		if cerr := n.Close(); cerr != nil {
			n.log.Warn("closing the failed incarnation", "err", cerr)
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// endReason is what the sessions and calls of an incarnation declared
// failed (err, from serve) are told.
func endReason(id uint32, err error) string {
	// The verdict's own words ("incarnation 5 of n2, in epoch 43"), after
	// the prefixes of the paths that carried it.
	detail := err.Error()
	prefix := directory.ErrDeclaredFailed.Error() + ": "
	if i := strings.LastIndex(detail, prefix); i >= 0 {
		detail = strings.TrimRight(detail[i+len(prefix):], ")")
	}
	return fmt.Sprintf("dsmd on n%d was declared failed by the cluster (%s): this incarnation serves nothing more and its mappings end; map the region again", id, detail)
}

// startIncarnation creates and starts a node. The first incarnation's
// failure is returned (a configuration error, a port in use: dsmd exits
// with it) unless it is a full file system under the data directory; a
// later incarnation's failure, or a full disk at any start, is logged and
// tried again, with a backoff (up to 30 s; 5 s while the disk is full),
// until it starts or ctx ends (nil, nil): dsmd stays up and starts, or
// rejoins, once what stopped it (a full disk, a data directory it cannot
// open) is gone, rather than exiting into a supervisor's restart loop.
func startIncarnation(ctx context.Context, cfg Config, opts Options, again bool) (*Node, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	backoff := time.Second
	var lastLog time.Time
	for attempt := 1; ; attempt++ {
		n, err := New(cfg, opts)
		if err == nil {
			if err = n.Start(); err == nil {
				if attempt > 1 {
					log.Info("node started after failed attempts", "node", ids.NodeID(cfg.ID), "attempts", attempt)
				}
				return n, nil
			}
		}
		full := diskFull(err)
		if !again && !full {
			return nil, err
		}
		wait := backoff
		if full {
			wait = min(backoff, 5*time.Second)
			// Once a minute is enough to say the disk is still full.
			if attempt == 1 || time.Since(lastLog) >= time.Minute {
				lastLog = time.Now()
				log.Error("the file system of the data directory is full: dsmd waits for free space and starts when there is some (free space under --data-dir)",
					"node", ids.NodeID(cfg.ID), "data_dir", cfg.DataDir, "attempt", attempt, "err", err)
				if opts.Notify != nil {
					// Under systemd the start is still in progress: extend
					// its timeout past the next of these notices.
					opts.Notify(fmt.Sprintf("STATUS=waiting for free space under %s (disk full)", cfg.DataDir),
						"EXTEND_TIMEOUT_USEC=120000000")
				}
			}
		} else {
			log.Error("a new incarnation of this node could not start; trying again", "node", ids.NodeID(cfg.ID), "in", wait, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(wait):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// diskFull reports whether a start failed on a full file system (or a
// quota reached): a condition an operator or a compaction clears, so that
// starting again later may succeed. Both stores' disk-full errors wrap the
// errno.
func diskFull(err error) bool { return pebblefs.IsDiskFull(err) }

// serve runs a started node until ctx ends (it leaves, bounded by
// leaveTimeout), until it cannot serve, or until it was declared failed
// (again: Run starts a new incarnation; the node is not closed yet).
func (n *Node) serve(ctx context.Context, notify func(...string), leaveTimeout time.Duration) (again bool, err error) {
	opts := n.opts
	var failed error
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case failed = <-n.failed:
			if errors.Is(failed, errDeclaredFailed) {
				notify(fmt.Sprintf("STATUS=declared failed; starting a new incarnation of n%d", n.cfg.ID))
				return true, failed
			}
			if errors.Is(failed, errRemoved) {
				notify("STOPPING=1", "STATUS=removed from the cluster")
				if n.cache != nil {
					// As for a failure verdict (Run): the sessions end now,
					// not when Close gets to the cache.
					n.cache.End(fmt.Sprintf("dsmd on n%d was removed from the cluster (%s): it serves nothing more and its mappings end", n.cfg.ID, strings.TrimPrefix(failed.Error(), errRemoved.Error()+": ")))
				}
				return false, errors.Join(failed, n.Close())
			}
			n.log.Error("dsmd cannot serve in this cluster; leaving it", "err", failed)
			done = true
		case <-opts.Reload:
			if err := n.ReloadTLS(); err != nil {
				n.log.Error("TLS reload failed; the previous certificates stay in use", "err", err)
			}
		}
	}
	n.log.Info("dsmd: leaving the cluster")
	notify("STOPPING=1", "STATUS=leaving the cluster")
	lctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	if err := n.Shutdown(lctx); failed == nil {
		return false, err
	}
	return false, failed
}

// fail reports an error that stops the node from serving (Run leaves the
// cluster, or closes a node that was removed, and returns it); the first
// one waiting wins, and fail reports whether it was err.
func (n *Node) fail(err error) bool {
	select {
	case n.failed <- err:
		return true
	default:
		return false
	}
}

// clusterTransport is the transport of a cluster whose alive members run
// count[kind] of each kind: the one most run, the leader's (leaderKind) on
// a tie, and this node's (mine) when nothing breaks the tie.
func clusterTransport(mine string, count map[string]int, leaderKind string) string {
	cluster, best := mine, count[mine]
	for kind, c := range count {
		if c > best || c == best && kind == leaderKind {
			cluster, best = kind, c
		}
	}
	return cluster
}

// checkTransports finds the alive members whose verbs address is of
// another transport (or libfabric provider) than this node's: an endpoint
// cannot reach them, so a cluster runs on one. mixed keeps them, with the
// address, so that each is reported once. The cluster's transport is the
// one most alive members run, and the Raft leader's on a tie: when that is
// not this node's, this node is the odd one out (it joined a cluster on
// another transport), the error says so, and the node leaves. Otherwise
// the others are the odd ones, and are only logged here (they leave by
// the same rule), so that one misconfigured member, even one that wins an
// election, never makes the others leave.
func (n *Node) checkTransports(v *directory.View, mixed map[ids.NodeID]string) error {
	self := ids.NodeID(n.cfg.ID)
	mine := verbsKind(n.verbs.Addr())
	count := map[string]int{mine: 1}
	addrOf := map[string]string{} // an address of each other kind
	for _, m := range v.Members() {
		if m.ID == self || m.State != directory.StateAlive || m.VerbsAddr == "" {
			continue
		}
		kind := verbsKind(m.VerbsAddr)
		count[kind]++
		if kind == mine {
			delete(mixed, m.ID)
			continue
		}
		addrOf[kind] = m.VerbsAddr
		if mixed[m.ID] != m.VerbsAddr {
			mixed[m.ID] = m.VerbsAddr
			n.log.Error("verbs: a member runs on another transport: a cluster runs on one, and this node does not reach it",
				"peer", m.ID, "peer_transport", kind, "peer_addr", m.VerbsAddr, "transport", mine)
		}
	}
	if len(addrOf) == 0 || n.dir == nil {
		return nil
	}
	leader := n.dir.RaftStats().Leader
	leaderKind := ""
	if a := mixed[leader]; a != "" {
		leaderKind = verbsKind(a)
	} else if leader == self {
		leaderKind = mine
	}
	cluster := clusterTransport(mine, count, leaderKind)
	if cluster == mine {
		return nil
	}
	how := "most alive members run it"
	if count[cluster] == count[mine] {
		how = "the leader runs it"
	}
	return fmt.Errorf("node: this cluster runs its verbs over %s (%s; one of them publishes %s), and this dsmd over %s: every member must run the same --transport (and --ofi-provider)",
		cluster, how, addrOf[cluster], mine)
}
