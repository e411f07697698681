package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"slices"
	"strings"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/mem"
)

// Options is one configuration of the simulator.
type Options struct {
	Nodes    int // 2..64 (up to coherence.MaxNodeID)
	Pages    int // pages in play, page p homed on node p%H+1, H = (Pages+1)/2
	PageSize int // bytes, a multiple of 8 (default 16)
	Ops      int // local requests issued before the run settles
	// Hot sends every request to page 0: all nodes hammer one page.
	Hot bool
	// Faults drops batches and messages and duplicates messages during
	// the workload phase.
	Faults bool
	// Crashes is the number of nodes that crash, homes only as allowed by
	// HomeCrashes (each crash is followed, some steps later, by the
	// reconfiguration that removes the node).
	Crashes int
	// HomeCrashes lets that many of the crashes hit home nodes: their
	// pages move to a new home, which rebuilds the words from the
	// survivors' reports; the page data comes from the backup (the old
	// home copy as it was at the crash: every write-back is taken to be
	// synced).
	HomeCrashes int
	// UnknownOutcomes makes the network (with Faults, during the
	// workload phase) report some batches as of unknown outcome
	// (rdma.ErrOutcomeUnknown): all of the batch executed, a prefix of it,
	// or none. The completion carries made-up results of the right shape,
	// which the state machine must ignore: only its resolution of the
	// outcome (a READ of the word) may act on such a batch.
	UnknownOutcomes bool
	// AsyncReconfig hands a reconfiguration to the live nodes one by one,
	// at random later steps, as a directory's replicas learn it, instead
	// of to all of them in one step.
	AsyncReconfig bool
	// LearnOdds: with AsyncReconfig, a step hands the epoch to one
	// lagging node with probability 1/LearnOdds (default 8). Larger odds
	// keep nodes in old epochs for longer, next to nodes that act in the
	// new one.
	LearnOdds int
	// Evict lets clients evict pages.
	Evict bool
	// Mutex makes every client run lock / increment / unlock on a
	// mutex built on CAS (page 0, word 0 is the lock, word 1 the
	// counter) instead of random accesses.
	Mutex bool
	// LazyHomes gives the state machines no HomedPages: a home creates a
	// page's duty when a starving node first queues for it or a node asks
	// it to repair a word naming a departed node (MsgStamp), as dsmd does
	// for sparse regions. The home slots start as dsmd's do: zero, never
	// touched (the zero word is InitialWord only in epochs that are
	// multiples of 16). A reconfiguration repairs only the duties a home
	// has; other words are used by the trust rule and stamped on demand.
	LazyHomes bool
	// Joins is the number of nodes that join during the workload, each
	// in an epoch of its own that adds it (members only, not homes: a
	// joiner is created as dsmd creates an engine for a new member, with
	// the current epoch and members, Config.Joining). Their ids follow
	// 1..Nodes. With AsyncReconfig a join may come while nodes still lag
	// behind an earlier epoch (they skip one).
	Joins int
	// Restarts is the number of the Crashes that are restarts: the
	// reconfiguration that removes the crashed id also adds a new id (a
	// new incarnation), which takes the crashed node's place as a client;
	// the crashed id never comes back.
	Restarts int
	// Epoch is the first epoch (default 1).
	Epoch ids.Epoch
	// EmptyEpochs is the number of reconfigurations that change nothing
	// (the same members), spread between the requests of the workload, so
	// that 4-bit tags wrap.
	EmptyEpochs int
	// Linearizability checks the recorded history with porcupine.
	Linearizability bool
	// Backups is the number of backups of every page (each release writes
	// its data and stamp to them; a crashed home's pages move to their
	// first live backup that is not tainted). 0: as many as Crashes plus
	// Taints when HomeCrashes is set (a promotable copy always survives),
	// else none; negative: none (then a crashed home's pages move to a
	// random first-epoch node whose slot gets the old home copy, a
	// stand-in for a backup).
	Backups int
	// SlowSlots reconfigures with SlotsPending: each new home of moved
	// pages learns that its slots are ready (SlotsReady) at a random later
	// step, as dsmd's node layer prepares them, and completes no move
	// before.
	SlowSlots bool
	// SkipMoves lets crashes (of homes too) and their reconfigurations,
	// and joins, come while nodes still lag behind earlier epochs: a
	// lagging node learns only the latest epoch and skips those between,
	// moves included, as dsmd's coalesced directory views do. Its
	// Reconfigure is the latest placement and backups, with the Targets
	// computed for that node: the new homes of the pages whose home
	// differs from the placement of the last epoch it learnt.
	SkipMoves bool
	// Taints is the number of reconfigurations, during the workload,
	// that keep the members and drop one live node from the backups of
	// every page from then on, as dsmd does for a member its failure
	// detector declared failed (it may be alive behind a partition). A
	// tainted node stays a member, a client and a home of the pages it
	// has, but is never promoted: it missed backup writes. With Backups
	// 0 and home crashes, every page has Crashes+Taints backups.
	Taints int
	// Fills keeps every page at Backups backups (docs/failover.md §6): a
	// backup that crashes, or is promoted to home, is replaced, at the
	// reconfiguration that removes or promotes it, by a live node that is
	// neither the page's home nor its backup (the newest id first: a
	// restarted node's new incarnation, a joiner). The replacement is
	// incomplete until the page's home reports it filled: the driver,
	// playing the node layer, gives the home a coherence.Fill for it once
	// the home has learnt the epoch (again after a fill given up), and
	// promotes only complete backups. A crash comes only when every page
	// keeps a complete live copy without the victim, and, unless
	// MidFillCrashes, only when no fill is under way (one node lost at a
	// time). A taint (Taints) takes the tainted node out of every backup
	// set at once and replaces it: the backups change without a departure,
	// so nodes that lag behind the taint still write the tainted node and
	// not its replacement (what a fill's fence is for). Needs Backups > 0.
	Fills bool
	// MidFillCrashes lets crashes (of homes, backups being filled and
	// any client) come while fills are under way.
	MidFillCrashes bool
	// Promotions (with Fills) is the number of moves away from a live
	// home during the workload (docs/protocol.md, "Moves from live
	// homes"): a page's first complete backup becomes its home in a new
	// epoch without a departure, and the old home is demoted to its first
	// backup. The old home's slot stays where lagging members' verbs
	// reach it; at a random step after the old home learnt the epoch, the
	// driver, playing its node layer, turns the slot's word into a stamp.
	Promotions int
	// Persists is the number of Persist events (docs/durability.md §2)
	// given during the workload, each for one page, to its home (three in
	// four) or to another live node (which must give it up). Every copy
	// reported must be the page's latest data and its home word's version.
	Persists int
	// Drains (with Fills) is the number of graceful leaves during the
	// workload (docs/failover.md §11): a live node is marked draining in
	// an epoch of its own; from then on its client issues nothing new,
	// it is never made a backup or promoted (unless it is a page's only
	// complete copy left), and the driver, playing dsmd's hand-over,
	// evicts every page it holds Modified and moves every page it homes
	// to a complete backup (a move away from a live home). Once it holds
	// and homes nothing, every member has learnt the latest epoch and
	// every backup but itself is complete, it departs. Its departure must revert nothing:
	// a leave that loses a write fails the run.
	Drains int
	// Partitions is the number of partitions under leases
	// (docs/failover.md §9): a live node is suspended (its lease ended:
	// its client issues nothing more, its engine runs on), removed some
	// steps later while it lives (a zombie: departed for every member
	// that learnt the epoch, its verbs executed by those that have not,
	// refused by those that have; the pages it homes move to complete
	// backups), and closed later still, when a new incarnation joins. The
	// pages it held are decided when their homes' words stop naming it,
	// or when their new homes rebuild them: its last write or the home
	// copy, nothing else. Needs Fills.
	Partitions int
	// CrashPartial (with Crashes) aims the crashes: a node whose batch
	// of unknown outcome executed in part (a backup write that landed its
	// stamp and not its data, say) is the next node to crash, as soon as
	// a crash may come and it may be lost. A dead releaser's partial
	// write, which random crashes seldom meet, is then common
	// (docs/failover.md §7, "Data beside a word never written").
	CrashPartial bool
	// UnsafeLease (with Partitions) breaks the lease on purpose: the
	// partitioned node's client goes on after its removal. The checks
	// must catch it (TestSimCatchesUnsafeLease).
	UnsafeLease bool
	// SplitReads makes every READ of more than 8 bytes (a page, a whole
	// slot) execute at two moments (mem.SplitReads): its last bytes when
	// its batch is delivered, the rest of the batch when a later step
	// delivers the rest, as a NIC or Go's copy may read. Other deliveries
	// (a release's WRITE and CAS) may run between the two. With
	// UnknownOutcomes, a split batch drawn to execute whole with its
	// answer lost executes its first part only, and its rest completes
	// as any batch does.
	SplitReads bool
	// EarlyPromote (with Fills) breaks the rule on purpose: a crashed
	// home's pages move to the first live backup, complete or not. The
	// checks must catch it (TestSimCatchesEarlyPromotion).
	EarlyPromote bool
	// LeaveHolding (with Drains) breaks the rule on purpose: a draining
	// node departs without writing back what it holds Modified, and the
	// driver's own check at its departure is off. The data checks must
	// catch the writes it takes with it (TestSimCatchesLeaveHolding).
	LeaveHolding bool
	// SettleSteps bounds the steps after the workload and the faults stop
	// in which every request must complete (default 200000).
	SettleSteps int
	// Trace records every step (used to print the trace of a failure).
	Trace bool
}

func (o *Options) norm() error {
	if o.Nodes < 2 || o.Nodes+o.Joins+o.Restarts+o.Partitions > coherence.MaxNodeID {
		return fmt.Errorf("sim: %d nodes, %d joins, %d restarts", o.Nodes, o.Joins, o.Restarts)
	}
	if o.Pages < 1 || o.Pages > o.Nodes {
		return fmt.Errorf("sim: %d pages for %d nodes", o.Pages, o.Nodes)
	}
	if o.PageSize == 0 {
		o.PageSize = 16
	}
	if o.PageSize%8 != 0 || o.PageSize < 16 {
		return fmt.Errorf("sim: page size %d", o.PageSize)
	}
	if o.SettleSteps == 0 {
		o.SettleSteps = 200000
	}
	if o.Epoch == 0 {
		o.Epoch = 1
	}
	if o.LearnOdds == 0 {
		o.LearnOdds = 8
	}
	if o.HomeCrashes > 0 && o.Fills {
		// Restarted nodes take the crashed ones' places.
		o.Crashes = min(o.Crashes, o.Nodes-2+o.Restarts)
		o.HomeCrashes = min(o.HomeCrashes, o.Crashes)
	} else if o.HomeCrashes > 0 {
		o.Crashes = min(o.Crashes, o.Nodes-2)
		o.HomeCrashes = min(o.HomeCrashes, o.Crashes)
	} else if o.Crashes > o.Nodes-o.homes()-1 {
		o.Crashes = max(0, o.Nodes-o.homes()-1)
	}
	o.Restarts = min(o.Restarts, o.Crashes)
	o.Taints = max(0, min(o.Taints, o.Nodes-1))
	if o.Fills && o.Backups <= 0 {
		return fmt.Errorf("sim: fills need Backups > 0")
	}
	if o.Promotions > 0 && !o.Fills {
		return fmt.Errorf("sim: promotions need Fills")
	}
	if o.Drains > 0 && (!o.Fills || o.Mutex) {
		return fmt.Errorf("sim: drains need Fills and no Mutex")
	}
	o.Drains = max(0, min(o.Drains, o.Nodes-2))
	if o.Partitions > 0 && (!o.Fills || o.Mutex || o.UnknownOutcomes || o.SplitReads) {
		return fmt.Errorf("sim: partitions need Fills, and no Mutex, UnknownOutcomes or SplitReads")
	}
	return nil
}

// homes is the number of home nodes: nodes 1..homes, page p on node
// p%homes+1, so that most homes serve two pages.
func (o Options) homes() int { return (o.Pages + 1) / 2 }

func (o Options) String() string {
	s := fmt.Sprintf("nodes=%d pages=%d ops=%d hot=%t faults=%t unknown=%t crashes=%d home-crashes=%d async-reconfig=%t evict=%t mutex=%t lin=%t",
		o.Nodes, o.Pages, o.Ops, o.Hot, o.Faults, o.UnknownOutcomes, o.Crashes, o.HomeCrashes, o.AsyncReconfig, o.Evict, o.Mutex, o.Linearizability)
	if o.LazyHomes {
		s += " lazy=true"
	}
	if o.Epoch > 1 {
		s += fmt.Sprintf(" epoch=%d", o.Epoch)
	}
	if o.SlowSlots {
		s += " slow-slots=true"
	}
	if o.EmptyEpochs > 0 {
		s += fmt.Sprintf(" empty-epochs=%d", o.EmptyEpochs)
	}
	if o.LearnOdds != 8 && o.LearnOdds != 0 {
		s += fmt.Sprintf(" learn-odds=%d", o.LearnOdds)
	}
	if o.Joins > 0 {
		s += fmt.Sprintf(" joins=%d", o.Joins)
	}
	if o.Restarts > 0 {
		s += fmt.Sprintf(" restarts=%d", o.Restarts)
	}
	if o.SkipMoves {
		s += " skip-moves=true"
	}
	if o.Taints > 0 {
		s += fmt.Sprintf(" taints=%d", o.Taints)
	}
	if o.Backups != 0 {
		s += fmt.Sprintf(" backups=%d", o.Backups)
	}
	if o.Fills {
		s += fmt.Sprintf(" fills=true mid-fill-crashes=%t", o.MidFillCrashes)
	}
	if o.EarlyPromote {
		s += " early-promote=true"
	}
	if o.Promotions > 0 {
		s += fmt.Sprintf(" promotions=%d", o.Promotions)
	}
	if o.Persists > 0 {
		s += fmt.Sprintf(" persists=%d", o.Persists)
	}
	if o.Drains > 0 {
		s += fmt.Sprintf(" drains=%d", o.Drains)
	}
	if o.LeaveHolding {
		s += " leave-holding=true"
	}
	if o.Partitions > 0 {
		s += fmt.Sprintf(" partitions=%d", o.Partitions)
	}
	if o.UnsafeLease {
		s += " unsafe-lease=true"
	}
	if o.CrashPartial {
		s += " crash-partial=true"
	}
	if o.SplitReads {
		s += " split-reads=true"
	}
	return s
}

// Stats are figures of one run.
type Stats struct {
	Steps       int // total steps
	SettleSteps int // steps the settle phase took
	Completed   int // requests completed
	MaxLatency  int // most steps between a request and its completion
	Messages    int // messages delivered
	Batches     int // batches delivered
	// Unknown counts the batches reported of unknown outcome, and
	// UnknownExecuted those of them that executed (all or a prefix).
	Unknown, UnknownExecuted int
	// MaxOvertakes is the most exclusive tenures other nodes took on a
	// page while one request on that page waited: the fairness figure.
	MaxOvertakes int
	// CriticalSections is the number of mutex critical sections run.
	CriticalSections int
	// Crashes and HomeCrashes count the nodes that crashed.
	Crashes, HomeCrashes int
	// EmptyEpochs counts the reconfigurations that changed nothing.
	EmptyEpochs int
	// Stamps counts the MsgStamp messages sent: words found naming a
	// departed holder or reserver.
	Stamps int
	// Joins counts the nodes that joined (restarts included), and
	// JoinerOps the requests that joiners completed.
	Joins, JoinerOps int
	// Taints counts the taint epochs, PassedTainted the promotions that
	// passed over a live tainted backup, SkippedMoves the epochs learnt
	// by a node that skipped an epoch that moved pages.
	Taints, PassedTainted, SkippedMoves int
	// Fills counts the pages reported filled, FillsAbandoned those given
	// up, FilledPromotions the promotions of a backup that a fill made
	// complete, MidFillCrashes the crashes while a fill was under way.
	Fills, FillsAbandoned, FilledPromotions, MidFillCrashes int
	// Promotions counts the moves away from a live home, DemoteStamps
	// the old home slots whose word the driver turned into a stamp
	// (others were written by a backup write first), DemoteClears those
	// whose data it zeroed, and LaggingHomeVerbs the batches that reached
	// an old home's slot after its page had moved.
	Promotions, DemoteStamps, DemoteClears, LaggingHomeVerbs int
	// StampOnly counts the backups that became homes with the stamp of a
	// dead releaser's tenure beside the copy of the tenure before: its
	// batch there executed in part (a backup batch writes the stamp
	// first, docs/failover.md §7, "Data beside a word never written").
	StampOnly int
	// Persisted counts the stable copies reported for Persist events,
	// PersistsAbandoned those given up.
	Persisted, PersistsAbandoned int
	// Rests counts the rests of split batches delivered (SplitReads,
	// DeliverSplit): READs that saw the memory at two moments.
	Rests int
	// Drains counts the graceful leaves completed (Options.Drains),
	// DrainEvictions the evictions of pages the leaving nodes held
	// Modified, DrainPromotions the moves away from their homes.
	Drains, DrainEvictions, DrainPromotions int
	// Partitions counts the partitions healed (Options.Partitions),
	// ZombieVerbs the batches of removed nodes executed by members that
	// had not learnt the removal, ZombieFenced those refused, and
	// ZombieReleases the pages whose data a removed node's write-back
	// decided.
	Partitions, ZombieVerbs, ZombieFenced, ZombieReleases int
	// ZombieHomes counts the pages moved away from a node at its
	// removal while it lived on.
	ZombieHomes int
}

// Violation is a broken invariant: the seed, the configuration, what broke
// and, when the run was traced, the steps that led there.
type Violation struct {
	Seed  int64
	Opts  Options
	Step  int
	What  string
	Trace []string
}

func (v *Violation) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sim: seed %d (%v): step %d: %s", v.Seed, v.Opts, v.Step, v.What)
	if len(v.Trace) > 0 {
		b.WriteString("\ntrace:\n")
		for _, l := range v.Trace {
			b.WriteString("  ")
			b.WriteString(l)
			b.WriteString("\n")
		}
	}
	return b.String()
}

// Run runs one seed. On a violation it runs the seed again with tracing
// on and returns the *Violation with the trace.
func Run(seed int64, o Options) (Stats, error) {
	st, err := runOnce(seed, o)
	var v *Violation
	if errors.As(err, &v) && !o.Trace {
		o.Trace = true
		if _, err2 := runOnce(seed, o); err2 != nil {
			return st, err2
		}
		return st, fmt.Errorf("%w (the traced rerun did not fail: nondeterminism)", err)
	}
	return st, err
}

func runOnce(seed int64, o Options) (Stats, error) {
	s, err := New(seed, o)
	if err != nil {
		return Stats{}, err
	}
	return s.run()
}

type pendingDone struct {
	node  ids.NodeID
	batch coherence.Batch
	ops   []rdma.Op
	err   error // wraps rdma.ErrOutcomeUnknown for a batch of unknown outcome
}

type clientOp struct {
	req    coherence.Request
	call   int
	grants int // grants on the page when the request was issued
	moves  int // moves of the page when the request was issued
}

type simNode struct {
	id     ids.NodeID
	sm     *coherence.Node
	ep     *mem.Endpoint
	alive  bool
	client *clientOp
	// joining: the node joined and waits for every member's
	// acknowledgement of its epoch (coherence.Node.Joining).
	joining bool
	// placed is the placement of the last epoch the node learnt (the
	// home of every page in play): its next Reconfigure moves the pages
	// whose home differs from it.
	placed []ids.NodeID
	// learnt is the last epoch the node learnt (or was created in).
	learnt ids.Epoch
	// suspended: its lease ended (Options.Partitions), its client issues
	// nothing; zombie: removed while alive, its engine runs on (alive is
	// false: it is no member and no check looks at its copies).
	suspended, zombie bool
	// mutex client
	mstate int // 0 idle, 1 locking, 2 to load the counter, 3 to store it, 4 to unlock
	mval   uint64
}

// fillDue is a fill of page p to backup to that home must run, from epoch
// epoch on (zero in fillOut).
type fillDue struct {
	page  ids.PageNo
	to    ids.NodeID
	home  ids.NodeID
	epoch ids.Epoch
}

type slot struct {
	home ids.NodeID
	reg  rdma.Registration
	off  uint64
}

func (sl slot) word() coherence.Word { return coherence.Word(rdma.LoadWord(sl.reg.Bytes(), sl.off)) }

func (sl slot) data(pageSize int) []byte {
	return sl.reg.Bytes()[sl.off+8 : sl.off+8+uint64(pageSize)]
}

// stampDue is the stamp of the slot that node left behind when page moved
// away from it in epoch epoch.
type stampDue struct {
	page  ids.PageNo
	node  ids.NodeID
	epoch ids.Epoch
}

// Sim is one simulated cluster over a manual mem network. Its methods
// (the driver's interface used by the interaction tests) run one step
// each; Check verifies the invariants.
type Sim struct {
	Seed  int64
	Opts  Options
	rng   *rand.Rand
	net   *mem.Network
	nodes []*simNode // index = id; [0] unused
	slots map[ids.PageNo]slot
	ref   map[ids.PageNo][]byte
	epoch ids.Epoch
	gone  map[ids.NodeID]bool

	done        []pendingDone
	step        int
	nextReq     uint64
	issued      int
	crashes     int
	homeCrashes int
	empties     int // empty epochs so far
	joins       int // joins so far (not counting restarts)
	restarts    int // crashes that are restarts, so far
	toJoin      int // new ids the pending reconfiguration adds
	homeOf      func(ids.PageNo) ids.NodeID
	moving      map[ids.PageNo][]byte // pages whose home crashed -> the home copy at the crash
	movingWord  map[ids.PageNo]coherence.Word
	// bslots are the backup slots: page -> backup node -> its slot there
	// (8+PageSize bytes, a word then the data). Every page of a run with
	// home crashes has backups (backupList), written by every release.
	bslots     map[ids.PageNo]map[ids.NodeID]slot
	moved      map[ids.PageNo]bool // pages the last reconfiguration moved
	moveEpochs int                 // epochs since the first move
	slotsDue   map[ids.NodeID]ids.Epoch
	reconf     int                   // steps until the pending reconfiguration; -1 none
	rc         coherence.Reconfigure // the latest reconfiguration (Targets: see rcFor)
	rcHomes    []ids.NodeID          // the latest placement, page -> home
	rcPlace    func(ids.PageNo) ids.NodeID
	prevHomes  []ids.NodeID        // the placement of the epoch before the latest
	tainted    map[ids.NodeID]bool // nodes that are backups no more and never promoted
	taints     int                 // taint epochs so far
	lagging    []ids.NodeID        // live nodes that have not received rc yet
	stats      Stats
	history    []op
	grants     map[ids.PageNo]int // exclusive grants per page
	pageMoves  map[ids.PageNo]int // moves of each page so far
	// epochTargets are the targets of every epoch that moved pages.
	epochTargets map[ids.Epoch][]ids.NodeID
	// undecided: pages whose data is one of these candidates, decided
	// when their home first makes its slot's data the page's (settle).
	undecided map[ids.PageNo][][]byte
	csOwner   ids.NodeID
	csCount   uint64

	// With Fills: bset is the backups of each page in promotion order,
	// complete those whose copy is complete (filled, or backups from the
	// start), filled those a fill made complete; fillsDue the fills to
	// give to a home once it has learnt their epoch, fillOut those given
	// and not reported yet; newSlots the backup slots to register at
	// joiners once they exist.
	bset     map[ids.PageNo][]ids.NodeID
	complete map[ids.PageNo]map[ids.NodeID]bool
	filled   map[ids.PageNo]map[ids.NodeID]bool
	bkCur    func(ids.PageNo) []ids.NodeID // backupsNow as of the latest epoch
	fillsDue []fillDue
	fillOut  map[fillDue]bool
	newSlots []fillDue

	// With Promotions: promote the pages to move away from their live
	// home at the next reconfiguration, and the new home of each;
	// former the backup slots that were home slots (lagging members'
	// verbs of every kind may reach them); stampsDue the stamps the
	// old homes' node layer owes.
	promote   map[ids.PageNo]ids.NodeID
	former    map[ids.PageNo]map[ids.NodeID]bool
	stampsDue []stampDue
	// clearsDue the clears of the data of those slots that the old
	// homes' node layer owes, clearAsk the clears the nodes asked for
	// (Ready.ClearSlots), by node: the epoch asked.
	clearsDue  []stampDue
	clearAsk   map[ids.NodeID]ids.Epoch
	promotions int
	persists   int

	// With Drains: draining the nodes marked (for good), drainer the
	// one under way (None: none), drains the drains started.
	draining map[ids.NodeID]bool
	drainer  ids.NodeID
	drains   int

	// With Partitions: suspendee the node partitioned (None: none),
	// partIn the steps until its removal or heal, partitions those
	// started, zombieAt the epoch that removed each zombie, zundecided
	// the pages the zombies held.
	suspendee ids.NodeID
	// partialFrom (CrashPartial) is the sender of the last batch that
	// executed in part, None once it crashed.
	partialFrom ids.NodeID
	partIn      int
	partitions  int
	zombieAt    map[ids.NodeID]ids.Epoch
	zundecided  map[ids.PageNo]zombieCands

	trace []string
	err   error
}

// New builds a cluster: nodes 1..o.Nodes, page p homed on node p%H+1 (H =
// (Pages+1)/2), every word initialised in o.Epoch, or left zero (never
// touched) with LazyHomes.
func New(seed int64, o Options) (*Sim, error) {
	if err := o.norm(); err != nil {
		return nil, err
	}
	netOpts := []mem.Option{mem.Manual()}
	if o.SplitReads {
		netOpts = append(netOpts, mem.SplitReads())
	}
	s := &Sim{
		Seed: seed, Opts: o, rng: rand.New(rand.NewSource(seed)),
		net:   mem.NewNetwork(netOpts...),
		slots: map[ids.PageNo]slot{}, ref: map[ids.PageNo][]byte{},
		epoch: o.Epoch, gone: map[ids.NodeID]bool{}, reconf: -1, grants: map[ids.PageNo]int{}, pageMoves: map[ids.PageNo]int{}, epochTargets: map[ids.Epoch][]ids.NodeID{}, undecided: map[ids.PageNo][][]byte{},
		moving:     map[ids.PageNo][]byte{},
		movingWord: map[ids.PageNo]coherence.Word{},
		bslots:     map[ids.PageNo]map[ids.NodeID]slot{},
		moved:      map[ids.PageNo]bool{},
		slotsDue:   map[ids.NodeID]ids.Epoch{},
		tainted:    map[ids.NodeID]bool{},
		bset:       map[ids.PageNo][]ids.NodeID{},
		complete:   map[ids.PageNo]map[ids.NodeID]bool{},
		filled:     map[ids.PageNo]map[ids.NodeID]bool{},
		fillOut:    map[fillDue]bool{},
		promote:    map[ids.PageNo]ids.NodeID{},
		former:     map[ids.PageNo]map[ids.NodeID]bool{},
		clearAsk:   map[ids.NodeID]ids.Epoch{},
		draining:   map[ids.NodeID]bool{},
		zombieAt:   map[ids.NodeID]ids.Epoch{},
		zundecided: map[ids.PageNo]zombieCands{},
	}
	members := make([]ids.NodeID, o.Nodes)
	for i := range members {
		members[i] = ids.NodeID(i + 1)
	}
	homeOf := func(p ids.PageNo) ids.NodeID {
		if int(p) >= o.Pages {
			return ids.None
		}
		return ids.NodeID(int(p)%o.homes() + 1)
	}
	s.homeOf = homeOf
	s.rcHomes = make([]ids.NodeID, o.Pages)
	for p := range s.rcHomes {
		s.rcHomes[p] = homeOf(ids.PageNo(p))
	}
	s.rcPlace, s.prevHomes = homeOf, s.rcHomes
	if o.Fills {
		for p := ids.PageNo(0); int(p) < o.Pages; p++ {
			s.bset[p] = s.backupList(p)
			s.complete[p] = map[ids.NodeID]bool{}
			s.filled[p] = map[ids.NodeID]bool{}
			for _, b := range s.bset[p] {
				s.complete[p][b] = true
			}
		}
	}
	s.nodes = make([]*simNode, o.Nodes+1)
	s.bkCur = s.backupsNow()
	slotLen := 8 + o.PageSize
	// Odd seeds start the versions just below the 16-bit wrap.
	var startVer uint16
	if seed%2 == 1 {
		startVer = uint16(65535 - s.rng.Intn(40))
	}
	for i := 1; i <= o.Nodes; i++ {
		id := ids.NodeID(i)
		ep, err := s.net.Endpoint(id)
		if err != nil {
			return nil, err
		}
		var homed []ids.PageNo
		for p := 0; p < o.Pages; p++ {
			if homeOf(ids.PageNo(p)) == id {
				homed = append(homed, ids.PageNo(p))
			}
		}
		listed := homed
		if o.LazyHomes {
			listed = nil
		}
		sm, err := coherence.NewNode(coherence.Config{
			ID: id, PageSize: o.PageSize, Epoch: o.Epoch, Members: members,
			HomeOf: homeOf, HomedPages: listed, Backups: s.backupsNow(),
		})
		if err != nil {
			return nil, err
		}
		if len(homed) > 0 {
			buf := make([]byte, len(homed)*slotLen)
			reg, err := ep.Register(buf, rdma.AccessAll)
			if err != nil {
				return nil, err
			}
			for k, p := range homed {
				off := uint64(k * slotLen)
				if !o.LazyHomes {
					rdma.StoreWord(reg.Bytes(), off, uint64(coherence.InitialWord(o.Epoch).WithVersion(startVer)))
				} // else: home memory zero, never touched (dsmd's anonymous slots)
				s.slots[p] = slot{home: id, reg: reg, off: off}
				s.ref[p] = make([]byte, o.PageSize)
			}
		}
		for p := 0; p < o.Pages; p++ {
			if !slices.Contains(s.backupList(ids.PageNo(p)), id) {
				continue
			}
			reg, err := ep.Register(make([]byte, slotLen), rdma.AccessAll)
			if err != nil {
				return nil, err
			}
			if s.bslots[ids.PageNo(p)] == nil {
				s.bslots[ids.PageNo(p)] = map[ids.NodeID]slot{}
			}
			s.bslots[ids.PageNo(p)][id] = slot{home: id, reg: reg}
		}
		n := &simNode{id: id, sm: sm, ep: ep, alive: true, placed: slices.Clone(s.rcHomes), learnt: o.Epoch}
		ep.SetHandler(func(from ids.NodeID, b []byte) { s.receive(n, from, b) })
		s.nodes[i] = n
	}
	return s, nil
}

// backupList is the backups of page p for the whole run, in the order in
// which they become its home: the first-epoch nodes after its first home,
// as many as there are crashes and taints (so that a promotable copy
// always survives), in runs with home crashes; none otherwise.
func (s *Sim) backupList(p ids.PageNo) []ids.NodeID {
	k := s.Opts.Backups
	if k == 0 && s.Opts.HomeCrashes > 0 {
		k = s.Opts.Crashes + s.Opts.Taints
	}
	k = min(k, s.Opts.Nodes-1)
	h := int(s.homeOf(p))
	out := make([]ids.NodeID, 0, max(k, 0))
	for i := 1; i <= k; i++ {
		out = append(out, ids.NodeID((h-1+i)%s.Opts.Nodes+1))
	}
	return out
}

// backupsNow is the backups of every page in the current epoch: its backup
// list without its home, without the nodes that crashed and without the
// tainted ones.
func (s *Sim) backupsNow() func(ids.PageNo) []ids.NodeID {
	if len(s.backupList(0)) == 0 {
		return nil
	}
	if s.Opts.Fills {
		cur := make([][]ids.NodeID, s.Opts.Pages)
		for p := range cur {
			cur[p] = slices.Clone(s.bset[ids.PageNo(p)])
		}
		return func(p ids.PageNo) []ids.NodeID {
			if int(p) < len(cur) {
				return cur[p]
			}
			return nil
		}
	}
	cur := make([][]ids.NodeID, s.Opts.Pages)
	for p := range cur {
		for _, b := range s.backupList(ids.PageNo(p)) {
			if !s.gone[b] && !s.tainted[b] && b != s.slots[ids.PageNo(p)].home {
				cur[p] = append(cur[p], b)
			}
		}
	}
	return func(p ids.PageNo) []ids.NodeID {
		if int(p) < len(cur) {
			return cur[p]
		}
		return nil
	}
}

func (s *Sim) tracef(format string, args ...any) {
	if s.Opts.Trace {
		s.trace = append(s.trace, fmt.Sprintf("%5d ", s.step)+fmt.Sprintf(format, args...))
	}
}

func (s *Sim) fail(format string, args ...any) {
	if s.err == nil {
		v := &Violation{Seed: s.Seed, Opts: s.Opts, Step: s.step, What: fmt.Sprintf(format, args...)}
		if s.Opts.Trace {
			v.Trace = s.trace
		}
		s.err = v
	}
}

// Err is the first violation found, if any.
func (s *Sim) Err() error { return s.err }

// ---- executing what nodes ask ----

func (s *Sim) apply(n *simNode) {
	if n.joining && !n.sm.Joining() {
		// The joiner may act from now on: the fairness bound counts
		// the tenures its request waits through from here. Before, it
		// waited for the epoch to reach every member, which the
		// directory bounds, not the reservation queue.
		n.joining = false
		s.tracef("%v: every member has acknowledged its epoch", n.id)
		if n.client != nil {
			n.client.grants = s.grants[n.client.req.Page]
		}
	}
	rd := n.sm.Ready()
	for _, b := range rd.Batches {
		s.tracef("%v posts %v", n.id, b)
		s.postBatch(n, b)
	}
	for _, m := range rd.Messages {
		s.tracef("%v sends %v", n.id, m)
		if m.Type == coherence.MsgStamp {
			s.stats.Stamps++
		}
		_ = n.ep.Send(context.Background(), m.To, m.Marshal())
	}
	for _, e := range rd.Pages {
		s.tracef("%v page %v", n.id, e)
		if e.Kind == coherence.PageGrantExclusive {
			s.grants[e.Page]++
		}
	}
	for _, c := range rd.Completions {
		s.tracef("%v %v", n.id, c)
		s.completed(n, c)
	}
	for _, f := range rd.Filled {
		s.tracef("%v %v", n.id, f)
		s.fillReported(n, f)
	}
	for _, d := range rd.Persisted {
		s.tracef("%v %v", n.id, d)
		s.persistReported(n, d)
	}
	if rd.ClearSlots != 0 {
		s.tracef("%v asks its node layer to clear the slots it entered anew up to %v", n.id, rd.ClearSlots)
		s.clearAsk[n.id] = rd.ClearSlots
	}
}

func (s *Sim) postBatch(n *simNode, b coherence.Batch) {
	sl, ok := s.slots[b.Verbs[0].Page]
	if ok && sl.home != b.Home && !s.nodes[b.Home].alive {
		// A node that has not learnt of the move yet: the batch fails.
		s.done = append(s.done, pendingDone{node: n.id, batch: b, err: &rdma.PeerError{Peer: b.Home, Err: rdma.ErrPeerUnreachable}})
		return
	}
	if ok && sl.home != b.Home {
		// A backup's slot (a release writes its data and stamp there),
		// or a slot left behind by a move away from a live home, where
		// a lagging member's verbs of every kind may land.
		bs, isBackup := s.bslots[b.Verbs[0].Page][b.Home]
		former := s.former[b.Verbs[0].Page][b.Home]
		for _, v := range b.Verbs {
			if v.Kind != coherence.VerbWrite && !former || v.Page != b.Verbs[0].Page {
				isBackup = false
			}
		}
		if !isBackup {
			s.fail("%v posted %v to a node that is neither the home nor a backup", n.id, b)
			return
		}
		if former && b.Verbs[0].Kind != coherence.VerbWrite {
			s.stats.LaggingHomeVerbs++
		}
		sl = bs
	}
	if !ok {
		s.fail("%v posted %v to a node that is not the home", n.id, b)
		return
	}
	ops := make([]rdma.Op, len(b.Verbs))
	for i, v := range b.Verbs {
		vs := s.slots[v.Page]
		if v.Page == b.Verbs[0].Page {
			vs = sl
		}
		op := rdma.Op{RKey: vs.reg.Descriptor().RKey, Offset: vs.off + v.Span.Offset()}
		switch v.Kind {
		case coherence.VerbRead:
			op.Kind = rdma.OpRead
			op.Buf = make([]byte, v.Span.Len(s.Opts.PageSize))
		case coherence.VerbWrite:
			op.Kind = rdma.OpWrite
			op.Buf = v.Data
		case coherence.VerbCAS:
			op.Kind, op.Compare, op.Operand = rdma.OpCAS, v.Compare, v.Operand
		case coherence.VerbFAA:
			op.Kind, op.Operand = rdma.OpFAA, v.Operand
		}
		ops[i] = op
	}
	n.ep.PostAsync(b.Home, ops, func(err error) {
		s.done = append(s.done, pendingDone{node: n.id, batch: b, ops: ops, err: err})
	})
}

func (s *Sim) receive(n *simNode, from ids.NodeID, b []byte) {
	if !n.alive && !n.zombie {
		return
	}
	s.stats.Messages++
	m, err := coherence.Unmarshal(b)
	if err != nil {
		s.fail("%v got an undecodable message from %v: %v", n.id, from, err)
		return
	}
	if m.From != from {
		s.fail("%v got a message from %v that claims to be from %v", n.id, from, m.From)
		return
	}
	if err := n.sm.Step(coherence.Receive{Msg: m}); err != nil {
		s.tracef("%v refuses %v: %v", n.id, m, err)
		return
	}
	s.tracef("%v receives %v", n.id, m)
	s.apply(n)
}

// completeBatch reports the i-th executed batch to its node.
func (s *Sim) completeBatch(i int) {
	d := s.done[i]
	s.done = slices.Delete(s.done, i, i+1)
	n := s.nodes[d.node]
	if !n.alive && !n.zombie {
		return
	}
	ev := coherence.VerbsDone{ID: d.batch.ID, Err: d.err, Unknown: errors.Is(d.err, rdma.ErrOutcomeUnknown)}
	switch {
	case d.err == nil:
		ev.Results = make([]coherence.Result, len(d.ops))
		for k := range d.ops {
			ev.Results[k] = coherence.Result{Word: d.ops[k].Result, Data: d.ops[k].Buf}
		}
	case ev.Unknown:
		// Results that look real and are not: a state machine that
		// read them would go wrong, and the checks would see it.
		ev.Results = make([]coherence.Result, len(d.batch.Verbs))
		for k, v := range d.batch.Verbs {
			ev.Results[k].Word = s.rng.Uint64()
			if v.Kind == coherence.VerbRead {
				ev.Results[k].Data = make([]byte, v.Span.Len(s.Opts.PageSize))
				s.rng.Read(ev.Results[k].Data)
			}
		}
	}
	s.tracef("%v completes batch#%d err=%v", n.id, d.batch.ID, d.err)
	if err := n.sm.Step(ev); err != nil {
		s.fail("%v refused the completion of batch#%d: %v", n.id, d.batch.ID, err)
		return
	}
	s.apply(n)
}

// ---- the reference model ----

func (s *Sim) refWord(p ids.PageNo, off int) uint64 {
	return binary.LittleEndian.Uint64(s.ref[p][off:])
}

func (s *Sim) setRef(p ids.PageNo, off int, v uint64) {
	binary.LittleEndian.PutUint64(s.ref[p][off:], v)
}

func (s *Sim) completed(n *simNode, c coherence.Completion) {
	s.stats.Completed++
	co := n.client
	if co == nil || co.req.ID != c.ID {
		s.fail("%v completed %v, which is not its outstanding request", n.id, c)
		return
	}
	n.client = nil
	if lat := s.step - co.call; lat > s.stats.MaxLatency {
		s.stats.MaxLatency = lat
	}
	if int(n.id) > s.Opts.Nodes {
		s.stats.JoinerOps++
	}
	if ov := s.grants[co.req.Page] - co.grants - 1; ov > s.stats.MaxOvertakes {
		s.stats.MaxOvertakes = ov
		// A move of the page while the request waited costs it its place
		// in the reservation queue (the new home starts a queue of its
		// own): the bound holds anew after each.
		if bound := (2*(len(s.nodes)-1) + 4) * (1 + s.pageMoves[co.req.Page] - co.moves); ov > bound {
			s.fail("fairness: %v's %v on %v waited through %d tenures of other nodes (bound %d)", n.id, co.req.Op, co.req.Page, ov, bound)
		}
	}
	r := co.req
	if r.Op == coherence.OpEvict {
		return
	}
	s.settleZombie(r.Page)
	s.decideByAccess(n, r, c)
	if cands := s.undecided[r.Page]; cands != nil {
		// Served before the new home made its slot's data the page's:
		// through the old home, which lagged behind the move and
		// repaired the word, refreshing every backup (the new home's
		// slot too) with its copy first; or through a home that took
		// the page before writing a home word beside it (its slot's
		// word was zero). The data the access used stands: the
		// reverted data, a dead releaser's last write, or (a page a
		// removed home held, Options.Partitions) its last write.
		delete(s.undecided, r.Page)
		if i, ok := s.usedCandidate(n, r, c, cands); ok && i >= 0 {
			copy(s.ref[r.Page], cands[i])
		}
		s.tracef("%v: its data is decided by an access", r.Page)
	}
	cur := s.refWord(r.Page, r.Offset)
	switch r.Op {
	case coherence.OpLoad:
		if c.Value != cur {
			s.fail("%v: load %v+%d returned %d, the latest store is %d", n.id, r.Page, r.Offset, c.Value, cur)
		}
	case coherence.OpStore:
		s.setRef(r.Page, r.Offset, r.Value)
	case coherence.OpAdd:
		if c.Value != cur {
			s.fail("%v: add %v+%d saw %d, the latest value is %d", n.id, r.Page, r.Offset, c.Value, cur)
		}
		s.setRef(r.Page, r.Offset, cur+r.Value)
	case coherence.OpCAS:
		if c.Value != cur || c.Swapped != (cur == r.Compare) {
			s.fail("%v: cas %v+%d saw %d swapped=%t, the latest value is %d", n.id, r.Page, r.Offset, c.Value, c.Swapped, cur)
		}
		if c.Swapped {
			s.setRef(r.Page, r.Offset, r.Value)
		}
	}
	if s.Opts.Linearizability {
		s.history = append(s.history, op{client: int(n.id), req: r, out: c, call: co.call, ret: s.step})
	}
	if s.Opts.Mutex {
		s.mutexDone(n, c)
	}
}

// ---- requests ----

// Request queues a local request at node id (one outstanding per node),
// as a step of its own.
func (s *Sim) Request(id ids.NodeID, r coherence.Request) error {
	s.step++
	err := s.request(id, r)
	s.check(false)
	return err
}

func (s *Sim) request(id ids.NodeID, r coherence.Request) error {
	if int(id) <= 0 || int(id) >= len(s.nodes) {
		return fmt.Errorf("sim: no node %v", id)
	}
	n := s.nodes[id]
	if !n.alive && !(n.zombie && s.Opts.UnsafeLease) {
		return fmt.Errorf("sim: %v is down", id)
	}
	if n.client != nil {
		return fmt.Errorf("sim: %v already has request #%d outstanding", id, n.client.req.ID)
	}
	s.nextReq++
	r.ID = s.nextReq
	n.client = &clientOp{req: r, call: s.step, grants: s.grants[r.Page], moves: s.pageMoves[r.Page]}
	s.tracef("%v requests %v %v+%d v=%d", id, r.Op, r.Page, r.Offset, r.Value)
	if err := n.sm.Step(r); err != nil {
		n.client = nil
		return err
	}
	s.apply(n)
	return nil
}

func (s *Sim) randomRequest(n *simNode) {
	if s.Opts.Mutex {
		s.mutexNext(n)
		return
	}
	pg := ids.PageNo(0)
	if !s.Opts.Hot {
		pg = ids.PageNo(s.rng.Intn(s.Opts.Pages))
	}
	r := coherence.Request{Page: pg, Offset: 8 * s.rng.Intn(s.Opts.PageSize/8)}
	x := s.rng.Intn(100)
	switch {
	case x < 45:
		r.Op = coherence.OpLoad
	case x < 65:
		r.Op, r.Value = coherence.OpStore, uint64(s.rng.Intn(1000))
	case x < 80:
		r.Op, r.Value = coherence.OpAdd, uint64(1+s.rng.Intn(9))
	case x < 92 || !s.Opts.Evict:
		r.Op, r.Compare, r.Value = coherence.OpCAS, uint64(s.rng.Intn(4)), uint64(s.rng.Intn(1000))
		if s.rng.Intn(2) == 0 {
			r.Compare = s.refWord(r.Page, r.Offset) // sometimes a CAS that can succeed
		}
	default:
		r.Op = coherence.OpEvict
		r.Offset = 0
	}
	if err := s.request(n.id, r); err != nil {
		s.fail("request: %v", err)
	}
}

// mutexNext issues the next request of a mutex client: lock with
// CAS(0 -> id), load the counter, store counter+1, unlock with a store of
// 0. Each is issued in a step of its own, so critical sections interleave
// with everything else.
func (s *Sim) mutexNext(n *simNode) {
	r := coherence.Request{Page: 0}
	switch n.mstate {
	case 0:
		n.mstate = 1
		r.Op, r.Compare, r.Value = coherence.OpCAS, 0, uint64(n.id)
	case 2:
		r.Op, r.Offset = coherence.OpLoad, 8
	case 3:
		r.Op, r.Offset, r.Value = coherence.OpStore, 8, n.mval+1
	case 4:
		r.Op, r.Offset, r.Value = coherence.OpStore, 0, 0
	default:
		return
	}
	if err := s.request(n.id, r); err != nil {
		s.fail("mutex request: %v", err)
	}
}

// mutexDone advances a mutex client after a completion and checks mutual
// exclusion when the lock is taken.
func (s *Sim) mutexDone(n *simNode, c coherence.Completion) {
	switch n.mstate {
	case 1:
		if !c.Swapped {
			n.mstate = 0
			return
		}
		if s.csOwner != ids.None {
			s.fail("mutual exclusion: %v took the lock while %v holds it", n.id, s.csOwner)
		}
		s.csOwner = n.id
		s.csCount++
		s.stats.CriticalSections++
		n.mstate = 2
	case 2:
		n.mval = c.Value
		n.mstate = 3
	case 3:
		n.mstate = 4
	case 4:
		s.csOwner = ids.None
		n.mstate = 0
	}
}

// ---- faults and reconfiguration ----

// Crash kills node id. Whatever it held in M and had not written back is
// lost: the reference model reverts those pages to the home copy.
func (s *Sim) Crash(id ids.NodeID) error {
	s.step++
	return s.crash(id)
}

func (s *Sim) crash(id ids.NodeID) error { return s.depart(id, false) }

// depart takes node id out: a crash, or (graceful) a drained node's leave,
// after which the reference keeps every page as it is (a leave loses
// nothing).
func (s *Sim) depart(id ids.NodeID, graceful bool) error {
	if int(id) <= 0 || int(id) >= len(s.nodes) {
		return fmt.Errorf("sim: no node %v", id)
	}
	n := s.nodes[id]
	if !n.alive {
		return fmt.Errorf("sim: %v is already down", id)
	}
	for p, sl := range s.slots {
		if sl.home == id && s.Opts.HomeCrashes == 0 {
			return fmt.Errorf("sim: %v is the home of %v: home crashes are off (HomeCrashes)", id, p)
		}
	}
	n.alive = false
	n.client = nil
	s.gone[id] = true
	s.lagging = slices.DeleteFunc(s.lagging, func(x ids.NodeID) bool { return x == id })
	pages := slices.Sorted(maps.Keys(s.slots)) // a trace in a stable order
	for _, p := range pages {
		sl := s.slots[p]
		w := coherence.Word(rdma.LoadWord(sl.reg.Bytes(), sl.off))
		// The word names the holder, except while the page is frozen
		// for a rebuild, or moved to a home the node has not learnt of
		// (SkipMoves: it lags behind the move): then the node's own
		// claim counts.
		if info := n.sm.Page(p); !graceful && (w.Holder() == id || info.Tenure && (info.Frozen || n.placed[p] != sl.home)) {
			copy(s.ref[p], sl.reg.Bytes()[sl.off+8:sl.off+8+uint64(s.Opts.PageSize)])
			s.tracef("%v held %v: it reverts to the home copy", id, p)
		}
	}
	for _, p := range pages {
		if sl := s.slots[p]; sl.home == id {
			s.moving[p] = slices.Clone(sl.reg.Bytes()[sl.off+8 : sl.off+8+uint64(s.Opts.PageSize)])
			s.movingWord[p] = coherence.Word(rdma.LoadWord(sl.reg.Bytes(), sl.off))
			s.tracef("%v was the home of %v: it moves at the next reconfiguration", id, p)
		}
	}
	if s.csOwner == id {
		s.csOwner = ids.None
	}
	n.mstate = 0
	s.tracef("crash %v", id)
	s.net.Crash(id)
	return nil
}

// Reconfigure moves every live node to the next epoch, without the nodes
// that crashed.
func (s *Sim) Reconfigure() {
	s.step++
	s.reconfigure(false)
	s.check(false)
}

func (s *Sim) reconfigure(async bool) { s.reconfigureJoin(async, 0) }

// reconfigureJoin moves to the next epoch, without the nodes that crashed
// and with joins new nodes (ids after the last), which are created in the
// new epoch; the others learn it at once, or one by one (async).
func (s *Sim) reconfigureJoin(async bool, joins int) {
	s.epoch++
	var members []ids.NodeID
	for _, n := range s.nodes[1:] {
		if n.alive {
			members = append(members, n.id)
		}
	}
	first := ids.NodeID(len(s.nodes))
	for k := 0; k < joins; k++ {
		members = append(members, first+ids.NodeID(k))
	}
	s.tracef("reconfigure %v members=%d", s.epoch, len(members))
	var homeOf func(ids.PageNo) ids.NodeID
	var targets []ids.NodeID
	clear(s.moved)
	if len(s.moving) > 0 {
		pages := make([]ids.PageNo, 0, len(s.moving))
		for p := range s.moving {
			pages = append(pages, p)
		}
		slices.Sort(pages)
		// Homes stay among the nodes of the first epoch (the same
		// list as members when nobody joined).
		cand := slices.DeleteFunc(slices.Clone(members), func(id ids.NodeID) bool { return int(id) > s.Opts.Nodes })
		for _, p := range pages {
			if len(s.backupList(p)) == 0 {
				// No backups (transcripts that script a home crash
				// without them): the new home's slot gets the old home
				// copy, a stand-in for a backup.
				home := cand[s.rng.Intn(len(cand))]
				reg, err := s.nodes[home].ep.Register(make([]byte, 8+s.Opts.PageSize), rdma.AccessAll)
				if err != nil {
					s.fail("register the new slot of %v at %v: %v", p, home, err)
					return
				}
				rdma.StoreWord(reg.Bytes(), 0, uint64(coherence.InitialWord(s.epoch)))
				copy(reg.Bytes()[8:], s.moving[p])
				s.slots[p] = slot{home: home, reg: reg}
				s.moved[p] = true
				s.tracef("%v moves to %v", p, home)
				continue
			}
			if !s.promoteBackup(p) {
				return
			}
		}
		clear(s.moving)
		clear(s.movingWord)
	}
	if len(s.promote) > 0 {
		s.promoteLive()
	}
	if len(s.moved) > 0 {
		homeOf = s.placement()
		s.rcPlace = homeOf
		for p := range s.moved {
			if h := s.slots[p].home; !slices.Contains(targets, h) {
				targets = append(targets, h)
			}
		}
		slices.Sort(targets)
	}
	if s.Opts.Fills {
		s.refill(members)
	}
	if homeOf != nil || s.moveEpochs > 0 {
		s.moveEpochs++
	}
	s.prevHomes = s.rcHomes
	s.rcHomes = make([]ids.NodeID, s.Opts.Pages)
	for p := range s.rcHomes {
		s.rcHomes[p] = s.slots[ids.PageNo(p)].home
	}
	s.bkCur = s.backupsNow()
	s.rc = coherence.Reconfigure{Epoch: s.epoch, Members: members, HomeOf: homeOf, Targets: targets, SlotsPending: s.Opts.SlowSlots && homeOf != nil, Backups: s.bkCur}
	if len(targets) > 0 {
		s.epochTargets[s.epoch] = targets
	}
	if s.rc.SlotsPending {
		for _, t := range targets {
			s.slotsDue[t] = s.epoch
		}
	}
	s.lagging = s.lagging[:0]
	for _, n := range s.nodes[1:] {
		if n.alive {
			s.lagging = append(s.lagging, n.id)
		}
	}
	for k := 0; k < joins; k++ {
		if err := s.addJoiner(first+ids.NodeID(k), members); err != nil {
			s.fail("join %v: %v", first+ids.NodeID(k), err)
			return
		}
	}
	for _, ns := range s.newSlots {
		s.addBackupSlot(ns.page, ns.to)
	}
	s.newSlots = s.newSlots[:0]
	if !async {
		for len(s.lagging) > 0 {
			s.reconfigureOne(0)
		}
	}
}

// promoteBackup makes the first live backup of page p that is not tainted, whose home crashed,
// its home: its backup slot becomes the home slot, the stamp a home word
// (the node layer's job in dsmd). The backup must hold the home copy as it
// was at the crash, or the data of the tenure the home's word names as
// held, written by a release whose CAS did not happen: then, unless the
// releaser lives (it claims the tenure and the rebuild decides), that
// write takes effect (the releaser's last write before it died).
func (s *Sim) promoteBackup(p ids.PageNo) bool {
	var home ids.NodeID
	var legacy []ids.NodeID
	if s.Opts.Fills {
		// Only a complete backup (I9), unless the run breaks the rule
		// on purpose.
		for _, b := range s.bset[p] {
			if !s.gone[b] && !s.tainted[b] && b != s.suspendee && (s.complete[p][b] || s.Opts.EarlyPromote) && (home == ids.None || s.draining[home]) {
				// The first, unless it drains and another does not
				// (dsmd's placement: a draining member is usable no
				// more, and is promoted only as the last copy).
				home = b
			}
		}
		if home != ids.None {
			if s.filled[p][home] {
				s.stats.FilledPromotions++
			}
			if !s.complete[p][home] {
				s.tracef("%v: backup %v is not complete, promoted all the same (EarlyPromote)", p, home)
			}
			s.bset[p] = slices.DeleteFunc(s.bset[p], func(b ids.NodeID) bool { return b == home })
			delete(s.complete[p], home)
			delete(s.filled[p], home)
		}
	} else {
		legacy = s.backupList(p)
	}
	for _, b := range legacy {
		if !s.gone[b] && b != s.slots[p].home && s.tainted[b] {
			s.stats.PassedTainted++
			s.tracef("%v: backup %v is tainted, not promoted", p, b)
		}
		if !s.gone[b] && !s.tainted[b] && b != s.slots[p].home {
			home = b
			break
		}
	}
	bs, ok := s.bslots[p][home]
	if home == ids.None || !ok {
		s.fail("%v has no live backup left", p)
		return false
	}
	s.stampFormer(p, home)
	delete(s.bslots[p], home)
	if !s.judgeBackup(p, home, bs, s.moving[p], s.movingWord[p]) {
		return false
	}
	delete(s.former[p], home)
	// The stamp stays: the first access finds a holder that is no
	// member and asks the home to repair the word (MsgStamp), which
	// writes the home copy to the other backups first. A rebuild
	// replaces it as well.
	s.slots[p] = bs
	s.moved[p] = true
	s.pageMoves[p]++
	s.tracef("%v moves to %v", p, home)
	return true
}

// judgeBackup checks the slot bs of page p at backup home, which becomes
// the page's home, against the old home's copy and word (oldData, old):
// it must hold the old home copy, or the data of the tenure the old word
// names as held, written by a release whose CAS did not happen: then,
// unless the releaser lives (it claims the tenure and the rebuild
// decides), the page is undecided between the two until the new home
// makes the slot's data the page's (its rebuild or repair, after every
// member acknowledged the epoch: settle) or an access takes one of them.
// Before that, an old home that lives on (a promotion) and still owes a
// repair of the word (a dead holder, or a stamp of its own) may refresh
// every backup, the new home's slot too, with its copy; and a promotion,
// or a crash of the new home, may make another backup, which the dead
// releaser never wrote, the home.
func (s *Sim) judgeBackup(p ids.PageNo, home ids.NodeID, bs slot, oldData []byte, old coherence.Word) bool {
	w := bs.word()
	if s.former[p][home] {
		// An old home's slot, promoted back: judged as the stamp
		// its word stands for.
		w = coherence.StampOf(w)
	}
	data := bs.data(s.Opts.PageSize)
	// A batch of unknown outcome may have executed in part: the stamp of
	// the held tenure beside the data of the one before (a backup batch
	// writes the stamp first).
	held := old.Holder() != ids.None && old.Holder() != coherence.NotHome &&
		(w.Version() == old.Version() || w.Version()+1 == old.Version())
	switch {
	case w != 0 && w.Holder() != coherence.NotHome:
		s.fail("backup of %v at %v: word %v is no stamp", p, home, w)
		return false
	case bytes.Equal(data, oldData):
		if h := old.Holder(); w.Holder() == coherence.NotHome && w.Version() == old.Version() && h != ids.None && h != coherence.NotHome && (s.nodes[h] == nil || !s.nodes[h].alive) {
			s.stats.StampOnly++
		}
	case w == 0 && !bytes.Equal(data, make([]byte, len(data))):
		// A backup batch writes the stamp before the data, and a fill
		// makes its backup complete only once it is done: data beside
		// a zero word is a batch that wrote the data first.
		s.fail("backup of %v at %v holds %v beside a zero word (the home copy is %v)", p, home, data, oldData)
		return false
	case s.undecided[p] != nil && slices.ContainsFunc(s.undecided[p], func(c []byte) bool { return bytes.Equal(c, data) }):
		// Still undecided since an earlier move.
	case held:
		// The releaser's last write, under a CAS that did not happen.
		// If it died, the write may take effect: it does once the new
		// home hands the slot's data out (its rebuild or repair, or an
		// access). Until then the old copy may still win (above; the
		// case of promote-crash seed 6098).
		if h := s.nodes[old.Holder()]; h == nil || !h.alive {
			s.undecided[p] = [][]byte{slices.Clone(oldData), slices.Clone(data)}
			s.tracef("%v: the backup at %v holds data of v%d of dead %v, never released: it takes effect once the new home hands it out", p, home, old.Version(), old.Holder())
		}
	case s.liveTenure(p):
		// A live node holds or claims the tenure: the rebuild decides
		// from the reports, and its copy is the data if it keeps the
		// tenure (a lagging releaser may have written its data to this
		// slot while it was a backup: before the rebuild, which waits
		// for its acknowledgement of the epoch).
	case old.Holder() == coherence.NotHome:
		// The old home was a promoted backup whose stamp nobody
		// replaced: no read took data there (a reader validates only a
		// word without a holder; the first use repairs the stamp, and
		// the repair writes the home copy to every backup first), and
		// the slot may hold the last write of a releaser that died
		// after writing some backups (a lagging one even writes the
		// slot that just became a home). That write takes effect or
		// not, unseen, decided as above.
		s.undecided[p] = [][]byte{slices.Clone(oldData), slices.Clone(data)}
		s.tracef("%v: the backup at %v differs from the old home's, which nobody read: it is the data once the new home hands it out", p, home)
	default:
		s.fail("backup of %v at %v (stamp %v, data %v) is neither the home copy (%v) nor the held tenure's (home word %v)", p, home, w, data, oldData, old)
		return false
	}
	return true
}

// persistOne gives one live node a Persist of a random page: its home, or
// (one in four) another node, which must give it up. It reports whether it
// gave one.
func (s *Sim) persistOne() bool {
	p := ids.PageNo(s.rng.Intn(s.Opts.Pages))
	id := s.slots[p].home
	if s.rng.Intn(4) == 0 {
		id = ids.NodeID(1 + s.rng.Intn(len(s.nodes)-1))
	}
	n := s.nodes[id]
	if !n.alive {
		return false
	}
	s.persists++
	s.tracef("%v persists %v", id, p)
	if err := n.sm.Step(coherence.Persist{Pages: []ids.PageNo{p}}); err != nil {
		s.fail("%v refused a Persist of %v: %v", id, p, err)
		return true
	}
	s.apply(n)
	return true
}

// persistReported checks a stable copy node n reported: n is the page's
// home, its word names no holder and shows the version reported, and the
// data is the page's latest (the reference model), unless the page's data
// is still undecided.
func (s *Sim) persistReported(n *simNode, d coherence.PersistDone) {
	if d.Err != nil {
		s.stats.PersistsAbandoned++
		if !errors.Is(d.Err, coherence.ErrPersistAbandoned) {
			s.fail("%v: persist of %v failed with %v", n.id, d.Page, d.Err)
		}
		return
	}
	s.stats.Persisted++
	sl := s.slots[d.Page]
	if sl.home != n.id {
		// A home that lags behind the move of the page: no tenure can
		// begin at the new home before it learns the epoch, so its
		// copy is still the latest.
		bs, ok := s.bslots[d.Page][n.id]
		if !ok || n.placed[d.Page] != n.id || !s.former[d.Page][n.id] {
			s.fail("%v reported a stable copy of %v, whose home is %v", n.id, d.Page, sl.home)
			return
		}
		sl = bs
	}
	if w := sl.word(); w.Holder() != ids.None || w.Version() != d.Version {
		s.fail("%v reported a stable copy of %v at v%d while its word is %v", n.id, d.Page, d.Version, w)
		return
	}
	if s.undecided[d.Page] == nil && !bytes.Equal(d.Data, s.ref[d.Page]) {
		s.fail("%v reported a stable copy of %v: %v, the latest is %v", n.id, d.Page, d.Data, s.ref[d.Page])
	}
}

// settle decides the data of an undecided page once its home's word is a
// home word (no stamp): the home's rebuild or repair made the slot's data
// the page's, and no old home writes it any more.
func (s *Sim) settle(p ids.PageNo) {
	cands := s.undecided[p]
	if cands == nil {
		return
	}
	sl := s.slots[p]
	if w := sl.word(); w == 0 || w.Holder() == coherence.NotHome || s.gone[sl.home] {
		return
	}
	delete(s.undecided, p)
	data := sl.data(s.Opts.PageSize)
	for _, c := range cands {
		if bytes.Equal(c, data) {
			copy(s.ref[p], data)
			s.tracef("%v: its data is decided at %v: %v", p, sl.home, data)
			return
		}
	}
	s.fail("%v: the home %v made %v its data, none of %v", p, sl.home, data, cands)
}

// liveTenure reports whether a live node holds page p in M or claims its
// tenure (a release under way, or frozen by a move).
func (s *Sim) liveTenure(p ids.PageNo) bool {
	for _, n := range s.nodes[1:] {
		if n.alive && n.sm.Page(p).Tenure {
			return true
		}
	}
	return false
}

// placement is the current homes of the pages, as a function of the page
// that later moves do not change.
func (s *Sim) placement() func(ids.PageNo) ids.NodeID {
	homes := make([]ids.NodeID, s.Opts.Pages)
	for p := range homes {
		homes[p] = s.slots[ids.PageNo(p)].home
	}
	return func(p ids.PageNo) ids.NodeID {
		if int(p) < len(homes) {
			return homes[p]
		}
		return s.homeOf(p)
	}
}

// slotsReady hands SlotsReady to one new home that has learnt the epoch
// of its slots, if there is one; it reports whether it did.
func (s *Sim) slotsReady() bool {
	var due []ids.NodeID
	for id, e := range s.slotsDue {
		if n := s.nodes[id]; !n.alive {
			delete(s.slotsDue, id)
		} else if n.sm.Epoch() >= e {
			due = append(due, id)
		}
	}
	if len(due) == 0 {
		return false
	}
	slices.Sort(due)
	id := due[s.rng.Intn(len(due))]
	n := s.nodes[id]
	e := s.slotsDue[id]
	delete(s.slotsDue, id)
	s.tracef("%v slots ready for %v", id, e)
	if err := n.sm.Step(coherence.SlotsReady{Epoch: e}); err != nil {
		s.fail("%v refused SlotsReady: %v", id, err)
		return true
	}
	s.apply(n)
	return true
}

// movedTo is the homes of the pages that moved so far: a joiner waits for
// their moves. A page that moved back to its first home counts too (a
// promotion, then a crash of the new home): its move may not be done.
// Once a page has moved away from a live home, every member: a home can
// gain a page in an epoch and lose it in a later one, and wait for the
// counts of that epoch's members while its new members learn nothing of
// it (dsmd's regionChains.targets names every member then too; found by
// partition-crash seed 1092, a joiner that never reported to such a
// home).
func (s *Sim) movedTo() []ids.NodeID {
	if s.stats.Promotions > 0 {
		var out []ids.NodeID
		for _, n := range s.nodes[1:] {
			if n.alive {
				out = append(out, n.id)
			}
		}
		return out
	}
	var out []ids.NodeID
	for p := ids.PageNo(0); int(p) < s.Opts.Pages; p++ {
		if h := s.slots[p].home; s.pageMoves[p] > 0 && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return out
}

// addJoiner creates node id as a new member in the current epoch: a state
// machine started with Config.Joining, the epoch's members, and the pages
// whose home moved so far (it asks their new homes whether they are
// rebuilt).
func (s *Sim) addJoiner(id ids.NodeID, members []ids.NodeID) error {
	if int(id) != len(s.nodes) {
		return fmt.Errorf("sim: the next new id is n%d", len(s.nodes))
	}
	ep, err := s.net.Endpoint(id)
	if err != nil {
		return err
	}
	sm, err := coherence.NewNode(coherence.Config{
		ID: id, PageSize: s.Opts.PageSize, Epoch: s.epoch, Members: members,
		HomeOf: s.placement(), Targets: s.movedTo(), Backups: s.backupsNow(), Joining: true,
	})
	if err != nil {
		return err
	}
	n := &simNode{id: id, sm: sm, ep: ep, alive: true, joining: sm.Joining(), placed: slices.Clone(s.rcHomes), learnt: s.epoch}
	ep.SetHandler(func(from ids.NodeID, b []byte) { s.receive(n, from, b) })
	s.fenceZombies(n)
	s.nodes = append(s.nodes, n)
	s.tracef("%v joins in %v", id, s.epoch)
	s.apply(n)
	return nil
}

// Join moves to the next epoch with node id (the next new id) added as a
// joining member: it is created in the new epoch; the others learn it at
// once, or only when Learn hands it over (async).
func (s *Sim) Join(id ids.NodeID, async bool) error {
	if int(id) != len(s.nodes) {
		return fmt.Errorf("sim: the next new id is n%d", len(s.nodes))
	}
	s.step++
	s.reconfigureJoin(async, 1)
	s.check(false)
	return s.err
}

// ReconfigureAsync moves to the next epoch like Reconfigure, but no node
// learns it until Learn hands it over.
func (s *Sim) ReconfigureAsync() {
	s.step++
	s.reconfigure(true)
	s.check(false)
}

// Learn hands the latest reconfiguration to node id, if it lags.
func (s *Sim) Learn(id ids.NodeID) error {
	i := slices.Index(s.lagging, id)
	if i < 0 {
		return fmt.Errorf("sim: %v does not lag", id)
	}
	s.step++
	s.reconfigureOne(i)
	s.check(false)
	return nil
}

// reconfigureOne hands the latest reconfiguration to the i-th lagging node.
func (s *Sim) reconfigureOne(i int) {
	n := s.nodes[s.lagging[i]]
	s.lagging = slices.Delete(s.lagging, i, i+1)
	rc := s.rcFor(n)
	if !slices.Equal(rc.Targets, s.rc.Targets) {
		// It skipped an epoch that moved pages.
		s.tracef("%v learns %v targets=%v", n.id, rc.Epoch, rc.Targets)
	} else {
		s.tracef("%v learns %v", n.id, rc.Epoch)
	}
	if !slices.Equal(n.placed, s.prevHomes) {
		s.stats.SkippedMoves++
	}
	n.placed = slices.Clone(s.rcHomes)
	n.learnt = rc.Epoch
	if rc.SlotsPending && slices.Contains(rc.Targets, n.id) && s.slotsDue[n.id] < rc.Epoch {
		// A target by an epoch it skipped: its slots are those of the
		// epoch it learns.
		s.slotsDue[n.id] = rc.Epoch
	}
	s.fenceZombies(n)
	// Slots left behind by moves that the node layer must clear
	// (clearOne) before a fill writes them.
	rc.ClearPending = s.clearPending(n.id, rc.Epoch)
	if err := n.sm.Step(rc); err != nil {
		s.fail("%v refused reconfiguration: %v", n.id, err)
	}
	s.apply(n)
}

// rcFor is the latest reconfiguration as node n learns it: the latest
// members, backups and placement, with the targets computed against the
// placement of the last epoch n learnt (the epochs it skips may have moved
// pages): the new homes of the pages whose home differs, and the targets of
// every epoch it skips. Without a target, no placement.
func (s *Sim) rcFor(n *simNode) coherence.Reconfigure {
	rc := s.rc
	rc.HomeOf, rc.Targets, rc.SlotsPending = nil, nil, false
	for p, h := range s.rcHomes {
		if h != n.placed[p] && !slices.Contains(rc.Targets, h) {
			rc.Targets = append(rc.Targets, h)
		}
	}
	// The targets of the epochs it skips too: a page moved to a target
	// there may have moved on since (a move away from a live home), and
	// that target still waits for this node's count.
	for e := n.learnt + 1; e < rc.Epoch; e++ {
		for _, t := range s.epochTargets[e] {
			if slices.Contains(rc.Members, t) && !slices.Contains(rc.Targets, t) {
				rc.Targets = append(rc.Targets, t)
			}
		}
	}
	if len(rc.Targets) > 0 {
		slices.Sort(rc.Targets)
		rc.HomeOf = s.rcPlace
		rc.SlotsPending = s.Opts.SlowSlots
	}
	return rc
}

// Tick advances the clock of every live node, as a step of its own.
func (s *Sim) Tick() {
	s.step++
	s.tick()
	s.check(false)
}

func (s *Sim) tick() {
	s.tracef("tick")
	for _, n := range s.nodes[1:] {
		if n.alive || n.zombie {
			_ = n.sm.Step(coherence.Tick{})
			s.apply(n)
		}
	}
}

// ---- the scheduler ----

func (s *Sim) busy() bool {
	if len(s.net.Pending()) > 0 || len(s.done) > 0 {
		return true
	}
	for _, n := range s.nodes[1:] {
		if n.alive && (n.client != nil || !n.sm.Quiet() || n.mstate >= 2) {
			return true
		}
	}
	return s.reconf >= 0 || len(s.lagging) > 0 || s.filling() || len(s.stampsDue) > 0 || len(s.clearsDue) > 0 || len(s.clearAsk) > 0 || s.drainer != ids.None || s.suspendee != ids.None
}

// deliverOne delivers (or, with faults, drops or duplicates, or executes
// with an unknown outcome) the i-th pending delivery.
func (s *Sim) deliverOne(d *mem.Delivery, faults bool) {
	if faults {
		switch x := s.rng.Intn(100); {
		case x < 3:
			s.tracef("drop %v", d)
			_ = s.net.Drop(d)
			return
		case x < 6 && d.Kind == mem.MessageDelivery:
			s.tracef("duplicate %v", d)
			_ = s.net.Duplicate(d)
		case x < 15 && d.Kind == mem.BatchDelivery && s.Opts.UnknownOutcomes:
			// About one batch in eight: executed, in part or not at all.
			s.unknownOutcome(d, s.rng.Intn(len(d.Ops)+1))
			return
		}
	}
	s.noteBatch(d, "")
	s.noteZombieBatch(d)
	_ = s.net.Deliver(d)
	if s.Opts.SplitReads {
		s.traceRest(d)
	}
}

// deliverSplit delivers d, a batch stopping in the middle of its first
// READ of more than 8 bytes (mem.Network.DeliverSplit).
func (s *Sim) deliverSplit(d *mem.Delivery) {
	s.noteBatch(d, ", split")
	_ = s.net.DeliverSplit(d)
	s.traceRest(d)
}

// noteBatch counts and traces the execution of d when it is a batch (or
// the rest of one); how is appended to the trace line.
func (s *Sim) noteBatch(d *mem.Delivery, how string) {
	if d.Kind != mem.BatchDelivery {
		return
	}
	s.stats.Batches++
	if d.Continues != 0 {
		s.stats.Rests++
	}
	s.tracef("execute %v%s", d, how)
}

// traceRest traces the rest of d that its delivery left queued, if any.
func (s *Sim) traceRest(d *mem.Delivery) {
	if !s.Opts.Trace || d.Kind != mem.BatchDelivery {
		return
	}
	batch := d.Seq
	if d.Continues != 0 {
		batch = d.Continues
	}
	for _, r := range s.net.Pending() {
		if r.Continues == batch {
			s.tracef("  its rest waits: %v", r)
		}
	}
}

// errUnknown is the error of a batch of unknown outcome, as the tcp
// transport reports it.
func errUnknown(peer ids.NodeID) error {
	return &rdma.PeerError{Peer: peer, Err: fmt.Errorf("sim: response lost: %w", rdma.ErrOutcomeUnknown)}
}

// unknownOutcome executes the first k ops of a pending batch (all, some or
// none) and fails it with an unknown outcome: its node learns nothing of
// what executed.
func (s *Sim) unknownOutcome(d *mem.Delivery, k int) {
	before := len(s.done)
	s.stats.Unknown++
	switch {
	case k == len(d.Ops):
		s.stats.Batches++
		s.stats.UnknownExecuted++
		s.tracef("execute %v, outcome unknown", d)
		_ = s.net.Deliver(d)
	case k > 0:
		s.stats.UnknownExecuted++
		s.partialFrom = d.From
		s.tracef("execute %d of %v, outcome unknown", k, d)
		s.executePrefix(d, k)
		_ = s.net.Drop(d)
	default:
		s.tracef("lose %v, outcome unknown", d)
		_ = s.net.Drop(d)
	}
	if len(s.done) == before+1 {
		s.done[before].err = errUnknown(d.To)
	}
}

// executePrefix runs the first k ops of a pending batch on the target's
// memory, as a target that failed in the middle of the batch would; the
// results are not kept (the answer is lost).
func (s *Sim) executePrefix(d *mem.Delivery, k int) {
	if !s.nodes[d.To].alive {
		return
	}
	for _, op := range d.Ops[:k] {
		var mem []byte
		for _, sl := range s.slots {
			if sl.home == d.To && sl.reg.Descriptor().RKey == op.RKey {
				mem = sl.reg.Bytes()
				break
			}
		}
		for _, bs := range s.bslots {
			if sl, ok := bs[d.To]; ok && mem == nil && sl.reg.Descriptor().RKey == op.RKey {
				mem = sl.reg.Bytes()
			}
		}
		if mem == nil {
			s.fail("executePrefix: no slot with key %#x at %v", op.RKey, d.To)
			return
		}
		switch op.Kind {
		case rdma.OpWrite:
			copy(mem[op.Offset:], op.Buf)
		case rdma.OpCAS:
			if rdma.LoadWord(mem, op.Offset) == op.Compare {
				rdma.StoreWord(mem, op.Offset, op.Operand)
			}
		case rdma.OpFAA:
			rdma.StoreWord(mem, op.Offset, rdma.LoadWord(mem, op.Offset)+op.Operand)
		}
	}
}

// randomStep takes one step. workload: new requests may be issued and
// faults injected.
func (s *Sim) randomStep(workload bool) {
	s.step++
	if s.reconf >= 0 {
		if s.reconf == 0 {
			s.reconf = -1
			joins := s.toJoin
			s.toJoin = 0
			s.reconfigureJoin(s.Opts.AsyncReconfig, joins)
			return
		}
		s.reconf--
	}
	if len(s.lagging) > 0 && s.rng.Intn(s.Opts.LearnOdds) == 0 {
		s.reconfigureOne(s.rng.Intn(len(s.lagging)))
		return
	}
	if len(s.slotsDue) > 0 && s.rng.Intn(16) == 0 && s.slotsReady() {
		return
	}
	if len(s.fillsDue) > 0 && s.rng.Intn(8) == 0 && s.issueFill(false) {
		return
	}
	if len(s.stampsDue) > 0 && s.rng.Intn(8) == 0 && s.stampOne() {
		return
	}
	if len(s.clearsDue)+len(s.clearAsk) > 0 && s.rng.Intn(8) == 0 && s.clearOne() {
		return
	}
	if workload && s.persists < s.Opts.Persists && s.rng.Intn(40) == 0 && s.persistOne() {
		return
	}
	if s.drainer != ids.None && s.rng.Intn(4) == 0 && s.driveDrain() {
		return
	}
	if s.suspendee != ids.None && s.drivePartition() {
		return
	}
	if workload && s.partitions < s.Opts.Partitions && s.suspendee == ids.None && s.drainer == ids.None && s.reconf < 0 && len(s.lagging) == 0 &&
		s.partitions*s.Opts.Ops < s.Opts.Partitions*(s.issued+1) && s.rng.Intn(20) == 0 && s.startPartition() {
		return
	}
	if workload && s.drains < s.Opts.Drains && s.drainer == ids.None && s.reconf < 0 && len(s.lagging) == 0 &&
		s.drains*s.Opts.Ops < s.Opts.Drains*(s.issued+1) && s.rng.Intn(20) == 0 && s.startDrain() {
		return
	}
	pending := s.net.Pending()
	x := s.rng.Intn(100)
	if !workload && s.Opts.Mutex && x < 20 {
		// Clients inside a critical section finish it.
		for _, n := range s.nodes[1:] {
			if n.alive && n.client == nil && n.mstate >= 2 {
				s.mutexNext(n)
				return
			}
		}
	}
	if workload && x < 20 && s.issued < s.Opts.Ops && s.empties < s.Opts.EmptyEpochs &&
		s.empties*s.Opts.Ops < s.Opts.EmptyEpochs*(s.issued+1) && s.reconf < 0 && len(s.lagging) == 0 {
		// An empty epoch between two requests: the tags move on (and
		// wrap), nobody departs.
		s.empties++
		s.stats.EmptyEpochs++
		s.reconfigure(s.Opts.AsyncReconfig)
		return
	}
	switch {
	case workload && x < 20 && s.issued < s.Opts.Ops:
		var idle []*simNode
		for _, n := range s.nodes[1:] {
			if (n.alive && !n.suspended || n.zombie && s.Opts.UnsafeLease) && n.client == nil && !s.draining[n.id] {
				idle = append(idle, n)
			}
		}
		if len(idle) > 0 {
			s.issued++
			s.randomRequest(idle[s.rng.Intn(len(idle))])
			return
		}
	case workload && s.crashes < s.Opts.Crashes && s.reconf < 0 && (len(s.lagging) == 0 || s.Opts.SkipMoves) && (x < 21 && s.rng.Intn(6) == 0 || s.partialCrashDue()):
		// With SkipMoves, a crash (and later its reconfiguration) may
		// come while nodes lag: they will skip the epochs between.
		cand := s.crashCandidates()
		if len(cand) > 0 {
			if s.Opts.Fills && s.filling() {
				s.stats.MidFillCrashes++
			}
			s.crashes++
			victim := cand[s.rng.Intn(len(cand))].id
			if s.Opts.CrashPartial && slices.ContainsFunc(cand, func(n *simNode) bool { return n.id == s.partialFrom }) {
				victim = s.partialFrom
			}
			s.partialFrom = ids.None
			for _, sl := range s.slots {
				if sl.home == victim {
					s.homeCrashes++
					break
				}
			}
			_ = s.crash(victim)
			if s.restarts < s.Opts.Restarts {
				// A restart: the reconfiguration that removes the
				// victim adds its new incarnation under a new id.
				s.restarts++
				s.toJoin++
			}
			s.reconf = 5 + s.rng.Intn(60)
			return
		}
	case workload && x < 22 && s.joins < s.Opts.Joins && s.reconf < 0 && (len(s.lagging) == 0 || s.rc.HomeOf == nil || s.Opts.SkipMoves) && s.rng.Intn(2) == 0:
		// A join, in an epoch of its own; with AsyncReconfig possibly
		// while nodes lag behind the last epoch (they skip it), unless
		// that epoch moved pages and SkipMoves is off.
		s.joins++
		s.reconfigureJoin(s.Opts.AsyncReconfig, 1)
		return
	case workload && x < 23 && s.taints < s.Opts.Taints && s.reconf < 0 && (len(s.lagging) == 0 || s.rc.HomeOf == nil || s.Opts.SkipMoves) &&
		s.taints*s.Opts.Ops < s.Opts.Taints*(s.issued+1) && s.rng.Intn(4) == 0:
		// A taint: the same members, one live node (of the first
		// epoch: joiners back up nothing) is a backup of no page from
		// this epoch on, and is never promoted.
		var cand []ids.NodeID
		for _, n := range s.nodes[1 : s.Opts.Nodes+1] {
			if n.alive && !s.tainted[n.id] && !s.draining[n.id] && n.id != s.suspendee {
				cand = append(cand, n.id)
			}
		}
		if len(cand) > 0 {
			s.taints++
			s.stats.Taints++
			victim := cand[s.rng.Intn(len(cand))]
			s.tainted[victim] = true
			s.tracef("taint %v: a backup of no page from now on, never promoted", victim)
			s.reconfigure(s.Opts.AsyncReconfig)
			return
		}
	case workload && x < 24 && s.promotions < s.Opts.Promotions && s.reconf < 0 && (len(s.lagging) == 0 || s.Opts.SkipMoves) &&
		s.promotions*s.Opts.Ops < s.Opts.Promotions*(s.issued+1) && s.rng.Intn(3) == 0:
		// A move away from a live home: a complete backup is promoted
		// and the old home demoted, in an epoch without a departure
		// (a joiner that won the page once filled, a drain).
		if p, c, ok := s.choosePromotion(); ok {
			s.promotions++
			s.promote[p] = c
			s.tracef("promote %v from live %v to %v", p, s.slots[p].home, c)
			s.reconfigure(s.Opts.AsyncReconfig)
			return
		}
	case x < 30 && (len(pending) < 4*s.Opts.Nodes || s.rng.Intn(10) == 0):
		// Time passes slowly while much is in flight: the network is
		// much faster than a tick.
		s.tick()
		return
	case x < 55 && len(s.done) > 0:
		s.completeBatch(s.rng.Intn(len(s.done)))
		return
	}
	if len(pending) > 0 {
		s.deliverOne(pending[s.rng.Intn(len(pending))], workload && s.Opts.Faults)
		return
	}
	if len(s.done) > 0 {
		s.completeBatch(s.rng.Intn(len(s.done)))
		return
	}
	s.tick()
}

func (s *Sim) run() (Stats, error) {
	for s.issued < s.Opts.Ops {
		// Every epoch while a move may be under way costs every member
		// a count to every member and an answer back (MsgMoveReport,
		// MsgMoveDone), repeated while the new homes wait.
		limit := s.Opts.Ops*200 + 10000 + s.moveEpochs*8*len(s.nodes)*len(s.nodes)
		if s.step > limit {
			s.fail("workload did not finish in %d steps:\n%s", limit, s.Dump())
			break
		}
		s.randomStep(true)
		s.check(false)
		if s.err != nil {
			return s.stats, s.err
		}
	}
	start := s.step
	for s.busy() {
		if s.step-start > s.Opts.SettleSteps {
			s.fail("liveness: still busy %d steps after the faults stopped:\n%s", s.step-start, s.Dump())
			break
		}
		s.randomStep(false)
		s.check(false)
		if s.err != nil {
			return s.stats, s.err
		}
	}
	s.stats.SettleSteps = s.step - start
	s.stats.Steps = s.step
	s.stats.Crashes, s.stats.HomeCrashes = s.crashes, s.homeCrashes
	s.stats.Joins = len(s.nodes) - 1 - s.Opts.Nodes
	if s.err == nil {
		s.check(true)
	}
	if s.err == nil && s.Opts.Mutex && s.crashes == 0 {
		if got := s.refWord(0, 8); got != s.csCount {
			s.fail("mutex: counter is %d after %d critical sections", got, s.csCount)
		}
	}
	if s.err == nil && s.Opts.Linearizability {
		if err := checkLinearizable(s.history); err != nil {
			s.fail("%v", err)
		}
	}
	return s.stats, s.err
}

// crashCandidates are the nodes a crash may hit now.
func (s *Sim) crashCandidates() []*simNode {
	var cand []*simNode
	from := s.Opts.homes() + 1
	if s.homeCrashes < s.Opts.HomeCrashes || s.Opts.Fills {
		from = 1
	}
	for _, n := range s.nodes[from:] {
		if n.alive && !s.draining[n.id] && n.id != s.suspendee && (!s.Opts.Fills || s.mayLose(n.id)) {
			cand = append(cand, n)
		}
	}
	if s.Opts.Fills && !s.Opts.MidFillCrashes && s.filling() {
		return nil // one node lost at a time: the fills first
	}
	return cand
}

// partialCrashDue reports whether CrashPartial asks for a crash now: the
// sender of the last batch that executed in part may crash.
func (s *Sim) partialCrashDue() bool {
	return s.Opts.CrashPartial && s.partialFrom != ids.None &&
		slices.ContainsFunc(s.crashCandidates(), func(n *simNode) bool { return n.id == s.partialFrom })
}

// ---- invariants ----

// Check verifies the invariants now; quiescent adds those that hold only
// when nothing is in flight. It returns the first violation.
func (s *Sim) Check(quiescent bool) error {
	s.check(quiescent)
	return s.err
}

func (s *Sim) check(quiescent bool) {
	if s.err != nil {
		return
	}
	for p := ids.PageNo(0); int(p) < s.Opts.Pages; p++ {
		s.settle(p)
		s.settleZombie(p)
		var holder ids.NodeID
		valid := 0
		for _, n := range s.nodes[1:] {
			if !n.alive {
				continue
			}
			state, data := n.sm.Copy(p)
			if state == coherence.Invalid {
				continue
			}
			valid++
			if state == coherence.Modified {
				if holder != ids.None {
					s.fail("single writer: %v and %v both hold %v in M", holder, n.id, p)
					return
				}
				holder = n.id
			}
			if !bytes.Equal(data, s.ref[p]) {
				s.fail("data: %v's %v copy of %v is %v, the latest is %v", n.id, state, p, data, s.ref[p])
				return
			}
		}
		if holder != ids.None && valid > 1 {
			s.fail("single writer: %v holds %v in M while %d other copies are valid", holder, p, valid-1)
			return
		}
		if quiescent {
			s.checkWord(p, holder)
		} else {
			s.checkBeliefs(p)
		}
		s.checkBackups(p)
		if s.err != nil {
			return
		}
	}
}

// checkBeliefs checks, at every step, what nodes believe of the word of p
// against the word. A node that believes its sharer unit counted at the
// word's version is counted: its exact bit is set, and the coarse count is
// at least the number of such coarse nodes. A node in M is the word's
// holder at its copy's version. And the word holds no unit that no node
// can account for: an exact bit is set only for a believer, a node in the
// middle of a transition of p (an FAA or a release CAS whose completion is
// on its way, an eviction, a resolution) or a departed node; the coarse
// count is at most the number of such coarse nodes.
// A wrong resolution of a batch of unknown outcome breaks one of these at
// once, where the check at the end of a run would see it only if no later
// acquisition cleared the word. Left out: nodes evicting or resolving from
// the lower bounds (their CAS may have executed), and pages frozen or moved
// to a home some node has not learnt of (beliefs about another word).
func (s *Sim) checkBeliefs(p ids.PageNo) {
	sl := s.slots[p]
	w := coherence.Word(rdma.LoadWord(sl.reg.Bytes(), sl.off))
	believers, unsure := 0, 0
	for _, n := range s.nodes[1:] {
		if !n.alive {
			if n.id > coherence.ExactSharers {
				unsure++
			}
			continue
		}
		if n.placed[p] != sl.home {
			// The node has not learnt the move of p yet (it may
			// lag several epochs): beliefs about another word.
			return
		}
		info := n.sm.Page(p)
		if info.Frozen {
			return
		}
		if info.State == coherence.Modified && (w.Holder() != n.id || w.Version() != info.Version) {
			s.fail("%v holds %v in M at v%d but the word is %v", n.id, p, info.Version, w)
			return
		}
		believes := info.Unit && info.UnitVersion == w.Version()
		if info.Phase != "idle" && n.id > coherence.ExactSharers {
			unsure++
		}
		if n.id <= coherence.ExactSharers && w.Exact()&(1<<(n.id-1)) != 0 && !believes && info.Phase == "idle" {
			s.fail("word of %v is %v: the bit of %v is set, and it does not believe its unit counted", p, w, n.id)
			return
		}
		if !believes || info.Phase == "evict" || info.Phase == "resolve" {
			continue
		}
		if n.id > coherence.ExactSharers {
			believers++
		} else if w.Exact()&(1<<(n.id-1)) == 0 {
			s.fail("%v believes its unit counted in %v at v%d, but the word is %v", n.id, p, info.UnitVersion, w)
			return
		}
	}
	if c := int(w.Coarse()); c < believers || c > believers+unsure {
		s.fail("word of %v is %v: %d coarse nodes believe their unit counted, %d may have a unit in it", p, w, believers, unsure)
	}
}

func (s *Sim) checkWord(p ids.PageNo, holder ids.NodeID) {
	sl := s.slots[p]
	w := coherence.Word(rdma.LoadWord(sl.reg.Bytes(), sl.off))
	named, resv := w.Holder(), w.Reserved()
	stamp := named == coherence.NotHome
	if stamp {
		// A promoted backup's stamp that nobody used since: the first
		// use has the home repair it into a word without a holder.
		named = ids.None
	}
	if s.Opts.LazyHomes || s.pageMoves[p] > 0 {
		// Lazy repair: a word nobody touched since a departure may still
		// name the departed holder or reserver (its home repairs it when
		// a node finds it), and keeps an older tag (the trust rule). A
		// page that moved is lazy at its new home in every mode: the
		// home's HomedPages, given at its start, do not list it, and it
		// has a duty only once a rebuild, a MsgStamp or a starving node
		// made one (home-crash seed 3415: a page promoted to its backup
		// with no report to rebuild from, acquired there by a node that
		// then crashed, its word never used again).
		if s.gone[named] {
			named = ids.None
		}
		if s.gone[resv] {
			resv = ids.None
		}
	} else {
		// The homes list their pages: after every departure they
		// repaired every word.
		for id := ids.NodeID(1); id <= coherence.ExactSharers; id++ {
			if s.gone[id] && w.Exact()&(1<<(id-1)) != 0 {
				s.fail("word of %v is %v: departed %v's sharer bit was not repaired", p, w, id)
				return
			}
		}
		if s.gone[named] || s.gone[resv] {
			s.fail("word of %v is %v: it names a departed node", p, w)
			return
		}
		// Every epoch had a departure (no empty epoch, join or taint),
		// so the last repair stamped the last epoch's tag, unless a
		// lagging node's CAS, posted before it learnt the epoch,
		// executed after the repair (the trust rule allows it: the tag
		// is advisory).
		if !stamp && s.Opts.EmptyEpochs == 0 && s.Opts.Joins == 0 && s.Opts.Taints == 0 && !s.Opts.AsyncReconfig && w.Tag() != uint8(s.epoch&15) {
			s.fail("word of %v is %v, in epoch %v", p, w, s.epoch)
			return
		}
	}
	if named != holder {
		s.fail("word of %v is %v, but the M holder is %v", p, w, holder)
		return
	}
	if holder == ids.None {
		home := sl.reg.Bytes()[sl.off+8 : sl.off+8+uint64(s.Opts.PageSize)]
		if !bytes.Equal(home, s.ref[p]) {
			s.fail("lost update: home copy of %v is %v, the latest is %v", p, home, s.ref[p])
			return
		}
	}
	if resv != ids.None {
		s.fail("word of %v is still reserved when quiet: %v", p, w)
		return
	}
	coarse, goneCoarse := 0, 0
	for _, n := range s.nodes[1:] {
		if !n.alive {
			if n.id > coherence.ExactSharers {
				goneCoarse++
			}
			continue
		}
		info := n.sm.Page(p)
		counted := info.Unit && info.UnitVersion == w.Version()
		if info.State == coherence.Shared && (!counted || info.Version != w.Version()) {
			s.fail("%v shares %v at v%d (unit=%t@%d) but the word is %v", n.id, p, info.Version, info.Unit, info.UnitVersion, w)
			return
		}
		if info.State == coherence.Modified && info.Version != w.Version() {
			s.fail("%v holds %v at v%d but the word is %v", n.id, p, info.Version, w)
			return
		}
		if n.id <= coherence.ExactSharers {
			if bit := w.Exact()&(1<<(n.id-1)) != 0; bit != counted {
				s.fail("word of %v is %v: bit of %v is %t, the node's unit is %t@%d", p, w, n.id, bit, info.Unit, info.UnitVersion)
				return
			}
		} else if counted {
			coarse++
		}
	}
	if c := int(w.Coarse()); c < coarse || c > coarse+goneCoarse {
		s.fail("word of %v is %v: %d coarse sharers live, %d gone", p, w, coarse, goneCoarse)
	}
}

// Dump describes every live node and the word of every page.
func (s *Sim) Dump() string {
	var b strings.Builder
	for p := ids.PageNo(0); int(p) < s.Opts.Pages; p++ {
		sl := s.slots[p]
		w := coherence.Word(rdma.LoadWord(sl.reg.Bytes(), sl.off))
		home := sl.reg.Bytes()[sl.off+8 : sl.off+8+uint64(s.Opts.PageSize)]
		fmt.Fprintf(&b, "%v@%v word=%v home[0]=%d ref[0]=%d", p, sl.home, w, binary.LittleEndian.Uint64(home), s.refWord(p, 0))
		if s.Opts.Fills {
			b.WriteString(" backups=")
			for i, id := range s.bset[p] {
				if i > 0 {
					b.WriteString(",")
				}
				fmt.Fprintf(&b, "%v", id)
				if !s.complete[p][id] {
					b.WriteString("(filling)")
				}
			}
		}
		b.WriteString("\n")
	}
	for _, d := range s.fillsDue {
		fmt.Fprintf(&b, "fill due: %v ->%v at %v from %v\n", d.page, d.to, d.home, d.epoch)
	}
	for _, d := range slices.SortedFunc(maps.Keys(s.fillOut), func(a, b fillDue) int { return int(a.page) - int(b.page) }) {
		fmt.Fprintf(&b, "fill under way: %v ->%v at %v\n", d.page, d.to, d.home)
	}
	for _, n := range s.nodes[1:] {
		if !n.alive {
			fmt.Fprintf(&b, "%v down\n", n.id)
			continue
		}
		b.WriteString(n.sm.Dump())
	}
	return b.String()
}

func decode(b []byte) (string, error) {
	m, err := coherence.Unmarshal(b)
	if err != nil {
		return "", err
	}
	return m.String(), nil
}
