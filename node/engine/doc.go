// Package engine is the coherence engine of dsmd: it drives one node's
// protocol state machine (coherence.Node) over the rdma verbs transport
// and serves the local page cache (node/localcache) and the word atomics.
//
// # What it does
//
// An Engine serves one region of NumPages pages for one node. New
// validates the configuration, reserves (rdma.Alloc: address space only)
// and registers a slot for every page of the region (coherence word at
// slot offset 0, home copy at 8), at SlotOffset(p), the same at every
// home, and builds the state machine. Only the slots of the pages this
// node is home of are ever touched, and a slot costs memory only once
// touched: a 1 TiB region costs nothing until used. The protocol runs in
// an epoch whose tag is 0, so an untouched (zero) word is the initial
// word. Descriptor is this node's registration; Start runs the engine
// with the peers' descriptors known so far and SetPeer adds the rest
// (dsmd learns them from the directory); Close stops it.
//
// One goroutine, the loop, owns the state machine; nothing else touches
// it and there is no lock around it. Others talk to it through channels:
//
//   - local requests (misses, evictions, atomics) are submitted and the
//     caller waits for the completion, its ctx or Close;
//   - every batch of verbs is turned into rdma ops on the home's slots and
//     posted on a goroutine of its own; the outcome (results or error) is
//     stepped back in as VerbsDone;
//   - messages are marshalled (coherence.Message.Marshal) and sent; the
//     transport's handler decodes what arrives (a message that does not
//     decode, or claims another sender, is logged and dropped) and hands
//     it to the loop;
//   - a ticker (Config.Tick) steps the protocol clock while the state
//     machine has work in progress (coherence.Node.Quiet is false, or a
//     call or a cache effect is pending); an idle engine does not tick.
//
// # The page cache
//
// localcache.Coherence is implemented by ReadMiss (a load of the page's
// first word: it ends when the node holds a valid copy, which is copied
// into the buffer), WriteMiss (an add of 0 to the first word: it takes the
// tenure without changing data) and Evict. The data of a page reaches the
// cache only through those buffers. The protocol takes pages back through
// Pages: Drop (-> Invalid) and Downgrade (-> Shared), which return the
// cache's data when it held the page Modified. That data is the page's
// truth: the engine keeps it and posts it in place of the state machine's
// copy in the page's write-backs (coherence.Verb.Data), so a recall or an
// eviction writes back what the cache's clients stored. The state
// machine's copy is never written by the engine.
//
// Invariants:
//
//   - Lock order (localcache): before a drop or downgrade of a page, the
//     engine fails every local miss of that page in flight (ErrConflict);
//     while the cache is applying it, new misses and evictions of the
//     page fail at once with ErrConflict. The caller releases its page
//     lock and retries. Pages is called on a goroutine, never by the loop,
//     and the calls for one page run one at a time, in order.
//   - Until the cache has applied a drop or downgrade, every batch and
//     message about that page is held: an invalidation is acknowledged
//     only after the cache dropped the page, and a write-back carries the
//     cache's data.
//   - While an Evict of a page is in progress, the cache has already
//     given the page up, and drops and downgrades of it are not passed to
//     Pages.
//
// MemPages is an in-memory Pages with the same page-lock discipline as
// localcache.Cache: the tests' cache.
//
// # Atomics
//
// Load, Store, Add and CompareAndSwap of an aligned 8-byte word are the
// state machine's atomics: they run at the page's exclusive holder, on the
// state machine's copy. A call that returns its ctx's error may still take
// effect later (the request stays queued in the protocol).
//
// # Nodes that are down
//
// SetDown names nodes the directory says are gone (failed, left, restarted
// as another incarnation): calls on the pages they are home of fail at
// once with an *UnavailableError, their batches are held back, and a call
// waiting for them as holder, reserver or sharer, or for a home whose
// batches have failed for Config.UnavailableAfter, fails after that bound.
// SetDownAwaited names such a node whose pages come back (a durable
// region's shards, which a page store loads again): calls on the pages it
// is home of wait, and fail after the bound, not at once, and not as lost.
// A batch whose outcome the transport cannot know (rdma.ErrOutcomeUnknown)
// is reported VerbsDone.Unknown; the state machine resolves it by reading
// the word. An eviction the state machine took over and the caller then
// gave up on returns localcache.ErrEvictPending: the engine keeps the data.
//
// # Not done yet
//
//   - One region per engine and one fixed home assignment: Reconfigure
//     changes the members and the epoch, never HomeOf (homes do not
//     move yet).
//   - Mixing the engine's atomics and mapped access on one page is not
//     coherent locally: while the cache holds a page Modified its data is
//     the truth, and an atomic on that page works on the state machine's
//     copy, which the cache's data replaces at the next write-back. dsmd
//     therefore does not use the engine's atomics: its atomics run on the
//     cache's page (localcache.Access).
//   - Batches are posted with the engine's context, without a per-batch
//     deadline.
//   - No metrics; a ReadMiss or WriteMiss copies the page once more than
//     needed.
package engine
