package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// keygen runs dsmctl keygen.
func keygen(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(dsmctlBin, "keygen").Output()
	if err != nil {
		t.Fatalf("dsmctl keygen: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// argOf is the value of flag name in args.
func argOf(args []string, name string) string {
	i := slices.Index(args, name)
	if i < 0 || i+1 >= len(args) {
		return ""
	}
	return args[i+1]
}

// add starts another dsmd, node id, that joins node 1's gossip address
// and bootstraps nothing; it is stopped with the others.
func (c *cluster) add(t *testing.T, id int, more ...string) *proc {
	t.Helper()
	dir := filepath.Join(filepath.Dir(argOf(c.nodes[0].args, "--data-dir")), fmt.Sprintf("n%d", id))
	p := &proc{id: id, socket: filepath.Join(dir, "dsmd.sock"), log: &bytes.Buffer{}}
	p.args = append([]string{"--id", fmt.Sprint(id), "--data-dir", dir,
		"--gossip-addr", freeAddr(t), "--raft-addr", freeAddr(t), "--rpc-addr", freeAddr(t), "--verbs-addr", freeAddr(t),
		"--join", argOf(c.nodes[0].args, "--gossip-addr"), "--log-level", "info"}, append(transportArgs(), more...)...)
	p.start(t)
	c.nodes = append(c.nodes, p)
	return p
}

// remove ends p (SIGTERM), waits for it and takes it out of the cluster.
func (c *cluster) remove(t *testing.T, p *proc) {
	t.Helper()
	c.nodes = slices.DeleteFunc(c.nodes, func(x *proc) bool { return x == p })
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// memberStates is dsmctl members on node i: node id -> state.
func (c *cluster) memberStates(i int) map[uint32]string {
	c.t.Helper()
	var mem struct {
		Members []struct {
			Node  uint32 `json:"node_id"`
			State string `json:"state"`
		} `json:"members"`
	}
	c.ctlJSON(i, &mem, "members")
	out := map[uint32]string{}
	for _, m := range mem.Members {
		out[m.Node] = m.State
	}
	return out
}

// waitAlive waits until dsmctl members on node 1 shows exactly want, all
// alive.
func (c *cluster) waitAlive(want ...uint32) {
	c.t.Helper()
	eventually(c.t, fmt.Sprintf("members %v alive", want), 60*time.Second, func() error {
		got := c.memberStates(1)
		for _, id := range want {
			if got[id] != "alive" {
				return fmt.Errorf("members %v", got)
			}
		}
		if len(got) != len(want) {
			return fmt.Errorf("members %v, want %v only", got, want)
		}
		return nil
	})
}

type keyringOut struct {
	Members uint32 `json:"members"`
	Keys    []struct {
		Key       string `json:"key"`
		Installed uint32 `json:"installed"`
		Primary   uint32 `json:"primary"`
	} `json:"keys"`
	Errors []struct {
		Node  uint32 `json:"node_id"`
		Error string `json:"error"`
	} `json:"errors"`
}

func (k keyringOut) has(key string) (installed, primary uint32) {
	for _, x := range k.Keys {
		if x.Key == key {
			return x.Installed, x.Primary
		}
	}
	return 0, 0
}

// TestGossipKeyring: with --gossip-key, a dsmd without the key (or with
// another) cannot join; dsmctl keyring rotates the key on a running
// cluster, which stays healthy, and a node started afterwards with only
// the new key joins.
func TestGossipKeyring(t *testing.T) {
	longTest(t)
	t.Parallel()
	k1, k2 := keygen(t), keygen(t)
	if k1 == k2 || len(k1) != 44 {
		t.Fatalf("keygen: %q %q", k1, k2)
	}
	c := launch(t, 3, func(int) []string { return []string{"--gossip-key", k1} })
	c.waitHealthy(1)

	// Intruders first, then a node with the key: once it is a member, the
	// intruders had their chance.
	noKey := c.add(t, 4)
	wrongKey := c.add(t, 5, "--gossip-key", keygen(t))
	c.add(t, 6, "--gossip-key", k1)
	c.waitAlive(1, 2, 3, 6)
	for i := 1; i <= 3; i++ {
		for id := range c.memberStates(i) {
			if id == 4 || id == 5 {
				t.Errorf("n%d's member table has n%d, which has no valid gossip key", i, id)
			}
		}
	}
	for _, p := range []*proc{noKey, wrongKey} {
		if !strings.Contains(p.logString(), "join failed") {
			t.Errorf("n%d did not report its failed join:\n%s", p.id, tail(p.logString(), 2000))
		}
		c.remove(t, p)
	}

	keyring := func(i int, args ...string) keyringOut {
		t.Helper()
		var k keyringOut
		c.ctlJSON(i, &k, append([]string{"keyring"}, args...)...)
		if len(k.Errors) > 0 {
			t.Fatalf("keyring %v on n%d: errors %+v", args, i, k.Errors)
		}
		return k
	}
	// Every node's gossip knows the four members before keys change (a
	// keyring operation names a member gossip has not met yet as failed).
	for i := 1; i <= 4; i++ {
		eventually(t, fmt.Sprintf("keyring list on node index %d answered by 4 members", i), 60*time.Second, func() error {
			out, errs, code := c.ctl(i, "keyring", "list", "--json")
			var k keyringOut
			if code != 0 || json.Unmarshal([]byte(out), &k) != nil || k.Members != 4 || len(k.Errors) > 0 {
				return fmt.Errorf("exit %d: %s%s", code, out, errs)
			}
			if len(k.Keys) != 1 || k.Keys[0].Key != k1 || k.Keys[0].Primary != 4 {
				return fmt.Errorf("keys %+v", k.Keys)
			}
			return nil
		})
	}
	if _, errs, code := c.ctl(2, "keyring", "use", k2); code == 0 || !strings.Contains(errs, "0 of 4 members hold it; install it first") {
		t.Errorf("keyring use of a key nobody holds: exit %d: %s", code, errs)
	}
	if k := keyring(2, "install", k2); k.Members != 4 {
		t.Fatalf("keyring install: %+v", k)
	} else if in, pr := k.has(k2); in != 4 || pr != 0 {
		t.Fatalf("after install: new key on %d, primary on %d: %+v", in, pr, k)
	}
	if _, errs, code := c.ctl(3, "keyring", "remove", k1); code == 0 || !strings.Contains(errs, "primary") {
		t.Errorf("keyring remove of the primary: exit %d: %s", code, errs)
	}
	if in, pr := keyring(3, "use", k2).has(k2); in != 4 || pr != 4 {
		t.Fatalf("after use: new key on %d, primary on %d", in, pr)
	}
	if k := keyring(1, "remove", k1); len(k.Keys) != 1 || k.Keys[0].Key != k2 {
		t.Fatalf("after remove: %+v", k)
	}

	// The cluster keeps working, and a node with only the new key joins.
	c.waitHealthy(1)
	if out, errs, code := c.ctl(1, "region", "create", "rot", "1MiB"); code != 0 {
		t.Fatalf("region create: exit %d: %s%s", code, out, errs)
	}
	if _, errs, code := c.ctl(2, "put", "rot", "0", "rotated"); code != 0 {
		t.Fatalf("put: %s", errs)
	}
	c.add(t, 7, "--gossip-key", k2)
	n7 := len(c.nodes) // its index for ctl
	c.waitAlive(1, 2, 3, 6, 7)
	eventually(t, "keyring list on the new node answered by 5 members", 60*time.Second, func() error {
		out, errs, code := c.ctl(n7, "keyring", "list", "--json")
		var k keyringOut
		if code != 0 || json.Unmarshal([]byte(out), &k) != nil || k.Members != 5 || len(k.Errors) > 0 {
			return fmt.Errorf("exit %d: %s%s", code, out, errs)
		}
		return nil
	})
	if out, errs, code := c.ctl(n7, "get", "rot", "0", "7"); code != 0 || !strings.Contains(out, "rotated") {
		t.Fatalf("get on the new node: exit %d: %s%s", code, out, errs)
	}
	if k := keyring(n7, "list"); k.Members != 5 || len(k.Keys) != 1 || k.Keys[0].Primary != 5 {
		t.Fatalf("keyring list with the new node: %+v", k)
	}
}
