package node

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// The web console is a page at / of the metrics address, with its script
// and style sheet embedded in the binary, and a small read-only JSON API
// under /api/ that the page polls. The API answers from the same code as
// the Admin service (Status, Regions, Pages, Stats), so the console shows
// what dsmctl shows.

//go:embed console
var consoleFiles embed.FS

// Console limits and defaults.
const (
	// consoleDefaultCells is how many cells /api/pages draws when the
	// request does not say.
	consoleDefaultCells = 4096
	// consoleCallTimeout bounds one API request (Status and Pages ask the
	// other members).
	consoleCallTimeout = 10 * time.Second
)

// consoleOverview is the answer of /api/overview.
type consoleOverview struct {
	NodeID   uint32          `json:"node_id"`
	Version  string          `json:"version"`
	LeaderID uint32          `json:"leader_id"`
	Term     uint64          `json:"term"`
	Epoch    uint64          `json:"epoch"`
	Health   string          `json:"health"`
	Reasons  []string        `json:"reasons"`
	Members  []consoleMember `json:"members"`
	Regions  []consoleRegion `json:"regions"`
}

type consoleMember struct {
	NodeID        uint32 `json:"node_id"`
	Addr          string `json:"addr"`
	State         string `json:"state"`
	Voter         bool   `json:"voter"`
	Leader        bool   `json:"leader"`
	HomedShards   uint32 `json:"homed_shards"`
	CacheBytes    uint64 `json:"cache_bytes"`
	CacheCapacity uint64 `json:"cache_capacity_bytes"`
	DirtyPages    uint64 `json:"dirty_pages"`
	Error         string `json:"error,omitempty"`
}

type consoleRegion struct {
	Name       string `json:"name"`
	ID         uint32 `json:"id"`
	Size       uint64 `json:"size_bytes"`
	PageSize   uint32 `json:"page_size"`
	Pages      uint64 `json:"pages"`
	Shards     uint32 `json:"shards"`
	Durability string `json:"durability"`
}

// consolePages is the answer of /api/pages: the cells of a range of a
// region's pages, each one page or a group of pages, as dsmctl pages
// draws them.
type consolePages struct {
	Region    consoleRegion `json:"region"`
	NodeID    uint32        `json:"node_id"`
	Cluster   bool          `json:"cluster"`
	FirstPage uint64        `json:"first_page"`
	PageCount uint64        `json:"page_count"`
	Group     uint64        `json:"group"`
	Totals    struct {
		Modified uint64 `json:"modified"`
		Shared   uint64 `json:"shared"`
		Invalid  uint64 `json:"invalid"`
		Dirty    uint64 `json:"dirty"`
	} `json:"totals"`
	Cells []consoleCell `json:"cells"`
}

// consoleCell is one cell. State is the strongest state of its pages
// (M over S over I): "M" modified at one node (Owners has it), "M*" at
// several, "S" shared (MaxSharers: at most that many nodes), "I" no copy.
type consoleCell struct {
	FirstPage  uint64   `json:"first_page"`
	Pages      uint64   `json:"pages"`
	State      string   `json:"state"`
	Modified   uint64   `json:"modified"`
	Shared     uint64   `json:"shared"`
	Invalid    uint64   `json:"invalid"`
	Owners     []uint32 `json:"owners"`
	MaxSharers uint32   `json:"max_sharers"`
	Dirty      uint64   `json:"dirty"`
}

// consoleStats is the answer of /api/stats: this node's counters, from
// which the page computes rates, and its miss latency histogram.
type consoleStats struct {
	NodeID       uint32            `json:"node_id"`
	TimeUnixNano int64             `json:"time_unix_nano"`
	Faults       map[string]uint64 `json:"faults"`
	Hits         uint64            `json:"hits"`
	Misses       uint64            `json:"misses"`
	InvSent      uint64            `json:"invalidations_sent"`
	InvReceived  uint64            `json:"invalidations_received"`
	RecallsSent  uint64            `json:"recalls_sent"`
	RecallsRecv  uint64            `json:"recalls_received"`
	BytesIn      uint64            `json:"bytes_in"`
	BytesOut     uint64            `json:"bytes_out"`
	Evictions    uint64            `json:"evictions"`
	Writebacks   uint64            `json:"writebacks"`
	CacheBytes   uint64            `json:"cache_bytes"`
	CacheCap     uint64            `json:"cache_capacity_bytes"`
	DirtyPages   uint64            `json:"dirty_pages"`
	MissLatency  consoleHistogram  `json:"miss_latency"`
}

// consoleHistogram has cumulative buckets, as Prometheus has them.
type consoleHistogram struct {
	Count   uint64          `json:"count"`
	SumNs   uint64          `json:"sum_ns"`
	P50Ns   uint64          `json:"p50_ns"`
	P99Ns   uint64          `json:"p99_ns"`
	MaxNs   uint64          `json:"max_ns"`
	Buckets []consoleBucket `json:"buckets"`
}

type consoleBucket struct {
	UpperBoundNs uint64 `json:"le_ns"`
	Count        uint64 `json:"count"`
}

// consoleError is the body of every error answer.
type consoleError struct {
	Error string `json:"error"`
}

// consoleMux adds the console and its API to mux.
func (n *Node) consoleMux(mux *http.ServeMux) {
	static, err := fs.Sub(consoleFiles, "console")
	if err != nil {
		panic(err) // the embedded tree is part of the binary
	}
	files := http.FileServerFS(static)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/", "/console.js", "/console.css":
		default:
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
	mux.HandleFunc("/api/overview", n.apiHandler(nil, n.apiOverview))
	mux.HandleFunc("/api/pages", n.apiHandler([]string{"region", "first", "count", "cells", "local"}, n.apiPages))
	mux.HandleFunc("/api/stats", n.apiHandler(nil, n.apiStats))
}

// apiHandler serves one JSON endpoint: GET only, the query parameters
// named in params only (anything else is a 400), errors as
// {"error": "..."} with a status that says whose fault it is.
func (n *Node) apiHandler(params []string, fn func(ctx context.Context, q url.Values) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", "GET")
			writeJSON(w, http.StatusMethodNotAllowed, consoleError{"method " + r.Method + " not allowed; use GET"})
			return
		}
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, consoleError{"bad query: " + err.Error()})
			return
		}
		for k, vs := range q {
			known := false
			for _, p := range params {
				known = known || k == p
			}
			switch {
			case !known:
				writeJSON(w, http.StatusBadRequest, consoleError{fmt.Sprintf("unknown parameter %q", k)})
				return
			case len(vs) > 1:
				writeJSON(w, http.StatusBadRequest, consoleError{fmt.Sprintf("parameter %q given %d times", k, len(vs))})
				return
			}
		}
		if n.dir == nil || n.cache == nil {
			writeJSON(w, http.StatusServiceUnavailable, consoleError{"dsmd is starting"})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), consoleCallTimeout)
		defer cancel()
		v, err := fn(ctx, q)
		if err != nil {
			writeJSON(w, httpStatus(err), consoleError{status.Convert(err).Message()})
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

// httpStatus maps an Admin service error to an HTTP status.
func httpStatus(err error) int {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.NotFound:
		return http.StatusNotFound
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Unavailable, codes.FailedPrecondition:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	enc.Encode(v)
}

func badParam(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

func consoleRegionOf(r *dsmpb.Region) consoleRegion {
	cr := consoleRegion{Name: r.GetName(), ID: r.GetId(), Size: r.GetSize(), PageSize: r.GetPageSize(), Shards: r.GetShards(),
		Durability: strings.ToLower(strings.TrimPrefix(r.GetDurability().String(), "DURABILITY_"))}
	if cr.PageSize > 0 {
		cr.Pages = cr.Size / uint64(cr.PageSize)
	}
	return cr
}

func (n *Node) apiOverview(ctx context.Context, _ url.Values) (any, error) {
	adm := &adminServer{n: n}
	st, err := adm.Status(ctx, &dsmpb.StatusRequest{})
	if err != nil {
		return nil, err
	}
	regs, err := adm.Regions(ctx, &dsmpb.RegionsRequest{})
	if err != nil {
		return nil, err
	}
	o := consoleOverview{NodeID: st.NodeId, Version: st.Version, LeaderID: st.LeaderId, Term: st.Term, Epoch: st.Epoch,
		Health:  strings.ToLower(strings.TrimPrefix(st.GetHealth().GetVerdict().String(), "VERDICT_")),
		Reasons: append([]string{}, st.GetHealth().GetReasons()...), Members: []consoleMember{}, Regions: []consoleRegion{}}
	for _, m := range st.Nodes {
		o.Members = append(o.Members, consoleMember{NodeID: m.NodeId, Addr: m.Addr, State: memberWord(m.State), Voter: m.Voter,
			Leader: m.NodeId == st.LeaderId, HomedShards: m.HomedShards, CacheBytes: m.CacheBytes,
			CacheCapacity: m.CacheCapacityBytes, DirtyPages: m.DirtyPages, Error: m.Error})
	}
	for _, r := range regs.Regions {
		o.Regions = append(o.Regions, consoleRegionOf(r))
	}
	return o, nil
}

// uintParam reads q[name] as a decimal number; absent, it is def.
func uintParam(q url.Values, name string, def uint64) (uint64, error) {
	s := q.Get(name)
	if s == "" {
		return def, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, badParam("parameter %s=%q is not a non-negative whole number", name, s)
	}
	return v, nil
}

func (n *Node) apiPages(ctx context.Context, q url.Values) (any, error) {
	name := q.Get("region")
	if name == "" {
		return nil, badParam("parameter region is required")
	}
	first, err := uintParam(q, "first", 0)
	if err != nil {
		return nil, err
	}
	count, err := uintParam(q, "count", 0)
	if err != nil {
		return nil, err
	}
	cells, err := uintParam(q, "cells", consoleDefaultCells)
	if err != nil {
		return nil, err
	}
	if cells < 1 || cells > maxPageCells {
		return nil, badParam("parameter cells=%d: want 1 to %d", cells, maxPageCells)
	}
	local := false
	if s := q.Get("local"); s != "" {
		if local, err = strconv.ParseBool(s); err != nil {
			return nil, badParam("parameter local=%q: want true or false", s)
		}
	}
	r, err := n.region(name)
	if err != nil {
		return nil, err
	}
	total := r.Pages()
	if first >= total {
		return nil, badParam("region %q has %d pages; first=%d is past its end", r.Name, total, first)
	}
	if count == 0 {
		count = total - first
	}
	if count > total-first {
		return nil, badParam("region %q has %d pages; first=%d count=%d runs past its end", r.Name, total, first, count)
	}
	group := (count + cells - 1) / cells
	resp, err := (&adminServer{n: n}).Pages(ctx, &dsmpb.PagesRequest{Region: name, FirstPage: first, PageCount: count,
		Group: group, Cluster: !local})
	if err != nil {
		return nil, err
	}
	out := consolePages{Region: consoleRegionOf(resp.GetRegion()), NodeID: resp.NodeId, Cluster: resp.Cluster,
		FirstPage: resp.FirstPage, PageCount: resp.PageCount, Group: max(resp.Group, 1), Cells: make([]consoleCell, 0, len(resp.Cells))}
	for _, c := range resp.Cells {
		cc := consoleCell{FirstPage: c.FirstPage, Pages: c.Pages, Modified: c.Modified, Shared: c.Shared, Invalid: c.Invalid,
			Owners: append([]uint32{}, c.Owners...), MaxSharers: c.MaxSharers, Dirty: c.Dirty}
		switch {
		case c.Modified > 0 && len(c.Owners) == 1:
			cc.State = "M"
		case c.Modified > 0:
			cc.State = "M*"
		case c.Shared > 0:
			cc.State = "S"
		case c.Invalid > 0:
			cc.State = "I"
		default:
			cc.State = "?"
		}
		out.Totals.Modified += c.Modified
		out.Totals.Shared += c.Shared
		out.Totals.Invalid += c.Invalid
		out.Totals.Dirty += c.Dirty
		out.Cells = append(out.Cells, cc)
	}
	return out, nil
}

func (n *Node) apiStats(context.Context, url.Values) (any, error) {
	ns := n.localStats()
	out := consoleStats{NodeID: ns.NodeId, TimeUnixNano: ns.TimeUnixNano, Faults: ns.Faults, Hits: ns.Hits, Misses: ns.Misses,
		InvSent: ns.InvalidationsSent, InvReceived: ns.InvalidationsReceived, RecallsSent: ns.RecallsSent,
		RecallsRecv: ns.RecallsReceived, BytesIn: ns.BytesIn, BytesOut: ns.BytesOut, Evictions: ns.Evictions,
		Writebacks: ns.Writebacks, CacheBytes: ns.CacheBytes, CacheCap: ns.CacheCapacityBytes, DirtyPages: ns.DirtyPages}
	out.MissLatency.Buckets = []consoleBucket{}
	if h := ns.MissLatency; h != nil {
		out.MissLatency.Count, out.MissLatency.SumNs = h.Count, h.SumNs
		out.MissLatency.P50Ns, out.MissLatency.P99Ns, out.MissLatency.MaxNs = h.P50Ns, h.P99Ns, h.MaxNs
		for _, b := range h.Buckets {
			out.MissLatency.Buckets = append(out.MissLatency.Buckets, consoleBucket{b.UpperBoundNs, b.Count})
		}
	}
	return out, nil
}
