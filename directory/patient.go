package directory

import (
	"log/slog"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// patientTransport is the Raft transport with an AppendEntries that keeps
// trying a peer it cannot reach, for up to patience, before it reports
// the failure to Raft.
//
// Why: hashicorp/raft counts every failed AppendEntries of a follower and,
// before its next attempt, waits failureWait doubled per failure, up to
// 10.24 s (10 ms, ten doublings; neither is configurable). Its replication
// of a follower that was down for a few seconds therefore sleeps up to
// 10.24 s after the follower is back, and a restarted dsmd learns the log's
// entries, its own new incarnation among them, that much later: it asks for
// no lease meanwhile and serves nothing (docs/failover.md §9). Retried here,
// with a backoff of our own capped at retryMax, a down follower costs Raft
// one failure per patience instead of one per attempt, so its counter stays
// low and the entries reach the follower within retryMax of its return.
//
// Raft tolerates a request sent late or twice by design: a request of a
// past term is refused by term, and entries of one term never conflict
// with the follower's copies of them. A retry that outlives its
// replication goroutine's reason (the leader stepped down, the peer left
// the configuration) ends at patience at the latest, or at once at stop
// (the directory closes), so Raft's Shutdown never waits on it.
// RequestVote, InstallSnapshot and the pipeline are Raft's own: elections
// time out by themselves, and a pipeline that fails falls back to
// AppendEntries.
type patientTransport struct {
	*raft.NetworkTransport

	// send is the one attempt (the network transport's AppendEntries).
	send     func(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error
	done     chan struct{}
	stopOnce sync.Once
	log      *slog.Logger

	patience           time.Duration
	retryMin, retryMax time.Duration
}

// Retry intervals of patientTransport.
const (
	appendRetryMin = 10 * time.Millisecond
	appendRetryMax = 200 * time.Millisecond
)

// newPatientTransport wraps t; a patience of zero or less makes no retries.
func newPatientTransport(t *raft.NetworkTransport, patience time.Duration, log *slog.Logger) *patientTransport {
	return &patientTransport{
		NetworkTransport: t, send: t.AppendEntries, done: make(chan struct{}), log: log,
		patience: patience, retryMin: appendRetryMin, retryMax: appendRetryMax,
	}
}

// AppendEntries implements raft.Transport.
func (t *patientTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	err := t.send(id, target, args, resp)
	if err == nil {
		return nil
	}
	start := time.Now()
	wait := t.retryMin
	tries := 1
	for time.Since(start) < t.patience {
		select {
		case <-t.done:
			return err
		default:
		}
		timer := time.NewTimer(wait)
		select {
		case <-t.done:
			timer.Stop()
			return err
		case <-timer.C:
		}
		wait = min(2*wait, t.retryMax)
		*resp = raft.AppendEntriesResponse{}
		tries++
		if err = t.send(id, target, args, resp); err == nil {
			if tries > 2 {
				t.log.Info("raft: follower reachable again", "peer", id, "addr", target,
					"attempts", tries, "after", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if tries == 2 {
			t.log.Debug("raft: follower unreachable, retrying", "peer", id, "addr", target, "err", err)
		}
	}
	return err
}

// stop ends every retry now, each with its last error, and makes later
// failures return at once.
func (t *patientTransport) stop() { t.stopOnce.Do(func() { close(t.done) }) }
