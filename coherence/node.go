package coherence

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/dsmkit/dsm/internal/ids"
)

// State is the MSI state of a node's copy of a page. The zero value is
// Invalid.
type State uint8

const (
	// Invalid: no copy.
	Invalid State = iota
	// Shared: a read-only copy, valid until an invalidation of a newer
	// tenure arrives.
	Shared
	// Modified: the only copy; the node is the exclusive holder.
	Modified
)

func (s State) String() string {
	switch s {
	case Invalid:
		return "I"
	case Shared:
		return "S"
	case Modified:
		return "M"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Config configures a Node.
type Config struct {
	// ID is this node; 1..MaxNodeID.
	ID ids.NodeID
	// PageSize is the page size in bytes: a positive multiple of 8.
	PageSize int
	// Epoch and Members are the initial configuration.
	Epoch   ids.Epoch
	Members []ids.NodeID
	// Joining says that this node is new to the protocol: it was a member
	// of no epoch before Epoch (a node that joined the cluster after the
	// region was created, or a restarted node under its new protocol id).
	// Members may still be in an older epoch, in which its id names a
	// node that is not a member (by the trust rule: a departed one), so
	// it posts nothing and sends no request until every member has
	// acknowledged an epoch it is a member of (docs/protocol.md, "Members
	// that join"). A node that was a member from the region's first epoch
	// leaves it false.
	Joining bool
	// HomeOf names the home of a page in the initial epoch: a pure
	// function of the page. Reconfigure.HomeOf changes it. A joining node
	// does not know which pages moved before it was created, nor whether
	// their moves are done: every page of a home in Targets waits until
	// that home says that its moves are done (MsgMoveDone). A node is not
	// created as the new home of a page whose move is not done.
	HomeOf func(ids.PageNo) ids.NodeID
	// Backups names the backups of a page (never its home): every
	// release writes the page's data and Stamp of its tenure to each of
	// them before its CAS at the home. Nil: no backups.
	Backups func(ids.PageNo) []ids.NodeID
	// Targets are, for a joining node, the new homes whose moves may not
	// be done yet (the targets of recent epochs that moved pages): every
	// page they home waits until they say that their moves are done.
	Targets []ids.NodeID
	// HomedPages are the pages this node is home for: after a departure
	// it repairs their words eagerly (releases what departed members held
	// and stamps the new epoch tag). A home that does not list a page (a
	// sparse region: the list would be too long) creates that page's duty
	// the first time a starving node queues for it (MsgEnqueue) or a node
	// finds its word naming a departed holder or reserver (MsgStamp), and
	// repairs it then. Words of pages nobody lists are used as they are
	// (the trust rule), whatever their tag: the zero word of a home slot
	// never touched is valid in every epoch.
	HomedPages []ids.PageNo
	// RetransmitTicks is how long an invalidation waits for its
	// acknowledgement before it is sent again (default 4).
	RetransmitTicks int
	// MaxBackoffTicks caps the exponential backoff of a blocked request
	// (default 8).
	MaxBackoffTicks int
	// StarveAttempts is the number of failed attempts after which a
	// request reserves the page (default 3).
	StarveAttempts int
}

func (c *Config) validate() error {
	if c.ID == ids.None || c.ID > MaxNodeID {
		return fmt.Errorf("%w: node id %d outside 1..%d", ErrBadConfig, c.ID, MaxNodeID)
	}
	if c.PageSize <= 0 || c.PageSize%8 != 0 {
		return fmt.Errorf("%w: page size %d", ErrBadConfig, c.PageSize)
	}
	if c.Epoch == 0 {
		return fmt.Errorf("%w: epoch 0", ErrBadConfig)
	}
	if c.HomeOf == nil {
		return fmt.Errorf("%w: no HomeOf", ErrBadConfig)
	}
	for _, m := range c.Members {
		if m == ids.None || m > MaxNodeID {
			return fmt.Errorf("%w: member id %d outside 1..%d", ErrBadConfig, m, MaxNodeID)
		}
	}
	if c.RetransmitTicks <= 0 {
		c.RetransmitTicks = 4
	}
	if c.MaxBackoffTicks <= 0 {
		c.MaxBackoffTicks = 8
	}
	if c.StarveAttempts <= 0 {
		c.StarveAttempts = 3
	}
	return nil
}

// phase is what a page's client side is doing.
type phase uint8

const (
	phIdle     phase = iota
	phRead           // FAA or READ of the word, READ of the page and the word, until a valid copy arrives
	phAcquire        // CAS for the tenure (or READ of the word to refresh)
	phWaitAcks       // tenure held, waiting for invalidation acks (and data)
	phRelease        // write-back and release of the tenure
	phEvict          // removing the sharer unit after dropping an S copy
	phPassTurn       // CAS handing our reservation back to the home
	// phResolve: a batch of another phase (resolving) came back with an
	// outcome that is not known (VerbsDone.Unknown); a READ of the word
	// decides whether it took effect (resolve.go).
	phResolve
	// phBackup: the release writes its stamp and data to each backup,
	// one after the other, before phRelease (docs/failover.md §7).
	phBackup
)

var phaseNames = [...]string{"idle", "read", "acquire", "wait-acks", "release", "evict", "pass-turn", "resolve", "backup"}

func (p phase) String() string { return phaseNames[p] }

// page is one page as seen by this node.
type page struct {
	no   ids.PageNo
	home ids.NodeID
	// seq orders pages by creation (Node.order); active: the page is in
	// Node.active.
	seq    uint64
	active bool

	state   State
	data    []byte // S, M: the copy
	copyVer uint16 // S, M: tenure of the copy

	// unitCounted: our sharer unit is in the word, added when the word's
	// version was unitVer. It stays there until the next acquisition
	// (which bumps the version), or until we remove it.
	unitCounted bool
	unitVer     uint16

	guess Word // the last word observed

	// ended: since the page's word was last rebuilt, this node learnt
	// that tenure endedVer (the newest such) had ended: it held a copy
	// of it, took a later tenure, or read a word that showed it over.
	// An Invalid page reports it to a new home (MsgReport.Ended): a
	// tenure claimed by an interrupted release that another node knows
	// to have ended had been released.
	ended    bool
	endedVer uint16

	ph       phase
	inflight uint64 // outstanding batch, 0 = none
	// abandoned: batches a freeze or a loss gave up while they were in
	// flight. Nothing new is posted for the page until they are finished
	// (I11): an abandoned batch to a peer could otherwise land after a
	// later one, an old release's data over a newer backup copy.
	abandoned []uint64
	retryAt   uint64 // tick before which nothing is posted
	attempts  int

	// phResolve: the phase whose batch had an unknown outcome, and that
	// batch's verbs.
	resolving phase
	unknown   []Verb
	// downgrade: a read miss whose coarse FAA had an unknown outcome took
	// the tenure instead; once M is granted and the queue is served, the
	// page is released to S (resolve.go).
	downgrade bool

	// phRead: invalidations seen while the read was in flight.
	invSeen bool
	invMax  uint16
	// phRead: a departure was learnt while the read was in flight. Its
	// result may predate the CAS of a departed acquirer that died before
	// its invalidation arrived; the copy would escape the drop of Shared
	// copies that the departure makes, so the read is done again.
	readStale bool

	// phAcquire / phWaitAcks
	expect   Word // CAS expected value of the attempt in flight
	acqVer   uint16
	awaiting map[ids.NodeID]bool
	needData bool
	invSent  uint64 // tick of the last (re)transmission
	invEvery int    // current retransmission interval in ticks

	// frozen: the page's home moved; nothing is posted until the new
	// home has rebuilt the word (MsgRebuilt), or said that its moves are
	// done (MsgMoveDone) for a page this node did not report. mustReport:
	// the page had state when it froze; its report goes to the new home
	// in every epoch until MsgRebuilt unfreezes it.
	frozen     bool
	mustReport bool
	// frozenM: the page froze during a release; the node claims the
	// tenure (wbData holds the data) until the rebuild says whether the
	// release had taken effect.
	frozenM bool

	// granted: the home reserved the page for us (MsgGrant, or our
	// reservation seen in the word); cleared when the turn is handed back.
	granted bool

	// a recall of tenure recallVer received
	recall      bool
	recallWrite bool
	recallVer   uint16

	// phBackup: the backups that hold this release's data and stamp
	bkAcked map[ids.NodeID]bool

	// phRelease
	relWrite  bool   // release to I (write recall, eviction) rather than S
	wroteBack bool   // the WRITE of the page executed
	wbData    []byte // the bytes to write back

	queue []Request
}

type batchRec struct {
	page  ids.PageNo
	home  bool // a home repair, not the client side
	verbs []Verb
	// to is the node the batch was posted to and epoch the epoch it was
	// posted in: an epoch acknowledgement to that node waits for every
	// batch of an older epoch (docs/failover.md §8).
	to    ids.NodeID
	epoch ids.Epoch
}

// Node is the coherence state machine of one node. It is not safe for
// concurrent use: the caller serialises Step and Ready.
type Node struct {
	cfg     Config
	epoch   ids.Epoch
	members []ids.NodeID // sorted; the authority on who may be named in a word
	now     uint64

	// Placement and moves (docs/failover.md §5, docs/protocol.md, "Epochs and failures").
	// homeFn is the current placement; hist the placements since the
	// oldest move this node may still wait for, the current one last.
	// moveAll: a joining node treats every page as moved until the
	// page's home said that its moves are done. owed: the members whose
	// MsgMoveDone this node waits for; sent: per new home, the pages
	// reported to it in this epoch; moveAt: the last MsgMoveReports.
	homeFn    func(ids.PageNo) ids.NodeID
	backupsFn func(ids.PageNo) []ids.NodeID
	hist      []func(ids.PageNo) ids.NodeID
	moveAll   bool
	owed      map[ids.NodeID]bool
	sent      map[ids.NodeID]map[ids.PageNo]bool
	moveAt    uint64
	moveEvery int // ticks between MsgMoveReports, doubling up to 16*RetransmitTicks
	// As a new home: target says that pages may have moved to this node
	// since it last completed its moves; counts are the members' counts
	// of this epoch (MsgMoveReport) and reportsIn the distinct pages each
	// has reported in it; the moves complete after SlotsReady of epoch
	// slotsNeed or later (slotsReady is the latest).
	target     bool
	counts     map[ids.NodeID]int
	reportsIn  map[ids.NodeID]int
	queryAt    map[ids.NodeID]uint64 // the last MsgQuery to each member
	slotsNeed  ids.Epoch
	slotsReady ids.Epoch

	// synced: every member has acknowledged the current epoch (MsgEpoch),
	// so no member still trusts what a departure invalidated; a home
	// repairs its words only then. Every node is unsynced after a
	// departure, not only a node with duties: a duty created later
	// (MsgStamp, MsgEnqueue) must not repair before every member has the
	// epoch. epochAcks: who has. probing: the probes are out (the node
	// has a duty); a node without duties sends none until it starts one.
	// A node starts synced, unless it joins (Config.Joining): then it
	// probes at once.
	synced    bool
	epochAcks map[ids.NodeID]bool
	probing   bool
	probeAt   uint64
	// ackOwed: members whose MsgEpoch this node answers once the batches
	// it posted to them in an older epoch are finished (epochAckDue).
	ackOwed map[ids.NodeID]bool
	// The clear of the backup slots this node entered anew (clear.go):
	// clearNeed is the latest epoch learnt with Reconfigure.ClearPending,
	// clearAsked the latest handed to the node layer (Ready.ClearSlots),
	// clearedAt the latest SlotsCleared; clearProbeAt the tick of the
	// last probe sent for it. clearedIn: the latest epoch in which each
	// member acknowledged a probe without Clearing (a fill to it waits
	// for one of its epoch).
	// clearTold: the members this node answered with Clearing in this
	// epoch, answered again once it is cleared.
	clearNeed, clearAsked, clearedAt ids.Epoch
	clearProbeAt                     uint64
	clearedIn                        map[ids.NodeID]ids.Epoch
	clearTold                        map[ids.NodeID]bool
	// joining: this node is new to the protocol and no epoch it is a
	// member of has been acknowledged by every member yet. Until then
	// its pages post no verb and send no message (drive does nothing):
	// a member still in an older epoch would take its id, found in a
	// word, for a departed node's. Cleared for good when synced.
	joining bool
	// ackedIn: the latest epoch in which each member acknowledged a
	// probe (MsgEpochAck): a fill waits until every member of its epoch
	// has acknowledged that epoch or a later one (fill.go). fillProbeAt:
	// the tick of the last probe sent for fills.
	ackedIn     map[ids.NodeID]ids.Epoch
	fillProbeAt uint64
	// fillsHeld: fills (and Persists: To None) asked for while moves to this node were not done
	// (target); they start when the moves are.
	fillsHeld []Fill

	pages map[ids.PageNo]*page
	order []*page     // creation order, for deterministic iteration
	homes []*homeDuty // creation order, for deterministic iteration
	// active and activeHomes hold every page and duty that a Tick may
	// move (not settled), and some settled ones, dropped at the next
	// Tick: a Tick walks them instead of every page and duty, which costs
	// nothing while a region of many pages is idle. A page or duty is
	// added whenever it is driven; one that leaves the settled state
	// without being driven is a bug the invariants catch. seq numbers
	// pages and duties in creation order: a Tick drives them in that
	// order.
	active      []*page
	activeHomes []*homeDuty
	seq         uint64
	homeIdx     map[ids.PageNo]*homeDuty
	// dutyAbandoned counts, per page, the batches of home duties dropped
	// (demote) that are not finished: a later duty of the page posts
	// nothing before they are (I11).
	dutyAbandoned map[ids.PageNo]int
	batches       map[uint64]batchRec
	// slotReads numbers the READs of a home slot posted for fills and
	// Persists (homeDuty.readPosted).
	slotReads uint64
	nextID    uint64

	rd Ready
}

// NewNode returns the state machine of cfg.ID.
func NewNode(cfg Config) (*Node, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	n := &Node{
		cfg:           cfg,
		epoch:         cfg.Epoch,
		members:       sortedIDs(cfg.Members),
		homeFn:        cfg.HomeOf,
		backupsFn:     cfg.Backups,
		hist:          []func(ids.PageNo) ids.NodeID{cfg.HomeOf},
		owed:          map[ids.NodeID]bool{},
		sent:          map[ids.NodeID]map[ids.PageNo]bool{},
		counts:        map[ids.NodeID]int{},
		reportsIn:     map[ids.NodeID]int{},
		queryAt:       map[ids.NodeID]uint64{},
		synced:        true,
		pages:         map[ids.PageNo]*page{},
		batches:       map[uint64]batchRec{},
		homeIdx:       map[ids.PageNo]*homeDuty{},
		dutyAbandoned: map[ids.PageNo]int{},
		ackOwed:       map[ids.NodeID]bool{},
		ackedIn:       map[ids.NodeID]ids.Epoch{},
		clearedIn:     map[ids.NodeID]ids.Epoch{},
		clearTold:     map[ids.NodeID]bool{},
	}
	if cfg.Joining {
		n.synced, n.joining = false, true
		n.epochAcks = map[ids.NodeID]bool{cfg.ID: true}
	}
	for _, p := range cfg.HomedPages {
		if n.homeIdx[p] == nil {
			n.addDuty(&homeDuty{no: p, guess: InitialWord(cfg.Epoch)})
		}
	}
	if n.joining {
		n.startProbe()
		n.moveAll = true
		for _, m := range cfg.Targets {
			if n.isMember(m) {
				n.owed[m] = true
			}
		}
		n.reportMoves()
	}
	return n, nil
}

func sortedIDs(in []ids.NodeID) []ids.NodeID {
	out := slices.Clone(in)
	slices.Sort(out)
	return slices.Compact(out)
}

// ID is the node's id.
func (n *Node) ID() ids.NodeID { return n.cfg.ID }

// Epoch is the node's current epoch.
func (n *Node) Epoch() ids.Epoch { return n.epoch }

// Ready returns the actions accumulated since the last call and clears
// them.
func (n *Node) Ready() Ready {
	rd := n.rd
	n.rd = Ready{}
	return rd
}

func (n *Node) tag() uint8 { return epochTag(n.epoch) }

func (n *Node) isMember(id ids.NodeID) bool {
	_, ok := slices.BinarySearch(n.members, id)
	return ok
}

func (n *Node) homeOf(no ids.PageNo) ids.NodeID { return n.homeFn(no) }

func (n *Node) page(no ids.PageNo) *page {
	p := n.pages[no]
	if p == nil {
		n.seq++
		p = &page{no: no, home: n.homeOf(no), guess: InitialWord(n.epoch), seq: n.seq}
		// A page this node has no state for may belong to a move that
		// is not done: it waits like the others (MsgMoveDone).
		p.frozen = n.inMove(no)
		n.pages[no] = p
		n.order = append(n.order, p)
	}
	return p
}

// Step feeds one event to the state machine. It returns an error for an
// event it refuses (a malformed request, a completion of an unknown batch,
// a message of another epoch); the state is unchanged then.
func (n *Node) Step(ev Event) error {
	if invariantsOn {
		defer n.checkInvariants()
	}
	switch ev := ev.(type) {
	case Request:
		return n.stepRequest(ev)
	case VerbsDone:
		return n.stepDone(ev)
	case Receive:
		return n.stepReceive(ev.Msg)
	case Tick:
		n.stepTick()
		return nil
	case Reconfigure:
		if err := n.stepReconfigure(ev); err != nil {
			return err
		}
		n.checkClear()
		return nil
	case SlotsReady:
		if ev.Epoch > n.epoch {
			return fmt.Errorf("%w: slots ready for %v in %v", ErrStaleEpoch, ev.Epoch, n.epoch)
		}
		n.slotsReady = max(n.slotsReady, ev.Epoch)
		n.checkMoveDone()
		return nil
	case SlotsCleared:
		if ev.Epoch > n.epoch {
			return fmt.Errorf("%w: slots cleared for %v in %v", ErrStaleEpoch, ev.Epoch, n.epoch)
		}
		if ev.Epoch > n.clearAsked {
			return fmt.Errorf("%w: slots cleared for %v, asked for %v", ErrBadRequest, ev.Epoch, n.clearAsked)
		}
		n.clearedAt = max(n.clearedAt, ev.Epoch)
		if n.clearNeed <= n.clearedAt {
			for _, m := range n.members {
				if n.clearTold[m] {
					delete(n.clearTold, m)
					n.ackOwed[m] = true
					n.epochAckDue(m)
				}
			}
		}
		return nil
	case Fill:
		return n.stepFill(ev)
	case Persist:
		return n.stepPersist(ev)
	}
	return fmt.Errorf("%w: event %T", ErrBadRequest, ev)
}

func (n *Node) stepRequest(r Request) error {
	switch r.Op {
	case OpLoad, OpStore, OpAdd, OpCAS:
		if r.Offset < 0 || r.Offset%8 != 0 || r.Offset+8 > n.cfg.PageSize {
			return fmt.Errorf("%w: offset %d in a %d-byte page", ErrBadRequest, r.Offset, n.cfg.PageSize)
		}
	case OpEvict:
	default:
		return fmt.Errorf("%w: op %v", ErrBadRequest, r.Op)
	}
	if n.homeOf(r.Page) == ids.None {
		return fmt.Errorf("%w: page %v has no home", ErrBadRequest, r.Page)
	}
	p := n.page(r.Page)
	p.queue = append(p.queue, r)
	n.drive(p)
	return nil
}

// ---- actions ----

func (n *Node) post(p *page, home bool, verbs ...Verb) uint64 {
	n.nextID++
	id := n.nextID
	n.batches[id] = batchRec{page: p.no, home: home, verbs: verbs, to: p.home, epoch: n.epoch}
	n.rd.Batches = append(n.rd.Batches, Batch{ID: id, Home: p.home, Verbs: verbs})
	return id
}

// postTo posts a batch of page p's client side to node to (a backup).
func (n *Node) postTo(p *page, to ids.NodeID, verbs ...Verb) uint64 {
	n.nextID++
	id := n.nextID
	n.batches[id] = batchRec{page: p.no, verbs: verbs, to: to, epoch: n.epoch}
	n.rd.Batches = append(n.rd.Batches, Batch{ID: id, Home: to, Verbs: verbs})
	return id
}

func (n *Node) send(t MsgType, to ids.NodeID, pg ids.PageNo, ver uint16, write bool) {
	n.rd.Messages = append(n.rd.Messages, Message{
		Type: t, From: n.cfg.ID, To: to, Epoch: n.epoch, Page: pg, Version: ver, Write: write,
	})
}

func (n *Node) effect(k PageEffectKind, p *page) {
	e := PageEffect{Kind: k, Page: p.no}
	if k == PageInstallShared || k == PageGrantExclusive {
		e.Data = p.data
	}
	n.rd.Pages = append(n.rd.Pages, e)
}

func (n *Node) complete(c Completion) { n.rd.Completions = append(n.rd.Completions, c) }

func (n *Node) backoff(p *page) {
	d := 1 << min(p.attempts, 6)
	d = min(d, n.cfg.MaxBackoffTicks)
	p.retryAt = n.now + uint64(d)
}

// ---- the driver ----

// drive makes every step the page can make now.
func (n *Node) drive(p *page) {
	n.wake(p)
	for !n.joining && !p.frozen && p.inflight == 0 && len(p.abandoned) == 0 && n.now >= p.retryAt {
		switch p.ph {
		case phIdle:
			if !n.driveIdle(p) {
				return
			}
		case phRead:
			n.postRead(p)
		case phAcquire:
			n.postAcquire(p)
		case phWaitAcks:
			if len(p.awaiting) == 0 && !p.needData {
				n.grant(p)
				continue
			}
			if p.needData {
				p.inflight = n.post(p, false, Verb{Kind: VerbRead, Page: p.no, Span: SpanPage})
			}
			return
		case phBackup:
			n.postBackup(p)
		case phRelease:
			n.postRelease(p)
		case phEvict:
			n.postEvict(p)
		case phPassTurn:
			n.postPassTurn(p)
		case phResolve:
			p.inflight = n.post(p, false, Verb{Kind: VerbRead, Page: p.no, Span: SpanWord})
		}
	}
}

// driveIdle serves what the local copy allows and starts the next
// transition. It reports whether the page left the idle phase.
func (n *Node) driveIdle(p *page) bool {
	for len(p.queue) > 0 {
		r := p.queue[0]
		switch r.Op {
		case OpLoad:
			if p.state == Invalid {
				n.startRead(p)
				return true
			}
			n.complete(Completion{ID: r.ID, Op: r.Op, Page: r.Page, Offset: r.Offset, Value: p.load(r.Offset)})
		case OpStore, OpAdd, OpCAS:
			if p.state != Modified {
				n.startAcquire(p)
				return true
			}
			c := Completion{ID: r.ID, Op: r.Op, Page: r.Page, Offset: r.Offset}
			old := p.load(r.Offset)
			switch r.Op {
			case OpStore:
				p.store(r.Offset, r.Value)
			case OpAdd:
				c.Value = old
				p.store(r.Offset, old+r.Value)
			case OpCAS:
				c.Value = old
				if old == r.Compare {
					p.store(r.Offset, r.Value)
					c.Swapped = true
				}
			}
			n.complete(c)
		case OpEvict:
			switch p.state {
			case Modified:
				n.startRelease(p, true)
				return true
			case Shared:
				p.state = Invalid
				p.data = nil
				n.effect(PageDrop, p)
				if p.unitCounted {
					p.ph = phEvict
					return true
				}
			}
			n.complete(Completion{ID: r.ID, Op: r.Op, Page: r.Page})
		}
		p.queue = p.queue[1:]
	}
	if p.recall {
		if p.state == Modified && p.copyVer == p.recallVer {
			n.startRelease(p, p.recallWrite)
			return true
		}
		p.recall = false
	}
	if p.downgrade {
		// The tenure was taken only to settle a coarse FAA of unknown
		// outcome: back to S, whose CAS adds the unit exactly.
		p.downgrade = false
		if p.state == Modified {
			n.startRelease(p, false)
			return true
		}
	}
	if p.granted {
		// Reserved for us, but nothing left to do: hand the turn on.
		p.ph = phPassTurn
		return true
	}
	return false
}

func (p *page) load(off int) uint64 { return binary.LittleEndian.Uint64(p.data[off:]) }

func (p *page) store(off int, v uint64) { binary.LittleEndian.PutUint64(p.data[off:], v) }

// ---- completions ----

func (n *Node) stepDone(d VerbsDone) error {
	rec, ok := n.batches[d.ID]
	if !ok {
		return fmt.Errorf("%w: #%d", ErrUnknownBatch, d.ID)
	}
	delete(n.batches, d.ID)
	if rec.epoch < n.clearNeed {
		n.checkClear()
	}
	switch {
	case rec.home && len(n.ackOwed) > 0:
		for _, m := range n.members {
			if n.ackOwed[m] {
				n.epochAckDue(m)
			}
		}
	case n.ackOwed[rec.to]:
		n.epochAckDue(rec.to)
	}
	if rec.home {
		n.homeDone(rec, d)
		return nil
	}
	p := n.pages[rec.page]
	if i := slices.Index(p.abandoned, d.ID); i >= 0 {
		// A batch given up when the page's home moved: its outcome
		// does not matter, only that it can land no more.
		p.abandoned = slices.Delete(p.abandoned, i, i+1)
		n.drive(p)
		return nil
	}
	if p.inflight != d.ID {
		return nil
	}
	p.inflight = 0
	if p.ph == phBackup {
		// Writes to a backup are idempotent while the tenure is ours:
		// one that failed, or whose outcome is unknown, is posted again.
		if d.Err == nil && len(d.Results) == len(rec.verbs) {
			p.bkAcked[rec.to] = true
		} else {
			p.retryAt = n.now + 1
		}
		n.drive(p)
		return nil
	}
	if d.Err != nil && d.Unknown && changesWord(rec.verbs) {
		// It may have executed: find out before anything else is
		// posted (resolve.go).
		p.resolving, p.unknown = p.ph, rec.verbs
		p.ph = phResolve
		p.retryAt = n.now + 1
		return nil
	}
	if d.Err != nil || !resultsFit(rec.verbs, d.Results, n.cfg.PageSize) {
		// Not executed (or only READs, which can run again): retry
		// the same phase after a tick.
		p.retryAt = n.now + 1
		return nil
	}
	p.noteWords(rec.verbs, d.Results)
	switch p.ph {
	case phRead:
		n.readDone(p, rec.verbs, d.Results)
	case phAcquire:
		n.acquireDone(p, rec.verbs, d.Results)
	case phWaitAcks:
		p.data = slices.Clone(d.Results[0].Data)
		p.needData = false
	case phRelease:
		n.releaseDone(p, rec.verbs, d.Results)
	case phEvict:
		n.evictDone(p, rec.verbs, d.Results)
	case phPassTurn:
		n.passTurnDone(p, d.Results)
	case phResolve:
		n.resolveDone(p, Word(binary.LittleEndian.Uint64(d.Results[0].Data)))
	}
	n.drive(p)
	return nil
}

// resultsFit checks the shape of the results the caller reported.
func resultsFit(verbs []Verb, res []Result, pageSize int) bool {
	if len(res) != len(verbs) {
		return false
	}
	for i, v := range verbs {
		if v.Kind == VerbRead && len(res[i].Data) != v.Span.Len(pageSize) {
			return false
		}
	}
	return true
}

// ---- messages ----

func (n *Node) stepReceive(m Message) error {
	if m.To != n.cfg.ID {
		return fmt.Errorf("%w: addressed to %v", ErrBadMessage, m.To)
	}
	if m.Epoch != n.epoch {
		return fmt.Errorf("%w: %v from %v in %v, this node is in %v", ErrStaleEpoch, m.Type, m.From, m.Epoch, n.epoch)
	}
	if !n.isMember(m.From) {
		return fmt.Errorf("%w: %v from non-member %v", ErrStaleEpoch, m.Type, m.From)
	}
	switch m.Type {
	case MsgEpoch:
		n.ackOwed[m.From] = true
		n.epochAckDue(m.From)
		return nil
	case MsgEpochAck:
		n.ackedIn[m.From] = n.epoch
		if !m.Clearing {
			n.clearedIn[m.From] = n.epoch
		}
		n.checkClear()
		n.epochAck(m.From)
		// A duty with fills is not settled: the active set holds it.
		for _, h := range n.activeHomes {
			if len(h.fills) > 0 && n.homeIdx[h.no] == h {
				n.driveHome(h) // its fence may be passed now
			}
		}
		return nil
	case MsgStamp:
		// The home side only: no client page is created for it.
		n.stamp(m.Page)
		return nil
	case MsgReport:
		n.gotReport(m)
		return nil
	case MsgQuery:
		n.reportTo(m.From)
		return nil
	case MsgMoveReport:
		n.gotMoveReport(m.From, int(min(m.Page, ids.PageNo(1)<<31)))
		return nil
	case MsgMoveDone:
		n.moveDone(m.From)
		return nil
	}
	p := n.page(m.Page)
	switch m.Type {
	case MsgInvalidate:
		if p.state == Shared && newer(m.Version, p.copyVer) {
			p.state = Invalid
			p.data = nil
			n.effect(PageDrop, p)
		}
		if p.unitCounted && newer(m.Version, p.unitVer) {
			p.unitCounted = false
		}
		if p.ph == phRead && p.inflight != 0 {
			if !p.invSeen || newer(m.Version, p.invMax) {
				p.invMax = m.Version
			}
			p.invSeen = true
		}
		n.send(MsgInvAck, m.From, m.Page, m.Version, false)
	case MsgInvAck:
		if p.ph == phWaitAcks && p.acqVer == m.Version && p.awaiting[m.From] {
			delete(p.awaiting, m.From)
			p.invEvery = n.cfg.RetransmitTicks
		}
	case MsgRebuilt:
		if m.From == p.home {
			n.unfreeze(p, m.Version, m.State == Shared, m.State == Modified)
		}
	case MsgEnqueue:
		n.enqueue(m.Page, m.From)
	case MsgGrant:
		if m.From == p.home {
			n.granted(p)
			return nil
		}
	case MsgRecall:
		n.recall(p, m.Version, m.Write)
		return nil
	}
	n.drive(p)
	return nil
}

// recall asks this node to release tenure ver of page p (to I when write,
// else to S): a MsgRecall, or its own home's fill.
func (n *Node) recall(p *page, ver uint16, write bool) {
	switch {
	case p.ph == phIdle && p.state == Modified && p.copyVer == ver,
		p.ph == phWaitAcks && p.acqVer == ver:
		if !p.recall || p.recallVer != ver {
			p.recall, p.recallVer, p.recallWrite = true, ver, write
		} else if write {
			p.recallWrite = true
		}
	}
	n.drive(p)
}

// ---- time ----

func (n *Node) stepTick() {
	n.now++
	slices.SortFunc(n.active, func(a, b *page) int { return cmp.Compare(a.seq, b.seq) })
	// Pages woken meanwhile are appended, and driven in this Tick too.
	for i := 0; i < len(n.active); i++ {
		p := n.active[i]
		if p.ph == phWaitAcks && len(p.awaiting) > 0 && n.now-p.invSent >= uint64(p.invEvery) {
			// Retransmit with exponential backoff so that a slow
			// network is not flooded with copies.
			p.invEvery = min(2*p.invEvery, 16*n.cfg.RetransmitTicks)
			n.sendInvalidations(p)
		}
		n.drive(p)
	}
	if len(n.owed) > 0 && n.now-n.moveAt >= uint64(n.moveEvery) {
		// Counts again (a home that misses reports asks for them with
		// MsgQuery; one that is done answers MsgMoveDone), with
		// exponential backoff: a new home waits for every member, and
		// every member sends to every member.
		n.moveAt = n.now
		n.moveEvery = min(2*n.moveEvery, 16*n.cfg.RetransmitTicks)
		for _, m := range n.members {
			if n.owed[m] {
				n.sendMoveReport(m)
			}
		}
	}
	if !n.synced && n.probing && n.now-n.probeAt >= uint64(2*n.cfg.RetransmitTicks) {
		n.probe()
	}
	if n.now-n.fillProbeAt >= uint64(2*n.cfg.RetransmitTicks) {
		n.fillProbe()
	}
	n.checkClear()
	slices.SortFunc(n.activeHomes, func(a, b *homeDuty) int { return cmp.Compare(a.seq, b.seq) })
	for i := 0; i < len(n.activeHomes); i++ {
		if h := n.activeHomes[i]; n.homeIdx[h.no] == h {
			n.driveHome(h)
		}
	}
	n.pruneActive()
}

// wake puts page p in the active set.
func (n *Node) wake(p *page) {
	if !p.active {
		p.active = true
		n.active = append(n.active, p)
	}
}

// wakeHome puts duty h in the active set.
func (n *Node) wakeHome(h *homeDuty) {
	if !h.active {
		h.active = true
		n.activeHomes = append(n.activeHomes, h)
	}
}

// pruneActive drops the settled pages and duties from the active sets,
// and the duties dropped (demote).
func (n *Node) pruneActive() {
	kept := n.active[:0]
	for _, p := range n.active {
		if settled(p) {
			p.active = false
			continue
		}
		kept = append(kept, p)
	}
	clear(n.active[len(kept):])
	n.active = kept
	keptH := n.activeHomes[:0]
	for _, h := range n.activeHomes {
		if n.homeIdx[h.no] != h || settledHome(h) {
			h.active = false
			continue
		}
		keptH = append(keptH, h)
	}
	clear(n.activeHomes[len(keptH):])
	n.activeHomes = keptH
}

// settled reports whether a Tick would do nothing for page p: nothing in
// progress or waiting, nothing to serve, no freeze to end.
func settled(p *page) bool {
	return p.ph == phIdle && p.inflight == 0 && len(p.abandoned) == 0 && len(p.queue) == 0 &&
		!p.recall && !p.downgrade && !p.granted && !p.frozen
}

// settledHome reports whether a Tick would do nothing for duty h: no
// repair, rebuild, reservation or fill, nothing in flight.
func settledHome(h *homeDuty) bool {
	return h.inflight == 0 && !h.rebuilding && !h.pending && len(h.fills) == 0 && h.granted == ids.None &&
		len(h.queue) == 0 && h.passUnsure == ids.None && !h.fillHeld
}
