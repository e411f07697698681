package dsm

import (
	"context"
	"runtime"
	"time"
)

// Mutex is a fair, cluster-wide mutual exclusion lock kept in region
// memory: a ticket lock on two adjacent aligned words, the ticket word at
// its offset and the now-serving word 8 bytes after it. Both start at zero
// (a new region is zeros), which is the unlocked state; the 16 bytes must
// be used for nothing else. Any process on any machine that maps the
// region and makes a Mutex at the same offset uses the same lock.
//
// Lock takes a ticket (AddUint64 on the ticket word) and waits until the
// now-serving word equals it; Unlock advances the now-serving word. Waiters
// enter in ticket order (FIFO). The lock needs no state in any dsmd, so it
// survives a daemon restart as long as the region's memory does.
//
// What it does not do: release the lock of a holder that died or never
// unlocks (every later Lock then waits), or notice a process that
// abandoned a ticket without waiting for its turn (a Lock that failed with
// ErrDaemonUnavailable after taking its ticket). A Mutex is not reentrant.
type Mutex struct {
	r   *Region
	off int64
}

// Mutex returns the Mutex whose two words are at off and off+8: off must
// be a multiple of 8 with 16 bytes inside the region (Lock and Unlock
// fail with ErrUnaligned or ErrOutOfRange otherwise).
func (r *Region) Mutex(off int64) *Mutex { return &Mutex{r: r, off: off} }

// Backoff of the wait for a turn.
const (
	lockSpins    = 16
	lockMinSleep = 2 * time.Microsecond
	lockMaxSleep = time.Millisecond
)

// Lock acquires the lock, waiting for the holders of earlier tickets.
//
// ctx is checked before a ticket is taken. Once it holds a ticket, Lock
// waits for its turn whatever ctx does, because an abandoned ticket would
// block every later one forever; when its turn comes and ctx is done by
// then, it releases the lock at once and returns ctx's error. So a Lock
// with a deadline can return later than the deadline, by as long as the
// holders before it keep the lock.
func (m *Mutex) Lock(ctx context.Context) error {
	if kind, cause := m.r.checkWords(m.off, 2); kind != nil {
		return newErr("lock", m.r.name, m.off, kind, cause)
	}
	if err := ctx.Err(); err != nil {
		return newErr("lock", m.r.name, m.off, nil, err)
	}
	next, err := m.r.AddUint64(ctx, m.off, 1)
	if err != nil {
		return err
	}
	ticket := next - 1
	bg := context.WithoutCancel(ctx)
	sleep := lockMinSleep
	for i := 0; ; i++ {
		serving, err := m.r.LoadUint64(bg, m.off+8)
		if err != nil {
			return err
		}
		if serving == ticket {
			break
		}
		if i < lockSpins {
			runtime.Gosched()
			continue
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, lockMaxSleep)
	}
	if err := ctx.Err(); err != nil {
		if uerr := m.Unlock(); uerr != nil {
			return uerr
		}
		return newErr("lock", m.r.name, m.off, nil, err)
	}
	return nil
}

// TryLock acquires the lock if it is free now, without waiting, and
// reports whether it did.
func (m *Mutex) TryLock(ctx context.Context) (bool, error) {
	if kind, cause := m.r.checkWords(m.off, 2); kind != nil {
		return false, newErr("lock", m.r.name, m.off, kind, cause)
	}
	serving, err := m.r.LoadUint64(ctx, m.off+8)
	if err != nil {
		return false, err
	}
	// Free means no ticket after the one being served: take the next
	// ticket only if it is the one served now.
	return m.r.CompareAndSwapUint64(ctx, m.off, serving, serving+1)
}

// Unlock releases the lock. It must be called by the holder, once per
// Lock; Unlock of a lock that is free fails with ErrNotLocked and changes
// nothing.
func (m *Mutex) Unlock() error {
	if kind, cause := m.r.checkWords(m.off, 2); kind != nil {
		return newErr("unlock", m.r.name, m.off, kind, cause)
	}
	ctx := context.Background()
	serving, err := m.r.LoadUint64(ctx, m.off+8)
	if err != nil {
		return err
	}
	next, err := m.r.LoadUint64(ctx, m.off)
	if err != nil {
		return err
	}
	if next == serving {
		return newErr("unlock", m.r.name, m.off, ErrNotLocked, nil)
	}
	// Only the holder moves the now-serving word, so this succeeds for
	// the holder; it fails only if the lock was released by someone else.
	ok, err := m.r.CompareAndSwapUint64(ctx, m.off+8, serving, serving+1)
	if err != nil {
		return err
	}
	if !ok {
		return newErr("unlock", m.r.name, m.off, ErrNotLocked, nil)
	}
	return nil
}
