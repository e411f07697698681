package dsm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// BarrierSize is the number of bytes of region memory a Barrier uses, from
// its offset: 68 aligned 8-byte words (docs/synchronization.md).
const BarrierSize = 8 * barrierWords

// MaxBarrierParties is the largest number of parties of a Barrier.
const MaxBarrierParties = 64

// Barrier is a reusable, cluster-wide barrier for a fixed number of
// parties, kept in region memory: each Wait returns once every party has
// called Wait for the same generation. Any process on any machine that
// maps the region and makes a Barrier at the same offset, with the same
// number of parties, uses the same barrier; each Barrier value is one
// party (a process may hold several), so one value must not Wait in two
// goroutines at once. Its BarrierSize bytes start at zero (a new region
// is zeros) and must be used for nothing else; the first use records the
// number of parties there.
//
// The generations are numbered from 0 (modulo 2^31): the state word holds
// the current generation and how many parties have arrived in it. The
// party that arrives last moves it to the next generation with no
// arrival, in the same compare-and-swap, which releases the others: they
// poll the state word, whose Shared copy stays valid until that move.
//
// Exactly the number of parties given must use the barrier. At each Wait
// a party makes sure that its mapping session is recorded in one of as
// many party words (parties of one session share a word), so that the
// others can ask dsmd about it; so at most that many sessions can take
// part (one more gets ErrTooManyParties, unless a recorded session is
// dead: it takes its word).
//
// # When a party dies
//
// A barrier that a dead party cannot complete is broken, and says so: when
// the state word has not moved for a second, every waiter asks dsmd about
// the sessions of the recorded parties (one call for all), and if dsmd says
// one is dead (its process exited or closed the Region, or its dsmd left
// the cluster or restarted; not when dsmd cannot judge: a node cut off by
// a partition may still be alive), it marks the barrier broken and
// records that session. Every Wait in progress, and every later one,
// fails with an error that matches ErrBarrierBroken and whose cause is a
// *DeadPartyError naming the session. A party that died after arriving in
// the generation being waited for counts as arrived for that one; the
// barrier breaks in the next. Reset makes the barrier usable again: the
// number of parties stays, the words of dead parties are freed for the
// processes that replace them, and the live parties keep theirs.
//
// A party that dies before its first Wait was never recorded: the others
// wait for it for as long as their ctx allows.
type Barrier struct {
	r       *Region
	off     int64
	parties int

	mu      sync.Mutex
	slot    int  // the word of this party's session at its last Wait, or -1
	checked bool // the parties word holds parties
}

// The layout, in words from off: the state word (bit 63 broken, bits 32..62
// the generation, bits 0..31 the parties arrived in it), the parties word,
// the word of the dead party's session that broke the barrier, a reserved
// word, then MaxBarrierParties party words: 0 when free, else the party's
// session token << partySessionShift | 1 << partyGenBits | the low
// partyGenBits bits of the generation it last arrived in.
const (
	barrierState      = 0
	barrierParties    = 1
	barrierBrokenBy   = 2
	barrierPartyWord  = 4
	barrierWords      = barrierPartyWord + MaxBarrierParties
	barrierBroken     = uint64(1) << 63
	barrierGenShift   = 32
	barrierGenMask    = 1<<31 - 1
	barrierCountMask  = 1<<32 - 1
	partyGenBits      = 21
	partyRecorded     = uint64(1) << partyGenBits
	partySessionShift = partyGenBits + 1
)

func barrierGen(s uint64) uint64 { return s >> barrierGenShift & barrierGenMask }

func partyWord(session, gen uint64) uint64 {
	return session<<partySessionShift | partyRecorded | gen&(partyRecorded-1)
}

func partySession(w uint64) uint64 { return w >> partySessionShift }

// Barrier returns the Barrier of parties parties whose words are at [off,
// off+BarrierSize): off must be a multiple of 8 with BarrierSize bytes
// inside the region, and parties between 1 and MaxBarrierParties (its
// calls fail with ErrUnaligned, ErrOutOfRange or ErrInvalidArgument
// otherwise). Every party must give the same number: the calls fail with
// ErrCountMismatch when the memory was first used with another.
func (r *Region) Barrier(off int64, parties int) *Barrier {
	return &Barrier{r: r, off: off, parties: parties, slot: -1}
}

func (b *Barrier) word(i int) int64 { return b.off + 8*int64(i) }

// wrap renames an error of the words underneath as op's on the Barrier;
// context errors and *Errors keep their sentinels.
func (b *Barrier) wrap(op string, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return newErr(op, b.r.name, b.off, e.Kind, e.Err)
	}
	return newErr(op, b.r.name, b.off, nil, err)
}

func (b *Barrier) check(ctx context.Context, op string) error {
	if kind, cause := b.r.checkWords(b.off, barrierWords); kind != nil {
		return newErr(op, b.r.name, b.off, kind, cause)
	}
	if b.parties < 1 || b.parties > MaxBarrierParties {
		return newErr(op, b.r.name, b.off, ErrInvalidArgument, fmt.Errorf("%d parties is not within 1..%d", b.parties, MaxBarrierParties))
	}
	if err := ctx.Err(); err != nil {
		return newErr(op, b.r.name, b.off, nil, err)
	}
	if err := b.r.needSession(op, b.off); err != nil {
		return err
	}
	b.mu.Lock()
	checked := b.checked
	b.mu.Unlock()
	if checked {
		return nil
	}
	if err := initCount(ctx, b.r, b.word(barrierParties), uint64(b.parties)); err != nil {
		return b.wrap(op, err)
	}
	b.mu.Lock()
	b.checked = true
	b.mu.Unlock()
	return nil
}

// broken is the error of a Wait on a broken barrier.
func (b *Barrier) broken(ctx context.Context, op string) error {
	tok, err := b.r.LoadUint64(ctx, b.word(barrierBrokenBy))
	if err != nil {
		return b.wrap(op, err)
	}
	var cause error
	if tok != 0 {
		cause = &DeadPartyError{Session: tok}
	}
	return newErr(op, b.r.name, b.off, ErrBarrierBroken, cause)
}

// register makes sure this party's session has a party word, recording
// generation gen in it, and returns the word's index. Parties of one
// session (several Barrier values of one Region) share its word: the word
// is there for dsmd to be asked whether the session is alive.
func (b *Barrier) register(ctx context.Context, gen uint64) (int, error) {
	me := sessionField(b.r.m.Session())
	b.mu.Lock()
	slot := b.slot
	b.mu.Unlock()
	for {
		words := make([]uint64, b.parties)
		mine := -1
		if slot >= 0 && slot < b.parties {
			// Usually the word this value used last still names it:
			// one load instead of all.
			w, err := b.r.LoadUint64(ctx, b.word(barrierPartyWord+slot))
			if err != nil {
				return -1, err
			}
			if w != 0 && partySession(w) == me {
				words[slot], mine = w, slot
			}
		}
		if mine < 0 {
			for i := range words {
				w, err := b.r.LoadUint64(ctx, b.word(barrierPartyWord+i))
				if err != nil {
					return -1, err
				}
				words[i] = w
				if mine < 0 && w != 0 && partySession(w) == me {
					mine = i
				}
			}
		}
		take := func(i int) (bool, error) {
			ok, err := b.r.CompareAndSwapUint64(ctx, b.word(barrierPartyWord+i), words[i], partyWord(me, gen))
			if ok {
				b.mu.Lock()
				b.slot = i
				b.mu.Unlock()
			}
			return ok, err
		}
		if mine >= 0 {
			ok, err := take(mine)
			if err != nil || ok {
				return mine, err
			}
			slot = -1
			continue // a party of this session arrived meanwhile
		}
		for i, w := range words {
			if w != 0 {
				continue
			}
			if ok, err := take(i); err != nil || ok {
				return i, err
			}
		}
		tokens := make([]uint64, len(words))
		for i, w := range words {
			tokens[i] = partySession(w)
		}
		for i, dead := range b.r.deadSessions(ctx, tokens) {
			if !dead {
				continue
			}
			if ok, err := take(i); err != nil || ok {
				return i, err
			}
		}
		return -1, newErr("wait", b.r.name, b.off, ErrTooManyParties, fmt.Errorf("its %d party words name live sessions", b.parties))
	}
}

// Wait arrives at the barrier and waits until every party has arrived in
// this generation; it returns the generation's number. It fails at once
// with ErrBarrierBroken on a broken barrier, and with it when the barrier
// breaks while it waits (see the type's documentation).
//
// ctx is checked before Wait arrives. A Wait whose ctx ends while it
// waits withdraws its arrival (the others keep waiting for a party) and
// returns ctx's error; if the last party arrived first, the generation is
// complete and Wait returns its number with no error.
func (b *Barrier) Wait(ctx context.Context) (uint64, error) {
	const op = "wait"
	if err := b.check(ctx, op); err != nil {
		return 0, err
	}
	bg := context.WithoutCancel(ctx)
	n := uint64(b.parties)
	var s, gen uint64
	for {
		var err error
		if s, err = b.r.LoadUint64(bg, b.word(barrierState)); err != nil {
			return 0, b.wrap(op, err)
		}
		if s&barrierBroken != 0 {
			return 0, b.broken(bg, op)
		}
		gen = barrierGen(s)
		if _, err := b.register(bg, gen); err != nil {
			return 0, b.wrap(op, err)
		}
		arrived := s & barrierCountMask
		next := s + 1
		if arrived+1 >= n {
			next = (gen + 1) & barrierGenMask << barrierGenShift // all arrived: the next generation
		}
		ok, err := b.r.CompareAndSwapUint64(bg, b.word(barrierState), s, next)
		if err != nil {
			return 0, b.wrap(op, err)
		}
		if !ok {
			continue
		}
		if arrived+1 >= n {
			return gen, nil
		}
		s = next
		break
	}
	var pace pollPace
	last, since := s, time.Now()
	var checked time.Time
	for {
		cur, err := b.r.LoadUint64(bg, b.word(barrierState))
		if err != nil {
			return 0, b.wrap(op, err)
		}
		switch (barrierGen(cur) - gen) & barrierGenMask {
		case 0:
		case 1:
			return gen, nil
		default:
			// Reset while this party waited: its arrival is void.
			return 0, newErr(op, b.r.name, b.off, ErrBarrierBroken, errors.New("the barrier was reset while this party waited"))
		}
		if cur&barrierBroken != 0 {
			return 0, b.broken(bg, op)
		}
		if cur != last {
			last, since = cur, time.Now()
			pace.reset()
		}
		if ctx.Err() != nil {
			// Withdraw: one arrival fewer in this generation.
			ok, err := b.r.CompareAndSwapUint64(bg, b.word(barrierState), cur, cur-1)
			if err != nil {
				return 0, b.wrap(op, err)
			}
			if ok {
				return 0, newErr(op, b.r.name, b.off, nil, ctx.Err())
			}
			continue
		}
		if time.Since(since) >= lockCheckAfter && time.Since(checked) >= lockCheckAfter {
			if err := b.breakIfDead(bg, cur); err != nil {
				return 0, b.wrap(op, err)
			}
			checked = time.Now()
			continue
		}
		pace.wait()
	}
}

// partyTokens reads the party words and returns the sessions recorded in
// them, 0 for free words and for this process's session.
func (b *Barrier) partyTokens(ctx context.Context) (words, tokens []uint64, err error) {
	me := sessionField(b.r.m.Session())
	words = make([]uint64, b.parties)
	tokens = make([]uint64, b.parties)
	for i := range words {
		w, err := b.r.LoadUint64(ctx, b.word(barrierPartyWord+i))
		if err != nil {
			return nil, nil, err
		}
		words[i] = w
		if w != 0 && partySession(w) != me {
			tokens[i] = partySession(w)
		}
	}
	return words, tokens, nil
}

// breakIfDead asks dsmd about the recorded parties of a generation stalled
// at state s, and breaks the barrier if one of them is dead.
func (b *Barrier) breakIfDead(ctx context.Context, s uint64) error {
	_, tokens, err := b.partyTokens(ctx)
	if err != nil {
		return err
	}
	for i, dead := range b.r.deadSessions(ctx, tokens) {
		if !dead {
			continue
		}
		// The session first, so that whoever sees the broken bit can
		// name it; a break that loses the race leaves a session that is
		// dead too, which Reset clears.
		if _, err := b.r.CompareAndSwapUint64(ctx, b.word(barrierBrokenBy), 0, tokens[i]); err != nil {
			return err
		}
		_, err := b.r.CompareAndSwapUint64(ctx, b.word(barrierState), s, s|barrierBroken)
		return err
	}
	return nil
}

// Reset makes the barrier usable again: it starts a new generation with
// no arrival, not broken, and frees the party words of the sessions dsmd
// says are dead, for the processes that replace them. A Wait in progress
// (arrived in the generation Reset ends) fails with ErrBarrierBroken.
// Call it once every live party has seen the barrier broken, or knows
// none is waiting: an arrival between a Reset and that party's own is of
// the new generation.
func (b *Barrier) Reset(ctx context.Context) error {
	const op = "reset"
	if err := b.check(ctx, op); err != nil {
		return err
	}
	tok, err := b.r.LoadUint64(ctx, b.word(barrierBrokenBy))
	if err != nil {
		return b.wrap(op, err)
	}
	for {
		s, err := b.r.LoadUint64(ctx, b.word(barrierState))
		if err != nil {
			return b.wrap(op, err)
		}
		// Two generations on: a waiter of this one tells a Reset from
		// its release.
		next := (barrierGen(s) + 2) & barrierGenMask << barrierGenShift
		ok, err := b.r.CompareAndSwapUint64(ctx, b.word(barrierState), s, next)
		if err != nil {
			return b.wrap(op, err)
		}
		if ok {
			break
		}
	}
	if tok != 0 {
		if _, err := b.r.CompareAndSwapUint64(ctx, b.word(barrierBrokenBy), tok, 0); err != nil {
			return b.wrap(op, err)
		}
	}
	words, tokens, err := b.partyTokens(ctx)
	if err != nil {
		return b.wrap(op, err)
	}
	for i, dead := range b.r.deadSessions(ctx, tokens) {
		if !dead {
			continue
		}
		if _, err := b.r.CompareAndSwapUint64(ctx, b.word(barrierPartyWord+i), words[i], 0); err != nil {
			return b.wrap(op, err)
		}
	}
	return nil
}

// Generation returns the number of the generation now waited for, and
// whether the barrier is broken.
func (b *Barrier) Generation(ctx context.Context) (gen uint64, broken bool, err error) {
	const op = "generation"
	if err := b.check(ctx, op); err != nil {
		return 0, false, err
	}
	s, err := b.r.LoadUint64(ctx, b.word(barrierState))
	if err != nil {
		return 0, false, b.wrap(op, err)
	}
	return barrierGen(s), s&barrierBroken != 0, nil
}
