//go:build linux

package localsock

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func TestParseGroups(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []uint32
		err  bool
	}{
		{"Name:\tx\nUid:\t0 0 0 0\nGroups:\t4 24 27 \nNgid:\t0\n", []uint32{4, 24, 27}, false},
		{"Groups:\n", []uint32{}, false},
		{"Groups:\t\t\n", []uint32{}, false},
		{"Name:\tx\n", nil, true},
		{"Groups:\t4 x\n", nil, true},
		{"Groups:\t-1\n", nil, true},
		{"Groups:\t4294967296\n", nil, true},
	} {
		got, err := ParseGroups(strings.NewReader(tc.in))
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("ParseGroups(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
		if err != nil && !errors.Is(err, ErrNoGroups) {
			t.Errorf("ParseGroups(%q): %v does not match ErrNoGroups", tc.in, err)
		}
	}
}

func TestGroupsOfSelf(t *testing.T) {
	g, err := Groups(int32(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.Getgroups()
	for _, w := range want {
		if !slices.Contains(g, uint32(w)) {
			t.Errorf("Groups(self) = %v, missing %d of %v", g, w, want)
		}
	}
	if _, err := Groups(0); err == nil {
		t.Error("Groups(0) succeeded")
	}
}

func TestPolicyAdmit(t *testing.T) {
	id := func(uid, gid uint32, groups ...uint32) Identity {
		return Identity{Cred: Cred{PID: 7, UID: uid, GID: gid}, Groups: groups}
	}
	noGroup := Policy{Socket: "/s", Owner: 500}
	withGroup := Policy{Socket: "/s", Owner: 500, HasGroup: true, Group: 900, GroupName: "dsm"}
	for _, tc := range []struct {
		name string
		p    Policy
		id   Identity
		ok   bool
	}{
		{"root", noGroup, id(0, 0), true},
		{"root with group", withGroup, id(0, 5), true},
		{"owner", noGroup, id(500, 500), true},
		{"other without group", noGroup, id(1000, 900, 900), false},
		{"primary group", withGroup, id(1000, 900), true},
		{"supplementary group", withGroup, id(1000, 1000, 4, 900), true},
		{"not in group", withGroup, id(1000, 1000, 4, 901), false},
		{"groups unreadable", withGroup, id(1000, 1000), false},
	} {
		err := tc.p.Admit(tc.id)
		if (err == nil) != tc.ok {
			t.Errorf("%s: Admit = %v, want allowed %v", tc.name, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrRefused) {
			t.Errorf("%s: %v does not match ErrRefused", tc.name, err)
		}
	}
	err := withGroup.Admit(id(1000, 1000))
	for _, want := range []string{"uid 1000", "/s", "root", "uid 500", "dsm (gid 900)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if err := noGroup.Admit(id(1, 1)); !strings.Contains(err.Error(), "--socket-group") {
		t.Errorf("refusal without a group %q does not say how to let a group in", err)
	}
}

// publicDir is a directory every user can search (t.TempDir's parent is
// its owner's only).
func publicDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "localsock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestListenModeAndGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give the socket another group")
	}
	dir := publicDir(t)
	for _, network := range []string{"unix", "unixpacket"} {
		path := filepath.Join(dir, network+".sock")
		ln, err := Listen(network, path, Perm{Mode: 0o660, HasGroup: true, Group: 4242})
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&fs.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
			t.Errorf("%s: mode %v, want a socket with 0660", network, fi.Mode())
		}
		if g, _ := fileGID(fi); g != 4242 {
			t.Errorf("%s: group %d, want 4242", network, g)
		}
		ents, _ := os.ReadDir(dir)
		if len(ents) != 1 {
			t.Errorf("%s: directory holds %d entries, want the socket only", network, len(ents))
		}
		if _, err := Listen(network, path, Perm{Mode: 0o600}); !errors.Is(err, ErrInUse) {
			t.Errorf("%s: second Listen = %v, want ErrInUse", network, err)
		}
		c, err := net.Dial(network, path)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		ln.Close()
		if _, err := os.Lstat(path); !os.IsNotExist(err) {
			t.Errorf("%s: socket file left after Close: %v", network, err)
		}
	}
}

func TestListenReplacesStale(t *testing.T) {
	dir := publicDir(t)
	path := filepath.Join(dir, "s.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close() // a dead daemon's file
	l2, err := Listen("unix", path, Perm{Mode: 0o600})
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	defer l2.Close()
	if fi, _ := os.Lstat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode())
	}
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen("unix", filepath.Join(dir, "file"), Perm{Mode: 0o600}); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen over a regular file = %v", err)
	}
	if _, err := Listen("unix", filepath.Join(dir, "x"), Perm{Mode: 0o1777}); err == nil {
		t.Error("Listen with mode 01777 succeeded")
	}
}

func TestUnreachable(t *testing.T) {
	dir := publicDir(t)
	inner := filepath.Join(dir, "inner")
	if err := os.Mkdir(inner, 0o700); err != nil {
		t.Fatal(err)
	}
	if os.Chmod(inner, 0o700) != nil {
		t.Fatal("chmod")
	}
	if got := Unreachable(filepath.Join(inner, "s"), false, 0); !strings.Contains(got, inner) {
		t.Errorf("Unreachable = %q, want %s named", got, inner)
	}
	if got := Unreachable(filepath.Join(dir, "s"), false, 0); got != "" {
		t.Errorf("Unreachable in a public dir = %q", got)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(inner, -1, 4242); err != nil {
			t.Fatal(err)
		}
		os.Chmod(inner, 0o710)
		if got := Unreachable(filepath.Join(inner, "s"), true, 4242); got != "" {
			t.Errorf("Unreachable for the dir's group = %q", got)
		}
		if got := Unreachable(filepath.Join(inner, "s"), true, 4243); got == "" {
			t.Error("Unreachable for another group = \"\"")
		}
	}
}

// dialEnv makes the test binary a client: it dials the socket named and
// prints what the server sent.
const dialEnv = "LOCALSOCK_TEST_DIAL"

func TestMain(m *testing.M) {
	if path := os.Getenv(dialEnv); path != "" {
		c, err := net.Dial("unix", path)
		if err != nil {
			os.Stdout.WriteString("dial: " + err.Error())
			os.Exit(0)
		}
		b := make([]byte, 1024)
		n, _ := c.Read(b)
		os.Stdout.Write(b[:n])
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestAdmitListener connects as root and as another uid (the test binary
// run again with other credentials) and checks the verdict each
// connection carries.
func TestAdmitListener(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as another uid")
	}
	dir := publicDir(t)
	path := filepath.Join(dir, "a.sock")
	raw, err := Listen("unix", path, Perm{Mode: 0o666})
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan *Addr, 4)
	ln := Admit(raw, Policy{Socket: path, Owner: 0, HasGroup: true, Group: 4242, GroupName: "g"},
		func(a *Addr) { refused <- a })
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a, ok := FromAddr(c.RemoteAddr())
			switch {
			case !ok:
				c.Write([]byte("no addr"))
			case a.Err != nil:
				c.Write([]byte("refused: " + a.Err.Error()))
			default:
				c.Write([]byte("admitted " + a.Cred.String()))
			}
			c.Close()
		}
	}()
	// The test binary's directory is its owner's only: run a copy.
	bin := filepath.Join(dir, "client")
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(cred *syscall.Credential) string {
		t.Helper()
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), dialEnv+"="+path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("client: %v: %s", err, out)
		}
		return string(out)
	}
	if out := run(nil); !strings.HasPrefix(out, "admitted uid 0") {
		t.Errorf("root: %q", out)
	}
	if out := run(&syscall.Credential{Uid: 65534, Gid: 65534}); !strings.Contains(out, "refused: permission denied: uid 65534 gid 65534") {
		t.Errorf("uid 65534: %q", out)
	}
	if a := <-refused; a.UID != 65534 {
		t.Errorf("onRefuse got %v", a)
	}
	if out := run(&syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{4242}}); !strings.HasPrefix(out, "admitted uid 65534") {
		t.Errorf("uid 65534 in group 4242 (supplementary): %q", out)
	}
	if out := run(&syscall.Credential{Uid: 65534, Gid: 4242}); !strings.HasPrefix(out, "admitted uid 65534") {
		t.Errorf("uid 65534 with primary group 4242: %q", out)
	}
}
