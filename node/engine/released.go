package engine

import (
	"context"
	"slices"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
)

// releaseWait is a call of WaitReleases: the pages of its range that were
// in a release when the loop took it, and those of them still in one.
type releaseWait struct {
	first, end ids.PageNo
	start      time.Time
	pages      []ids.PageNo // in a release when the call came
	left       []ids.PageNo // still in one
	ch         chan releaseResult
}

type releaseResult struct {
	reclaimed []ids.PageNo
	err       error
}

// WaitReleases waits until no page of [first, end) that was in a release at
// this node when the call came is in one any more: every write-back this
// node began on its own (the answer to a recall: a downgrade or a drop of a
// page the cache held Modified) or for an eviction that gave up waiting has
// reached the page's home and backups. A page cache's write-back (Flush)
// sees only the pages it holds Modified: without this wait, a page given up
// to a recall a moment before, its write-back still in flight, would be
// counted as written back.
//
// It returns the pages of the range whose release a move interrupted and
// whose new home gave the tenure back to this node (coherence's reclaimed
// grant) while the cache holds no Modified copy of them, whether the grant
// came during the wait or before it: their data is in the engine only, and
// the caller writes them back (localcache's WriteBack). (A grant that came
// before the call was missed before: a leaving node waiting for its
// hand-over departed holding one, and the tenure's write was lost, in the
// engine simulation's leave-handover-2 seed 1286.) It fails with an *UnavailableError when a page waits for a
// node that is down, as a miss does (Config.UnavailableAfter), and with
// ctx's error.
func (e *Engine) WaitReleases(ctx context.Context, first, end ids.PageNo) ([]ids.PageNo, error) {
	w := &releaseWait{first: first, end: end, start: e.now(), ch: make(chan releaseResult, 1)}
	select {
	case e.relCh <- w:
	case <-e.stop:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case r := <-w.ch:
		return r.reclaimed, r.err
	case <-e.stop:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// onReleaseWait takes a WaitReleases call: it answers at once when no page
// of the range is in a release.
func (e *Engine) onReleaseWait(w *releaseWait) {
	w.pages = e.sm.Releases(w.first, w.end)
	w.left = slices.Clone(w.pages)
	e.relWaits = append(e.relWaits, w)
}

// checkReleaseWaits answers the WaitReleases calls whose pages all left
// their releases. It runs on the loop after every step.
func (e *Engine) checkReleaseWaits() {
	if len(e.relWaits) == 0 {
		return
	}
	keep := e.relWaits[:0]
	for _, w := range e.relWaits {
		w.left = slices.DeleteFunc(w.left, func(p ids.PageNo) bool { return !e.sm.Releasing(p) })
		if len(w.left) > 0 {
			keep = append(keep, w)
			continue
		}
		// Every reclaimed page of the range, also one whose grant came
		// before the call: nothing else writes it back until a recall.
		var reclaimed []ids.PageNo
		for p := range e.reclaimed {
			if p >= w.first && p < w.end {
				reclaimed = append(reclaimed, p)
			}
		}
		slices.Sort(reclaimed)
		w.ch <- releaseResult{reclaimed: reclaimed}
	}
	clear(e.relWaits[len(keep):])
	e.relWaits = keep
}

// sweepReleaseWaits fails the WaitReleases calls that wait for a page that
// is unavailable.
func (e *Engine) sweepReleaseWaits(now time.Time) {
	keep := e.relWaits[:0]
	for _, w := range e.relWaits {
		var err error
		for _, p := range w.left {
			if ue := e.unavailable(p, now.Sub(w.start), false); ue != nil {
				err = ue
				break
			}
		}
		if err != nil {
			w.ch <- releaseResult{err: err}
			continue
		}
		keep = append(keep, w)
	}
	clear(e.relWaits[len(keep):])
	e.relWaits = keep
}
