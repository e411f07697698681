package tests

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The local security tests run dsmctl and dsmclient as other users, so
// they need root.

// user is a local identity a client runs as.
type user struct {
	uid, gid uint32
	groups   []uint32
}

func (u user) String() string { return fmt.Sprintf("uid %d", u.uid) }

func (u user) cred() *syscall.Credential {
	return &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: append([]uint32{}, u.groups...)}
}

const socketGroup = 4242

// capSysPtrace is CAP_SYS_PTRACE.
const capSysPtrace = 19

// publicDir is a directory every user can search, removed at the end.
func publicDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "dsm-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// localCluster starts one dsmd whose sockets lie in a public directory,
// with the socket group socketGroup and mode (0666 lets every user reach
// dsmd, so that its own credential check is what refuses them).
func localCluster(t *testing.T, mode string) (*dsmCluster, string, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runs clients as other users: needs root")
	}
	dir := publicDir(t)
	sock, msock := filepath.Join(dir, "n1.sock"), filepath.Join(dir, "n1.map")
	c := startClusterWith(t, 1, map[int][]string{1: {"--socket", sock, "--map-socket", msock,
		"--socket-group", fmt.Sprint(socketGroup), "--socket-mode", mode}})
	c.nodes[0].socket = sock
	c.waitHealthy(1)
	return c, sock, msock
}

// as runs bin with args as u and returns its output and error.
func as(t *testing.T, u user, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientHang)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	// userfaultfd(2) needs CAP_SYS_PTRACE unless vm.unprivileged_userfaultfd
	// is 1 or /dev/userfaultfd is open to the user: the clients keep that
	// one capability (it does not change who they are on dsmd's socket).
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: u.cred(), AmbientCaps: []uintptr{capSysPtrace}}
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	cmd.Dir = "/"
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %v as %v hung", filepath.Base(bin), args, u)
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("%s %v as %v: %v", filepath.Base(bin), args, u, err)
	}
	if err != nil {
		return out.String() + errb.String(), fmt.Errorf("exit %d: %s", ee.ExitCode(), strings.TrimSpace(errb.String()+"\n"+out.String()))
	}
	return out.String(), nil
}

func ctlAs(t *testing.T, u user, sock string, args ...string) (string, error) {
	return as(t, u, dsmctlBin, append([]string{"--addr", sock, "--timeout", "10s"}, args...)...)
}

func clientAs(t *testing.T, u user, sock, region string, args ...string) (string, error) {
	return as(t, u, dsmclientBin(t), append([]string{"-addr", sock, "-region", region, "-timeout", "30s"}, args...)...)
}

func mustFail(t *testing.T, what string, out string, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s succeeded: %s", what, out)
		return
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %v, want it to say %q", what, err, w)
		}
	}
}

// mustOK returns a check that out, err is a success: mustOK(t, what)(f()).
func mustOK(t *testing.T, what string) func(out string, err error) string {
	return func(out string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return out
	}
}

// TestLocalSocketGroup: a user outside the socket group is refused by
// dsmd on both sockets with a clear error; a member of the group (primary
// or supplementary) is served.
func TestLocalSocketGroup(t *testing.T) {
	longTest(t)
	t.Parallel()
	c, sock, msock := localCluster(t, "0666")
	c.createRegion(t, 1, "r", 1<<20)
	for _, path := range []string{sock, msock} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o666 || st.Gid != socketGroup {
			t.Errorf("%s: mode %v group %d, want 0666 and %d", path, fi.Mode(), st.Gid, socketGroup)
		}
	}
	outsider := user{uid: 2000, gid: 2000}
	out, err := ctlAs(t, outsider, sock, "status")
	mustFail(t, "dsmctl status as an outsider", out, err, "permission denied", "uid 2000", "group gid 4242")
	out, err = clientAs(t, outsider, sock, "r", "read-at", "0", "8")
	mustFail(t, "dsmclient read-at as an outsider", out, err, "permission denied", "uid 2000")
	out, err = clientAs(t, outsider, sock, "r", "map-direct", msock)
	mustFail(t, "mapping as an outsider", out, err, "permission denied", "uid 2000", msock)

	for _, member := range []user{{uid: 2001, gid: socketGroup}, {uid: 2002, gid: 2002, groups: []uint32{7, socketGroup}}} {
		mustOK(t, fmt.Sprintf("dsmctl region ls as %v in the group", member))(ctlAs(t, member, sock, "region", "ls"))
		mustOK(t, fmt.Sprintf("mapping as %v in the group", member))(clientAs(t, member, sock, "r", "map-direct", msock))
		if got := mustOK(t, "put-bytes")(clientAs(t, member, sock, "r", "put-bytes", "0", "c0ffee")); strings.TrimSpace(got) != "ok" {
			t.Errorf("put-bytes as %v: %q", member, got)
		}
		if got := mustOK(t, "read-at")(clientAs(t, member, sock, "r", "read-at", "0", "3")); strings.TrimSpace(got) != "c0ffee" {
			t.Errorf("read-at as %v: %q", member, got)
		}
	}
	if !strings.Contains(c.nodes[0].logString(), "local client refused") {
		t.Error("dsmd did not log the refusals")
	}
}

// TestLocalSocketMode: with the default group mode (0660) the file system
// keeps outsiders away before dsmd sees them.
func TestLocalSocketMode(t *testing.T) {
	t.Parallel()
	_, sock, msock := localCluster(t, "0660")
	for _, path := range []string{sock, msock} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o660 {
			t.Fatalf("%s: %v %v, want mode 0660", path, fi.Mode(), err)
		}
	}
	out, err := ctlAs(t, user{uid: 2000, gid: 2000}, sock, "status")
	mustFail(t, "dsmctl status as an outsider", out, err, "permission denied")
	mustOK(t, "dsmctl region ls in the group")(ctlAs(t, user{uid: 2001, gid: socketGroup}, sock, "region", "ls"))
}

// TestRegionAccess: a region's access list decides who may map, read and
// write it; root always may; an open region is every member's.
func TestRegionAccess(t *testing.T) {
	longTest(t)
	t.Parallel()
	c, sock, msock := localCluster(t, "0660")
	c.createRegion(t, 1, "open", 1<<20)
	if out, errs, code := c.ctl(1, "region", "create", "sec", "1MiB", "--allow-uid", "3001", "--read-only-uid", "3002", "--read-only-gid", "4343"); code != 0 {
		t.Fatalf("region create with access: exit %d: %s%s", code, out, errs)
	} else if !strings.Contains(out, "access: read-write: uid 3001; read-only: uid 3002 gid 4343") {
		t.Errorf("region create says %q", out)
	}
	writer := user{uid: 3001, gid: 3001, groups: []uint32{socketGroup}}
	reader := user{uid: 3002, gid: 3002, groups: []uint32{socketGroup}}
	groupReader := user{uid: 3004, gid: 3004, groups: []uint32{socketGroup, 4343}}
	stranger := user{uid: 3003, gid: 3003, groups: []uint32{socketGroup}}

	// The writer maps, writes and reads.
	mustOK(t, "writer put-bytes")(clientAs(t, writer, sock, "sec", "put-bytes", "8", "5ec2e7"))
	mustOK(t, "writer dsmctl put")(ctlAs(t, writer, sock, "put", "sec", "16", "hello"))
	if got := mustOK(t, "writer read-at")(clientAs(t, writer, sock, "sec", "read-at", "8", "3")); strings.TrimSpace(got) != "5ec2e7" {
		t.Errorf("writer read-at: %q", got)
	}
	// The readers read through the RPCs, and may neither write nor map.
	for _, r := range []user{reader, groupReader} {
		if got := mustOK(t, fmt.Sprintf("%v dsmctl get", r))(ctlAs(t, r, sock, "get", "sec", "16", "5")); !strings.Contains(got, "hello") {
			t.Errorf("%v dsmctl get: %q", r, got)
		}
		out, err := ctlAs(t, r, sock, "put", "sec", "16", "HELLO")
		mustFail(t, fmt.Sprintf("%v dsmctl put", r), out, err, "permission denied", fmt.Sprintf("uid %d", r.uid), "may only read")
		out, err = clientAs(t, r, sock, "sec", "add", "0", "1", "1")
		mustFail(t, fmt.Sprintf("%v dsmclient map", r), out, err, "permission denied", "map")
	}
	// The stranger may do nothing with it, but may use the open region.
	out, err := ctlAs(t, stranger, sock, "get", "sec", "16", "5")
	mustFail(t, "stranger dsmctl get", out, err, "permission denied", "uid 3003", "not on the region's access list")
	out, err = clientAs(t, stranger, sock, "sec", "read-at", "0", "8")
	mustFail(t, "stranger read-at", out, err, "permission denied")
	out, err = clientAs(t, stranger, sock, "sec", "map-direct", msock)
	mustFail(t, "stranger map-direct", out, err, "permission denied", "uid 3003")
	mustOK(t, "stranger on the open region")(clientAs(t, stranger, sock, "open", "put-bytes", "0", "01"))
	out, err = ctlAs(t, stranger, sock, "region", "access", "sec", "--open")
	mustFail(t, "stranger opens the region", out, err, "permission denied")
	out, err = ctlAs(t, stranger, sock, "region", "rm", "sec")
	mustFail(t, "stranger deletes the region", out, err, "permission denied")
	// Root reads anything; the writer hands the region to the stranger.
	if out, errs, code := c.ctl(1, "get", "sec", "16", "5"); code != 0 || !strings.Contains(out, "hello") {
		t.Errorf("root dsmctl get: exit %d %q %s", code, out, errs)
	}
	// The writer holds a mapping; the new list cuts it off.
	hold := exec.Command(dsmclientBin(t), "-addr", sock, "-region", "sec", "-timeout", "60s", "hold")
	hold.SysProcAttr = &syscall.SysProcAttr{Credential: writer.cred(), AmbientCaps: []uintptr{capSysPtrace}}
	hold.Dir = "/"
	stdin, err := hold.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := hold.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var holdErr bytes.Buffer
	hold.Stderr = &holdErr
	if err := hold.Start(); err != nil {
		t.Fatal(err)
	}
	defer hold.Process.Kill()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "mapped" {
		t.Fatalf("hold: %q %v: %s", lines.Text(), lines.Err(), holdErr.String())
	}
	mustOK(t, "writer region access")(ctlAs(t, writer, sock, "region", "access", "sec", "--allow-uid", "3003"))
	if !lines.Scan() || !strings.Contains(lines.Text(), "dead:") || !strings.Contains(lines.Text(), "permission denied") ||
		!strings.Contains(lines.Text(), "access list changed") {
		t.Errorf("the writer's mapping after the change: %q %v: %s", lines.Text(), lines.Err(), holdErr.String())
	}
	if err := hold.Wait(); err != nil {
		t.Errorf("hold: %v: %s", err, holdErr.String())
	}
	if got := mustOK(t, "stranger read-at now")(clientAs(t, stranger, sock, "sec", "read-at", "8", "3")); strings.TrimSpace(got) != "5ec2e7" {
		t.Errorf("stranger read-at after the change: %q", got)
	}
	out, err = ctlAs(t, writer, sock, "get", "sec", "16", "5")
	mustFail(t, "the former writer after the change", out, err, "permission denied")
	if got := mustOK(t, "region access")(ctlAs(t, stranger, sock, "region", "access", "sec")); !strings.Contains(got, "read-write: uid 3003") {
		t.Errorf("region access says %q", got)
	}
}

// TestControlAccess: libdsm's region calls (the control protocol on the
// mapping socket) are checked like the gRPC calls they stand for: a user
// outside the socket group is refused, a region's access list keeps a
// stranger from mapping or deleting it, and its writer may.
func TestControlAccess(t *testing.T) {
	t.Parallel()
	c, _, msock := localCluster(t, "0666")
	lib := buildClib(t)
	if out, errs, code := c.ctl(1, "region", "create", "csec", "64KiB", "--allow-uid", "3001"); code != 0 {
		t.Fatalf("region create with access: exit %d: %s%s", code, out, errs)
	}
	cclient := filepath.Join(lib, "cclient")
	writer := user{uid: 3001, gid: 3001, groups: []uint32{socketGroup}}
	stranger := user{uid: 3003, gid: 3003, groups: []uint32{socketGroup}}
	outsider := user{uid: 3005, gid: 3005}
	out, err := as(t, outsider, cclient, msock, "csec", "create", "65536")
	mustFail(t, "outsider create", out, err, "permission denied", "uid 3005", "may not use dsmd's socket")
	out, err = as(t, stranger, cclient, msock, "csec", "hex", "0", "4")
	mustFail(t, "stranger map", out, err, "permission denied", "uid 3003")
	out, err = as(t, stranger, cclient, msock, "csec", "delete")
	mustFail(t, "stranger delete", out, err, "permission denied", "uid 3003", "not on the region's access list")
	mustOK(t, "writer create (idempotent)")(as(t, writer, cclient, msock, "csec", "create", "65536"))
	mustOK(t, "writer add")(as(t, writer, cclient, msock, "csec", "add", "0", "1", "3"))
	mustOK(t, "writer delete")(as(t, writer, cclient, msock, "csec", "delete"))
}
