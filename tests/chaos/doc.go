// Package chaos is the DSM service's chaos harness (`make chaos`): it runs
// real dsmd clusters under a seeded nemesis while client processes on every
// node use the public dsm API, records every operation with its call and
// return time, and checks the histories.
//
// # Nodes as hosts
//
// In netns mode (the default wherever it works) every dsmd runs in a network
// namespace of its own (dsmchaos-n1, ...) with an address of its own
// (10.77.0.i on eth0), joined by veth pairs to a bridge that lives in a
// namespace of the harness (dsmchaos-h) and nowhere else: the subnet
// reaches neither the machine's own interfaces nor loopback. Faults act per
// node with nftables rules inside the node's namespace, the way they would
// between machines. Where namespaces do not work, loopback mode runs every
// dsmd on 127.0.0.1 with ports of its own and a uid of its own, and its
// rules match the sender's uid and the destination ports. Every run says
// which mode ran. Clients run inside their node's namespace and reach
// their dsmd through its Unix socket (paths are shared across namespaces).
//
// Everything the harness creates has a fixed name (namespaces dsmchaos-*,
// nftables table dsmchaos, tmpfs mounts of source dsmchaos-disk, cgroup
// dsmchaos, pids in /run/dsmchaos/pids), one harness runs at a time (a lock
// in /run/dsmchaos), and each run removes what a killed run left before it
// starts and what it made when it ends.
//
// # The nemesis
//
// Schedule draws, from the seed, one fault at a time after a quiet start,
// each for a time drawn from -fault-for (3 to 8 s by default) with 2 to 5 s
// of quiet between them. The kinds (-faults) are kill (SIGKILL a dsmd,
// restart it with its data directory when the fault ends), pause
// (SIGSTOP/SIGCONT), partition (one node cut from the others), halves (a
// minority cut from a majority), bridge (two sides cut, one node reaching
// both), oneway (every packet from one node to another dropped), loss (20 to
// 50% of a node's packets dropped both ways), slow (a dsmd limited to 5% of a
// CPU by a cgroup), disk (the tmpfs under a node's data directory filled),
// leave (SIGTERM, a graceful leave, and a restart), join (a new node joins
// with a client of its own, and leaves gracefully) and client-kill (a
// node's client process SIGKILLed and started again). Network delay is
// not among them: it needs the netem qdisc, which these kernels lack.
//
// # Clients
//
// ClientMain is the client process (`chaos client`, started by the
// harness). Its workers: registers (three words, loaded, stored and
// compared-and-swapped through Bytes() with sync/atomic), checksummed pages
// (each node writes its own with WriteAt, every node reads all of them with
// ReadAt), counters (AddUint64), a Mutex-protected read-modify-write of a
// pair of words through Bytes(), and Sync every second. Every operation
// writes its call before it starts and its return after, so one that never
// returns (a thread blocked in a page fault forever) is seen as such. The
// items sit in shards of their own so that their homes spread over the
// nodes. At the end the workload stops, every fault is healed, and a final
// check reads every item on every node.
//
// # Checkers
//
//   - linearizability: porcupine on each register word, with a crash
//     pseudo-operation wherever a dsmd died without writing back (after it,
//     a register's unsynced value may be lost); on failure, porcupine's
//     visualization, and the shortest prefix that is not linearizable;
//   - register values: every value loaded was stored by someone;
//   - pages: every page read is a page some write wrote (checksum, page
//     number), never older than what was acknowledged before the read
//     while no dsmd died in between;
//   - durability: never older than what a Sync that returned covered
//     (pages, counters, the pair), whatever died;
//   - counters: the final value counts every acknowledged add (every
//     synced one, once a dsmd died) and invents none; no two adds return
//     the same value;
//   - mutex: the pair is equal inside every critical section, no two
//     critical sections read the same value;
//   - crash: a dsmd that exits on its own, or a panic, fatal error or data
//     race in a node's log;
//   - availability (reported, not a violation): per fault kind, the
//     operations that failed, that never returned, that took longer than
//     -op-deadline, and the longest wait.
//
// Operations of a node whose dsmd was killed, from its death until its
// client noticed, promise nothing (until the library fences the mapping,
// as soon as it sees the session end, plain accesses to pages already
// mapped still see the machine's cached pages) and are treated as
// uncertain.
//
// # Output
//
// A run directory per schedule: config and timing (run.json), the schedule
// as executed (schedule.json), the harness's events (events.jsonl), every
// node's log (nodes/nI/dsmd.log), every client's history and log
// (clients/), the merged history (history.jsonl), the verdicts
// (verdict.txt, verdict.json), the picture (timeline.svg) and porcupine's
// visualization of a register that is not linearizable. The last line of
// output is
//
//	chaos: S schedules, F faults, O operations, V violations; ...
//
// and the exit status is 0 only when V is 0. `chaos -check DIR` runs the
// checkers again on a run directory, and `chaos -report DIR...` (`make
// chaos-report RUNS=...`) sums the verdicts of many: schedules, faults,
// operations, violations and the schedules that had them, and per fault
// kind the operations, errors and the longest wait with its seed
// (`-markdown` for docs/reliability.md).
//
// `-ofi PROVIDER` (`make chaos OFI='tcp;ofi_rxm'`) runs every dsmd on
// --transport ofi, built with the ofi tag. There a target refuses a
// departed incarnation's verbs by closing the keys it granted it
// (ofi.Transport.Fence, since session 23: the first schedules on ofi,
// before it, found violations after partitions healed:
// docs/reliability.md). On shm the verbs go through shared memory, so
// partitions and losses cut only the directory's traffic.
package chaos
