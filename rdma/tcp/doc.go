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
// the intended listener's node ids). The listener refuses a wrong version or
// a hello meant for another node with a status the dialer reports as
// ErrHandshake; it does not answer bytes without the magic. The dialer
// checks that the listener is the node it meant to reach.
//
// # Frames
//
// After the hellos a connection carries frames: a 16-byte header (body
// length, type, status, op count, request id) and a body. The exact layout
// is in wire.go. Requests carry up to rdma.MaxBatch ops with the WRITE data
// inline; the response to request id carries the results of the ops that
// executed, in order, and the error code and text of the op that stopped
// the batch. Error codes map back to the rdma sentinels on the initiator
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
// Each request has an id, so any number of batches are in flight on one
// connection; the responder executes them in arrival order and answers in
// the same order. Each connection has a writer goroutine, which coalesces
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
// skipped. A connection that breaks fails every call on it with a
// *rdma.PeerError wrapping rdma.ErrPeerUnreachable (and the cause);
// Close fails them with rdma.ErrClosed.
package tcp
