// Package ofi is the libfabric backend of the verbs transport: an
// rdma.Transport whose READ, WRITE, CAS and FAA are one-sided operations of
// a libfabric provider (fi_read, fi_write, fi_compare_atomic and
// fi_fetch_atomic on FI_UINT64 with FI_CSWAP and FI_SUM), on a reliable
// datagram endpoint (FI_EP_RDM) with FI_RMA, FI_ATOMIC and FI_MSG. On a
// real fabric it runs over the verbs or EFA provider; on one host it is
// tested with shm (cross-memory attach), tcp;ofi_rxm and sockets.
//
// Everything but this file is behind the build tag ofi (cgo, libfabric
// 1.17 or later, -lfabric), so the package exists, empty, without it:
//
//	go test -tags ofi -race ./rdma/ofi/...
//
// # Driving it
//
//	t, err := ofi.Listen(id, "127.0.0.1:0", ofi.Config{Provider: "tcp;ofi_rxm"})
//	// publish t.Addr() (through the directory); for every peer:
//	t.AddPeer(peerID, peerAddr)
//	reg, err := t.Register(mem, rdma.AccessAll) // mem from rdma.Alloc
//	// publish reg.Descriptor(); peers then Post ops naming its RKey.
//
// Config.Provider names the provider ("sockets", "tcp;ofi_rxm", "shm", or
// empty to let libfabric choose). Addr is "ofi:<provider>:<hex of the
// endpoint name from fi_getname>"; AddPeer decodes it, refuses another
// provider's address or a name of the wrong size, and inserts it into the
// address vector. Every two-sided frame starts with a 24-byte header: wire
// version (3), kind, the sender's node id (so a receiver knows who sent it
// without FI_SOURCE), the sender's incarnation nonce and the incarnation of
// the receiver it is meant for.
//
// dsmd (package node) drives it like the tcp backend, through --transport
// ofi and --ofi-provider: it publishes Addr and Nonce in the directory, adds
// the peers the directory lists as alive with AddPeer and ExpectNonce, and
// removes them with RemovePeer when the directory's failure detector marks
// them failed, which fails the operations pending on them at once.
//
// # Incarnations
//
// Listen draws a random non-zero nonce (Nonce), which the daemon publishes
// as the directory's incarnation of the node. The socket providers name an
// endpoint by its host and port, so a restarted process listens at the same
// fabric address as the one before it, and a peer that has not yet learnt
// of the restart reaches the new process with the old one's descriptors.
// Three things keep those from touching the new process's memory:
//
//   - ExpectNonce(peer, nonce) names the incarnation that may be reached.
//     Every frame names the receiver's incarnation it is meant for, and a
//     receiver drops frames meant for an earlier process of its node;
//     descriptor queries alone go to any incarnation, and their answer
//     says whose it is. A
//     frame from the peer tells the initiator the peer's incarnation: once
//     it differs from the expected one, Post and Send fail with
//     rdma.ErrIncarnation without sending; what was cached of the peer's
//     registrations is dropped and what was pending on the old process
//     fails at once. A descriptor query that another incarnation answers
//     fails with rdma.ErrIncarnation too.
//   - One-sided operations carry no nonce (the fabric executes them without
//     this code), so requested memory keys start at a random point of the
//     key space, drawn per incarnation: a key of the old process names no
//     registration in the new one, and providers that check keys at the
//     target (sockets, tcp;ofi_rxm) refuse the operation; the initiator's
//     question that follows meets the new incarnation and fails with
//     rdma.ErrIncarnation. Where the provider chooses keys itself
//     (FI_MR_PROV_KEY: verbs, efa), whether a key of an old process can
//     name a registration of the new one is up to the provider and the
//     NIC (not tested here).
//   - shm names endpoints after the process (pid), so a new process has a
//     new address, and the old address reaches nobody.
//
// # How an operation travels
//
// A Post takes one slot: C memory (never the Go heap) that holds the
// libfabric contexts, the compare, operand and result words of atomics, and
// a staging arena for READ and WRITE payloads. WRITE payloads are copied
// into the arena, the ops are posted with one cgo call, and READ data is
// copied out once every completion arrived; with an arena large enough for
// the batch (it grows, up to 8 MiB per segment, and is kept while all
// arenas together stay under 64 MiB), a Post allocates nothing: the
// benchmarks measure 0 allocations per operation.
//
// Writes are posted with FI_DELIVERY_COMPLETE, so a completed WRITE is
// visible at the target, except on libfabric 1.17's shm to a peer that
// cross-memory attach reaches (probed with process_vm_readv at AddPeer;
// not with FI_SHM_DISABLE_CMA): there a WRITE without it takes the
// provider's fast path, which copies the payload into the target's memory
// with process_vm_writev inside fi_writemsg and only then completes it
// (smr_rma_fast), so completion still means visibility, and it needs no
// response from the target. With FI_DELIVERY_COMPLETE the same 4 KiB WRITE
// went through the provider's segmentation buffers and the target's
// progress, at 0.35 to 0.65 ms. Other libfabric versions keep
// FI_DELIVERY_COMPLETE (their shm was not read here).
//
// # Progress
//
// One goroutine per endpoint, the poller, reads the completion queue: it
// completes slots, receives frames, fails slots whose completions are
// overdue and, for providers that make progress only when polled (shm,
// tcp;ofi_rxm), is what lets the target side of one-sided operations
// proceed. Config.Poll says how it waits on an empty queue:
//
//   - PollBlock (the default for sockets and the rxm providers, whose wait
//     objects wake for incoming traffic): in fi_cq_sread, on a thread of
//     its own, 100 ms at a time while idle and 10 ms with requests in
//     flight (the reaper's period); Close signals it out with
//     fi_cq_signal.
//   - PollDoorbell (the default, and only meaningful, on shm). libfabric
//     1.17's shm has no wait object that wakes for a peer's request (its
//     CQ offers FI_WAIT_YIELD at most, fi_cq_sread spins or polls, and its
//     data progress is FI_PROGRESS_MANUAL), and it carries WRITEs with
//     delivery-complete, atomics and messages through the target's
//     progress: the target must read its queue before anything happens.
//     So every endpoint has a doorbell, a non-blocking Unix datagram
//     socket beside its file in /dev/shm ("<name>.bell"). An initiator that
//     posts a request that needs the target (an atomic, a message, a
//     delivery-complete WRITE), or that the provider refused with
//     FI_EAGAIN (a full command queue), sends the target's doorbell one
//     byte that asks to be rung back. The poller waits for its doorbell in
//     the runtime's network poller (no OS thread and no P held while
//     idle), then drains it, reads the queue (the provider serves every
//     command posted before the rings) and rings back each initiator that
//     asked, whose poller then finds its completion. The poller also wakes
//     after 100 ms idle, 1 ms with requests in flight, for a ring that was
//     dropped (the socket's queue was full: the target had rings to read
//     anyway) or never sent. A READ, and a WRITE by cross-memory attach,
//     ring nobody: they leave the target a notice that it reads at its
//     next progress. The runtime clears a socket's readiness before it
//     waits, so the poller peeks for a ring that came between its last
//     drain and the wait; without the peek about one wake-up in two was
//     lost to the 1 ms fallback.
//   - PollSleep: 20 µs sleeps between reads; PollSpin: yielding between
//     reads (a core per endpoint). Outside PollBlock and PollDoorbell the
//     poller keeps reading without a pause for 200 µs after a completion.
//
// A caller waiting for its own completions on shm first reads the queue
// itself (when no one else is reading it) for up to 100 µs, about an
// atomic's round trip, which spares it the wake-ups of a hand-over from the
// poller; READs and WRITEs by cross-memory attach complete inside the post,
// so the first read finds them. Whoever reads the queue holds one mutex,
// so completions, and the frames received, are handled in queue order. The
// other providers leave reading to the poller: on tcp;ofi_rxm, caller reads
// made fi_close of the endpoint fault now and then (DeadPeerMidBatch,
// libfabric 1.17), and in blocking mode the poller holds the queue anyway.
//
// Idle cost (TestIdleCPU: two connected endpoints in one process, 10 s,
// utime+stime from /proc/self/stat, on this shared two-core machine): shm
// 0.35 % of a CPU per endpoint with the doorbell (the 100 ms fallback
// wake-ups, the runtime's own timers), against 31 % with the 20 µs sleeps
// it replaced; sockets 0.25 % and tcp;ofi_rxm 0.35 %, against 1.0 to 1.2 %
// and 1.5 to 2 % when the blocking poller woke every 10 ms.
//
// What was tried and dropped: a doorbell thread in C (poll(2) on the
// socket, fi_cq_read of zero entries for the target's progress, an eventfd
// to wake the Go side), with and without a bounded spin after serving,
// measured 2 to 4 times slower than the goroutine in the network poller on
// this loaded machine: the initiator's side then needs a third wake-up,
// and a spinning thread takes one of the two cores from the peer it
// serves. Spinning the poller goroutine (runtime.Gosched, 50 µs) after
// serving made atomics 3 to 6 times slower in the same run (the spinning
// goroutine holds a P, and the runtime polls the network less while every
// P is busy).
//
// The endpoint reaches itself through the fabric, so a Post to the local
// node takes the same path, and the same atomicity domain, as a remote one.
//
// # Order within a batch
//
// Providers do not all order RMA (shm and tcp;ofi_rxm order only sends).
// A batch is therefore cut into segments: a segment is the longest run of
// ops on distinct registrations; its ops are posted together and the next
// segment is posted when it completed. Ops on one registration wait for
// each other even where their bytes do not overlap, because the order of
// such ops carries meaning: the coherence protocol dates a page it READs
// by READs of the page's word before and after it, and a release WRITEs
// the page before the CAS that ends its tenure (docs/protocol.md, "The home
// slot and the coherence word"). A batch of n ops on one registration
// costs n round trips on these providers; one that orders RMA at the
// target (FI_ORDER_* in msg_order) could take them in one, which is not
// built.
//
// # Memory registration
//
// The MR mode bits FI_MR_LOCAL, VIRT_ADDR, ALLOCATED, PROV_KEY and ENDPOINT
// are offered and whatever the provider keeps is honoured: local buffers are
// registered and their descriptors passed when it wants FI_MR_LOCAL; the
// registration's address goes in rdma.RKey.Base and remote addresses are
// Base+Offset under VIRT_ADDR (Base is zero and addresses are offsets
// otherwise); keys are the provider's under PROV_KEY and otherwise chosen
// here, counting up from a random point drawn per incarnation, never reused;
// a region is bound to the endpoint and enabled under ENDPOINT. Remote rights map to FI_REMOTE_READ and FI_REMOTE_WRITE; libfabric
// has no separate right for atomics, so AccessRemoteAtomic registers both,
// and the atomic-only rule is enforced by the initiator's check below.
// Go memory passed to Register is pinned while registered.
//
// # Keys per requester incarnation, and the fence
//
// The key in a registration's Descriptor (the one dsmd publishes through
// the directory) names the registration; only this endpoint's own
// operations use it as a fabric key. A peer's incarnation gets a key of
// its own: the target answers its first descriptor query for a
// registration by registering the same memory once more, with the same
// rights, for that incarnation (requester node and nonce, from the
// query's header), and the answer carries that key (remoteDesc.key), which
// every later operation of the incarnation names. Fence(node, nonce)
// closes the keys granted to that incarnation and refuses its later
// queries ("not found"), so the providers that check keys at the target
// (sockets, tcp;ofi_rxm) refuse its operations, whatever connection they
// come on, while every other incarnation's keys and operations in flight
// are untouched. ofi_rxm checks a WRITE's key when its header arrives and
// copies its payload as the bytes come, so Fence also closes the
// connection to the node's address there (fi_av_remove with
// FI_AV_REMOVE_CLEANUP, which this package sets unless the environment
// does): a WRITE half received when the fence falls is dropped, not
// finished. That is done only while no newer incarnation of the node is
// expected at the address or has spoken from it: the connection may then
// carry the new process's requests, and what a graceful close leaves
// queued is still delivered after the requests' error completions. A
// node that learns a departure only after the new incarnation (it was
// paused, or joined later) keeps the connection, and with it the one case
// the keys alone leave open: a WRITE of the fenced process whose header
// arrived before the fence. dsmd calls Fence for every departed incarnation
// as it learns the departure, before its engines acknowledge the epoch,
// as it does on the tcp transport (node.fenceDeparted): an incarnation cut
// off by a partition lands nothing when the partition heals
// (TestFenceRefusesADepartedIncarnation). Registrations cost one memory
// region per peer incarnation that uses them (Grants counts them). On shm
// a target checks no key for READs and cross-memory-attach WRITEs (see
// Checks), so there the fence is the initiator's: its engines post
// nothing once its lease is over. Providers that choose keys themselves
// (FI_MR_PROV_KEY: verbs, efa) invalidate a closed region's key in the
// NIC; that was not tested here.
//
// # Checks, and which error comes from where
//
// An initiator validates every op with rdma.CheckOp against the target's
// descriptor, which it asks the target for on the first use of a key (a
// control frame) and caches. So unknown keys, out-of-bounds ranges,
// misaligned atomics and missing rights are reported with the rdma
// sentinels, before anything is posted, by every provider; the suite's bad
// requests never reach the fabric. Deregister closes the memory region (the
// provider refuses later accesses where it checks keys) and then tells every
// peer, waiting up to a second for each acknowledgement, so that no peer
// starts an operation on the key afterwards; the peers keep a tombstone and
// answer ErrUnknownKey.
//
// A request that reaches the target with a wrong descriptor anyway (a race
// with Deregister) is a second line of defence, and there the providers
// differ (measured with libfabric 1.17, TestProviderEnforces and
// TestShmRefusedRequest):
//
//   - sockets refuses it with an error completion (FI_EACCES); the initiator
//     asks the target for the registration as it is now and reports
//     ErrUnknownKey, ErrOutOfBounds or ErrAccessDenied.
//   - tcp;ofi_rxm refuses it by dropping the connection (FI_ECANCELED or
//     FI_ENOTCONN at the initiator); the same question, after the connection
//     is re-made, names the sentinel.
//   - shm checks nothing at the target for a READ, nor for a WRITE by
//     cross-memory attach (above): the initiator's process_vm_readv or
//     writev reaches any address of the target's process, and the
//     provider never looks at the key. Requests that go through the
//     target's progress (atomics, delivery-complete WRITEs) are checked
//     there, and the provider never completes one it refuses (a write
//     without the right, a revoked key): that request fails with
//     ErrPeerUnreachable after Config.OpTimeout. So on shm the trust
//     boundary is the initiator: memory safety rests on its checks and on
//     the acknowledged revocation, among processes of one user on one host
//     (who could attach to each other with ptrace anyway).
//
// Errors that are not access errors (connection refused or reset, a peer
// that said bye, no completion within OpTimeout) are a *rdma.PeerError
// wrapping rdma.ErrPeerUnreachable; libfabric's codes travel in a
// *FabricError inside it. When the failure struck ops already posted to the
// provider, it also wraps rdma.ErrOutcomeUnknown: the target may have
// executed them and no completion will say (a peer closing its endpoint or
// a completion overdue past OpTimeout); a failure before posting (the peer
// was known to be down, the provider refused the post) wraps
// ErrPeerUnreachable alone and executed nothing. Ops after the first failing op report
// rdma.ErrFlushed; when the failure came from the target, the later ops of
// the same segment ran concurrently with it and may have executed. A Post
// whose context ends after its requests went to the provider reports the
// context's error with ErrOutcomeUnknown as well.
//
// An unknown outcome settles as on the tcp transport: the batch may still
// execute after Post returned (its requests stay with the provider: held
// in a TCP connection through a partition or a loss, or behind a paused
// target), but once a later Post to the same peer node has completed, it
// has executed or never will, so a caller that must know reads the state
// back with such a Post. The providers do not give that order themselves:
// tcp;ofi_rxm serves a READ as it arrives and an atomic through its
// message path, and a READ posted after an abandoned FAA returned the word
// without it (TestLaterPostAfterUnknown). So a Post to a peer waits while
// a Post abandoned on it has requests the provider has not completed
// (executed, or failed where the provider knows they did not), and fails
// without posting if its context ends, the peer is removed or the
// transport closes first; after six times OpTimeout it logs and posts (a
// provider that never completes a request: shm's refused ones). The
// engine simulation models exactly this order (rdma/mem's Abandon; the
// "-late" configurations of node/engine), and without it loses an
// acknowledged add (TestEngineSimNeedsInDoubtOrder).
//
// # Dead peers, cancellation, Close
//
// Close sends a bye frame to every peer (best effort, 200 ms): they fail
// the operations pending on this endpoint at once and refuse new ones until
// a frame from it arrives again or AddPeer is called; the bye is
// acknowledged, and the acknowledging peer has handled everything this
// endpoint sent before it. A peer that died without a bye is found by
// OpTimeout: a slot whose completions are overdue fails with
// ErrPeerUnreachable, and a provider that refuses posts to a dead peer
// (FI_EAGAIN) is given up on after the same time. On shm the peer's
// process id is in its address, and the poller looks every 50 ms whether
// it still runs (/proc/<pid>/stat; a zombie counts as gone): when it does
// not, what is pending on the peer fails at once and later posts fail with
// ErrPeerUnreachable before anything is posted. TestPeerProcessDies kills
// a peer process under load: sockets fails the posts within about 50 ms
// (connection errors), shm within about 50 ms (the process check),
// tcp;ofi_rxm after OpTimeout. In dsmd the directory's failure detector
// usually comes first (gossip declared a killed dsmd failed about a second
// after the kill in the real-process tests, TestKilledHomeFailsOver):
// RemovePeer then kicks every operation pending on it (an error that wraps
// rdma.ErrOutcomeUnknown), and later ones fail with rdma.ErrUnknownPeer
// before anything is posted. When a Post's context ends first, the slot is
// abandoned to the poller, which releases it when its last completion
// arrives; a late completion only ever writes the slot's C memory, never
// the caller's buffers. Close fails everything pending with rdma.ErrClosed,
// stops the goroutines and closes the endpoint before freeing the C memory;
// slots whose completions never came are left allocated, because shm lets
// a target write into the initiator's buffers after the initiator closed.
//
// # shm specifics
//
// libfabric 1.17's shm completes the requests that need a response (an
// atomic's result, a delivery-complete WRITE, a message over 4 KiB) in the
// order of the initiating endpoint's response queue, and stops at the first
// whose response has not come (smr_progress_resp). A peer that dies with
// such requests in flight never answers them, so the endpoint that posted
// them refuses every later request that needs a response, to any peer and
// to itself (FI_EAGAIN for ever; READs still work). Removing the peer's
// address from the address vector does not help (it unmaps the peer's
// region while the stuck entries still point into it). So on shm each peer
// gets an endpoint of its own for the requests this node initiates towards
// it ("dsm_ofi_<pid>_<node>_<seq>", in the same domain, with an address
// vector holding only that peer, and its completions on the transport's
// queue); the transport's own endpoint receives, is the target of the
// peers' requests and carries the posts to the node itself. When the peer
// is removed (RemovePeer, AddPeer with another address) or its process is
// found gone, its endpoint is closed, with whatever the dead peer never
// answered; requests to every other peer, and to the node itself, go on
// (TestDeadPeerDoesNotWedge). Once that endpoint is closed and what it
// completed was read, the slots whose requests it will never complete are
// free again (nothing can write their C memory any more). One more defect
// of libfabric 1.17's shm shapes when such an endpoint may close: a target
// that reads a connection request (an endpoint's first request) after the
// requesting endpoint closed and its file went away crashes in
// smr_progress_connreq (it reads the region it failed to map; seen as
// dsmd crashing at shutdown right after a restart, when every peer's
// fresh endpoint sent its bye and closed). So a peer's endpoint is closed
// only once the peer has answered something sent on it (a control reply,
// an atomic), or the peer's process is gone; otherwise it stays open until
// the process ends, and its file until a later Listen removes it. An
// endpoint of a peer
// in the same process stays open until the transport closes for good
// (below). Each peer endpoint is an shm region in /dev/shm like the main
// one (mostly untouched, sparse pages).
//
// shm endpoints are named "dsm_ofi_<pid>_<node>_<seq>" and live in
// /dev/shm while open, beside their doorbells ("<name>.bell"); Listen
// removes the files of processes that are gone (the provider leaves them
// behind when a process dies).
//
// libfabric 1.17's shm maps each endpoint's region once per process, and an
// endpoint's progress reads the region header of the peers it knows. When an
// shm endpoint of the same process closed (unmapping its region), the
// others faulted in fi_cq_read (on the pid check at the start of the gone
// region; about one conformance run in fifteen, most runs with caller
// reads), and a send to it faulted at once. So a closed shm endpoint is
// parked with its region mapped until no shm endpoint of the process is
// open, and only then closed for good; sends and posts to an shm endpoint
// of the same process hold its liveness lock, which Close takes
// exclusively. A service process has one endpoint, so this only matters to
// tests and tools that open several. An shm endpoint with requests that
// never completed is never closed, for the same reason.
package ofi
