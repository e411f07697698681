// Package placement decides which nodes hold a shard of a region: its home
// and its backups. It is a pure function of the shard and the set of
// candidate nodes, so every replica of the directory that sees the same
// member list computes the same answer without talking to anyone.
//
// It uses rendezvous (highest random weight) hashing: every (shard, node)
// pair gets a pseudo-random 64-bit score and the nodes are ranked by score.
// The first node is the home, the next ones are the backups. Two properties
// follow and are tested:
//
//   - a node that joins takes over only the shards where it scores highest,
//     about 1/N of them; no other shard changes home;
//   - a node that leaves or fails hands each of its shards to the next node in
//     that shard's ranking, which is its first backup.
//
// The score function is fixed (a SplitMix64-style mixer over the region, the
// shard and the node id). Changing it moves almost every shard; treat it as
// part of the on-the-wire contract of the directory.
package placement
