package tests

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// watchdogStop is how long TestWatchdogStoppedDaemon keeps n1 stopped:
// well past its lease (LeaseLength 1.5 s).
const watchdogStop = 4 * time.Second

// watchdogBound is the latest an access may succeed after dsmd stopped:
// its lease ran at most L(1-ε) - R = 1.185 s after its last request, the
// lease page's deadline watchdogMargin (R/3 = 100 ms) before that, and
// dsmd itself would have had to be done suspending by the end of the
// lease plus R: L(1-ε) = 1.485 s after the last request. An access later
// than that is one the majority may already have stopped allowing.
const watchdogBound = 1485 * time.Millisecond

func boottimeNow() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}

// watchTick is one "tick" line of dsmclient watch-loop.
type watchTick struct {
	now, lastOK   time.Duration
	faults, value uint64
}

// TestWatchdogStoppedDaemon: a client process maps a region through n1 and
// loads and stores a word in a loop, checking that it always finds the
// value it stored last. n1's dsmd is then stopped (SIGSTOP) for longer
// than its lease, so it cannot suspend its page cache itself: the
// library's watchdog (docs/failover.md §9) must make the mapping
// inaccessible, so that no access succeeds later than watchdogBound after
// the stop. After SIGCONT the client must either resume, finding the value
// it stored last, or report its mapping dead (a dsmd declared failed meanwhile
// may start again as a new incarnation and drop its sessions); it must
// never read anything else.
func TestWatchdogStoppedDaemon(t *testing.T) {
	c := startClusterWith(t, 3, nil)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	const region = "watchdog"
	c.createRegion(t, 1, region, 16*4096)
	p := c.startClient(t, 1, region, "watch-loop", "0")
	if l := p.next(t); l != "started" {
		t.Fatalf("dsmclient: %q, want started", l)
	}
	n1 := c.nodes[0]
	stopped := false
	t.Cleanup(func() {
		if stopped {
			n1.cmd.Process.Signal(syscall.SIGCONT)
		}
	})

	var (
		ticks []watchTick
		dead  string
	)
	// read takes the client's lines until until (or its exit); it fails
	// the test on a wrong value.
	read := func(until time.Time) {
		t.Helper()
		for {
			select {
			case l, ok := <-p.lines:
				if !ok {
					<-p.done
					if dead == "" {
						t.Fatalf("dsmclient exited (%v) without saying its mapping died: %s", p.err, p.stderrString())
					}
					return
				}
				switch {
				case strings.HasPrefix(l, "tick "):
					var k watchTick
					var now, last int64
					if _, err := fmt.Sscanf(l, "tick %d %d %d %d", &now, &last, &k.faults, &k.value); err != nil {
						t.Fatalf("dsmclient: %q: %v", l, err)
					}
					k.now, k.lastOK = time.Duration(now), time.Duration(last)
					ticks = append(ticks, k)
				case strings.HasPrefix(l, "dead: "):
					dead = l
				case strings.HasPrefix(l, "wrong "):
					var got, want uint64
					fmt.Sscanf(l, "wrong %d %d", &got, &want)
					if got < want {
						// A value it stored before: its later stores are
						// gone while its mapping lives on (as when a new
						// incarnation drops the pages set aside but keeps
						// the sessions), which it must be told of.
						t.Fatalf("dsmclient read %d, a value it stored before its last (%d), on a live mapping: its last stores were lost silently", got, want)
					}
					t.Fatalf("dsmclient read a value it never stored: %s", l)
				default:
					t.Fatalf("dsmclient: unexpected %q", l)
				}
			case <-time.After(time.Until(until)):
				return
			}
		}
	}
	// The loop runs: accesses succeed.
	read(time.Now().Add(time.Second))
	if len(ticks) == 0 || ticks[len(ticks)-1].value == 0 || dead != "" {
		t.Fatalf("the client's loop does not run: %d ticks, dead %q", len(ticks), dead)
	}
	before := ticks[len(ticks)-1]

	stopAt := boottimeNow()
	if err := n1.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped = true
	read(time.Now().Add(watchdogStop))
	contAt := boottimeNow()
	if err := n1.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false

	// While n1 was stopped: the last access that succeeded, as the client
	// saw it up to the SIGCONT.
	var last watchTick
	for _, k := range ticks {
		if k.now < contAt && k.lastOK > last.lastOK {
			last = k
		}
	}
	var final watchTick
	for _, k := range ticks {
		if k.now < contAt {
			final = k
		}
	}
	if final.now < stopAt+watchdogBound {
		t.Fatalf("the client reported nothing after %v of the stop (last report %v after it)", watchdogBound, final.now-stopAt)
	}
	took := last.lastOK - stopAt
	t.Logf("the last access succeeded %v after SIGSTOP (bound %v); %d accesses before the stop, %d faults during it",
		took.Round(time.Millisecond), watchdogBound, before.value, final.faults-before.faults)
	if took > watchdogBound {
		t.Fatalf("an access succeeded %v after dsmd was stopped, past its lease (bound %v): the watchdog did not cut the mapping off", took, watchdogBound)
	}
	if final.faults == before.faults && dead == "" {
		t.Fatalf("the client's accesses neither faulted nor succeeded while dsmd was stopped")
	}

	// After SIGCONT: the client resumes (an access succeeds after it, on
	// the value it stored last, which it checks) or its mapping dies.
	deadline := time.Now().Add(90 * time.Second)
	for dead == "" && time.Now().Before(deadline) {
		n := len(ticks)
		read(time.Now().Add(500 * time.Millisecond))
		if len(ticks) > n && ticks[len(ticks)-1].lastOK > contAt {
			break
		}
	}
	switch {
	case dead != "":
		t.Logf("after SIGCONT the mapping died: %s", dead)
		if !strings.Contains(dead, "dsmd") && !strings.Contains(dead, "daemon") {
			t.Errorf("the mapping died for an unexpected reason: %s", dead)
		}
	case len(ticks) > 0 && ticks[len(ticks)-1].lastOK > contAt:
		k := ticks[len(ticks)-1]
		t.Logf("after SIGCONT the client resumed %v later, its stores intact (%d in all)", (k.lastOK - contAt).Round(time.Millisecond), k.value)
	default:
		t.Fatalf("90 s after SIGCONT the client neither resumed nor saw its mapping die (last tick %+v)\n%s", ticks[len(ticks)-1], tail(n1.logString(), 4000))
	}
}
