package tests

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestClusterTransport checks that the cluster runs on the transport under
// test (each member publishes a verbs address of it), and, on ofi, that a
// dsmd on another transport that joins is refused plainly: it leaves with
// an error that says why, and the cluster goes on without it.
func TestClusterTransport(t *testing.T) {
	c := startClusterWith(t, 2, nil)
	c.waitHealthy(1)
	var members struct {
		Members []struct {
			Node      uint32 `json:"node_id"`
			State     string `json:"state"`
			VerbsAddr string `json:"verbs_addr"`
		} `json:"members"`
	}
	c.ctlJSON(1, &members, "members")
	if len(members.Members) != 2 {
		t.Fatalf("%d members, want 2: %+v", len(members.Members), members)
	}
	for _, m := range members.Members {
		ofi := strings.HasPrefix(m.VerbsAddr, "ofi:")
		switch {
		case testTransport == "tcp" && ofi, testTransport == "ofi" && !ofi:
			t.Errorf("n%d publishes verbs address %q; the run is on %s", m.Node, m.VerbsAddr, testTransport)
		case ofi && testOFIProvider != "" && !strings.HasPrefix(m.VerbsAddr, "ofi:"+testOFIProvider+":"):
			t.Errorf("n%d publishes verbs address %q; the run is on provider %s", m.Node, m.VerbsAddr, testOFIProvider)
		}
	}
	if testTransport != "ofi" {
		t.Log("a mixed cluster needs a dsmd built with the ofi tag: checked on the ofi runs")
		return
	}

	// A third node on tcp joins the ofi cluster.
	gossip := c.nodes[0].arg("--gossip-addr")
	dir := filepath.Join(t.TempDir(), "n3")
	p := &proc{id: 3, socket: filepath.Join(dir, "dsmd.sock"), log: &bytes.Buffer{},
		args: []string{"--id", "3", "--data-dir", dir, "--gossip-addr", freeAddr(t), "--raft-addr", freeAddr(t),
			"--rpc-addr", freeAddr(t), "--verbs-addr", freeAddr(t), "--join", gossip, "--transport", "tcp"}}
	p.start(t)
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	select {
	case <-p.done:
	case <-time.After(90 * time.Second):
		t.Fatalf("a tcp dsmd that joined the ofi cluster still runs after 90 s:\n%s", tail(p.logString(), 4000))
	}
	log := p.logString()
	if p.err == nil || !strings.Contains(log, "every member must run the same --transport") {
		t.Fatalf("the tcp dsmd exited with %v; want an error that names the transports:\n%s", p.err, tail(log, 4000))
	}
	t.Logf("the tcp dsmd exited (%v): %s", p.err, lastLineWith(log, "every member must run the same"))
	c.waitHealthy(1)
	for _, n := range c.nodes {
		if !strings.Contains(n.logString(), "runs on another transport") {
			t.Errorf("n%d did not log the member on another transport", n.id)
		}
	}
}

func lastLineWith(s, sub string) string {
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], sub) {
			return lines[i]
		}
	}
	return fmt.Sprintf("(no line with %q)", sub)
}
