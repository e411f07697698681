package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/node/pagestore"
)

// The persist request (docs/durability.md §2, "As built").
//
// A Sync of a durable region first writes the range's Modified pages back
// to their homes and backups (localcache Flush), as for any region. Then
// it sends a persist request to the home, in the placement of the engine's
// current view, of every page of the range that this node gave up
// Modified since its last successful Sync of it (the record below). The
// home takes a stable copy of each page with engine.Persist (the page's
// turn, a holder recalled to S, word and data read together), writes the
// copies to its page store and sends them in persist-copy messages (or
// copy-parts, for pages too large for one message) to every backup of the
// page, which writes them to its own store. Every store orders the writes
// of a page by the home's order of its stable copies (writeOrdered). The home
// answers once its write and every backup's answer are in; Sync returns
// once every home has answered, or with the error of the first node that
// failed, named ("n2: page store: ...").
//
// A home that answers that it is not the home of a page (the page moved,
// or the region is not set up there yet), or that does not answer in
// persistCallTimeout, is asked again in the placement of the engine's
// view at that moment, up to persistAttempts times; then Sync fails with
// ErrPersistUnavailable, which a caller may retry.
//
// The record: the engine tells the node of every page it gives up
// Modified (engine.Config.Released: a recall or downgrade, an eviction,
// the write-back of a Sync), with the tenure it releases. A page it never
// held Modified was written by another node, whose Sync covers it. A
// successful Sync of a range forgets the pages it persisted unless they
// were given up again, at another tenure, meanwhile; a failed one keeps
// them for the next Sync.

const (
	// persistCallTimeout bounds one persist request to a home, and
	// persistCopyTimeout one persist-copy to a backup.
	persistCallTimeout = 30 * time.Second
	persistCopyTimeout = 15 * time.Second
	// persistCopyWait bounds a home's wait for its stable copies; with
	// persistCopyTimeout it stays under persistCallTimeout, so that a
	// home answers before its requester gives up.
	persistCopyWait = 10 * time.Second
	// persistAttempts is how often a Sync asks for a page whose home
	// answers "not home" or does not answer.
	persistAttempts = 4
)

// ErrPersistUnavailable fails a Sync of a durable region whose pages'
// homes could not be reached or did not take the request: the written-back
// data is in memory at the homes and backups, not known to be on disk. The
// caller may retry the Sync.
var ErrPersistUnavailable = errors.New("node: persist: no home took the request; retry the Sync")

// ErrPersistFailed fails a Sync of a durable region that a node could not
// persist (a disk fault); the message names the node and the cause.
var ErrPersistFailed = errors.New("node: persist failed")

// ErrPersistLost fails a Sync of a durable region one of whose writes was
// lost before the Sync could persist it: the page's home holds an older
// version than the one this node released, because the release was lost
// with the nodes that held it (its home and backups departed). The
// message names the pages and versions. The Sync persists everything else,
// and reports each lost write once: the next Sync does not ask for it
// again.
var ErrPersistLost = errors.New("node: written data lost before it was persisted")

// persister is a node's part in persisting durable regions: as the
// requester of its Syncs, as a home and as a backup.
type persister struct {
	n     *Node
	store *pagestore.Store
	log   *slog.Logger
	self  ids.NodeID

	nextID atomic.Uint64
	wg     sync.WaitGroup // handlers of requests from peers
	closed bool           // under mu: no more handlers start

	mu sync.Mutex
	// released: per durable region, the pages this node gave up Modified
	// since its last Sync of them, with the tenure released.
	released map[ids.RegionID]map[ids.PageNo]uint16
	// calls: requests this node sent, by id, waiting for their answer.
	calls map[uint64]*pcall
	// copies: the stable copies asked for at this home (engine.Persist),
	// per page, in the order asked; the engine answers a page's in order.
	copies map[regionPage][]chan stableCopy
	// seq numbers the stable copies this node took as a home, in the
	// order the engine handed them over (a page's in tenure order).
	seq uint64

	// parts: pages arriving in copy-parts, until every byte is in.
	parts map[partKey]*partialPage

	// wmu orders the writes of a page to the store (writeOrdered).
	wmu    sync.Mutex
	latest map[regionPage]queued
	writes int
}

// stableCopy is a page's stable copy and its place in the home's order.
type stableCopy struct {
	d   coherence.PersistDone
	seq uint64
}

// queued is the last write of a page handed to the store: from which
// home, with which of its sequence numbers, when, and its outcome.
type queued struct {
	src ids.NodeID
	seq uint64
	at  time.Time
	w   *queuedWrite
}

// queuedWrite is the outcome of one Enqueue: done is closed once err is
// set.
type queuedWrite struct {
	done chan struct{}
	err  error
}

// partKey names one page's copy from one home.
type partKey struct {
	from ids.NodeID
	r    ids.RegionID
	no   ids.PageNo
	seq  uint64
}

// partialPage is a page whose copy-parts are arriving.
type partialPage struct {
	version uint16
	data    []byte
	got     map[int]bool // offsets received
	bytes   int
	at      time.Time
}

type regionPage struct {
	r  ids.RegionID
	no ids.PageNo
}

type pcall struct {
	to ids.NodeID
	ch chan nodeMsg // buffered 1
}

func newPersister(n *Node, store *pagestore.Store) *persister {
	return &persister{n: n, store: store, log: n.log.With("part", "persist"), self: ids.NodeID(n.cfg.ID),
		released: map[ids.RegionID]map[ids.PageNo]uint16{}, calls: map[uint64]*pcall{},
		copies: map[regionPage][]chan stableCopy{}, latest: map[regionPage]queued{}, parts: map[partKey]*partialPage{}}
}

// releasedFn is the engine's Config.Released for durable region r.
func (ps *persister) releasedFn(r ids.RegionID) func(ids.PageNo, uint16) {
	return func(no ids.PageNo, v uint16) {
		ps.mu.Lock()
		m := ps.released[r]
		if m == nil {
			m = map[ids.PageNo]uint16{}
			ps.released[r] = m
		}
		m[no] = v
		ps.mu.Unlock()
	}
}

// persistedFn is the engine's Config.Persisted for region r: it hands
// each stable copy to the oldest request of its page. It does not block.
func (ps *persister) persistedFn(r ids.RegionID) func([]coherence.PersistDone) {
	return func(done []coherence.PersistDone) {
		ps.mu.Lock()
		defer ps.mu.Unlock()
		for _, d := range done {
			k := regionPage{r, d.Page}
			q := ps.copies[k]
			if len(q) == 0 {
				continue
			}
			ps.seq++
			q[0] <- stableCopy{d, ps.seq} // buffered 1, sent once
			if len(q) == 1 {
				delete(ps.copies, k)
			} else {
				ps.copies[k] = q[1:]
			}
		}
	}
}

// forget drops what is recorded of a deleted region.
func (ps *persister) forget(r ids.RegionID) {
	ps.mu.Lock()
	delete(ps.released, r)
	for k := range ps.copies {
		if k.r == r {
			delete(ps.copies, k)
		}
	}
	ps.mu.Unlock()
	ps.wmu.Lock()
	for k := range ps.latest {
		if k.r == r {
			delete(ps.latest, k)
		}
	}
	ps.wmu.Unlock()
}

// recorded lists the pages of [first, end) of r given up Modified since
// their last Sync, sorted.
func (ps *persister) recorded(r ids.RegionID, first, end ids.PageNo) []persistPage {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []persistPage
	for no, v := range ps.released[r] {
		if no >= first && no < end {
			out = append(out, persistPage{No: no, Version: v})
		}
	}
	slices.SortFunc(out, func(a, b persistPage) int { return cmp.Compare(a.No, b.No) })
	return out
}

// persisted forgets the pages of a successful Sync, unless released again
// at another tenure meanwhile.
func (ps *persister) persisted(r ids.RegionID, pages []persistPage) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	m := ps.released[r]
	for _, p := range pages {
		if v, ok := m[p.No]; ok && v == p.Version {
			delete(m, p.No)
		}
	}
}

// ---- the requester: a Sync ----

// syncRange persists the recorded pages of [first, end) of durable region
// r at their homes and backups; Flush has written them back before.
func (ps *persister) syncRange(ctx context.Context, r directory.Region, first, end ids.PageNo) error {
	all := ps.recorded(r.ID, first, end)
	todo := all
	var last []string // why pages were left for a later attempt
	var lost []string // the homes' accounts of lost writes
	for attempt := 0; len(todo) > 0; attempt++ {
		if attempt == persistAttempts {
			return fmt.Errorf("%w: %d pages of region %q after %d attempts: %s", ErrPersistUnavailable, len(todo), r.Name,
				attempt, strings.Join(last, "; "))
		}
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(attempt) * 250 * time.Millisecond):
			}
		}
		byHome, err := ps.homes(r.ID, todo)
		if err != nil {
			return err
		}
		type outcome struct {
			pages []persistPage
			code  answerCode
			msg   string
		}
		out := make(chan outcome)
		calls := 0
		for home, pages := range byHome {
			for chunk := range slices.Chunk(pages, maxPersistPages) {
				calls++
				go func() {
					code, msg := ps.askHome(ctx, home, r.ID, chunk)
					out <- outcome{chunk, code, msg}
				}()
			}
		}
		todo, last = nil, nil
		var failed []string
		for range calls {
			o := <-out
			switch o.code {
			case answerOK:
			case answerLost:
				lost = append(lost, o.msg)
			case answerRetry:
				todo = append(todo, o.pages...)
				last = append(last, o.msg)
			default:
				failed = append(failed, o.msg)
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if len(failed) > 0 {
			slices.Sort(failed)
			return fmt.Errorf("%w: region %q: %s", ErrPersistFailed, r.Name, strings.Join(slices.Compact(failed), "; "))
		}
	}
	ps.persisted(r.ID, all)
	if len(lost) > 0 {
		slices.Sort(lost)
		return fmt.Errorf("%w: region %q: %s", ErrPersistLost, r.Name, strings.Join(lost, "; "))
	}
	return nil
}

// homes groups pages by the node of their home in the placement of the
// engine's current view.
func (ps *persister) homes(r ids.RegionID, pages []persistPage) (map[ids.NodeID][]persistPage, error) {
	es := ps.n.eng
	re, err := es.get(r)
	if err != nil {
		return nil, err
	}
	es.mu.RLock()
	pm := re.last
	homeOf := re.chains.homeOf(pm)
	es.mu.RUnlock()
	out := map[ids.NodeID][]persistPage{}
	for _, p := range pages {
		h := homeOf(p.No)
		node, ok := pm.nodeOf(h)
		if !ok || h == ids.None {
			return nil, fmt.Errorf("%w: page %d of region %v has no home in this view", ErrPersistUnavailable, p.No, r)
		}
		out[node] = append(out[node], p)
	}
	return out, nil
}

// askHome sends one persist request to home (or serves it here) and
// returns the answer; a home that does not answer is an answerRetry. The
// wait ends early when the engine's view moves the first page to another
// home (the home departed): the request then goes to the new one.
func (ps *persister) askHome(ctx context.Context, home ids.NodeID, r ids.RegionID, pages []persistPage) (answerCode, string) {
	if home == ps.self {
		return ps.serveHome(ctx, r, pages)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		t := time.NewTicker(homeWatchInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if now, err := ps.homes(r, pages[:1]); err == nil && len(now[home]) == 0 {
				cancel(fmt.Errorf("%w: the page's home moved", errHomeMoved))
				return
			}
		}
	}()
	id := ps.nextID.Add(1)
	a, err := ps.call(ctx, home, id, encodePersist(id, r, pages), persistCallTimeout)
	if err != nil {
		if cause := context.Cause(ctx); errors.Is(cause, errHomeMoved) {
			err = cause
		}
		return answerRetry, fmt.Sprintf("%v: persist request: %v", home, err)
	}
	return a.Code, a.Msg
}

// homeWatchInterval is how often a persist request in progress checks
// that its home is still the pages' home.
const homeWatchInterval = 200 * time.Millisecond

var errHomeMoved = errors.New("node: persist: home moved")

// call sends a request and waits for its answer from to.
func (ps *persister) call(ctx context.Context, to ids.NodeID, id uint64, b []byte, timeout time.Duration) (nodeMsg, error) {
	c := &pcall{to: to, ch: make(chan nodeMsg, 1)}
	ps.mu.Lock()
	ps.calls[id] = c
	ps.mu.Unlock()
	defer func() {
		ps.mu.Lock()
		delete(ps.calls, id)
		ps.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := ps.send(ctx, to, b); err != nil {
		return nodeMsg{}, err
	}
	select {
	case a := <-c.ch:
		return a, nil
	case <-ctx.Done():
		return nodeMsg{}, fmt.Errorf("no answer: %w", ctx.Err())
	}
}

// send sends a node-layer message, counted with the protocol's.
func (ps *persister) send(ctx context.Context, to ids.NodeID, b []byte) error {
	st := &ps.n.stats
	st.msgsOut.Add(1)
	st.bytesOut.Add(uint64(len(b)))
	return ps.n.verbs.Send(ctx, to, b)
}

// ---- messages from peers ----

// deliver takes a node-layer message from the verbs transport. Requests
// are served on goroutines of their own: the transport's handler must not
// wait for engines or disks.
func (ps *persister) deliver(from ids.NodeID, b []byte) {
	m, err := decodeNodeMsg(b)
	if err != nil {
		ps.log.Warn("undecodable node message", "from", from, "err", err)
		return
	}
	switch m.Kind {
	case msgPersistAnswer, msgCopyAnswer:
		ps.mu.Lock()
		c := ps.calls[m.ID]
		ps.mu.Unlock()
		if c == nil || c.to != from {
			ps.log.Debug("answer to no request", "from", from, "kind", m.Kind, "id", m.ID)
			return
		}
		select {
		case c.ch <- m:
		default:
		}
		return
	}
	// The pages of a persist-copy alias b, which the transport may reuse.
	for i := range m.Pages {
		m.Pages[i].Data = slices.Clone(m.Pages[i].Data)
	}
	ctx := ps.n.ctx
	ps.mu.Lock()
	if ps.closed {
		ps.mu.Unlock()
		return
	}
	ps.wg.Add(1)
	ps.mu.Unlock()
	go func() {
		defer ps.wg.Done()
		var code answerCode
		var msg string
		kind := msgPersistAnswer
		switch m.Kind {
		case msgPersist:
			code, msg = ps.serveHome(ctx, m.Region, m.Pages)
		case msgCopyPart:
			kind = msgCopyAnswer
			code, msg = ps.serveCopyPart(ctx, from, m)
		default:
			kind = msgCopyAnswer
			code, msg = ps.serveCopy(ctx, from, m.Region, m.PageSize, m.Pages)
		}
		sctx, cancel := context.WithTimeout(ctx, persistCopyTimeout)
		defer cancel()
		if err := ps.send(sctx, from, encodeAnswer(kind, m.ID, code, msg)); err != nil {
			ps.log.Warn("could not answer", "to", from, "kind", m.Kind, "err", err)
		}
	}()
}

// ---- the home ----

// serveHome persists pages of region r at this node, their home: stable
// copies, this node's store and every backup's.
func (ps *persister) serveHome(ctx context.Context, r ids.RegionID, asked []persistPage) (answerCode, string) {
	es := ps.n.eng
	re, err := es.get(r)
	if err != nil {
		return answerRetry, fmt.Sprintf("%v: %v", ps.self, err)
	}
	start := time.Now()
	pages, code, msg := ps.stableCopies(ctx, re, asked)
	if code != answerOK && code != answerLost {
		return code, msg
	}
	lostMsg := msg
	copied := time.Now()
	// The backups of each page, in the engine's view now.
	es.mu.RLock()
	pm := re.last
	backupsOf := re.chains.backupsOf(pm)
	es.mu.RUnlock()
	byBackup := map[ids.NodeID][]persistPage{}
	for _, p := range pages {
		for _, b := range backupsOf(ids.PageNo(p.No)) {
			if in, ok := pm.byProto[b]; ok && !in.departed && in.node != ps.self {
				byBackup[in.node] = append(byBackup[in.node], persistPage{No: ids.PageNo(p.No), Version: p.Version, Seq: p.seq, Data: p.Data})
			}
		}
	}
	var mine string
	var stored time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := ps.writeOrdered(ctx, ps.self, pages); err != nil {
			mine = fmt.Sprintf("%v: page store: %v", ps.self, err)
		}
		stored = time.Since(copied)
	}()
	failed := ps.copyToBackups(ctx, r, re.pageSize, byBackup)
	backedUp := time.Since(copied)
	<-done
	ps.log.Debug("persist request served", "region", re.region.Name, "pages", len(pages), "stable-copies", copied.Sub(start),
		"store", stored, "backups", backedUp)
	if mine != "" {
		failed = append(failed, mine)
	}
	if len(failed) > 0 {
		slices.Sort(failed)
		return answerFailed, strings.Join(failed, "; ")
	}
	if code == answerLost {
		return answerLost, lostMsg
	}
	return answerOK, ""
}

// stableCopies takes a stable copy of every page asked for at this node,
// their home (engine.Persist), in the home's order of stable copies. A
// page whose copy is older than the version asked for was lost (see
// answerLost): it is left out, and the answer is answerLost, with the
// other pages, naming it; a page this node is not the home of is answered
// retry.
func (ps *persister) stableCopies(ctx context.Context, re *regionEngine, asked []persistPage) ([]seqPage, answerCode, string) {
	r := re.region.ID
	if re.region.Durability != directory.DurabilitySynced {
		return nil, answerFailed, fmt.Sprintf("%v: region %q is not durable", ps.self, re.region.Name)
	}
	for _, p := range asked {
		if uint64(p.No) >= re.region.Pages() {
			return nil, answerFailed, fmt.Sprintf("%v: page %d is past the end of region %q", ps.self, p.No, re.region.Name)
		}
	}
	nos := make([]ids.PageNo, len(asked))
	chs := make([]chan stableCopy, len(asked))
	ps.mu.Lock()
	for i, p := range asked {
		nos[i] = p.No
		chs[i] = make(chan stableCopy, 1)
		k := regionPage{r, p.No}
		ps.copies[k] = append(ps.copies[k], chs[i])
	}
	ps.mu.Unlock()
	re.e.Persist(nos)
	wctx, cancel := context.WithTimeout(ctx, persistCopyWait)
	defer cancel()
	pages := make([]seqPage, 0, len(asked))
	var lost []string
	for i, ch := range chs {
		var sc stableCopy
		select {
		case sc = <-ch:
		case <-wctx.Done():
			// The channels left behind are answered and dropped in order.
			return nil, answerRetry, fmt.Sprintf("%v: no stable copy of page %d: %v", ps.self, asked[i].No, wctx.Err())
		}
		d := sc.d
		switch {
		case errors.Is(d.Err, coherence.ErrPersistAbandoned):
			return nil, answerRetry, fmt.Sprintf("%v: %v", ps.self, d.Err)
		case d.Err != nil:
			return nil, answerFailed, fmt.Sprintf("%v: stable copy of page %d: %v", ps.self, d.Page, d.Err)
		case asked[i].Version != 0 && pagestore.Newer(asked[i].Version, d.Version):
			// A home's copy of a page never goes back to an older
			// version but when the release was lost with the nodes that
			// held it: this node became home holding what survived.
			lost = append(lost, fmt.Sprintf("page %d (released at version %d, the home holds %d)", d.Page, asked[i].Version, d.Version))
			continue
		}
		pages = append(pages, seqPage{Page: pagestore.Page{Region: r, No: uint64(d.Page), Version: d.Version, Data: d.Data}, seq: sc.seq})
	}
	if len(lost) > 0 {
		ps.log.Warn("a Sync asked for writes this home never got: lost with the nodes that held them", "region", re.region.Name, "lost", len(lost), "first", lost[0])
		return pages, answerLost, fmt.Sprintf("%v: %d written pages lost with the nodes that held them before a Sync persisted them: %s",
			ps.self, len(lost), strings.Join(lost, ", "))
	}
	return pages, answerOK, ""
}

// copyToBackups sends stable copies of region r's pages to the backups
// named (node ids), in persist-copies or, for pages too large for one,
// copy-parts, and waits for every answer. It returns what failed.
func (ps *persister) copyToBackups(ctx context.Context, r ids.RegionID, pageSize int, byBackup map[ids.NodeID][]persistPage) []string {
	perMsg := copyPagesPerMsg(pageSize)
	var mu sync.Mutex
	var failed []string
	fail := func(m string) {
		mu.Lock()
		failed = append(failed, m)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	// Pages too large for a persist-copy go in copy-parts, a bounded
	// number in flight.
	inflight := make(chan struct{}, maxPartsInFlight)
	for b, bp := range byBackup {
		if perMsg == 0 {
			for _, p := range bp {
				for off := 0; off < len(p.Data); off += partBytes {
					wg.Add(1)
					inflight <- struct{}{}
					go func() {
						defer func() { <-inflight; wg.Done() }()
						id := ps.nextID.Add(1)
						piece := p.Data[off:min(off+partBytes, len(p.Data))]
						a, err := ps.call(ctx, b, id, encodeCopyPart(id, r, pageSize, p, off, piece), persistCopyTimeout)
						switch {
						case err != nil:
							fail(fmt.Sprintf("%v: persist-copy to backup %v: %v", ps.self, b, err))
						case a.Code != answerOK:
							fail(a.Msg)
						}
					}()
				}
			}
			continue
		}
		for chunk := range slices.Chunk(bp, perMsg) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := ps.nextID.Add(1)
				a, err := ps.call(ctx, b, id, encodeCopy(id, r, pageSize, chunk), persistCopyTimeout)
				switch {
				case err != nil:
					fail(fmt.Sprintf("%v: persist-copy to backup %v: %v", ps.self, b, err))
				case a.Code != answerOK:
					fail(a.Msg)
				}
			}()
		}
	}
	wg.Wait()
	return failed
}

// persistFill writes the pages of a fill to the store of the backup it
// filled, node `to` (docs/durability.md §3): a stable copy of each page
// of the region's pages, taken at this node, their home, after the fill
// completed in memory, sent in persist-copies. Every release after the
// fill writes the backup, and every Sync after it persists there too, so
// once this returns nil the backup holds every synced page of the pages
// on disk as well as in memory.
func (ps *persister) persistFill(ctx context.Context, re *regionEngine, to ids.NodeID, pages []ids.PageNo) error {
	for chunk := range slices.Chunk(pages, maxPersistPages) {
		asked := make([]persistPage, len(chunk))
		for i, p := range chunk {
			asked[i] = persistPage{No: p}
		}
		sp, code, msg := ps.stableCopies(ctx, re, asked)
		if code != answerOK {
			return fmt.Errorf("%w: %s", ErrPersistFailed, msg)
		}
		copies := make([]persistPage, len(sp))
		for i, p := range sp {
			copies[i] = persistPage{No: ids.PageNo(p.No), Version: p.Version, Seq: p.seq, Data: p.Data}
		}
		if failed := ps.copyToBackups(ctx, re.region.ID, re.pageSize, map[ids.NodeID][]persistPage{to: copies}); len(failed) > 0 {
			slices.Sort(failed)
			return fmt.Errorf("%w: %s", ErrPersistFailed, strings.Join(slices.Compact(failed), "; "))
		}
	}
	return nil
}

// ---- a backup ----

// serveCopy writes a home's stable copies of pages of region r to this
// node's store.
func (ps *persister) serveCopy(ctx context.Context, from ids.NodeID, r ids.RegionID, pageSize int, pages []persistPage) (answerCode, string) {
	reg, ok := ps.n.dir.View().RegionByID(r)
	switch {
	case !ok:
		return answerFailed, fmt.Sprintf("%v: region %v is not in this node's directory", ps.self, r)
	case reg.Durability != directory.DurabilitySynced:
		return answerFailed, fmt.Sprintf("%v: region %q is not durable", ps.self, reg.Name)
	case pageSize != int(reg.PageSize):
		return answerFailed, fmt.Sprintf("%v: pages of %d bytes for region %q of %d-byte pages", ps.self, pageSize, reg.Name, reg.PageSize)
	}
	sp := make([]seqPage, len(pages))
	for i, p := range pages {
		if uint64(p.No) >= reg.Pages() {
			return answerFailed, fmt.Sprintf("%v: page %d is past the end of region %q", ps.self, p.No, reg.Name)
		}
		sp[i] = seqPage{Page: pagestore.Page{Region: r, No: uint64(p.No), Version: p.Version, Data: p.Data}, seq: p.Seq}
	}
	if err := ps.writeOrdered(ctx, from, sp); err != nil {
		return answerFailed, fmt.Sprintf("%v: page store: %v", ps.self, err)
	}
	return answerOK, ""
}

// maxPartsInFlight bounds the copy-parts one persist request has in
// flight.
const maxPartsInFlight = 32

// serveCopyPart takes a piece of a home's stable copy of a page too large
// for a persist-copy; the piece that completes the page writes it, and its
// answer says how that went.
func (ps *persister) serveCopyPart(ctx context.Context, from ids.NodeID, m nodeMsg) (answerCode, string) {
	reg, ok := ps.n.dir.View().RegionByID(m.Region)
	p := m.Pages[0]
	switch {
	case !ok:
		return answerFailed, fmt.Sprintf("%v: region %v is not in this node's directory", ps.self, m.Region)
	case reg.Durability != directory.DurabilitySynced:
		return answerFailed, fmt.Sprintf("%v: region %q is not durable", ps.self, reg.Name)
	case m.PageSize != int(reg.PageSize):
		return answerFailed, fmt.Sprintf("%v: pages of %d bytes for region %q of %d-byte pages", ps.self, m.PageSize, reg.Name, reg.PageSize)
	case uint64(p.No) >= reg.Pages():
		return answerFailed, fmt.Sprintf("%v: page %d is past the end of region %q", ps.self, p.No, reg.Name)
	}
	k := partKey{from: from, r: m.Region, no: p.No, seq: p.Seq}
	now := time.Now()
	ps.mu.Lock()
	pp := ps.parts[k]
	if pp == nil {
		for k, old := range ps.parts {
			if now.Sub(old.at) >= latestTTL {
				delete(ps.parts, k) // its home gave up long ago
			}
		}
		pp = &partialPage{version: p.Version, data: make([]byte, m.PageSize), got: map[int]bool{}, at: now}
		ps.parts[k] = pp
	}
	if !pp.got[m.Offset] {
		pp.got[m.Offset] = true
		pp.bytes += copy(pp.data[m.Offset:], p.Data)
	}
	done := pp.bytes >= m.PageSize
	if done {
		delete(ps.parts, k)
	}
	ps.mu.Unlock()
	if !done {
		return answerOK, ""
	}
	page := seqPage{Page: pagestore.Page{Region: m.Region, No: uint64(p.No), Version: pp.version, Data: pp.data}, seq: p.Seq}
	if err := ps.writeOrdered(ctx, from, []seqPage{page}); err != nil {
		return answerFailed, fmt.Sprintf("%v: page store: %v", ps.self, err)
	}
	return answerOK, ""
}

// ---- the order of a page's writes ----

// latestTTL is how long the store's order of a page's writes is
// remembered: far longer than any request lives (persistCallTimeout).
const latestTTL = 5 * time.Minute

// seqPage is a page to store and its place in the order of the stable
// copies of the home that took it.
type seqPage struct {
	pagestore.Page
	seq uint64
}

// writeOrdered stores pages of the stable copies of home src (this node,
// or the home of a persist-copy) so that a page's stored copy never goes
// back to an older one: the copies of two requests may reach this point in
// either order (goroutines, several messages in flight). A page whose
// newer copy from the same home is queued already is not written again:
// its write is that newer one, and this call waits for its outcome too.
// Writes are queued under wmu in the order decided, and awaited outside
// it, so that concurrent requests share the store's group commits.
func (ps *persister) writeOrdered(ctx context.Context, src ids.NodeID, pages []seqPage) error {
	now := time.Now()
	mine := &queuedWrite{done: make(chan struct{})}
	var put []pagestore.Page
	var deps []*queuedWrite
	ps.wmu.Lock()
	for _, p := range pages {
		k := regionPage{p.Region, ids.PageNo(p.No)}
		if q, ok := ps.latest[k]; ok && q.src == src && q.seq >= p.seq && now.Sub(q.at) < latestTTL {
			if !slices.Contains(deps, q.w) {
				deps = append(deps, q.w)
			}
			continue
		}
		ps.latest[k] = queued{src: src, seq: p.seq, at: now, w: mine}
		put = append(put, p.Page)
	}
	if ps.writes++; ps.writes%1024 == 0 {
		for k, q := range ps.latest {
			if now.Sub(q.at) >= latestTTL {
				delete(ps.latest, k)
			}
		}
	}
	wait, err := ps.store.Enqueue(put)
	ps.wmu.Unlock()
	if err == nil {
		err = wait(ctx)
	}
	mine.err = err
	close(mine.done)
	if err != nil {
		return err
	}
	for _, d := range deps {
		select {
		case <-d.done:
			if d.err != nil {
				return d.err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// close waits for the handlers of requests in progress (the node's
// context is cancelled before).
func (ps *persister) close() {
	ps.mu.Lock()
	ps.closed = true
	ps.mu.Unlock()
	ps.wg.Wait()
}
