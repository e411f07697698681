package fault_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/fault"
	"github.com/dsmkit/dsm/rdma/mem"
	"github.com/dsmkit/dsm/rdma/rdmatest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func wrapped(t testing.TB, n int) []*fault.Transport {
	net := mem.NewNetwork()
	ts := make([]*fault.Transport, n)
	for i := range ts {
		ep, err := net.Endpoint(ids.NodeID(i + 1))
		if err != nil {
			t.Fatal(err)
		}
		ts[i] = fault.Wrap(ep, uint64(i))
	}
	return ts
}

// With no rules the wrapper is transparent: it passes the whole suite.
func TestConformance(t *testing.T) {
	rdmatest.Run(t, rdmatest.Backend{Name: "fault(mem)", New: func(t testing.TB, n int) []rdma.Transport {
		var out []rdma.Transport
		for _, f := range wrapped(t, n) {
			out = append(out, f)
		}
		return out
	}})
}

func counter(t *testing.T, tr rdma.Transport) (rdma.Registration, rdma.RKey) {
	t.Helper()
	b, err := rdma.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := tr.Register(b, rdma.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Deregister(); rdma.Free(b) })
	return reg, reg.Descriptor().RKey
}

func closeAll(t *testing.T, ts []*fault.Transport) {
	t.Cleanup(func() {
		for _, tr := range ts {
			tr.Close()
		}
	})
}

func TestDropByKindAndPeer(t *testing.T) {
	ts := wrapped(t, 3)
	closeAll(t, ts)
	reg2, rk2 := counter(t, ts[1])
	reg3, rk3 := counter(t, ts[2])
	if err := ts[0].SetRules(fault.Rule{Traffic: fault.Ops, Action: fault.Drop, Peer: 2, Kind: rdma.OpCAS, Prob: 1}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ops := []rdma.Op{{Kind: rdma.OpFAA, RKey: rk2, Operand: 1}, {Kind: rdma.OpCAS, RKey: rk2, Offset: 8, Operand: 1}}
	err := ts[0].Post(ctx, 2, ops)
	if !errors.Is(err, fault.ErrInjected) || !errors.Is(err, rdma.ErrPeerUnreachable) {
		t.Fatalf("batch with a CAS to n2: %v, want an injected unreachable error", err)
	}
	if rdma.LoadWord(reg2.Bytes(), 0) != 0 {
		t.Error("an operation of a dropped batch executed")
	}
	// Other kinds to n2, and CAS to n3, pass.
	if err := ts[0].Post(ctx, 2, ops[:1]); err != nil {
		t.Errorf("FAA to n2: %v", err)
	}
	if err := ts[0].Post(ctx, 3, []rdma.Op{{Kind: rdma.OpCAS, RKey: rk3, Operand: 1}}); err != nil || rdma.LoadWord(reg3.Bytes(), 0) != 1 {
		t.Errorf("CAS to n3: %v", err)
	}
	if s := ts[0].Stats(); s.DroppedBatches != 1 {
		t.Errorf("stats %+v, want one dropped batch", s)
	}
}

// The same seed makes the same choices.
func TestSeededProbability(t *testing.T) {
	run := func(seed uint64) []bool {
		net := mem.NewNetwork()
		a, _ := net.Endpoint(1)
		b, _ := net.Endpoint(2)
		defer b.Close()
		f := fault.Wrap(a, seed)
		defer f.Close()
		reg, rk := counter(t, b)
		_ = reg
		f.SetRules(fault.Rule{Traffic: fault.Ops, Action: fault.Drop, Prob: 0.5})
		var out []bool
		for i := 0; i < 200; i++ {
			out = append(out, f.Post(context.Background(), 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}) == nil)
		}
		return out
	}
	a, b, c := run(7), run(7), run(8)
	same, diff, ok := true, false, 0
	for i := range a {
		same = same && a[i] == b[i]
		diff = diff || a[i] != c[i]
		if a[i] {
			ok++
		}
	}
	if !same {
		t.Error("same seed, different choices")
	}
	if !diff {
		t.Error("different seeds made identical choices over 200 draws")
	}
	if ok < 60 || ok > 140 {
		t.Errorf("%d of 200 batches passed at p=0.5", ok)
	}
}

type inbox struct {
	mu   sync.Mutex
	msgs []string
	cond chan struct{}
}

func newInbox(tr rdma.Transport) *inbox {
	in := &inbox{cond: make(chan struct{}, 1000)}
	tr.SetHandler(func(from ids.NodeID, msg []byte) {
		in.mu.Lock()
		in.msgs = append(in.msgs, string(msg))
		in.mu.Unlock()
		in.cond <- struct{}{}
	})
	return in
}

func (in *inbox) wait(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		in.mu.Lock()
		got := append([]string(nil), in.msgs...)
		in.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-in.cond:
		case <-deadline:
			t.Fatalf("got %v, waiting for %d messages", got, n)
		}
	}
}

func TestMessageFaults(t *testing.T) {
	ts := wrapped(t, 2)
	closeAll(t, ts)
	in := newInbox(ts[1])
	ctx := context.Background()
	send := func(s string) {
		if err := ts[0].Send(ctx, 2, []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	ts[0].SetRules(fault.Rule{Traffic: fault.Messages, Action: fault.Duplicate, Prob: 1})
	send("dup")
	ts[0].SetRules(fault.Rule{Traffic: fault.Messages, Action: fault.Drop, Prob: 1})
	send("lost")
	ts[0].SetRules(fault.Rule{Traffic: fault.Messages, Action: fault.Reorder, Prob: 1, Delay: time.Hour})
	send("first")
	ts[0].SetRules()
	send("second")
	ts[0].SetRules(fault.Rule{Traffic: fault.Messages, Action: fault.Delay, Prob: 1, Delay: time.Millisecond})
	send("late")
	got := in.wait(t, 5)
	want := []string{"dup", "dup", "second", "first", "late"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	s := ts[0].Stats()
	if s.DuplicatedMsgs != 1 || s.DroppedMessages != 1 || s.ReorderedMsgs != 1 || s.DelayedMessages != 1 {
		t.Errorf("stats %+v", s)
	}
}

// A held message is released by its timer when no later message comes.
func TestReorderTimeout(t *testing.T) {
	ts := wrapped(t, 2)
	closeAll(t, ts)
	in := newInbox(ts[1])
	ts[0].SetRules(fault.Rule{Traffic: fault.Messages, Action: fault.Reorder, Prob: 1, Delay: time.Millisecond})
	ts[0].Send(context.Background(), 2, []byte("alone"))
	if got := in.wait(t, 1); got[0] != "alone" {
		t.Errorf("got %v", got)
	}
}

func TestPartition(t *testing.T) {
	ts := wrapped(t, 2)
	closeAll(t, ts)
	reg, rk := counter(t, ts[1])
	in0, in1 := newInbox(ts[0]), newInbox(ts[1])
	ctx := context.Background()
	ts[0].Partition(2)
	ts[1].Partition(1)
	if err := ts[0].Post(ctx, 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}); !errors.Is(err, rdma.ErrPeerUnreachable) {
		t.Errorf("Post across a partition: %v", err)
	}
	ts[0].Send(ctx, 2, []byte("cut"))
	ts[1].Send(ctx, 1, []byte("cut"))
	ts[0].Heal(2)
	ts[1].Heal(1)
	if err := ts[0].Post(ctx, 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}); err != nil || rdma.LoadWord(reg.Bytes(), 0) != 1 {
		t.Errorf("Post after heal: %v", err)
	}
	ts[0].Send(ctx, 2, []byte("healed"))
	ts[1].Send(ctx, 1, []byte("healed"))
	if got := in1.wait(t, 1); len(got) != 1 || got[0] != "healed" {
		t.Errorf("n2 received %v", got)
	}
	if got := in0.wait(t, 1); len(got) != 1 || got[0] != "healed" {
		t.Errorf("n1 received %v", got)
	}
}

func TestInvalidRules(t *testing.T) {
	ts := wrapped(t, 1)
	closeAll(t, ts)
	for _, r := range []fault.Rule{
		{Traffic: fault.Ops, Action: fault.Duplicate, Prob: 1},
		{Traffic: fault.Ops, Action: fault.Reorder, Prob: 1},
		{Traffic: fault.Messages, Action: fault.Drop, Prob: 2},
		{Traffic: fault.Messages, Action: fault.Delay, Prob: 1},
		{Action: fault.Drop, Prob: 1},
		{Traffic: fault.Ops, Prob: 1},
	} {
		if err := ts[0].SetRules(r); err == nil {
			t.Errorf("rule %+v accepted", r)
		}
	}
}

// LoseResponse executes the batch and reports an unknown outcome;
// LoseRequest reports the same without executing it. Neither applies to
// messages.
func TestLoseResponseAndRequest(t *testing.T) {
	ts := wrapped(t, 2)
	closeAll(t, ts)
	reg, rk := counter(t, ts[1])
	ctx := context.Background()
	for _, c := range []struct {
		action fault.Action
		want   uint64 // the counter after the batch
	}{{fault.LoseResponse, 1}, {fault.LoseRequest, 1}} {
		if err := ts[0].SetRules(fault.Rule{Traffic: fault.Ops, Action: c.action, Prob: 1}); err != nil {
			t.Fatal(err)
		}
		ops := []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}
		err := ts[0].Post(ctx, 2, ops)
		if !errors.Is(err, rdma.ErrOutcomeUnknown) || !errors.Is(err, rdma.ErrPeerUnreachable) || !errors.Is(err, fault.ErrInjected) {
			t.Errorf("action %d: Post = %v, want an injected ErrOutcomeUnknown", c.action, err)
		}
		if !errors.Is(ops[0].Err, rdma.ErrOutcomeUnknown) {
			t.Errorf("action %d: op error %v", c.action, ops[0].Err)
		}
		if got := rdma.LoadWord(reg.Bytes(), 0); got != c.want {
			t.Errorf("action %d: counter %d, want %d", c.action, got, c.want)
		}
	}
	if s := ts[0].Stats(); s.LostResponses != 1 || s.LostRequests != 1 {
		t.Errorf("stats %+v", s)
	}
	for _, a := range []fault.Action{fault.LoseResponse, fault.LoseRequest} {
		if err := ts[0].SetRules(fault.Rule{Traffic: fault.Messages, Action: a, Prob: 1}); err == nil {
			t.Errorf("action %d accepted for messages", a)
		}
	}
}
