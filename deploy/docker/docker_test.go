package docker_test

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/testports"
)

// daemon is the Docker daemon the test talks to.
type daemon struct {
	t    *testing.T
	host string // DOCKER_HOST for every docker command; "" : the default
}

// docker runs the docker CLI and returns its stdout, stderr and error.
func (d *daemon) docker(ctx context.Context, args ...string) (string, string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Env = os.Environ()
	if d.host != "" {
		cmd.Env = append(cmd.Env, "DOCKER_HOST="+d.host)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// must runs docker and fails the test on an error.
func (d *daemon) must(args ...string) string {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, errs, err := d.docker(ctx, args...)
	if err != nil {
		d.t.Fatalf("docker %s: %v\n%s%s", strings.Join(args, " "), err, out, errs)
	}
	return out
}

// missing skips the test, or fails it under CI, where docker must be there.
func missing(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI is set: the image test must run; .ci/run installs docker.io)", msg)
	}
	t.Skipf("SKIPPED: %s; install docker.io to run the image test", msg)
}

// dockerDaemon finds a running Docker daemon, or starts dockerd for this
// test (host networking only: no bridge, no iptables) with its state in a
// temporary directory, stopped when the test ends.
func dockerDaemon(t *testing.T) *daemon {
	t.Helper()
	if _, err := exec.LookPath("docker"); err != nil {
		missing(t, "no docker command")
	}
	d := &daemon{t: t}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, _, err := d.docker(ctx, "info"); err == nil {
		return d
	}
	dockerd, err := exec.LookPath("dockerd")
	if err != nil {
		missing(t, "no Docker daemon answers and there is no dockerd to start")
	}
	if os.Geteuid() != 0 {
		missing(t, "no Docker daemon answers, and starting dockerd needs root")
	}
	dir, err := os.MkdirTemp("", "dsm-dockerd-")
	if err != nil {
		t.Fatal(err)
	}
	d.host = "unix://" + filepath.Join(dir, "docker.sock")
	logf, err := os.Create(filepath.Join(dir, "dockerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(dockerd, "--host", d.host, "--data-root", filepath.Join(dir, "root"),
		"--exec-root", filepath.Join(dir, "exec"), "--pidfile", filepath.Join(dir, "dockerd.pid"),
		"--bridge=none", "--iptables=false", "--ip6tables=false", "--log-level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting dockerd: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			t.Errorf("dockerd did not stop 30 s after SIGTERM")
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("dockerd log (last 3000 bytes):\n%s", tail(string(b), 3000))
		}
		logf.Close()
		unmountUnder(t, dir)
		if err := os.RemoveAll(dir); err != nil {
			t.Logf("removing dockerd's state: %v", err)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, errs, err := d.docker(ctx, "info")
		cancel()
		if err == nil {
			return d
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("dockerd exited at start:\n%s", tail(string(b), 3000))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dockerd does not answer 30 s after it started: %s", errs)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// unmountUnder detaches what dockerd left mounted under dir (the network
// namespace it keeps under its exec root).
func unmountUnder(t *testing.T, dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Logf("reading mountinfo: %v", err)
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			if err := syscall.Unmount(f[4], syscall.MNT_DETACH); err != nil {
				t.Logf("unmounting %s: %v", f[4], err)
			}
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// buildStatic builds the packages with CGO_ENABLED=0 into dir (one go
// build: the packages compile in parallel) and checks that each binary has
// no dynamic loader (they run in an empty image).
func buildStatic(t *testing.T, dir string, pkgs ...string) {
	t.Helper()
	start := time.Now()
	// No -trimpath here (unlike make image): it would change the build
	// cache key of every package and rebuild the whole tree each time.
	cmd := exec.Command("go", append([]string{"build", "-ldflags=-s", "-o", dir + "/"}, pkgs...)...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", strings.Join(pkgs, " "), err, b)
	}
	t.Logf("built %d binaries in %v", len(pkgs), time.Since(start).Round(time.Millisecond))
	for _, pkg := range pkgs {
		f, err := elf.Open(filepath.Join(dir, filepath.Base(pkg)))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Fatalf("%s is dynamically linked: the scratch image has no loader", pkg)
			}
		}
		f.Close()
	}
}

// TestImage builds the image from binaries built here (Dockerfile.prebuilt:
// no registry needed), checks that `docker run IMAGE --help` prints dsmd's
// help, starts a three-node cluster in containers on the host's loopback,
// waits until dsmctl in a container reports it healthy, writes a page on
// one node and reads it on another, maps the region from an application
// container (when the host has /dev/userfaultfd), and stops the nodes with
// docker stop, which must leave gracefully.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a container image and runs dsmd in containers; skipped with -short")
	}
	d := dockerDaemon(t)

	ctxDir := t.TempDir()
	for _, sub := range []string{"bin", "empty", "app"} {
		if err := os.MkdirAll(filepath.Join(ctxDir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The application image's dsmclient is built with them, then moved out
	// of the image's context.
	buildStatic(t, filepath.Join(ctxDir, "bin"), "github.com/dsmkit/dsm/cmd/dsmd",
		"github.com/dsmkit/dsm/cmd/dsmctl", "github.com/dsmkit/dsm/tests/internal/dsmclient")
	if err := os.Rename(filepath.Join(ctxDir, "bin", "dsmclient"), filepath.Join(ctxDir, "app", "dsmclient")); err != nil {
		t.Fatal(err)
	}

	tag := fmt.Sprintf("dsm-image-test:%d", os.Getpid())
	d.must("build", "-q", "-f", "Dockerfile.prebuilt", "-t", tag, ctxDir)
	t.Cleanup(func() {
		d.docker(context.Background(), "rmi", "-f", tag)
	})

	t.Logf("image built")
	help := d.must("run", "--rm", tag, "--help")
	if !strings.Contains(help, "Usage: dsmd --id N --data-dir DIR") {
		t.Fatalf("docker run IMAGE --help does not print dsmd's help:\n%s", help)
	}
	if user := strings.TrimSpace(d.must("image", "inspect", "-f", "{{.Config.User}}", tag)); user != "65532:65532" {
		t.Errorf("the image runs as %q, want the unprivileged 65532:65532", user)
	}

	// Three nodes on the host's network, loopback only (no TLS needed).
	prefix := fmt.Sprintf("dsm-image-test-%d-", os.Getpid())
	const n = 3
	var join string
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("%sn%d", prefix, i+1)
		gossip := testports.Addr(t)
		if join == "" {
			join = gossip
		}
		vol := names[i] + "-run"
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if t.Failed() {
				logs, errs, _ := d.docker(ctx, "logs", "--tail", "60", names[i])
				t.Logf("---- %s log:\n%s%s", names[i], logs, errs)
			}
			d.docker(ctx, "rm", "-f", "-v", names[i])
			d.docker(ctx, "volume", "rm", "-f", vol)
		})
		// The local sockets go to a named volume at /run/dsm, which an
		// application container mounts to reach this dsmd. A new volume
		// takes the image directory's owner (dsmd's user). The least
		// privilege of compose.yaml and the StatefulSet: no capability,
		// a read-only root, no new privileges, the default seccomp profile.
		d.must("run", "-d", "--name", names[i], "--network", "host",
			"--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true",
			"-v", vol+":/run/dsm", tag,
			"--id", fmt.Sprint(i+1), "--data-dir", "/var/lib/dsm",
			"--gossip-addr", gossip, "--raft-addr", testports.Addr(t),
			"--rpc-addr", testports.Addr(t), "--verbs-addr", testports.Addr(t),
			"--bootstrap-expect", fmt.Sprint(n), "--join", join,
			"--socket", "/run/dsm/dsmd.sock", "--map-socket", "/run/dsm/map.sock")
	}
	ctl := func(node int, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, errs, err := d.docker(ctx, append([]string{"exec", names[node-1], "dsmctl", "--timeout", "10s"}, args...)...)
		if err != nil {
			return out + errs, err
		}
		return out, nil
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := ctl(1, "status")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dsmctl status in n1's container: not healthy within 60 s: %v\n%s", err, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("the cluster in containers is healthy")
	if out, err := ctl(1, "region", "create", "demo", "1MiB"); err != nil {
		t.Fatalf("dsmctl region create: %v\n%s", err, out)
	}
	if out, err := ctl(1, "put", "demo", "4096", "hello"); err != nil {
		t.Fatalf("dsmctl put on n1: %v\n%s", err, out)
	}
	if out, err := ctl(3, "get", "demo", "4096", "5"); err != nil || !strings.Contains(out, "hello") {
		t.Fatalf("dsmctl get on n3: %v\n%s", err, out)
	}

	t.Run("application container maps a region", func(t *testing.T) {
		mapFromContainer(t, d, ctxDir, tag, names[1]+"-run", ctl)
	})

	// docker stop sends SIGTERM: each node drains and leaves, and exits 0.
	for i := n - 1; i >= 0; i-- {
		d.must("stop", "-t", "30", names[i])
		code := strings.TrimSpace(d.must("inspect", "-f", "{{.State.ExitCode}}", names[i]))
		out, errs, _ := d.docker(context.Background(), "logs", names[i])
		logs := out + errs
		if code != "0" || !strings.Contains(logs, "dsmd stopped") {
			t.Errorf("%s after docker stop: exit code %s\n%s", names[i], code, tail(logs, 2000))
		}
	}
}

// mapFromContainer runs the dsm library in an application container beside
// node 2: it mounts node 2's socket volume at the same path, gets
// /dev/userfaultfd (the least privilege that works: no capability and the
// default seccomp profile), writes through the mapping and reads back what
// dsmctl wrote on node 1; node 3 then reads the application's write.
func mapFromContainer(t *testing.T, d *daemon, ctxDir, tag, vol string, ctl func(int, ...string) (string, error)) {
	if _, err := os.Stat("/dev/userfaultfd"); err != nil {
		t.Skipf("this host has no /dev/userfaultfd (Linux 6.1+): %v", err)
	}
	appDir := filepath.Join(ctxDir, "app")
	if err := os.WriteFile(filepath.Join(appDir, "Dockerfile"),
		[]byte("FROM scratch\nCOPY dsmclient /dsmclient\nENTRYPOINT [\"/dsmclient\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	appTag := tag + "-app"
	d.must("build", "-q", "-t", appTag, appDir)
	t.Cleanup(func() { d.docker(context.Background(), "rmi", "-f", appTag) })
	app := func(args ...string) string {
		t.Helper()
		return strings.TrimSpace(d.must(append([]string{"run", "--rm", "--network", "none",
			"--device", "/dev/userfaultfd", "-v", vol + ":/run/dsm", appTag,
			"-addr", "/run/dsm/dsmd.sock", "-region", "demo"}, args...)...))
	}
	if got := app("get-bytes", "4096", "5"); got != fmt.Sprintf("%x", "hello") {
		t.Fatalf("the application read %q through its mapping, want %x", got, "hello")
	}
	if got := app("put-bytes", "8192", fmt.Sprintf("%x", "world")); got != "ok" {
		t.Fatalf("put-bytes through the mapping: %q", got)
	}
	out, err := ctl(3, "get", "demo", "8192", "5")
	if err != nil || !strings.Contains(out, "world") {
		t.Fatalf("dsmctl get on n3 after the application's write: %v\n%s", err, out)
	}
}

// TestDockerfilesAgree: the final stage of Dockerfile and of
// Dockerfile.prebuilt are the same but for where the files come from, so
// the image built without a registry is the image users build.
func TestDockerfilesAgree(t *testing.T) {
	final := func(name, from string) []string {
		t.Helper()
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var lines []string
		in := false
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			l := strings.TrimSpace(sc.Text())
			if strings.HasPrefix(l, "# ---- final stage") {
				in = true
				continue
			}
			if !in || l == "" {
				continue
			}
			if from != "" {
				l = strings.ReplaceAll(l, from, "")
				l = strings.ReplaceAll(l, " /out/", " ")
			}
			lines = append(lines, l)
		}
		if !in {
			t.Fatalf("%s has no final stage marker", name)
		}
		return lines
	}
	multi := final("Dockerfile", "--from=build ")
	pre := final("Dockerfile.prebuilt", "")
	if strings.Join(multi, "\n") != strings.Join(pre, "\n") {
		t.Fatalf("final stages differ:\nDockerfile:\n%s\n\nDockerfile.prebuilt:\n%s",
			strings.Join(multi, "\n"), strings.Join(pre, "\n"))
	}
	if multi[0] != "FROM scratch" {
		t.Fatalf("the final stage starts with %q, want FROM scratch", multi[0])
	}
}
