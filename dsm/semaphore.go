package dsm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// SemaphoreSize is the number of bytes of region memory a Semaphore uses,
// from its offset: 28 aligned 8-byte words (docs/synchronization.md).
const SemaphoreSize = 8 * semWords

// SemaphoreHolders is how many mapping sessions (processes, or mappings of
// one process) can hold units of one Semaphore at the same time.
const SemaphoreHolders = 16

// MaxSemaphoreCapacity is the largest capacity of a Semaphore: the units a
// holder word can count.
const MaxSemaphoreCapacity = 1<<holderUnitBits - 1

// Semaphore is a fair, cluster-wide counting semaphore kept in region
// memory, whose units come back when a process that holds them dies. Any
// process on any machine that maps the region and makes a Semaphore at the
// same offset, with the same capacity, uses the same semaphore. Its
// SemaphoreSize bytes start at zero (a new region is zeros) and must be
// used for nothing else; the first use records the capacity there.
//
// The units are not counted in a word of their own: each holder word
// records a mapping session and the units it holds, and the units free
// are the capacity less their sum. Taking units is one compare-and-swap on
// the taker's holder word, and so is giving them back, so the count is
// right whatever point a process dies at.
//
// Acquirers are served in order (FIFO), like the Mutex, through a queue
// that is a Mutex in the first MutexSize bytes: an acquirer takes its
// ticket, and the one at the head of the line waits there until enough
// units are free, takes them and lets the next one in. A request for many
// units therefore holds up the smaller ones behind it, as with
// golang.org/x/sync/semaphore. A process dead in the queue is skipped
// exactly as by the Mutex.
//
// # When a holder dies
//
// The units of a process that dies (or closes the Region, or whose dsmd
// restarts or leaves the cluster) while it holds them come back: the
// acquirer at the head of the line, after a second without enough units
// free, asks dsmd about the sessions in the holder words (one call for
// all) and clears the words of those dsmd says are dead (not of those it
// cannot judge: a node cut off by a partition may still be alive). A
// TryAcquire that finds too few units free asks the same, at most once a
// second per Semaphore value. No error reports it: what units stand for
// (connections, slots, a share of a resource) is free again when their
// holder is gone. Data that a holder was updating under the semaphore is
// not protected by it (use a Mutex for that).
//
// The units are held by the mapping session, not by a goroutine: every
// Semaphore value of one Region shares them, and any of them may Release
// them. At most SemaphoreHolders sessions hold units at a time; the head
// of the line waits for a holder word as it waits for units.
type Semaphore struct {
	r        *Region
	off      int64
	capacity uint64
	q        *Mutex

	mu      sync.Mutex
	swept   time.Time // dead holders were last looked for by TryAcquire
	slot    int       // the holder word this value last used; -1: none
	checked bool      // the capacity word holds this capacity
}

// The layout, in words from off: the queue Mutex (mutexWords), the
// capacity word, the releases word (a count of Releases, which the head
// of the line polls), then SemaphoreHolders holder words. A holder word
// is 0 when free, else the holder's session token << holderUnitBits |
// units.
const (
	semCapacityWord = mutexWords
	semReleasesWord = mutexWords + 1
	semHolderWord   = mutexWords + 2
	semWords        = semHolderWord + SemaphoreHolders
	holderUnitBits  = 22
	holderUnitMask  = 1<<holderUnitBits - 1
)

func holderWord(session, units uint64) uint64 {
	if units == 0 {
		return 0
	}
	return session<<holderUnitBits | units
}

func holderOf(w uint64) (session, units uint64) { return w >> holderUnitBits, w & holderUnitMask }

// sessionField is a session token as a word of 64-holderUnitBits bits
// records it (tokens fit: their dsmd incarnation is at most 1022).
func sessionField(token uint64) uint64 { return token & (1<<(64-holderUnitBits) - 1) }

// Semaphore returns the Semaphore of capacity units whose words are at
// [off, off+SemaphoreSize): off must be a multiple of 8 with
// SemaphoreSize bytes inside the region, and capacity between 1 and
// MaxSemaphoreCapacity (its calls fail with ErrUnaligned, ErrOutOfRange
// or ErrInvalidArgument otherwise). Every user of the semaphore must give
// the same capacity: the calls fail with ErrCountMismatch when the memory
// was first used with another.
func (r *Region) Semaphore(off int64, capacity uint64) *Semaphore {
	return &Semaphore{r: r, off: off, capacity: capacity, q: r.Mutex(off), slot: -1}
}

func (s *Semaphore) word(i int) int64 { return s.off + 8*int64(i) }

// check validates the Semaphore's place and request, and records or
// compares its capacity.
func (s *Semaphore) check(ctx context.Context, op string, n uint64) error {
	if kind, cause := s.r.checkWords(s.off, semWords); kind != nil {
		return newErr(op, s.r.name, s.off, kind, cause)
	}
	if s.capacity == 0 || s.capacity > MaxSemaphoreCapacity {
		return newErr(op, s.r.name, s.off, ErrInvalidArgument, fmt.Errorf("capacity %d is not within 1..%d", s.capacity, MaxSemaphoreCapacity))
	}
	if n > s.capacity {
		return newErr(op, s.r.name, s.off, ErrInvalidArgument, fmt.Errorf("%d units of a semaphore of %d", n, s.capacity))
	}
	if err := s.r.needSession(op, s.off); err != nil {
		return err
	}
	s.mu.Lock()
	checked := s.checked
	s.mu.Unlock()
	if checked {
		return nil
	}
	if err := initCount(ctx, s.r, s.word(semCapacityWord), s.capacity); err != nil {
		return s.wrap(op, err)
	}
	s.mu.Lock()
	s.checked = true
	s.mu.Unlock()
	return nil
}

// initCount records count in the word at off if it is zero, and fails
// with ErrCountMismatch if it holds another.
func initCount(ctx context.Context, r *Region, off int64, count uint64) error {
	if _, err := r.CompareAndSwapUint64(ctx, off, 0, count); err != nil {
		return err
	}
	got, err := r.LoadUint64(ctx, off)
	if err != nil {
		return err
	}
	if got != count {
		return newErr("", r.name, off, ErrCountMismatch, fmt.Errorf("made with %d, in use with %d", count, got))
	}
	return nil
}

// wrap renames an error of the words underneath as op's on the
// Semaphore; context errors and *Errors keep their sentinels.
func (s *Semaphore) wrap(op string, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return newErr(op, s.r.name, s.off, e.Kind, e.Err)
	}
	return newErr(op, s.r.name, s.off, nil, err)
}

// holders reads the holder words.
func (s *Semaphore) holders(ctx context.Context) ([SemaphoreHolders]uint64, error) {
	var h [SemaphoreHolders]uint64
	for i := range h {
		w, err := s.r.LoadUint64(ctx, s.word(semHolderWord+i))
		if err != nil {
			return h, err
		}
		h[i] = w
	}
	return h, nil
}

// take takes n units if they are free, in the word of this session or a
// free one, and reports whether it did, with the holder words it read
// last. Only the head of the queue calls
// it, so units are only added by one caller at a time; holders that
// Release (or are cleared as dead) meanwhile make it read again.
func (s *Semaphore) take(ctx context.Context, n uint64) (bool, [SemaphoreHolders]uint64, error) {
	me := s.r.m.Session()
	for {
		h, err := s.holders(ctx)
		if err != nil {
			return false, h, err
		}
		var used uint64
		mine, free := -1, -1
		for i, w := range h {
			session, units := holderOf(w)
			used += units
			switch {
			case w != 0 && session == sessionField(me):
				mine = i
			case w == 0 && free < 0:
				free = i
			}
		}
		i := mine
		if i < 0 {
			i = free
		}
		if used > s.capacity || s.capacity-used < n || i < 0 {
			return false, h, nil
		}
		_, units := holderOf(h[i])
		ok, err := s.r.CompareAndSwapUint64(ctx, s.word(semHolderWord+i), h[i], holderWord(me, units+n))
		if ok {
			s.mu.Lock()
			s.slot = i
			s.mu.Unlock()
		}
		if err != nil || ok {
			return ok, h, err
		}
	}
}

// sweep clears the holder words of sessions dsmd says are dead, and
// reports whether it cleared any.
func (s *Semaphore) sweep(ctx context.Context) (bool, error) {
	h, err := s.holders(ctx)
	if err != nil {
		return false, err
	}
	me := s.r.m.Session()
	tokens := make([]uint64, len(h))
	for i, w := range h {
		if session, _ := holderOf(w); w != 0 && session != sessionField(me) {
			tokens[i] = session
		}
	}
	cleared := false
	for i, dead := range s.r.deadSessions(ctx, tokens) {
		if !dead {
			continue
		}
		ok, err := s.r.CompareAndSwapUint64(ctx, s.word(semHolderWord+i), h[i], 0)
		if err != nil {
			return cleared, err
		}
		cleared = cleared || ok
	}
	return cleared, nil
}

// enter takes the queue; the head before may have died waiting there,
// which leaves nothing to repair (units are only in holder words).
func (s *Semaphore) enter(ctx context.Context) error {
	if err := s.q.Lock(ctx); err != nil && !errors.Is(err, ErrOwnerDied) {
		return err
	}
	return nil
}

// leave lets the next acquirer in. Should that fail, units taken are
// given back, so that a caller told of an error holds nothing.
func (s *Semaphore) leave(op string, took uint64) error {
	err := s.q.Unlock()
	if err == nil {
		return nil
	}
	if took > 0 {
		_ = s.Release(took)
	}
	return s.wrap(op, err)
}

// Acquire takes n units, waiting until they are free and every acquirer
// ahead of it is served. Acquire of 0 units returns at once.
//
// ctx is checked before Acquire joins the line. An Acquire whose ctx ends
// while it waits leaves the line and returns ctx's error, holding nothing.
func (s *Semaphore) Acquire(ctx context.Context, n uint64) error {
	const op = "acquire"
	if err := ctx.Err(); err != nil {
		return newErr(op, s.r.name, s.off, nil, err)
	}
	if err := s.check(ctx, op, n); err != nil || n == 0 {
		return err
	}
	if err := s.enter(ctx); err != nil {
		return s.wrap(op, err)
	}
	bg := context.WithoutCancel(ctx)
	var pace pollPace
	var last [SemaphoreHolders]uint64
	var releases uint64   // the releases word when the holder words were read
	var read time.Time    // the holder words were last read
	since := time.Now()   // the holder words last changed
	var checked time.Time // dead holders were last looked for
	for {
		rel, err := s.r.LoadUint64(bg, s.word(semReleasesWord))
		if err != nil {
			return errors.Join(s.wrap(op, err), s.leave(op, 0))
		}
		// One word to poll: the holder words are read again when a
		// Release says so, and once a second all the same (a releaser
		// may die between its two steps).
		if read.IsZero() || rel != releases || time.Since(read) >= lockCheckAfter {
			releases, read = rel, time.Now()
			ok, h, err := s.take(bg, n)
			if err != nil {
				return errors.Join(s.wrap(op, err), s.leave(op, 0))
			}
			if ok {
				return s.leave(op, n)
			}
			if h != last {
				last, since = h, time.Now()
				pace.reset()
			}
		}
		if err := ctx.Err(); err != nil {
			if lerr := s.leave(op, 0); lerr != nil {
				return lerr
			}
			return newErr(op, s.r.name, s.off, nil, err)
		}
		if time.Since(since) >= lockCheckAfter && time.Since(checked) >= lockCheckAfter {
			cleared, err := s.sweep(bg)
			if err != nil {
				return errors.Join(s.wrap(op, err), s.leave(op, 0))
			}
			checked = time.Now()
			if cleared {
				read = time.Time{}
			}
			continue
		}
		pace.wait()
	}
}

// TryAcquire takes n units if they are free now and no other acquirer is
// in the line (waiting, or taking its units at that instant), without
// waiting, and reports whether it did. When too few are free it
// first clears the holder words of dead sessions (asking dsmd, at most
// once a second per Semaphore value).
func (s *Semaphore) TryAcquire(ctx context.Context, n uint64) (bool, error) {
	const op = "try acquire"
	if err := s.check(ctx, op, n); err != nil || n == 0 {
		return err == nil, err
	}
	ok, err := s.q.TryLock(ctx)
	if err != nil && !errors.Is(err, ErrOwnerDied) {
		return false, s.wrap(op, err)
	}
	if !ok {
		return false, nil
	}
	bg := context.WithoutCancel(ctx)
	took, _, err := s.take(bg, n)
	if err == nil && !took {
		s.mu.Lock()
		sweep := time.Since(s.swept) >= lockCheckAfter
		if sweep {
			s.swept = time.Now()
		}
		s.mu.Unlock()
		var cleared bool
		if sweep {
			cleared, err = s.sweep(bg)
		}
		if err == nil && cleared {
			took, _, err = s.take(bg, n)
		}
	}
	if err != nil {
		return false, errors.Join(s.wrap(op, err), s.leave(op, 0))
	}
	var give uint64
	if took {
		give = n
	}
	if err := s.leave(op, give); err != nil {
		return false, err
	}
	return took, nil
}

// Release gives back n units held by this Region's mapping session (taken
// through any Semaphore value of the Region at this offset). It fails with
// ErrNotHeld, changing nothing, when the session holds fewer than n.
// Release of 0 units does nothing.
func (s *Semaphore) Release(n uint64) error {
	const op = "release"
	ctx := context.Background()
	if err := s.check(ctx, op, n); err != nil || n == 0 {
		return err
	}
	me := s.r.m.Session()
	for {
		i, w, err := s.mine(ctx)
		if err != nil {
			return s.wrap(op, err)
		}
		_, held := holderOf(w)
		if i < 0 || held < n {
			return newErr(op, s.r.name, s.off, ErrNotHeld, fmt.Errorf("this mapping holds %d units, releases %d", held, n))
		}
		ok, err := s.r.CompareAndSwapUint64(ctx, s.word(semHolderWord+i), w, holderWord(me, held-n))
		if err != nil {
			return s.wrap(op, err)
		}
		if ok {
			// Wake the head of the line. The units are back even if
			// this fails: the head reads the holder words once a
			// second all the same.
			_, _ = s.r.AddUint64(ctx, s.word(semReleasesWord), 1)
			return nil
		}
	}
}

// mine returns the index and value of this session's holder word, or -1.
// It looks first at the word this value took or released units in last.
func (s *Semaphore) mine(ctx context.Context) (int, uint64, error) {
	me := sessionField(s.r.m.Session())
	s.mu.Lock()
	last := s.slot
	s.mu.Unlock()
	if last >= 0 {
		w, err := s.r.LoadUint64(ctx, s.word(semHolderWord+last))
		if err != nil {
			return -1, 0, err
		}
		if session, _ := holderOf(w); w != 0 && session == me {
			return last, w, nil
		}
	}
	h, err := s.holders(ctx)
	if err != nil {
		return -1, 0, err
	}
	for i, w := range h {
		if session, _ := holderOf(w); w != 0 && session == me {
			s.mu.Lock()
			s.slot = i
			s.mu.Unlock()
			return i, w, nil
		}
	}
	return -1, 0, nil
}

// Available returns the units free now: the capacity less the units the
// holder words record (dead holders' included until they are cleared).
func (s *Semaphore) Available(ctx context.Context) (uint64, error) {
	const op = "available"
	if err := s.check(ctx, op, 0); err != nil {
		return 0, err
	}
	h, err := s.holders(ctx)
	if err != nil {
		return 0, s.wrap(op, err)
	}
	var used uint64
	for _, w := range h {
		_, units := holderOf(w)
		used += units
	}
	if used > s.capacity {
		return 0, nil
	}
	return s.capacity - used, nil
}
