package tcp_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/tcp"
)

// stallBlock is how long TestStalledConnectionBreaks drops the packets to
// the responder: long enough for TCP to back its retransmissions off to
// 12.8 s apart (from 200 ms, doubling: the one after 14 s of loss comes
// at about 25.4 s).
const stallBlock = 14 * time.Second

// TestStalledConnectionBreaks: a connection whose packets are lost for a
// while (nftables drops what goes to the responder's port) stalls with no
// error while TCP backs its retransmissions off, and a Post on it waited
// for TCP's next retransmission, long after the loss ended (seed 660007 of
// the chaos runs, docs/failover.md §10). With Config.UserTimeout the kernel
// breaks the connection and Post dials again within its RetryWindow, so the
// batch completes soon after the loss ends. Only a wide margin is timed:
// the Post must complete within 21 s of its start (the loss ends at 14 s;
// without the user timeout it completes at about 25 s).
func TestStalledConnectionBreaks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for nftables")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft")
	}
	a, err := tcp.Listen(1, "127.0.0.1:0", tcp.Config{UserTimeout: time.Second, RetryWindow: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b := listen(t, 2, "127.0.0.1:0")
	a.AddPeer(2, b.Addr())
	reg := register(t, b, 4096)
	faa := func() []rdma.Op { return []rdma.Op{{Kind: rdma.OpFAA, RKey: reg.Descriptor().RKey, Operand: 1}} }
	if err := a.Post(ctxT(t), 2, faa()); err != nil {
		t.Fatal(err)
	}

	_, port, _ := strings.Cut(b.Addr(), ":")
	table := fmt.Sprintf("dsmtest_stall_%d", os.Getpid())
	nft := func(script string) error {
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft: %v: %s", err, out)
		}
		return nil
	}
	if err := nft(fmt.Sprintf("table inet %s {\n\tchain input {\n\t\ttype filter hook input priority -10; policy accept;\n\t\ttcp dport %s drop\n\t}\n}\n", table, port)); err != nil {
		t.Skipf("cannot set up the packet filter: %v", err)
	}
	healed := false
	heal := func() {
		if !healed {
			healed = true
			if err := nft("delete table inet " + table + "\n"); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(heal)

	start := time.Now()
	done := make(chan error, 1)
	ops := faa()
	go func() { done <- a.Post(ctxT(t), 2, ops) }()
	time.Sleep(stallBlock)
	heal()
	select {
	case err := <-done:
		took := time.Since(start)
		t.Logf("the Post completed %v after its start (the loss ended at %v): %v", took.Round(10*time.Millisecond), stallBlock, err)
		if err != nil {
			t.Fatalf("Post across the stall: %v", err)
		}
		if ops[0].Result != 1 {
			t.Fatalf("FAA returned %d, want 1 (it executed once before)", ops[0].Result)
		}
		if took > stallBlock+7*time.Second {
			t.Fatalf("the Post completed %v after its start, %v after the loss ended: the stalled connection was not broken", took, took-stallBlock)
		}
	case <-time.After(hang):
		t.Fatalf("the Post still waits %v after the loss ended", hang)
	}
}
