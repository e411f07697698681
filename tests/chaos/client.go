package chaos

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/dsmkit/dsm/dsm"
)

// ClientMain is the workload client, `chaos client FLAGS`: a process that
// runs on one node (inside its network namespace), talks to that node's
// dsmd over its Unix socket with the public dsm API only, and records every
// operation in its history file. The harness starts it; it is not meant to
// be run by hand. It returns the exit status.
//
// With -final it maps the region, reads every item once (registers,
// counters, the pair, every checksummed page) and exits: the final check.
// Otherwise it runs its workers until SIGTERM: two register workers (loads,
// stores and compare-and-swaps through Bytes() with sync/atomic), a page
// writer (WriteAt of its node's checksummed pages), a page reader (ReadAt of
// every node's pages), a counter worker (AddUint64), a lock worker
// (Mutex-protected read-modify-write of the pair through Bytes()) and a
// syncer (Sync every second). When the mapping dies (dsmd went away) it
// maps the region again, recording each attempt as a "map" operation.
func ClientMain(args []string) int {
	fs := flag.NewFlagSet("chaos client", flag.ContinueOnError)
	socket := fs.String("socket", "", "the node's dsmd socket")
	node := fs.Int("node", 0, "the node's id")
	gen := fs.Int("gen", 1, "this client's life on the node (1, 2, ... after restarts)")
	out := fs.String("out", "", "the history file to append to")
	nodes := fs.Int("nodes", 3, "read the checksummed pages of nodes 1..N")
	seed := fs.Uint64("seed", 1, "seed of the workload's choices")
	rate := fs.Float64("rate", 1, "scale of every worker's operation rate")
	deadline := fs.Duration("op-deadline", 10*time.Second, "context deadline of operations that take one")
	final := fs.Bool("final", false, "read every item once and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *socket == "" || *node < 1 || *node > maxNodes || *out == "" || *nodes < 1 || *nodes > maxNodes || *rate <= 0 {
		fmt.Fprintln(os.Stderr, "chaos client: -socket, -node (1..6), -out, -nodes (1..6) and a positive -rate are required")
		return 2
	}
	// No garbage collector: a collection waits for every thread, and a
	// thread blocked in a page fault that dsmd never serves would stop
	// every worker of the process with it. The client allocates little.
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(1 << 30)
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos client:", err)
		return 1
	}
	c := &client{node: *node, gen: *gen, socket: *socket, nodes: *nodes, seed: *seed, rate: *rate,
		deadline: *deadline, stop: make(chan struct{}), changed: make(chan struct{}),
		rec: &recorder{f: f, now: func() int64 { return time.Now().UnixNano() }}}
	if *final {
		return c.finalReads()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sig; close(c.stop) }()
	return c.run()
}

type client struct {
	node, gen, nodes int
	socket           string
	seed             uint64
	rate             float64
	deadline         time.Duration
	rec              *recorder
	stop             chan struct{} // closed when the workload should end

	mu sync.Mutex
	// r is the live mapping, nil while the region is being mapped again.
	r *dsm.Region
	// changed is closed (and replaced) whenever r changes.
	changed chan struct{}
}

func (c *client) stopped() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

// current returns the live mapping, waiting (unrecorded) while the region
// is mapped again; nil once the workload ends.
func (c *client) current() *dsm.Region {
	for {
		c.mu.Lock()
		r, ch := c.r, c.changed
		c.mu.Unlock()
		if r != nil {
			return r
		}
		select {
		case <-ch:
		case <-c.stop:
			return nil
		}
	}
}

func (c *client) set(r *dsm.Region) {
	c.mu.Lock()
	c.r = r
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// mapRegion dials dsmd and maps the region, recorded as one "map"
// operation.
func (c *client) mapRegion() (*dsm.Client, *dsm.Region, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.deadline)
	defer cancel()
	id := c.rec.call(record{Op: opMap})
	cl, err := dsm.Dial(ctx, c.socket)
	if err != nil {
		c.rec.ret(id, record{}, err)
		return nil, nil, err
	}
	r, err := cl.Map(ctx, regionName)
	if err != nil {
		cl.Close()
		c.rec.ret(id, record{}, err)
		return nil, nil, err
	}
	c.rec.ret(id, record{}, nil)
	return cl, r, nil
}

// mapper keeps a live mapping in c.r until the workload ends.
func (c *client) mapper() {
	for !c.stopped() {
		cl, r, err := c.mapRegion()
		if err != nil {
			c.pause(500 * time.Millisecond)
			continue
		}
		c.set(r)
		select {
		case <-r.Done():
		case <-c.stop:
			return
		}
		c.set(nil)
		// Unmap the dead mapping once the workers that still hold it have
		// had time to notice (their accesses fault meanwhile).
		time.AfterFunc(5*time.Second, func() { r.Close(); cl.Close() })
	}
}

// pause sleeps d, or less if the workload ends.
func (c *client) pause(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.stop:
	}
}

// every runs op at about perSecond times a second (scaled by -rate), with
// jitter, until the workload ends.
func (c *client) every(perSecond float64, rng *rand.Rand, op func(r *dsm.Region)) {
	mean := time.Duration(float64(time.Second) / (perSecond * c.rate))
	for !c.stopped() {
		r := c.current()
		if r == nil {
			return
		}
		op(r)
		c.pause(mean/2 + time.Duration(rng.Int64N(int64(mean))))
	}
}

func (c *client) run() int {
	go c.mapper()
	var wg sync.WaitGroup
	worker := func(w int, perSecond float64, op func(*rand.Rand, *dsm.Region)) {
		rng := rand.New(rand.NewPCG(c.seed, uint64(c.node)<<32|uint64(c.gen)<<8|uint64(w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.every(perSecond, rng, func(r *dsm.Region) { op(rng, r) })
		}()
	}
	for w := 1; w <= 2; w++ {
		var seq uint64
		last := map[int64]uint64{}
		worker(w, 40, func(rng *rand.Rand, r *dsm.Region) {
			seq++
			c.register(rng, r, w, uint64(c.node)<<56|uint64(c.gen)<<44|uint64(w)<<40|seq, last)
		})
	}
	var j int
	buf := make([]byte, pageSize)
	worker(3, 10, func(_ *rand.Rand, r *dsm.Region) {
		off := pageOff(c.node, j%pagesPerNode)
		j++
		seq := uint64(time.Now().UnixNano())
		fillPage(buf, pageIndex(off), seq, c.node)
		id := c.rec.call(record{Op: opPageWrite, Worker: 3, Addr: off, Arg: seq})
		_, err := r.WriteAt(buf, off)
		c.rec.ret(id, record{}, err)
	})
	rbuf := make([]byte, pageSize)
	worker(4, 20, func(rng *rand.Rand, r *dsm.Region) {
		c.readPage(r, 4, pageOff(1+rng.IntN(c.nodes), rng.IntN(pagesPerNode)), rbuf)
	})
	worker(5, 20, func(rng *rand.Rand, r *dsm.Region) {
		off := counterWords[rng.IntN(len(counterWords))]
		ctx, cancel := context.WithTimeout(context.Background(), c.deadline)
		defer cancel()
		id := c.rec.call(record{Op: opAdd, Worker: 5, Addr: off, Arg: 1})
		v, err := r.AddUint64(ctx, off, 1)
		c.rec.ret(id, record{Out: v}, err)
	})
	worker(6, 10, func(_ *rand.Rand, r *dsm.Region) { c.rmw(r) })
	worker(7, 1, func(_ *rand.Rand, r *dsm.Region) {
		ctx, cancel := context.WithTimeout(context.Background(), c.deadline)
		defer cancel()
		id := c.rec.call(record{Op: opSync, Worker: 7})
		c.rec.ret(id, record{}, r.Sync(ctx))
	})
	<-c.stop
	// Workers finish the operation they are in; one blocked for good is
	// recorded as such by its missing return, and the harness kills this
	// process when it does not exit.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(c.deadline):
	}
	return 0
}

// onBytes runs f, which accesses the mapping through Bytes() at offset
// off, turning a fault on a dead mapping, or on a page the library made
// inaccessible, into an error that says why (Region.FaultErr).
func onBytes(r *dsm.Region, off int64, f func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("fault on the mapping: %v (%v)", p, r.FaultErr(off))
		}
	}()
	f()
	return nil
}

func word(b []byte, off int64) *uint64 { return (*uint64)(unsafe.Pointer(&b[off])) }

// register runs one random register operation through Bytes().
func (c *client) register(rng *rand.Rand, r *dsm.Region, w int, unique uint64, last map[int64]uint64) {
	b := r.Bytes()
	off := regWords[rng.IntN(len(regWords))]
	var err error
	switch k := rng.IntN(10); {
	case k < 4:
		var v uint64
		id := c.rec.call(record{Op: opLoad, Worker: w, Addr: off})
		err = onBytes(r, off, func() { v = atomic.LoadUint64(word(b, off)) })
		c.rec.ret(id, record{Out: v}, err)
		if err == nil {
			last[off] = v
		}
	case k < 7:
		id := c.rec.call(record{Op: opStore, Worker: w, Addr: off, Arg: unique})
		err = onBytes(r, off, func() { atomic.StoreUint64(word(b, off), unique) })
		c.rec.ret(id, record{}, err)
		if err == nil {
			last[off] = unique
		}
	default:
		var sw bool
		old := last[off]
		id := c.rec.call(record{Op: opCAS, Worker: w, Addr: off, Arg: unique, Old: old})
		err = onBytes(r, off, func() { sw = atomic.CompareAndSwapUint64(word(b, off), old, unique) })
		c.rec.ret(id, record{Swapped: sw}, err)
		if err == nil && sw {
			last[off] = unique
		}
	}
}

// readPage reads the checksummed page at off and records what it holds.
// A torn or wrong page is recorded with its bytes (for the checker's
// account of the tear), and read once more at once, as an operation of its
// own: whether the damage stays says where it is.
func (c *client) readPage(r *dsm.Region, w int, off int64, buf []byte) {
	if c.readPageOnce(r, w, off, buf) {
		c.readPageOnce(r, w, off, buf)
	}
}

// readPageOnce is one read of readPage; it reports whether the page was
// torn or wrong.
func (c *client) readPageOnce(r *dsm.Region, w int, off int64, buf []byte) bool {
	id := c.rec.call(record{Op: opPageRead, Worker: w, Addr: off})
	if _, err := r.ReadAt(buf, off); err != nil {
		c.rec.ret(id, record{}, err)
		return false
	}
	st, seq := checkPage(buf, pageIndex(off))
	ret := record{Out: seq, Status: st}
	damaged := st == pageTorn || st == pageWrong
	if damaged {
		ret.Raw = hex.EncodeToString(buf)
	}
	c.rec.ret(id, ret, nil)
	return damaged
}

// rmw locks the Mutex, reads both words of the pair, writes each plus one
// (plain loads and stores through Bytes()) and unlocks. It records the pair
// as it found it.
func (c *client) rmw(r *dsm.Region) {
	ctx, cancel := context.WithTimeout(context.Background(), c.deadline)
	defer cancel()
	id := c.rec.call(record{Op: opRMW, Worker: 6, Addr: pairA})
	mu := r.Mutex(mutexOff)
	err := mu.Lock(ctx)
	ownerDied := errors.Is(err, dsm.ErrOwnerDied) // held, after a holder that died
	if err != nil && !ownerDied {
		// Nothing was written.
		c.rec.ret(id, record{Status: rmwNoLock}, err)
		return
	}
	b := r.Bytes()
	var a, bb uint64
	err = onBytes(r, pairA, func() {
		a, bb = *word(b, pairA), *word(b, pairB)
		if ownerDied && a != bb {
			// The dead holder wrote one word of the pair: finish its
			// update, as a program told ErrOwnerDied repairs its data.
			a, bb = max(a, bb), max(a, bb)
		}
		*word(b, pairA), *word(b, pairB) = a+1, bb+1
	})
	if uerr := mu.Unlock(); err == nil && uerr != nil {
		err = fmt.Errorf("unlock: %w", uerr)
	}
	c.rec.ret(id, record{Out: a, Out2: bb}, err)
}

// finalReads maps the region and reads every item once.
func (c *client) finalReads() int {
	var r *dsm.Region
	for attempt := 0; ; attempt++ {
		_, m, err := c.mapRegion()
		if err == nil {
			r = m
			break
		}
		if attempt == 5 || errors.Is(err, dsm.ErrUnknownRegion) {
			fmt.Fprintln(os.Stderr, "chaos client: final reads: map:", err)
			return 1
		}
		time.Sleep(time.Second)
	}
	// Every item is read by a goroutine of its own, so that one whose page
	// is never served blocks only its own read.
	b := r.Bytes()
	ctx, cancel := context.WithTimeout(context.Background(), c.deadline)
	defer cancel()
	var reads []func()
	for _, off := range regWords {
		reads = append(reads, func() {
			var v uint64
			id := c.rec.call(record{Op: opLoad, Addr: off})
			err := onBytes(r, off, func() { v = atomic.LoadUint64(word(b, off)) })
			c.rec.ret(id, record{Out: v}, err)
		})
	}
	for _, off := range counterWords {
		reads = append(reads, func() {
			id := c.rec.call(record{Op: opCount, Addr: off})
			v, err := r.LoadUint64(ctx, off)
			c.rec.ret(id, record{Out: v}, err)
		})
	}
	reads = append(reads, func() {
		id := c.rec.call(record{Op: opPair, Addr: pairA})
		a, err := r.LoadUint64(ctx, pairA)
		var bb uint64
		if err == nil {
			bb, err = r.LoadUint64(ctx, pairB)
		}
		c.rec.ret(id, record{Out: a, Out2: bb}, err)
	})
	reads = append(reads, func() {
		id := c.rec.call(record{Op: opLockWords, Addr: mutexOff})
		t, err := r.LoadUint64(ctx, mutexOff)
		var s uint64
		if err == nil {
			s, err = r.LoadUint64(ctx, mutexOff+8)
		}
		c.rec.ret(id, record{Out: t, Out2: s}, err)
	})
	for n := 1; n <= c.nodes; n++ {
		for j := range pagesPerNode {
			reads = append(reads, func() { c.readPage(r, 0, pageOff(n, j), make([]byte, pageSize)) })
		}
	}
	var wg sync.WaitGroup
	for _, read := range reads {
		wg.Add(1)
		go func() { defer wg.Done(); read() }()
	}
	wg.Wait()
	return 0
}
