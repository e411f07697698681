package coherence

import (
	"errors"
	"fmt"
	"strings"

	"github.com/dsmkit/dsm/internal/ids"
)

// VerbKind is the kind of a one-sided verb. It maps one to one onto
// rdma.OpKind (READ, WRITE, CAS, FAA); the zero value is invalid.
type VerbKind uint8

const (
	// VerbRead reads the target span of the home slot.
	VerbRead VerbKind = 1 + iota
	// VerbWrite writes Data to the target span.
	VerbWrite
	// VerbCAS compares the coherence word with Compare and, if equal,
	// replaces it with Operand.
	VerbCAS
	// VerbFAA adds Operand to the coherence word.
	VerbFAA
)

func (k VerbKind) String() string {
	switch k {
	case VerbRead:
		return "READ"
	case VerbWrite:
		return "WRITE"
	case VerbCAS:
		return "CAS"
	case VerbFAA:
		return "FAA"
	}
	return fmt.Sprintf("VerbKind(%d)", uint8(k))
}

// Span names the bytes of a home slot a verb touches. The home keeps, for
// every page it serves, a slot of 8+PageSize bytes in registered memory:
// the coherence word at offset 0 and the home copy of the page at offset 8.
type Span uint8

const (
	// SpanWord is the coherence word: 8 bytes at slot offset 0.
	SpanWord Span = 1 + iota
	// SpanPage is the home copy: PageSize bytes at slot offset 8.
	SpanPage
	// SpanSlot is the word followed by the page: 8+PageSize bytes at
	// slot offset 0. A READ of it does not date the data by the word
	// (a READ is not atomic and reads its bytes in no set order): the
	// protocol reads a copy as the word, the page and the word again
	// (slotVerbs).
	SpanSlot
)

func (s Span) String() string {
	switch s {
	case SpanWord:
		return "word"
	case SpanPage:
		return "page"
	case SpanSlot:
		return "slot"
	}
	return fmt.Sprintf("Span(%d)", uint8(s))
}

// Offset is the byte offset of the span inside the page's slot.
func (s Span) Offset() uint64 {
	if s == SpanPage {
		return 8
	}
	return 0
}

// Len is the length of the span for pages of pageSize bytes.
func (s Span) Len(pageSize int) int {
	switch s {
	case SpanWord:
		return 8
	case SpanPage:
		return pageSize
	}
	return 8 + pageSize
}

// Verb is one one-sided operation on the home slot of a page. The node
// layer turns it into an rdma.Op: Kind -> OpKind, (home, Page, Span) ->
// (RKey, Offset) through the home's slot table, Data -> Buf of a WRITE, a
// READ gets a fresh Buf of Span.Len bytes, Compare/Operand as they are.
type Verb struct {
	Kind    VerbKind
	Page    ids.PageNo
	Span    Span
	Compare uint64 // CAS
	Operand uint64 // CAS: new value; FAA: addend
	// Data is what a WRITE stores. For a SpanPage write (a write-back) it
	// is the state machine's copy of the page, read-only. An executor
	// whose application keeps the page elsewhere (dsmd keeps it in the
	// page cache's memfd and hands the state machine no stores) posts the
	// page's current contents in its place: the write-back then carries
	// what the application stored. The state machine never reads the
	// bytes back.
	Data []byte
	// HomeCopy: Data is the home's copy of the page, read from its slot
	// (a fill of a backup, or the refresh of the backups before a repair
	// or a rebuild), not this node's write-back: the executor posts it as
	// it is, whatever the application holds of the page.
	HomeCopy bool
}

func (v Verb) String() string {
	switch v.Kind {
	case VerbCAS:
		return fmt.Sprintf("CAS %v %v %v->%v", v.Page, v.Span, Word(v.Compare), Word(v.Operand))
	case VerbFAA:
		return fmt.Sprintf("FAA %v %v +%#x", v.Page, v.Span, v.Operand)
	}
	return fmt.Sprintf("%v %v %v", v.Kind, v.Page, v.Span)
}

// Batch is a list of verbs to post to one home as one batch (one round
// trip, executed in order). The caller reports its outcome with VerbsDone
// carrying the same ID.
type Batch struct {
	ID    uint64
	Home  ids.NodeID
	Verbs []Verb
}

func (b Batch) String() string {
	parts := make([]string, len(b.Verbs))
	for i, v := range b.Verbs {
		parts[i] = v.String()
	}
	return fmt.Sprintf("batch#%d ->%v [%s]", b.ID, b.Home, strings.Join(parts, "; "))
}

// Result is the outcome of one verb: the word before a CAS or FAA, the
// bytes of a READ (Span.Len of them); nothing for a WRITE.
type Result struct {
	Word uint64
	Data []byte
}

// OpKind is the kind of a local request. The zero value is invalid.
type OpKind uint8

const (
	// OpLoad loads the 8-byte word at Offset.
	OpLoad OpKind = 1 + iota
	// OpStore stores Value at Offset.
	OpStore
	// OpAdd adds Value at Offset and returns the old value.
	OpAdd
	// OpCAS replaces the word at Offset with Value if it equals Compare;
	// it returns the old value and whether it swapped.
	OpCAS
	// OpEvict gives up the local copy of the page (write-back if M).
	OpEvict
)

func (k OpKind) String() string {
	switch k {
	case OpLoad:
		return "load"
	case OpStore:
		return "store"
	case OpAdd:
		return "add"
	case OpCAS:
		return "cas"
	case OpEvict:
		return "evict"
	}
	return fmt.Sprintf("OpKind(%d)", uint8(k))
}

// Completion reports the end of a local request.
type Completion struct {
	ID      uint64
	Op      OpKind
	Page    ids.PageNo
	Offset  int
	Value   uint64 // load: the value; add, cas: the old value
	Swapped bool   // cas
}

func (c Completion) String() string {
	s := fmt.Sprintf("done#%d %v %v+%d", c.ID, c.Op, c.Page, c.Offset)
	switch c.Op {
	case OpLoad, OpAdd:
		s += fmt.Sprintf(" =%d", c.Value)
	case OpCAS:
		s += fmt.Sprintf(" old=%d swapped=%t", c.Value, c.Swapped)
	}
	return s
}

// PageEffectKind says what the caller must do to its mapping of a page.
type PageEffectKind uint8

const (
	// PageInstallShared maps the page read-only with Data.
	PageInstallShared PageEffectKind = 1 + iota
	// PageGrantExclusive maps the page read-write (Data is the content).
	PageGrantExclusive
	// PageDowngrade write-protects the page (M -> S).
	PageDowngrade
	// PageDrop unmaps the page (-> I).
	PageDrop
)

func (k PageEffectKind) String() string {
	switch k {
	case PageInstallShared:
		return "install-S"
	case PageGrantExclusive:
		return "grant-M"
	case PageDowngrade:
		return "downgrade"
	case PageDrop:
		return "drop"
	}
	return fmt.Sprintf("PageEffectKind(%d)", uint8(k))
}

// PageEffect is a change of the local mapping of one page.
type PageEffect struct {
	Kind PageEffectKind
	Page ids.PageNo
	Data []byte // install, grant: the page content (the node's copy; do not modify)
	// Reclaimed marks a grant that gives the node back the tenure of its
	// own release, interrupted by a move (the new home's rebuild kept it
	// the holder): Data is what the release was writing back, not a copy
	// from the home, so a node that keeps the page's truth elsewhere (a
	// page cache it gave the page up from) keeps it.
	Reclaimed bool
}

func (e PageEffect) String() string { return fmt.Sprintf("%v %v", e.Kind, e.Page) }

// Ready is what a Step asks the caller to do. Batches and messages may be
// issued in any order and in parallel; completions may be reported at once.
type Ready struct {
	Batches     []Batch
	Messages    []Message
	Pages       []PageEffect
	Completions []Completion
	// Filled reports the end of the fill of one page of a backup (the
	// Fill event): done, or given up (FillDone.Err).
	Filled []FillDone
	// Persisted reports a stable copy of a page asked for by a Persist
	// event, or why there is none (PersistDone.Err).
	Persisted []PersistDone
	// ClearSlots, when not zero, asks the node layer to zero the data of
	// this node's backup slots of the pages whose backup set it entered
	// anew up to this epoch (Reconfigure.ClearPending), and then to step
	// SlotsCleared: every member is in that epoch or a later one, and no
	// verb of an older epoch that used such a slot as a home slot is in
	// flight any more.
	ClearSlots ids.Epoch
}

// Empty reports whether there is nothing to do.
func (r *Ready) Empty() bool {
	return len(r.Batches) == 0 && len(r.Messages) == 0 && len(r.Pages) == 0 && len(r.Completions) == 0 && len(r.Filled) == 0 &&
		len(r.Persisted) == 0 && r.ClearSlots == 0
}

// PersistDone answers a Persist event for page Page at its home. Err nil:
// Data is the page's data as released by tenure Version, read from the
// home's slot while the home held the page's turn and the word named no
// holder, so no release could write the slot during the read: the data
// of every release up to that tenure, and of no later one. A page never
// written reports Version 0 and all-zero Data. Err wraps
// ErrPersistAbandoned when this node is not (or no longer) the page's
// home; the node layer asks the home of a later epoch.
type PersistDone struct {
	Page    ids.PageNo
	Version uint16
	Data    []byte
	Err     error
}

func (p PersistDone) String() string {
	if p.Err != nil {
		return fmt.Sprintf("persist %v: %v", p.Page, p.Err)
	}
	return fmt.Sprintf("persisted %v v%d", p.Page, p.Version)
}

// FillDone reports the end of the fill of page Page at backup To, asked
// for by a Fill event at the page's home. Err nil: To holds the page's
// released data and its Stamp, or the page was never written (its slot
// at the home is all zero: To's slot, never written or cleared, reads
// zero data too), and
// every member is in an epoch in which To is a backup of the page, so
// every later release writes To too: To's copy of Page is complete from
// now on, as long as it stays a backup. Err wraps ErrFillAbandoned when
// the fill cannot complete here: To is no member, or no backup of the
// page, any more, or this node is not (or no longer) the page's home; the
// node layer asks the page's home in its later epochs again if the page
// still needs To filled.
type FillDone struct {
	Page ids.PageNo
	To   ids.NodeID
	Err  error
}

func (f FillDone) String() string {
	if f.Err != nil {
		return fmt.Sprintf("fill %v ->%v: %v", f.Page, f.To, f.Err)
	}
	return fmt.Sprintf("filled %v ->%v", f.Page, f.To)
}

// Event is an input of Node.Step: Request, VerbsDone, Receive, Tick,
// Reconfigure, SlotsReady, Fill or Persist.
type Event interface{ isEvent() }

// Request is a local access (a fault, an explicit ReadAt/WriteAt word, an
// atomic) or an eviction. Offset is the byte offset of an 8-byte word in
// the page and must be a multiple of 8.
type Request struct {
	ID      uint64
	Op      OpKind
	Page    ids.PageNo
	Offset  int
	Value   uint64
	Compare uint64
}

// VerbsDone reports the outcome of a Batch: Results[i] belongs to Verbs[i]
// when Err is nil. A batch that failed (peer unreachable, dropped) did not
// execute; the node retries it.
//
// Unknown marks a failure whose outcome is not known (the transport's
// rdma.ErrOutcomeUnknown): the batch may have executed, or a prefix of it,
// or nothing, and it will never execute later. The node does not post it
// again blindly: it reads the word and judges from it whether the batch
// took effect (docs/protocol.md, "Batches of unknown outcome"). Unknown
// is meaningful only together with Err.
type VerbsDone struct {
	ID      uint64
	Results []Result
	Err     error
	Unknown bool
}

// Receive delivers a message from a peer.
type Receive struct{ Msg Message }

// Tick advances the node's clock by one tick.
type Tick struct{}

// Reconfigure installs a new configuration: the epoch and the members.
// Members absent from the new list are gone: the node stops waiting for
// them, and a home releases what they held in the words it keeps. Members
// new to the list joined: nothing changes for a node that was a member
// before; the joiner itself, created with Config.Joining, acts once every
// member has acknowledged its epoch. A departed id never comes back.
type Reconfigure struct {
	Epoch   ids.Epoch
	Members []ids.NodeID
	// HomeOf, when not nil, is the placement of this epoch: the home of
	// every page from now on. A page moved when its home differs from the
	// previous placement's; no list of pages is ever built. Every node
	// freezes the pages it has state for that moved and reports them to
	// their new home, which rebuilds their words from every member's
	// reports and then tells every member that its move is done
	// (MsgMoveDone); a page without state at a node stays frozen there
	// until then too. Nil keeps the placement. A page moves only away
	// from a home that departed in this epoch or before (the new home's
	// slot must hold the page's backup copy, and a word that names no
	// holder, when the move is rebuilt; see SlotsPending).
	HomeOf func(ids.PageNo) ids.NodeID
	// Targets are the members that gain pages in this epoch: the new
	// homes of the pages that moved (the node layer knows them from the
	// shards; the core cannot list pages). Only they collect reports, and
	// only their pages wait. Required with HomeOf.
	Targets []ids.NodeID
	// Backups, when not nil, are the backups of every page from this
	// epoch on (never its home): a release writes the page's data and
	// Stamp of its tenure to each of them before the CAS at the home
	// (docs/failover.md §7). Nil keeps the backups of the last
	// configuration.
	Backups func(ids.PageNo) []ids.NodeID
	// SlotsPending says that the node layer has not prepared the new
	// home slots of the pages moving to this node yet: the node completes
	// no move before a SlotsReady of this epoch or a later one.
	SlotsPending bool
	// ClearPending says that this node entered the backup set of some
	// pages anew in this epoch (or in an epoch it skipped), and that its
	// slots of them may hold data: a home demoted by a promotion stays a
	// backup, and a fill, which skips a page never written, would leave
	// that data there (docs/failover.md §7, "A page promoted away before
	// its new home rebuilt it"). The node asks the node layer to clear
	// them (Ready.ClearSlots) once every member is in this epoch or a
	// later one and no verb of an older epoch is in flight to them, and
	// until SlotsCleared of this epoch or a later one its epoch
	// acknowledgements say Clearing: no fill to this node starts before.
	ClearPending bool
}

// SlotsCleared tells the node that the data of its backup slots of every
// page whose backup set it entered anew up to Epoch reads zero, under
// words that are stamps or zero (Ready.ClearSlots): the slots a fill to
// this node requires.
type SlotsCleared struct{ Epoch ids.Epoch }

// SlotsReady tells the node that the home slots of every page that moved
// to it up to Epoch hold their backup copies, under words that name no
// holder (docs/failover.md §5).
type SlotsReady struct{ Epoch ids.Epoch }

// Fill asks this node, the home of Pages in its current epoch, to copy
// each of them to To, a backup of the page in its current Backups that
// entered the page's backup set later (docs/failover.md §6): a restarted
// or a new member that takes a departed backup's place, or any backup
// that was not complete in the previous epoch. The node layer lists the
// pages whose home slots are populated (the core cannot list pages); a
// page it leaves out must be one never written, and To's slots must read
// zero data where the home's do (a To that entered the page's backup set
// anew clears its slots first: Reconfigure.ClearPending). For each page
// the home waits until every member of its current epoch has
// acknowledged that epoch or a later one (MsgEpoch: no release can skip
// To from then on), To without Clearing, then takes the page's reservation (the home's turn, HomeTurn; a holder
// is recalled first), posts one batch [WRITE page, WRITE Stamp(v)] of
// its own slot's copy to To and gives the reservation back. Each page
// ends with a FillDone in Ready.Filled. A page already being filled to
// To is not filled twice.
type Fill struct {
	Pages []ids.PageNo
	To    ids.NodeID
}

// Persist asks this node, the home of Pages in its current epoch, for a
// stable copy of each (docs/durability.md §2): the copy a fill would
// write, read the same way (the page's turn taken, a holder recalled to
// S, the slot read with no holder), and handed to the node layer instead
// of written to a backup, in a PersistDone in Ready.Persisted. No epoch
// fence: the copy needs only that no tenure end while it is read. Several
// Persists of one page are served one after the other, each with the data
// of its own moment.
type Persist struct {
	Pages []ids.PageNo
}

func (Request) isEvent()      {}
func (VerbsDone) isEvent()    {}
func (Receive) isEvent()      {}
func (Tick) isEvent()         {}
func (Reconfigure) isEvent()  {}
func (SlotsReady) isEvent()   {}
func (SlotsCleared) isEvent() {}
func (Fill) isEvent()         {}
func (Persist) isEvent()      {}

// Errors.
var (
	// ErrStaleEpoch refuses a message stamped with another epoch.
	ErrStaleEpoch = errors.New("coherence: stale epoch")
	// ErrBadRequest refuses a malformed local request.
	ErrBadRequest = errors.New("coherence: bad request")
	// ErrBadConfig refuses an invalid configuration.
	ErrBadConfig = errors.New("coherence: bad configuration")
	// ErrUnknownBatch reports a VerbsDone that names no outstanding batch.
	ErrUnknownBatch = errors.New("coherence: unknown batch")
	// ErrBadMessage refuses a message that cannot be decoded.
	ErrBadMessage = errors.New("coherence: bad message")
	// ErrFillAbandoned ends the fill of a page that cannot complete at
	// this node (FillDone.Err wraps it, saying why).
	ErrFillAbandoned = errors.New("coherence: fill abandoned")
	// ErrPersistAbandoned ends a Persist of a page this node is not the
	// home of (PersistDone.Err wraps it, saying why).
	ErrPersistAbandoned = errors.New("coherence: persist abandoned")
)
