package node

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsmkit/dsm/directory"
)

func TestGossipKeyFlags(t *testing.T) {
	k := directory.EncodeGossipKey(bytes.Repeat([]byte{9}, 32))
	dir := t.TempDir()
	file := filepath.Join(dir, "keys.json")
	if err := os.WriteFile(file, []byte(`["`+k+`"]`), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`["short"]`), 0o600)
	base := []string{"--id", "1", "--data-dir", "/d"}
	for _, tc := range []struct {
		args []string
		keys int
		err  string
	}{
		{nil, 0, ""},
		{[]string{"--gossip-key", k}, 1, ""},
		{[]string{"--gossip-keyring-file", file}, 1, ""},
		{[]string{"--gossip-key", "c2hvcnQ="}, 0, "--gossip-key: directory: invalid gossip key: 5 bytes, want 16, 24 or 32"},
		{[]string{"--gossip-key", "%%"}, 0, "not base64"},
		{[]string{"--gossip-keyring-file", bad}, 0, "--gossip-keyring-file: " + bad},
		{[]string{"--gossip-keyring-file", filepath.Join(dir, "none")}, 0, "no such file"},
		{[]string{"--gossip-key", k, "--gossip-keyring-file", file}, 0, "not both"},
	} {
		cfg, err := ParseFlags(append(append([]string{}, base...), tc.args...), &bytes.Buffer{})
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		if keys, _ := cfg.gossipKeys(); len(keys) != tc.keys {
			t.Errorf("%v: %d keys", tc.args, len(keys))
		}
	}
}
