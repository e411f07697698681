package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/node/localcache"
)

// MemPages is an in-memory page cache of one node: the Pages of an engine
// in tests, and a model of what localcache.Cache does with the engine.
// Reads and writes take a page's lock across the whole miss, as the Cache
// does; Drop and Downgrade take it too. The zero value is ready to use.
type MemPages struct {
	mu    sync.Mutex
	pages map[memKey]*memPage
}

type memKey struct {
	r ids.RegionID
	p ids.PageNo
}

type memPage struct {
	mu    sync.Mutex
	state localcache.State
	data  []byte
}

var _ Pages = (*MemPages)(nil)

func (m *MemPages) page(r ids.RegionID, p ids.PageNo) *memPage {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pages == nil {
		m.pages = map[memKey]*memPage{}
	}
	pg := m.pages[memKey{r, p}]
	if pg == nil {
		pg = &memPage{state: localcache.Invalid}
		m.pages[memKey{r, p}] = pg
	}
	return pg
}

// State is the local state of a page.
func (m *MemPages) State(r ids.RegionID, p ids.PageNo) localcache.State {
	pg := m.page(r, p)
	pg.mu.Lock()
	defer pg.mu.Unlock()
	return pg.state
}

// lockHeld locks page p and makes sure it is held at least Shared (or
// Modified when write), asking c on a miss. A miss that fails with
// ErrConflict is retried after the page's lock was released (the engine
// applies the remote action in between). On success the page is locked.
func (m *MemPages) lockHeld(ctx context.Context, c localcache.Coherence, r ids.RegionID, p ids.PageNo, size int, write bool) (*memPage, error) {
	pg := m.page(r, p)
	for {
		pg.mu.Lock()
		var err error
		switch {
		case pg.state == localcache.Modified, pg.state == localcache.Shared && !write:
			return pg, nil
		case pg.state == localcache.Shared:
			if err = c.WriteMiss(ctx, r, p, nil); err == nil {
				pg.state = localcache.Modified
				return pg, nil
			}
		default:
			buf := make([]byte, size)
			if write {
				err = c.WriteMiss(ctx, r, p, buf)
			} else {
				err = c.ReadMiss(ctx, r, p, buf)
			}
			if err == nil {
				pg.data = buf
				pg.state = localcache.Shared
				if write {
					pg.state = localcache.Modified
				}
				return pg, nil
			}
		}
		pg.mu.Unlock()
		if !errors.Is(err, ErrConflict) {
			return nil, err
		}
	}
}

// Read copies page p (size bytes) into a new slice, missing through c.
func (m *MemPages) Read(ctx context.Context, c localcache.Coherence, r ids.RegionID, p ids.PageNo, size int) ([]byte, error) {
	pg, err := m.lockHeld(ctx, c, r, p, size, false)
	if err != nil {
		return nil, err
	}
	defer pg.mu.Unlock()
	return append([]byte(nil), pg.data...), nil
}

// Write stores data at byte offset off of page p (size bytes), missing
// through c for the exclusive copy.
func (m *MemPages) Write(ctx context.Context, c localcache.Coherence, r ids.RegionID, p ids.PageNo, size, off int, data []byte) error {
	if off < 0 || off+len(data) > size {
		return fmt.Errorf("engine: write of %d bytes at %d in a %d-byte page", len(data), off, size)
	}
	pg, err := m.lockHeld(ctx, c, r, p, size, true)
	if err != nil {
		return err
	}
	defer pg.mu.Unlock()
	copy(pg.data[off:], data)
	return nil
}

// Update runs fn on the exclusive copy of page p (size bytes), missing
// through c for it: a read-modify-write of the whole page.
func (m *MemPages) Update(ctx context.Context, c localcache.Coherence, r ids.RegionID, p ids.PageNo, size int, fn func(data []byte)) error {
	pg, err := m.lockHeld(ctx, c, r, p, size, true)
	if err != nil {
		return err
	}
	defer pg.mu.Unlock()
	fn(pg.data)
	return nil
}

// Evict drops page p to make room, writing it back through c when it is
// Modified. On error the page stays as it was, except after
// localcache.ErrEvictPending (the engine took the write-back over).
func (m *MemPages) Evict(ctx context.Context, c localcache.Coherence, r ids.RegionID, p ids.PageNo) error {
	pg := m.page(r, p)
	for {
		done, err := m.evict(ctx, c, r, p, pg)
		if done || !errors.Is(err, ErrConflict) {
			return err
		}
	}
}

func (m *MemPages) evict(ctx context.Context, c localcache.Coherence, r ids.RegionID, p ids.PageNo, pg *memPage) (bool, error) {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if pg.state != localcache.Shared && pg.state != localcache.Modified {
		return true, nil
	}
	var dirty []byte
	if pg.state == localcache.Modified {
		dirty = pg.data
	}
	if err := c.Evict(ctx, r, p, dirty); err != nil {
		if errors.Is(err, localcache.ErrEvictPending) {
			// The engine keeps the data and finishes the write-back.
			pg.state, pg.data = localcache.Invalid, nil
		}
		return false, err
	}
	pg.state, pg.data = localcache.Invalid, nil
	return true, nil
}

// Drop implements Pages.
func (m *MemPages) Drop(r ids.RegionID, p ids.PageNo) []byte {
	pg := m.page(r, p)
	pg.mu.Lock()
	defer pg.mu.Unlock()
	var dirty []byte
	if pg.state == localcache.Modified {
		dirty = pg.data
	}
	pg.state, pg.data = localcache.Invalid, nil
	return dirty
}

// Downgrade implements Pages.
func (m *MemPages) Downgrade(r ids.RegionID, p ids.PageNo) []byte {
	pg := m.page(r, p)
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if pg.state != localcache.Modified {
		return nil
	}
	pg.state = localcache.Shared
	return append([]byte(nil), pg.data...)
}
