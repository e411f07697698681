package directory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/dsmkit/dsm/internal/ids"
)

// ProtoVersion is the version of the protocols between dsmd nodes (gossip
// metadata, directory RPC, Raft commands, coherence messages) that this
// build speaks. A node admits into its directory only the nodes that
// gossip the same version: nodes of two releases whose protocols differ
// never form one cluster (docs/operations.md, Upgrade). Raise it with any
// change that a node of the previous release would misread. Version 0 is
// the releases before the field existed (they refuse metadata with it).
// Version 2: Member.FailedAt and the data plane's chains (homes move to
// backups, releases write backups). Version 3: leases (the lease and
// fence exchanges of the directory RPC; a departure waits for a fence).
// Version 4: promotion records (a Raft command and region records that
// version 3 does not decode), and a protocol epoch that counts them.
// Version 5: the data plane places shards by promotion records and extra
// backups (node/placement.go), a promotion repeated after another
// member's is applied again, and durable regions' persist messages.
// Version 6: a promotion record of a shard whose home departed with no
// complete member brings it back (node/placement.go, revive: a durable
// region's from a page store, a memory region's empty), which version 5
// ignores, and Region.contents_lost in the gRPC messages.
// Version 7: placement checkpoints (a Raft command that version 6 does not
// decode, and records it drops that version 6 would still walk).
// Version 8: drain marks (Member.DrainingAt, counted in the protocol
// epoch): a draining member's shards are handed over before it leaves,
// and promotions of a shard's creation backups without a fill record.
// Version 9: the Clearing flag of the coherence epoch acknowledgement (a
// member that entered replica sets anew clears its slots of them before
// their fills, docs/failover.md §7), which version 8 refuses as a
// malformed message.
const ProtoVersion = 9

// nodeMeta is what a node gossips about itself (memberlist node metadata,
// at most memberlist.MetaMaxSize bytes).
type nodeMeta struct {
	// Proto is the node's ProtoVersion. Releases without the field refuse
	// the metadata of those with it (unknown field), and the others refuse
	// theirs (version 0): each side logs the other as of another release.
	Proto     int        `json:"proto"`
	ID        ids.NodeID `json:"id"`
	GRPCAddr  string     `json:"grpc,omitempty"`
	VerbsAddr string     `json:"verbs,omitempty"`
	RaftAddr  string     `json:"raft"`
	RPCAddr   string     `json:"rpc"`
	// Expect is the node's bootstrap-expect (0: it never bootstraps).
	Expect int `json:"expect,omitempty"`
	// HasState is set once the node holds Raft state: a cluster exists and
	// nobody may bootstrap another one.
	HasState bool `json:"state,omitempty"`
	// Nonce is this process's incarnation nonce (Config.Nonce), never 0.
	// Nodes of versions without it cannot gossip with this one: each side
	// refuses the other's metadata.
	Nonce uint64 `json:"nonce"`
}

func encodeMeta(m nodeMeta) []byte {
	b, err := json.Marshal(m)
	if err != nil {
		panic("directory: encode meta: " + err.Error())
	}
	return b
}

// decodeMeta parses gossip metadata received from the network.
func decodeMeta(b []byte) (nodeMeta, error) {
	var m nodeMeta
	if len(b) > memberlist.MetaMaxSize {
		return m, fmt.Errorf("%w: %d bytes", ErrBadMeta, len(b))
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nodeMeta{}, fmt.Errorf("%w: %v", ErrBadMeta, err)
	}
	if dec.More() {
		return nodeMeta{}, fmt.Errorf("%w: trailing data", ErrBadMeta)
	}
	if m.Proto != ProtoVersion {
		return nodeMeta{ID: m.ID, Proto: m.Proto}, fmt.Errorf("%w: node %v speaks gossip protocol version %d, this node speaks %d", ErrProtoVersion, m.ID, m.Proto, ProtoVersion)
	}
	if m.ID == ids.None || m.RaftAddr == "" || m.RPCAddr == "" || m.Expect < 0 || m.Expect > 7 || m.Nonce == 0 {
		return nodeMeta{}, fmt.Errorf("%w: id %v raft %q rpc %q expect %d nonce %#x", ErrBadMeta, m.ID, m.RaftAddr, m.RPCAddr, m.Expect, m.Nonce)
	}
	if err := m.member().validate(); err != nil {
		return nodeMeta{}, fmt.Errorf("%w: %v", ErrBadMeta, err)
	}
	return m, nil
}

func (m nodeMeta) member() Member {
	return Member{ID: m.ID, GRPCAddr: m.GRPCAddr, VerbsAddr: m.VerbsAddr, RaftAddr: m.RaftAddr, RPCAddr: m.RPCAddr, State: StateAlive, Nonce: m.Nonce}
}

func nodeName(id ids.NodeID) string { return strconv.FormatUint(uint64(id), 10) }

// gossipState is what gossip says about one node.
type gossipState uint8

const (
	gossipAlive gossipState = 1 + iota
	gossipDead
	gossipLeft
)

type gossipEntry struct {
	meta  nodeMeta
	state gossipState
	addr  string // gossip address
}

type gossipEvent struct {
	entry gossipEntry
}

// gossip is the memberlist delegate. Its callbacks only append to a queue
// and signal; they never block memberlist.
type gossip struct {
	meta atomic.Pointer[nodeMeta]

	mu      sync.Mutex
	queue   []gossipEvent
	signal  chan struct{}
	dropped atomic.Uint64 // events whose metadata did not decode

	log *slog.Logger
	// refused is, per memberlist node name, the protocol version for which
	// the node was last logged as refused (so that it is logged once, not
	// on every update); guarded by mu.
	refused map[string]int

	// members is the latest gossip state per node, kept by the directory's
	// run loop from the queue; guarded by mu.
	members map[ids.NodeID]gossipEntry
	// seen is when each node last answered a probe or sent an update, by
	// memberlist node name; guarded by mu.
	seen map[string]time.Time

	// onMsg receives user messages (keyring operations); set before
	// memberlist starts.
	onMsg func([]byte)
}

func newGossip(m nodeMeta, log *slog.Logger) *gossip {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m.Proto = ProtoVersion
	g := &gossip{signal: make(chan struct{}, 1), members: map[ids.NodeID]gossipEntry{}, seen: map[string]time.Time{},
		log: log, refused: map[string]int{}}
	g.meta.Store(&m)
	return g
}

// NodeMeta implements memberlist.Delegate.
func (g *gossip) NodeMeta(limit int) []byte {
	b := encodeMeta(*g.meta.Load())
	if len(b) > limit {
		return nil
	}
	return b
}

// NotifyMsg implements memberlist.Delegate: user messages.
func (g *gossip) NotifyMsg(b []byte) {
	if g.onMsg != nil {
		g.onMsg(b)
	}
}

func (g *gossip) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (g *gossip) LocalState(join bool) []byte                { return nil }
func (g *gossip) MergeRemoteState(buf []byte, join bool)     {}

func (g *gossip) NotifyJoin(n *memberlist.Node)   { g.push(n, gossipAlive) }
func (g *gossip) NotifyUpdate(n *memberlist.Node) { g.push(n, gossipAlive) }
func (g *gossip) NotifyLeave(n *memberlist.Node) {
	st := gossipDead
	if n.State == memberlist.StateLeft {
		st = gossipLeft
	}
	g.push(n, st)
}

// NotifyPingComplete implements memberlist.PingDelegate: a probe of n was
// answered.
func (g *gossip) NotifyPingComplete(n *memberlist.Node, _ time.Duration, _ []byte) {
	g.mu.Lock()
	g.seen[n.Name] = time.Now()
	g.mu.Unlock()
}

// AckPayload implements memberlist.PingDelegate; probes carry nothing.
func (g *gossip) AckPayload() []byte { return nil }

// lastSeen is when node id last answered a probe or sent an update (zero
// if never).
func (g *gossip) lastSeen(id ids.NodeID) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seen[nodeName(id)]
}

func (g *gossip) push(n *memberlist.Node, st gossipState) {
	m, err := decodeMeta(n.Meta)
	if errors.Is(err, ErrProtoVersion) {
		g.refuse(n, m.Proto, err)
	}
	if err != nil || nodeName(m.ID) != n.Name {
		g.dropped.Add(1)
		return
	}
	g.mu.Lock()
	g.queue = append(g.queue, gossipEvent{entry: gossipEntry{meta: m, state: st, addr: n.Address()}})
	if st == gossipAlive {
		g.seen[n.Name] = time.Now()
	}
	g.mu.Unlock()
	select {
	case g.signal <- struct{}{}:
	default:
	}
}

// refuse logs, once per node and version, that n gossips another protocol
// version: it never enters the directory.
func (g *gossip) refuse(n *memberlist.Node, proto int, err error) {
	g.mu.Lock()
	v, logged := g.refused[n.Name]
	g.refused[n.Name] = proto
	g.mu.Unlock()
	if logged && v == proto {
		return
	}
	g.log.Error("directory: refusing a node of another release: "+err.Error()+"; nodes of two releases cannot form one cluster (docs/operations.md, Upgrade)",
		"peer", n.Name, "gossip", n.Address(), "peer_proto", proto, "proto", ProtoVersion)
}

// drain applies queued events to the member map and reports whether there
// were any.
func (g *gossip) drain() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	q := g.queue
	g.queue = nil
	for _, e := range q {
		g.members[e.entry.meta.ID] = e.entry
	}
	return len(q) > 0
}

// mark records st for id as if gossip had said it, after every event
// already queued: a leave confirmed over RPC is not undone by an older
// "alive" still waiting in the queue.
func (g *gossip) mark(id ids.NodeID, st gossipState) {
	g.drain()
	g.mu.Lock()
	defer g.mu.Unlock()
	if e, ok := g.members[id]; ok {
		e.state = st
		g.members[id] = e
	}
}

func (g *gossip) snapshot() map[ids.NodeID]gossipEntry {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[ids.NodeID]gossipEntry, len(g.members))
	for k, v := range g.members {
		out[k] = v
	}
	return out
}

func (g *gossip) lookup(id ids.NodeID) (gossipEntry, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e, ok := g.members[id]
	return e, ok
}
