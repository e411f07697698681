package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// wordEvent is one line of `dsmclient history` (its Event).
type wordEvent struct {
	Client  int    `json:"client"`
	Kind    string `json:"kind"`
	Off     int64  `json:"off"`
	Value   uint64 `json:"value"`
	Old     uint64 `json:"old"`
	Out     uint64 `json:"out"`
	Swapped bool   `json:"swapped"`
	Call    int64  `json:"call"`
	Return  int64  `json:"return"`
}

// wordModel is the sequential specification of independent 8-byte words,
// each starting at 0, under load, store and compare-and-swap (which
// reports only whether it swapped).
var wordModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		return partitionByOff(h, func(in any) int64 { return in.(wordEvent).Off })
	},
	Init: func() any { return uint64(0) },
	Step: func(state, input, _ any) (bool, any) {
		v, e := state.(uint64), input.(wordEvent)
		switch e.Kind {
		case "load":
			return e.Out == v, v
		case "store":
			return true, e.Value
		case "cas":
			if e.Swapped != (v == e.Old) {
				return false, v
			}
			if e.Swapped {
				return true, e.Value
			}
			return true, v
		}
		return false, v
	},
	DescribeOperation: func(input, _ any) string {
		e := input.(wordEvent)
		switch e.Kind {
		case "load":
			return fmt.Sprintf("c%d load @%d -> %#x", e.Client, e.Off, e.Out)
		case "store":
			return fmt.Sprintf("c%d store @%d %#x", e.Client, e.Off, e.Value)
		}
		return fmt.Sprintf("c%d cas @%d %#x->%#x: %v", e.Client, e.Off, e.Old, e.Value, e.Swapped)
	},
}

// parseHistory decodes the JSON lines of dsmclient history runs.
func parseHistory(outs []string) ([]wordEvent, error) {
	var h []wordEvent
	for _, out := range outs {
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if l == "" {
				continue
			}
			var e wordEvent
			if err := json.Unmarshal([]byte(l), &e); err != nil {
				return nil, fmt.Errorf("history line %q: %v", l, err)
			}
			if e.Return < e.Call {
				return nil, fmt.Errorf("history line %q returns before its call", l)
			}
			h = append(h, e)
		}
	}
	return h, nil
}

// checkHistory runs porcupine on h; with viz, a non-linearizable history
// is written as an HTML visualization into a new directory under
// $TMPDIR, kept after the test.
func checkHistory(h []wordEvent, viz bool) error {
	ops := make([]porcupine.Operation, len(h))
	for i, e := range h {
		ops[i] = porcupine.Operation{ClientId: e.Client, Input: e, Call: e.Call, Output: nil, Return: e.Return}
	}
	res, info := porcupine.CheckOperationsVerbose(wordModel, ops, 30*time.Second)
	switch res {
	case porcupine.Ok:
		return nil
	case porcupine.Unknown:
		return fmt.Errorf("porcupine timed out on %d operations", len(ops))
	}
	if viz {
		if dir, err := os.MkdirTemp("", "dsm-history-"); err == nil {
			path := filepath.Join(dir, "history.html")
			if err := porcupine.VisualizePath(wordModel, info, path); err == nil {
				return fmt.Errorf("history of %d operations is not linearizable (visualization: %s)", len(ops), path)
			}
		}
	}
	return fmt.Errorf("history of %d operations is not linearizable", len(ops))
}

// TestWordModelRejects checks the checker: histories that no single word
// allows are rejected, and their legal twins accepted.
func TestWordModelRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    []wordEvent
		ok   bool
	}{
		{"stale read after store", []wordEvent{
			{Client: 1, Kind: "store", Value: 5, Call: 1, Return: 2},
			{Client: 2, Kind: "load", Out: 0, Call: 3, Return: 4},
		}, false},
		{"read of the store", []wordEvent{
			{Client: 1, Kind: "store", Value: 5, Call: 1, Return: 2},
			{Client: 2, Kind: "load", Out: 5, Call: 3, Return: 4},
		}, true},
		{"concurrent read may miss the store", []wordEvent{
			{Client: 1, Kind: "store", Value: 5, Call: 1, Return: 4},
			{Client: 2, Kind: "load", Out: 0, Call: 2, Return: 3},
		}, true},
		{"two cas from the same old both swap", []wordEvent{
			{Client: 1, Kind: "cas", Old: 0, Value: 7, Swapped: true, Call: 1, Return: 4},
			{Client: 2, Kind: "cas", Old: 0, Value: 8, Swapped: true, Call: 2, Return: 3},
		}, false},
		{"cas fails on the right value", []wordEvent{
			{Client: 1, Kind: "cas", Old: 0, Value: 7, Swapped: false, Call: 1, Return: 2},
		}, false},
		{"words are independent", []wordEvent{
			{Client: 1, Kind: "store", Off: 8, Value: 5, Call: 1, Return: 2},
			{Client: 2, Kind: "load", Off: 0, Out: 0, Call: 3, Return: 4},
		}, true},
	} {
		err := checkHistory(tc.h, false)
		if (err == nil) != tc.ok {
			t.Errorf("%s: checker says %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// (h) Load, Store and CAS from clients on every node at once, on two words
// of one page and one word of another, form a linearizable history.
func testLinearizable(t *testing.T, c *dsmCluster) {
	const region, n = "lin", 100
	c.createRegion(t, 1, region, 1<<20)
	nodes := []int{1, 2, 3, 3}
	seed := time.Now().UnixNano() % 1000000
	t.Logf("seed %d", seed)
	outs := runAll(t, c, region, nodes, func(i int) []string {
		return []string{"-id", fmt.Sprint(i + 1), "history", fmt.Sprint(n), fmt.Sprint(seed), "0", "8", "8192"}
	})
	h, err := parseHistory(outs)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != len(nodes)*n {
		t.Fatalf("%d operations recorded, want %d", len(h), len(nodes)*n)
	}
	swapped, loads := 0, 0
	for _, e := range h {
		if e.Swapped {
			swapped++
		}
		if e.Kind == "load" && e.Out != 0 {
			loads++
		}
	}
	t.Logf("%d operations, %d successful cas, %d loads of a non-zero value", len(h), swapped, loads)
	if err := checkHistory(h, true); err != nil {
		t.Fatal(err)
	}
}

// partitionByOff splits a history into one per word: independent words
// are checked apart (off reads an operation's input's offset), in the
// order each word first appears.
func partitionByOff(h []porcupine.Operation, off func(input any) int64) [][]porcupine.Operation {
	by := map[int64][]porcupine.Operation{}
	var offs []int64
	for _, o := range h {
		k := off(o.Input)
		if _, ok := by[k]; !ok {
			offs = append(offs, k)
		}
		by[k] = append(by[k], o)
	}
	out := make([][]porcupine.Operation, 0, len(offs))
	for _, k := range offs {
		out = append(out, by[k])
	}
	return out
}
