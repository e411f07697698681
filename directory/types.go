package directory

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"time"

	"github.com/dsmkit/dsm/directory/placement"
	"github.com/dsmkit/dsm/internal/ids"
)

// Sentinel errors. Those that a forwarded call can return keep their
// identity across the RPC: errors.Is works on the caller's side.
var (
	ErrInvalidRegion  = errors.New("directory: invalid region spec")
	ErrRegionExists   = errors.New("directory: region exists with a different spec")
	ErrNoRegion       = errors.New("directory: no such region")
	ErrTooManyRegions = errors.New("directory: region ids exhausted")
	ErrNoSpace        = errors.New("directory: regions would exceed the address space every node can map")
	ErrPageOutOfRange = errors.New("directory: page out of range")
	ErrNoMembers      = errors.New("directory: no alive members")
	ErrInvalidMember  = errors.New("directory: invalid member")
	ErrNotLeader      = errors.New("directory: not the leader")
	ErrNoLeader       = errors.New("directory: no leader")
	ErrClosed         = errors.New("directory: closed")
	ErrBadCommand     = errors.New("directory: malformed command")
	ErrBadSnapshot    = errors.New("directory: malformed snapshot")
	ErrBadFrame       = errors.New("directory: malformed rpc frame")
	ErrBadMeta        = errors.New("directory: malformed gossip metadata")
	// ErrProtoVersion: gossip metadata of a node that speaks another
	// ProtoVersion (another release).
	ErrProtoVersion  = errors.New("directory: another protocol version")
	ErrInvalidConfig = errors.New("directory: invalid config")
	// ErrStaleIncarnation: a member update carries the nonce of one of the
	// node's earlier incarnations (a late message of a process that has
	// restarted since); it changes nothing.
	ErrStaleIncarnation = errors.New("directory: stale incarnation")
	// ErrNoProtoIDs: every protocol id is taken or quarantined; a new
	// incarnation cannot be admitted.
	ErrNoProtoIDs = errors.New("directory: protocol ids exhausted")
	// ErrStaleCheckpoint refuses a placement checkpoint that is not after
	// the region's current one (RecordCheckpoint).
	ErrStaleCheckpoint = errors.New("directory: stale placement checkpoint")
	// ErrNotFailed refuses to remove a member the directory does not hold
	// failed (RemoveMember).
	ErrNotFailed = errors.New("directory: member is not failed")
	// ErrNoMember names a node that is not in the member table.
	ErrNoMember = errors.New("directory: no such member")
	// ErrDeclaredFailed: the incarnation was declared failed. A verdict is
	// final: its pages moved on, and only a new process (a new
	// incarnation) is admitted again. A voter refuses such an incarnation
	// a lease with it, so a process cut off from the log learns it too.
	ErrDeclaredFailed = errors.New("directory: this incarnation was declared failed")
	// ErrDeparted: the incarnation left the cluster, was removed from it
	// (dsmctl members remove), or another process of the node id took its
	// place; a voter refuses it a lease with it.
	ErrDeparted = errors.New("directory: this incarnation departed from the cluster")
	// ErrGaveUp: the incarnation gave itself up, having asked in vain for
	// a lease for twice the expiry while a leader reached it (a fence at a
	// majority that no departure followed). It matches ErrDeclaredFailed:
	// the incarnation is over, and its process starts a new one.
	ErrGaveUp = fmt.Errorf("%w by itself", ErrDeclaredFailed)
)

// SpecError says which field of a RegionSpec is wrong and why. It matches
// ErrInvalidRegion with errors.Is.
type SpecError struct {
	Field  string
	Reason string
}

func (e *SpecError) Error() string {
	return "directory: invalid region spec: " + e.Field + ": " + e.Reason
}

// Unwrap makes errors.Is(err, ErrInvalidRegion) hold.
func (e *SpecError) Unwrap() error { return ErrInvalidRegion }

// Durability says what Sync promises for a region's pages.
type Durability uint8

const (
	// DurabilitySynced: after Sync, data is persisted at the home and copied
	// to the backups (design.md §5). The default.
	DurabilitySynced Durability = 1 + iota
	// DurabilityMemory: pages live only in memory; a synced page survives a
	// single crash through its backup copies but not a restart of the whole
	// cluster.
	DurabilityMemory
)

func (d Durability) String() string {
	switch d {
	case DurabilitySynced:
		return "synced"
	case DurabilityMemory:
		return "memory"
	}
	return fmt.Sprintf("Durability(%d)", uint8(d))
}

// Limits of a region.
const (
	DefaultPageSize  = 4 << 10
	MinPageSize      = 4 << 10
	MaxPageSize      = 2 << 20
	DefaultShardSize = 2 << 20
	MaxShardSize     = 1 << 30
	// MaxRegionSize is the largest region. Every member maps every
	// region twice in its address space (the page cache's memfd and the
	// home slots, both sparse), and a process that maps it needs as much
	// again: 16 TiB leaves room in the 128 TiB of a 4-level-paging x86-64
	// or arm64 process.
	MaxRegionSize = 16 << 40
	// MaxTotalSize bounds the sum of all regions' sizes, so that every
	// member can map every region at once (about twice this much address
	// space).
	MaxTotalSize   = 32 << 40
	DefaultBackups = 1
	MaxBackups     = 4
	MaxNameLen     = 128
)

// RegionSpec is what a caller asks for. Zero fields take defaults (see
// Normalize).
type RegionSpec struct {
	Name       string
	Size       uint64     // bytes; a multiple of PageSize
	PageSize   uint32     // power of two in [MinPageSize, MaxPageSize]; 0 = DefaultPageSize
	ShardSize  uint64     // bytes of consecutive pages placed together; 0 = max(DefaultShardSize, PageSize)
	Backups    int        // backup homes per shard, 1..MaxBackups; 0 = DefaultBackups
	Durability Durability // 0 = DurabilitySynced
}

// Normalize fills defaults and validates. The returned spec is what the
// directory stores; two specs are the same region if their normalized forms
// are equal.
func (s RegionSpec) Normalize() (RegionSpec, error) {
	if err := validName(s.Name); err != nil {
		return s, err
	}
	if s.PageSize == 0 {
		s.PageSize = DefaultPageSize
	}
	if s.PageSize < MinPageSize || s.PageSize > MaxPageSize || bits.OnesCount32(s.PageSize) != 1 {
		return s, &SpecError{"PageSize", fmt.Sprintf("%d is not a power of two in [%d, %d]", s.PageSize, MinPageSize, MaxPageSize)}
	}
	if s.Size == 0 {
		return s, &SpecError{"Size", "zero"}
	}
	if s.Size > MaxRegionSize {
		return s, &SpecError{"Size", fmt.Sprintf("%s is larger than the largest region, %s", sizeString(s.Size), sizeString(MaxRegionSize))}
	}
	if s.Size%uint64(s.PageSize) != 0 {
		return s, &SpecError{"Size", fmt.Sprintf("%d bytes is not a multiple of the page size (%d bytes)", s.Size, s.PageSize)}
	}
	if s.ShardSize == 0 {
		s.ShardSize = max(DefaultShardSize, uint64(s.PageSize))
	}
	if s.ShardSize < uint64(s.PageSize) || s.ShardSize > MaxShardSize || bits.OnesCount64(s.ShardSize) != 1 {
		return s, &SpecError{"ShardSize", fmt.Sprintf("%d is not a power of two in [page size, %d]", s.ShardSize, MaxShardSize)}
	}
	if s.Backups == 0 {
		s.Backups = DefaultBackups
	}
	if s.Backups < 1 || s.Backups > MaxBackups {
		return s, &SpecError{"Backups", fmt.Sprintf("%d not in [1, %d]", s.Backups, MaxBackups)}
	}
	if s.Durability == 0 {
		s.Durability = DurabilitySynced
	}
	if s.Durability != DurabilitySynced && s.Durability != DurabilityMemory {
		return s, &SpecError{"Durability", s.Durability.String()}
	}
	return s, nil
}

// sizeString writes a byte count in binary units when it is a whole number
// of them ("16 TiB"), in bytes otherwise.
func sizeString(n uint64) string {
	for _, u := range []struct {
		shift uint
		name  string
	}{{50, "PiB"}, {40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", n>>u.shift, u.name)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}

// TotalSize is the sum of the regions' sizes (bounded by MaxTotalSize).
func (v *View) TotalSize() uint64 {
	var t uint64
	for _, r := range v.regions {
		t += r.Size
	}
	return t
}

func validName(n string) error {
	if n == "" {
		return &SpecError{"Name", "empty"}
	}
	if len(n) > MaxNameLen {
		return &SpecError{"Name", fmt.Sprintf("longer than %d bytes", MaxNameLen)}
	}
	if n[0] == '.' || n[0] == '-' {
		return &SpecError{"Name", "starts with '.' or '-'"}
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return &SpecError{"Name", fmt.Sprintf("byte %q at %d outside [A-Za-z0-9._-]", c, i)}
		}
	}
	return nil
}

// Region is one entry of the region table. Regions ids are never reused.
type Region struct {
	ID ids.RegionID
	RegionSpec
	CreatedAt time.Time
	// Homes are the members alive when the region was created, sorted:
	// the nodes among which the coherence engines place the region's
	// pages and their backups (placement.Rank over them, per shard: the
	// shard's chain). They do not change when members come and go: a
	// shard moves along its chain when its home departs (node/placement.go),
	// and nodes that joined later hold no copy (filling one is not built),
	// so they can differ from Placement, which follows the alive members.
	Homes []ids.NodeID `json:",omitempty"`
	// HomeIncarnations[i] is the incarnation of Homes[i] when the region
	// was created (same length as Homes): a later incarnation of the same
	// node does not have its copies.
	HomeIncarnations []uint64 `json:",omitempty"`
	// Epoch is the epoch in which the region was created (0: recorded
	// before it was kept). A failure verdict before it does not make a
	// home incomplete for the region.
	Epoch ids.Epoch `json:",omitempty"`
	// Access says which local users may map, read and write the region;
	// nil: every process allowed on dsmd's socket. Set at creation,
	// changed by SetRegionAccess.
	Access *Access `json:",omitempty"`
	// Filled are the completeness records of the region's replacement
	// backups, in the order they were recorded (RecordFilled): each says
	// that an incarnation holds a complete copy of some shards. The data
	// plane counts one only for departures after it was recorded, and
	// only while the incarnation has not failed, departed or been pushed
	// out of the shard's backups since (node/placement.go). A checkpoint
	// drops the records of the incarnations that had departed by its epoch
	// (Checkpoint); no other record is removed.
	Filled []FillRecord `json:",omitempty"`
	// Promoted are the promotion records of the region, in the order they
	// were committed (Promote): each says that an incarnation, complete
	// for some shards by its fill records, was promoted to take them over
	// in epoch At. The data plane decides which of those shards it homes
	// from then on (docs/failover.md §6, "Promotion in the daemon"); the
	// daemon does not use them yet. A checkpoint drops the records up to
	// its epoch (Checkpoint).
	Promoted []PromoteRecord `json:",omitempty"`
	// Checkpoint is the placement of every shard of the region after every
	// event up to epoch CheckpointAt, as the data plane's walk left it
	// (placement.Checkpoint, encoded; nil: none). The data plane walks
	// from it instead of from the region's creation, and reads no record
	// of an incarnation that had departed by then, nor any promotion up
	// to it: committing one drops those (RecordCheckpoint), so that the
	// records of a long-lived region do not grow with its history.
	Checkpoint   []byte    `json:",omitempty"`
	CheckpointAt ids.Epoch `json:",omitempty"`
}

// PromoteRecord records the promotion of incarnation Incarnation of Node
// (protocol id Proto) for the region's shards in Shards, committed in
// epoch At, which it moved. Every one of those shards was covered by a
// fill record of that incarnation committed before.
type PromoteRecord struct {
	Node        ids.NodeID
	Incarnation uint64
	Proto       ids.NodeID
	At          ids.Epoch
	Shards      []ShardRange
}

// Covers reports whether the record names shard s.
func (p PromoteRecord) Covers(s uint64) bool { return rangesCover(p.Shards, s) }

// FillRecord records that incarnation Incarnation of Node (protocol id
// Proto) holds a complete copy of the region's shards in Shards: its home
// copied every populated page to it in an epoch in which it was a backup
// of them, and every release since writes it.
type FillRecord struct {
	Node        ids.NodeID
	Incarnation uint64
	Proto       ids.NodeID
	// Since is the epoch of the view in which the fills began: the
	// incarnation was a backup of the shards from then on, and was not
	// declared failed after it (the command is refused otherwise).
	Since ids.Epoch
	// At is the epoch in which the record was committed (Since <= At).
	At     ids.Epoch
	Shards []ShardRange
}

// ShardRange is the shards [First, End) of a region.
type ShardRange struct{ First, End uint64 }

// Covers reports whether the record names shard s.
func (f FillRecord) Covers(s uint64) bool { return rangesCover(f.Shards, s) }

// rangesCover reports whether the sorted, disjoint ranges rs hold shard s.
func rangesCover(rs []ShardRange, s uint64) bool {
	i, _ := slices.BinarySearchFunc(rs, s, func(r ShardRange, s uint64) int {
		if r.End <= s {
			return -1
		}
		if r.First > s {
			return 1
		}
		return 0
	})
	return i < len(rs) && rs[i].First <= s && s < rs[i].End
}

// maxFillRanges bounds the shard ranges of one record.
const maxFillRanges = 4096

// validShardRanges checks that rs are non-empty, sorted, apart and below
// n (n == 0: no bound).
func validShardRanges(rs []ShardRange, n uint64) error {
	if len(rs) == 0 || len(rs) > maxFillRanges {
		return fmt.Errorf("%w: %d shard ranges", ErrBadCommand, len(rs))
	}
	for i, r := range rs {
		if r.First >= r.End || (n != 0 && r.End > n) || (i > 0 && rs[i-1].End >= r.First) {
			return fmt.Errorf("%w: shard range [%d, %d) empty, out of order or beyond the region", ErrBadCommand, r.First, r.End)
		}
	}
	return nil
}

// HomeIncarnation returns the incarnation that home h had when the region
// was created, and false if h is not one of its homes.
func (r Region) HomeIncarnation(h ids.NodeID) (uint64, bool) {
	i, ok := slices.BinarySearch(r.Homes, h)
	if !ok || i >= len(r.HomeIncarnations) {
		return 0, false
	}
	return r.HomeIncarnations[i], true
}

// Pages is the number of pages of the region.
func (r Region) Pages() uint64 { return r.Size / uint64(r.PageSize) }

// PagesPerShard is the number of consecutive pages placed together.
func (r Region) PagesPerShard() uint64 { return r.ShardSize / uint64(r.PageSize) }

// Shards is the number of shards of the region.
func (r Region) Shards() uint64 { return (r.Pages() + r.PagesPerShard() - 1) / r.PagesPerShard() }

// ShardOf returns the shard holding page p.
func (r Region) ShardOf(p ids.PageNo) placement.Shard {
	return placement.Shard{Region: r.ID, Index: uint64(p) / r.PagesPerShard()}
}

// MemberState is a member's standing in the directory.
type MemberState uint8

const (
	// StateAlive: reachable; takes part in placement.
	StateAlive MemberState = 1 + iota
	// StateSuspect: gossip doubts the member. Never written to the
	// replicated table (it would churn epochs); reported by LocalMembers.
	StateSuspect
	// StateLeft: left gracefully; no longer placed, not in Raft.
	StateLeft
	// StateFailed: declared dead by failure detection; no longer placed,
	// removed from Raft. It becomes alive again if it comes back.
	StateFailed
)

func (s MemberState) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateSuspect:
		return "suspect"
	case StateLeft:
		return "left"
	case StateFailed:
		return "failed"
	}
	return fmt.Sprintf("MemberState(%d)", uint8(s))
}

// MaxProtoID is the largest protocol id: coherence.MaxNodeID, the largest
// node id the coherence word can name (the directory does not import the
// protocol core; a test checks that the two agree).
const MaxProtoID ids.NodeID = 1022

// maxPastNonces bounds Member.PastNonces.
const maxPastNonces = 64

// Member is one node as the directory knows it: the node id and its
// current incarnation.
//
// A node id is configured and stable across restarts; each process that
// holds it is a new incarnation, told apart by its random Nonce. The first
// record of a node id is incarnation 1; every record with another nonce
// (a restart, whether or not the old process was ever marked failed) is the
// next incarnation, with a fresh protocol id, in one command and one epoch.
// The old incarnation's protocol id goes to the quarantine (View.Quarantine)
// and is not given out again.
type Member struct {
	ID        ids.NodeID
	GRPCAddr  string // the node's gRPC service
	VerbsAddr string // where peers reach its registered memory
	RaftAddr  string // its Raft transport
	RPCAddr   string // its directory forwarding port
	State     MemberState
	// Incarnation counts the processes that have held this node id, from 1.
	// Assigned by the directory; ignored in a put.
	Incarnation uint64 `json:",omitempty"`
	// Nonce is the incarnation's random, non-zero nonce (the verbs
	// transport's, passed in Config.Nonce). 0 only in a record restored
	// from a version 1 snapshot or created by a command of that version
	// replayed from an old log: unknown, and the first nonce seen for it is
	// adopted without a new incarnation.
	Nonce uint64 `json:",omitempty"`
	// Proto is the incarnation's protocol id, 1..MaxProtoID: the id the
	// coherence protocol names it by. Unique among the members and the
	// quarantined ids. Assigned by the directory; ignored in a put. 0 (none
	// yet) only for a record from before incarnations whose node id is
	// above MaxProtoID, until its first nonce.
	Proto ids.NodeID `json:",omitempty"`
	// PastNonces are the nonces of the node's earlier incarnations (the
	// last 64, oldest first): an update that carries one of them is stale
	// and refused, so a late message of a dead process never makes a new
	// incarnation. Assigned by the directory; ignored in a put.
	PastNonces []uint64 `json:",omitempty"`
	// Descriptors are the registered-memory descriptors peers need to reach
	// the member's home pages. Opaque to the directory; set by the member
	// itself with SetLocalMeta. A new incarnation never inherits them.
	Descriptors []byte
	// Epoch is the epoch in which this record last changed.
	Epoch ids.Epoch
	// FailedAt and LastFailedAt are the epochs in which the failure
	// detector first and last declared this incarnation failed, and
	// Failures how many times (0: never). A verdict is final (the
	// incarnation departs from the data plane: DepartedAt), so the two are
	// equal. A log or snapshot of an earlier release may hold an incarnation that came back alive after
	// verdicts; the data plane does not count it as a complete backup copy
	// of a region that existed then (docs/failover.md §7). Assigned by the
	// directory; ignored in a put.
	FailedAt     ids.Epoch `json:",omitempty"`
	LastFailedAt ids.Epoch `json:",omitempty"`
	Failures     uint32    `json:",omitempty"`
	// Draining: the incarnation is leaving gracefully (SIGTERM): it writes
	// back what its clients wrote and then leaves. It is alive meanwhile,
	// in every respect. Set by the member with SetDraining; ignored in a
	// put.
	Draining bool `json:",omitempty"`
	// DrainingAt is the epoch in which the incarnation was marked draining
	// for a hand-over (SetDraining of this version; 0: never, or marked
	// by a version before hand-overs): from then on the data plane places
	// no shard and no new backup copy at it, its shards are promoted to
	// other members, and it stays in the replica sets it is in until it
	// departs (node/placement.go, docs/failover.md §11). Kept when it
	// departs, and into the quarantine. Assigned by the directory;
	// ignored in a put.
	DrainingAt ids.Epoch `json:",omitempty"`
	// JoinedAt is the epoch in which this incarnation was first recorded
	// (0: before it was kept). A join can push a replacement backup out
	// of a shard's backups (node/placement.go). Assigned by the
	// directory; ignored in a put.
	JoinedAt ids.Epoch `json:",omitempty"`
}

// DepartedAt is the epoch in which this incarnation departed from the
// data plane (0: it has not): that of its failure verdict, which is final
// (the process is admitted again only as a new incarnation), or, for one
// that left without a verdict, that of its leave.
func (m Member) DepartedAt() ids.Epoch {
	if m.State != StateFailed && m.State != StateLeft {
		return 0
	}
	if m.Failures > 0 && m.LastFailedAt != 0 {
		return m.LastFailedAt
	}
	return max(m.Epoch, 1)
}

func (m Member) clone() Member {
	m.Descriptors = slices.Clone(m.Descriptors)
	m.PastNonces = slices.Clone(m.PastNonces)
	return m
}

func (m Member) sameAddrs(o Member) bool {
	return m.GRPCAddr == o.GRPCAddr && m.VerbsAddr == o.VerbsAddr && m.RaftAddr == o.RaftAddr && m.RPCAddr == o.RPCAddr
}

func (m Member) validate() error {
	if m.ID == ids.None {
		return fmt.Errorf("%w: zero id", ErrInvalidMember)
	}
	if m.State < StateAlive || m.State > StateFailed {
		return fmt.Errorf("%w: state %v", ErrInvalidMember, m.State)
	}
	for _, a := range []string{m.GRPCAddr, m.VerbsAddr, m.RaftAddr, m.RPCAddr} {
		if len(a) > 256 {
			return fmt.Errorf("%w: address longer than 256 bytes", ErrInvalidMember)
		}
	}
	if len(m.Descriptors) > maxDescriptors {
		return fmt.Errorf("%w: %d bytes of descriptors exceed %d", ErrInvalidMember, len(m.Descriptors), maxDescriptors)
	}
	if len(m.PastNonces) > maxPastNonces {
		return fmt.Errorf("%w: %d past nonces exceed %d", ErrInvalidMember, len(m.PastNonces), maxPastNonces)
	}
	return nil
}

// Quarantined is a protocol id that no incarnation holds any more and that
// is not given out again (until the homes' scrubs can release it,
// docs/failover.md §2: for now, never).
type Quarantined struct {
	Proto ids.NodeID
	// LeftAt is the epoch from which its incarnation is no member: that
	// of the command that retired the id (a restart), or of its leave.
	LeftAt ids.Epoch
	// Node and Incarnation say whose id it was.
	Node        ids.NodeID
	Incarnation uint64
	// FailedAt, LastFailedAt, Failures, JoinedAt and DrainingAt are the
	// incarnation's when it departed.
	FailedAt     ids.Epoch `json:",omitempty"`
	LastFailedAt ids.Epoch `json:",omitempty"`
	Failures     uint32    `json:",omitempty"`
	JoinedAt     ids.Epoch `json:",omitempty"`
	DrainingAt   ids.Epoch `json:",omitempty"`
}

// ProtoMember is one coherence member of an epoch: an incarnation and its
// protocol id.
type ProtoMember struct {
	Node        ids.NodeID
	Incarnation uint64
	Proto       ids.NodeID
	State       MemberState
}

// EpochRecord is the member set of one epoch.
type EpochRecord struct {
	Epoch ids.Epoch
	// Members are the epoch's coherence members (today: the alive ones),
	// sorted by node id.
	Members []ProtoMember
}

// historyLen is how many epochs a View keeps (View.History).
const historyLen = 64

const maxDescriptors = 64 << 10

// Placement is where one page lives.
type Placement struct {
	Epoch   ids.Epoch
	Shard   placement.Shard
	Home    ids.NodeID
	Backups []ids.NodeID // in failover order; may be shorter than asked if few members are alive
}

// View is an immutable snapshot of the replicated directory, as applied on
// this node. Views are shared between the directory and every reader: never
// modify one (its exported fields included). Every method is safe for
// concurrent use.
type View struct {
	Epoch ids.Epoch
	// Index is the Raft index of the last command applied to this view.
	Index      uint64
	nextRegion ids.RegionID
	members    []Member             // sorted by ID
	regions    []Region             // sorted by Name
	byID       map[ids.RegionID]int // index into regions
	alive      []ids.NodeID
	quarantine []Quarantined // in the order the ids were retired
	history    []EpochRecord // the last historyLen epochs, oldest first; the last is Epoch's
	promotions uint64        // promotion records ever committed (deleted regions' too)
	drains     uint64        // drain marks ever made (Member.DrainingAt)
}

// Promotions is the number of promotion records ever committed, those of
// regions deleted since included: it only grows, so the data plane can
// count it in its protocol epoch.
func (v *View) Promotions() uint64 { return v.promotions }

// Drains is the number of drain marks ever made (Member.DrainingAt): it
// only grows, so the data plane can count it in its protocol epoch (a mark
// changes the placement).
func (v *View) Drains() uint64 { return v.drains }

// setRegions installs rs (sorted by name) and its id index.
func (v *View) setRegions(rs []Region) {
	v.regions = rs
	v.byID = make(map[ids.RegionID]int, len(rs))
	for i, r := range rs {
		v.byID[r.ID] = i
	}
}

// Members returns the member table sorted by id (a copy).
func (v *View) Members() []Member {
	out := slices.Clone(v.members)
	for i := range out {
		out[i] = out[i].clone()
	}
	return out
}

// Member returns one member.
func (v *View) Member(id ids.NodeID) (Member, bool) {
	i, ok := slices.BinarySearchFunc(v.members, id, func(m Member, id ids.NodeID) int { return cmpID(m.ID, id) })
	if !ok {
		return Member{}, false
	}
	return v.members[i].clone(), true
}

// ByProto returns the member whose current incarnation holds protocol id
// p, and false if none does (p is free or quarantined).
func (v *View) ByProto(p ids.NodeID) (Member, bool) {
	if p == ids.None {
		return Member{}, false
	}
	for _, m := range v.members {
		if m.Proto == p {
			return m.clone(), true
		}
	}
	return Member{}, false
}

// Quarantine returns the retired protocol ids, in the order they were
// retired (a copy).
func (v *View) Quarantine() []Quarantined { return slices.Clone(v.quarantine) }

// ProtoIDsLeft is how many protocol ids can still be given to new
// incarnations: ids are not reused yet, so a cluster sees at most
// MaxProtoID incarnations over its life.
func (v *View) ProtoIDsLeft() int {
	n := int(MaxProtoID) - len(v.quarantine)
	for _, m := range v.members {
		if m.Proto != ids.None {
			n--
		}
	}
	return n
}

// History returns the member sets of the epochs after `after`, oldest
// first, as far as the view keeps them (the last 64 epochs; the last
// record is the view's epoch). A caller that followed the epochs up to
// `after` has missed some when the first record's epoch is not after+1.
// The records are shared: do not modify them.
func (v *View) History(after ids.Epoch) []EpochRecord {
	i, _ := slices.BinarySearchFunc(v.history, after, func(r EpochRecord, e ids.Epoch) int {
		switch {
		case r.Epoch <= e:
			return -1
		}
		return 1
	})
	return slices.Clone(v.history[i:])
}

// Alive returns the ids of alive members, sorted: the placement candidates.
func (v *View) Alive() []ids.NodeID { return slices.Clone(v.alive) }

// Regions returns the region table sorted by name (a copy).
func (v *View) Regions() []Region { return slices.Clone(v.regions) }

// Region looks a region up by name.
func (v *View) Region(name string) (Region, bool) {
	i, ok := slices.BinarySearchFunc(v.regions, name, func(r Region, n string) int { return cmpStr(r.Name, n) })
	if !ok {
		return Region{}, false
	}
	return v.regions[i], true
}

// RegionByID looks a region up by id.
func (v *View) RegionByID(id ids.RegionID) (Region, bool) {
	i, ok := v.byID[id]
	if !ok {
		return Region{}, false
	}
	return v.regions[i], true
}

// Placement returns the home and backups of page p of region r in this view.
func (v *View) Placement(r ids.RegionID, p ids.PageNo) (Placement, error) {
	reg, ok := v.RegionByID(r)
	if !ok {
		return Placement{}, fmt.Errorf("%w: %v", ErrNoRegion, r)
	}
	if uint64(p) >= reg.Pages() {
		return Placement{}, fmt.Errorf("%w: %v of %v has %d pages", ErrPageOutOfRange, p, r, reg.Pages())
	}
	return v.ShardPlacement(reg.ShardOf(p), reg.Backups)
}

// ShardPlacement returns the home and up to backups backups of shard s.
func (v *View) ShardPlacement(s placement.Shard, backups int) (Placement, error) {
	if len(v.alive) == 0 {
		return Placement{}, ErrNoMembers
	}
	rank := placement.Rank(s, v.alive, 1+backups)
	return Placement{Epoch: v.Epoch, Shard: s, Home: rank[0], Backups: rank[1:]}, nil
}

func cmpID(a, b ids.NodeID) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
