package coherence_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/coherence/sim"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma/mem"
)

// TestInteraction runs the transcripts under testdata/interaction/: a small language
// that drives a simulated cluster step by step and prints what every step
// did. Rewrite the expectations with -rewrite.
//
//	add-nodes N [pages=P] [lazy] [epoch=E] [backups=K] [fills]
//	                                a cluster of N nodes, page p homed on n(p%H+1), H=(P+1)/2,
//	                                in epoch E (default 1); lazy: homes list no pages and their
//	                                slots start zero, never touched; backups: every page has
//	                                K backups, the first-epoch nodes after its home, and a
//	                                crashed home's pages move to the first live one; fills:
//	                                a backup that crashes or is promoted is replaced at the
//	                                reconfiguration, and a crashed home's pages move to the
//	                                first live complete backup
//	read nX page=P [off=O]          a load
//	write nX page=P [off=O] v=V     a store
//	add nX page=P [off=O] v=V       an atomic add
//	cas nX page=P [off=O] cmp=C v=V an atomic compare-and-swap
//	evict nX page=P                 give the page up
//	deliver [from=nX] [to=nY] [kind=batch|msg] [n=K]   execute / hand over
//	deliver-split [from=..] [to=..] [kind=..] [n=K]   deliver, a batch stopping in the middle of
//	                                its first READ of more than 8 bytes, after its last half
//	                                (at most 128 bytes; of a 16-byte page: its bytes 8-15):
//	                                the rest waits in the network, "(rest of #N)", for a
//	                                later deliver (mem.Network.DeliverSplit)
//	drop [from=..] [to=..] [kind=..] [n=K]            lose them
//	dup [from=..] [to=..] [n=K]                       duplicate messages
//	complete [nX]                   report executed batches to their nodes
//	complete nX outcome=unknown executed=true|false
//	                                report nX's oldest batch as of unknown
//	                                outcome: executed (an executed one, else
//	                                the oldest in the network runs first) or
//	                                lost unexecuted (the oldest in the network)
//	complete nX outcome=unknown ops=K
//	                                nX's oldest batch in the network executes
//	                                its first K ops only, and is reported as
//	                                of unknown outcome
//	tick [n=K]                      advance every clock
//	crash nX                        kill a node
//	leave nX                        a drained node departs (graceful leave): it must hold no
//	                                tenure and home no page, and nothing reverts
//	reconfigure [async]             next epoch without the crashed nodes
//	                                (async: nobody learns it until learn nX)
//	learn nX                        hand the pending epoch to a node
//	join nX [async]                 next epoch with nX added (the next new id), created in
//	                                that epoch as a joining member (async: nobody else learns
//	                                it until learn nY)
//	promote page=P to=nX [async]    next epoch with page P moved away from its live home to its
//	                                complete backup nX; the old home becomes its first backup, to
//	                                fill, and owes the stamp of the slot it leaves behind (async:
//	                                nobody learns it until learn nY)
//	stamp nX page=P                 the old home nX stamps the slot of P it left behind
//	persist nX page=P               a Persist of P at nX (its home: a stable copy; else given up)
//	fill                            give every home the fills due there (coherence.Fill)
//	stabilize [max=K]               run until nothing is in flight (at most K steps), fills given
//	pending | dump | check          inspect
func TestInteraction(t *testing.T) {
	datadriven.Walk(t, "testdata/interaction", func(t *testing.T, path string) {
		var s *sim.Sim
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "add-nodes" && s == nil {
				d.Fatalf(t, "add-nodes first")
			}
			out := run(t, d, &s)
			if s != nil {
				if tr := s.TakeTrace(); len(tr) > 0 {
					out = strings.Join(tr, "\n") + "\n" + out
				}
				if err := s.Err(); err != nil {
					out += fmt.Sprintf("VIOLATION: %v\n", err)
				}
			}
			if out == "" {
				out = "ok\n"
			}
			return out
		})
	})
}

func node(t *testing.T, d *datadriven.TestData) ids.NodeID {
	for _, a := range d.CmdArgs {
		if len(a.Vals) == 0 && strings.HasPrefix(a.Key, "n") {
			v, err := strconv.Atoi(a.Key[1:])
			if err != nil {
				d.Fatalf(t, "bad node %q", a.Key)
			}
			return ids.NodeID(v)
		}
	}
	return ids.None
}

func intArg(t *testing.T, d *datadriven.TestData, key string, def int) int {
	if !d.HasArg(key) {
		return def
	}
	var v int
	d.ScanArgs(t, key, &v)
	return v
}

func nodeArg(t *testing.T, d *datadriven.TestData, key string) ids.NodeID {
	if !d.HasArg(key) {
		return ids.None
	}
	var v string
	d.ScanArgs(t, key, &v)
	n, err := strconv.Atoi(strings.TrimPrefix(v, "n"))
	if err != nil {
		d.Fatalf(t, "bad node %q", v)
	}
	return ids.NodeID(n)
}

func filter(t *testing.T, d *datadriven.TestData) sim.Filter {
	f := sim.Filter{From: nodeArg(t, d, "from"), To: nodeArg(t, d, "to")}
	if d.HasArg("kind") {
		var k string
		d.ScanArgs(t, "kind", &k)
		switch k {
		case "batch":
			f.Kind = mem.BatchDelivery
		case "msg":
			f.Kind = mem.MessageDelivery
		default:
			d.Fatalf(t, "kind %q", k)
		}
	}
	return f
}

func run(t *testing.T, d *datadriven.TestData, sp **sim.Sim) string {
	s := *sp
	req := func(op coherence.OpKind) string {
		r := coherence.Request{
			Op: op, Page: ids.PageNo(intArg(t, d, "page", 0)), Offset: intArg(t, d, "off", 0),
			Value: uint64(intArg(t, d, "v", 0)), Compare: uint64(intArg(t, d, "cmp", 0)),
		}
		if err := s.Request(node(t, d), r); err != nil {
			return fmt.Sprintf("error: %v\n", err)
		}
		return ""
	}
	switch d.Cmd {
	case "add-nodes":
		n, err := strconv.Atoi(d.CmdArgs[0].Key)
		if err != nil {
			d.Fatalf(t, "add-nodes N")
		}
		s, err = sim.New(2, sim.Options{Nodes: n, Pages: intArg(t, d, "pages", 1), Crashes: n, HomeCrashes: n, Trace: true,
			Backups: intArg(t, d, "backups", -1), Fills: d.HasArg("fills"),
			LazyHomes: d.HasArg("lazy"), Epoch: ids.Epoch(intArg(t, d, "epoch", 1))})
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		*sp = s
		return s.Dump()
	case "read":
		return req(coherence.OpLoad)
	case "write":
		return req(coherence.OpStore)
	case "add":
		return req(coherence.OpAdd)
	case "cas":
		return req(coherence.OpCAS)
	case "evict":
		return req(coherence.OpEvict)
	case "deliver":
		s.Deliveries(filter(t, d), sim.Deliver, intArg(t, d, "n", 0))
	case "deliver-split":
		s.Deliveries(filter(t, d), sim.DeliverSplit, intArg(t, d, "n", 0))
	case "drop":
		s.Deliveries(filter(t, d), sim.Drop, intArg(t, d, "n", 0))
	case "dup":
		s.Deliveries(filter(t, d), sim.Duplicate, intArg(t, d, "n", 0))
	case "complete":
		if d.HasArg("outcome") {
			var outcome string
			d.ScanArgs(t, "outcome", &outcome)
			if outcome != "unknown" {
				d.Fatalf(t, "outcome %q", outcome)
			}
			if d.HasArg("ops") {
				if _, err := s.CompleteUnknownPart(node(t, d), intArg(t, d, "ops", 0)); err != nil {
					return fmt.Sprintf("error: %v\n", err)
				}
				return ""
			}
			var executed bool
			d.ScanArgs(t, "executed", &executed)
			if _, err := s.CompleteUnknown(node(t, d), executed); err != nil {
				return fmt.Sprintf("error: %v\n", err)
			}
			return ""
		}
		s.Complete(node(t, d))
	case "tick":
		for i := 0; i < intArg(t, d, "n", 1); i++ {
			s.Tick()
		}
	case "crash":
		if err := s.Crash(node(t, d)); err != nil {
			return fmt.Sprintf("error: %v\n", err)
		}
	case "leave":
		if err := s.Leave(node(t, d)); err != nil {
			return fmt.Sprintf("error: %v\n", err)
		}
	case "reconfigure":
		if d.HasArg("async") {
			s.ReconfigureAsync()
		} else {
			s.Reconfigure()
		}
	case "join":
		if err := s.Join(node(t, d), d.HasArg("async")); err != nil {
			return fmt.Sprintf("error: %v\n", err)
		}
	case "learn":
		if err := s.Learn(node(t, d)); err != nil {
			return fmt.Sprintf("error: %v\n", err)
		}
	case "promote":
		var to string
		d.ScanArgs(t, "to", &to)
		id, err := strconv.Atoi(strings.TrimPrefix(to, "n"))
		if err != nil {
			d.Fatalf(t, "promote page=P to=nX")
		}
		if err := s.Promote(ids.PageNo(intArg(t, d, "page", 0)), ids.NodeID(id), d.HasArg("async")); err != nil {
			return fmt.Sprintf("error: %v\n", err)
		}
	case "persist":
		if err := s.Persist(node(t, d), ids.PageNo(intArg(t, d, "page", 0))); err != nil {
			return fmt.Sprintf("error: %v\n", err)
		}
	case "stamp":
		if err := s.Stamp(node(t, d), ids.PageNo(intArg(t, d, "page", 0))); err != nil {
			return fmt.Sprintf("error: %v\n", err)
		}
	case "fill":
		if !s.Fill() {
			return "no fill due\n"
		}
	case "stabilize":
		if !s.Stabilize(intArg(t, d, "max", 100000)) {
			return "not stable\n"
		}
	case "pending":
		return s.Pending()
	case "dump":
		return s.Dump()
	case "check":
		if err := s.Check(true); err != nil {
			return fmt.Sprintf("VIOLATION: %v\n", err)
		}
		return "ok\n"
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	return ""
}
