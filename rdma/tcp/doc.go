// Package tcp is the pure-Go backend of the verbs transport (rdma): one-sided
// READ, WRITE, CAS and FAA on a peer's registered memory, and small
// two-sided messages, carried over TCP. It is the default fabric of the
// service and the one every machine can run.
//
// # Driving it
//
//	tr, err := tcp.Listen(1, "127.0.0.1:0", tcp.Config{Logger: log})
//	tr.AddPeer(2, addrOfNode2)              // no connection yet
//	reg, err := tr.Register(mem, rdma.AccessAll)
//	err = tr.Post(ctx, 2, ops)              // connects on first use
//	tr.Close()                              // fails what is pending, stops every goroutine
//
// Registrations live in the shared table of the software backends
// (rdma/internal/target); the responder touches memory only through it, so
// every remote op is checked by rdma.CheckOp (key, bounds, alignment,
// rights) and a Deregister waits for the ops in flight on its memory. A Post
// to the local node runs on the table directly.
//
// # Connections
//
// Each node sends its own requests and messages on its own outbound
// connection to the peer, made on first use to the address given to
// AddPeer and made again on the next use after it failed. The peer's
// requests arrive on the connection it dialled, which this node only
// serves. Two nodes that talk both ways therefore hold two connections,
// and there is never a question of which of two crossing dials wins.
// An outbound connection has no reader while nothing is pending on it, so
// before an operation reuses one that sat idle for a millisecond, one
// non-blocking peek checks that the peer has not closed it: a peer that
// restarted is reached by the next operation instead of failing it.
// Messages to a peer share the outbound connection with the operations
// posted to it, so they arrive in the order sent and after the operations
// posted before them.
//
// A connection opens with a hello each way (magic, version, the dialer's and
// the intended listener's node ids, the sender's incarnation nonce, and from
// the listener the id of the session it keeps for the dialer; see below).
// The listener refuses a wrong version or a hello meant for another node
// with a status the dialer reports as ErrHandshake; it does not answer bytes
// without the magic. The dialer checks that the listener is the node it
// meant to reach. Version 2 (sessions) does not talk to version 1: the two
// refuse each other's hellos with a clear error.
//
// # Frames
//
// After the hellos a connection carries frames: a 16-byte header (body
// length, type, status, op count, request id) and a body. The exact layout
// is in wire.go. Requests carry the requester's floor (below) and up to
// rdma.MaxBatch ops with the WRITE data inline; the response to request id
// carries the results of the ops that executed, in order, and the error
// code and text of the op that stopped the batch. Error codes map back to the rdma sentinels on the initiator
// (errors.Is works; the text is the target's). A frame that breaks the
// format (unknown type, body longer than 64 MiB, a count above
// rdma.MaxBatch, a truncated op, non-zero padding, trailing bytes, a
// message above rdma.MaxMessage) closes the connection; an op the target
// cannot execute gets an error reply and leaves the connection open.
// Batches that move more than 64 MiB in either direction are refused with
// rdma.ErrTooLarge before they are sent.
//
// # In flight
//
// Each request has an id, so many batches are in flight on one connection
// (up to 1024 unfinished per peer; Post waits for room beyond that); the
// responder executes them in arrival order and answers in the same order. Each connection has a writer goroutine, which coalesces
// every queued frame into one buffered write (it yields once before
// draining its queue, so that the goroutines about to queue a frame get it
// into the same write), and a reader goroutine. The responder holds its
// answers back while the next request is already complete in its read
// buffer, and sends them together. Frame
// buffers come from size-classed sync.Pools; in the steady state a Post
// allocates nothing with a context that cannot end, and two objects (the
// context.AfterFunc that interrupts its read) with one that can.
//
// Two shortcuts keep a lone round trip as cheap as a bare TCP exchange. A
// frame sent when the connection is idle is written by its sender with one
// non-blocking write (the writer goroutine takes over whatever the kernel
// does not accept at once), and the responder writes its answer the same
// way unless more requests are already buffered. A Post issued on a quiet
// connection (nothing else pending, nobody reading) also takes the read
// side and reads its own response, handing the stream to the reader
// goroutine as soon as a frame for another call comes first; under load the
// reader goroutine reads everything. Either way READ data goes from the
// stream into the caller's buffer with one copy, and large READs (64 KiB
// and up) are read into the caller's buffer directly.
//
// # Cancellation and failure
//
// The caller and the reader race for a pending call: the reader claims it
// before it writes into the caller's ops and buffers, the caller abandons it
// when its context ends first. The late response to an abandoned call is
// skipped. A caller that loses the race while its response is arriving asks
// the reader to stop (a read deadline in the past interrupts a blocked
// read) and waits for it to let go, so that after Post returns the
// transport never touches its ops or buffers; the rest of that response is
// skipped. A connection that breaks hands every call on it back to its
// Post, which sends it again as the next section says; a response that
// breaks the format fails the calls of its connection for good.
//
// # Exactly once across broken connections
//
// A batch executes at the target at most once, and a Post that returns an
// error tells whether it may have executed (rdma.Transport.Post states the
// contract). The coherence protocol depends on it: it retries a batch that
// failed, and a CAS or FAA that executed twice would corrupt a coherence
// word.
//
// Sessions. Each Transport draws a random 64-bit incarnation nonce when it
// starts. As a requester, it numbers its batches to each peer node 1, 2,
// 3, ... (the request id on the wire), across connections and addresses,
// and never reuses a number towards that node. As a responder, it keeps a
// session per requester incarnation (node, nonce), with an id unique within
// its own incarnation that its hello tells the dialer. A session records
// the response of every batch that executed an op changing memory (WRITE,
// CAS, FAA) until the requester's floor passes it: each request carries
// the requester's floor, the lowest number it has not finished yet, and
// numbers below it are finished and never sent again. A request below the
// floor is ignored (no execution, no answer); a request at or above it is
// answered from the record if there is one, and executed otherwise. A
// batch of READs only changes nothing and is not recorded: a copy sent
// again reads again. Every request of a session executes under the
// session's lock, whichever connection carried it, and a new connection
// of a session closes the session's older ones before it serves, so
// nothing buffered on an old connection executes after a request of the
// new one.
//
// Stalls. A connection whose packets are lost for a while does not break
// by itself: TCP backs its retransmissions off, up to minutes apart, and
// keeps the connection open. Every connection therefore has
// TCP_USER_TIMEOUT set (Config.UserTimeout, 5 s): data left unacknowledged
// that long breaks it, and what was in flight on it is sent again as below.
//
// Re-sending. When the connection that carried a batch breaks before its
// response is complete, Post connects again, within Config.RetryWindow
// (10 s by default) and its context, and looks at the new hello: when it
// comes from the same incarnation of the peer with the same session id,
// the batch is sent again under the same number, and answered from the
// record or executed now; the caller sees a normal completion. Dial
// failures that may pass (a timeout, a reset, a handshake cut short) are
// retried with backoff from 5 ms to 200 ms; those that will not (nobody
// listens at the address, which means the incarnation is gone; a refused
// handshake; the peer removed; the transport closed) end the wait at once.
//
// What the errors mean. A Post error that wraps rdma.ErrOutcomeUnknown
// (always with rdma.ErrPeerUnreachable, or with rdma.ErrClosed when this
// transport closed, or with the context's error) says that the request
// may have reached the peer: the batch may have executed there (a prefix
// of it, as far as the target got) or not. Every other error says that
// nothing executed beyond the ops whose Err is nil: a failure to connect
// before the request was queued, rdma.ErrUnknownPeer, a batch refused
// before sending, or an op the target refused. The outcome is unknown in
// exactly these cases:
//
//   - the peer could not be reached again within the retry window or the
//     context, or nobody listens at its address any more;
//   - a different incarnation of the peer answered (it restarted);
//   - the same incarnation answered with another session id (it dropped
//     this node's session: RemovePeer, or the bounds below);
//   - the context ended after the request was queued (the error matches
//     both the context's error and rdma.ErrOutcomeUnknown);
//   - the peer sent a response that breaks the format (with ErrProtocol);
//   - this transport closed, or Config.RetryWindow is negative.
//
// A batch whose outcome is unknown may still execute after Post returned
// (its request may still be in the network), but not for long: once a
// later Post from this node to the same incarnation of the peer has
// completed, the unknown batch has either executed or never will. A caller
// that must know reads the state back with such a Post.
//
// A restarted peer. Its registrations are new, and their keys differ from
// the old ones (every incarnation numbers its keys from a random start, so
// the chance that an old key names new memory is about one in 2^63 per
// registration), and a batch meant for the old incarnation must never
// execute at the new one. The
// requester sees the new nonce in the hello and does not send the batch
// again: it fails with rdma.ErrOutcomeUnknown, not with a "never executed"
// answer, because the old incarnation may well have executed it before it
// went away. The new incarnation never sees any batch of the old session,
// and nothing of its predecessor's records (it has none) is trusted.
//
// Departed incarnations. Fence(node, nonce) drops that requester
// incarnation's session and refuses its handshakes from then on (hello
// status "fenced"): dsmd fences every incarnation the directory says
// departed, so a process removed while it was cut off executes no verb
// here when it comes back.
//
// Bounds. A requester has at most 1024 unfinished batches per peer node
// (maxInFlight), so a session holds at most that many records; a session
// whose connections all closed is dropped after Config.SessionLinger (1
// minute by default; keep it above the requesters' retry window), a node
// keeps sessions for its two latest incarnations (the current one and the
// one before), and a responder keeps at most 1024 sessions in all,
// dropping the least recently greeted first. A dropped session's id is
// never handed out again, so a requester that comes back to it learns
// that the outcomes it had in flight are lost.
//
// Mutual TLS (Config.TLS). Each connection first runs a TLS 1.3 handshake
// in which both sides present certificates of the cluster CA; then the
// hellos as above, inside TLS. The dialer checks that the listener's
// certificate names the node it dialed; the listener checks that the node
// the dialer's hello claims is the one its certificate names, and refuses
// the hello otherwise (status 6), before any request is read. With
// TLS.Plaintext (trusted fabrics) the frames after the hellos travel in
// plaintext on the same socket: the connection was authenticated, but
// nothing after the hellos is encrypted or integrity-protected. The ALPN
// protocol keeps an encrypting node and an authenticating-only node from
// connecting. Over TLS, requests are written by the writer goroutine (no
// inline write from the caller) and an idle connection is not probed
// before reuse; docs/benchmarks.md has the cost.
package tcp
