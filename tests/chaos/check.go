package chaos

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Violation is a wrong answer (or a crash) that a checker found, with the
// operations that show it.
type Violation struct {
	// Checker is linearizability, register-values, page, durability,
	// counter, mutex, crash, recovery or placement.
	Checker string `json:"checker"`
	What    string `json:"what"`
	T       int64  `json:"t"` // when it showed (Unix ns), for the picture
	Node    int    `json:"node,omitempty"`
	// Context names the faults in progress or recent at T.
	Context string `json:"context,omitempty"`
	Ops     []*Op  `json:"ops,omitempty"`
}

// KindStats is the availability of the operations during one fault kind
// (or "none": no fault in progress or healed in the last recoveryWindow).
type KindStats struct {
	Kind   string `json:"kind"`
	Ops    int    `json:"ops"`
	Errors int    `json:"errors"`
	// Hung operations never returned: blocked until their process was
	// killed at the end.
	Hung int `json:"hung"`
	// Killed operations never returned because the nemesis killed their
	// client process.
	Killed int `json:"killed"`
	// OverDeadline operations returned, after more than the deadline.
	OverDeadline  int      `json:"over_deadline"`
	ErrorFraction float64  `json:"error_fraction"`
	MaxLatencyMS  float64  `json:"max_latency_ms"`
	SampleErrors  []string `json:"sample_errors,omitempty"`
	Faults        int      `json:"faults"`
}

// Verdict is what the checkers say of one schedule.
type Verdict struct {
	Seed         uint64      `json:"seed"`
	Mode         string      `json:"mode"`
	Faults       int         `json:"faults"`
	Ops          int         `json:"operations"`
	Violations   []Violation `json:"violations"`
	Linearizable string      `json:"linearizable"` // ok, illegal, unknown (porcupine timed out) per word
	Availability []KindStats `json:"availability"`
	// LongestWaitMS is the longest any operation waited (to its return, or
	// to the end for one that never returned).
	LongestWaitMS float64  `json:"longest_wait_ms"`
	LongestWaitOp *Op      `json:"longest_wait_op,omitempty"`
	Notes         []string `json:"notes,omitempty"`
}

// recoveryWindow: operations up to this long after a fault healed count as
// that fault's (failover and catching up take a moment).
const recoveryWindow = 5 * time.Second

// checker holds what every check needs.
type checker struct {
	ops    []*Op
	faults []Fault
	losses []int64 // when a dsmd died without writing back, sorted
	// lossesOf are the same per node.
	lossesOf map[int][]int64
	tEnd     int64
	deadline time.Duration
	dir      string // where visualizations go
	v        *Verdict
}

func newChecker(ops []*Op, faults []Fault, events []event, tEnd int64, deadline time.Duration, dir string) *checker {
	c := &checker{ops: ops, faults: faults, tEnd: tEnd, deadline: deadline, dir: dir, v: &Verdict{},
		lossesOf: map[int][]int64{}}
	for _, e := range events {
		if e.What == evLoss {
			c.losses = append(c.losses, e.T)
			c.lossesOf[e.Node] = append(c.lossesOf[e.Node], e.T)
			c.markUnacked(e.Node, e.T)
		}
	}
	sort.Slice(c.losses, func(i, j int) bool { return c.losses[i] < c.losses[j] })
	for _, ls := range c.lossesOf {
		sort.Slice(ls, func(i, j int) bool { return ls[i] < ls[j] })
	}
	return c
}

// markUnacked marks the operations of node's clients that ran after its
// dsmd died at t and before they noticed (a failed operation, or mapping
// the region again).
func (c *checker) markUnacked(node int, t int64) {
	noticed := c.tEnd
	for _, o := range c.ops {
		if o.Node == node && !o.Final && o.Call >= t && (o.Kind == opMap || o.Failed()) && o.Call < noticed {
			noticed = o.Call
		}
	}
	for _, o := range c.ops {
		if o.Node == node && !o.Final && o.Call < noticed && (o.Pending() || o.Return > t) {
			o.Unacked = true
		}
	}
}

// lossBetween says whether a dsmd died without writing back in (a, b].
func (c *checker) lossBetween(a, b int64) bool {
	i := sort.Search(len(c.losses), func(i int) bool { return c.losses[i] > a })
	return i < len(c.losses) && c.losses[i] <= b
}

// nodeLossBetween says whether node's dsmd died without writing back in
// (a, b].
func (c *checker) nodeLossBetween(node int, a, b int64) bool {
	ls := c.lossesOf[node]
	i := sort.Search(len(ls), func(i int) bool { return ls[i] > a })
	return i < len(ls) && ls[i] <= b
}

// segment numbers the stretches between losses: operations in one
// segment see one lineage of the data.
func (c *checker) segment(t int64) int {
	return sort.Search(len(c.losses), func(i int) bool { return c.losses[i] > t })
}

// context names the faults in progress, or healed within the recovery
// window, at t.
func (c *checker) context(t int64) string {
	var s []string
	for i := range c.faults {
		f := &c.faults[i]
		if f.Start == 0 || t < f.Start {
			continue
		}
		switch {
		case f.End == 0 || t <= f.End:
			s = append(s, "during "+f.String())
		case t <= f.End+int64(recoveryWindow):
			s = append(s, fmt.Sprintf("%.1fs after %s", float64(t-f.End)/1e9, f.String()))
		}
	}
	if len(c.losses) > 0 && c.losses[0] < t {
		s = append(s, fmt.Sprintf("%d dsmd deaths without write-back before", c.segment(t)))
	}
	return strings.Join(s, "; ")
}

func (c *checker) violate(checker, what string, t int64, node int, ops ...*Op) {
	c.v.Violations = append(c.v.Violations, Violation{Checker: checker, What: what, T: t, Node: node,
		Context: c.context(t), Ops: ops})
}

func (c *checker) of(kinds ...string) []*Op {
	var out []*Op
	for _, o := range c.ops {
		for _, k := range kinds {
			if o.Kind == k {
				out = append(out, o)
				break
			}
		}
	}
	return out
}

// check runs every checker.
func (c *checker) check() *Verdict {
	c.v.Ops = len(c.ops)
	c.v.Violations = []Violation{}
	c.registers()
	c.pages()
	c.counters()
	c.mutex()
	c.availability()
	return c.v
}

// regInput is a register operation as porcupine sees it.
type regInput struct {
	Kind    string
	Word    int64
	Arg     uint64
	Old     uint64
	Out     uint64
	Swapped bool
	// Known is false for a store or cas that never returned: it may take
	// effect at any time after its call, or never.
	Known bool
	Proc  string
}

// regState is a register's value; !Known after a dsmd died without writing
// back: its unsynced stores may be lost, so the next load may see any
// value (the register-values check still requires it to be one stored).
type regState struct {
	Known bool
	V     uint64
}

const opCrash = "crash"

var registerModel = porcupine.Model{
	Init: func() any { return regState{Known: true} },
	Step: func(state, input, _ any) (bool, any) {
		s, in := state.(regState), input.(regInput)
		switch in.Kind {
		case opCrash:
			return true, regState{}
		case opLoad:
			if !s.Known {
				return true, regState{Known: true, V: in.Out}
			}
			return in.Out == s.V, s
		case opStore:
			return true, regState{Known: true, V: in.Arg}
		case opCAS:
			if !in.Known {
				if s.Known && s.V == in.Old {
					return true, regState{Known: true, V: in.Arg}
				}
				return true, s
			}
			if !s.Known {
				if in.Swapped {
					return true, regState{Known: true, V: in.Arg}
				}
				return true, s
			}
			if in.Swapped != (s.V == in.Old) {
				return false, s
			}
			if in.Swapped {
				return true, regState{Known: true, V: in.Arg}
			}
			return true, s
		}
		return false, s
	},
	DescribeOperation: func(input, _ any) string {
		in := input.(regInput)
		switch in.Kind {
		case opCrash:
			return "dsmd died (unsynced data may be lost)"
		case opLoad:
			return fmt.Sprintf("%s load -> %#x", in.Proc, in.Out)
		case opStore:
			return fmt.Sprintf("%s store %#x", in.Proc, in.Arg)
		}
		res := fmt.Sprint(in.Swapped)
		if !in.Known {
			res = "?"
		}
		return fmt.Sprintf("%s cas %#x -> %#x: %s", in.Proc, in.Old, in.Arg, res)
	},
	DescribeState: func(state any) string {
		s := state.(regState)
		if !s.Known {
			return "unknown (after a crash)"
		}
		return fmt.Sprintf("%#x", s.V)
	},
}

// registers checks the register history with porcupine, one word at a
// time, and that every value loaded was stored by someone.
func (c *checker) registers() {
	ops := c.of(opLoad, opStore, opCAS)
	clients := map[string]int{"nemesis": 0}
	clientID := func(o *Op) int {
		k := fmt.Sprintf("%s/w%d", o.Proc, o.Worker)
		if id, ok := clients[k]; ok {
			return id
		}
		clients[k] = len(clients)
		return clients[k]
	}
	// history is word w's history as porcupine takes it, cut at time cut:
	// operations called later are left out, those that returned later have
	// not returned.
	history := func(w, cut int64) []porcupine.Operation {
		var h []porcupine.Operation
		for _, o := range ops {
			if o.Addr != w || o.Call > cut {
				continue
			}
			returned := o.Return != 0 && o.Return <= cut
			known := returned && !o.Unacked
			if (returned && o.Failed()) || (!known && o.Kind == opLoad) {
				continue
			}
			in := regInput{Kind: o.Kind, Word: w, Arg: o.Arg, Old: o.Old, Out: o.Out, Swapped: o.Swapped,
				Known: known, Proc: o.Proc}
			ret := o.Return
			if !known {
				ret = math.MaxInt64
			}
			h = append(h, porcupine.Operation{ClientId: clientID(o), Input: in, Call: o.Call, Return: ret})
		}
		for _, t := range c.losses {
			if t <= cut {
				h = append(h, porcupine.Operation{ClientId: 0, Input: regInput{Kind: opCrash, Word: w}, Call: t, Return: t})
			}
		}
		return h
	}
	var results []string
	for _, w := range regWords {
		h := history(w, math.MaxInt64)
		res, info := porcupine.CheckOperationsVerbose(registerModel, h, 2*time.Minute)
		results = append(results, fmt.Sprintf("word %d: %s", w, res))
		switch res {
		case porcupine.Illegal:
			path := filepath.Join(c.dir, fmt.Sprintf("linearizability-word%d.html", w))
			info.AddAnnotations(c.annotations())
			what := fmt.Sprintf("the history of register word %d (%d operations) is not linearizable", w, len(h))
			t, first := c.firstIllegal(ops, w, func(cut int64) []porcupine.Operation { return history(w, cut) })
			node := 0
			if first != nil {
				what += fmt.Sprintf("; the shortest prefix that is not ends with %s", describe(first))
				node = first.Node
			}
			if err := porcupine.VisualizePath(registerModel, info, path); err == nil {
				what += "; see " + filepath.Base(path)
			}
			c.violate("linearizability", what, t, node)
		case porcupine.Unknown:
			c.v.Notes = append(c.v.Notes, fmt.Sprintf("porcupine gave up on word %d after 2 minutes (%d operations): undecided, not counted", w, len(h)))
		}
	}
	c.v.Linearizable = strings.Join(results, ", ")

	// Every value loaded was stored (or is the initial zero).
	stored := map[uint64]*Op{}
	for _, o := range ops {
		if (o.Kind == opStore || o.Kind == opCAS) && !o.Failed() {
			if p, ok := stored[o.Arg]; !ok || o.Call < p.Call {
				stored[o.Arg] = o
			}
		}
	}
	for _, o := range ops {
		if o.Kind != opLoad || !o.acked() || o.Out == 0 {
			continue
		}
		if s, ok := stored[o.Out]; !ok || s.Call > o.Return {
			c.violate("register-values", fmt.Sprintf("%s loaded %#x from word %d, a value no store had written by then", o.Proc, o.Out, o.Addr), o.Return, o.Node, o)
		}
	}
}

// firstIllegal finds where word w's history stops being linearizable: the
// earliest cut whose history porcupine rejects (by bisection on time, to a
// millisecond), and the operation that returned last before it.
func (c *checker) firstIllegal(ops []*Op, w int64, history func(cut int64) []porcupine.Operation) (int64, *Op) {
	var lo, hi int64 = math.MaxInt64, 0
	for _, o := range ops {
		if o.Addr == w {
			lo = min(lo, o.Call)
			hi = max(hi, o.Return, o.Call)
		}
	}
	if hi == 0 {
		return 0, nil
	}
	for i := 0; i < 40 && hi-lo > int64(time.Millisecond); i++ {
		mid := lo + (hi-lo)/2
		if porcupine.CheckOperationsTimeout(registerModel, history(mid), 10*time.Second) == porcupine.Illegal {
			hi = mid
		} else {
			lo = mid
		}
	}
	var first *Op
	for _, o := range ops {
		if o.Addr == w && o.Return != 0 && o.Return <= hi && (first == nil || o.Return > first.Return) {
			first = o
		}
	}
	return hi, first
}

// describe names an operation and its result for a violation.
func describe(o *Op) string {
	res := ""
	switch o.Kind {
	case opLoad:
		res = fmt.Sprintf(" -> %#x", o.Out)
	case opStore:
		res = fmt.Sprintf(" %#x", o.Arg)
	case opCAS:
		res = fmt.Sprintf(" %#x -> %#x: swapped %v", o.Old, o.Arg, o.Swapped)
	}
	lat := "never returned"
	if o.Return != 0 {
		lat = fmt.Sprintf("took %s", time.Duration(o.Return-o.Call).Round(time.Millisecond))
	}
	return fmt.Sprintf("%s %s at %#x%s (%s)", o.Proc, o.Kind, o.Addr, res, lat)
}

// annotations are the faults, for porcupine's visualization.
func (c *checker) annotations() []porcupine.Annotation {
	var a []porcupine.Annotation
	for _, f := range c.faults {
		if f.Start == 0 {
			continue
		}
		end := f.End
		if end == 0 {
			end = c.tEnd
		}
		a = append(a, porcupine.Annotation{Tag: "nemesis", Start: f.Start, End: end, Description: f.String(),
			BackgroundColor: "#f6c6c6"})
	}
	for _, t := range c.losses {
		a = append(a, porcupine.Annotation{Tag: "dsmd deaths", Start: t, Description: "no write-back", BackgroundColor: "#e08080"})
	}
	return a
}

// syncedAt is when the data of an operation by node that returned at t was
// known to be synced: the return of the first successful Sync on that node
// called after t (0: never).
func (c *checker) syncedAt() func(node int, t int64) int64 {
	by := map[int][]*Op{}
	for _, o := range c.of(opSync) {
		if o.acked() {
			by[o.Node] = append(by[o.Node], o)
		}
	}
	return func(node int, t int64) int64 {
		best := int64(0)
		for _, s := range by[node] {
			// A Sync covers the node's writes of its dsmd's present life
			// only: one that died in between took them with it (and the
			// client mapped the region anew).
			if s.Call > t && (best == 0 || s.Return < best) && !c.nodeLossBetween(node, t, s.Call) {
				best = s.Return
			}
		}
		return best
	}
}

// pages checks every read of a checksummed page: complete (not torn, the
// right page), a seq that some write had started, not older than what was
// acknowledged before (when no dsmd died since) and never older than what
// was synced before.
func (c *checker) pages() {
	synced := c.syncedAt()
	writes := map[int64][]*Op{}
	for _, o := range c.of(opPageWrite) {
		writes[o.Addr] = append(writes[o.Addr], o)
	}
	type wInfo struct {
		o        *Op
		syncedAt int64
	}
	info := map[int64][]wInfo{}
	bySeq := map[uint64]*Op{}
	for addr, ws := range writes {
		for _, w := range ws {
			bySeq[w.Arg] = w
			s := int64(0)
			if w.acked() {
				s = synced(w.Node, w.Return)
			}
			info[addr] = append(info[addr], wInfo{w, s})
		}
	}
	tornAllowed := 0
	for _, r := range c.of(opPageRead) {
		if !r.acked() {
			continue
		}
		ws := info[r.Addr]
		// A write in flight during the read (or one that never completed and
		// was not overwritten since) may leave a partial page: plain memory
		// copies are not atomic.
		inflight := func() bool {
			for _, w := range ws {
				if w.o.Call > r.Return {
					continue
				}
				if !w.o.acked() {
					overwritten := false
					for _, w2 := range ws {
						if w2.o.acked() && w2.o.Call > w.o.Call && w2.o.Return < r.Call {
							overwritten = true
							break
						}
					}
					if !overwritten {
						return true
					}
					continue
				}
				if w.o.Return >= r.Call {
					return true
				}
			}
			return false
		}
		switch r.Status {
		case pageTorn, pageWrong:
			if inflight() {
				tornAllowed++
				continue
			}
			c.violate("page", fmt.Sprintf("%s read a %s page at %#x (seq %#x in its header) with no write of it in flight%s", r.Proc, r.Status, r.Addr, r.Out,
				c.tearAccount(r, writes[r.Addr])), r.Return, r.Node, r)
			continue
		}
		seq := r.Out
		if seq != 0 {
			if w := bySeq[seq]; w == nil || w.Addr != r.Addr || w.Call > r.Return {
				c.violate("page", fmt.Sprintf("%s read page %#x with seq %#x, which no write of that page had started", r.Proc, r.Addr, seq), r.Return, r.Node, r)
				continue
			}
		}
		var ackW, syncW *Op
		var syncT int64
		for _, w := range ws {
			if !w.o.acked() {
				continue
			}
			// A dsmd that died (or was declared failed) after the write
			// returned and before the read did may have taken the write
			// with it: a read in flight across the loss may see the data
			// before it.
			if w.o.Return < r.Call && !c.lossBetween(w.o.Return, r.Return) && (ackW == nil || w.o.Arg > ackW.Arg) {
				ackW = w.o
			}
			if w.syncedAt != 0 && w.syncedAt < r.Call && (syncW == nil || w.o.Arg > syncW.Arg) {
				syncW, syncT = w.o, w.syncedAt
			}
		}
		what := "zeros (the initial page)"
		if seq != 0 {
			what = fmt.Sprintf("seq %#x", seq)
		}
		switch {
		case syncW != nil && seq < syncW.Arg:
			c.violate("durability", fmt.Sprintf("%s read page %#x and got %s, older than seq %#x that %s wrote and a Sync on n%d made durable %.3fs before the read",
				r.Proc, r.Addr, what, syncW.Arg, syncW.Proc, syncW.Node, float64(r.Call-syncT)/1e9), r.Return, r.Node, r, syncW)
		case ackW != nil && seq < ackW.Arg:
			c.violate("page", fmt.Sprintf("stale read: %s read page %#x and got %s, older than seq %#x that %s's write returned %.3fs before the read (no dsmd died in between)",
				r.Proc, r.Addr, what, ackW.Arg, ackW.Proc, float64(r.Call-ackW.Return)/1e9), r.Return, r.Node, r, ackW)
		}
	}
	if tornAllowed > 0 {
		c.v.Notes = append(c.v.Notes, fmt.Sprintf("%d page reads saw a partial page while a write of it was in flight (allowed: WriteAt is a plain copy)", tornAllowed))
	}
}

// counters checks the final value of each counter against the adds: every
// acknowledged add counted (every synced one, once a dsmd died without
// writing back), none invented; and that no two adds returned the same
// value while no dsmd died.
func (c *checker) counters() {
	synced := c.syncedAt()
	for _, w := range counterWords {
		var acked, maybe, syncedAcked int
		seen := map[[2]uint64]*Op{}
		for _, o := range c.of(opAdd) {
			if o.Addr != w {
				continue
			}
			switch {
			case o.acked():
				acked++
				if synced(o.Node, o.Return) != 0 {
					syncedAcked++
				}
				if seg := c.segment(o.Call); seg == c.segment(o.Return) {
					k := [2]uint64{uint64(seg), o.Out}
					if p := seen[k]; p != nil {
						c.violate("counter", fmt.Sprintf("two adds to counter %d returned the same value %d (%s and %s) with no dsmd death between them", w, o.Out, p.Proc, o.Proc), o.Return, o.Node, p, o)
					}
					seen[k] = o
				}
			default:
				maybe++
			}
		}
		c.v.Notes = append(c.v.Notes, fmt.Sprintf("counter %d: %d adds acknowledged (%d of them synced), %d failed or never returned", w, acked, syncedAcked, maybe))
		for _, f := range c.of(opCount) {
			if f.Addr != w || !f.OK {
				continue
			}
			v := int(f.Out)
			switch {
			case v > acked+maybe:
				c.violate("counter", fmt.Sprintf("counter %d reads %d on n%d at the end: more than the %d acknowledged and %d uncertain adds (invented)", w, v, f.Node, acked, maybe), f.Return, f.Node, f)
			case len(c.losses) == 0 && v < acked:
				c.violate("counter", fmt.Sprintf("counter %d reads %d on n%d at the end: %d acknowledged adds lost, and no dsmd died without writing back", w, v, f.Node, acked-v), f.Return, f.Node, f)
			case v < syncedAcked:
				c.violate("durability", fmt.Sprintf("counter %d reads %d on n%d at the end: fewer than the %d adds acknowledged before a Sync that returned", w, v, f.Node, syncedAcked), f.Return, f.Node, f)
			}
		}
	}
}

// mutex checks the lock-protected pair: both words equal inside every
// critical section and at the end, no two critical sections that read the
// same value while no dsmd died, and the final value against the
// critical sections that completed.
func (c *checker) mutex() {
	synced := c.syncedAt()
	var acked, maybe, syncedAcked int
	seen := map[[2]uint64]*Op{}
	for _, o := range c.of(opRMW) {
		if !o.acked() {
			if o.Status == rmwNoLock {
				continue
			}
			maybe++
			continue
		}
		acked++
		if synced(o.Node, o.Return) != 0 {
			syncedAcked++
		}
		if o.Out != o.Out2 {
			c.violate("mutex", fmt.Sprintf("%s found the pair at %d and %d inside the lock (mutual exclusion or coherence broken)", o.Proc, o.Out, o.Out2), o.Return, o.Node, o)
		}
		if seg := c.segment(o.Call); seg == c.segment(o.Return) {
			k := [2]uint64{uint64(seg), o.Out}
			if p := seen[k]; p != nil {
				c.violate("mutex", fmt.Sprintf("two critical sections (%s and %s) both read the pair at %d with no dsmd death between them: an update was lost", p.Proc, o.Proc, o.Out), o.Return, o.Node, p, o)
			}
			seen[k] = o
		}
	}
	c.v.Notes = append(c.v.Notes, fmt.Sprintf("mutex: %d critical sections completed (%d of them synced), %d uncertain", acked, syncedAcked, maybe))
	// The lock's own words: every completed critical section took a ticket
	// and advanced the now-serving word once; a Lock that failed or never
	// returned may have taken a ticket (skipped later, once its process
	// was found dead or its Lock gave it up). A Lock whose process or
	// dsmd stopped for five seconds between taking its ticket and
	// recording itself is skipped and takes another: after a pause,
	// tickets beyond the completed and uncertain Locks are not a fault.
	paused := slices.ContainsFunc(c.faults, func(f Fault) bool { return f.Kind == faultPause })
	var unc, killedRMW int
	for _, o := range c.of(opRMW) {
		if !o.acked() {
			unc++
		}
		if o.Killed {
			killedRMW++
		}
	}
	for _, f := range c.of(opLockWords) {
		if !f.OK {
			continue
		}
		t, s := int(f.Out), int(f.Out2&^(1<<63))
		note := fmt.Sprintf("mutex words on n%d at the end: ticket %d, now serving %d", f.Node, t, s)
		if f.Out2&(1<<63) != 0 {
			note += " (its last holder died holding it)"
		}
		if t > s && killedRMW > 0 {
			note += fmt.Sprintf(" (%d Locks were in clients the nemesis killed; their tickets are skipped by the next Lock)", killedRMW)
		}
		c.v.Notes = append(c.v.Notes, note)
		switch {
		case s > t:
			c.violate("mutex", fmt.Sprintf("the Mutex on n%d at the end serves ticket %d of only %d taken", f.Node, s, t), f.Return, f.Node, f)
		case len(c.losses) > 0:
		case s < acked:
			c.violate("mutex", fmt.Sprintf("the Mutex on n%d at the end serves ticket %d, but %d critical sections completed: an Unlock was lost", f.Node, s, acked), f.Return, f.Node, f)
		case t > acked+unc && paused:
			c.v.Notes = append(c.v.Notes, fmt.Sprintf("the Mutex on n%d handed out %d tickets for %d critical sections and %d uncertain Locks: Locks skipped while stopped took new ones", f.Node, t, acked, unc))
		case t > acked+unc:
			c.violate("mutex", fmt.Sprintf("the Mutex on n%d at the end has handed out %d tickets, more than the %d critical sections and %d uncertain Locks could have taken", f.Node, t, acked, unc), f.Return, f.Node, f)
		}
	}
	for _, f := range c.of(opPair) {
		if !f.OK {
			continue
		}
		a := int(f.Out)
		switch {
		case f.Out != f.Out2:
			c.violate("mutex", fmt.Sprintf("the pair reads %d and %d on n%d at the end", f.Out, f.Out2, f.Node), f.Return, f.Node, f)
		case a > acked+maybe:
			c.violate("mutex", fmt.Sprintf("the pair reads %d on n%d at the end: more than the %d completed and %d uncertain critical sections", a, f.Node, acked, maybe), f.Return, f.Node, f)
		case len(c.losses) == 0 && a < acked:
			c.violate("mutex", fmt.Sprintf("the pair reads %d on n%d at the end: %d completed critical sections lost, and no dsmd died without writing back", a, f.Node, acked-a), f.Return, f.Node, f)
		case a < syncedAcked:
			c.violate("durability", fmt.Sprintf("the pair reads %d on n%d at the end: fewer than the %d critical sections completed before a Sync that returned", a, f.Node, syncedAcked), f.Return, f.Node, f)
		}
	}
}

// attribute names the fault kind an operation ran under: the first fault
// that was in progress (or healed within the recovery window) at some time
// while it ran (to its return, or to the end for one that never
// returned); "none" otherwise, "final" for the final check, client-kill
// for one whose process the nemesis killed.
func (c *checker) attribute(o *Op) string {
	switch {
	case o.Final:
		return "final"
	case o.Killed:
		return faultClientKill
	}
	end := o.Return
	if o.Pending() {
		end = c.tEnd
	}
	kind, start := "none", int64(math.MaxInt64)
	for _, f := range c.faults {
		if f.Start == 0 {
			continue
		}
		fEnd := f.End
		if fEnd == 0 {
			fEnd = c.tEnd
		}
		if o.Call <= fEnd+int64(recoveryWindow) && end >= f.Start && f.Start < start {
			kind, start = f.Kind, f.Start
		}
	}
	return kind
}

// availability sums up, per fault kind, how many operations failed, hung
// or took longer than the deadline, and finds the longest wait.
func (c *checker) availability() {
	stats := map[string]*KindStats{}
	for _, f := range c.faults {
		if f.Start == 0 {
			continue
		}
		if stats[f.Kind] == nil {
			stats[f.Kind] = &KindStats{Kind: f.Kind}
		}
		stats[f.Kind].Faults++
	}
	var longest int64
	for _, o := range c.ops {
		k := c.attribute(o)
		s := stats[k]
		if s == nil {
			s = &KindStats{Kind: k}
			stats[k] = s
		}
		s.Ops++
		lat := o.Return - o.Call
		switch {
		case o.Killed:
			s.Killed++
			continue
		case o.Pending():
			s.Hung++
			lat = c.tEnd - o.Call
		case !o.OK:
			s.Errors++
			if len(s.SampleErrors) < 3 {
				msg := o.Kind + ": " + o.Err
				dup := false
				for _, e := range s.SampleErrors {
					dup = dup || e == msg
				}
				if !dup {
					s.SampleErrors = append(s.SampleErrors, msg)
				}
			}
		}
		if !o.Pending() && time.Duration(lat) > c.deadline {
			s.OverDeadline++
		}
		if ms := float64(lat) / 1e6; ms > s.MaxLatencyMS {
			s.MaxLatencyMS = ms
		}
		if lat > longest {
			longest, c.v.LongestWaitOp = lat, o
		}
	}
	c.v.LongestWaitMS = float64(longest) / 1e6
	for _, s := range stats {
		if s.Ops > 0 {
			s.ErrorFraction = float64(s.Errors+s.Hung) / float64(s.Ops)
		}
		c.v.Availability = append(c.v.Availability, *s)
	}
	order := func(k string) int {
		switch k {
		case "none":
			return -2
		case "final":
			return 100
		}
		for i, f := range allFaults {
			if f == k {
				return i
			}
		}
		return 99
	}
	sort.Slice(c.v.Availability, func(i, j int) bool {
		return order(c.v.Availability[i].Kind) < order(c.v.Availability[j].Kind)
	})
}

// recovery turns a cluster that did not become whole again after the
// last fault healed (no leader, or running nodes not alive in each
// other's view, recoverWithin after the heal) into a violation: errors
// during a fault are allowed, a cluster that never comes back is not.
func (c *checker) recovery(events []event) {
	for _, e := range events {
		switch e.What {
		case evUnrecovered:
			c.violate("recovery", "the cluster did not recover: "+e.Detail, e.T, 0)
		case evRecovered:
			c.v.Notes = append(c.v.Notes, "recovered "+e.Detail)
		}
	}
}

// crashes turns dsmd exits that no fault asked for, and panics, fatal
// errors and data races in the nodes' logs, into violations.
func (c *checker) crashes(events []event, nodeDirs map[int]string) {
	for _, e := range events {
		if e.What == evCrash {
			c.violate("crash", fmt.Sprintf("n%d's dsmd exited on its own: %s", e.Node, e.Detail), e.T, e.Node)
		}
	}
	for id, dir := range nodeDirs {
		b, err := os.ReadFile(filepath.Join(dir, "dsmd.log"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			for _, m := range []string{"panic: ", "fatal error: ", "WARNING: DATA RACE"} {
				if strings.HasPrefix(l, m) {
					c.violate("crash", fmt.Sprintf("n%d's log: %s", id, strings.TrimSpace(l)), 0, id)
				}
			}
		}
	}
}

// tearAccount says, for a torn or wrong page read r whose bytes the client
// recorded, which write each part of the page came from (runs of 8-byte
// words, by the seq of the write of that page whose content has them, or
// zero), and what the same worker's next read of the page found. It is ""
// when the read has no bytes recorded.
func (c *checker) tearAccount(r *Op, writes []*Op) string {
	raw, err := hex.DecodeString(r.Raw)
	if err != nil || len(raw) != pageSize {
		return ""
	}
	page := pageIndex(r.Addr)
	want := make(map[uint64][]byte, len(writes))
	order := make([]uint64, 0, len(writes))
	for _, w := range writes {
		if _, ok := want[w.Arg]; ok || w.Call > r.Return {
			continue
		}
		b := make([]byte, pageSize)
		fillPage(b, page, w.Arg, w.Node)
		want[w.Arg] = b
		order = append(order, w.Arg)
	}
	// The newest write first: a word that several writes share (none, but
	// for the page number) is put down to the newest.
	slices.Reverse(order)
	label := func(o int) string {
		word := raw[o : o+8]
		if o == hdrPage && binary.LittleEndian.Uint64(word) == page {
			return "page number"
		}
		for _, seq := range order {
			if string(want[seq][o:o+8]) == string(word) {
				return fmt.Sprintf("seq %#x", seq)
			}
		}
		if binary.LittleEndian.Uint64(word) == 0 {
			return "zeros"
		}
		return "unknown"
	}
	var parts []string
	start, cur := 0, label(0)
	for o := 8; o <= pageSize; o += 8 {
		l := ""
		if o < pageSize {
			l = label(o)
		}
		if l != cur {
			parts = append(parts, fmt.Sprintf("%d-%d %s", start, o-1, cur))
			start, cur = o, l
		}
	}
	next := "no later read of it by that worker"
	var after *Op
	for _, o := range c.of(opPageRead) {
		if o.Proc == r.Proc && o.Worker == r.Worker && o.Addr == r.Addr && o.Call >= r.Return && (after == nil || o.Call < after.Call) {
			after = o
		}
	}
	switch {
	case after == nil:
	case !after.OK:
		next = "the next read by that worker failed: " + after.Err
	default:
		next = fmt.Sprintf("the next read by that worker, %.3fs later, found %s seq %#x", float64(after.Call-r.Return)/1e9, after.Status, after.Out)
	}
	return fmt.Sprintf(" [bytes %s; %s]", strings.Join(parts, ", "), next)
}
