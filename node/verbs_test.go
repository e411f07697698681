package node

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestTransportFlags: --transport picks the verbs backend; ofi needs a
// dsmd built with the ofi tag (and says so plainly otherwise), no TLS
// unless --insecure, and --ofi-provider goes with it only.
func TestTransportFlags(t *testing.T) {
	base := []string{"--id", "2", "--data-dir", "/d"}
	cfg, err := ParseFlags(base, &bytes.Buffer{})
	if err != nil || cfg.Transport != TransportTCP {
		t.Fatalf("default transport %q, %v; want tcp", cfg.Transport, err)
	}
	// What --transport ofi is refused for: nothing in a dsmd with the
	// libfabric backend; the missing backend, before anything else,
	// without it.
	ofiOK, plaintext := "", "verbs-plaintext"
	if !ofiCompiled {
		ofiOK, plaintext = "transport", "transport"
	}
	for _, c := range []struct {
		args    []string
		setting string // "" when accepted
	}{
		{[]string{"--transport", "tcp"}, ""},
		{[]string{"--transport", "udp"}, "transport"},
		{[]string{"--ofi-provider", "shm"}, "ofi-provider"},
		{[]string{"--transport", "ofi"}, ofiOK},
		{[]string{"--transport", "ofi", "--ofi-provider", "tcp;ofi_rxm"}, ofiOK},
		{[]string{"--transport", "ofi", "--tls-dir", "/etc/dsm/tls"}, "transport"},
		{[]string{"--transport", "ofi", "--tls-dir", "/etc/dsm/tls", "--insecure"}, ofiOK},
		{[]string{"--transport", "ofi", "--tls-dir", "/etc/dsm/tls", "--insecure", "--verbs-plaintext"}, plaintext},
	} {
		_, err := ParseFlags(append(append([]string(nil), base...), c.args...), &bytes.Buffer{})
		var ce *ConfigError
		switch {
		case c.setting == "" && err != nil:
			t.Errorf("%v: %v", c.args, err)
		case c.setting != "" && (!errors.As(err, &ce) || ce.Setting != c.setting):
			t.Errorf("%v: err %v, want a ConfigError about --%s", c.args, err, c.setting)
		}
	}
	if !ofiCompiled {
		_, err := ParseFlags(append(base, "--transport", "ofi"), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "this dsmd was built without libfabric support (build tag ofi)") {
			t.Errorf("--transport ofi without the ofi tag: %v", err)
		}
	}
}

func TestOFIProviderFromEnvironment(t *testing.T) {
	t.Setenv("FI_PROVIDER", "shm")
	if p := (Config{}).ofiProvider(); p != "shm" {
		t.Errorf("with FI_PROVIDER=shm: %q", p)
	}
	if p := (Config{OFIProvider: "tcp;ofi_rxm"}).ofiProvider(); p != "tcp;ofi_rxm" {
		t.Errorf("--ofi-provider wins over FI_PROVIDER: %q", p)
	}
	t.Setenv("FI_PROVIDER", "^udp,tcp")
	if p := (Config{}).ofiProvider(); p != "" {
		t.Errorf("with a list in FI_PROVIDER: %q, want libfabric to apply it", p)
	}
}

func TestVerbsKind(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:7949":             "tcp",
		"[::1]:7949":                 "tcp",
		"ofi:tcp;ofi_rxm:0200aabb":   "ofi tcp;ofi_rxm",
		"ofi:shm:64736d5f6f66695f00": "ofi shm",
		"ofi:verbs;ofi_rxm:0a0b":     "ofi verbs;ofi_rxm",
		"ofi:":                       "ofi",
	} {
		if got := verbsKind(addr); got != want {
			t.Errorf("verbsKind(%q) = %q, want %q", addr, got, want)
		}
	}
}

// TestClusterTransport: the cluster's transport is the one most alive
// members run, the leader's on a tie, and a member keeps its own when
// nothing breaks the tie; one odd member never outvotes the others, even
// as the leader.
func TestClusterTransport(t *testing.T) {
	const ofi, tcp = "ofi shm", "tcp"
	for _, c := range []struct {
		mine   string
		count  map[string]int
		leader string
		want   string
	}{
		{tcp, map[string]int{tcp: 1, ofi: 2}, ofi, ofi},
		{tcp, map[string]int{tcp: 1, ofi: 2}, tcp, ofi},
		{ofi, map[string]int{tcp: 1, ofi: 2}, tcp, ofi},
		{tcp, map[string]int{tcp: 1, ofi: 1}, ofi, ofi},
		{ofi, map[string]int{tcp: 1, ofi: 1}, ofi, ofi},
		{tcp, map[string]int{tcp: 1, ofi: 1}, "", tcp},
		{ofi, map[string]int{tcp: 1, ofi: 1}, "", ofi},
		{tcp, map[string]int{tcp: 3}, "", tcp},
		{tcp, map[string]int{tcp: 1, ofi: 1, "ofi tcp;ofi_rxm": 1}, "ofi tcp;ofi_rxm", "ofi tcp;ofi_rxm"},
	} {
		for range 20 { // map order varies
			if got := clusterTransport(c.mine, c.count, c.leader); got != c.want {
				t.Fatalf("mine %q, count %v, leader's %q: %q, want %q", c.mine, c.count, c.leader, got, c.want)
			}
		}
	}
}
