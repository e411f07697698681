package pagestore

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/dsmkit/dsm/internal/pebblefs"
)

// pebbleCommitFatal is the format pebble v1.1.5's DB.Apply passes to
// Logger.Fatalf when a commit failed, which is how a failed WAL write or
// fsync reaches the caller. If Fatalf returned, Apply would report
// success.
const pebbleCommitFatal = "pebble: fatal commit error: %v"

// commitFailure is the panic value pebbleLogger.Fatalf raises for a failed
// commit; commitBatch recovers it.
type commitFailure struct{ err error }

// pebbleLogger sends pebble's messages to slog and decides what pebble's
// Fatalf calls do:
//   - a failed commit panics with commitFailure, recovered by commitBatch on
//     the committer goroutine (the only caller of Apply);
//   - a disk fault elsewhere (a MANIFEST write of a background flush or
//     compaction on a full disk) is logged and returns: pebble returns the
//     error after that Fatalf, and the store reopens the database before
//     its next batch;
//   - anything else is a broken invariant or corruption of pebble's own
//     files: it is logged and panics, as raftstore does.
type pebbleLogger struct {
	log   *slog.Logger
	fault atomic.Bool
}

func (p *pebbleLogger) Infof(format string, args ...any) {
	p.log.Debug(fmt.Sprintf(format, args...), "component", "pebble")
}

func (p *pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if format == pebbleCommitFatal {
		err := errors.New(msg)
		if len(args) == 1 {
			if e, ok := args[0].(error); ok {
				err = e
			}
		}
		panic(commitFailure{err: err})
	}
	for _, a := range args {
		if e, ok := a.(error); ok && pebblefs.IsDiskFault(e) {
			p.fault.Store(true)
			p.log.Error("pebble failed on a disk fault; the database is reopened before the next write", "err", msg, "component", "pebble")
			return
		}
	}
	p.log.Error(msg, "component", "pebble")
	panic("pagestore: pebble fatal: " + msg)
}

func (p *pebbleLogger) faulted() bool { return p.fault.Load() }

func (p *pebbleLogger) clearFault() { p.fault.Store(false) }
