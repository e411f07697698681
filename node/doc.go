// Package node is dsmd, the daemon of the DSM service on one machine, as an
// importable package: cmd/dsmd only parses its flags (ParseFlags) and calls
// Run, so tests start whole nodes in-process.
//
// # What a node runs
//
//   - A replica of the cluster directory (package directory): Raft on pebble
//     for the region table, placement and members; memberlist for discovery
//     and failure detection. The node's addresses (gRPC, verbs) are
//     published in its member record.
//
//   - The verbs endpoint of the tcp backend (rdma/tcp). A goroutine follows
//     the directory (Subscribe) and keeps the transport's peer table equal
//     to the alive members and their verbs addresses.
//
//   - The gRPC Admin and Client services (internal/rpc/dsm/v1) on a Unix
//     socket (Config.Socket, default DATA_DIR/dsmd.sock) and optionally on
//     TCP (Config.GRPCAddr). Answers about the cluster come from the local
//     replica; Regions and RegionInfo first ask the leader for a read index
//     (LinearizableView, bounded to one second) so that a region created
//     through one node is listed by every other. Directory errors are mapped
//     to the codes of types.proto (statusError).
//
//   - The page store of durable regions (node/pagestore) in
//     DATA_DIR/pages, a pebble instance of its own beside the directory's
//     Raft log store, and the persist requests of Sync (persist.go), which
//     travel on the verbs transport under region id 0 (persistmsg.go).
//     Nothing reads the store back after a restart yet.
//
//   - Prometheus metrics on Config.MetricsAddr (/metrics, /healthz): the Go
//     runtime and process, the directory's epoch, regions and members, Raft
//     term, leader and indexes, the health verdict, and the page cache's
//     counters when the cache runs. They are read at scrape time. The same
//     address serves the web console at / (console.go: embedded static
//     files and a read-only JSON API under /api/ built on the Admin
//     service's Status, Regions, Pages and Stats) and, with Config.Pprof,
//     net/http/pprof under /debug/pprof/ (docs/console.md).
//
//   - The page cache and its mapping-session socket (node/localcache,
//     Config.MapSocket), and one coherence engine per region (node/engine)
//     behind it: the engines follow the directory (regions, the members'
//     home memory descriptors) and share the verbs transport, each
//     protocol message prefixed with its region id (regions.go). Options.
//     Coherence replaces the engines in tests (localcache.MemHome: a
//     single node with every page in memory).
//
//   - Memory calls (memory.go): Client Load, Store, Add, CompareAndSwap
//     (hardware atomics on the cache's page, held through the protocol
//     under the page lock), Sync (write-back of the range's Modified
//     pages; for a durable region then persisted at the homes and
//     backups, persist.go), Admin ReadMemory and WriteMemory (through the cache, at most
//     MaxMemoryIO bytes per call), Pages (this node's copies, or every
//     alive member's merged into one picture) and Stats (the cache's and
//     the engines' counters and the miss latency histogram, from every
//     member on request).
//
// A region's pages are homed on the members alive at its creation
// (directory.Region.Homes), for the region's life: the engines do not move
// homes on membership changes yet. A node outside that set answers memory
// calls on the region with FailedPrecondition.
//
// Status reports each alive member's cache use by asking that member's own
// Status over its published gRPC address, in parallel, one second each,
// with a metadata marker (dsm-status-local) that keeps the peer from asking
// further; a member that cannot be asked keeps its row, with the reason.
//
// # Local clients and gossip keys
//
// Both Unix sockets are created with --socket-mode and --socket-group
// (internal/localsock), and every peer's SO_PEERCRED credentials are
// judged when it connects (localauth.go): root, dsmd's user and the socket
// group's members are admitted; a refused process gets PERMISSION_DENIED
// on every gRPC call (an interceptor) and Error{permission denied} in
// answer to its map request. The caller's identity reaches the handlers
// as the peer address of the call (localsock.Addr). A region's access list
// (directory.Access) is checked on Map (localcache Config.MayMap: a
// mapping needs write access), again on the mappings made when the list
// changes (revokeMappings, localcache Revoke), and in memRegion for every
// memory call;
// callers over TCP carry no uid and are not checked there. Keyring (the
// gossip keys, keyring.go) is for root and dsmd's user only.
//
// # Health
//
// Status judges from the local replica and the local gossip view:
//
//   - unhealthy: no Raft leader known, fewer than a majority of the voters
//     alive, no alive member, or a shard of a region with no live home;
//   - degraded: a member failed (its shards moved to their backups), a
//     member that gossip suspects or that is in gossip but not yet in the
//     directory, or a region asking for more backups than there are other
//     alive members;
//   - healthy otherwise. A member that left gracefully is not a fault.
//
// # Lifecycle
//
//	n, err := node.New(cfg, node.Options{Logger: log})
//	err = n.Start()                 // binds everything, joins in the background
//	err = n.Shutdown(ctx)           // graceful: Raft hand-off, gossip leave, marked left
//	err = n.Close()                 // abrupt: peers see a failure; restartable
//
// Run does Start, waits for its context, then Shutdown: dsmd cancels that
// context on SIGTERM or SIGINT. Every goroutine a Node starts is stopped by
// Shutdown or Close.
//
// # Addresses
//
// --bind HOST with --port-base P derives gossip HOST:P, Raft HOST:P+1,
// directory RPC HOST:P+2 and verbs HOST:P+3; --gossip-addr, --raft-addr,
// --rpc-addr and --verbs-addr override one each. Port 0 picks a free port.
//
// # TLS
//
// --tls-dir (or --tls-ca, --tls-cert, --tls-key) loads the cluster CA and
// this node's certificate (internal/tlsconf), which must name --id; the
// verbs transport, Raft, the directory RPC and the gRPC TCP listener then
// speak mutual TLS 1.3 (docs/security.md). Run reloads the files at each
// Options.Reload (dsmd: SIGHUP). Without TLS, Validate refuses addresses
// that are not loopback unless Insecure, and the node then warns every
// minute. The Unix sockets are not affected.
package node
