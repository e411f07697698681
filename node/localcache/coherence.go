package localcache

import (
	"context"
	"sync"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/internal/ids"
)

// State is the local MSI state of a page: what this machine's mappings may
// do with it. It is the coherence protocol's state (coherence.State):
//
//   - Invalid (the zero value): the page is not in the region's memfd (a
//     hole); every local access faults.
//   - Shared: the memfd holds a valid copy; clients map it read-only, and
//     a store faults (WP).
//   - Modified: this node holds the page exclusively; clients may map it
//     writable, and the memfd copy is the only current one.
type State = coherence.State

// Page states.
const (
	Invalid  = coherence.Invalid
	Shared   = coherence.Shared
	Modified = coherence.Modified
)

// Coherence is what the Cache needs from the coherence engine: permission
// and data for local misses, and a place to give pages up. The Cache calls
// it with the page's lock held (see "Lock order" in the package doc): the
// engine must not wait, inside these calls, for Invalidate, Downgrade or
// Install of the same page; when a remote action conflicts with a miss in
// flight, the engine fails the miss (any error) first, and the Cache retries
// the fault after the remote action.
//
// ctx is cancelled when the faulting client goes away or the Cache closes.
// An error means "nothing granted": the page keeps its local state. buf is
// valid only during the call.
type Coherence interface {
	// ReadMiss obtains Shared permission for a page this node does not
	// hold and writes its current contents into buf (one page).
	ReadMiss(ctx context.Context, r ids.RegionID, p ids.PageNo, buf []byte) error
	// WriteMiss obtains exclusive (Modified) permission. buf is nil when
	// this node holds a valid Shared copy (an upgrade: no data is wanted);
	// otherwise the engine writes the page's current contents into buf.
	WriteMiss(ctx context.Context, r ids.RegionID, p ids.PageNo, buf []byte) error
	// Evict tells the engine that this node dropped its copy to make room.
	// dirty is nil for a Shared copy; for a Modified one it holds the
	// contents to write back, and on error the Cache keeps the page
	// resident and Modified. The page is already out of every local
	// mapping when Evict is called. An error wrapping ErrBusy means that a
	// remote request is taking the page at this moment: the Cache
	// releases the page's lock and, where it must write the page back
	// (Flush), tries again.
	Evict(ctx context.Context, r ids.RegionID, p ids.PageNo, dirty []byte) error
}

// MemHome is a Coherence for a node that is the only one: it is the home of
// every page and keeps the written-back contents in memory. Pages never
// written read as zeros. It grants every request at once. Tests use it as
// the backing store; a single-node dsmd could too.
type MemHome struct {
	mu    sync.Mutex
	pages map[homeKey][]byte
}

type homeKey struct {
	r ids.RegionID
	p ids.PageNo
}

var _ Coherence = (*MemHome)(nil)

// ReadMiss copies the home copy into buf.
func (h *MemHome) ReadMiss(_ context.Context, r ids.RegionID, p ids.PageNo, buf []byte) error {
	h.Get(r, p, buf)
	return nil
}

// WriteMiss copies the home copy into buf when asked.
func (h *MemHome) WriteMiss(_ context.Context, r ids.RegionID, p ids.PageNo, buf []byte) error {
	if buf != nil {
		h.Get(r, p, buf)
	}
	return nil
}

// Evict stores dirty data as the home copy.
func (h *MemHome) Evict(_ context.Context, r ids.RegionID, p ids.PageNo, dirty []byte) error {
	if dirty != nil {
		h.Put(r, p, dirty)
	}
	return nil
}

// Get copies the home copy of a page into buf (zeros if never written).
func (h *MemHome) Get(r ids.RegionID, p ids.PageNo, buf []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	src := h.pages[homeKey{r, p}]
	n := copy(buf, src)
	clear(buf[n:])
}

// Put replaces the home copy of a page with a copy of data.
func (h *MemHome) Put(r ids.RegionID, p ids.PageNo, data []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pages == nil {
		h.pages = make(map[homeKey][]byte)
	}
	h.pages[homeKey{r, p}] = append([]byte(nil), data...)
}
