package tests

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestUnavailablePageFails is the no-hang bound of a mapped access (design
// §10, must-hold 5) on real processes, for pages that are lost: the home
// and the backup of a shard are killed with kill -9 and restarted (new
// incarnations, with empty memory), so no copy of the shard is left. A
// client process on the third node, whose mapping has a fault timeout of
// 2 s, reads with ReadAt a page of that shard it never held. The read
// fails with ErrUnavailable naming the departed home instead of waiting
// forever (dsmd fails the fault, the library turns EHWPOISON into the
// error dsmd gave). A plain load of another such page through Bytes()
// faults (SIGBUS, recovered by the client with debug.SetPanicOnFault) and
// the client learns why from Region.Unavailable. Pages homed at the
// survivor are read as usual. The only thing timed is that nothing hangs
// (clientHang). (A page whose home died and that has a backup is served
// again once the failure verdict moves it: TestKilledHomeFailsOver.)
func TestUnavailablePageFails(t *testing.T) {
	const region = "un"
	c, homes := threeNodesWithRegion(t, region)
	offOf := func(page uint64) string { return strconv.FormatUint(page*4096, 10) }
	first, home, backup, s := c.firstShardCopies(t, region)
	// The error names the shard's last home: its home, or the backup it
	// moved to when the home departed first.
	names := func(s string) bool {
		return strings.Contains(s, fmt.Sprintf("n%d", home)) || strings.Contains(s, fmt.Sprintf("n%d", backup))
	}
	c.mustCtl(t, s, "put", region, offOf(homes[uint32(s)]), fmt.Sprintf("homed-at-n%d", s))

	c.killAndRestart(t, home, backup)
	// The survivor knows the shard is lost once its engine fails a page of it at
	// once (a page the clients below do not use).
	probe := offOf(first + 3)
	eventually(t, fmt.Sprintf("n%d fails a page of the lost shard as unavailable", s), 60*time.Second, func() error {
		_, errs, code := c.ctl(s, "get", region, probe, "8")
		if code != 0 && strings.Contains(errs, "unavailable") && names(errs) {
			return nil
		}
		return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
	})

	// ReadAt of a page of the lost shard that the survivor never held.
	start := time.Now()
	out, err := c.client(s, region, "-fault-timeout", "2s", "read-at", offOf(first+1), "8")
	switch {
	case err == nil:
		t.Fatalf("ReadAt of a page of the lost shard returned %q", out)
	case strings.Contains(err.Error(), "hung"):
		t.Fatalf("ReadAt of a page of the lost shard hung: %v", err)
	case !strings.Contains(err.Error(), "page unavailable") || !names(err.Error()):
		t.Fatalf("ReadAt of a page of the lost shard: %v; want ErrUnavailable naming n%d or n%d", err, home, backup)
	}
	t.Logf("ReadAt failed after %v: %v", time.Since(start).Round(100*time.Millisecond), err)

	// A plain load of another such page faults, and the client can say why.
	start = time.Now()
	out, err = c.client(s, region, "-fault-timeout", "2s", "try-get-bytes", offOf(first+2), "8")
	if err != nil {
		t.Fatalf("plain load of a page of the lost shard: %v", err)
	}
	if !strings.HasPrefix(out, "fault: ") || !names(out) {
		t.Fatalf("plain load of a page of the lost shard: %q; want a fault naming n%d or n%d", out, home, backup)
	}
	t.Logf("plain load faulted after %v: %s", time.Since(start).Round(100*time.Millisecond), strings.TrimSpace(out))

	// The survivors' pages are served as usual.
	got := c.mustClient(t, s, region, "-fault-timeout", "2s", "read-at", offOf(homes[uint32(s)]), "11")
	if want := fmt.Sprintf("%x", fmt.Sprintf("homed-at-n%d", s)); got != want {
		t.Fatalf("n%d reads %s at the page homed at itself, want %s", s, got, want)
	}
}
