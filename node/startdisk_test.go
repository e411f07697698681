package node

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// startResult is what startIncarnation returned.
type startResult struct {
	n   *Node
	err error
}

func singleNodeConfig(dataDir string) Config {
	cfg := Default()
	cfg.ID, cfg.DataDir, cfg.BootstrapExpect = 1, dataDir, 1
	cfg.GossipAddr, cfg.RaftAddr, cfg.RPCAddr, cfg.VerbsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.CacheSize = 8 << 20
	return cfg
}

// TestStartWaitsForDiskSpace starts dsmd's first incarnation on a real
// full file system (a tmpfs mounted as its data directory and filled up):
// it neither starts nor returns an error (dsmd would exit), it says the
// disk is full and tries again; once the filler is removed it starts and
// serves. Without the wait the first attempt's error comes back.
func TestStartWaitsForDiskSpace(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	fill, free := mountTmpfs(t, dir, "64m")
	fill()

	var logs syncBuffer
	var status syncBuffer
	opts := Options{
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Notify: func(states ...string) { status.Write([]byte(strings.Join(states, " ") + "\n")) },
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan startResult, 1)
	go func() {
		n, err := startIncarnation(ctx, singleNodeConfig(dir), opts, false)
		done <- startResult{n, err}
	}()

	// The wait is logged at the first attempt; then three more seconds
	// (two more attempts) pass without a return.
	deadline := time.Now().Add(30 * time.Second)
	var quiet <-chan time.Time
	for waited := false; !waited; {
		if quiet == nil && strings.Contains(logs.String(), "attempt=1") {
			quiet = time.After(3 * time.Second)
		}
		select {
		case r := <-done:
			if r.n != nil {
				r.n.Close()
			}
			t.Fatalf("startIncarnation on a full disk returned (%v, %v); want it to wait for space", r.n != nil, r.err)
		case <-quiet:
			waited = true
		case <-time.After(50 * time.Millisecond):
		}
		if quiet == nil && time.Now().After(deadline) {
			t.Fatalf("no failed attempt logged in 30 s; logs:\n%s", logs.String())
		}
	}
	if !strings.Contains(logs.String(), "the file system of the data directory is full") {
		t.Fatalf("the wait does not say the disk is full; logs:\n%s", logs.String())
	}
	if st := status.String(); !strings.Contains(st, "STATUS=waiting for free space under "+dir) || !strings.Contains(st, "EXTEND_TIMEOUT_USEC=") {
		t.Fatalf("the service manager was not told of the wait: %q", status.String())
	}

	free()
	var r startResult
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("not started 60 s after the space was freed; logs:\n%s", logs.String())
	}
	if r.err != nil || r.n == nil {
		t.Fatalf("startIncarnation after the space was freed: (%v, %v)", r.n != nil, r.err)
	}
	defer r.n.Close()
	conn, err := grpc.NewClient("unix://"+r.n.Addrs().Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitHealthy(t, dsmpb.NewAdminClient(conn))
	if !strings.Contains(logs.String(), "node started after failed attempts") {
		t.Errorf("the start after the wait is not logged; logs:\n%s", logs.String())
	}
}

// TestFirstStartFailsOnOtherErrors: a first start that fails for another
// reason than a full disk (here a port in use) returns its error at once,
// so that dsmd exits with it rather than waiting.
func TestFirstStartFailsOnOtherErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := singleNodeConfig(t.TempDir())
	cfg.GossipAddr = ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	n, err := startIncarnation(ctx, cfg, Options{}, false)
	if n != nil {
		n.Close()
	}
	if err == nil {
		t.Fatalf("the first start with the gossip port in use succeeded")
	}
	if diskFull(err) {
		t.Fatalf("a port in use taken for a full disk: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("the first start with the gossip port in use waited %v for its error", time.Since(start))
	}
	t.Logf("first start: %v", err)
}
