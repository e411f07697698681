package tests

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestUnavailablePageFails is the no-hang bound of a mapped access (design
// §10, must-hold 5) on real processes: after kill -9 of n3, a client
// process on n1 whose mapping has a fault timeout of 2 s reads, with
// ReadAt, a page homed at n3 that n1 never held. The read fails with
// ErrUnavailable naming n3 instead of waiting forever (dsmd poisons the
// fault, the library turns EHWPOISON into the error dsmd gave). A plain
// load of another such page through Bytes() faults (SIGBUS, recovered by
// the client with debug.SetPanicOnFault) and the client learns why from
// Region.Unavailable. Pages homed at the survivors are read as usual. The
// only thing timed is that nothing hangs (clientHang).
func TestUnavailablePageFails(t *testing.T) {
	const region = "un"
	c, homes := threeNodesWithRegion(t, region)
	offOf := func(page uint64) string { return strconv.FormatUint(page*4096, 10) }
	c.mustCtl(t, 1, "put", region, offOf(homes[1]), "homed-at-n1")

	victim := c.nodes[2]
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	// n1 knows that n3 is down once its engine fails a page homed there at
	// once (a page the clients below do not use).
	probe := offOf(homes[3] + 3)
	eventually(t, "n1 fails a page homed at the dead n3 as unavailable", 60*time.Second, func() error {
		_, errs, code := c.ctl(1, "get", region, probe, "8")
		if code != 0 && strings.Contains(errs, "unavailable") && strings.Contains(errs, "n3") {
			return nil
		}
		return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
	})

	// ReadAt of a page homed at n3 that n1 never held.
	start := time.Now()
	out, err := c.client(1, region, "-fault-timeout", "2s", "read-at", offOf(homes[3]+1), "8")
	switch {
	case err == nil:
		t.Fatalf("ReadAt of a page homed at the dead n3 returned %q", out)
	case strings.Contains(err.Error(), "hung"):
		t.Fatalf("ReadAt of a page homed at the dead n3 hung: %v", err)
	case !strings.Contains(err.Error(), "page unavailable") || !strings.Contains(err.Error(), "n3"):
		t.Fatalf("ReadAt of a page homed at the dead n3: %v; want ErrUnavailable naming n3", err)
	}
	t.Logf("ReadAt failed after %v: %v", time.Since(start).Round(100*time.Millisecond), err)

	// A plain load of another such page faults, and the client can say why.
	start = time.Now()
	out, err = c.client(1, region, "-fault-timeout", "2s", "try-get-bytes", offOf(homes[3]+2), "8")
	if err != nil {
		t.Fatalf("plain load of a page homed at the dead n3: %v", err)
	}
	if !strings.HasPrefix(out, "fault: ") || !strings.Contains(out, "n3") {
		t.Fatalf("plain load of a page homed at the dead n3: %q; want a fault naming n3", out)
	}
	t.Logf("plain load faulted after %v: %s", time.Since(start).Round(100*time.Millisecond), strings.TrimSpace(out))

	// The survivors' pages are served as usual.
	got := c.mustClient(t, 1, region, "-fault-timeout", "2s", "read-at", offOf(homes[1]), "11")
	if want := fmt.Sprintf("%x", "homed-at-n1"); got != want {
		t.Fatalf("n1 reads %s at the page homed at the live n1, want %s", got, want)
	}
}
