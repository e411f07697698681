package directory

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/tlsconf"
)

// Config configures one directory replica.
type Config struct {
	// NodeID is this node's id: configured, stable across restarts, unique.
	NodeID ids.NodeID
	// DataDir holds the Raft log and stable store (pebble) and snapshots.
	DataDir string
	// DiskReserve is the size in bytes of the file kept beside the Raft
	// log and deleted when the disk is nearly full, so that the directory
	// keeps working (raftstore's space guard); 0 keeps none.
	DiskReserve int64
	// Nonce identifies this process among the incarnations of NodeID:
	// random and never reused. The daemon passes its verbs transport's
	// (tcp.Transport.Nonce), so that the directory's incarnation and the
	// transport's are one. 0: the directory draws a random one itself.
	// Every Open must use a new nonce: one seen before for this node id is
	// refused as stale (its member updates fail with ErrStaleIncarnation).
	Nonce uint64

	// GossipAddr, RaftAddr and RPCAddr are host:port to bind. They are also
	// the addresses advertised to peers, so they must name a concrete
	// interface (not 0.0.0.0). Port 0 picks a free port; Addrs reports it.
	// A node that restarts from its DataDir should keep its Raft address.
	GossipAddr string
	RaftAddr   string
	RPCAddr    string
	// GRPCAddr and VerbsAddr are published to peers, not used here.
	GRPCAddr  string
	VerbsAddr string

	// Join lists gossip addresses of existing members; any one reachable
	// member is enough. Retried in the background until one answers.
	Join []string
	// BootstrapExpect: wait until this many servers with the same setting
	// are visible in gossip, then the one with the lowest id bootstraps
	// Raft with them as voters. 0: never bootstrap, wait to be added by the
	// leader. Never bootstraps over existing Raft state, its own or a
	// visible peer's.
	BootstrapExpect int
	// MaxVoters is the number of Raft voters the leader maintains: 3
	// (default) or 5; 1 for a single-node cluster. Further members join as
	// non-voters and are promoted when a voter fails or leaves.
	MaxVoters int

	// TLS, when set, makes the Raft transport and the forwarding RPC
	// mutual TLS 1.3 with its certificates: each side must present a
	// node certificate of the cluster CA (a client certificate is
	// refused). A Raft dialer requires the certificate of the member
	// whose Raft address it dials, a follower forwarding to the leader
	// the leader's; the forwarding RPC serves only nodes that the member
	// table or gossip knows. Nil: plain TCP (loopback, tests). Gossip is
	// not covered.
	TLS *tlsconf.Manager

	// GossipKeys turn on gossip encryption: AES keys of 16, 24 or 32
	// bytes, the first the primary. A keyring kept in DataDir (KeyringFile,
	// written whenever the keys change) takes precedence: it holds the keys
	// installed at runtime. Neither: gossip is not encrypted.
	GossipKeys [][]byte

	Timing Timing
	// Logger receives the directory's, Raft's, memberlist's and pebble's
	// messages. nil discards them.
	Logger *slog.Logger
	// Now stamps region creation times; nil means time.Now.
	Now func() time.Time
}

// Timing holds the timeouts. Zero fields take LANTiming's values.
type Timing struct {
	RaftHeartbeat   time.Duration
	RaftElection    time.Duration
	RaftLeaderLease time.Duration
	RaftCommit      time.Duration
	// RaftAppendPatience is how long the leader keeps retrying an
	// AppendEntries to a follower it cannot reach (every 10 to 200 ms)
	// before it reports the failure to Raft, whose own wait before the
	// next attempt doubles with each failure up to 10.24 s: a follower
	// that comes back is then sent the log within 200 ms instead of up to
	// 10.24 s later (directory/patient.go). Negative: no retries.
	RaftAppendPatience time.Duration

	SnapshotInterval  time.Duration
	SnapshotThreshold uint64
	TrailingLogs      uint64

	GossipProbeInterval time.Duration
	GossipProbeTimeout  time.Duration
	GossipInterval      time.Duration
	// GossipSuspicionMult scales how long a suspect has to refute before
	// it is declared dead: GossipSuspicionMult * ProbeInterval at least,
	// GossipSuspicionMaxMult times that at most (shrinking with
	// confirmations from other members).
	GossipSuspicionMult    int
	GossipSuspicionMaxMult int
	// GossipReconnect is how often a replica tries to reach the members
	// gossip declared dead again (a join to their last address): after a
	// partition heals, gossip on each side still holds the other dead and
	// never probes it, so without this the two sides never meet again.
	// A member dead for longer than reconnectFast is tried every
	// reconnectSlow instead.
	GossipReconnect time.Duration

	// ReconcileInterval is how often the leader reconciles gossip with the
	// replicated member table even without events.
	ReconcileInterval time.Duration
	// ReapAfter: an alive member that the leader has not heard of in
	// gossip for this long is marked failed.
	ReapAfter time.Duration
	// RPCTimeout bounds one forwarded call on the leader.
	RPCTimeout time.Duration

	// Leases (docs/failover.md §9, directory/lease.go): every
	// LeasePeriod a replica asks the voters for a grant; a majority's
	// grants keep its lease for LeaseLength·(1-ε) - LeaseRevoke after the
	// request was sent, LeaseRevoke being the time it then has to revoke
	// local access. The leader commits an incarnation's departure only
	// after a majority of voters waited LeaseLength·(1+ε) since their last
	// grant to it, and declares an alive incarnation it has not granted
	// for that long plus one period failed.
	LeasePeriod time.Duration
	LeaseLength time.Duration
	LeaseRevoke time.Duration
}

// LANTiming is tuned for a LAN or loopback: failure detection in about a
// second, leader failover in about one to two (docs/architecture.md has the
// measurements).
func LANTiming() Timing {
	return Timing{
		RaftHeartbeat:   500 * time.Millisecond,
		RaftElection:    500 * time.Millisecond,
		RaftLeaderLease: 250 * time.Millisecond,
		// The commit timeout paces the leader's appends when nothing new
		// is logged: they only tell followers the commit index, which
		// applyLocal announces at once after each command, and retry a
		// follower that fell behind. Shorter, an idle leader wakes every
		// 20-40 ms per follower for nothing (docs/benchmarks.md, idle CPU).
		RaftCommit:         250 * time.Millisecond,
		RaftAppendPatience: 30 * time.Second,

		SnapshotInterval:  30 * time.Second,
		SnapshotThreshold: 4096,
		TrailingLogs:      4096,

		GossipProbeInterval:    200 * time.Millisecond,
		GossipProbeTimeout:     100 * time.Millisecond,
		GossipInterval:         200 * time.Millisecond,
		GossipSuspicionMult:    4,
		GossipSuspicionMaxMult: 4,
		GossipReconnect:        time.Second,

		ReconcileInterval: time.Second,
		ReapAfter:         30 * time.Second,
		RPCTimeout:        5 * time.Second,

		LeasePeriod: 250 * time.Millisecond,
		LeaseLength: 1500 * time.Millisecond,
		LeaseRevoke: 300 * time.Millisecond,
	}
}

func (t Timing) withDefaults() Timing {
	d := LANTiming()
	set := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	set(&t.RaftHeartbeat, d.RaftHeartbeat)
	set(&t.RaftElection, d.RaftElection)
	set(&t.RaftLeaderLease, d.RaftLeaderLease)
	set(&t.RaftCommit, d.RaftCommit)
	set(&t.RaftAppendPatience, d.RaftAppendPatience)
	set(&t.SnapshotInterval, d.SnapshotInterval)
	set(&t.GossipProbeInterval, d.GossipProbeInterval)
	set(&t.GossipProbeTimeout, d.GossipProbeTimeout)
	set(&t.GossipInterval, d.GossipInterval)
	set(&t.GossipReconnect, d.GossipReconnect)
	set(&t.ReconcileInterval, d.ReconcileInterval)
	set(&t.ReapAfter, d.ReapAfter)
	set(&t.RPCTimeout, d.RPCTimeout)
	set(&t.LeasePeriod, d.LeasePeriod)
	set(&t.LeaseLength, d.LeaseLength)
	set(&t.LeaseRevoke, d.LeaseRevoke)
	if t.SnapshotThreshold == 0 {
		t.SnapshotThreshold = d.SnapshotThreshold
	}
	if t.TrailingLogs == 0 {
		t.TrailingLogs = d.TrailingLogs
	}
	if t.GossipSuspicionMult == 0 {
		t.GossipSuspicionMult = d.GossipSuspicionMult
	}
	if t.GossipSuspicionMaxMult == 0 {
		t.GossipSuspicionMaxMult = d.GossipSuspicionMaxMult
	}
	return t
}

// randomNonce draws a random non-zero incarnation nonce.
func randomNonce() uint64 {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			panic("directory: no randomness for the incarnation nonce: " + err.Error())
		}
		if n := binary.LittleEndian.Uint64(b[:]); n != 0 {
			return n
		}
	}
}

func (c Config) withDefaults() (Config, error) {
	if c.NodeID == ids.None {
		return c, fmt.Errorf("%w: zero NodeID", ErrInvalidConfig)
	}
	if c.DataDir == "" {
		return c, fmt.Errorf("%w: no DataDir", ErrInvalidConfig)
	}
	for name, a := range map[string]string{"GossipAddr": c.GossipAddr, "RaftAddr": c.RaftAddr, "RPCAddr": c.RPCAddr} {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			return c, fmt.Errorf("%w: %s %q: %v", ErrInvalidConfig, name, a, err)
		}
		ip := net.ParseIP(host)
		if ip == nil || ip.IsUnspecified() {
			return c, fmt.Errorf("%w: %s %q must be a concrete IP address", ErrInvalidConfig, name, a)
		}
	}
	if c.MaxVoters == 0 {
		c.MaxVoters = 3
	}
	if c.MaxVoters != 1 && c.MaxVoters != 3 && c.MaxVoters != 5 {
		return c, fmt.Errorf("%w: MaxVoters %d (want 1, 3 or 5)", ErrInvalidConfig, c.MaxVoters)
	}
	if c.BootstrapExpect < 0 || c.BootstrapExpect > c.MaxVoters {
		return c, fmt.Errorf("%w: BootstrapExpect %d not in [0, MaxVoters=%d]", ErrInvalidConfig, c.BootstrapExpect, c.MaxVoters)
	}
	for i, k := range c.GossipKeys {
		if err := memberlist.ValidateKey(k); err != nil {
			return c, fmt.Errorf("%w: gossip key %d has %d bytes, want 16, 24 or 32", ErrInvalidConfig, i+1, len(k))
		}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Nonce == 0 {
		c.Nonce = randomNonce()
	}
	c.Timing = c.Timing.withDefaults()
	lp := leaseParams{Period: c.Timing.LeasePeriod, Length: c.Timing.LeaseLength, Revoke: c.Timing.LeaseRevoke}
	if lp.hold() < 2*lp.Period {
		return c, fmt.Errorf("%w: a lease of %v with %v to revoke holds %v after a request, under two periods of %v: raise LeaseLength",
			ErrInvalidConfig, lp.Length, lp.Revoke, lp.hold(), lp.Period)
	}
	return c, nil
}
