package node

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseFlagsDerivesAddresses(t *testing.T) {
	cfg, err := ParseFlags([]string{"--id", "2", "--data-dir", "/d", "--bind", "10.1.2.3", "--port-base", "9000",
		"--raft-addr", "10.1.2.3:9999", "--join", "a:1,b:2", "--join", "c:3", "--cache-size", "64MiB", "--insecure"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Resolve()
	want := Addrs{Gossip: "10.1.2.3:9000", Raft: "10.1.2.3:9999", RPC: "10.1.2.3:9002", Verbs: "10.1.2.3:9003",
		Socket: "/d/dsmd.sock", MapSocket: "/d/map.sock"}
	if a != want {
		t.Fatalf("Resolve = %+v, want %+v", a, want)
	}
	if got := strings.Join(cfg.Join, " "); got != "a:1 b:2 c:3" {
		t.Fatalf("join = %q", got)
	}
	if cfg.CacheSize != 64<<20 {
		t.Fatalf("cache size = %d", cfg.CacheSize)
	}
}

func TestParseFlagsConfigFileFlagsWin(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "dsmd.json")
	body := `{"id": 7, "data_dir": "/from/file", "cache_size": "2GiB", "join": ["f:1"], "log_level": "debug", "bootstrap_expect": 3}`
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseFlags([]string{"--config", file, "--data-dir", "/from/flag", "--join", "g:2"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ID != 7 || cfg.DataDir != "/from/flag" || cfg.CacheSize != 2<<30 || cfg.LogLevel != "debug" || cfg.BootstrapExpect != 3 {
		t.Fatalf("cfg = %+v", cfg)
	}
	if len(cfg.Join) != 1 || cfg.Join[0] != "g:2" {
		t.Fatalf("join = %v: the flag must replace the file's list", cfg.Join)
	}
	// Without the flag the file's list stays.
	cfg, err = ParseFlags([]string{"--config", file}, &bytes.Buffer{})
	if err != nil || len(cfg.Join) != 1 || cfg.Join[0] != "f:1" || cfg.DataDir != "/from/file" {
		t.Fatalf("cfg = %+v, err %v", cfg, err)
	}
	// Unknown keys are refused, not ignored.
	if err := os.WriteFile(file, []byte(`{"id": 1, "data_dir": "/x", "cache": 3}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseFlags([]string{"--config", file}, &bytes.Buffer{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("unknown key: err = %v, want ErrConfig", err)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		setting string
	}{
		{[]string{"--data-dir", "/d"}, "id"},
		{[]string{"--id", "1"}, "data-dir"},
		{[]string{"--id", "1", "--data-dir", "/d", "--log-level", "loud"}, "log-level"},
		{[]string{"--id", "1", "--data-dir", "/d", "--port-base", "70000"}, "port-base"},
		{[]string{"--id", "1", "--data-dir", "/d", "--grpc-addr", "nocolon"}, "grpc-addr"},
		{[]string{"--id", "1", "--data-dir", "/d", "--bootstrap-expect", "-1"}, "bootstrap-expect"},
	} {
		_, err := ParseFlags(tc.args, &bytes.Buffer{})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Setting != tc.setting || !errors.Is(err, ErrConfig) {
			t.Errorf("%v: err = %v, want a ConfigError on %s", tc.args, err, tc.setting)
		}
	}
	if _, err := ParseFlags([]string{"--id", "x"}, &bytes.Buffer{}); err == nil {
		t.Error("--id x: no error")
	}
	if _, err := ParseFlags([]string{"--cache-size", "lots"}, &bytes.Buffer{}); err == nil {
		t.Error("--cache-size lots: no error")
	}
	var out bytes.Buffer
	if _, err := ParseFlags([]string{"--help"}, &out); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: err = %v", err)
	}
}

func TestUsageMentionsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	Usage(&out)
	c := Default()
	fs := flags(&c, &bytes.Buffer{})
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		if !strings.Contains(out.String(), "-"+f.Name) {
			t.Errorf("usage does not mention -%s", f.Name)
		}
	})
	if n < 17 || !strings.Contains(out.String(), "Example") {
		t.Fatalf("usage lists %d flags, example present: %v", n, strings.Contains(out.String(), "Example"))
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]Size{"4096": 4096, "4KiB": 4096, "64MiB": 64 << 20, "2G": 2 << 30,
		"1GB": 1e9, "1.5GiB": 3 << 29, " 8 mib ": 8 << 20} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "1XB", "NaN", "1e30TiB"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q): no error", in)
		}
	}
	if s := Size(64 << 20).String(); s != "64MiB" {
		t.Errorf("String = %q", s)
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"4096", "64MiB", "1.5GiB", "1e400", "-0", "kib"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSize(s)
		if err == nil && v > 0 {
			// A parsed size prints and parses back to itself.
			back, err := ParseSize(v.String())
			if err != nil || back != v {
				t.Fatalf("%q -> %d -> %q -> %d, %v", s, v, v.String(), back, err)
			}
		}
	})
}

// TestSecureByDefault: without TLS, only loopback addresses are bound
// unless --insecure; the TLS flags come as a set.
func TestSecureByDefault(t *testing.T) {
	base := []string{"--id", "2", "--data-dir", "/d"}
	for _, c := range []struct {
		args    []string
		setting string // "" when accepted
	}{
		{nil, ""},
		{[]string{"--bind", "127.0.0.2"}, ""},
		{[]string{"--bind", "10.1.2.3"}, "bind"},
		{[]string{"--verbs-addr", "0.0.0.0:7000"}, "verbs-addr"},
		{[]string{"--grpc-addr", ":7400"}, "grpc-addr"},
		{[]string{"--grpc-addr", "localhost:7400"}, ""},
		{[]string{"--bind", "10.1.2.3", "--insecure"}, ""},
		{[]string{"--bind", "10.1.2.3", "--tls-dir", "/etc/dsm/tls"}, ""},
		{[]string{"--bind", "10.1.2.3", "--tls-ca", "ca.pem", "--tls-cert", "n.pem", "--tls-key", "k.pem"}, ""},
		{[]string{"--tls-ca", "ca.pem", "--tls-cert", "n.pem"}, "tls-key"},
		{[]string{"--verbs-plaintext"}, "verbs-plaintext"},
		{[]string{"--verbs-plaintext", "--tls-dir", "/etc/dsm/tls"}, ""},
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
	cfg, _ := ParseFlags(append(base, "--tls-dir", "/etc/dsm/tls", "--tls-key", "/k.pem"), &bytes.Buffer{})
	if f, on := cfg.TLSFiles(); !on || f.CA != "/etc/dsm/tls/ca.pem" || f.Cert != "/etc/dsm/tls/node-2.pem" || f.Key != "/k.pem" {
		t.Fatalf("TLSFiles = %+v, %v", f, on)
	}
}
