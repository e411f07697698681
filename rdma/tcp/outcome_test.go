package tcp_test

// Exactly-once execution across broken connections: the cut proxy of
// proxy_test.go drops a response after the target executed its batch (or
// cuts at random), and the transport must finish every batch exactly once
// or say that its outcome is unknown.

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/tcp"
)

func listenCfg(t *testing.T, id ids.NodeID, cfg tcp.Config) *tcp.Transport {
	t.Helper()
	tr, err := tcp.Listen(id, "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// behindProxy starts node 1 and node 2 with node 1 reaching node 2 through
// a cut proxy, connected, and returns them with a registration at node 2.
func behindProxy(t *testing.T, seed uint64) (a, b *tcp.Transport, p *cutProxy, reg rdma.Registration) {
	return behindProxyCfg(t, seed, tcp.Config{})
}

// behindProxyCfg is behindProxy with node 2's configuration.
func behindProxyCfg(t *testing.T, seed uint64, cfg tcp.Config) (a, b *tcp.Transport, p *cutProxy, reg rdma.Registration) {
	t.Helper()
	b = listenCfg(t, 2, cfg)
	reg = register(t, b, 1<<16)
	p = newCutProxy(t, b.Addr(), seed)
	a = listenCfg(t, 1, tcp.Config{RetryWindow: hang})
	if err := a.AddPeer(2, p.addr()); err != nil {
		t.Fatal(err)
	}
	warm := []rdma.Op{{Kind: rdma.OpRead, RKey: reg.Descriptor().RKey, Buf: make([]byte, 8)}}
	if err := a.Post(ctxT(t), 2, warm); err != nil {
		t.Fatal(err)
	}
	return a, b, p, reg
}

// An FAA whose response is lost after the target executed it is applied
// once, and Post returns the word from before the add.
func TestFAAExactlyOnceWhenResponseLost(t *testing.T) {
	a, _, p, reg := behindProxy(t, 1)
	rdma.StoreWord(reg.Bytes(), 0, 41)
	p.arm(nil)
	ops := []rdma.Op{{Kind: rdma.OpFAA, RKey: reg.Descriptor().RKey, Operand: 5}}
	if err := a.Post(ctxT(t), 2, ops); err != nil {
		t.Fatalf("Post across a lost response: %v", err)
	}
	if p.cuts.Load() != 1 {
		t.Fatalf("%d cuts, want 1", p.cuts.Load())
	}
	if ops[0].Result != 41 || ops[0].Err != nil {
		t.Errorf("FAA result %d (err %v), want 41", ops[0].Result, ops[0].Err)
	}
	if w := rdma.LoadWord(reg.Bytes(), 0); w != 46 {
		t.Errorf("word %d after one FAA of 5 on 41, want 46", w)
	}
}

// A batch that changed memory and read it is answered, after its response
// was lost, with what it read when it executed; its WRITE does not
// execute again over what changed since.
func TestBatchAnsweredFromRecord(t *testing.T) {
	a, _, p, reg := behindProxy(t, 2)
	mem := reg.Bytes()
	rk := reg.Descriptor().RKey
	p.arm(func() {
		// The batch executed; its response is being dropped. Memory
		// changes before the requester comes back.
		copy(mem[64:], "ZZZZZZZZ")
		copy(mem[128:], "changed!")
	})
	ops := []rdma.Op{
		{Kind: rdma.OpWrite, RKey: rk, Offset: 64, Buf: []byte("abcdefgh")},
		{Kind: rdma.OpFAA, RKey: rk, Offset: 0, Operand: 1},
		{Kind: rdma.OpRead, RKey: rk, Offset: 0, Buf: make([]byte, 256)},
	}
	if err := a.Post(ctxT(t), 2, ops); err != nil {
		t.Fatalf("Post across a lost response: %v", err)
	}
	if p.cuts.Load() != 1 {
		t.Fatalf("%d cuts, want 1", p.cuts.Load())
	}
	read := ops[2].Buf
	if ops[1].Result != 0 || rdma.LoadWord(read, 0) != 1 || string(read[64:72]) != "abcdefgh" || !bytes.Equal(read[128:136], make([]byte, 8)) {
		t.Errorf("answer FAA %d, READ word %d, bytes %q and %q: not what the batch saw when it executed",
			ops[1].Result, rdma.LoadWord(read, 0), read[64:72], read[128:136])
	}
	if w := rdma.LoadWord(mem, 0); w != 1 {
		t.Errorf("word %d, want 1", w)
	}
	if string(mem[64:72]) != "ZZZZZZZZ" {
		t.Errorf("memory at 64 is %q: the WRITE executed again", mem[64:72])
	}
}

// Many batches in flight while the proxy cuts connections at random: every
// FAA executes exactly once, so a counter ends at exactly the number of
// FAAs posted and every pre-add value is seen once.
func TestCounterExactUnderRandomCuts(t *testing.T) {
	a, _, p, reg := behindProxy(t, 3)
	rk := reg.Descriptor().RKey
	p.setProb(0.1)
	const workers, each = 24, 80
	const n = workers * each
	results := make(chan uint64, n)
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				// Alternate a lone FAA with a batch that also reads the
				// worker's own word after adding to it.
				ops := []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}
				own := uint64(8 * (w + 1))
				if i%2 == 1 {
					ops = append(ops,
						rdma.Op{Kind: rdma.OpFAA, RKey: rk, Offset: own, Operand: 1},
						rdma.Op{Kind: rdma.OpRead, RKey: rk, Offset: own, Buf: make([]byte, 8)})
				}
				// A caller that posts again whatever certainly did not
				// execute, as the coherence protocol does.
				var err error
				for try := 0; try < 100; try++ {
					if err = a.Post(ctxT(t), 2, ops); err == nil || errors.Is(err, rdma.ErrOutcomeUnknown) {
						break
					}
				}
				if err != nil {
					errc <- fmt.Errorf("worker %d, FAA %d: %w", w, i, err)
					return
				}
				results <- ops[0].Result
				if len(ops) > 1 {
					if got := rdma.LoadWord(ops[2].Buf, 0); got != ops[1].Result+1 {
						errc <- fmt.Errorf("worker %d: READ after its FAA saw %d, the FAA returned %d", w, got, ops[1].Result)
						return
					}
				}
			}
		}(w)
	}
	wg.Wait()
	close(results)
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	seen := make(map[uint64]bool, n)
	for r := range results {
		if seen[r] {
			t.Errorf("pre-add value %d returned twice: an FAA executed twice", r)
		}
		seen[r] = true
	}
	if got := rdma.LoadWord(reg.Bytes(), 0); got != n {
		t.Errorf("counter %d after %d FAAs", got, n)
	}
	for w := 0; w < workers; w++ {
		if got := rdma.LoadWord(reg.Bytes(), uint64(8*(w+1))); got != each/2 {
			t.Errorf("worker %d's counter %d after %d FAAs", w, got, each/2)
		}
	}
	t.Logf("%d cuts", p.cuts.Load())
	if p.cuts.Load() == 0 {
		t.Error("the proxy never cut")
	}
}

// A responder that restarts while a batch is in flight: the batch executed
// at the old incarnation and its response was lost. The new incarnation
// (whose registrations reuse the old keys here: Config.FirstKey; by
// default they differ) must not execute it: the
// requester learns from the handshake that the peer is another
// incarnation and fails the batch with ErrOutcomeUnknown, so that a caller
// that posts again what certainly did not execute does not post it.
func TestResponderRestartNotAppliedTwice(t *testing.T) {
	a, b, p, reg := behindProxyCfg(t, 4, tcp.Config{FirstKey: 1})
	rk := reg.Descriptor().RKey
	var b2 *tcp.Transport
	var reg2 rdma.Registration
	p.arm(func() {
		b.Close()
		b2 = listenCfg(t, 2, tcp.Config{FirstKey: 1})
		reg2 = register(t, b2, 1<<16)
		p.setTarget(b2.Addr())
	})
	ops := []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}
	var err error
	for try := 0; try < 3; try++ {
		if err = a.Post(ctxT(t), 2, ops); err == nil || errors.Is(err, rdma.ErrOutcomeUnknown) {
			break
		}
	}
	if reg2 == nil {
		t.Fatal("the proxy did not cut")
	}
	if reg2.Descriptor().RKey != rk {
		t.Fatalf("the new incarnation's key %v differs from the old %v: the test needs them equal", reg2.Descriptor().RKey, rk)
	}
	if got := rdma.LoadWord(reg.Bytes(), 0); got != 1 {
		t.Errorf("old incarnation's word %d, want 1 (it executed the FAA)", got)
	}
	if got := rdma.LoadWord(reg2.Bytes(), 0); got != 0 {
		t.Errorf("new incarnation's word %d: the batch of the old session executed there too", got)
	}
	if !errors.Is(err, rdma.ErrOutcomeUnknown) || !errors.Is(err, rdma.ErrPeerUnreachable) || !errors.Is(ops[0].Err, rdma.ErrOutcomeUnknown) {
		t.Errorf("Post = %v (op %v), want ErrOutcomeUnknown and ErrPeerUnreachable", err, ops[0].Err)
	}
	// The new incarnation serves new batches.
	ops = []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}
	if err := a.Post(ctxT(t), 2, ops); err != nil {
		t.Fatal(err)
	}
	if got := rdma.LoadWord(reg2.Bytes(), 0); got != 1 || ops[0].Result != 0 {
		t.Errorf("new incarnation's word %d (FAA returned %d), want 1 (0)", got, ops[0].Result)
	}
	_ = b2
}

// A restarted process numbers its keys from another random start: a batch
// that names the previous process's memory fails at the new one with
// ErrUnknownKey (the engine posts again where its configuration says)
// instead of reaching memory that happens to carry the same key.
func TestRestartedResponderKeysDiffer(t *testing.T) {
	b := listen(t, 2, "127.0.0.1:0")
	addr := b.Addr()
	rk := register(t, b, 4096).Descriptor().RKey
	b.Close()
	b2 := listen(t, 2, addr)
	reg2 := register(t, b2, 4096)
	if reg2.Descriptor().RKey == rk {
		t.Fatalf("the new incarnation's first key %v equals the old one's", rk)
	}
	a := listen(t, 1, "127.0.0.1:0")
	if err := a.AddPeer(2, b2.Addr()); err != nil {
		t.Fatal(err)
	}
	ops := []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}
	if err := a.Post(ctxT(t), 2, ops); !errors.Is(err, rdma.ErrUnknownKey) {
		t.Fatalf("a batch naming the old incarnation's key: %v, want ErrUnknownKey", err)
	}
	if got := rdma.LoadWord(reg2.Bytes(), 0); got != 0 {
		t.Fatalf("the new incarnation's word is %d", got)
	}
}

// With no retry window a lost response fails the batch at once with
// ErrOutcomeUnknown; a peer that cannot be reached before anything was
// sent fails it without.
func TestOutcomeUnknownOnlyWhenSent(t *testing.T) {
	b := listen(t, 2, "127.0.0.1:0")
	reg := register(t, b, 4096)
	rk := reg.Descriptor().RKey
	p := newCutProxy(t, b.Addr(), 5)
	a := listenCfg(t, 1, tcp.Config{RetryWindow: -1})
	a.AddPeer(2, p.addr())
	post := func() error {
		return a.Post(ctxT(t), 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}})
	}
	if err := post(); err != nil {
		t.Fatal(err)
	}
	p.arm(nil)
	if err := post(); !errors.Is(err, rdma.ErrOutcomeUnknown) || !errors.Is(err, rdma.ErrPeerUnreachable) {
		t.Errorf("Post whose response was lost, no retry window: %v, want ErrOutcomeUnknown", err)
	}
	if got := rdma.LoadWord(reg.Bytes(), 0); got != 2 {
		t.Errorf("word %d, want 2", got)
	}
	p.close()
	c := listenCfg(t, 3, tcp.Config{RetryWindow: -1})
	c.AddPeer(2, p.addr())
	err := c.Post(ctxT(t), 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}})
	if !errors.Is(err, rdma.ErrPeerUnreachable) || errors.Is(err, rdma.ErrOutcomeUnknown) {
		t.Errorf("Post to an address nobody listens on: %v, want ErrPeerUnreachable without ErrOutcomeUnknown", err)
	}
}
