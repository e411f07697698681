package chaos

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// op builds a completed operation for the checkers' tests (times in ms).
func op(proc string, node int, kind string, addr int64, call, ret int64) *Op {
	return &Op{Proc: proc, Node: node, Kind: kind, Addr: addr, Call: call * 1e6, Return: ret * 1e6, OK: true}
}

func checkersOf(t *testing.T, ops []*Op, losses ...int64) *Verdict {
	t.Helper()
	var events []event
	for _, l := range losses {
		events = append(events, event{T: l * 1e6, What: evLoss, Node: 1})
	}
	c := newChecker(ops, nil, events, 1e12, 10*time.Second, t.TempDir())
	return c.check()
}

func violations(v *Verdict, checker string) int {
	n := 0
	for _, x := range v.Violations {
		if x.Checker == checker {
			n++
		}
	}
	return n
}

func TestRegisters(t *testing.T) {
	store := func(p string, v uint64, call, ret int64) *Op {
		o := op(p, 1, opStore, 0, call, ret)
		o.Arg = v
		return o
	}
	load := func(p string, v uint64, call, ret int64) *Op {
		o := op(p, 2, opLoad, 0, call, ret)
		o.Out = v
		return o
	}
	cas := func(p string, old, v uint64, sw bool, call, ret int64) *Op {
		o := op(p, 3, opCAS, 0, call, ret)
		o.Old, o.Arg, o.Swapped = old, v, sw
		return o
	}
	for _, tc := range []struct {
		name   string
		ops    []*Op
		losses []int64
		lin    int // linearizability violations
		values int // register-values violations
	}{
		{"read of the store", []*Op{store("a", 5, 1, 2), load("b", 5, 3, 4)}, nil, 0, 0},
		{"stale read", []*Op{store("a", 5, 1, 2), load("b", 0, 3, 4)}, nil, 1, 0},
		{"concurrent read may miss the store", []*Op{store("a", 5, 1, 4), load("b", 0, 2, 3)}, nil, 0, 0},
		{"two cas from one old both swap", []*Op{cas("a", 0, 7, true, 1, 4), cas("b", 0, 8, true, 2, 3)}, nil, 1, 0},
		{"cas fails on the right value", []*Op{cas("a", 0, 7, false, 1, 2)}, nil, 1, 0},
		{"a store that never returned may land late", []*Op{
			{Proc: "a", Kind: opStore, Arg: 9, Call: 1e6},
			load("b", 0, 2, 3), load("b", 9, 4, 5)}, nil, 0, 0},
		{"a failed store did nothing", []*Op{
			{Proc: "a", Kind: opStore, Arg: 9, Call: 1e6, Return: 2e6, Err: "fault"},
			load("b", 9, 4, 5)}, nil, 1, 1},
		{"lost after a dsmd died", []*Op{store("a", 5, 1, 2), load("b", 0, 5, 6)}, []int64{3}, 0, 0},
		{"after a death, loads agree with each other", []*Op{store("a", 5, 1, 2), load("b", 0, 5, 6), load("b", 5, 7, 8)}, []int64{3}, 1, 0},
		{"an invented value", []*Op{load("b", 77, 1, 2)}, []int64{0}, 0, 1},
	} {
		v := checkersOf(t, tc.ops, tc.losses...)
		if got := violations(v, "linearizability"); got != tc.lin {
			t.Errorf("%s: %d linearizability violations, want %d: %+v", tc.name, got, tc.lin, v.Violations)
		}
		if got := violations(v, "register-values"); got != tc.values {
			t.Errorf("%s: %d register-values violations, want %d: %+v", tc.name, got, tc.values, v.Violations)
		}
	}
}

func TestPages(t *testing.T) {
	off := pageOff(1, 0)
	write := func(seq uint64, call, ret int64) *Op {
		o := op("w", 1, opPageWrite, off, call, ret)
		o.Arg = seq
		return o
	}
	read := func(status string, seq uint64, call, ret int64) *Op {
		o := op("r", 2, opPageRead, off, call, ret)
		o.Status, o.Out = status, seq
		return o
	}
	sync := func(node int, call, ret int64) *Op { return op("s", node, opSync, 0, call, ret) }
	for _, tc := range []struct {
		name             string
		ops              []*Op
		losses           []int64
		page, durability int
	}{
		{"fresh read", []*Op{write(100, 1, 2), read(pageOK, 100, 3, 4)}, nil, 0, 0},
		{"stale read", []*Op{write(100, 1, 2), write(200, 3, 4), read(pageOK, 100, 5, 6)}, nil, 1, 0},
		{"zeros after a write", []*Op{write(100, 1, 2), read(pageZero, 0, 5, 6)}, nil, 1, 0},
		{"unsynced write lost with its holder", []*Op{write(100, 1, 2), read(pageZero, 0, 5, 6)}, []int64{3}, 0, 0},
		{"synced write lost", []*Op{write(100, 1, 2), sync(1, 3, 4), read(pageZero, 0, 7, 8)}, []int64{5}, 0, 1},
		{"a sync on another node does not count", []*Op{write(100, 1, 2), sync(2, 3, 4), read(pageZero, 0, 7, 8)}, []int64{5}, 0, 0},
		{"a sync after the writer's dsmd died does not cover its writes", []*Op{write(100, 1, 2), op("w", 1, opMap, 0, 4, 4), sync(1, 5, 6), read(pageZero, 0, 7, 8)}, []int64{3}, 0, 0},
		{"a seq nobody wrote", []*Op{write(100, 1, 2), read(pageOK, 300, 3, 4)}, nil, 1, 0},
		{"a seq read before its write started", []*Op{read(pageOK, 300, 1, 2), write(300, 3, 4)}, nil, 1, 0},
		{"torn with nothing in flight", []*Op{write(100, 1, 2), read(pageTorn, 100, 3, 4)}, nil, 1, 0},
		{"torn while a write is in flight", []*Op{write(100, 1, 5), read(pageTorn, 100, 3, 4)}, nil, 0, 0},
		{"torn after a write that never returned", []*Op{{Proc: "w", Node: 1, Kind: opPageWrite, Addr: off, Arg: 5, Call: 1e6}, read(pageTorn, 5, 3, 4)}, nil, 0, 0},
		{"wrong page", []*Op{write(100, 1, 2), read(pageWrong, 100, 3, 4)}, nil, 1, 0},
	} {
		v := checkersOf(t, tc.ops, tc.losses...)
		if got := violations(v, "page"); got != tc.page {
			t.Errorf("%s: %d page violations, want %d: %+v", tc.name, got, tc.page, v.Violations)
		}
		if got := violations(v, "durability"); got != tc.durability {
			t.Errorf("%s: %d durability violations, want %d: %+v", tc.name, got, tc.durability, v.Violations)
		}
	}
}

func TestCountersAndMutex(t *testing.T) {
	w := counterWords[0]
	add := func(node int, out uint64, call, ret int64) *Op {
		o := op("a", node, opAdd, w, call, ret)
		o.Arg, o.Out = 1, out
		return o
	}
	final := func(v uint64) *Op {
		o := op("f", 1, opCount, w, 100, 101)
		o.Out, o.Final = v, true
		return o
	}
	failed := &Op{Proc: "a", Node: 1, Kind: opAdd, Addr: w, Call: 5e6, Return: 6e6, Err: "dsmd unavailable"}
	rmw := func(a, b uint64, call, ret int64) *Op {
		o := op("m", 1, opRMW, pairA, call, ret)
		o.Out, o.Out2 = a, b
		return o
	}
	pair := func(a, b uint64) *Op {
		o := op("f", 1, opPair, pairA, 100, 101)
		o.Out, o.Out2, o.Final = a, b, true
		return o
	}
	lockWords := func(ticket, serving uint64) *Op {
		o := op("f", 1, opLockWords, mutexOff, 100, 101)
		o.Out, o.Out2, o.Final = ticket, serving, true
		return o
	}
	waiting := &Op{Proc: "m", Kind: opRMW, Call: 5e6}
	for _, tc := range []struct {
		name                       string
		ops                        []*Op
		losses                     []int64
		counter, mutex, durability int
	}{
		{"lock words in step", []*Op{rmw(0, 0, 1, 2), pair(1, 1), lockWords(1, 1)}, nil, 0, 0, 0},
		{"a waiter holds a ticket", []*Op{rmw(0, 0, 1, 2), waiting, pair(1, 1), lockWords(2, 1)}, nil, 0, 0, 0},
		{"a ticket nobody took", []*Op{rmw(0, 0, 1, 2), waiting, pair(1, 1), lockWords(3, 1)}, nil, 0, 1, 0},
		{"an Unlock lost", []*Op{rmw(0, 0, 1, 2), rmw(1, 1, 3, 4), pair(2, 2), lockWords(2, 1)}, nil, 0, 1, 0},
		{"serving past the tickets", []*Op{rmw(0, 0, 1, 2), pair(1, 1), lockWords(1, 2)}, nil, 0, 1, 0},
		{"exact", []*Op{add(1, 1, 1, 2), add(2, 2, 3, 4), final(2)}, nil, 0, 0, 0},
		{"a failed add may count", []*Op{add(1, 1, 1, 2), failed, final(2)}, nil, 0, 0, 0},
		{"a failed add may not count", []*Op{add(1, 1, 1, 2), failed, final(1)}, nil, 0, 0, 0},
		{"invented", []*Op{add(1, 1, 1, 2), final(2)}, nil, 1, 0, 0},
		{"lost", []*Op{add(1, 1, 1, 2), add(2, 2, 3, 4), final(1)}, nil, 1, 0, 0},
		{"twice the same value", []*Op{add(1, 1, 1, 2), add(2, 1, 3, 4), final(2)}, nil, 1, 0, 0},
		{"unsynced adds lost with a dead dsmd", []*Op{add(1, 1, 1, 2), add(2, 2, 3, 4), final(0)}, []int64{50}, 0, 0, 0},
		{"synced adds lost", []*Op{add(1, 1, 1, 2), op("s", 1, opSync, 0, 3, 4), final(0)}, []int64{50}, 0, 0, 1},
		{"pair in step", []*Op{rmw(0, 0, 1, 2), rmw(1, 1, 3, 4), pair(2, 2)}, nil, 0, 0, 0},
		{"pair torn inside the lock", []*Op{rmw(0, 1, 1, 2), pair(1, 1)}, nil, 0, 1, 0},
		{"two sections read the same", []*Op{rmw(0, 0, 1, 2), rmw(0, 0, 3, 4), pair(1, 1)}, nil, 0, 2, 0},
		{"pair lost", []*Op{rmw(0, 0, 1, 2), rmw(1, 1, 3, 4), pair(1, 1)}, nil, 0, 1, 0},
		{"a failed Lock wrote nothing", []*Op{rmw(0, 0, 1, 2), {Proc: "m", Kind: opRMW, Call: 3e6, Return: 4e6, Err: "x", Status: rmwNoLock}, pair(2, 2)}, nil, 0, 1, 0},
	} {
		v := checkersOf(t, tc.ops, tc.losses...)
		if got := violations(v, "counter"); got != tc.counter {
			t.Errorf("%s: %d counter violations, want %d: %+v", tc.name, got, tc.counter, v.Violations)
		}
		if got := violations(v, "mutex"); got != tc.mutex {
			t.Errorf("%s: %d mutex violations, want %d: %+v", tc.name, got, tc.mutex, v.Violations)
		}
		if got := violations(v, "durability"); got != tc.durability {
			t.Errorf("%s: %d durability violations, want %d: %+v", tc.name, got, tc.durability, v.Violations)
		}
	}
}

func TestAvailability(t *testing.T) {
	faults := []Fault{{Kind: faultPause, Nodes: []int{1}, Start: 10e9, End: 20e9}}
	ops := []*Op{
		op("a", 1, opLoad, 0, 1000, 1001),                                         // none
		op("a", 1, opLoad, 0, 12000, 12500),                                       // pause
		{Proc: "a", Node: 1, Kind: opLoad, Call: 15e9},                            // pause, hung
		{Proc: "a", Node: 1, Kind: opAdd, Call: 24e9, Return: 24e9 + 1, Err: "x"}, // pause's recovery window
		op("a", 1, opLoad, 0, 40000, 40001),                                       // none
	}
	c := newChecker(ops, faults, nil, 60e9, 10*time.Second, t.TempDir())
	c.availability()
	got := map[string]KindStats{}
	for _, k := range c.v.Availability {
		got[k.Kind] = k
	}
	if n := got["none"]; n.Ops != 2 || n.Errors != 0 || n.Hung != 0 {
		t.Errorf("none: %+v", n)
	}
	if p := got[faultPause]; p.Ops != 3 || p.Errors != 1 || p.Hung != 1 || p.Faults != 1 || p.MaxLatencyMS != 45e3 {
		t.Errorf("pause: %+v", p)
	}
	if c.v.LongestWaitMS != 45e3 {
		t.Errorf("longest wait %v ms, want 45000", c.v.LongestWaitMS)
	}
}

func TestPageContent(t *testing.T) {
	p := make([]byte, pageSize)
	if st, seq := checkPage(p, 7); st != pageZero || seq != 0 {
		t.Fatalf("zero page: %s %d", st, seq)
	}
	fillPage(p, 7, 12345, 2)
	if st, seq := checkPage(p, 7); st != pageOK || seq != 12345 {
		t.Fatalf("written page: %s %d", st, seq)
	}
	if st, _ := checkPage(p, 8); st != pageWrong {
		t.Fatalf("page 7 read as page 8: %s", st)
	}
	q := make([]byte, pageSize)
	fillPage(q, 7, 999, 2)
	copy(p[pageSize/2:], q[pageSize/2:]) // half of one write, half of another
	if st, _ := checkPage(p, 7); st != pageTorn {
		t.Fatalf("half-and-half page: %s", st)
	}
}

func TestSchedule(t *testing.T) {
	kinds, err := ParseFaults("all")
	if err != nil {
		t.Fatal(err)
	}
	a := Schedule(7, 60*time.Second, kinds, 3, DefaultSpan)
	b := Schedule(7, 60*time.Second, kinds, 3, DefaultSpan)
	if !reflect.DeepEqual(a, b) || len(a) < 3 {
		t.Fatalf("schedule of seed 7 is not deterministic or too short: %v", a)
	}
	if reflect.DeepEqual(a, Schedule(8, 60*time.Second, kinds, 3, DefaultSpan)) {
		t.Fatal("seeds 7 and 8 give the same schedule")
	}
	var end time.Duration
	for _, f := range a {
		if f.At < end || f.At+f.For > 58*time.Second || len(f.Nodes) == 0 {
			t.Fatalf("fault %+v overlaps the previous one or ends too late", f)
		}
		end = f.At + f.For
		for _, n := range f.Nodes {
			if n < 1 || n > 4 || (n == 4) != (f.Kind == faultJoin) {
				t.Fatalf("fault %+v targets n%d", f, n)
			}
		}
		if f.Kind == faultBridge && (len(f.Sides[0]) == 0 || len(f.Sides[1]) == 0) {
			t.Fatalf("bridge without two sides: %+v", f)
		}
	}
	if _, err := ParseFaults("kill,nope"); err == nil {
		t.Fatal("an unknown fault kind is accepted")
	}
	if s, err := ParseSpan("300ms-1s"); err != nil || s != (Span{300 * time.Millisecond, time.Second}) {
		t.Fatalf("ParseSpan: %v %v", s, err)
	}
	if _, err := ParseSpan("2s-1s"); err == nil {
		t.Fatal("ParseSpan accepts MIN > MAX")
	}
}

func TestReadHistory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "n1g1.jsonl")
	rec := &recorder{now: func() int64 { return 5 }}
	var err error
	if rec.f, err = os.Create(path); err != nil {
		t.Fatal(err)
	}
	id := rec.call(record{Op: opStore, Addr: 8, Arg: 3})
	rec.ret(id, record{}, nil)
	id = rec.call(record{Op: opLoad, Addr: 8})
	rec.ret(id, record{Out: 3}, nil)
	rec.call(record{Op: opAdd, Addr: 16}) // never returns
	rec.f.WriteString(`{"k":"ret","id":`) // killed in the middle of a line
	rec.f.Close()
	ops, err := readHistory(path, "n1g1", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 3 || !ops[0].OK || ops[1].Out != 3 || !ops[2].Pending() || ops[2].Proc != "n1g1" {
		t.Fatalf("history: %+v %+v %+v", ops[0], ops[1], ops[2])
	}
}

func TestPicture(t *testing.T) {
	ops := []*Op{op("n1g1", 1, opLoad, 0, 1, 2), {Proc: "n2g1", Node: 2, Kind: opAdd, Call: 3e6, Return: 4e6, Err: "x"},
		{Proc: "n2g1", Node: 2, Kind: opLoad, Call: 5e6}}
	faults := []Fault{{Kind: faultKill, Nodes: []int{2}, Start: 2e6, End: 3e6}}
	var b bytes.Buffer
	err := picture(&b, "t", ops, faults, []event{{T: 2e6, What: evLoss}}, []Violation{{Checker: "page", What: "x", T: 4e6, Node: 2}}, 2, 0, 10e6, time.Second)
	if err != nil || !strings.HasPrefix(b.String(), "<svg") || !strings.Contains(b.String(), "kill n2") {
		t.Fatalf("picture: %v\n%s", err, b.String())
	}
}

// TestDeadCache: after a node's dsmd died, its client's operations until it
// notices succeed against the dead node's cache; they promise nothing.
func TestDeadCache(t *testing.T) {
	st := op("n3g1", 3, opStore, 0, 11, 12)
	st.Arg = 9
	ops := []*Op{
		st,                               // after n3's death at 10 ms, before its client noticed
		op("n3g1", 3, opMap, 0, 20, 21),  // noticed: maps again
		op("n1g1", 1, opLoad, 0, 30, 31), // the store is gone: 0
		op("n3g2", 3, opLoad, 0, 40, 41), // and stays gone
	}
	events := []event{{T: 10e6, What: evLoss, Node: 3}}
	v := newChecker(ops, nil, events, 1e12, 10*time.Second, t.TempDir()).check()
	if len(v.Violations) != 0 {
		t.Fatalf("a store into a dead node's cache counted as acknowledged: %+v", v.Violations)
	}
	if !st.Unacked || ops[2].Unacked {
		t.Fatalf("unacked: store %v, later load %v", st.Unacked, ops[2].Unacked)
	}
}

// TestRecovery: a cluster that did not become whole after the last heal is
// a violation; one that did is a note.
func TestRecovery(t *testing.T) {
	c := newChecker(nil, nil, nil, 1e12, 10*time.Second, t.TempDir())
	c.check()
	c.recovery([]event{{T: 5e9, What: evRecovered, Detail: "2.1s after the last heal"}})
	if len(c.v.Violations) != 0 || !slices.Contains(c.v.Notes, "recovered 2.1s after the last heal") {
		t.Fatalf("recovered: violations %+v, notes %q", c.v.Violations, c.v.Notes)
	}
	c.recovery([]event{{T: 5e9, What: evUnrecovered, Detail: "45s after the last heal: n2 sees no leader"}})
	if len(c.v.Violations) != 1 || c.v.Violations[0].Checker != "recovery" {
		t.Fatalf("not recovered: violations %+v", c.v.Violations)
	}
}

// TestTearAccount: a torn read whose bytes the client recorded is told
// part by part: the header and the first half of the body from the newer
// write, the rest from the older one, and what the worker's next read of
// the page found.
func TestTearAccount(t *testing.T) {
	off := pageOff(1, 0)
	page := pageIndex(off)
	write := func(seq uint64, call, ret int64) *Op {
		o := op("w", 1, opPageWrite, off, call, ret)
		o.Arg = seq
		return o
	}
	older, newer := make([]byte, pageSize), make([]byte, pageSize)
	fillPage(older, page, 100, 1)
	fillPage(newer, page, 200, 1)
	torn := append(slices.Clone(newer[:2048]), older[2048:]...)
	if st, _ := checkPage(torn, page); st != pageTorn {
		t.Fatalf("the test page is %s, want torn", st)
	}
	r := op("r", 2, opPageRead, off, 5, 6)
	r.Status, r.Out, r.Raw = pageTorn, 200, hex.EncodeToString(torn)
	again := op("r", 2, opPageRead, off, 7, 8)
	again.Status, again.Out = pageOK, 200
	v := checkersOf(t, []*Op{write(100, 1, 2), write(200, 3, 4), r, again})
	if violations(v, "page") != 1 {
		t.Fatalf("violations: %+v", v.Violations)
	}
	what := v.Violations[0].What
	for _, want := range []string{"0-7 seq 0xc8", "8-15 page number", "16-2047 seq 0xc8", "2048-4095 seq 0x64", "the next read by that worker, 0.001s later, found ok seq 0xc8"} {
		if !strings.Contains(what, want) {
			t.Errorf("the account lacks %q: %s", want, what)
		}
	}
	t.Log(what)
}

// TestPlacements: two nodes whose logs give one region's homes different
// digests for one protocol epoch are a violation; equal digests, another
// epoch and lines without a digest are not.
func TestPlacements(t *testing.T) {
	dir := t.TempDir()
	line := func(ts, epoch, digest string) string {
		l := `time=2026-12-04T12:31:` + ts + `Z level=INFO msg="region members changed" node=n1 part=engine region=chaos members="[n5 n6 n7 n8]" protocol_epoch=` + epoch
		if digest != "" {
			l += " homes=" + digest
		}
		return l + "\n"
	}
	logs := map[string]string{
		"n1": line("24.576", "e71", "00000000000000aa") + line("25.000", "e72", "00000000000000bb") + line("25.100", "e73", ""),
		"n2": line("24.580", "e71", "00000000000000aa") + line("25.002", "e72", "00000000000000cc") + line("25.101", "e73", ""),
		"n4": line("24.590", "e71", "00000000000000aa"),
	}
	for n, l := range logs {
		if err := os.MkdirAll(filepath.Join(dir, "nodes", n), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "nodes", n, "dsmd.log"), []byte(l), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := newChecker(nil, nil, nil, 1e12, 10*time.Second, dir)
	c.check()
	c.placements(dir)
	if len(c.v.Violations) != 1 {
		t.Fatalf("violations %+v, want one (epoch e72)", c.v.Violations)
	}
	v := c.v.Violations[0]
	if v.Checker != "placement" || !strings.Contains(v.What, "protocol epoch e72: n1 00000000000000bb, n2 00000000000000cc") || v.Node != 2 {
		t.Errorf("violation %+v", v)
	}
}
