package tests

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/testports"
)

// freeBase returns a port base whose 26 ports (the script uses base+0..25)
// are free for TCP and UDP and given to no other test process.
func freeBase(t *testing.T) int { return testports.Range(t, 26) }

// TestRunClusterScript runs deploy/local/run-cluster.sh (what `make run`
// calls): it must build, report a healthy cluster that dsmctl reaches, and
// stop every dsmd on SIGINT.
func TestRunClusterScript(t *testing.T) {
	longTest(t)
	if testing.Short() {
		t.Skip("starts dsmd processes; skipped with -short")
	}
	runDir, binDir := t.TempDir(), t.TempDir()
	cmd := exec.Command("bash", "../deploy/local/run-cluster.sh")
	cmd.Env = append(os.Environ(), "DSM_RUN_DIR="+runDir, "BIN_DIR="+binDir, fmt.Sprintf("PORT_BASE=%d", freeBase(t)))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() { done <- cmd.Wait(); pw.Close(); close(exited) }()
	t.Cleanup(func() {
		// On an early failure: stop the script and its dsmd (one process
		// group) so that nothing outlives the test.
		select {
		case <-exited:
		default:
			syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(30 * time.Second):
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-exited
			}
		}
	})
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var out strings.Builder
	defer func() {
		if t.Failed() {
			t.Logf("script output:\n%s", out.String())
		}
	}()
	up := time.After(180 * time.Second) // includes building both binaries
	waiting := true
	for waiting {
		select {
		case l, ok := <-lines:
			if !ok {
				<-exited
				t.Fatalf("script ended before the cluster was up: %v", <-done)
			}
			out.WriteString(l + "\n")
			if strings.Contains(l, "Ctrl-C stops") {
				waiting = false
			}
		case <-up:
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			t.Fatal("cluster not up within 180 s")
		}
	}
	if !strings.Contains(out.String(), "health: healthy") || !strings.Contains(out.String(), "export DSM_ADDR=") {
		t.Fatalf("script did not report a healthy cluster and how to reach it")
	}
	// The script names n1's web console, and it answers.
	m := regexp.MustCompile(`Web console: (http://\S+/) `).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatal("the script does not print the web console's address")
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	for path, want := range map[string]string{"": "<title>DSM console</title>", "api/overview": `"node_id": 1`} {
		resp, err := hc.Get(m[1] + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Errorf("GET %s%s: %s, lacks %q", m[1], path, resp.Status, want)
		}
	}
	ctl := exec.Command(filepath.Join(binDir, "dsmctl"), "status")
	ctl.Env = append(os.Environ(), "DSM_ADDR="+filepath.Join(runDir, "n2", "dsmd.sock"))
	if b, err := ctl.CombinedOutput(); err != nil {
		t.Fatalf("dsmctl status with DSM_ADDR: %v\n%s", err, b)
	}

	// The default path is the secure one: the script made a CA and the
	// nodes' certificates, and every dsmd runs with TLS.
	for _, f := range []string{"ca.pem", "node-1.pem", "node-3-key.pem", "client.pem"} {
		if _, err := os.Stat(filepath.Join(runDir, "tls", f)); err != nil {
			t.Errorf("no %s: %v", f, err)
		}
	}
	for i := 1; i <= 3; i++ {
		log, _ := os.ReadFile(filepath.Join(runDir, fmt.Sprintf("n%d", i), "dsmd.log"))
		if !strings.Contains(string(log), "TLS on") {
			t.Errorf("n%d runs without TLS", i)
		}
	}

	// Ctrl-C reaches the script (the terminal sends it to the foreground
	// process group; here to the script only).
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	go func() {
		for l := range lines {
			out.WriteString(l + "\n")
		}
	}()
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatal("script did not stop 60 s after SIGINT")
	}
	// Every dsmd is gone: their sockets no longer answer.
	for i := 1; i <= 3; i++ {
		sock := filepath.Join(runDir, fmt.Sprintf("n%d", i), "dsmd.sock")
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			t.Errorf("n%d still answers on %s after the script stopped", i, sock)
		}
		log, _ := os.ReadFile(filepath.Join(runDir, fmt.Sprintf("n%d", i), "dsmd.log"))
		if !strings.Contains(string(log), "dsmd stopped") {
			t.Errorf("n%d's log has no clean stop", i)
		}
	}
}
