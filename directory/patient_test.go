package directory

import (
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// fakeAppends is a send that fails its first `fails` calls (forever when
// fails < 0) and then answers with Success and the request's term.
type fakeAppends struct {
	fails int64
	calls atomic.Int64
}

var errUnreachable = errors.New("dial tcp: connection refused")

func (f *fakeAppends) send(_ raft.ServerID, _ raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	n := f.calls.Add(1)
	if f.fails < 0 || n <= f.fails {
		resp.Term = 99 // what a broken exchange may leave behind
		return errUnreachable
	}
	if resp.Term != 0 || resp.Success {
		return errors.New("the retry reused the response of a failed attempt")
	}
	resp.Term, resp.Success = args.Term, true
	return nil
}

func testPatient(f *fakeAppends, patience time.Duration) *patientTransport {
	return &patientTransport{
		send: f.send, done: make(chan struct{}), log: slog.New(slog.DiscardHandler),
		patience: patience, retryMin: time.Millisecond, retryMax: 2 * time.Millisecond,
	}
}

// TestPatientAppendRetriesUntilReachable: failures within the patience
// are not reported to Raft; the answer of the attempt that succeeds is.
func TestPatientAppendRetriesUntilReachable(t *testing.T) {
	f := &fakeAppends{fails: 20}
	tr := testPatient(f, time.Minute)
	var resp raft.AppendEntriesResponse
	if err := tr.AppendEntries("2", "addr", &raft.AppendEntriesRequest{Term: 7}, &resp); err != nil {
		t.Fatalf("AppendEntries: %v, want the success of the 21st attempt", err)
	}
	if got := f.calls.Load(); got != 21 {
		t.Errorf("%d attempts, want 21", got)
	}
	if !resp.Success || resp.Term != 7 {
		t.Errorf("response %+v, want the successful attempt's", resp)
	}
}

// TestPatientAppendGivesUp: past the patience, the last error goes to Raft
// (which then backs off and calls again).
func TestPatientAppendGivesUp(t *testing.T) {
	f := &fakeAppends{fails: -1}
	tr := testPatient(f, 30*time.Millisecond)
	var resp raft.AppendEntriesResponse
	if err := tr.AppendEntries("2", "addr", &raft.AppendEntriesRequest{Term: 7}, &resp); !errors.Is(err, errUnreachable) {
		t.Fatalf("AppendEntries to a peer that never answers: %v, want its error", err)
	}
	if got := f.calls.Load(); got < 2 {
		t.Errorf("%d attempts, want retries within the patience", got)
	}
}

// TestPatientAppendStops: stop ends a retry in progress at once and makes
// later failures return without retrying, so Raft's Shutdown never waits
// for a follower that is down.
func TestPatientAppendStops(t *testing.T) {
	f := &fakeAppends{fails: -1}
	tr := testPatient(f, time.Hour)
	done := make(chan error, 1)
	go func() {
		var resp raft.AppendEntriesResponse
		done <- tr.AppendEntries("2", "addr", &raft.AppendEntriesRequest{Term: 7}, &resp)
	}()
	for f.calls.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	tr.stop()
	tr.stop() // twice is harmless
	if err := <-done; !errors.Is(err, errUnreachable) {
		t.Fatalf("AppendEntries ended by stop: %v, want the last error", err)
	}
	before := f.calls.Load()
	var resp raft.AppendEntriesResponse
	if err := tr.AppendEntries("2", "addr", &raft.AppendEntriesRequest{Term: 7}, &resp); !errors.Is(err, errUnreachable) {
		t.Fatalf("AppendEntries after stop: %v", err)
	}
	if got := f.calls.Load() - before; got != 1 {
		t.Errorf("%d attempts after stop, want 1", got)
	}
}
