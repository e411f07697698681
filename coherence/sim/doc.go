// Package sim is the deterministic simulator of the coherence protocol: N
// coherence.Node state machines (2 to 64 in the test configurations) over
// an rdma/mem network in manual mode, driven by a seeded random scheduler,
// checked against a reference model after every step.
//
// # What a run does
//
// New builds the cluster: nodes 1..N, page p homed on node p%H+1 (H =
// (Pages+1)/2 homes, most serving two pages) with its
// slot (coherence word and home copy) in the home's registered memory. Run
// then takes random steps, each one of: issue a local request at an idle
// node (load, store, add, CAS, evict; or the next step of a mutex client),
// execute a pending batch at its home, report an executed batch to its
// node (completions are delayed and reordered independently of execution,
// as on a real fabric), deliver a pending message, advance every node's
// clock. During the workload phase it also drops batches and messages,
// duplicates messages, reports batches as of unknown outcome (with
// UnknownOutcomes: all of the batch executed, a prefix, or none, and the
// node learns nothing of it), and crashes nodes (homes too, with HomeCrashes),
// each crash followed some steps later by the reconfiguration that removes
// the node (and moves its pages), and with EmptyEpochs reconfigurations
// that change nothing. With LazyHomes the state machines list no home
// pages and the home slots start zero (never touched), as dsmd's do: the
// trust rule and MsgStamp are all that makes them usable after a
// departure. With Joins, nodes join mid-run: each is created as a new
// member (coherence.Config.Joining) in an epoch of its own, with ids after
// 1..N, while the others learn that epoch at their own pace (with
// AsyncReconfig: possibly skipping it); with Restarts, some crashes are
// restarts, whose reconfiguration also adds a new id that takes the crashed
// node's place as a client. Joiners are clients like the others, never
// homes (but with Fills, where a filled one may be promoted). With SkipMoves, crashes (of homes too), their reconfigurations
// and joins come while nodes still lag: a lagging node learns only the
// latest epoch, moves it skipped included (its Targets are the new homes
// of the pages whose home differs from the placement of the last epoch it
// learnt). With Taints, epochs with the same members drop one live node
// from the backups of every page; a tainted node is never promoted.
// With Fills, a backup that crashes or is promoted is replaced by a live
// member, which the page's home fills (coherence.Fill, stepped by the
// driver once the home has learnt the epoch); only a complete backup is
// promoted, and a crash comes only while every page keeps a complete live
// copy without the victim (with MidFillCrashes, while fills are under
// way too; EarlyPromote breaks the rule on purpose, for the checks to
// catch). With Drains, a live node is marked draining, writes back what
// it holds Modified, its pages move to complete backups, and it departs
// holding and homing nothing: a leave that reverts nothing (LeaveHolding
// breaks it on purpose). With SplitReads, a READ of more than one word (8 bytes: a page,
// a slot) reads its last bytes when its batch is delivered
// and the rest at a later step (mem.SplitReads), with other deliveries in
// between, as a NIC or Go's copy may: a copy installed from such a READ
// must still equal the reference (the data check below). Then
// the faults and the new requests
// stop and the run settles: every request must complete within
// SettleSteps.
//
// # What it checks
//
// After every step: at most one M copy of a page and no other valid copy
// beside it; every valid copy equals the reference model (the latest
// completed store); the word agrees with what the nodes believe of it (a
// node in M is its holder; a node that believes its sharer unit counted is
// counted; no unit is counted that no node can account for: checkBeliefs). At every completion: loads, adds and CASes return what
// the reference model says; no request waited through more than 2N+4
// tenures of other nodes (fairness). When the run has settled: the home
// word names the M holder, its sharer units match the nodes' own view of
// their units, the home copy holds the latest data when nobody holds M;
// the recorded history of word operations is linearizable (porcupine;
// configurations without crashes, since a crash loses unsynced stores by
// design); the mutex counter equals the number of critical sections.
//
// A crash reverts the reference model of the pages the node held in M to
// their home copy: unsynced data is lost, as documented.
//
// With backups, after every step: every backup counted complete holds the
// home copy while the home's word names no holder, unless its stamp is
// newer (a release under way; I10); at every promotion, the promoted slot
// holds the old home's data, or a dead writer's last write (I9).
//
// # Reproducing a failure
//
// A failing seed is run again with tracing on; the returned *Violation
// prints the seed, the configuration, the broken invariant and every step.
// The methods of the driver (Request, Deliveries, Complete,
// CompleteUnknown, Tick, Crash,
// Reconfigure, Join, Learn, Stabilize, Dump, Check) take one chosen step at a time; the
// interaction tests of package coherence drive them from transcripts.
package sim
