package sim

import (
	"fmt"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/internal/ids"
)

// op is one completed request in the recorded history.
type op struct {
	client    int
	req       coherence.Request
	out       coherence.Completion
	call, ret int
}

type wordKey struct {
	page ids.PageNo
	off  int
}

// wordModel is the sequential specification of one 8-byte word under
// load, store, add and compare-and-swap.
var wordModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[wordKey][]porcupine.Operation{}
		var keys []wordKey
		for _, o := range h {
			k := wordKey{o.Input.(coherence.Request).Page, o.Input.(coherence.Request).Offset}
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], o)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() any { return uint64(0) },
	Step: func(state, input, output any) (bool, any) {
		v := state.(uint64)
		r := input.(coherence.Request)
		c := output.(coherence.Completion)
		switch r.Op {
		case coherence.OpLoad:
			return c.Value == v, v
		case coherence.OpStore:
			return true, r.Value
		case coherence.OpAdd:
			return c.Value == v, v + r.Value
		case coherence.OpCAS:
			if c.Value != v || c.Swapped != (v == r.Compare) {
				return false, v
			}
			if c.Swapped {
				return true, r.Value
			}
			return true, v
		}
		return false, v
	},
	DescribeOperation: func(input, output any) string {
		return fmt.Sprintf("%v %v", input.(coherence.Request).Op, output.(coherence.Completion))
	},
}

// checkLinearizable checks the history of word operations with porcupine.
// Call and return times are simulator steps; an operation that completes
// in the step that issued it has call == return.
func checkLinearizable(h []op) error {
	ops := make([]porcupine.Operation, 0, len(h))
	for _, o := range h {
		ops = append(ops, porcupine.Operation{
			ClientId: o.client - 1, Input: o.req, Output: o.out,
			Call: int64(2 * o.call), Return: int64(2*o.ret + 1),
		})
	}
	switch porcupine.CheckOperationsTimeout(wordModel, ops, 30*time.Second) {
	case porcupine.Illegal:
		return fmt.Errorf("linearizability: porcupine finds the history of %d operations not linearizable", len(ops))
	case porcupine.Unknown:
		return fmt.Errorf("linearizability: porcupine timed out on %d operations", len(ops))
	}
	return nil
}
