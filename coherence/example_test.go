package coherence_test

import (
	"encoding/binary"
	"fmt"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/internal/ids"
)

// execute runs a batch on a home slot (word at 0, page at 8) the way a
// one-sided transport does: in order, each verb on the span it names.
func execute(slot []byte, b coherence.Batch) []coherence.Result {
	res := make([]coherence.Result, len(b.Verbs))
	for i, v := range b.Verbs {
		span := slot[v.Span.Offset() : v.Span.Offset()+uint64(v.Span.Len(len(slot)-8))]
		switch v.Kind {
		case coherence.VerbRead:
			res[i].Data = append([]byte(nil), span...)
		case coherence.VerbWrite:
			copy(span, v.Data)
		case coherence.VerbCAS:
			old := binary.LittleEndian.Uint64(slot)
			if old == v.Compare {
				binary.LittleEndian.PutUint64(slot, v.Operand)
			}
			res[i].Word = old
		case coherence.VerbFAA:
			old := binary.LittleEndian.Uint64(slot)
			binary.LittleEndian.PutUint64(slot, old+v.Operand)
			res[i].Word = old
		}
	}
	return res
}

// Example drives three nodes by hand: node 1 is the home of page 0, node 2
// reads it, node 3 writes it, node 2 reads it again. Every batch executes
// at once and every message arrives at once; the node layer does the same
// with rdma Post and Send.
func Example() {
	const pageSize = 16
	members := []ids.NodeID{1, 2, 3}
	slot := make([]byte, 8+pageSize)
	binary.LittleEndian.PutUint64(slot, uint64(coherence.InitialWord(1)))
	nodes := map[ids.NodeID]*coherence.Node{}
	for _, id := range members {
		n, err := coherence.NewNode(coherence.Config{
			ID: id, PageSize: pageSize, Epoch: 1, Members: members,
			HomeOf: func(ids.PageNo) ids.NodeID { return 1 },
		})
		if err != nil {
			panic(err)
		}
		nodes[id] = n
	}
	// run executes what node id asks until nothing is left.
	var run func(id ids.NodeID)
	run = func(id ids.NodeID) {
		for {
			rd := nodes[id].Ready()
			if rd.Empty() {
				return
			}
			for _, b := range rd.Batches {
				fmt.Printf("%v: %v\n", id, b)
				_ = nodes[id].Step(coherence.VerbsDone{ID: b.ID, Results: execute(slot, b)})
			}
			for _, m := range rd.Messages {
				fmt.Printf("%v: %v\n", id, m)
				wire := m.Marshal()
				got, err := coherence.Unmarshal(wire)
				if err != nil {
					panic(err)
				}
				_ = nodes[m.To].Step(coherence.Receive{Msg: got})
				run(m.To)
			}
			for _, c := range rd.Completions {
				fmt.Printf("%v: %v\n", id, c)
			}
		}
	}
	step := func(id ids.NodeID, r coherence.Request) {
		_ = nodes[id].Step(r)
		run(id)
	}
	step(2, coherence.Request{ID: 1, Op: coherence.OpLoad, Page: 0})
	step(3, coherence.Request{ID: 2, Op: coherence.OpStore, Page: 0, Value: 42})
	step(2, coherence.Request{ID: 3, Op: coherence.OpLoad, Page: 0})
	for i := 0; i < 8; i++ { // the reader backs off, then retries
		for _, id := range members {
			_ = nodes[id].Step(coherence.Tick{})
			run(id)
		}
	}
	// Output:
	// n2: batch#1 ->n1 [FAA p0 word +0x20000000000; READ p0 page; READ p0 word]
	// n2: done#1 load p0+0 =0
	// n3: batch#1 ->n1 [CAS p0 word {M=n- R=n- v=0 t=1 S=0x0 C=0}->{M=n3 R=n- v=1 t=1 S=0x0 C=0}; READ p0 page]
	// n3: batch#2 ->n1 [CAS p0 word {M=n- R=n- v=0 t=1 S=0x2 C=0}->{M=n3 R=n- v=1 t=1 S=0x0 C=0}; READ p0 page]
	// n3: inv n3->n2 e1 p0 v=1
	// n2: ack n2->n3 e1 p0 v=1
	// n3: done#2 store p0+0
	// n2: batch#2 ->n1 [FAA p0 word +0x20000000000; READ p0 page; READ p0 word]
	// n2: recall n2->n3 e1 p0 v=1 read
	// n3: batch#3 ->n1 [WRITE p0 page; CAS p0 word {M=n3 R=n- v=1 t=1 S=0x0 C=0}->{M=n- R=n- v=1 t=1 S=0x4 C=0}]
	// n3: batch#4 ->n1 [CAS p0 word {M=n3 R=n- v=1 t=1 S=0x2 C=0}->{M=n- R=n- v=1 t=1 S=0x6 C=0}]
	// n2: batch#3 ->n1 [READ p0 word; READ p0 page; READ p0 word]
	// n2: done#3 load p0+0 =42
}
