// Package coherence is the page coherence protocol of the service: an MSI
// (Modified / Shared / Invalid) invalidation protocol in which every page
// has a home node keeping a 64-bit coherence word beside the home copy of
// the page, and nodes change that word with one-sided CAS and FAA and move
// page data with one-sided READ and WRITE.
//
// # A pure state machine
//
// Node is one node's protocol state, written in the style of a Raft core:
// it does no I/O, starts no goroutine and reads no clock. The caller feeds
// it events through Step and executes what Ready returns:
//
//	n, _ := coherence.NewNode(cfg)
//	n.Step(coherence.Request{ID: 1, Op: coherence.OpLoad, Page: 7})
//	rd := n.Ready()
//	// rd.Batches: verbs to post, one batch per element, to b.Home
//	// rd.Messages: messages to send (Marshal, then rdma Send)
//	// rd.Pages: mappings to install, write-protect (downgrade) or drop
//	// rd.Completions: local requests that finished
//	... later, for each batch: n.Step(coherence.VerbsDone{ID: b.ID, Results: ...})
//	... for each message received: n.Step(coherence.Receive{Msg: m})
//	... every tick: n.Step(coherence.Tick{})
//	... on a directory change: n.Step(coherence.Reconfigure{Epoch: e, Members: ms, HomeOf: placement, Targets: gainers})
//	... at a home, for a backup gained: n.Step(coherence.Fill{Pages: populated, To: b}); rd.Filled reports each page
//
// A Verb maps one to one onto an rdma.Op: VerbRead/Write/CAS/FAA are
// OpRead/Write/CAS/FAA; the home's slot table turns (Home, Page, Span) into
// (RKey, Offset); a READ gets a buffer of Span.Len bytes; Compare and
// Operand are copied. A batch must be posted as one rdma Post (its verbs
// execute in order); a batch that fails did not execute and is retried.
// A batch whose outcome is unknown (VerbsDone.Unknown: the transport lost
// its answer; it may have executed, in part or in full, and never executes
// later) is resolved instead: the node reads the word and judges from it
// whether the batch took effect (resolve.go; docs/protocol.md, "Batches of
// unknown outcome").
//
// # The home slot
//
// For every page it serves, the home registers a slot of 8+PageSize bytes:
// the coherence word at offset 0 and the home copy of the page at offset
// 8. A READ is not atomic and does not read its bytes in address order
// (a memmove reads a copy's tail first; a NIC reads in any order), so a
// copy is read as the word, the page and the word again, in one batch:
// both words without a holder and at one version date the copy as that
// version's data, whole (slotVerbs).
//
// # The coherence word
//
//	bits  0- 9  holder    exclusive (M) holder, 0 = none          (10 bits)
//	bits 10-19  reserved  node the home reserved the page for, 0 =
//	                      none, 1023 = HomeTurn (back to the home)  (10 bits)
//	bits 20-35  version   tenure counter, +1 on every acquisition  (16 bits)
//	bits 36-39  tag       the configuration epoch modulo 16        (4 bits)
//	bits 40-53  exact     one sharer bit per node 1..14            (14 bits)
//	bits 54-63  coarse    count of sharers with ids 15..1022       (10 bits)
//
// Node ids are 1..MaxNodeID (1022): a cluster of up to 1022 nodes of any
// id assignment within that range; Config validation refuses larger ids.
// Nodes 1..ExactSharers (14) are tracked exactly. Every other node adds 1
// to the coarse count; an acquirer that finds the count non-zero sends the
// invalidation to every member above 14 (a broadcast: the price of a
// 64-bit word). The count cannot overflow: it never exceeds the number of
// node ids above 14 (1008 < 1024), because of the unit rule below.
//
// The unit rule: a node's sharer "unit" (its exact bit, or one in the
// coarse count) is added only by the node itself (FAA on a read miss, or
// the CAS that downgrades it from M to S), and removed by the node itself
// (the CAS of an eviction) or by the next acquisition, whose CAS clears
// every unit and increments the version (after a home failure the new home
// sets them from the nodes' own reports). So a node's unit added at version
// v is still in the word exactly while the word's version is v, and a node
// never adds its unit twice (which would carry into a neighbour's bit).
// Invalidations carry the acquisition's version: a node whose unit or copy
// is older drops it; an older invalidation (a duplicate, a reordered
// message) changes nothing and is acknowledged anyway.
//
// The version is the identity of the home copy: every write-back belongs
// to one tenure, so a READ that returns the same version as the reader's
// FAA, with no holder, returns the data written back by the last tenure.
// Versions are compared in serial-number arithmetic over 16 bits: the
// protocol assumes no message is delayed across 2^15 tenures of its page.
//
// # Transitions
//
// Read miss: one batch [FAA +unit, READ page, READ word] to the home.
// Valid when the FAA's old word and the word after the page have no holder
// and the FAA's version: install S. A holder found: send it a recall
// (read), back off, retry with [READ word, READ page, READ word] (the unit
// stays counted). The uncontended read miss costs one round trip
// and no message to any CPU.
//
// Write miss or upgrade: one batch [CAS word -> {holder=self, version+1,
// no sharers}, READ page] (the READ is omitted when the node's S copy is of
// the current version). A failed CAS returns the word, which is the next
// attempt's expected value. On success the invalidations go to every
// recorded sharer in the same Ready; M is granted, and the queued stores
// and atomics complete, when every sharer has acknowledged.
//
// Recall: the holder serves the requests it has queued, then write-protects
// the page and posts [WRITE page, CAS word -> holder cleared] (read recall:
// its own unit added in the same CAS, M -> S; write recall or eviction: M
// -> I). The requester, retrying, then finds the word free.
//
// Eviction of S: drop the copy, then remove the unit with a CAS that
// expects the unit's version (if the version moved, the unit is already
// gone). Eviction of M: as a write recall.
//
// # Epochs and departures
//
// Every message carries the sender's epoch and a receiver in another epoch
// refuses it (ErrStaleEpoch); the sender retransmits in the new epoch.
// Reconfigure installs a new epoch: the member list is the authority on
// who may be named in a word. Every node stops waiting for acknowledgements
// from non-members and, when someone departed, drops its S copies (a
// departed acquirer may have cleared sharer units and died before its
// invalidations arrived), the copy of a downgrade in flight included: its
// release may have executed before that acquisition. Nodes learn a new
// epoch at different times, so after a departure a node repairs a word
// only once it has asked every member whether it is in the new epoch
// (MsgEpoch, repeated; a lagging member refuses until it learns) and all
// have answered (MsgEpochAck). Every node is bound by this, not only a
// node with duties then: a duty it starts later waits too (it sends its
// probes when it has a duty). A member answers only once no batch it
// posted to the prober in an older epoch is unfinished, so no verb of the
// old epoch lands after the repair. The repair is a CAS: a departed holder's
// tenure ends and its unsynced data reverts to the home copy, a departed
// reservation lapses, exact bits of non-members are cleared, and the tag
// is stamped. Coarse units of departed nodes stay counted (an extra
// invalidation) until the next acquisition clears them.
//
// Members that join: a member list loses departed ids and gains new ones,
// and a departed id never comes back. A node new to the protocol is
// created in the epoch that added it with Config.Joining: it probes that
// epoch at once and posts no verb and sends no request until every member
// has acknowledged it, since a member still in an older epoch would take
// its id, found in a word, for a departed node's (the trust rule below).
// Members that were there before change nothing when members are added.
//
// The trust rule: the word's tag (the epoch modulo 16) does not decide
// whether a word may be used. A copy read between two words without a
// holder at one version validates the data whatever its tag; a word with no holder and no
// reservation but the node's own is acquirable whatever its tag; a holder
// that is a member is recalled whatever the tag. Every CAS a node makes
// (acquire, release, evict, pass the turn, the home's repairs and passes)
// writes its own epoch's tag. A word that names a holder or a reserver
// that is not a member is never used: the node sends MsgStamp to the
// page's home and backs off; the home starts a duty for the page if it has
// none (as for MsgEnqueue) and repairs the word once synced. So a home
// needs no list of its pages (Config.HomedPages) and no sweep after a
// departure: untouched words (zero, from any epoch) are used as they are
// and stamped by their first CAS, and words naming departed nodes are
// repaired when a node finds them. The argument: only a repair removes a
// departed holder or reserver from a word, and a repair happens only when
// every member has the epoch and has dropped what the departure made
// untrustworthy; every other change of a word is a CAS or FAA by a member
// that the unit rule and the version already account for, whatever the
// tag. An epoch without a departure needs no probe and no repair.
//
// # Home failure
//
// When a home departs, Reconfigure.HomeOf gives the new placement and
// Targets the members that gain pages; no list of pages is built. The new
// home's slot holds the backup copy of each page (the data last written
// back; keeping that backup is the durability layer's job) under a word
// that names no holder (the node layer says so with SlotsReady when the
// reconfiguration said SlotsPending). Every node freezes each page it has
// state for whose home changed: an unfinished acquisition is abandoned; an
// unfinished release claims the tenure (its CAS may or may not have
// executed at the dead home) and keeps its data without mapping it
// writable; no verb is posted. It reports its state and copy version to
// the new home (MsgReport) and then tells every target how many pages it
// reported to it in this epoch (MsgMoveReport, repeated with backoff; a
// target that holds fewer asks for them again with MsgQuery). A page a
// node has no state for, and whose home changed, waits too. With every
// member's count matched, the new home writes the rebuilt word of each
// reported page with a CAS, tells each reporter (MsgRebuilt, saying
// whether it is the holder or its unit is counted) and every member that
// its moves are done (MsgMoveDone), which unfreezes the pages nobody
// reported: their words are the slot's as prepared. Reports and counts
// start over in every epoch. The M claimant of the newest tenure becomes
// the holder, unless another node holds a
// copy of that tenure or a newer one, or knows since the last rebuild that
// it ended (an Invalid report says the newest tenure it knows ended,
// MsgReport.Ended: from copies held, tenures taken, words read): a reader
// only installs a copy of a tenure once that tenure has been released, and
// a newer tenure begins only after it, so the claimant's release had taken
// effect (its write-back, or a later one, is in the backup) and it drops
// its copy. A release whose outcome was unknown and still unresolved may
// be followed by any number of tenures: an Invalid report is often the
// only trace of them. Else the S reporters of the newest version become
// the sharers. A node drops an S copy the word does not record, and
// resumes. Unsynced data of an M holder survives the home's failure; the
// home copy reverts to the backup.
//
// # Backups and fills
//
// Config.Backups and Reconfigure.Backups name the backups of every page:
// a release writes the page and Stamp(v) to each before its CAS at the
// home. A backup that enters a page's set later is filled by the home:
// the node layer steps Fill{Pages, To} there (it lists the populated
// slots; the core cannot list pages). For each page the home waits until
// every member of its epoch has acknowledged that epoch or a later one
// (so every later release writes To, and no older one is in flight), takes
// the page's turn (HomeTurn), recalls a holder, READs its own slot and
// writes the page and its stamp to To in one batch, then passes the turn
// on. Ready.Filled reports every page, filled or abandoned
// (ErrFillAbandoned: To departed or is no backup of the page, or this node
// is not its home). A backup is complete, and may become home, only once
// every populated page of its shards was filled (docs/failover.md §6).
//
// # Contention
//
// A blocked request retries with exponential backoff (up to
// MaxBackoffTicks) and recalls the holder on every attempt. After
// StarveAttempts failures it asks the page's home to queue it
// (MsgEnqueue, repeated on every later attempt; the home ignores
// duplicates). The home keeps a FIFO queue per page and hands the
// reservation out in order: it writes the head's id into the word's
// reserved field with a CAS and tells it (MsgGrant). While the page is
// reserved for R, no other node acquires it. R's own acquisition CAS sets
// the field to HomeTurn (a reading R sets it with a CAS once its copy is
// installed; an R that no longer needs the page hands it back at once);
// the home, which polls the word while a reservation is out, then passes
// it to the next in line or clears it. So once a node is queued, at most
// one tenure per node ahead of it in the queue (and the tenure in
// progress) comes before its own: the simulator measures the most tenures
// any request waited through (Stats.MaxOvertakes) and fails above a bound.
// The home's CPU takes part only under contention.
// Readers ignore reservations: a reader adds its unit once and then holds
// still, so readers alone cannot starve a writer.
//
// # Atomics
//
// Load, store, add and compare-and-swap of an aligned 8-byte word run at
// the page's exclusive holder, on its copy: an atomic is a store as far as
// coherence is concerned (it takes the tenure) and executes locally once M
// is granted. Because a page has at most one M copy and no valid S copy
// while it has one, and loads run only on valid copies, every word
// operation is linearizable at the step that completes it. A mutex is a
// word: lock is CAS(0 -> owner) retried, unlock is a store of 0.
//
// # Invariants (checked by the simulator in coherence/sim)
//
//   - single writer: never an M copy while another valid copy exists;
//   - every valid copy equals the latest completed store;
//   - when quiet: the word's holder is the M node (or, with lazy homes, a
//     departed node that nobody has found yet), the word's sharer units
//     are exactly the nodes whose unit is counted, and with no holder the
//     home copy is the latest data.
package coherence
