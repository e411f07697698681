package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/ids"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
	"github.com/dsmkit/dsm/node/localcache"
)

// MaxMemoryIO bounds one ReadMemory or WriteMemory call.
const MaxMemoryIO = 16 << 20

// memRegion looks a region up for a memory call and checks [off, off+n).
// A region created through another node a moment ago may not be in this
// node's view yet: it is waited for (up to two seconds) once the leader
// confirms it exists.
//
// A local caller must be allowed to do op by the region's access list
// (write: op writes).
func (n *Node) memRegion(ctx context.Context, name, op string, write bool, off, length uint64) (directory.Region, error) {
	r, err := n.region(name)
	if status.Code(err) == codes.NotFound {
		if _, ok := n.freshView(ctx).Region(name); ok {
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			for err != nil && wctx.Err() == nil {
				select {
				case <-wctx.Done():
				case <-time.After(5 * time.Millisecond):
				}
				r, err = n.region(name)
				if err == nil && (n.eng == nil || n.eng.refusedRegion(r.ID) == "") {
					if _, cerr := n.cache.Held(r.ID, 0, 1); cerr != nil {
						err = cerr // the page cache has not set it up yet
					}
				}
			}
			cancel()
			if err != nil {
				return r, status.Errorf(codes.Unavailable, "region %q exists but is not set up on n%d yet: retry", name, n.cfg.ID)
			}
		}
	}
	if err != nil {
		return r, err
	}
	if err := checkRegion(ctx, r, op, write); err != nil {
		return r, err
	}
	if n.eng != nil {
		if why := n.eng.refusedRegion(r.ID); why != "" {
			return r, status.Errorf(codes.FailedPrecondition, "region %q is not served on n%d: %s", name, n.cfg.ID, why)
		}
	}
	if off > r.Size || length > r.Size-off {
		return r, status.Errorf(codes.InvalidArgument, "region %q: %d bytes at offset %d pass its end (%d bytes)", name, length, off, r.Size)
	}
	return r, nil
}

// word runs fn on the aligned word at off of region name, with the page
// held Modified (write) or at least Shared here.
func (n *Node) word(ctx context.Context, name string, off uint64, write bool, fn func(w *uint64)) error {
	if off%8 != 0 {
		return status.Errorf(codes.InvalidArgument, "region %q: offset %d is not a multiple of 8", name, off)
	}
	op := "read"
	if write {
		op = "write"
	}
	r, err := n.memRegion(ctx, name, op, write, off, 8)
	if err != nil {
		return err
	}
	ps := uint64(r.PageSize)
	in := off % ps
	err = n.cache.Access(ctx, r.ID, ids.PageNo(off/ps), write, func(page []byte) {
		fn((*uint64)(unsafe.Pointer(&page[in])))
	})
	return statusError(err)
}

func (s *clientServer) Load(ctx context.Context, req *dsmpb.LoadRequest) (*dsmpb.LoadResponse, error) {
	var v uint64
	err := s.n.word(ctx, req.GetRegion(), req.GetOffset(), false, func(w *uint64) { v = atomic.LoadUint64(w) })
	if err != nil {
		return nil, err
	}
	return &dsmpb.LoadResponse{Value: v}, nil
}

func (s *clientServer) Store(ctx context.Context, req *dsmpb.StoreRequest) (*dsmpb.StoreResponse, error) {
	err := s.n.word(ctx, req.GetRegion(), req.GetOffset(), true, func(w *uint64) { atomic.StoreUint64(w, req.GetValue()) })
	if err != nil {
		return nil, err
	}
	return &dsmpb.StoreResponse{}, nil
}

func (s *clientServer) Add(ctx context.Context, req *dsmpb.AddRequest) (*dsmpb.AddResponse, error) {
	var v uint64
	err := s.n.word(ctx, req.GetRegion(), req.GetOffset(), true, func(w *uint64) { v = atomic.AddUint64(w, req.GetDelta()) })
	if err != nil {
		return nil, err
	}
	return &dsmpb.AddResponse{NewValue: v}, nil
}

func (s *clientServer) CompareAndSwap(ctx context.Context, req *dsmpb.CompareAndSwapRequest) (*dsmpb.CompareAndSwapResponse, error) {
	resp := &dsmpb.CompareAndSwapResponse{}
	err := s.n.word(ctx, req.GetRegion(), req.GetOffset(), true, func(w *uint64) {
		for {
			cur := atomic.LoadUint64(w)
			if cur != req.GetOld() {
				resp.Current = cur
				return
			}
			if atomic.CompareAndSwapUint64(w, cur, req.GetNew()) {
				resp.Swapped, resp.Current = true, req.GetNew()
				return
			}
		}
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// Sync writes back the pages of the range this node holds Modified to
// their homes and backups, and waits for the write-backs of the range
// already under way (see awaitWriteBacks). For a durable region it then
// persists, at the homes and backups, every page of the range this node
// gave up Modified since its last Sync (persist.go); the pages are on disk
// there when it returns, but are not loaded again after a restart yet
// (docs/durability.md).
func (s *clientServer) Sync(ctx context.Context, req *dsmpb.SyncRequest) (*dsmpb.SyncResponse, error) {
	return s.n.sync(ctx, req.GetRegion(), req.GetOffset(), req.GetLength())
}

func (n *Node) sync(ctx context.Context, name string, off, length uint64) (*dsmpb.SyncResponse, error) {
	r, err := n.region(name)
	if err != nil {
		return nil, err
	}
	if length == 0 && off <= r.Size {
		length = r.Size - off
	}
	if _, err := n.memRegion(ctx, name, "sync", true, off, length); err != nil {
		return nil, err
	}
	ps := uint64(r.PageSize)
	first := off / ps
	pages := (off+length+ps-1)/ps - first
	if pages == 0 {
		return &dsmpb.SyncResponse{Epoch: uint64(n.dir.Epoch())}, nil
	}
	start := time.Now()
	w, err := n.cache.Flush(ctx, r.ID, ids.PageNo(first), pages)
	if err != nil {
		return nil, statusError(err)
	}
	flushed := time.Now()
	more, err := n.awaitWriteBacks(ctx, r.ID, ids.PageNo(first), ids.PageNo(first+pages))
	if err != nil {
		return nil, statusError(err)
	}
	awaited := time.Now()
	if r.Durability == directory.DurabilitySynced && n.persist != nil {
		if err := n.persist.syncRange(ctx, r, ids.PageNo(first), ids.PageNo(first+pages)); err != nil {
			return nil, persistStatus(err)
		}
	}
	n.log.Debug("sync", "region", r.Name, "pages", pages, "written", w+more, "write-back", flushed.Sub(start),
		"await", awaited.Sub(flushed), "persist", time.Since(awaited))
	return &dsmpb.SyncResponse{PagesWritten: uint64(w + more), Epoch: uint64(n.dir.Epoch())}, nil
}

// awaitWriteBacks completes a Sync's write-back of pages [first, end) of
// region rid beyond what the cache's Flush sees: a page the cache gave up
// Modified to a recall just before (a downgrade or a drop) is not Modified
// in the cache any more, but its release may still be on its way to the
// home and backups, or interrupted by a move. It waits for those releases
// (engine.WaitReleases), writes back the pages whose tenure a move gave
// back to this node (localcache.WriteBack), and waits again, until no
// release the Sync must cover is left. It returns how many pages it wrote
// back itself.
func (n *Node) awaitWriteBacks(ctx context.Context, rid ids.RegionID, first, end ids.PageNo) (int, error) {
	if n.eng == nil {
		return 0, nil
	}
	re, err := n.eng.get(rid)
	if err != nil {
		return 0, err
	}
	written := 0
	for {
		reclaimed, err := re.e.WaitReleases(ctx, first, end)
		if err != nil || len(reclaimed) == 0 {
			return written, err
		}
		for _, p := range reclaimed {
			if err := n.cache.WriteBack(ctx, rid, p); err != nil {
				return written, err
			}
			written++
		}
	}
}

// rw copies between buf and region memory at off, page by page, through
// the page cache (and so the coherence protocol).
func (n *Node) rw(ctx context.Context, r directory.Region, off uint64, buf []byte, write bool) error {
	ps := uint64(r.PageSize)
	for done := uint64(0); done < uint64(len(buf)); {
		at := off + done
		p, in := at/ps, at%ps
		m := min(ps-in, uint64(len(buf))-done)
		err := n.cache.Access(ctx, r.ID, ids.PageNo(p), write, func(page []byte) {
			if write {
				copy(page[in:in+m], buf[done:done+m])
			} else {
				copy(buf[done:done+m], page[in:in+m])
			}
		})
		if err != nil {
			return statusError(err)
		}
		done += m
	}
	return nil
}

func (s *adminServer) ReadMemory(ctx context.Context, req *dsmpb.ReadMemoryRequest) (*dsmpb.ReadMemoryResponse, error) {
	if req.GetLength() > MaxMemoryIO {
		return nil, status.Errorf(codes.InvalidArgument, "read of %d bytes: at most %d per call", req.GetLength(), MaxMemoryIO)
	}
	r, err := s.n.memRegion(ctx, req.GetRegion(), "read", false, req.GetOffset(), uint64(req.GetLength()))
	if err != nil {
		return nil, err
	}
	buf := make([]byte, req.GetLength())
	if err := s.n.rw(ctx, r, req.GetOffset(), buf, false); err != nil {
		return nil, err
	}
	return &dsmpb.ReadMemoryResponse{Data: buf}, nil
}

func (s *adminServer) WriteMemory(ctx context.Context, req *dsmpb.WriteMemoryRequest) (*dsmpb.WriteMemoryResponse, error) {
	if len(req.GetData()) > MaxMemoryIO {
		return nil, status.Errorf(codes.InvalidArgument, "write of %d bytes: at most %d per call", len(req.GetData()), MaxMemoryIO)
	}
	r, err := s.n.memRegion(ctx, req.GetRegion(), "write", true, req.GetOffset(), uint64(len(req.GetData())))
	if err != nil {
		return nil, err
	}
	if err := s.n.rw(ctx, r, req.GetOffset(), req.GetData(), true); err != nil {
		return nil, err
	}
	if req.GetSync() && len(req.GetData()) > 0 {
		if _, err := s.n.sync(ctx, req.GetRegion(), req.GetOffset(), uint64(len(req.GetData()))); err != nil {
			return nil, err
		}
	}
	return &dsmpb.WriteMemoryResponse{Written: uint64(len(req.GetData()))}, nil
}

// ---- Pages ----

// maxPageCells bounds the cells of one Pages answer.
const maxPageCells = 1 << 16

func statePB(s localcache.State) dsmpb.PageState {
	switch s {
	case localcache.Shared:
		return dsmpb.PageState_PAGE_STATE_SHARED
	case localcache.Modified:
		return dsmpb.PageState_PAGE_STATE_MODIFIED
	}
	return dsmpb.PageState_PAGE_STATE_INVALID
}

// Pages reports the MSI state of a range of pages: this node's copies, or
// with cluster set every alive member's copies (each is asked for its own),
// so that a page shows as M at one node, S at k nodes, or I.
func (s *adminServer) Pages(ctx context.Context, req *dsmpb.PagesRequest) (*dsmpb.PagesResponse, error) {
	n := s.n
	r, err := n.region(req.GetRegion())
	if err != nil {
		return nil, err
	}
	total := r.Pages()
	first := req.GetFirstPage()
	if first >= total {
		return nil, status.Errorf(codes.InvalidArgument, "region %q has %d pages; first page %d is past its end", r.Name, total, first)
	}
	count := req.GetPageCount()
	if count == 0 || count > total-first {
		count = total - first
	}
	local, err := n.cache.Held(r.ID, ids.PageNo(first), count)
	if err != nil {
		return nil, statusError(err)
	}
	if req.GetHeldOnly() {
		resp := &dsmpb.PagesResponse{NodeId: n.cfg.ID, Region: regionPB(r), FirstPage: first, PageCount: count, Group: 1}
		for _, p := range slices.Sorted(maps.Keys(local)) {
			resp.Cells = append(resp.Cells, &dsmpb.PageCell{FirstPage: uint64(p), Pages: 1, LocalState: statePB(local[p])})
		}
		return resp, nil
	}
	group := max(req.GetGroup(), 1)
	if (count+group-1)/group > maxPageCells {
		return nil, status.Errorf(codes.InvalidArgument, "%d pages in groups of %d make more than %d cells; raise the group", count, group, maxPageCells)
	}
	// states[node] is that node's held pages of the range.
	states := map[uint32]map[ids.PageNo]localcache.State{n.cfg.ID: local}
	cluster := req.GetCluster() && !localOnly(ctx)
	if cluster {
		for id, m := range n.askPages(ctx, &dsmpb.PagesRequest{Region: r.Name, FirstPage: first, PageCount: count, HeldOnly: true}) {
			states[id] = m
		}
	}
	resp := &dsmpb.PagesResponse{NodeId: n.cfg.ID, Region: regionPB(r), FirstPage: first, PageCount: count,
		Group: group, Cluster: cluster}
	nodes := make([]uint32, 0, len(states))
	held := map[ids.PageNo]bool{}
	for id, m := range states {
		nodes = append(nodes, id)
		for p := range m {
			held[p] = true
		}
	}
	slices.Sort(nodes)
	// Only held pages need a look: every other page is Invalid everywhere,
	// so a cell costs O(1) plus its held pages, whatever the region's size.
	heldPages := slices.Sorted(maps.Keys(held))
	j := 0
	for c := first; c < first+count; c += group {
		cell := &dsmpb.PageCell{FirstPage: c, Pages: min(group, first+count-c), LocalState: dsmpb.PageState_PAGE_STATE_INVALID}
		cell.Invalid = cell.Pages
		owners := map[uint32]bool{}
		for ; j < len(heldPages) && uint64(heldPages[j]) < c+cell.Pages; j++ {
			p := heldPages[j]
			var mod, sharers []uint32
			for _, id := range nodes {
				switch states[id][p] {
				case localcache.Modified:
					mod = append(mod, id)
				case localcache.Shared:
					sharers = append(sharers, id)
				}
			}
			ls := local[p]
			cell.LocalState = max(cell.LocalState, statePB(ls)) // I < S < M
			if ls == localcache.Modified {
				cell.Dirty++
			}
			switch {
			case len(mod) > 0:
				cell.Modified++
				cell.Invalid--
				for _, id := range mod {
					owners[id] = true
				}
			case len(sharers) > 0:
				cell.Shared++
				cell.Invalid--
				cell.MaxSharers = max(cell.MaxSharers, uint32(len(sharers)))
				if cell.Pages == 1 {
					cell.Sharers = sharers
				}
			}
		}
		for id := range owners {
			cell.Owners = append(cell.Owners, id)
		}
		slices.Sort(cell.Owners)
		resp.Cells = append(resp.Cells, cell)
	}
	return resp, nil
}

// askPages asks every other alive member for its copies of a range.
// Members that do not answer are left out.
func (n *Node) askPages(ctx context.Context, req *dsmpb.PagesRequest) map[uint32]map[ids.PageNo]localcache.State {
	out := map[uint32]map[ids.PageNo]localcache.State{}
	var mu sync.Mutex
	n.eachPeer(ctx, func(ctx context.Context, id uint32, adm dsmpb.AdminClient) {
		resp, err := adm.Pages(ctx, req)
		if err != nil {
			n.log.Debug("pages: peer did not answer", "peer", id, "err", err)
			return
		}
		m := map[ids.PageNo]localcache.State{}
		for _, c := range resp.Cells {
			switch c.LocalState {
			case dsmpb.PageState_PAGE_STATE_MODIFIED:
				m[ids.PageNo(c.FirstPage)] = localcache.Modified
			case dsmpb.PageState_PAGE_STATE_SHARED:
				m[ids.PageNo(c.FirstPage)] = localcache.Shared
			}
		}
		mu.Lock()
		out[id] = m
		mu.Unlock()
	})
	return out
}

// eachPeer calls fn for every other alive member with a gRPC address, in
// parallel, each bounded by peerTimeout, with the local-only marker set so
// that the peer answers for itself. Members that cannot be dialled are
// skipped.
func (n *Node) eachPeer(ctx context.Context, fn func(ctx context.Context, id uint32, adm dsmpb.AdminClient)) {
	n.eachMember(ctx, func(ctx context.Context, id uint32, adm dsmpb.AdminClient, err error) {
		if err == nil {
			fn(ctx, id, adm)
		}
	})
}

// eachMember is eachPeer that also calls fn, with the error, for the alive
// members it cannot dial or that publish no gRPC address.
func (n *Node) eachMember(ctx context.Context, fn func(ctx context.Context, id uint32, adm dsmpb.AdminClient, err error)) {
	var wg sync.WaitGroup
	for _, m := range n.dir.Members() {
		if uint32(m.ID) == n.cfg.ID || m.State != directory.StateAlive {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if m.GRPCAddr == "" {
				fn(ctx, uint32(m.ID), nil, errors.New("no gRPC address published"))
				return
			}
			conn, err := n.dialPeer(m.GRPCAddr, m.ID)
			if err != nil {
				fn(ctx, uint32(m.ID), nil, err)
				return
			}
			defer conn.Close()
			cctx, cancel := context.WithTimeout(ctx, peerTimeout)
			defer cancel()
			cctx = metadata.AppendToOutgoingContext(cctx, statusLocalKey, "1")
			fn(cctx, uint32(m.ID), dsmpb.NewAdminClient(conn), nil)
		}()
	}
	wg.Wait()
}

// ---- Stats ----

func (n *Node) localStats() *dsmpb.NodeStats {
	st := n.cache.Stats()
	ns := &dsmpb.NodeStats{
		NodeId:       n.cfg.ID,
		TimeUnixNano: time.Now().UnixNano(),
		Faults: map[string]uint64{
			"read":    st.ReadMisses,
			"write":   st.WriteMisses - st.Upgrades,
			"upgrade": st.Upgrades,
			"minor":   st.LocalResolves,
		},
		Hits:                  st.LocalResolves,
		Misses:                st.ReadMisses + st.WriteMisses,
		InvalidationsReceived: st.Invalidations,
		RecallsReceived:       st.Downgrades,
		Evictions:             st.Evictions,
		Writebacks:            st.Writebacks,
		CacheBytes:            uint64(st.ResidentBytes),
		CacheCapacityBytes:    uint64(n.cfg.CacheSize),
		CachePages:            uint64(st.ResidentPages),
		DirtyPages:            uint64(st.DirtyPages),
	}
	if n.eng != nil {
		ns.MissLatency = n.eng.missLat.snapshot()
		ns.InvalidationsSent = n.stats.invalidationsSent.Load()
		ns.RecallsSent = n.stats.recallsSent.Load()
		ns.BytesIn = n.stats.bytesIn.Load()
		ns.BytesOut = n.stats.bytesOut.Load()
	}
	return ns
}

func (s *adminServer) Stats(ctx context.Context, req *dsmpb.StatsRequest) (*dsmpb.StatsResponse, error) {
	n := s.n
	resp := &dsmpb.StatsResponse{Nodes: []*dsmpb.NodeStats{n.localStats()}}
	if req.GetAllNodes() && !localOnly(ctx) {
		var mu sync.Mutex
		answered := map[uint32]bool{}
		n.eachPeer(ctx, func(ctx context.Context, id uint32, adm dsmpb.AdminClient) {
			r, err := adm.Stats(ctx, &dsmpb.StatsRequest{})
			mu.Lock()
			defer mu.Unlock()
			answered[id] = true
			if err != nil {
				resp.Nodes = append(resp.Nodes, &dsmpb.NodeStats{NodeId: id, Error: fmt.Sprintf("n%d did not answer: %s", id, status.Convert(err).Message())})
				return
			}
			for _, ns := range r.Nodes {
				if ns.NodeId == id {
					resp.Nodes = append(resp.Nodes, ns)
				}
			}
		})
		slices.SortFunc(resp.Nodes, func(a, b *dsmpb.NodeStats) int { return int(a.NodeId) - int(b.NodeId) })
	}
	return resp, nil
}

// persistStatus maps the error of a durable region's persist requests:
// Unavailable, whose message names the node and the cause; a caller may
// retry the Sync (the data written back is at the homes and backups in
// memory either way).
func persistStatus(err error) error {
	if errors.Is(err, ErrPersistLost) {
		return status.Error(codes.DataLoss, err.Error())
	}
	if errors.Is(err, ErrPersistFailed) || errors.Is(err, ErrPersistUnavailable) {
		return status.Error(codes.Unavailable, err.Error())
	}
	return statusError(err)
}
