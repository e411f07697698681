package systemd

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/dsmkit/dsm/node"
)

// unit reads a unit file into its [Service]-style keys (a key given twice
// keeps every value, in order).
func unit(t *testing.T, name string) map[string][]string {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	keys := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || l[0] == '#' || l[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			t.Fatalf("%s: %q is not KEY=VALUE", name, l)
		}
		keys[k] = append(keys[k], v)
	}
	return keys
}

func one(t *testing.T, u map[string][]string, key string) string {
	t.Helper()
	if len(u[key]) != 1 {
		t.Fatalf("dsmd.service: %s given %d times, want once", key, len(u[key]))
	}
	return u[key][0]
}

func TestUnit(t *testing.T) {
	u := unit(t, "dsmd.service")
	for key, want := range map[string]string{
		"Type": "notify", "NotifyAccess": "main", "User": "dsm", "Group": "dsm",
		"ExecStart":       "/usr/local/bin/dsmd --config /etc/dsm/dsmd.json",
		"NoNewPrivileges": "yes", "ProtectSystem": "strict", "CapabilityBoundingSet": "",
		"AmbientCapabilities": "", "StateDirectory": "dsm", "ReadWritePaths": "/run/dsm",
	} {
		if got := one(t, u, key); got != want {
			t.Errorf("dsmd.service: %s=%s, want %s", key, got, want)
		}
	}
	// dsmd's leave is bounded by --leave-timeout, 20 s by default.
	if s, err := strconv.Atoi(one(t, u, "TimeoutStopSec")); err != nil || s < 30 {
		t.Errorf("TimeoutStopSec=%s: leave dsmd its 20 s leave and a margin", one(t, u, "TimeoutStopSec"))
	}
	b, err := os.ReadFile("dsm.tmpfiles")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^d /run/dsm 0750 dsm dsm -$`).Match(b) {
		t.Error("dsm.tmpfiles does not make /run/dsm for dsm")
	}
	b, err = os.ReadFile("dsm.sysusers")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^u dsm `).Match(b) {
		t.Error("dsm.sysusers does not make the user dsm")
	}
}

// TestConfig: dsmd accepts the example configuration, and it agrees with
// the unit (sockets in /run/dsm, the data in the StateDirectory).
func TestConfig(t *testing.T) {
	b, err := os.ReadFile("dsmd.json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	// This machine has no group dsm and no keyring in /etc/dsm.
	if m["socket_group"] != "dsm" {
		t.Errorf("socket_group %v, want dsm (dsm.sysusers)", m["socket_group"])
	}
	m["socket_group"] = strconv.Itoa(os.Getgid())
	dir := t.TempDir()
	keyring := filepath.Join(dir, "keyring.json")
	if err := os.WriteFile(keyring, []byte(`["`+strings.Repeat("A", 43)+`="]`), 0o600); err != nil {
		t.Fatal(err)
	}
	m["gossip_keyring_file"] = keyring
	b, err = json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "dsmd.json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := node.ParseFlags([]string{"--config", file}, io.Discard)
	if err != nil {
		t.Fatalf("dsmd refuses dsmd.json: %v", err)
	}
	a := cfg.Resolve()
	if filepath.Dir(a.Socket) != "/run/dsm" || filepath.Dir(a.MapSocket) != "/run/dsm" {
		t.Errorf("sockets %s, %s: want them in /run/dsm (tmpfiles, ReadWritePaths)", a.Socket, a.MapSocket)
	}
	if a.Socket != node.DefaultSocket {
		t.Errorf("socket %s: clients look at %s without $DSM_ADDR", a.Socket, node.DefaultSocket)
	}
	if cfg.DataDir != "/var/lib/dsm" {
		t.Errorf("data_dir %s: StateDirectory=dsm is /var/lib/dsm", cfg.DataDir)
	}
}

// TestSystemdAnalyze checks the unit with systemd's own tools where they are
// installed: systemd-analyze verify, and the offline security review, whose
// exposure must stay low.
func TestSystemdAnalyze(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("SKIPPED: systemd-analyze is not installed")
	}
	b, err := os.ReadFile("dsmd.service")
	if err != nil {
		t.Fatal(err)
	}
	// verify wants ExecStart's program to exist: this test's own binary
	// stands in for /usr/local/bin/dsmd.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dsmd.service")
	if err := os.WriteFile(file, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/dsmd", self)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", file).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err = exec.Command(sa, "security", "--offline=yes", file).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security --offline=yes: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for dsmd.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in:\n%s", out)
	}
	if x, _ := strconv.ParseFloat(string(m[1]), 64); x > 2.0 {
		t.Errorf("exposure level %s, want at most 2.0 (OK):\n%s", m[1], out)
	}
	t.Logf("systemd-analyze security: exposure %s", m[1])
}
