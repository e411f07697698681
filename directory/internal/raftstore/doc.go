// Package raftstore keeps the Raft log and stable store of the cluster
// directory in one pebble database.
//
// Keys are split by a one-byte prefix: 'l' followed by the big-endian log
// index holds an encoded raft.Log, 's' followed by the caller's key holds a
// stable value. Big-endian indexes sort in index order, so the first and last
// index are the first and last key under the 'l' prefix, found with a bounded
// iterator. Every write is one pebble batch committed with Sync: when a call
// returns, the data survives a kill -9 of the process.
//
// hashicorp/raft compares the error text of a missing stable key with
// "not found"; ErrKeyNotFound therefore carries exactly that text and no
// package prefix.
package raftstore
