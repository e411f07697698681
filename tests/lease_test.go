package tests

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPartitionLease cuts n3 off from the other two with a firewall that
// drops every packet sent to its ports (nftables on loopback): n1 and n2
// cannot reach it, and the voters fence it before they declare it failed,
// so no majority grants it a lease any more and it suspends local access.
// A store on n3 to a page it holds Modified then does not complete. The
// failure verdict is n3's departure: the page is served at its home with
// the data written back before the cut (n3's later write, never synced
// and never seen by anyone, is gone, as a crash would lose it), and the
// majority writes it. n3 learns that it was declared failed and starts a
// new incarnation in the same process, which the majority admits once
// the firewall goes; it then reads the majority's value, never its own
// lost write.
func TestPartitionLease(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for nftables (CI runs it as root)")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (CI installs nftables)")
	}
	const region = "part"
	c, homes := threeNodesWithRegion(t, region)
	off := strconv.FormatUint(homes[1]*4096, 10)
	c.mustCtl(t, 1, "put", region, off, "v1-by-n1")
	// n2 reads it: n1 writes it back to its home (and backups).
	if out := c.mustCtl(t, 2, "get", region, off, "8"); !strings.Contains(out, "v1-by-n1") {
		t.Fatalf("n2 reads %q", out)
	}
	// n3 takes it Modified and writes it without Sync.
	c.mustCtl(t, 3, "put", region, off, "v2-by-n3")

	n3 := c.nodes[2]
	var ports []string
	for i, a := range n3.args {
		if slices.Contains([]string{"--gossip-addr", "--raft-addr", "--rpc-addr", "--verbs-addr"}, a) && i+1 < len(n3.args) {
			_, p, _ := strings.Cut(n3.args[i+1], ":")
			ports = append(ports, p)
		}
	}
	if len(ports) != 4 {
		t.Fatalf("n3's ports: %v from %v", ports, n3.args)
	}
	table := fmt.Sprintf("dsmtest_lease_%d", os.Getpid())
	set := strings.Join(ports, ", ")
	nft := func(script string) error {
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft: %v: %s", err, out)
		}
		return nil
	}
	if err := nft(fmt.Sprintf(`table inet %s {
	chain input {
		type filter hook input priority -10; policy accept;
		tcp dport { %s } drop
		udp dport { %s } drop
	}
}
`, table, set, set)); err != nil {
		t.Fatal(err)
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

	eventually(t, "n3 suspends local access", 30*time.Second, func() error {
		if !strings.Contains(n3.logString(), "lease over") {
			return fmt.Errorf("n3 has not logged the end of its lease")
		}
		return nil
	})
	if out, errs, code := c.ctl(3, "--timeout", "2s", "put", region, off, "v3-by-n3"); code == 0 {
		t.Fatalf("a store on n3 without a lease completed: %s%s", out, errs)
	}
	eventually(t, "n1 declares n3 failed", 30*time.Second, func() error {
		if st := c.memberStates(1)[3]; st != "dead" {
			return fmt.Errorf("n3 is %q at n1", st)
		}
		return nil
	})
	eventually(t, "n1 reads the page written back before the cut", 30*time.Second, func() error {
		out, errs, code := c.ctl(1, "get", region, off, "8")
		if code != 0 {
			return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
		}
		if !strings.Contains(out, "v1-by-n1") {
			t.Fatalf("n1 reads %q after n3's failure; want the data written back before the cut (v1-by-n1)", out)
		}
		return nil
	})
	c.mustCtl(t, 2, "put", region, off, "v4-by-n2")
	if out := c.mustCtl(t, 1, "get", region, off, "8"); !strings.Contains(out, "v4-by-n2") {
		t.Fatalf("n1 reads %q after n2's write", out)
	}
	eventually(t, "n3 learns it was declared failed and starts a new incarnation", 30*time.Second, func() error {
		if !strings.Contains(n3.logString(), "starting a new incarnation") {
			return fmt.Errorf("n3 has not started a new incarnation")
		}
		return nil
	})
	if out, errs, code := c.ctl(3, "--timeout", "2s", "get", region, off, "8"); code == 0 {
		t.Fatalf("n3, cut off, served the page: %s%s", out, errs)
	}

	heal()
	eventually(t, "n3 rejoins as a new incarnation and reads the majority's value", 60*time.Second, func() error {
		out, errs, code := c.ctl(3, "--timeout", "5s", "get", region, off, "8")
		if code != 0 {
			return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errs))
		}
		if !strings.Contains(out, "v4-by-n2") {
			t.Fatalf("n3 reads %q after it rejoined; want the majority's v4-by-n2", out)
		}
		return nil
	})
	var members struct {
		Members []struct {
			Node        uint32 `json:"node_id"`
			Incarnation uint64 `json:"incarnation"`
		} `json:"members"`
	}
	c.ctlJSON(1, &members, "members")
	for _, m := range members.Members {
		// Incarnation 2 may have been admitted while cut off (gossip goes
		// out) and declared failed in turn.
		if m.Node == 3 && m.Incarnation < 2 {
			t.Errorf("n3 rejoined as incarnation %d; want a new one", m.Incarnation)
		}
	}
}
