package cli

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// TestBinary builds the real dsmctl and runs it as a process against the
// fake server on a real Unix socket.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to build dsmctl with")
	}
	bin := filepath.Join(t.TempDir(), "dsmctl")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command(goTool, append(args, "github.com/dsmkit/dsm/cmd/dsmctl")...)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f, sock := serveFake(t)

	dsmctl := func(env []string, args ...string) (string, string, int) {
		t.Helper()
		var out, errb bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return out.String(), errb.String(), 0
		case errors.As(err, &ee):
			return out.String(), errb.String(), ee.ExitCode()
		}
		t.Fatalf("running dsmctl: %v", err)
		return "", "", -1
	}

	out, _, code := dsmctl(nil, "--help")
	if code != 0 || !strings.Contains(out, "Available Commands:") || !strings.Contains(out, "pages") {
		t.Errorf("dsmctl --help: exit %d\n%s", code, out)
	}

	out, errs, code := dsmctl([]string{AddrEnv + "=" + sock}, "status")
	if code != ExitOK || !strings.Contains(out, "health: healthy") || strings.Contains(out, "\x1b[") {
		t.Errorf("dsmctl status: exit %d, stderr %q\n%s", code, errs, out)
	}

	f.mu.Lock()
	f.verdict = dsmpb.Health_VERDICT_UNHEALTHY
	f.reasons = []string{"no Raft leader"}
	f.mu.Unlock()
	out, _, code = dsmctl([]string{AddrEnv + "=" + sock}, "status", "--json")
	if code != ExitUnhealthy || !strings.Contains(out, `"health": "unhealthy"`) {
		t.Errorf("dsmctl status on an unhealthy cluster: exit %d\n%s", code, out)
	}

	_, errs, code = dsmctl(nil, "--addr", sock, "region", "info", "nope")
	if code != ExitError || errs != "dsmctl: region \"nope\" not found — list regions with `dsmctl region ls`\n" {
		t.Errorf("unknown region: exit %d, stderr %q", code, errs)
	}

	_, errs, code = dsmctl(nil, "--addr", sock+".gone", "members")
	if code != ExitError || !strings.Contains(errs, "no socket there — is dsmd running?") {
		t.Errorf("no dsmd: exit %d, stderr %q", code, errs)
	}
}
