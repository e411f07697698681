// Command dsmclient is a small client of the dsm library for the
// integration tests: it dials a dsmd, maps one region and runs one command
// on it, printing its result on stdout. The tests start it as a separate
// process, so that faults on the mapping are resolved by dsmd while the
// client is blocked in the kernel, as in any real client.
//
// Usage:
//
//	dsmclient [-addr SOCK] [-region R] [-id N] [-timeout D] [-fault-timeout D] COMMAND ARGS...
//
// -fault-timeout, when given, is the mapping's dsm.WithFaultTimeout.
//
// Commands (offsets, lengths and counts are numbers in Go syntax: 4096 or
// 0x1000):
//
//	create SIZE              create the region (idempotent), SIZE in bytes
//	put-bytes OFF HEX        store the bytes through Bytes(); prints "ok"
//	sync                     Sync of the region; prints "ok"
//	get-bytes OFF LEN        load LEN bytes through Bytes(); prints hex
//	add OFF DELTA N          N AddUint64 calls; prints the last result
//	mutex-inc LOCKOFF N CNTOFF...
//	                         N times: Lock, plain read-increment-write of
//	                         the uint64 at each CNTOFF through Bytes(),
//	                         Unlock; prints "ok"
//	history N SEED OFF...    N random Load/Store/CAS on the words at OFF...;
//	                         prints one JSON object (Event) per operation
//	session                  print the mapping's session token (%#x)
//	barrier OFF PARTIES      Barrier.Wait; prints "passed GEN", or "broken"
//	                         and, when a dead party broke it, "session
//	                         TOKEN" (%#x)
//	barrier-reset OFF PARTIES
//	                         Barrier.Reset; prints "ok"
//	barrier-loop OFF PARTIES N CNTOFF
//	                         N times: AddUint64(CNTOFF, 1), Wait, then check
//	                         that the counter is at least PARTIES times the
//	                         generations passed; prints "ok"
//	sem-acquire OFF CAP N    Semaphore.Acquire of N units; prints "ok"
//	sem-try OFF CAP N        Semaphore.TryAcquire; prints "true" or "false"
//	sem-release OFF CAP N    Semaphore.Release; prints "ok"
//	sem-available OFF CAP    Semaphore.Available; prints the units free
//	sem-check OFF CAP CNTOFF N [MAXOFF]
//	                         N times: Acquire 1 unit, AddUint64(CNTOFF, 1)
//	                         and check that at most CAP are inside, raise
//	                         the word at MAXOFF to the count seen, add -1,
//	                         Release; prints "ok"
//	fill OFF LEN SEED        write a pattern over [OFF, OFF+LEN) through
//	                         Bytes(), page by page; prints "ok"
//	check OFF LEN SEED       compare [OFF, OFF+LEN) with the pattern; prints
//	                         "ok" or the first difference
//	touch-sparse OFF...      store OFF as a uint64 at each OFF through Bytes()
//	                         and load it back; prints "ok"
//	read-u64 OFF...          load the uint64 at each OFF through Bytes();
//	                         prints the values on one line, space-separated
//	read-at OFF LEN          ReadAt of LEN bytes; prints hex
//	read-sum OFF LEN         ReadAt of LEN bytes, 1 MiB at a time; prints
//	                         their SHA-256 in hex
//	try-get-bytes OFF LEN    as get-bytes, but a fault (SIGBUS on a page
//	                         that is unavailable) is recovered
//	                         (debug.SetPanicOnFault): prints "fault: " and
//	                         what Region.FaultErr says of it
//	fault-loop OFF LEN       print "started", then write every page of
//	                         [OFF, OFF+LEN) through Bytes(), over and over,
//	                         until killed
//	watch-loop OFF           print "started", then load the uint64 at OFF
//	                         through Bytes(), check that it holds the
//	                         last value this loop stored, store it plus
//	                         one, over and over (a fault is recovered
//	                         with debug.SetPanicOnFault and the access
//	                         tried again 1 ms later); every 50 ms print
//	                         "tick NOW LASTOK FAULTS LAST": NOW and the
//	                         time of the last access that succeeded, in
//	                         CLOCK_BOOTTIME nanoseconds, the faults so far
//	                         and the last value stored. A value that is
//	                         not the last stored: print "wrong GOT WANT"
//	                         and exit 1. When the mapping dies: print
//	                         "dead: " and its error and exit 0
//	registers write|read SEED PAUSEMS OFF...
//	                         until stdin closes: after a random pause of
//	                         0 to PAUSEMS milliseconds, pick one of the
//	                         8-byte words at OFF... at random; write:
//	                         WriteAt a value unique to this client (-id in
//	                         the high 32 bits, a count in the low ones),
//	                         then Sync; read: ReadAt it. Prints one JSON
//	                         object (RegEvent) as each operation starts
//	                         (phase "call") and one as it ends (phase
//	                         "return", with the error if it failed), each
//	                         written at once, so that a client killed
//	                         mid-operation leaves that operation's call
//	                         behind. A failed operation does not end the
//	                         run; a dead mapping does (exit status 1)
//	hold                     read the first page through Bytes(), print
//	                         "mapped", and keep the mapping until stdin
//	                         closes or SIGTERM or SIGINT arrives; if the
//	                         mapping dies first, print "dead: " and its
//	                         error and exit 0
//	map-direct SOCK          map the region through the mapping socket SOCK
//	                         directly (no gRPC call first); prints "mapped"
//	repl                     read commands (put-bytes, sync, get-bytes, read-at,
//	                         read-sum, add, mutex-inc, fill, check,
//	                         touch-sparse, read-u64,
//	                         lock, unlock, session, barrier..., sem-...)
//	                         from stdin, one a line, on one mapping held
//	                         until stdin closes; answer each with one line:
//	                         its output, or "ERR " and the error
//
// The exit status is 0 on success, 1 on an error (written to stderr), 2
// on a usage error.
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/dsm"
	"github.com/dsmkit/dsm/internal/mapclient"
)

// Event is one completed operation of the history command. Call and Return
// are time.Now().UnixNano() just before the call and just after it
// returned.
type Event struct {
	Client int    `json:"client"`
	Kind   string `json:"kind"` // load, store or cas
	Off    int64  `json:"off"`
	// Value stored (store), or new value (cas).
	Value uint64 `json:"value,omitempty"`
	// Old is the value compared (cas).
	Old uint64 `json:"old,omitempty"`
	// Out is the value loaded (load).
	Out uint64 `json:"out,omitempty"`
	// Swapped is the result of a cas.
	Swapped bool  `json:"swapped,omitempty"`
	Call    int64 `json:"call"`
	Return  int64 `json:"return"`
}

// RegEvent is one line of the registers command. A write's Call is
// time.Now().UnixNano() just before WriteAt, Written just after it
// returned without an error (0 otherwise), and Return just after Sync
// returned (or WriteAt failed); a read's Call and Return surround ReadAt.
type RegEvent struct {
	Client int    `json:"client"`
	Kind   string `json:"kind"`  // write or read
	Phase  string `json:"phase"` // call or return
	Off    int64  `json:"off"`
	// Value is the value written (write).
	Value uint64 `json:"value,omitempty"`
	// Out is the value read (read, without an error).
	Out     uint64 `json:"out,omitempty"`
	Call    int64  `json:"call"`
	Written int64  `json:"written,omitempty"`
	Return  int64  `json:"return,omitempty"`
	// Err is the error of a failed operation.
	Err string `json:"err,omitempty"`
}

// mapOpts are the options of the mapping (from the flags).
var mapOpts []dsm.MapOption

// errUsage marks errors in the command line.
var errUsage = errors.New("usage")

func usagef(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, a...))
}

type client struct {
	id     int
	region string
	c      *dsm.Client
	r      *dsm.Region
	out    *bufio.Writer
	locks  map[int64]*dsm.Mutex // lock and unlock, by offset
	// barriers are this process's parties, by offset: one per barrier, so
	// that a repl waits as the same party each time.
	barriers map[int64]*dsm.Barrier
}

// barrier returns this process's party of the barrier at off.
func (cl *client) barrier(off int64, parties int) *dsm.Barrier {
	if cl.barriers == nil {
		cl.barriers = map[int64]*dsm.Barrier{}
	}
	b := cl.barriers[off]
	if b == nil {
		b = cl.r.Barrier(off, parties)
		cl.barriers[off] = b
	}
	return b
}

func main() {
	fs := flag.NewFlagSet("dsmclient", flag.ContinueOnError)
	addr := fs.String("addr", "", "dsmd socket (default $DSM_ADDR)")
	region := fs.String("region", "r", "region name")
	id := fs.Int("id", 0, "client id written in history events")
	timeout := fs.Duration("timeout", 60*time.Second, "bound of the whole run")
	faultTimeout := fs.Duration("fault-timeout", dsm.DefaultFaultTimeout, "the mapping's fault timeout (dsm.WithFaultTimeout)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	mapOpts = []dsm.MapOption{dsm.WithFaultTimeout(*faultTimeout)}
	if fs.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "dsmclient: no command")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	err := run(ctx, *addr, *region, *id, fs.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, "dsmclient:", err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, addr, region string, id int, args []string) error {
	if args[0] == "map-direct" {
		if len(args) != 2 {
			return usagef("map-direct SOCK")
		}
		return mapDirect(ctx, args[1], region)
	}
	c, err := dsm.Dial(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	cl := &client{id: id, region: region, c: c, out: bufio.NewWriter(os.Stdout)}
	defer cl.out.Flush()
	if args[0] == "create" {
		if len(args) != 2 {
			return usagef("create SIZE")
		}
		size, err := strconv.ParseInt(args[1], 10, 64)
		if err != nil {
			return usagef("size %q: %v", args[1], err)
		}
		if err := c.CreateRegion(ctx, region, size); err != nil {
			return err
		}
		fmt.Fprintln(cl.out, "ok")
		return nil
	}
	r, err := c.Map(ctx, region, mapOpts...)
	if err != nil {
		return err
	}
	defer r.Close()
	cl.r = r
	switch args[0] {
	case "repl":
		return cl.repl(ctx, os.Stdin)
	case "hold":
		return cl.hold(ctx)
	case "history":
		return cl.history(ctx, args[1:])
	case "registers":
		return cl.registers(ctx, args[1:], os.Stdin)
	case "fault-loop":
		return cl.faultLoop(args[1:])
	case "watch-loop":
		return cl.watchLoop(args[1:])
	}
	s, err := cl.do(ctx, args)
	if err != nil {
		return err
	}
	fmt.Fprintln(cl.out, s)
	return nil
}

// mapDirect maps region through the mapping socket alone.
func mapDirect(ctx context.Context, sock, region string) error {
	mc, err := mapclient.Connect(ctx, sock)
	if err != nil {
		return err
	}
	defer mc.Close()
	m, err := mc.Map(ctx, region)
	if err != nil {
		return err
	}
	m.Close()
	fmt.Println("mapped")
	return nil
}

// hold keeps the mapping, with its first page faulted in, until stdin
// closes or a signal to stop arrives.
func (cl *client) hold(ctx context.Context) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	_ = cl.r.Bytes()[0]
	if err := cl.r.Err(); err != nil {
		return err
	}
	fmt.Fprintln(cl.out, "mapped")
	if err := cl.out.Flush(); err != nil {
		return err
	}
	eof := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(eof) }()
	select {
	case <-eof:
	case <-sig:
	case <-cl.r.Done():
		// The mapping died (dsmd went away, the region was deleted).
		fmt.Fprintln(cl.out, "dead:", cl.r.Err())
		return cl.out.Flush()
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// tryGet loads n bytes at off through Bytes(), recovering a fault: the
// answer is then "fault: " and what FaultErr says of it.
func (cl *client) tryGet(off, n int64) (s string, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			if rerr := cl.r.Err(); rerr != nil {
				s, err = "", fmt.Errorf("%v: %w", p, rerr)
				return
			}
			s = fmt.Sprintf("fault: %v: %v", p, cl.r.FaultErr(off))
		}
	}()
	p := make([]byte, n)
	copy(p, cl.r.Bytes()[off:])
	return hex.EncodeToString(p), nil
}

// repl answers one command per line of in until EOF.
func (cl *client) repl(ctx context.Context, in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		s, err := cl.do(ctx, f)
		if err != nil {
			s = "ERR " + strings.ReplaceAll(err.Error(), "\n", " ")
		}
		fmt.Fprintln(cl.out, s)
		if err := cl.out.Flush(); err != nil {
			return err
		}
	}
	return sc.Err()
}

func ints(args []string) ([]int64, error) {
	v := make([]int64, len(args))
	for i, a := range args {
		n, err := strconv.ParseInt(a, 0, 64)
		if err != nil {
			return nil, usagef("%q is not a number", a)
		}
		v[i] = n
	}
	return v, nil
}

// span checks that [off, off+n) lies inside the region.
func (cl *client) span(off, n int64) error {
	if off < 0 || n < 0 || off > cl.r.Len() || n > cl.r.Len()-off {
		return usagef("[%d, %d+%d) is outside the region of %d bytes", off, off, n, cl.r.Len())
	}
	return nil
}

// do runs one single-line command.
func (cl *client) do(ctx context.Context, args []string) (string, error) {
	cmd, args := args[0], args[1:]
	b := cl.r.Bytes()
	switch cmd {
	case "put-bytes":
		if len(args) != 2 {
			return "", usagef("put-bytes OFF HEX")
		}
		off, err := strconv.ParseInt(args[0], 0, 64)
		if err != nil {
			return "", usagef("offset %q", args[0])
		}
		p, err := hex.DecodeString(args[1])
		if err != nil {
			return "", usagef("hex %q: %v", args[1], err)
		}
		if err := cl.span(off, int64(len(p))); err != nil {
			return "", err
		}
		copy(b[off:], p)
		return "ok", cl.r.Err()
	case "sync":
		if len(args) != 0 {
			return "", usagef("sync")
		}
		return "ok", cl.r.Sync(ctx)
	case "read-at":
		v, err := ints(args)
		if err != nil || len(v) != 2 {
			return "", usagef("read-at OFF LEN")
		}
		if err := cl.span(v[0], v[1]); err != nil {
			return "", err
		}
		p := make([]byte, v[1])
		if _, err := cl.r.ReadAt(p, v[0]); err != nil {
			return "", err
		}
		return hex.EncodeToString(p), nil
	case "read-sum":
		v, err := ints(args)
		if err != nil || len(v) != 2 {
			return "", usagef("read-sum OFF LEN")
		}
		if err := cl.span(v[0], v[1]); err != nil {
			return "", err
		}
		h := sha256.New()
		p := make([]byte, 1<<20)
		for at, end := v[0], v[0]+v[1]; at < end; at += int64(len(p)) {
			q := p[:min(int64(len(p)), end-at)]
			if _, err := cl.r.ReadAt(q, at); err != nil {
				return "", err
			}
			h.Write(q)
		}
		return hex.EncodeToString(h.Sum(nil)), nil
	case "try-get-bytes":
		v, err := ints(args)
		if err != nil || len(v) != 2 {
			return "", usagef("try-get-bytes OFF LEN")
		}
		if err := cl.span(v[0], v[1]); err != nil {
			return "", err
		}
		return cl.tryGet(v[0], v[1])
	case "get-bytes":
		v, err := ints(args)
		if err != nil || len(v) != 2 {
			return "", usagef("get-bytes OFF LEN")
		}
		if err := cl.span(v[0], v[1]); err != nil {
			return "", err
		}
		p := make([]byte, v[1])
		copy(p, b[v[0]:])
		if err := cl.r.Err(); err != nil {
			return "", err
		}
		return hex.EncodeToString(p), nil
	case "add":
		v, err := ints(args)
		if err != nil || len(v) != 3 {
			return "", usagef("add OFF DELTA N")
		}
		var last uint64
		for range v[2] {
			last, err = cl.r.AddUint64(ctx, v[0], uint64(v[1]))
			if err != nil {
				return "", err
			}
		}
		return strconv.FormatUint(last, 10), nil
	case "lock", "unlock":
		// lock OFF: "ok", or "owner-died" when the previous holder died
		// holding it (the lock is held either way); unlock OFF: "ok".
		v, err := ints(args)
		if err != nil || len(v) != 1 {
			return "", usagef("%s LOCKOFF", cmd)
		}
		if cl.locks == nil {
			cl.locks = map[int64]*dsm.Mutex{}
		}
		mu := cl.locks[v[0]]
		if mu == nil {
			mu = cl.r.Mutex(v[0])
			cl.locks[v[0]] = mu
		}
		if cmd == "unlock" {
			return "ok", mu.Unlock()
		}
		switch err := mu.Lock(ctx); {
		case errors.Is(err, dsm.ErrOwnerDied):
			return "owner-died", nil
		case err != nil:
			return "", err
		}
		return "ok", nil
	case "session":
		return fmt.Sprintf("%#x", cl.r.Session()), nil
	case "barrier", "barrier-reset":
		v, err := ints(args)
		if err != nil || len(v) != 2 {
			return "", usagef("%s OFF PARTIES", cmd)
		}
		b := cl.barrier(v[0], int(v[1]))
		if cmd == "barrier-reset" {
			return "ok", b.Reset(ctx)
		}
		gen, err := b.Wait(ctx)
		if errors.Is(err, dsm.ErrBarrierBroken) {
			var dp *dsm.DeadPartyError
			if errors.As(err, &dp) {
				return fmt.Sprintf("broken session %#x", dp.Session), nil
			}
			return "broken", nil
		}
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("passed %d", gen), nil
	case "barrier-loop":
		v, err := ints(args)
		if err != nil || len(v) != 4 {
			return "", usagef("barrier-loop OFF PARTIES N CNTOFF")
		}
		b := cl.barrier(v[0], int(v[1]))
		for range v[2] {
			if _, err := cl.r.AddUint64(ctx, v[3], 1); err != nil {
				return "", err
			}
			gen, err := b.Wait(ctx)
			if err != nil {
				return "", err
			}
			got, err := cl.r.LoadUint64(ctx, v[3])
			if err != nil {
				return "", err
			}
			if want := uint64(v[1]) * (gen + 1); got < want {
				return "", fmt.Errorf("generation %d passed with %d arrivals counted, want %d", gen, got, want)
			}
		}
		return "ok", nil
	case "sem-acquire", "sem-try", "sem-release":
		v, err := ints(args)
		if err != nil || len(v) != 3 {
			return "", usagef("%s OFF CAP N", cmd)
		}
		s := cl.r.Semaphore(v[0], uint64(v[1]))
		switch cmd {
		case "sem-acquire":
			return "ok", s.Acquire(ctx, uint64(v[2]))
		case "sem-release":
			return "ok", s.Release(uint64(v[2]))
		}
		ok, err := s.TryAcquire(ctx, uint64(v[2]))
		return strconv.FormatBool(ok), err
	case "sem-available":
		v, err := ints(args)
		if err != nil || len(v) != 2 {
			return "", usagef("sem-available OFF CAP")
		}
		n, err := cl.r.Semaphore(v[0], uint64(v[1])).Available(ctx)
		return strconv.FormatUint(n, 10), err
	case "sem-check":
		v, err := ints(args)
		if err != nil || len(v) != 4 && len(v) != 5 {
			return "", usagef("sem-check OFF CAP CNTOFF N [MAXOFF]")
		}
		s := cl.r.Semaphore(v[0], uint64(v[1]))
		for range v[3] {
			if err := s.Acquire(ctx, 1); err != nil {
				return "", err
			}
			in, err := cl.r.AddUint64(ctx, v[2], 1)
			if err != nil {
				return "", err
			}
			if in > uint64(v[1]) {
				return "", fmt.Errorf("%d holders inside a semaphore of %d", in, v[1])
			}
			if len(v) == 5 {
				if err := raiseTo(ctx, cl.r, v[4], in); err != nil {
					return "", err
				}
			}
			if _, err := cl.r.AddUint64(ctx, v[2], ^uint64(0)); err != nil {
				return "", err
			}
			if err := s.Release(1); err != nil {
				return "", err
			}
		}
		return "ok", nil
	case "mutex-inc":
		v, err := ints(args)
		if err != nil || len(v) < 3 {
			return "", usagef("mutex-inc LOCKOFF N CNTOFF...")
		}
		for _, off := range v[2:] {
			if err := cl.span(off, 8); err != nil {
				return "", err
			}
		}
		mu := cl.r.Mutex(v[0])
		for range v[1] {
			if err := mu.Lock(ctx); err != nil {
				return "", err
			}
			for _, off := range v[2:] {
				w := b[off : off+8]
				binary.LittleEndian.PutUint64(w, binary.LittleEndian.Uint64(w)+1)
			}
			if err := mu.Unlock(); err != nil {
				return "", err
			}
		}
		return "ok", nil
	case "fill", "check":
		v, err := ints(args)
		if err != nil || len(v) != 3 {
			return "", usagef("%s OFF LEN SEED", cmd)
		}
		if err := cl.span(v[0], v[1]); err != nil {
			return "", err
		}
		return cl.pattern(cmd == "fill", v[0], v[1], uint64(v[2]))
	case "touch-sparse":
		v, err := ints(args)
		if err != nil {
			return "", err
		}
		for _, off := range v {
			if err := cl.span(off, 8); err != nil {
				return "", err
			}
			binary.LittleEndian.PutUint64(b[off:], uint64(off))
			if got := binary.LittleEndian.Uint64(b[off:]); got != uint64(off) {
				return "", fmt.Errorf("at %d: stored %d, loaded %d", off, off, got)
			}
		}
		return "ok", cl.r.Err()
	case "read-u64":
		v, err := ints(args)
		if err != nil {
			return "", err
		}
		var s []string
		for _, off := range v {
			if err := cl.span(off, 8); err != nil {
				return "", err
			}
			s = append(s, strconv.FormatUint(binary.LittleEndian.Uint64(b[off:]), 10))
		}
		return strings.Join(s, " "), cl.r.Err()
	}
	return "", usagef("unknown command %q", cmd)
}

// patternWord is the uint64 the pattern of seed holds at off.
// raiseTo raises the word at off to v if it holds less.
func raiseTo(ctx context.Context, r *dsm.Region, off int64, v uint64) error {
	for {
		cur, err := r.LoadUint64(ctx, off)
		if err != nil || cur >= v {
			return err
		}
		if ok, err := r.CompareAndSwapUint64(ctx, off, cur, v); err != nil || ok {
			return err
		}
	}
}

func patternWord(seed uint64, off int64) uint64 {
	x := seed*0x9e3779b97f4a7c15 ^ uint64(off)
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 29
	return x
}

// pattern writes (fill) or compares the pattern over [off, off+n), 8 bytes
// at a time; off and n must be multiples of 8.
func (cl *client) pattern(fill bool, off, n int64, seed uint64) (string, error) {
	if off%8 != 0 || n%8 != 0 {
		return "", usagef("offset and length must be multiples of 8")
	}
	b := cl.r.Bytes()
	for o := off; o < off+n; o += 8 {
		want := patternWord(seed, o)
		if fill {
			binary.LittleEndian.PutUint64(b[o:], want)
			continue
		}
		if got := binary.LittleEndian.Uint64(b[o:]); got != want {
			return fmt.Sprintf("differs at %d: %#x, want %#x", o, got, want), cl.r.Err()
		}
	}
	return "ok", cl.r.Err()
}

// history runs N random operations on the given words and prints them.
func (cl *client) history(ctx context.Context, args []string) error {
	v, err := ints(args)
	if err != nil || len(v) < 3 {
		return usagef("history N SEED OFF...")
	}
	n, seed, offs := v[0], uint64(v[1]), v[2:]
	rng := rand.New(rand.NewPCG(seed, uint64(cl.id)))
	last := make(map[int64]uint64) // the last value seen per word
	enc := json.NewEncoder(cl.out)
	for i := range n {
		off := offs[rng.IntN(len(offs))]
		e := Event{Client: cl.id, Off: off}
		// Unique stored values: client id in the high half.
		unique := uint64(cl.id)<<32 | uint64(i+1)
		var err error
		switch k := rng.IntN(10); {
		case k < 4:
			e.Kind = "load"
			e.Call = time.Now().UnixNano()
			e.Out, err = cl.r.LoadUint64(ctx, off)
			e.Return = time.Now().UnixNano()
			last[off] = e.Out
		case k < 7:
			e.Kind, e.Value = "store", unique
			e.Call = time.Now().UnixNano()
			err = cl.r.StoreUint64(ctx, off, e.Value)
			e.Return = time.Now().UnixNano()
			last[off] = e.Value
		default:
			e.Kind, e.Old, e.Value = "cas", last[off], unique
			e.Call = time.Now().UnixNano()
			e.Swapped, err = cl.r.CompareAndSwapUint64(ctx, off, e.Old, e.Value)
			e.Return = time.Now().UnixNano()
			if e.Swapped {
				last[off] = e.Value
			}
		}
		if err != nil {
			return fmt.Errorf("operation %d (%s at %d): %w", i, e.Kind, off, err)
		}
		if err := enc.Encode(e); err != nil {
			return err
		}
	}
	return nil
}

// registers writes or reads the words at random until in closes (see
// the package documentation).
func (cl *client) registers(ctx context.Context, args []string, in io.Reader) error {
	if len(args) < 4 || args[0] != "write" && args[0] != "read" {
		return usagef("registers write|read SEED PAUSEMS OFF...")
	}
	write := args[0] == "write"
	v, err := ints(args[1:])
	if err != nil {
		return err
	}
	seed, pause, offs := uint64(v[0]), v[1], v[2:]
	if pause < 0 {
		return usagef("negative pause %d", pause)
	}
	for _, off := range offs {
		if err := cl.span(off, 8); err != nil {
			return err
		}
	}
	stop := make(chan struct{})
	go func() { io.Copy(io.Discard, in); close(stop) }()
	rng := rand.New(rand.NewPCG(seed, uint64(cl.id)))
	enc := json.NewEncoder(cl.out)
	emit := func(e RegEvent) error {
		if err := enc.Encode(e); err != nil {
			return err
		}
		return cl.out.Flush()
	}
	var buf [8]byte
	for seq := uint64(1); ; seq++ {
		if pause > 0 {
			t := time.NewTimer(time.Duration(rng.Int64N(pause+1)) * time.Millisecond)
			select {
			case <-t.C:
			case <-stop:
				t.Stop()
			}
		}
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		e := RegEvent{Client: cl.id, Kind: "read", Phase: "call", Off: offs[rng.IntN(len(offs))]}
		if write {
			e.Kind, e.Value = "write", uint64(cl.id)<<32|seq&(1<<32-1)
		}
		e.Call = time.Now().UnixNano()
		if err := emit(e); err != nil {
			return err
		}
		var err error
		if write {
			binary.LittleEndian.PutUint64(buf[:], e.Value)
			if _, err = cl.r.WriteAt(buf[:], e.Off); err == nil {
				e.Written = time.Now().UnixNano()
				err = cl.r.Sync(ctx)
			}
		} else {
			if _, err = cl.r.ReadAt(buf[:], e.Off); err == nil {
				e.Out = binary.LittleEndian.Uint64(buf[:])
			}
		}
		e.Return = time.Now().UnixNano()
		e.Phase = "return"
		if err != nil {
			e.Err = err.Error()
		}
		if err := emit(e); err != nil {
			return err
		}
		if err := cl.r.Err(); err != nil {
			return err
		}
	}
}

// faultLoop writes one byte of every page of the range, over and over.
func (cl *client) faultLoop(args []string) error {
	v, err := ints(args)
	if err != nil || len(v) != 2 {
		return usagef("fault-loop OFF LEN")
	}
	if err := cl.span(v[0], v[1]); err != nil {
		return err
	}
	fmt.Fprintln(cl.out, "started")
	if err := cl.out.Flush(); err != nil {
		return err
	}
	b, ps := cl.r.Bytes(), cl.r.PageSize()
	for round := byte(1); ; round++ {
		for o := v[0]; o < v[0]+v[1]; o += ps {
			b[o] = round
		}
		if err := cl.r.Err(); err != nil {
			return err
		}
	}
}

// boottime reads CLOCK_BOOTTIME in nanoseconds.
func boottime() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// watchLoop checks and increments the word at OFF over and over,
// reporting when accesses succeed (see the command's doc).
func (cl *client) watchLoop(args []string) error {
	v, err := ints(args)
	if err != nil || len(v) != 1 || v[0]%8 != 0 {
		return usagef("watch-loop OFF (8-byte aligned)")
	}
	if err := cl.span(v[0], 8); err != nil {
		return err
	}
	w := (*uint64)(unsafe.Pointer(&cl.r.Bytes()[v[0]]))
	var lastOK, faults atomic.Int64
	var stored atomic.Uint64
	// One access: a load that must find the last value stored, then the
	// store of the next. A fault on either leaves the count as it was.
	access := func() (got uint64, wrong, faulted bool) {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if recover() != nil {
				faulted = true
			}
		}()
		last := stored.Load()
		if got = atomic.LoadUint64(w); got != last {
			return got, true, false
		}
		atomic.StoreUint64(w, last+1)
		stored.Store(last + 1)
		return got, false, false
	}
	// The first load gives the value to start from.
	var first [8]byte
	if _, err := cl.r.ReadAt(first[:], v[0]); err != nil {
		return err
	}
	stored.Store(binary.NativeEndian.Uint64(first[:]))
	fmt.Fprintln(cl.out, "started")
	if err := cl.out.Flush(); err != nil {
		return err
	}
	var mu sync.Mutex // cl.out
	say := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(cl.out, format+"\n", a...)
		cl.out.Flush()
	}
	go func() {
		for {
			select {
			case <-cl.r.Done():
				say("dead: %v", cl.r.Err())
				os.Exit(0)
			case <-time.After(50 * time.Millisecond):
				say("tick %d %d %d %d", boottime(), lastOK.Load(), faults.Load(), stored.Load())
			}
		}
	}()
	for {
		got, wrong, faulted := access()
		switch {
		case wrong:
			say("wrong %d %d", got, stored.Load())
			os.Exit(1)
		case faulted:
			faults.Add(1)
			time.Sleep(time.Millisecond)
		default:
			lastOK.Store(boottime())
			time.Sleep(200 * time.Microsecond)
		}
	}
}
