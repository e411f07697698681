package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"
)

// Fault kinds, as -faults names them.
const (
	faultKill       = "kill"        // SIGKILL a dsmd; restart it (same id, data, addresses) at the end
	faultPause      = "pause"       // SIGSTOP a dsmd; SIGCONT at the end
	faultPartition  = "partition"   // cut one node away from all others, both ways
	faultHalves     = "halves"      // cut a minority from a majority, both ways
	faultBridge     = "bridge"      // cut two sides from each other; one bridge node still reaches both
	faultOneWay     = "oneway"      // drop every packet from one node to another, the reverse still flows
	faultLoss       = "loss"        // drop 20-50% of a node's packets, both ways
	faultSlow       = "slow"        // limit a dsmd to 5% of one CPU (cgroup); SIGSTOP/SIGCONT bursts without one
	faultDisk       = "disk"        // fill the tmpfs under a node's data directory
	faultLeave      = "leave"       // SIGTERM a dsmd (a graceful leave); start it again at the end
	faultJoin       = "join"        // a new node joins (and its client starts); it leaves gracefully at the end
	faultClientKill = "client-kill" // SIGKILL a node's client process; a new one starts at the end
)

// allFaults lists every kind, in the order -faults all means.
var allFaults = []string{faultKill, faultPause, faultPartition, faultHalves, faultBridge, faultOneWay,
	faultLoss, faultSlow, faultDisk, faultLeave, faultJoin, faultClientKill}

// The short run (-short) is the one that make test can afford: one
// schedule of ShortDuration with faults that today's dsmd survives without
// wrong answers or hangs (see docs/reliability.md, "Chaos testing"): short
// pauses, below the failure detector's threshold, and client kills.
var (
	ShortFaults   = []string{faultPause, faultClientKill}
	ShortSpan     = Span{200 * time.Millisecond, 700 * time.Millisecond}
	ShortDuration = 20 * time.Second
	ShortSeed     = uint64(1)
)

// networkFaults need the firewall.
var networkFaults = []string{faultPartition, faultHalves, faultBridge, faultOneWay, faultLoss}

// ParseFaults parses a comma-separated list of kinds ("all" for every one).
func ParseFaults(s string) ([]string, error) {
	if s == "all" {
		return slices.Clone(allFaults), nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if k == "" {
			continue
		}
		if !slices.Contains(allFaults, k) {
			return nil, fmt.Errorf("unknown fault %q (known: %s, or all)", k, strings.Join(allFaults, ","))
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no fault kinds in %q", s)
	}
	return out, nil
}

// Fault is one entry of a schedule: what, on which nodes, when and for how
// long; then, once executed, when it actually started and ended and how it
// went.
type Fault struct {
	Kind string `json:"kind"`
	// Nodes are the targets: the node killed, paused, cut away, slowed,
	// ...; for oneway, the sender and then the receiver whose packets are
	// dropped; for bridge, the bridge node.
	Nodes []int `json:"nodes"`
	// Sides are the two groups cut from each other (partition, halves,
	// bridge).
	Sides [2][]int `json:"sides,omitzero"`
	// Pct is the share of packets dropped (loss).
	Pct int `json:"pct,omitempty"`
	// At is when it starts, after the workload started; For how long it
	// lasts.
	At  time.Duration `json:"at"`
	For time.Duration `json:"for"`

	// Start and End are when it was applied and healed (Unix ns; 0: not).
	Start int64 `json:"start,omitempty"`
	End   int64 `json:"end,omitempty"`
	// Err says why applying or healing it failed.
	Err string `json:"err,omitempty"`
	// Note says anything else worth knowing (the mechanism used).
	Note string `json:"note,omitempty"`
}

func (f *Fault) String() string {
	s := fmt.Sprintf("%s %s", f.Kind, nodeList(f.Nodes))
	switch f.Kind {
	case faultPartition, faultHalves, faultBridge:
		s = fmt.Sprintf("%s %s | %s", f.Kind, nodeList(f.Sides[0]), nodeList(f.Sides[1]))
		if f.Kind == faultBridge {
			s += " via " + nodeList(f.Nodes)
		}
	case faultOneWay:
		s = fmt.Sprintf("%s n%d -> n%d", f.Kind, f.Nodes[0], f.Nodes[1])
	case faultLoss:
		s = fmt.Sprintf("%s %s %d%%", f.Kind, nodeList(f.Nodes), f.Pct)
	}
	return s
}

func nodeList(ns []int) string {
	var b strings.Builder
	for i, n := range ns {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "n%d", n)
	}
	return b.String()
}

// Span is the range of fault durations: each lasts from Span[0] to Span[1].
type Span [2]time.Duration

// DefaultSpan is long enough for the failure detector to declare a
// stopped or cut-off node dead (about 1.5 s) and for failover to act.
var DefaultSpan = Span{3 * time.Second, 8 * time.Second}

// ParseSpan parses "3s-8s" or a single duration.
func ParseSpan(s string) (Span, error) {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		hi = lo
	}
	a, err := time.ParseDuration(strings.TrimSpace(lo))
	if err != nil {
		return Span{}, err
	}
	b, err := time.ParseDuration(strings.TrimSpace(hi))
	if err != nil {
		return Span{}, err
	}
	if a <= 0 || b < a {
		return Span{}, fmt.Errorf("fault durations %q: want MIN-MAX with 0 < MIN <= MAX", s)
	}
	return Span{a, b}, nil
}

// Schedule draws the faults of one run from seed: after a quiet warm-up,
// one fault at a time, each lasting a time drawn from span (a client kill
// keeps its client away for 0.5 to 2 s at most), with 2 to 5 s of quiet
// between them, the last one healed at least 2 s before the end. nodes is
// the number of base nodes; a joining node is nodes+1.
func Schedule(seed uint64, duration time.Duration, kinds []string, nodes int, span Span) []Fault {
	rng := rand.New(rand.NewPCG(seed, 0xc4a05))
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)).Round(time.Millisecond)
	}
	var out []Fault
	t := between(2*time.Second, 4*time.Second)
	for {
		f := Fault{Kind: kinds[rng.IntN(len(kinds))], At: t}
		f.For = between(span[0], span[1])
		if f.Kind == faultClientKill {
			f.For = between(min(span[0], 500*time.Millisecond), min(span[1], 2*time.Second))
		}
		if t+f.For > duration-2*time.Second {
			break
		}
		perm := rng.Perm(nodes)
		for i := range perm {
			perm[i]++
		}
		switch f.Kind {
		case faultPartition:
			f.Nodes = perm[:1]
			f.Sides = [2][]int{perm[:1], sorted(perm[1:])}
		case faultHalves:
			minority := 1 + rng.IntN(max(1, (nodes-1)/2))
			f.Nodes = sorted(perm[:minority])
			f.Sides = [2][]int{f.Nodes, sorted(perm[minority:])}
		case faultBridge:
			if nodes < 3 {
				f.Kind = faultPartition
				f.Nodes = perm[:1]
				f.Sides = [2][]int{perm[:1], sorted(perm[1:])}
				break
			}
			rest := perm[1:]
			cut := 1 + rng.IntN(len(rest)-1)
			f.Nodes = perm[:1]
			f.Sides = [2][]int{sorted(rest[:cut]), sorted(rest[cut:])}
		case faultOneWay:
			f.Nodes = perm[:2]
		case faultLoss:
			f.Nodes = perm[:1]
			f.Pct = 20 + 10*rng.IntN(4)
		case faultJoin:
			f.Nodes = []int{nodes + 1}
		default:
			f.Nodes = perm[:1]
		}
		out = append(out, f)
		t += f.For + between(2*time.Second, 5*time.Second)
	}
	return out
}

func sorted(s []int) []int {
	s = slices.Clone(s)
	sort.Ints(s)
	return s
}
