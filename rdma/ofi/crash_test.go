//go:build ofi

package ofi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

const childEnv = "DSM_OFI_CRASH_CHILD"

// crashChild is the peer process of TestPeerProcessDies: it opens an
// endpoint, registers memory, tells the parent about both on stdout, learns
// the parent's address on stdin, and then serves until it is killed.
func crashChild(prov string) {
	tr, err := Listen(2, "127.0.0.1:0", Config{Provider: prov})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	mem, err := rdma.Alloc(4 << 20)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	reg, err := tr.Register(mem, rdma.AccessAll)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	d := reg.Descriptor()
	name := tr.shmName
	if name == "" {
		name = "-"
	}
	fmt.Printf("PEER %s %d %d %d %s\n", tr.Addr(), d.RKey.Key, d.RKey.Base, os.Getpid(), name)
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		os.Exit(1)
	}
	if err := tr.AddPeer(1, strings.TrimSpace(in.Text())); err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Println("READY")
	select {} // until killed
}

// TestPeerProcessDies kills (SIGKILL) a peer process while large reads to
// it are in flight: every Post must fail with ErrPeerUnreachable within
// about OpTimeout, the survivor must close cleanly, and for shm the file the
// dead endpoint left in /dev/shm must be removed by the next Listen.
func TestPeerProcessDies(t *testing.T) {
	if prov := os.Getenv(childEnv); prov != "" {
		crashChild(prov)
		return
	}
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, prov := range []string{"tcp;ofi_rxm", "shm", "sockets"} {
		t.Run(prov, func(t *testing.T) { testPeerProcessDies(t, prov) })
	}
}

func testPeerProcessDies(t *testing.T, prov string) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestPeerProcessDies$")
	cmd.Env = append(os.Environ(), childEnv+"="+prov)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
		}
		cmd.Wait()
	}()
	out := bufio.NewScanner(stdout)
	line := func() string {
		if !out.Scan() {
			t.Fatalf("child ended: %v", out.Err())
		}
		return out.Text()
	}
	var addr, shmName string
	var key, base uint64
	var pid int
	if _, err := fmt.Sscanf(line(), "PEER %s %d %d %d %s", &addr, &key, &base, &pid, &shmName); err != nil {
		t.Fatalf("child said: %v", err)
	}

	const opTimeout = time.Second
	a, err := Listen(1, "127.0.0.1:0", Config{Provider: prov, OpTimeout: opTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.AddPeer(2, addr); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(stdin, a.Addr())
	if got := line(); got != "READY" {
		t.Fatalf("child said %q", got)
	}
	rk := rdma.RKey{Key: key, Base: base}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Post(ctx, 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: rk, Operand: 1}}); err != nil {
		t.Fatalf("post before the kill: %v", err)
	}

	const workers = 4
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ops := make([]rdma.Op, 4)
			for i := range ops {
				ops[i] = rdma.Op{Kind: rdma.OpRead, RKey: rk, Offset: uint64(i) << 20, Buf: make([]byte, 1<<20)}
			}
			for {
				if err := a.Post(ctx, 2, ops); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	killedAt := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed = true
	wg.Wait()
	took := time.Since(killedAt)
	close(errs)
	for err := range errs {
		if !errors.Is(err, rdma.ErrPeerUnreachable) {
			t.Errorf("post to the killed peer: %v, want ErrPeerUnreachable", err)
		}
	}
	t.Logf("%s: all posts failed %v after the kill (OpTimeout %v)", prov, took.Round(time.Millisecond), opTimeout)

	if prov == "shm" {
		cmd.Wait()
		file := filepath.Join(shmDir, shmName)
		if _, err := os.Stat(file); err != nil {
			t.Logf("the killed endpoint left no file (%v)", err)
			return
		}
		b, err := Listen(3, "", Config{Provider: "shm"})
		if err != nil {
			t.Fatal(err)
		}
		b.Close()
		if _, err := os.Stat(file); !os.IsNotExist(err) {
			t.Errorf("stale file %s of the killed endpoint survived the next Listen: %v", file, err)
		}
	}
}

// deadPeer is a crash child of the running test that endpoint a (node 1)
// knows as node 2.
type deadPeer struct {
	cmd *exec.Cmd
	rk  rdma.RKey
}

// startPeer starts the running test's binary as a crash child on prov and
// connects it with a.
func startPeer(t *testing.T, test, prov string, a *Transport) *deadPeer {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$")
	cmd.Env = append(os.Environ(), childEnv+"="+prov)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	out := bufio.NewScanner(stdout)
	if !out.Scan() {
		t.Fatalf("child ended: %v", out.Err())
	}
	var addr, shmName string
	var key, base uint64
	var pid int
	if _, err := fmt.Sscanf(out.Text(), "PEER %s %d %d %d %s", &addr, &key, &base, &pid, &shmName); err != nil {
		t.Fatalf("child said %q: %v", out.Text(), err)
	}
	if err := a.AddPeer(2, addr); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(stdin, a.Addr())
	if !out.Scan() || out.Text() != "READY" {
		t.Fatalf("child did not get ready: %q", out.Text())
	}
	return &deadPeer{cmd: cmd, rk: rdma.RKey{Key: key, Base: base}}
}

// kill ends the child with SIGKILL and reaps it.
func (d *deadPeer) kill() {
	d.cmd.Process.Kill()
	d.cmd.Wait()
}

// TestRemovePeerFailsPendingAtOnce kills a peer process while FAAs and
// large READs to it are in flight and then removes the peer, as dsmd does
// when the directory's failure detector marks the member failed: the
// pending operations must fail at once (not after OpTimeout), saying that
// their outcome is unknown, and later ones before anything is posted.
func TestRemovePeerFailsPendingAtOnce(t *testing.T) {
	if prov := os.Getenv(childEnv); prov != "" {
		crashChild(prov)
		return
	}
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, prov := range []string{"tcp;ofi_rxm", "shm"} {
		t.Run(prov, func(t *testing.T) {
			a, err := Listen(1, "127.0.0.1:0", Config{Provider: prov, OpTimeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			peer := startPeer(t, "TestRemovePeerFailsPendingAtOnce", prov, a)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			errs := make(chan error, 4)
			for w := 0; w < 4; w++ {
				go func() {
					ops := []rdma.Op{{Kind: rdma.OpFAA, RKey: peer.rk, Operand: 1}}
					if w%2 == 1 {
						ops = []rdma.Op{{Kind: rdma.OpRead, RKey: peer.rk, Buf: make([]byte, 1<<20)}}
					}
					for {
						if err := a.Post(ctx, 2, ops); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			time.Sleep(100 * time.Millisecond)
			peer.kill()
			time.Sleep(200 * time.Millisecond)
			removed := time.Now()
			a.RemovePeer(2)
			for w := 0; w < 4; w++ {
				select {
				case err := <-errs:
					if !errors.Is(err, rdma.ErrPeerUnreachable) && !errors.Is(err, rdma.ErrUnknownPeer) {
						t.Errorf("post pending on the removed peer: %v", err)
					}
				case <-time.After(2 * time.Second):
					t.Fatalf("a post to the dead peer still pending 2 s after RemovePeer (OpTimeout 20 s)")
				}
			}
			t.Logf("%s: every post failed %v after RemovePeer", prov, time.Since(removed).Round(time.Millisecond))
			err = a.Post(ctx, 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: peer.rk, Operand: 1}})
			if !errors.Is(err, rdma.ErrUnknownPeer) {
				t.Errorf("post after RemovePeer: %v, want ErrUnknownPeer", err)
			}
		})
	}
}

// TestDeadPeerDoesNotWedge kills (SIGKILL) a peer process while FAAs to it
// are in flight, on every provider: the FAAs fail with ErrPeerUnreachable
// (on shm at once, as the transport notices that the process is gone;
// elsewhere within OpTimeout), and the endpoint stays usable: FAA and WRITE
// on its own memory and on a live peer's work, and so do messages to the
// live peer. libfabric 1.17's shm endpoint that posted the FAAs is left
// with their responses missing for ever, which blocks every later request
// that needs a response (the provider completes them in order); that is
// why on shm requests to a peer leave from an endpoint of the peer's own
// (see the package documentation, "Dead peers").
func TestDeadPeerDoesNotWedge(t *testing.T) {
	if prov := os.Getenv(childEnv); prov != "" {
		crashChild(prov)
		return
	}
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, prov := range []string{"shm", "tcp;ofi_rxm", "sockets"} {
		t.Run(prov, func(t *testing.T) { testDeadPeerDoesNotWedge(t, prov) })
	}
}

func testDeadPeerDoesNotWedge(t *testing.T, prov string) {
	const opTimeout = 2 * time.Second
	a, err := Listen(1, "127.0.0.1:0", Config{Provider: prov, OpTimeout: opTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	live, err := Listen(3, "127.0.0.1:0", Config{Provider: prov})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if err := a.AddPeer(3, live.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := live.AddPeer(1, a.Addr()); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	live.SetHandler(func(_ ids.NodeID, msg []byte) { got <- msg })
	peer := startPeer(t, "TestDeadPeerDoesNotWedge", prov, a)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	for w := 0; w < 2; w++ {
		go func() {
			for {
				if err := a.Post(ctx, 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: peer.rk, Operand: 1}}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	killed := time.Now()
	peer.kill()
	for w := 0; w < 2; w++ {
		select {
		case err := <-errs:
			if !errors.Is(err, rdma.ErrPeerUnreachable) {
				t.Errorf("FAA to the killed peer: %v, want ErrPeerUnreachable", err)
			}
		case <-time.After(opTimeout + 3*time.Second):
			t.Fatalf("an FAA to the killed peer still pending %v after the kill (OpTimeout %v)", time.Since(killed).Round(time.Millisecond), opTimeout)
		}
	}
	t.Logf("%s: the FAAs to the killed peer failed %v after the kill (OpTimeout %v)", prov, time.Since(killed).Round(time.Millisecond), opTimeout)

	for _, target := range []struct {
		name string
		tr   *Transport
	}{{"own", a}, {"live peer's", live}} {
		mem, err := rdma.Alloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		defer rdma.Free(mem)
		reg, err := target.tr.Register(mem, rdma.AccessAll)
		if err != nil {
			t.Fatal(err)
		}
		rk := reg.Descriptor().RKey
		ops := []rdma.Op{
			{Kind: rdma.OpFAA, RKey: rk, Operand: 5},
			{Kind: rdma.OpWrite, RKey: rk, Offset: 64, Buf: []byte("after the kill")},
			{Kind: rdma.OpCAS, RKey: rk, Offset: 8, Compare: 0, Operand: 7},
		}
		if err := a.Post(ctx, target.tr.LocalID(), ops); err != nil {
			t.Fatalf("%s memory after a peer died with FAAs in flight: %v", target.name, err)
		}
		if string(mem[64:78]) != "after the kill" || mem[0] != 5 || mem[8] != 7 {
			t.Errorf("%s memory after the ops: % x", target.name, mem[:80])
		}
	}
	if err := a.Send(ctx, 3, []byte("still here")); err != nil {
		t.Fatalf("message to the live peer: %v", err)
	}
	select {
	case m := <-got:
		if string(m) != "still here" {
			t.Errorf("live peer got %q", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the live peer got no message")
	}
	a.RemovePeer(2)
	if err := a.Post(ctx, 2, []rdma.Op{{Kind: rdma.OpFAA, RKey: peer.rk, Operand: 1}}); !errors.Is(err, rdma.ErrUnknownPeer) {
		t.Errorf("post after RemovePeer: %v, want ErrUnknownPeer", err)
	}
	if prov == "shm" {
		// The requests the dead peer never answered went with its
		// endpoint: every slot is free again.
		deadline := time.Now().Add(2 * time.Second)
		for len(a.free) != cap(a.free) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := cap(a.free) - len(a.free); n != 0 {
			t.Errorf("%d operation slots still taken after the dead peer's endpoint was retired", n)
		}
	}
}
