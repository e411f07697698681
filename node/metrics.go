package node

import (
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/ids"
)

// The metrics are read at scrape time from the directory and the page cache
// (a collector), so they cost nothing between scrapes and never disagree
// with what Status reports.
var (
	descUp          = prometheus.NewDesc("dsm_node_info", "Constant 1, labelled with the node id and the build version.", []string{"node", "version"}, nil)
	descEpoch       = prometheus.NewDesc("dsm_directory_epoch", "Epoch of the local directory replica.", nil, nil)
	descRegions     = prometheus.NewDesc("dsm_directory_regions", "Regions in the local directory replica.", nil, nil)
	descMembers     = prometheus.NewDesc("dsm_directory_members", "Members of the directory by state.", []string{"state"}, nil)
	descRaftTerm    = prometheus.NewDesc("dsm_raft_term", "Current Raft term.", nil, nil)
	descRaftLeader  = prometheus.NewDesc("dsm_raft_leader", "Node id of the Raft leader known here (0: none).", nil, nil)
	descRaftIsLead  = prometheus.NewDesc("dsm_raft_is_leader", "1 when this node leads Raft.", nil, nil)
	descRaftIndex   = prometheus.NewDesc("dsm_raft_index", "Raft log indexes: last, commit, applied, snapshot.", []string{"kind"}, nil)
	descRaftVoters  = prometheus.NewDesc("dsm_raft_servers", "Raft configuration by suffrage.", []string{"suffrage"}, nil)
	descHealth      = prometheus.NewDesc("dsm_health", "Health verdict as Status reports it: 1 healthy, 2 degraded, 3 unhealthy.", nil, nil)
	descCacheCap    = prometheus.NewDesc("dsm_cache_capacity_bytes", "Configured page cache capacity.", nil, nil)
	descCacheFaults = prometheus.NewDesc("dsm_cache_faults_total", "Fault messages read from clients, by kind.", []string{"kind"}, nil)
	descCacheOps    = prometheus.NewDesc("dsm_cache_ops_total", "Page cache operations by kind.", []string{"op"}, nil)
	descCachePages  = prometheus.NewDesc("dsm_cache_pages", "Pages held by the page cache: resident and dirty.", []string{"kind"}, nil)
	descCacheBytes  = prometheus.NewDesc("dsm_cache_bytes", "Bytes of the pages held by the page cache (each at its region's page size): resident, and dirty (Modified here, lost if this node dies before a sync).", []string{"kind"}, nil)
	descCacheCli    = prometheus.NewDesc("dsm_cache_clients", "Client mappings attached to the page cache.", nil, nil)
	descMsgs        = prometheus.NewDesc("dsm_protocol_messages_total", "Coherence protocol messages, by direction.", []string{"dir"}, nil)
	descInvSent     = prometheus.NewDesc("dsm_invalidations_sent_total", "Invalidation messages sent (retransmissions included).", nil, nil)
	descRecallsSent = prometheus.NewDesc("dsm_recalls_sent_total", "Recall messages sent to exclusive holders.", nil, nil)
	descBytes       = prometheus.NewDesc("dsm_bytes_total", "Page data and protocol messages moved, by direction.", []string{"dir"}, nil)
	descMissLat     = prometheus.NewDesc("dsm_miss_latency_seconds", "Latency of the page cache's read and write misses through the coherence engine.", nil, nil)
	descRegionsSrv  = prometheus.NewDesc("dsm_engine_regions", "Regions with a coherence engine on this node.", nil, nil)
	descLeaseLeft   = prometheus.NewDesc("dsm_lease_remaining_seconds", "Time left on this node's lease from a majority of the Raft voters (negative: over, local access to pages suspended).", nil, nil)
	descLeaseEnds   = prometheus.NewDesc("dsm_lease_suspensions_total", "Times this node's lease ended and local access to pages was suspended.", nil, nil)
	descStoreDrops  = prometheus.NewDesc("dsm_pagestore_shards_dropped_total", "Shards of durable regions whose pages this node's page store deleted because it no longer backs them.", nil, nil)
)

type collector struct{ n *Node }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(c, ch)
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	n := c.n
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	ctr := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	g(descUp, 1, ids.NodeID(n.cfg.ID).String(), Version)
	g(descCacheCap, float64(n.cfg.CacheSize))
	if n.dir == nil {
		return
	}
	if l := n.dir.Lease(); l.Until != 0 {
		g(descLeaseLeft, (l.Until - directory.LeaseClock()).Seconds())
	}
	ctr(descLeaseEnds, n.stats.leaseSuspends.Load())
	ctr(descStoreDrops, n.stats.storeShardsDropped.Load())
	v := n.dir.View()
	rs := n.dir.RaftStats()
	g(descEpoch, float64(v.Epoch))
	g(descRegions, float64(len(v.Regions())))
	states := map[directory.MemberState]int{directory.StateAlive: 0, directory.StateLeft: 0, directory.StateFailed: 0}
	for _, m := range v.Members() {
		states[m.State]++
	}
	for s, k := range states {
		g(descMembers, float64(k), s.String())
	}
	g(descRaftTerm, float64(rs.Term))
	g(descRaftLeader, float64(rs.Leader))
	lead := 0.0
	if rs.Leader == n.dir.NodeID() {
		lead = 1
	}
	g(descRaftIsLead, lead)
	g(descRaftIndex, float64(rs.LastIndex), "last")
	g(descRaftIndex, float64(rs.CommitIndex), "commit")
	g(descRaftIndex, float64(rs.AppliedIndex), "applied")
	g(descRaftIndex, float64(rs.LastSnapshotIndex), "snapshot")
	g(descRaftVoters, float64(len(rs.Voters)), "voter")
	g(descRaftVoters, float64(len(rs.NonVoters)), "nonvoter")
	short, homeless := placementHealth(v)
	g(descHealth, float64(n.judge(v, rs, n.members(v), homeless, short).Verdict))
	if n.cache == nil {
		return
	}
	st := n.cache.Stats()
	ctr(descCacheFaults, st.FaultsMissing, "missing")
	ctr(descCacheFaults, st.FaultsMinor, "minor")
	ctr(descCacheFaults, st.FaultsWP, "wp")
	for _, op := range []struct {
		name string
		v    uint64
	}{
		{"read_miss", st.ReadMisses}, {"write_miss", st.WriteMisses}, {"upgrade", st.Upgrades},
		{"miss_error", st.MissErrors}, {"local_resolve", st.LocalResolves}, {"install", st.Installs},
		{"invalidate", st.Invalidations}, {"downgrade", st.Downgrades}, {"evict", st.Evictions},
		{"writeback", st.Writebacks}, {"evict_error", st.EvictErrors}, {"session_error", st.SessionErrors},
	} {
		ctr(descCacheOps, op.v, op.name)
	}
	g(descCachePages, float64(st.ResidentPages), "resident")
	g(descCachePages, float64(st.DirtyPages), "dirty")
	g(descCacheBytes, float64(st.ResidentBytes), "resident")
	g(descCacheBytes, float64(st.DirtyBytes), "dirty")
	g(descCacheCli, float64(st.Clients))
	if n.eng == nil {
		return
	}
	ns := &n.stats
	ctr(descMsgs, ns.msgsIn.Load(), "in")
	ctr(descMsgs, ns.msgsOut.Load(), "out")
	ctr(descInvSent, ns.invalidationsSent.Load())
	ctr(descRecallsSent, ns.recallsSent.Load())
	ctr(descBytes, ns.bytesIn.Load(), "in")
	ctr(descBytes, ns.bytesOut.Load(), "out")
	h := n.eng.missLat.snapshot()
	buckets := make(map[float64]uint64, len(h.Buckets))
	for _, b := range h.Buckets {
		buckets[float64(b.UpperBoundNs)/1e9] = b.Count
	}
	ch <- prometheus.MustNewConstHistogram(descMissLat, h.Count, float64(h.SumNs)/1e9, buckets)
	n.eng.mu.RLock()
	served := len(n.eng.byID)
	n.eng.mu.RUnlock()
	g(descRegionsSrv, float64(served))
}

// metricsHandler serves /metrics from a registry of this node only (no
// package globals): the Go runtime, the process, and the node's collector;
// /healthz; the web console at / and its JSON API under /api/; and, with
// --pprof, the Go profiler under /debug/pprof/.
func (n *Node) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collector{n})
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	n.consoleMux(mux)
	if n.cfg.Pprof {
		// Not /debug/pprof/cmdline: the command line may hold
		// --gossip-key, and go tool pprof does not need it.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}
