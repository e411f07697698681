package tests

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsmkit/dsm/dsm"
	"github.com/dsmkit/dsm/internal/mapclient/mapclienttest"
)

// TestDeadMappingFaults: a dead local dsmd never hands an application
// wrong data. This test process maps a region through n1 (plain loads are
// safe here: a dsmd process resolves the faults), then n1 gets SIGKILL.
// Every plain access through Bytes() must then fault: on a page the
// process held, on a page it held until n2 wrote it (n1's copy invalidated:
// the kernel would fill it with zeros), on a page never held (zeros too),
// and a store to a page never held (it would succeed). The other accesses
// fail with ErrDaemonUnavailable, and Close works.
func TestDeadMappingFaults(t *testing.T) {
	c := startCluster(t, 2)
	c.waitHealthy(1)
	c.waitHealthy(2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl1, err := dsm.Dial(ctx, c.nodes[0].socket)
	if err != nil {
		t.Fatal(err)
	}
	defer cl1.Close()
	cl2, err := dsm.Dial(ctx, c.nodes[1].socket)
	if err != nil {
		t.Fatal(err)
	}
	defer cl2.Close()
	const ps = 4096
	if err := cl1.CreateRegion(ctx, "dead", 4*ps); err != nil {
		t.Fatal(err)
	}
	r1, err := cl1.Map(ctx, "dead")
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	var r2 *dsm.Region
	eventually(t, "n2 maps the region", time.Minute, func() error {
		r2, err = cl2.Map(ctx, "dead")
		return err
	})
	defer r2.Close()

	b := r1.Bytes()
	b[0] = 'x'      // page 0: held (Modified) by n1
	if b[ps] != 0 { // page 1: held Shared by n1, until n2 writes it
		t.Fatalf("page 1 starts with %#x", b[ps])
	}
	if _, err := r2.WriteAt([]byte("elsewhere"), ps); err != nil {
		t.Fatal(err)
	}

	n1 := c.nodes[0]
	if err := n1.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-n1.done
	select {
	case <-r1.Done():
	case <-time.After(time.Minute):
		t.Fatal("the mapping did not notice that dsmd is gone")
	}
	if err := r1.Err(); !errors.Is(err, dsm.ErrDaemonUnavailable) {
		t.Fatalf("Err after dsmd died: %v", err)
	}
	for _, a := range []struct {
		what  string
		off   int
		store bool
	}{
		{"load of a page held", 1, false},
		{"load of a page written on n2 since", ps + 1, false},
		{"load of a page never held", 2*ps + 2, false},
		{"store to a page never held", 3*ps + 3, true},
	} {
		if r := mapclienttest.Touch(b, a.off, a.store, time.Minute); r.Err != nil || !r.Faulted {
			t.Errorf("%s after dsmd died: no fault (read %#x, %v)", a.what, r.V, r.Err)
		}
	}
	if _, err := r1.ReadAt(make([]byte, 8), ps); !errors.Is(err, dsm.ErrDaemonUnavailable) {
		t.Errorf("ReadAt after dsmd died: %v", err)
	}
	if _, err := r1.AddUint64(ctx, 8, 1); !errors.Is(err, dsm.ErrDaemonUnavailable) {
		t.Errorf("Add after dsmd died: %v", err)
	}
	if err := r1.Close(); err != nil && !errors.Is(err, dsm.ErrDaemonUnavailable) {
		t.Fatalf("Close of a dead region: %v", err)
	}
}
