//go:build linux

package localcache

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/mapclient"
)

// childEnv, when set, turns the test binary into a client process: an
// application that maps regions through package mapclient from the
// daemon's socket (the variable's value) and obeys commands, one line each
// on stdin, answering one line each on stdout ("ok ..." or "err KIND: ...",
// KIND being gone, closed, range or other). Offsets and values are hex.
//
//	map NAME              map region NAME (one mapping per child)
//	mapt NAME MS          map with a FaultTimeout of MS milliseconds
//	tryload OFF           load through Bytes(), a fault recovered (SetPanicOnFault) -> ok VALUE, or fault
//	trystore OFF VALUE    store through Bytes(), a fault recovered -> ok, or fault
//	unavail               the pages poisoned now -> ok PAGE=WHY... (";"-separated)
//	load OFF              plain 8-byte load through Bytes()   -> ok VALUE
//	store OFF VALUE       plain 8-byte store through Bytes()
//	readat OFF N          ReadAt of N bytes                    -> ok HEXBYTES
//	writeat OFF HEXBYTES  WriteAt
//	fill FIRST N PS [GEN] WriteAt of the 8-byte value 1000*i+7+GEN<<32 at page i, FIRST <= i < FIRST+N, pages of PS bytes
//	check FIRST N PS [GEN] ReadAt of the same; answers err on the first mismatch
//	readat2 OFF N         two concurrent ReadAt calls of N bytes
//	sweep OP FIRST N PS   one access per page (OP: read = ReadAt, load, store)
//	spin OFF              start storing 1, 2, 3, ... into the 8-byte word at OFF through Bytes(), one store after another, in a goroutine
//	spun                  the last value the spinning goroutine has stored (its store completed) -> ok VALUE
//	spinstop              stop the spinning goroutine, wait for it           -> ok LAST
//	hold                  start a process that inherits this one's sockets and outlives it -> ok PID
//	close                 close the mapping
//	exit
const childEnv = "DSM_LOCALCACHE_TEST_CLIENT"

// daemonEnv, when set, turns the test binary into a daemon process serving
// region "r" on the socket path it names, with a MemHome whose misses of
// page 3 never end. It prints "ready" once it listens and "entered P" when
// a miss of page P begins, and serves until stdin closes.
const daemonEnv = "DSM_LOCALCACHE_TEST_DAEMON"

// holderEnv, when set, makes the test binary a process that only holds the
// descriptors it inherited, until killed (or hangDeadline).
const holderEnv = "DSM_LOCALCACHE_TEST_HOLDER"

// startHolder starts a holder process that inherits every socket of this
// process: the session socket then outlives this process.
func startHolder() (int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	var files []*os.File
	for _, e := range ents {
		fd, _ := strconv.Atoi(e.Name())
		if link, _ := os.Readlink("/proc/self/fd/" + e.Name()); fd > 2 && strings.HasPrefix(link, "socket:") {
			files = append(files, os.NewFile(uintptr(fd), link))
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, childEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, holderEnv+"=1")
	cmd.ExtraFiles = files
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	return cmd.Process.Pid, nil
}

func TestMain(m *testing.M) {
	if os.Getenv(holderEnv) != "" {
		time.Sleep(hangDeadline)
		os.Exit(0)
	}
	if sock := os.Getenv(daemonEnv); sock != "" {
		if err := daemonMain(sock); err != nil {
			fmt.Fprintln(os.Stderr, "localcache test daemon:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	if sock := os.Getenv(childEnv); sock != "" {
		if err := clientMain(sock); err != nil {
			fmt.Fprintln(os.Stderr, "localcache test client:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func clientMain(sock string) error {
	ctx, cancel := context.WithTimeout(context.Background(), hangDeadline)
	defer cancel()
	c, err := mapclient.Connect(ctx, sock)
	if err != nil {
		return err
	}
	defer c.Close()
	var m *mapclient.Mapping
	var sp spinner
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		arg := func(i int) uint64 {
			if i >= len(f) {
				return 0
			}
			v, _ := strconv.ParseUint(f[i], 16, 64)
			return v
		}
		reply := "ok"
		var err error
		if f[0] != "map" && f[0] != "mapt" && f[0] != "exit" && m == nil {
			err = errors.New("not mapped")
		} else {
			switch f[0] {
			case "exit":
				return nil
			case "map":
				m, err = c.Map(ctx, f[1])
			case "mapt":
				m, err = c.MapWith(ctx, f[1], mapclient.Options{FaultTimeout: time.Duration(arg(2)) * time.Millisecond})
			case "tryload":
				reply = tryLoad(m.Bytes()[arg(1):])
			case "trystore":
				reply = tryStore(m.Bytes()[arg(1):], arg(2))
			case "unavail":
				var parts []string
				for _, u := range m.Unavailable() {
					parts = append(parts, fmt.Sprintf("%x=%s", uint64(u.Page), u.Why))
				}
				reply = strings.TrimSpace("ok " + strings.Join(parts, ";"))
			case "load":
				v := binary.LittleEndian.Uint64(m.Bytes()[arg(1):])
				reply = fmt.Sprintf("ok %x", v)
			case "store":
				binary.LittleEndian.PutUint64(m.Bytes()[arg(1):], arg(2))
			case "readat":
				b := make([]byte, arg(2))
				if _, err = m.ReadAt(b, int64(arg(1))); err == nil {
					reply = "ok " + hex.EncodeToString(b)
				}
			case "writeat":
				var b []byte
				if b, err = hex.DecodeString(f[2]); err == nil {
					_, err = m.WriteAt(b, int64(arg(1)))
				}
			case "fill", "check":
				first, n, ps, gen := arg(1), arg(2), int64(arg(3)), arg(4)
				for i := first; i < first+n && err == nil; i++ {
					b := make([]byte, 8)
					want := 1000*i + 7 + gen<<32
					if f[0] == "fill" {
						binary.LittleEndian.PutUint64(b, want)
						_, err = m.WriteAt(b, int64(i)*ps)
						continue
					}
					if _, err = m.ReadAt(b, int64(i)*ps); err == nil {
						if v := binary.LittleEndian.Uint64(b); v != want {
							err = fmt.Errorf("page %d holds %#x, want %#x", i, v, want)
						}
					}
				}
			case "sweep":
				// One access per page: read (ReadAt of 8 bytes), load or
				// store (plain, through Bytes()).
				first, n, ps := int64(arg(2)), int64(arg(3)), int64(arg(4))
				b := m.Bytes()
				var sum uint64
				buf := make([]byte, 8)
				for i := first; i < first+n && err == nil; i++ {
					switch f[1] {
					case "read":
						_, err = m.ReadAt(buf, i*ps)
					case "load":
						sum += binary.LittleEndian.Uint64(b[i*ps:])
					case "store":
						binary.LittleEndian.PutUint64(b[i*ps:], uint64(i))
					default:
						err = fmt.Errorf("unknown sweep %q", f[1])
					}
				}
				reply = fmt.Sprintf("ok %x", sum)
			case "readat2":
				// Two ReadAt calls of the same bytes from two goroutines
				// (two threads faulting on one page).
				errs := make(chan error, 2)
				for range 2 {
					go func() {
						_, err := m.ReadAt(make([]byte, arg(2)), int64(arg(1)))
						errs <- err
					}()
				}
				err = errors.Join(<-errs, <-errs)
			case "spin":
				sp.start(m.Bytes()[arg(1):])
			case "spun":
				reply = fmt.Sprintf("ok %x", sp.last.Load())
			case "spinstop":
				reply = fmt.Sprintf("ok %x", sp.stop())
			case "hold":
				var pid int
				if pid, err = startHolder(); err == nil {
					reply = fmt.Sprintf("ok %x", pid)
				}
			case "close":
				err = m.Close()
			default:
				err = fmt.Errorf("unknown command %q", f[0])
			}
		}
		if err != nil {
			kind := "other"
			switch {
			case errors.Is(err, mapclient.ErrDaemonGone):
				kind = "gone"
			case errors.Is(err, mapclient.ErrClosed):
				kind = "closed"
			case errors.Is(err, mapclient.ErrOutOfRange):
				kind = "range"
			case errors.Is(err, mapclient.ErrPageUnavailable):
				kind = "unavail"
			}
			reply = fmt.Sprintf("err %s: %v", kind, err)
		}
		fmt.Fprintln(out, reply)
		out.Flush()
	}
	return in.Err()
}

// spinner stores increasing values into one word of a mapping, from its
// own goroutine, until stopped; last is the value of its last completed
// store.
type spinner struct {
	last atomic.Uint64
	quit atomic.Bool
	done chan struct{}
}

func (s *spinner) start(b []byte) {
	w := (*atomic.Uint64)(unsafe.Pointer(&b[0]))
	s.quit.Store(false)
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		for v := s.last.Load() + 1; !s.quit.Load(); v++ {
			w.Store(v) // one 8-byte store: it faults (and waits) or lands whole
			s.last.Store(v)
		}
	}()
}

func (s *spinner) stop() uint64 {
	if s.done == nil {
		return 0
	}
	s.quit.Store(true)
	<-s.done
	s.done = nil
	return s.last.Load()
}

// tryLoad loads the 8-byte word at the start of b, answering "fault" if
// the load faults (a poisoned page raises SIGBUS).
func tryLoad(b []byte) (reply string) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			reply = "fault"
		}
	}()
	return fmt.Sprintf("ok %x", binary.LittleEndian.Uint64(b))
}

// tryStore stores v as the 8-byte word at the start of b, answering
// "fault" if the store faults.
func tryStore(b []byte, v uint64) (reply string) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			reply = "fault"
		}
	}()
	binary.LittleEndian.PutUint64(b, v)
	return "ok"
}

// stuckHome is a MemHome whose misses of page 3 never end.
type stuckHome struct {
	MemHome
	out chan<- string
}

func (h *stuckHome) ReadMiss(ctx context.Context, r ids.RegionID, p ids.PageNo, buf []byte) error {
	if p == 3 {
		h.out <- fmt.Sprintf("entered %d", p)
		<-ctx.Done()
		return ctx.Err()
	}
	return h.MemHome.ReadMiss(ctx, r, p, buf)
}

func daemonMain(sock string) error {
	out := make(chan string, 4)
	c, err := New(Config{Coherence: &stuckHome{out: out}})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.AddRegion(RegionSpec{ID: 1, Name: "r", Size: 16 * DefaultPageSize}); err != nil {
		return err
	}
	if err := c.Listen(sock); err != nil {
		return err
	}
	fmt.Println("ready")
	go func() {
		for line := range out {
			fmt.Println(line)
		}
	}()
	_, err = io.Copy(io.Discard, os.Stdin)
	return err
}

// hangDeadline bounds every wait; it only catches hangs.
const hangDeadline = 60 * time.Second

// proc is the test's handle on one client process.
type proc struct {
	t       testing.TB
	name    string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	replies chan string
}

func startProc(t testing.TB, name, sock string) *proc {
	return startRole(t, name, childEnv, sock)
}

func startRole(t testing.TB, name, env, sock string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"="+sock,
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: name, cmd: cmd, stdin: stdin, replies: make(chan string, 16)}
	go func() {
		defer close(p.replies)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.replies <- sc.Text()
		}
	}()
	t.Cleanup(p.stop)
	return p
}

// send writes a command without waiting for its answer.
func (p *proc) send(format string, args ...any) {
	p.t.Helper()
	if _, err := fmt.Fprintf(p.stdin, format+"\n", args...); err != nil {
		p.t.Fatalf("%s: %v", p.name, err)
	}
}

// reply waits for the next answer.
func (p *proc) reply() string {
	p.t.Helper()
	select {
	case r, ok := <-p.replies:
		if !ok {
			p.t.Fatalf("%s exited", p.name)
		}
		return r
	case <-time.After(hangDeadline):
		p.t.Fatalf("%s: no answer", p.name)
	}
	return ""
}

// do sends a command and returns its answer.
func (p *proc) do(format string, args ...any) string {
	p.t.Helper()
	p.send(format, args...)
	return p.reply()
}

// ok sends a command that must succeed and returns the answer's value.
func (p *proc) ok(format string, args ...any) string {
	p.t.Helper()
	r := p.do(format, args...)
	if r != "ok" && !strings.HasPrefix(r, "ok ") {
		p.t.Fatalf("%s: %q: %s", p.name, fmt.Sprintf(format, args...), r)
	}
	return strings.TrimPrefix(strings.TrimPrefix(r, "ok"), " ")
}

func (p *proc) load(off int64) uint64 {
	p.t.Helper()
	v, err := strconv.ParseUint(p.ok("load %x", off), 16, 64)
	if err != nil {
		p.t.Fatal(err)
	}
	return v
}

func (p *proc) store(off int64, v uint64) { p.t.Helper(); p.ok("store %x %x", off, v) }

func (p *proc) kill() {
	p.cmd.Process.Kill()
	p.cmd.Wait()
}

func (p *proc) stop() {
	defer func() {
		for range p.replies {
		}
	}()
	if p.cmd.ProcessState != nil {
		return
	}
	fmt.Fprintln(p.stdin, "exit")
	p.stdin.Close()
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(hangDeadline):
		p.cmd.Process.Kill()
		<-done
	}
}
