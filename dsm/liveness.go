package dsm

import (
	"context"
	"errors"
	"runtime"
	"time"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// deadSessions asks dsmd, in one call, which of the mapping sessions named
// by tokens are over for good. A session it cannot judge (or a token of 0:
// a dsmd that gives none) is not dead; so is every token when dsmd does
// not answer within lockAskDeadline.
func (r *Region) deadSessions(ctx context.Context, tokens []uint64) []bool {
	dead := make([]bool, len(tokens))
	var ask []uint64
	var at []int
	for i, t := range tokens {
		if t != 0 {
			ask, at = append(ask, t), append(at, i)
		}
	}
	if len(ask) == 0 {
		return dead
	}
	ctx, cancel := context.WithTimeout(ctx, lockAskDeadline)
	defer cancel()
	resp, err := r.c.rpc.SessionsAlive(ctx, &dsmpb.SessionsAliveRequest{Tokens: ask})
	if err != nil || len(resp.GetStates()) != len(ask) {
		return dead
	}
	for j, st := range resp.GetStates() {
		dead[at[j]] = st == dsmpb.SessionState_SESSION_STATE_DEAD
	}
	return dead
}

// needSession fails with ErrUnsupported when dsmd gave this mapping no
// session token (a dsmd without its coherence engine): the Barrier and the
// Semaphore record who takes part by that token.
func (r *Region) needSession(op string, off int64) error {
	if r.m.Session() == 0 {
		return newErr(op, r.name, off, ErrUnsupported, errors.New("dsmd gave this mapping no session token"))
	}
	return nil
}

// pollPace paces a poll of region words the way the Mutex does: a few
// yields, then sleeps doubling from lockMinSleep to lockMaxSleep.
type pollPace struct {
	i     int
	sleep time.Duration
}

func (b *pollPace) wait() {
	if b.i < lockSpins {
		b.i++
		runtime.Gosched()
		return
	}
	if b.sleep == 0 {
		b.sleep = lockMinSleep
	}
	time.Sleep(b.sleep)
	b.sleep = min(2*b.sleep, lockMaxSleep)
}

// reset starts over after progress.
func (b *pollPace) reset() { *b = pollPace{} }
