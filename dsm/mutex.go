package dsm

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"
)

// MutexSize is the number of bytes of region memory a Mutex uses, from its
// offset: ten aligned 8-byte words.
const MutexSize = 8 * mutexWords

// Mutex is a fair, cluster-wide mutual exclusion lock kept in region
// memory, which survives the death of the processes that use it. Any
// process on any machine that maps the region and makes a Mutex at the
// same offset uses the same lock. Its MutexSize bytes start at zero (a new
// region is zeros), which is the unlocked state, and must be used for
// nothing else.
//
// It is a ticket lock: Lock takes a ticket (AddUint64 on the first word)
// and waits until the now-serving word (the second) equals it; Unlock
// advances the now-serving word. Waiters enter in ticket order (FIFO).
// Each ticket's taker also records, in one of eight owner words, its
// ticket and its mapping's session: a token by which any member of the
// cluster can ask dsmd whether that process still maps the region.
//
// # When a holder or a waiter dies
//
// A process that dies (or closes the Region, or whose dsmd restarts or
// leaves the cluster) while it holds the lock or a ticket does not block
// the others for good. A waiter that sees the lock not move for a second
// looks at the tickets ahead of it (up to eight: those that can be
// recorded), asks dsmd about their sessions in one call, and skips those
// dsmd says are dead (not those it cannot judge: a node cut off by a
// partition may still be alive). A skipped holder is reported: the next
// Lock (or TryLock) to acquire the lock gets it and returns an error
// matching ErrOwnerDied, because the data the lock protects may be half
// updated; it holds the lock and must Unlock it. A skipped waiter, or a
// ticket whose taker has not recorded itself for five seconds after it
// could, is skipped silently. A Lock of a live process whose ticket was
// skipped (a process stopped for longer than that before recording
// itself) takes a new ticket.
//
// The waiter right behind the head asks after a second, those further
// back after two (so that one question usually suffices), and any live
// waiter, however far back, does: dead tickets are skipped up to eight at
// a time, every second or two.
//
// What it does not do: break the lock of a holder that is alive and never
// unlocks, or of one whose dsmd is unreachable or failed (its fate is
// unknown until the directory decides it left or restarted). A Mutex is
// not reentrant. A process that has eight tickets or more taken ahead of
// it waits to record itself until one of them is done; a Lock whose ctx
// ends meanwhile returns at once and leaves its ticket to a goroutine,
// which records it given up as soon as it can.
type Mutex struct {
	r   *Region
	off int64

	mu     sync.Mutex
	ticket uint64 // the ticket held through this Mutex value
	held   bool
	// dangling are tickets a failed Lock recorded and could not give up
	// (the lock's page was unavailable): given up by the next call.
	dangling []uint64
}

// Mutex returns the Mutex whose words are at [off, off+MutexSize): off
// must be a multiple of 8 with MutexSize bytes inside the region (Lock
// and Unlock fail with ErrUnaligned or ErrOutOfRange otherwise).
func (r *Region) Mutex(off int64) *Mutex { return &Mutex{r: r, off: off} }

// The layout, in words from off: the ticket word, the now-serving word
// (its top bit says that the last holder died holding the lock, for the
// next acquirer to report), then ownerSlots owner words: ticket t is
// recorded in owner word t % ownerSlots.
const (
	ownerSlots = 8
	mutexWords = 2 + ownerSlots
	diedBit    = uint64(1) << 63
)

// An owner word: the ticket's low ownerTicketBits bits, its state, the
// taker's session token.
const (
	ownerTicketBits = 19
	ownerStateBits  = 3
	ownerTicketMask = 1<<ownerTicketBits - 1
	ownerSession    = ownerTicketBits + ownerStateBits // shift of the session
)

type ownerState uint8

const (
	ownerWaiting ownerState = 1 + iota // recorded, waiting for its turn
	ownerHolding                       // holds the lock
	ownerSkipped                       // skipped before it held the lock
	ownerDied                          // held the lock when it was found dead
)

func ownerWord(ticket uint64, st ownerState, session uint64) uint64 {
	return ticket&ownerTicketMask | uint64(st)<<ownerTicketBits | session<<ownerSession
}

func ownerOf(w uint64) (ticket uint64, st ownerState, session uint64) {
	return w & ownerTicketMask, ownerState(w >> ownerTicketBits & (1<<ownerStateBits - 1)), w >> ownerSession
}

// names reports whether owner word w is ticket t's.
func names(w, t uint64) bool {
	tk, st, _ := ownerOf(w)
	return st != 0 && tk == t&ownerTicketMask
}

// Backoff of the wait for a turn, and when a waiter looks at the head of
// the line. Variables so that tests can shorten them.
var (
	lockSpins       = 16
	lockMinSleep    = 2 * time.Microsecond
	lockMaxSleep    = time.Millisecond
	lockCheckAfter  = time.Second     // a stall this long makes a waiter look ahead
	lockUnrecorded  = 5 * time.Second // a ticket that could record itself and did not
	lockAskDeadline = 2 * time.Second // for dsmd's answer about a session
	// abandonMaxSleep paces the wait of a ticket given up before it could
	// be recorded.
	abandonMaxSleep = 10 * time.Millisecond
)

func (m *Mutex) word(i int) int64 { return m.off + 8*int64(i) }

func (m *Mutex) slot(ticket uint64) int64 { return m.word(2 + int(ticket%ownerSlots)) }

// Lock acquires the lock, waiting for the holders of earlier tickets. It
// returns an error matching ErrOwnerDied, with the lock held, when the
// previous holder died holding it (see the type's documentation).
//
// ctx is checked before a ticket is taken. A Lock whose ctx ends while it
// waits gives its ticket up and returns ctx's error (the next waiter skips
// it within about a second); one whose turn comes first takes the lock,
// releases it at once and returns ctx's error.
func (m *Mutex) Lock(ctx context.Context) error {
	if kind, cause := m.r.checkWords(m.off, mutexWords); kind != nil {
		return newErr("lock", m.r.name, m.off, kind, cause)
	}
	if err := ctx.Err(); err != nil {
		return newErr("lock", m.r.name, m.off, nil, err)
	}
	if err := m.giveUpDangling(ctx); err != nil {
		return err
	}
	for {
		next, err := m.r.AddUint64(ctx, m.off, 1)
		if err != nil {
			return err
		}
		ticket := next - 1
		got, died, err := m.wait(ctx, ticket)
		if err != nil {
			// A ticket left recorded as waiting would hold up every
			// later Lock for as long as this process maps the region.
			if gerr := m.giveUp(context.WithoutCancel(ctx), ticket); gerr != nil {
				m.mu.Lock()
				m.dangling = append(m.dangling, ticket)
				m.mu.Unlock()
			}
			return err
		}
		if !got {
			continue // skipped: take a new ticket
		}
		m.mu.Lock()
		m.ticket, m.held = ticket, true
		m.mu.Unlock()
		if err := ctx.Err(); err != nil {
			if uerr := m.Unlock(); uerr != nil {
				return uerr
			}
			return newErr("lock", m.r.name, m.off, nil, err)
		}
		if died {
			return newErr("lock", m.r.name, m.off, ErrOwnerDied, nil)
		}
		return nil
	}
}

// wait records the taker of ticket and waits for its turn; it reports
// whether it got the lock (false: the ticket was skipped) and whether the
// previous holder died holding it.
func (m *Mutex) wait(ctx context.Context, ticket uint64) (got, died bool, err error) {
	bg := context.WithoutCancel(ctx)
	me := m.r.m.Session()
	slot := m.slot(ticket)
	recorded := false
	defer func() {
		if err != nil && !recorded {
			// Its owner word still belongs to an earlier ticket.
			m.abandon(ticket)
		}
	}()
	sleep := lockMinSleep
	var last uint64
	since := time.Now()   // the now-serving word last changed
	var checked time.Time // the line was last looked at
	var line lineWatch
	for i := 0; ; i++ {
		sw, err := m.r.LoadUint64(bg, m.word(1))
		if err != nil {
			return false, false, err
		}
		serving := sw &^ diedBit
		if serving > ticket {
			return false, false, nil // skipped
		}
		if sw != last {
			last, since = sw, time.Now()
		}
		switch {
		case !recorded && ticket-serving < ownerSlots:
			// The slot's earlier ticket is done: record this one.
			cur, err := m.r.LoadUint64(bg, slot)
			if err != nil {
				return false, false, err
			}
			if names(cur, ticket) {
				return false, false, nil // skipped before it was recorded
			}
			ok, err := m.r.CompareAndSwapUint64(bg, slot, cur, ownerWord(ticket, ownerWaiting, me))
			if err != nil {
				return false, false, err
			}
			recorded = ok
			continue
		case recorded && serving == ticket:
			// Its turn: take the lock unless it was skipped meanwhile.
			ok, err := m.r.CompareAndSwapUint64(bg, slot, ownerWord(ticket, ownerWaiting, me), ownerWord(ticket, ownerHolding, me))
			if err != nil || !ok {
				return false, false, err
			}
			if sw&diedBit != 0 {
				// Only the holder moves the word now. Should this fail
				// (the page unavailable), the bit stays until Unlock,
				// which moves the word from whatever it reads.
				_, _ = m.r.CompareAndSwapUint64(bg, m.word(1), sw, serving)
			}
			return true, sw&diedBit != 0, nil
		case ctx.Err() != nil && !recorded:
			// Given up by abandon (the deferred call), as soon as its
			// owner word is free.
			return false, false, newErr("lock", m.r.name, m.off, nil, ctx.Err())
		case ctx.Err() != nil:
			// Give the ticket up; the waiter after it skips it.
			ok, err := m.r.CompareAndSwapUint64(bg, slot, ownerWord(ticket, ownerWaiting, me), ownerWord(ticket, ownerSkipped, me))
			if err != nil {
				return false, false, err
			}
			if ok {
				return false, false, newErr("lock", m.r.name, m.off, nil, ctx.Err())
			}
			continue // its turn came: take the lock, then give it back
		}
		// Every waiter, recorded or not, looks at the line ahead of it
		// when the head has not moved for lockCheckAfter: a waiter too far
		// back to record itself may be the only live one.
		if stalled := time.Since(since); stalled >= lockCheckAfter && time.Since(checked) >= lockCheckAfter {
			ask := stalled >= lockCheckAfter*time.Duration(min(ticket-serving, 2))
			if err := m.checkLine(bg, sw, ticket, &line, ask); err != nil {
				return false, false, err
			}
			checked = time.Now()
			continue
		}
		if i < lockSpins {
			runtime.Gosched()
			continue
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, lockMaxSleep)
	}
}

// abandon gives up ticket, which this process took but could not record
// (its owner word still names an earlier ticket), in the background: once
// the earlier ticket is done it records the ticket given up, and passes it
// if it is the head of the line. It stops when the ticket is served or
// skipped, or when an access fails (a dead mapping's ticket is skipped as
// never recorded).
func (m *Mutex) abandon(ticket uint64) {
	me := m.r.m.Session()
	go func() {
		ctx := context.Background()
		slot := m.slot(ticket)
		sleep := lockMinSleep
		for {
			sw, err := m.r.LoadUint64(ctx, m.word(1))
			if err != nil {
				return
			}
			serving := sw &^ diedBit
			if serving > ticket {
				return
			}
			if ticket-serving < ownerSlots {
				cur, err := m.r.LoadUint64(ctx, slot)
				if err != nil || names(cur, ticket) {
					return // skipped as never recorded
				}
				ok, err := m.r.CompareAndSwapUint64(ctx, slot, cur, ownerWord(ticket, ownerSkipped, me))
				if err != nil {
					return
				}
				if ok {
					_ = m.pass(ctx, sw)
					return
				}
				continue
			}
			time.Sleep(sleep)
			sleep = min(2*sleep, abandonMaxSleep)
		}
	}()
}

// giveUp marks ticket, recorded by this process as waiting, given up (a
// ticket not recorded needs nothing: it is skipped as such).
func (m *Mutex) giveUp(ctx context.Context, ticket uint64) error {
	ctx, cancel := context.WithTimeout(ctx, lockAskDeadline)
	defer cancel()
	me := m.r.m.Session()
	_, err := m.r.CompareAndSwapUint64(ctx, m.slot(ticket), ownerWord(ticket, ownerWaiting, me), ownerWord(ticket, ownerSkipped, me))
	return err
}

// giveUpDangling gives up the tickets of failed Locks that could not be
// given up then; it fails while one of them still cannot be.
func (m *Mutex) giveUpDangling(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for len(m.dangling) > 0 {
		if err := m.giveUp(ctx, m.dangling[0]); err != nil {
			return err
		}
		m.dangling = m.dangling[1:]
	}
	return nil
}

// lineWatch is what a waiter remembers of the tickets ahead of it between
// looks: since when each has been recordable (its owner word free) without
// being recorded.
type lineWatch struct {
	unrecorded map[uint64]time.Time
}

// checkLine looks at the tickets from the head of the line (sw's, which
// has not moved for lockCheckAfter) up to ticket, at most ownerSlots of
// them: it skips each whose taker has left it unrecorded for
// lockUnrecorded since it could record it, and, when ask, each whose taker
// dsmd says is dead (one question for them all); then it passes the
// tickets skipped or given up at the head.
func (m *Mutex) checkLine(ctx context.Context, sw, ticket uint64, line *lineWatch, ask bool) error {
	head := sw &^ diedBit
	n := min(ticket-head, ownerSlots)
	ws := make([]uint64, n)
	for i := range n {
		w, err := m.r.LoadUint64(ctx, m.slot(head+i))
		if err != nil {
			return err
		}
		ws[i] = w
	}
	if line.unrecorded == nil {
		line.unrecorded = map[uint64]time.Time{}
	}
	for t := range line.unrecorded {
		if t < head {
			delete(line.unrecorded, t)
		}
	}
	var tokens []uint64
	var at []uint64
	for i, w := range ws {
		t := head + uint64(i)
		_, st, session := ownerOf(w)
		switch {
		case !names(w, t):
			first, ok := line.unrecorded[t]
			if !ok {
				line.unrecorded[t] = time.Now()
				continue
			}
			if time.Since(first) < lockUnrecorded {
				continue
			}
			if _, err := m.r.CompareAndSwapUint64(ctx, m.slot(t), w, ownerWord(t, ownerSkipped, 0)); err != nil {
				return err
			}
		case ask && (st == ownerWaiting || st == ownerHolding):
			tokens = append(tokens, session)
			at = append(at, uint64(i))
		}
	}
	if len(tokens) > 0 {
		for j, dead := range m.r.deadSessions(ctx, tokens) {
			if !dead {
				continue
			}
			i := at[j]
			w := ws[i]
			_, st, session := ownerOf(w)
			st2 := ownerSkipped
			if st == ownerHolding {
				st2 = ownerDied
			}
			if _, err := m.r.CompareAndSwapUint64(ctx, m.slot(head+i), w, ownerWord(head+i, st2, session)); err != nil {
				return err
			}
		}
	}
	return m.pass(ctx, sw)
}

// TryLock acquires the lock if it is free now, without waiting, and
// reports whether it did. Like Lock, it returns an error matching
// ErrOwnerDied, with the lock held (true), when the previous holder died
// holding it.
func (m *Mutex) TryLock(ctx context.Context) (bool, error) {
	if kind, cause := m.r.checkWords(m.off, mutexWords); kind != nil {
		return false, newErr("lock", m.r.name, m.off, kind, cause)
	}
	sw, err := m.r.LoadUint64(ctx, m.word(1))
	if err != nil {
		return false, err
	}
	// Tickets given up ahead do not make the lock busy.
	if err := m.pass(ctx, sw); err != nil {
		return false, err
	}
	if sw, err = m.r.LoadUint64(ctx, m.word(1)); err != nil {
		return false, err
	}
	serving := sw &^ diedBit
	// Free means no ticket after the one being served: take the next
	// ticket only if it is the one served now.
	if ok, err := m.r.CompareAndSwapUint64(ctx, m.off, serving, serving+1); err != nil || !ok {
		return false, err
	}
	bg := context.WithoutCancel(ctx)
	me := m.r.m.Session()
	slot := m.slot(serving)
	for {
		cur, err := m.r.LoadUint64(bg, slot)
		if err != nil {
			return false, err
		}
		if names(cur, serving) {
			// Skipped as never recorded (this process stopped for
			// lockUnrecorded between the two steps).
			return false, nil
		}
		ok, err := m.r.CompareAndSwapUint64(bg, slot, cur, ownerWord(serving, ownerHolding, me))
		if err != nil {
			return false, err
		}
		if ok {
			break
		}
	}
	m.mu.Lock()
	m.ticket, m.held = serving, true
	m.mu.Unlock()
	if sw&diedBit != 0 {
		_, _ = m.r.CompareAndSwapUint64(bg, m.word(1), sw, serving) // else Unlock clears it
		return true, newErr("lock", m.r.name, m.off, ErrOwnerDied, nil)
	}
	return true, nil
}

// Unlock releases the lock. It must be called by the holder, once per
// Lock; Unlock of a lock that is free, or that was taken over because its
// holder was found dead (its Region closed, its dsmd gone), fails with
// ErrNotLocked and changes nothing.
func (m *Mutex) Unlock() error {
	if kind, cause := m.r.checkWords(m.off, mutexWords); kind != nil {
		return newErr("unlock", m.r.name, m.off, kind, cause)
	}
	ctx := context.Background()
	sw, err := m.r.LoadUint64(ctx, m.word(1))
	if err != nil {
		return err
	}
	serving := sw &^ diedBit
	m.mu.Lock()
	ticket, held := m.ticket, m.held
	m.held = false
	m.mu.Unlock()
	if !held {
		// Unlock through another Mutex value than the Lock's: the lock
		// being served is the caller's if it is held at all.
		ticket = serving
		next, err := m.r.LoadUint64(ctx, m.off)
		if err != nil {
			return err
		}
		if next == serving {
			return newErr("unlock", m.r.name, m.off, ErrNotLocked, nil)
		}
	}
	w, err := m.r.LoadUint64(ctx, m.slot(ticket))
	if err != nil {
		return err
	}
	if _, st, _ := ownerOf(w); serving != ticket || !names(w, ticket) || st != ownerHolding {
		return newErr("unlock", m.r.name, m.off, ErrNotLocked, errors.New("the lock was taken over: its holder was found dead"))
	}
	// Only the holder moves the now-serving word while it holds the lock.
	ok, err := m.r.CompareAndSwapUint64(ctx, m.word(1), sw, serving+1)
	if err != nil {
		return err
	}
	if !ok {
		return newErr("unlock", m.r.name, m.off, ErrNotLocked, nil)
	}
	return m.pass(ctx, serving+1)
}

// pass moves the now-serving word past the tickets given up or skipped at
// the head of the line, from sw on (a holder found dead sets the died bit
// for the next acquirer), so that the next live ticket need not wait for
// a waiter's look.
func (m *Mutex) pass(ctx context.Context, sw uint64) error {
	for range ownerSlots {
		head := sw &^ diedBit
		w, err := m.r.LoadUint64(ctx, m.slot(head))
		if err != nil {
			return err
		}
		_, st, _ := ownerOf(w)
		if !names(w, head) || st != ownerSkipped && st != ownerDied {
			return nil
		}
		next := head + 1 | sw&diedBit
		if st == ownerDied {
			next |= diedBit
		}
		if ok, err := m.r.CompareAndSwapUint64(ctx, m.word(1), sw, next); err != nil || !ok {
			return err
		}
		sw = next
	}
	return nil
}
