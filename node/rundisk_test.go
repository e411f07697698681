package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// mountTmpfs mounts a tmpfs of size at dir and returns a function that
// fills it up and one that frees it again.
func mountTmpfs(t *testing.T, dir, size string) (fill, free func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs as the data directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("cannot mount a tmpfs (%v)", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			fds, _ := os.ReadDir("/proc/self/fd")
			for _, fd := range fds {
				if l, _ := os.Readlink("/proc/self/fd/" + fd.Name()); strings.HasPrefix(l, dir) {
					t.Logf("still open: %s", l)
				}
			}
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	filler := filepath.Join(dir, "filler")
	fill = func() {
		t.Helper()
		f, err := os.OpenFile(filler, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		chunk := make([]byte, 4<<10)
		for {
			if _, err := f.Write(chunk); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("filling %s: %v", dir, err)
				}
				return
			}
		}
	}
	free = func() {
		t.Helper()
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
	}
	return fill, free
}

// TestRunningNodeOnFullDisk fills the disk (a real tmpfs) of a running
// single-node cluster while its directory takes writes (region creations,
// each a Raft entry). The first fill: dsmd deletes its disk reserve and
// the creations go on. The second fill takes that room too: creations
// fail with errors, the process does not die (pebble's failed commit and
// raft's unsaved term would end it), and reads of a region's bytes are
// served throughout. Once the disk is freed, creations are taken again.
func TestRunningNodeOnFullDisk(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	fill, free := mountTmpfs(t, dir, "128m")
	var logs syncBuffer
	cfg := singleNodeConfig(dir)
	cfg.DiskReserve = 32 << 20
	n, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	conn, err := grpc.NewClient("unix://"+n.Addrs().Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	adm, cli := dsmpb.NewAdminClient(conn), dsmpb.NewClientClient(conn)
	waitHealthy(t, adm)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := cli.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: "keep", Size: 16 << 12}); err != nil {
		t.Fatal(err)
	}
	want := []byte(strings.Repeat("kept;", 800))
	for {
		_, err := adm.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{Region: "keep", Data: want})
		if err == nil {
			break
		}
		if code(err) != codes.NotFound || ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	read := func(when string) {
		t.Helper()
		got, err := adm.ReadMemory(ctx, &dsmpb.ReadMemoryRequest{Region: "keep", Length: uint32(len(want))})
		if err != nil || string(got.Data) != string(want) {
			t.Fatalf("read %s: %v", when, err)
		}
	}
	next := 0
	create := func() error {
		next++
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		defer ccancel()
		_, err := cli.CreateRegion(cctx, &dsmpb.CreateRegionRequest{Name: fmt.Sprintf("r%d", next), Size: 1 << 12})
		return err
	}

	fill()
	for i := range 10 {
		if err := create(); err != nil {
			t.Fatalf("creation %d after the first fill (the reserve should give room): %v", i, err)
		}
	}
	if !strings.Contains(logs.String(), "released its reserve") {
		t.Fatalf("the reserve was not released after the first fill; logs:\n%s", logs.String())
	}
	read("after the first fill")

	fill()
	var failed int
	var lastErr error
	const tries = 4
	for i := range tries {
		if lastErr = create(); lastErr != nil {
			failed++
		}
		if i%2 == 0 {
			read(fmt.Sprintf("with the disk full, after %d creations", i))
		}
	}
	if failed == 0 {
		t.Fatalf("every creation succeeded on a full disk")
	}
	t.Logf("on a full disk: %d of %d creations failed, the last with %v", failed, tries, lastErr)
	if !strings.Contains(logs.String(), "the directory's writes are refused") {
		t.Fatalf("the refusal is not logged; logs:\n%s", logs.String())
	}
	read("with the disk full")

	free()
	deadline := time.Now().Add(60 * time.Second)
	for create() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("no region created 60 s after the disk was freed")
		}
		time.Sleep(time.Second)
	}
	read("after the disk was freed")
}
