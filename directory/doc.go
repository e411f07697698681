// Package directory is the cluster directory of the DSM service: the
// Raft-replicated authority on what changes rarely and must never be lost or
// disagree (design.md §3). It holds
//
//   - the region table: name (unique), id (never reused), size, page size,
//     shard size, number of backups, durability, creation time;
//   - the member table: node id, addresses (gRPC, verbs, Raft, directory
//     RPC), state (alive, left, failed), the current incarnation (its
//     number, nonce and protocol id, below) and the opaque registered-memory
//     descriptors each node publishes for its home pages;
//   - the epoch, which grows by one with every change of the member table
//     (and so of placement), and the member sets of the last 64 epochs
//     (View.History), so that a reader that skipped epochs can replay them;
//   - the quarantine of retired protocol ids; and
//   - implicitly, placement: pages are grouped into shards of ShardSize
//     bytes and each shard's home and backups are computed by rendezvous
//     hashing (package placement) over the alive members. Placement is a pure
//     function of a View, so every replica derives the same answer.
//
// # Incarnations and protocol ids
//
// A node id is configured and survives restarts; the process behind it
// does not, nor does its memory. Each process is an incarnation of its
// node id, told apart by a random non-zero nonce (Config.Nonce: the daemon
// passes its verbs transport's, so that both layers name the same
// incarnation) that travels in the gossip metadata and in every member
// command. The FSM numbers incarnations from 1 and gives each one a
// protocol id, 1..MaxProtoID (coherence.MaxNodeID): the name the coherence
// protocol will use for it, lowest free first.
//
// A member put with a nonce the table has not seen for that node is a
// restart: Incarnation+1, a fresh protocol id, the old one moved to the
// quarantine, the new process's addresses and descriptors replacing the old
// ones, state alive, all in one command and so one epoch (a departure and a
// join at once). It does not matter whether the old process was marked
// failed first: a restart quicker than failure detection is caught by the
// nonce. A put or state change carrying one of the node's past nonces
// (Member.PastNonces) is refused with ErrStaleIncarnation: a late
// SetLocalMeta of a dead process, or gossip that has not caught up, cannot
// bring an old incarnation back. Protocol ids are never reused yet (the
// homes cannot prove that no word names a retired id: docs/failover.md §2),
// so a cluster admits MaxProtoID incarnations over its life
// (View.ProtoIDsLeft); past that a restart fails with ErrNoProtoIDs and the
// old incarnation is marked failed.
//
// Until the engines follow epochs, a region records the incarnations of its
// homes at creation (Region.HomeIncarnations), so that a node can refuse
// the pages of a home that has restarted instead of reading its empty
// memory.
//
// # Replication
//
// Every change is a command (command.go) committed through hashicorp/raft
// and applied by the FSM (fsm.go) to an immutable View. Commands are
// idempotent (create and delete by name, puts and state changes that compare
// with the current value), so a proposer may retry one whose outcome it did
// not learn, as CreateRegion does across leader changes. Followers forward
// writes to the leader over the directory's own small RPC (rpc.go: 4-byte
// length-prefixed JSON frames on RPCAddr). LinearizableView asks the leader
// for a read index (Barrier, then VerifyLeader) and waits until the local
// replica has applied that far; every other read uses the local replica and
// may be stale by a few milliseconds. Raft tells followers the commit index
// only with an AppendEntries, so the leader follows each command it applies
// with a barrier entry (announceCommit) rather than relying on its idle
// appends, which Timing.RaftCommit spaces widely so that an idle leader
// sleeps.
//
// The Raft log and stable store live in one pebble database
// (internal/raftstore), behind raft's log cache; snapshots are files in
// DataDir; the transport is raft's TCP transport.
//
// # Membership
//
// memberlist gossips each node's metadata (id, addresses, bootstrap-expect,
// whether it holds Raft state, incarnation nonce) and detects failures. Its callbacks only
// queue events. The node's run loop drains the queue and, on the Raft
// leader, reconciles (reconcile.go): alive gossip members are put alive in
// the member table (a new nonce making a new incarnation) and added to Raft
// (voters up to MaxVoters, non-voters beyond, non-voters promoted when a
// voter goes); dead ones are marked failed, departed ones left, and both
// are removed from Raft. Each table change is one command, so one epoch.
//
// Bootstrap follows Consul's bootstrap-expect: when BootstrapExpect servers
// with that same setting are alive in gossip and none of them (nor this
// node) holds Raft state, the one with the lowest node id bootstraps Raft
// with all of them as voters. A node with state never bootstraps again; a
// node whose peers have state waits to be added.
//
// # Driving it
//
//	d, err := directory.Open(directory.Config{NodeID: 1, DataDir: dir,
//		GossipAddr: "10.0.0.1:7946", RaftAddr: "10.0.0.1:7947", RPCAddr: "10.0.0.1:7948",
//		Join: []string{"10.0.0.2:7946"}, BootstrapExpect: 3})
//	defer d.Close()
//	r, err := d.CreateRegion(ctx, directory.RegionSpec{Name: "features", Size: 64 << 30})
//	p, err := d.Placement(r.ID, page) // p.Home, p.Backups, p.Epoch
//	changes, cancel := d.Subscribe()   // new epochs, members joined / departed
//
// Every method is safe for concurrent use. Close stops the replica as if it
// crashed (peers detect the failure); Leave departs gracefully.
package directory
