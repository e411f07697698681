package tests

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsmkit/dsm/dsm"
	"github.com/dsmkit/dsm/internal/mapproto"
)

// The C library (clients/c) and the Python package (clients/python) map
// the same regions as the Go library: these tests run all three against
// one cluster. libdsm is built here with cc; Python needs numpy and
// pytest. A missing prerequisite skips the test, except under CI (env CI
// set), where it fails it.

var (
	clibOnce sync.Once
	clibDir  string // holds libdsm.so and cclient
	clibErr  error
)

// needTool fails (under CI) or skips t for a missing prerequisite.
func needTool(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI is set: the prerequisite must be installed, see .ci/run)", msg)
	}
	t.Skipf("%s; skipped (under CI this fails)", msg)
}

// repoRoot is the repository's top directory (tests/..).
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// buildClib builds libdsm.so and the cclient test tool once, beside dsmd,
// straight from the sources (the source tree is left as it is).
func buildClib(t testing.TB) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		needTool(t, "no C compiler (%s) to build libdsm", cc)
	}
	clibOnce.Do(func() {
		root := repoRoot(t)
		clibDir = filepath.Join(filepath.Dir(dsmdBin), "clib")
		if clibErr = os.MkdirAll(clibDir, 0o755); clibErr != nil {
			return
		}
		src := filepath.Join(root, "clients", "c")
		warn := []string{"-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter"}
		obj := filepath.Join(clibDir, "dsm.o")
		for _, args := range [][]string{
			append(warn, "-fPIC", "-c", "-o", obj, filepath.Join(src, "dsm.c")),
			{"-shared", "-o", filepath.Join(clibDir, "libdsm.so"), obj, "-lpthread"},
			append(warn, "-I", src, "-o", filepath.Join(clibDir, "cclient"), filepath.Join(root, "tests", "internal", "cclient", "main.c"), obj, "-lpthread"),
			append(warn, "-I", src, "-o", filepath.Join(clibDir, "shm_example"), filepath.Join(src, "examples", "shm_example.c"), obj, "-lpthread"),
		} {
			if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
				clibErr = fmt.Errorf("%s %s: %v\n%s", cc, strings.Join(args, " "), err, out)
				return
			}
		}
	})
	if clibErr != nil {
		t.Fatal(clibErr)
	}
	return clibDir
}

// python finds a python3 that has numpy and pytest: $DSM_PYTHON, else
// python3 on the PATH, else the system's /usr/bin/python3.
func python(t *testing.T) string {
	t.Helper()
	cands := []string{"python3", "/usr/bin/python3"}
	if p := os.Getenv("DSM_PYTHON"); p != "" {
		cands = []string{p}
	}
	var tried []string
	for _, p := range cands {
		path, err := exec.LookPath(p)
		if err != nil {
			tried = append(tried, p+": not found")
			continue
		}
		if out, err := exec.Command(path, "-c", "import numpy, pytest").CombinedOutput(); err != nil {
			tried = append(tried, fmt.Sprintf("%s: %s", path, strings.TrimSpace(string(out))))
			continue
		}
		return path
	}
	needTool(t, "no python3 with numpy and pytest (%s)", strings.Join(tried, "; "))
	return ""
}

// runTool runs a command with env added, and returns its stdout without
// the final newline; it fails t on an exit status other than 0.
func runTool(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientHang)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\nstdout: %s\nstderr: %s", filepath.Base(name), strings.Join(args, " "), err, out.String(), errb.String())
	}
	return strings.TrimSuffix(out.String(), "\n")
}

// TestClientsAcrossLanguages runs Go, C and Python processes on three
// nodes against the same regions: text a C program writes on one node is
// read by Go and C on others; a numpy array written on one node is read by
// Go and C on others; a counter incremented under the mutex from all three
// languages at once sums exactly; a holder of the mutex that dies is
// found dead across languages; the Python package's own tests pass.
func TestClientsAcrossLanguages(t *testing.T) {
	longTest(t)
	t.Parallel()
	if testing.Short() {
		t.Skip("starts dsmd processes; skipped with -short")
	}
	lib := buildClib(t)
	py := python(t)
	c := startClusterWith(t, 3, nil)
	for i := 1; i <= 3; i++ {
		c.waitHealthy(i)
	}
	sock := func(n int) string { return c.nodes[n-1].socket }
	cclient := filepath.Join(lib, "cclient")
	root := repoRoot(t)
	pyEnv := []string{"DSM_LIBRARY=" + filepath.Join(lib, "libdsm.so"), "PYTHONPATH=" + filepath.Join(root, "clients", "python"),
		"PYTHONDONTWRITEBYTECODE=1"}
	worker := filepath.Join(root, "tests", "internal", "pyclient", "worker.py")

	// The shm_open-style example: C writes on n1 (creating the region
	// through the control protocol), Go reads on n2, C on n3.
	const text = "written by C on n1"
	runTool(t, []string{"DSM_ADDR=" + sock(1)}, filepath.Join(lib, "shm_example"), "write", "greet", text)
	c.waitRegion(t, "greet")
	if got := c.mustClient(t, 2, "greet", "get-bytes", "0", strconv.Itoa(len(text))); got != hex.EncodeToString([]byte(text)) {
		t.Fatalf("Go on n2 reads %s, want %x", got, text)
	}
	if got := runTool(t, []string{"DSM_ADDR=" + sock(3)}, filepath.Join(lib, "shm_example"), "read", "greet"); got != text {
		t.Fatalf("C on n3 reads %q, want %q", got, text)
	}

	// A numpy array written on n1 is read by Go on n2 and C on n3.
	const count = 3000 // spans pages
	c.createRegion(t, 1, "arr", 1<<16)
	if got := runTool(t, pyEnv, py, worker, sock(1), "arr", "write-arange", strconv.Itoa(count)); got != "ok" {
		t.Fatalf("python write-arange: %q", got)
	}
	want := make([]byte, 8*count)
	for i := range count {
		binary.LittleEndian.PutUint64(want[8*i:], math.Float64bits(float64(i)*1.5))
	}
	if got := c.mustClient(t, 2, "arr", "get-bytes", "0", strconv.Itoa(len(want))); got != hex.EncodeToString(want) {
		t.Fatalf("Go on n2 does not read the numpy array written on n1")
	}
	if got := runTool(t, nil, cclient, sock(3), "arr", "hex", "0", strconv.Itoa(len(want))); got != hex.EncodeToString(want) {
		t.Fatalf("C on n3 does not read the numpy array written on n1")
	}

	// One counter, plain increments under the mutex at 0, from Go on n1,
	// C on n2 and on n1 (beside Go), and Python on n3, all at once.
	const region, lockOff, cntOff, n = "langs", "0", "4096", 100
	if got := runTool(t, nil, cclient, sock(2), region, "create", strconv.Itoa(1<<16)); got != "ok" {
		t.Fatalf("C create: %q", got)
	}
	c.waitRegion(t, region)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	start := time.Now()
	run := func(f func() (string, error)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := f(); err != nil || strings.TrimSpace(out) != "ok" {
				errs <- fmt.Errorf("%q, %v", out, err)
			}
		}()
	}
	run(func() (string, error) { return c.client(1, region, "mutex-inc", lockOff, strconv.Itoa(n), cntOff) })
	run(clientTool(nil, cclient, sock(2), region, "mutex-inc", lockOff, strconv.Itoa(n), cntOff))
	run(clientTool(nil, cclient, sock(1), region, "mutex-inc", lockOff, strconv.Itoa(n), cntOff))
	run(clientTool(pyEnv, py, worker, sock(3), region, "mutex-inc", lockOff, strconv.Itoa(n), cntOff))
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := c.mustClient(t, 2, region, "read-u64", cntOff); got != strconv.Itoa(4*n) {
		t.Fatalf("counter %s after 4 x %d increments under the mutex from Go, C and Python", got, n)
	}
	t.Logf("4 x %d increments under the mutex (Go, C, C, Python on three nodes) in %v", n, time.Since(start).Round(time.Millisecond))

	mutexDeadHolder(t, c, cclient)

	// The Python package's tests, against n2.
	cmd := exec.Command(py, "-m", "pytest", "-q", "-p", "no:cacheprovider", filepath.Join(root, "clients", "python", "tests"))
	cmd.Env = append(os.Environ(), append(pyEnv, "DSM_ADDR="+sock(2))...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "passed") || strings.Contains(string(out), "skipped") {
		t.Fatalf("pytest clients/python/tests: %v\n%s", err, out)
	}
	t.Logf("pytest clients/python/tests: %s", strings.TrimSpace(string(out)))
}

// waitRegion waits until every node's directory has region.
func (c *dsmCluster) waitRegion(t *testing.T, region string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientHang)
	defer cancel()
	for i, p := range c.nodes {
		cl, err := dsm.Dial(ctx, p.socket)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, fmt.Sprintf("n%d knows region %s", i+1, region), clientHang, func() error {
			rs, err := cl.Regions(ctx)
			if err != nil {
				return err
			}
			for _, r := range rs {
				if r.Name == region {
					return nil
				}
			}
			return fmt.Errorf("not listed")
		})
		cl.Close()
	}
}

// The control protocol on the mapping socket answers a malformed request
// with an Error and ends the session; a refused request (an unknown
// region) gets an Error and the session goes on.
func TestControlSessionErrors(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 1)
	c.waitHealthy(1)
	mapSock := filepath.Join(filepath.Dir(c.nodes[0].socket), "map.sock")
	conn := func() *unixPacket {
		t.Helper()
		u, err := dialPacket(mapSock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { u.Close() })
		return u
	}
	enc := func(m mapproto.Ctl) []byte {
		b, err := mapproto.EncodeCtl(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	u := conn()
	reply := u.roundTrip(t, enc(mapproto.Ctl{Type: mapproto.TypeLookup, Name: "nothing"}))
	if m, err := mapproto.Decode(reply); err != nil || m.Type != mapproto.TypeError || m.Code != mapproto.CodeUnknownRegion {
		t.Fatalf("lookup of an unknown region: %+v %v", m, err)
	}
	reply = u.roundTrip(t, enc(mapproto.Ctl{Type: mapproto.TypeCreate, Name: "ctl", Size: 1 << 16}))
	if m, err := mapproto.DecodeCtl(reply); err != nil || m.Type != mapproto.TypeRegion || m.Size != 1<<16 || m.Existed {
		t.Fatalf("create on the same session: %+v %v", m, err)
	}
	reply = u.roundTrip(t, enc(mapproto.Ctl{Type: mapproto.TypeSessionsAlive, Tokens: []uint64{0, 1 << 40}}))
	if m, err := mapproto.DecodeCtl(reply); err != nil || m.Type != mapproto.TypeStates || len(m.States) != 2 {
		t.Fatalf("sessions-alive: %+v %v", m, err)
	}
	// A truncated request: an Error, then the end of the session.
	reply = u.roundTrip(t, []byte{mapproto.Version, byte(mapproto.TypeSync), 9, 0, 'c'})
	if m, err := mapproto.Decode(reply); err != nil || m.Type != mapproto.TypeError || m.Code != mapproto.CodeBadRequest {
		t.Fatalf("malformed request: %+v %v", m, err)
	}
	if b, err := u.recv(); err == nil {
		t.Fatalf("the session goes on after a malformed request: %x", b)
	}
}

// unixPacket is a raw connection to a mapping socket.
type unixPacket struct{ *net.UnixConn }

func dialPacket(path string) (*unixPacket, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	return &unixPacket{c}, nil
}

func (u *unixPacket) recv() ([]byte, error) {
	u.SetReadDeadline(time.Now().Add(clientHang))
	b := make([]byte, mapproto.MaxMsg)
	n, err := u.Read(b)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, io.EOF
	}
	return b[:n], nil
}

// roundTrip sends one message and returns the answer.
func (u *unixPacket) roundTrip(t *testing.T, b []byte) []byte {
	t.Helper()
	if _, err := u.Write(b); err != nil {
		t.Fatal(err)
	}
	reply, err := u.recv()
	if err != nil {
		t.Fatalf("no answer to %x: %v", b, err)
	}
	return reply
}

// mutexDeadHolder: the C mutex is the Go Mutex. A C holder that dies is found dead by a Go
// waiter on another node (the C process's session token, recorded in the
// owner word, names its mapping), and a Go holder that dies is found dead
// by a C waiter (which asks dsmd through the control protocol).
func mutexDeadHolder(t *testing.T, c *dsmCluster, cclient string) {
	const region = "cmx"
	c.createRegion(t, 1, region, 1<<16)

	// A C holder on n1 is killed; a Go waiter on n2 gets the lock, told
	// that the holder died.
	holder := exec.Command(cclient, c.nodes[0].socket, region, "lock-hold", "0")
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 7)
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "locked\n" {
		t.Fatalf("C holder: %q %v", line, err)
	}
	holder.Process.Kill()
	holder.Wait()
	waiter := c.startClient(t, 2, region, "repl")
	if got := waiter.call(t, "lock 0"); got != "owner-died" {
		t.Fatalf("Go Lock after the C holder was killed: %q, want owner-died", got)
	}
	// Now the Go process holds the lock and is killed; a C waiter on n1
	// gets it, told that the holder died.
	waiter.kill(t)
	if got := runTool(t, nil, cclient, c.nodes[0].socket, region, "lock", "0"); got != "owner-died" {
		t.Fatalf("C lock after the Go holder was killed: %q, want owner-died", got)
	}
	if got := runTool(t, nil, cclient, c.nodes[1].socket, region, "lock", "0"); got != "ok" {
		t.Fatalf("C lock after that: %q, want ok", got)
	}
}

// clientTool returns a run of program name with args and env added to the
// test's environment, bounded by clientHang: its standard output, or an
// error that carries its standard error.
func clientTool(env []string, name string, args ...string) func() (string, error) {
	return func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), clientHang)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.Output()
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("%s %v: %v: %s", filepath.Base(name), args, err, ee.Stderr)
		}
		return string(out), err
	}
}
