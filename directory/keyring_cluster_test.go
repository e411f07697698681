package directory_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/ids"
)

func withKeys(cfg directory.Config, keys ...[]byte) directory.Config {
	cfg.GossipKeys = keys
	return cfg
}

// gossipSees reports whether d's failure detector knows node id.
func gossipSees(d *directory.Directory, id ids.NodeID) bool {
	return slices.ContainsFunc(d.GossipMembers(), func(m directory.GossipMember) bool { return m.ID == id })
}

// waitAliveOn waits until the replicas of nodes on list exactly alive,
// and their gossip sees each of them alive.
func (c *cluster) waitAliveOn(on []ids.NodeID, alive ...ids.NodeID) {
	c.t.Helper()
	waitFor(c.t, "alive members on the keyed nodes", func() bool {
		for _, id := range on {
			d := c.node(id)
			if !slices.Equal(d.View().Alive(), alive) {
				return false
			}
			for _, a := range alive {
				if !slices.ContainsFunc(d.GossipMembers(), func(m directory.GossipMember) bool { return m.ID == a && m.State == directory.StateAlive }) {
					return false
				}
			}
		}
		return true
	})
}

func keyStatus(res directory.KeyringResult, k []byte) directory.KeyStatus {
	i := slices.IndexFunc(res.Keys, func(s directory.KeyStatus) bool { return bytes.Equal(s.Key, k) })
	if i < 0 {
		return directory.KeyStatus{Key: k}
	}
	return res.Keys[i]
}

// TestGossipEncryption: members without the cluster's key cannot join;
// the key is rotated on a running cluster (install, use, remove) and a
// node with only the new key joins afterwards, one with only the old key
// does not; the keyring survives a restart.
func TestGossipEncryption(t *testing.T) {
	k1, k2 := directory.NewGossipKey(), directory.NewGossipKey()
	c := newCluster(t)
	seed := c.config(1, 3, 3, nil).GossipAddr
	for i := 1; i <= 3; i++ {
		var join []string
		if i > 1 {
			join = []string{seed}
		}
		c.start(withKeys(c.config(ids.NodeID(i), 3, 3, join), k1))
	}
	c.waitMembers(1, 2, 3)
	ctx := ctxT(t)

	// Intruders: no key, and another key. Node 6, with the key, starts
	// after them: once it is a member, they had their chance.
	c.start(c.config(4, 0, 3, []string{seed}))
	c.start(withKeys(c.config(5, 0, 3, []string{seed}), directory.NewGossipKey()))
	c.start(withKeys(c.config(6, 0, 3, []string{seed}), k1))
	c.waitAliveOn([]ids.NodeID{1, 2, 3, 6}, 1, 2, 3, 6)
	for _, id := range []ids.NodeID{1, 2, 3, 6} {
		for _, intruder := range []ids.NodeID{4, 5} {
			if gossipSees(c.node(id), intruder) {
				t.Errorf("%v's gossip sees %v, which has no valid key", id, intruder)
			}
		}
	}
	for _, intruder := range []ids.NodeID{4, 5} {
		if gossipSees(c.node(intruder), 1) {
			t.Errorf("%v's gossip sees the cluster", intruder)
		}
		c.stop(intruder)
	}

	if _, err := c.node(2).Keyring(ctx, directory.KeyringUse, k2); !errors.Is(err, directory.ErrKeyNotInstalled) {
		t.Fatalf("use of a key nobody holds: %v", err)
	}
	res, err := c.node(2).Keyring(ctx, directory.KeyringInstall, k2)
	if err != nil || res.Errors != nil || res.Members != 4 || keyStatus(res, k2).Installed != 4 || keyStatus(res, k1).Primary != 4 {
		t.Fatalf("install: %+v, %v", res, err)
	}
	if _, err := c.node(3).Keyring(ctx, directory.KeyringRemove, k1); !errors.Is(err, directory.ErrPrimaryKey) {
		t.Fatalf("remove of the primary key: %v", err)
	}
	res, err = c.node(3).Keyring(ctx, directory.KeyringUse, k2)
	if err != nil || res.Errors != nil || keyStatus(res, k2).Primary != 4 {
		t.Fatalf("use: %+v, %v", res, err)
	}
	res, err = c.node(6).Keyring(ctx, directory.KeyringRemove, k1)
	if err != nil || res.Errors != nil || keyStatus(res, k1).Installed != 0 || len(res.Keys) != 1 {
		t.Fatalf("remove: %+v, %v", res, err)
	}
	res, err = c.node(1).Keyring(ctx, directory.KeyringList, nil)
	if err != nil || res.Members != 4 || len(res.Keys) != 1 || !bytes.Equal(res.Keys[0].Key, k2) || res.Keys[0].Primary != 4 {
		t.Fatalf("list after the rotation: %+v, %v", res, err)
	}

	// The cluster still works: a write through a follower, gossip between
	// everyone, and a new node with the new key only joins; one with the
	// old key only does not.
	if _, err := c.node(6).CreateRegion(ctx, spec("after-rotation")); err != nil {
		t.Fatal(err)
	}
	c.start(withKeys(c.config(8, 0, 3, []string{seed}), k1))
	c.start(withKeys(c.config(7, 0, 3, []string{seed}), k2))
	c.waitAliveOn([]ids.NodeID{1, 2, 3, 6, 7}, 1, 2, 3, 6, 7)
	for _, d := range c.live() {
		if d.NodeID() != 8 && gossipSees(d, 8) {
			t.Errorf("%v's gossip sees node 8, which has the removed key only", d.NodeID())
		}
	}
	c.stop(8)

	// The keyring is kept: node 2 restarts with the old key on its
	// command line and still uses the new one.
	b, err := os.ReadFile(filepath.Join(c.config(2, 3, 3, nil).DataDir, directory.KeyringFile))
	if err != nil {
		t.Fatal(err)
	}
	if kept, err := directory.ParseKeyringFile(b); err != nil || len(kept) != 1 || !bytes.Equal(kept[0], k2) {
		t.Fatalf("node 2's keyring file: %x, %v", kept, err)
	}
	c.stop(2)
	c.start(withKeys(c.config(2, 3, 3, nil), k1))
	c.waitMembers(1, 2, 3, 6, 7)
	if _, err := c.node(2).CreateRegion(ctx, spec("after-restart")); err != nil {
		t.Fatal(err)
	}
}
