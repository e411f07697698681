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
// the others for good. The waiter next in line notices that the lock has not moved
// for a second, asks dsmd about the session at the head of the line, and
// when dsmd says it is dead (not when it cannot say: a node cut off by a
// partition may still be alive), it skips that ticket. A skipped holder is
// reported: the next Lock (or TryLock) to acquire the lock gets it and
// returns an error matching ErrOwnerDied, because the data the lock
// protects may be half updated; it holds the lock and must Unlock it. A
// skipped waiter, or a ticket whose taker never recorded itself (it died
// between the two steps) for five seconds, is skipped silently. A Lock of
// a live process whose ticket was skipped (a process stopped for longer
// than that before recording itself) takes a new ticket.
//
// The waiter that decides asks about one session at a time; waiters
// further back look after a second per ticket ahead of them, so a chain
// of dead tickets is skipped at about one per second.
//
// What it does not do: break the lock of a holder that is alive and never
// unlocks, or of one whose dsmd is unreachable or failed (its fate is
// unknown until the directory decides it left or restarted). A Mutex is
// not reentrant. A process that has more than eight tickets taken ahead
// of it waits to record itself until one of them is done.
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
	lockCheckAfter  = time.Second     // per ticket ahead
	lockUnrecorded  = 5 * time.Second // a head that never recorded itself
	lockAskDeadline = 2 * time.Second // for dsmd's answer about a session
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
	sleep := lockMinSleep
	var last uint64
	since := time.Now()   // the now-serving word last changed
	var checked time.Time // the head was last looked at
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
		case recorded && ctx.Err() != nil:
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
		if after := lockCheckAfter * time.Duration(ticket-serving); recorded && time.Since(since) >= after && time.Since(checked) >= after {
			if err := m.checkHead(bg, sw, time.Since(since)); err != nil {
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

// checkHead looks at the ticket being served, sw's, which has not moved for
// stalled, and skips it if its taker is dead, gave it up, or never recorded
// itself for lockUnrecorded.
func (m *Mutex) checkHead(ctx context.Context, sw uint64, stalled time.Duration) error {
	head := sw &^ diedBit
	slot := m.slot(head)
	w, err := m.r.LoadUint64(ctx, slot)
	if err != nil {
		return err
	}
	var skipped uint64
	switch tk, st, session := ownerOf(w); {
	case !names(w, head):
		if stalled < lockUnrecorded {
			return nil
		}
		skipped = ownerWord(head, ownerSkipped, 0)
	case st == ownerSkipped || st == ownerDied:
		// Given up, or skipped by a waiter that stopped before moving
		// the now-serving word: move it.
		return m.advance(ctx, sw, head, st == ownerDied)
	default:
		if !m.dead(ctx, session) {
			return nil
		}
		st2 := ownerSkipped
		if st == ownerHolding {
			st2 = ownerDied
		}
		skipped = ownerWord(tk, st2, session)
	}
	ok, err := m.r.CompareAndSwapUint64(ctx, slot, w, skipped)
	if err != nil || !ok {
		return err
	}
	_, st, _ := ownerOf(skipped)
	return m.advance(ctx, sw, head, st == ownerDied)
}

// advance moves the now-serving word from sw past head, keeping (or
// setting, when the skipped taker held the lock) the died bit for the next
// acquirer.
func (m *Mutex) advance(ctx context.Context, sw, head uint64, died bool) error {
	next := head + 1 | sw&diedBit
	if died {
		next |= diedBit
	}
	_, err := m.r.CompareAndSwapUint64(ctx, m.word(1), sw, next)
	return err
}

// dead asks dsmd whether the mapping session is over for good; a session
// it cannot judge (or a token of 0: a dsmd that gives none) is not dead.
func (m *Mutex) dead(ctx context.Context, session uint64) bool {
	return m.r.deadSessions(ctx, []uint64{session})[0]
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
	if err := m.passGivenUp(ctx, sw); err != nil {
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
	return m.passGivenUp(ctx, serving+1)
}

// passGivenUp moves the now-serving word past tickets given up (a Lock
// whose ctx ended) from sw on, so that the next live ticket does not wait
// for a waiter's check.
func (m *Mutex) passGivenUp(ctx context.Context, sw uint64) error {
	for range ownerSlots {
		head := sw &^ diedBit
		w, err := m.r.LoadUint64(ctx, m.slot(head))
		if err != nil {
			return err
		}
		if _, st, _ := ownerOf(w); !names(w, head) || st != ownerSkipped {
			return nil
		}
		next := head + 1 | sw&diedBit
		if ok, err := m.r.CompareAndSwapUint64(ctx, m.word(1), sw, next); err != nil || !ok {
			return err
		}
		sw = next
	}
	return nil
}
