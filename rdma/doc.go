// Package rdma is the one-sided verbs transport: the way one node reaches
// another node's memory without involving that node's application code.
//
// It is shaped after RDMA verbs on a reliable-connected queue pair:
//
//   - A node registers memory it owns (Alloc gives memory off the Go heap)
//     with a set of remote rights and publishes the resulting Descriptor.
//     Deregistration revokes access; keys are never reused.
//   - A peer addresses that memory by (peer, RKey, offset) and issues READ,
//     WRITE, CAS and FAA on it. Atomics act on aligned 8-byte words in the
//     host's byte order and return the word as it was before.
//   - Several operations to one peer are posted as one batch (a doorbell):
//     they execute in order, cost one round trip, and complete in order. The
//     first failure ends the batch; the rest report ErrFlushed.
//   - Small two-sided messages (Send, and a Handler on the receiver) carry
//     what only the target's CPU can act on, such as invalidations.
//
// Every target validates every request with CheckOp before it touches
// memory, so a bad request gets one of the sentinel errors and never reaches
// outside the registered bounds. A peer that dies fails the operations
// pending on it with a *PeerError wrapping ErrPeerUnreachable; contexts bound
// every wait.
//
// Backends live in subpackages and all pass the conformance suite in
// rdmatest: mem (in-process; with a manual mode that lets a simulator hold,
// reorder, drop and release every operation), tcp (pure Go, the default),
// ofi (libfabric through cgo, build tag ofi), and fault, a wrapper that
// injects delay, loss, duplication, reordering and partitions into any of
// them.
package rdma
