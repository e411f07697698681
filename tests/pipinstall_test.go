package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// pipPython finds a python3 that can build and install a package offline:
// pip, setuptools and a bdist_wheel command (the wheel package, or
// setuptools 70.1 and later). Candidates: $DSM_PYTHON, else python3 on the
// PATH, else the system's /usr/bin/python3 (Debian's python3-pip,
// python3-setuptools, python3-wheel).
func pipPython(t *testing.T) string {
	t.Helper()
	cands := []string{"python3", "/usr/bin/python3"}
	if p := os.Getenv("DSM_PYTHON"); p != "" {
		cands = []string{p}
	}
	// setuptools before anything of pip: pip imports distutils, after which
	// setuptools' distutils shim refuses to load.
	const probe = `import importlib.util, setuptools
assert importlib.util.find_spec("pip"), "no pip"
try:
    import wheel
except ImportError:
    from setuptools.command import bdist_wheel`
	var tried []string
	for _, p := range cands {
		path, err := exec.LookPath(p)
		if err != nil {
			tried = append(tried, p+": not found")
			continue
		}
		if out, err := exec.Command(path, "-c", probe).CombinedOutput(); err != nil {
			tried = append(tried, path+": "+lastLine(string(out)))
			continue
		}
		return path
	}
	needTool(t, "no python3 with pip, setuptools and wheel (%s)", strings.Join(tried, "; "))
	return ""
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// TestPipInstall installs clients/python with pip, offline (no index, no
// build isolation: setuptools and wheel are the installed ones), into a
// target directory, as docs/clients.md says; then a Python run outside
// the source tree, with only that directory on its path and DSM_LIBRARY
// naming a libdsm.so built here, imports dsm from it and finds dsm.connect,
// the Client and Region types, and the package's version in its metadata.
// pip runs on a copy of clients/python: its in-tree build leaves build/
// and an egg-info directory beside the sources.
func TestPipInstall(t *testing.T) {
	py := pipPython(t)
	lib := filepath.Join(buildClib(t), "libdsm.so")
	tmp := t.TempDir()
	src := filepath.Join(tmp, "src")
	if err := os.CopyFS(src, os.DirFS(filepath.Join(repoRoot(t), "clients", "python"))); err != nil {
		t.Fatal(err)
	}
	pyproject, err := os.ReadFile(filepath.Join(src, "pyproject.toml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^version = "([^"]+)"$`).FindSubmatch(pyproject)
	if m == nil {
		t.Fatal("pyproject.toml has no version line")
	}
	version := string(m[1])
	target := filepath.Join(tmp, "site")
	env := []string{"PIP_NO_INDEX=1", "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_ROOT_USER_ACTION=ignore", "PIP_NO_CACHE_DIR=1"}
	runTool(t, env, py, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--target", target, src)

	script := `import importlib.metadata, os, sys
import dsm
assert callable(dsm.connect), dsm.connect
assert isinstance(dsm.Client, type) and isinstance(dsm.Region, type)
print(os.path.realpath(dsm.__file__))
print(importlib.metadata.version("dsm-client"))`
	cmd := exec.Command(py, "-c", script)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "PYTHONPATH="+target, "DSM_LIBRARY="+lib, "PYTHONNOUSERSITE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("importing the installed package: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	realTarget, err := filepath.EvalSymlinks(target)
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 2 || !strings.HasPrefix(lines[0], realTarget+string(filepath.Separator)) || lines[1] != version {
		t.Fatalf("dsm imported from %q, version %q; want a module under %s, version %s\n%s", lines[0], lines[len(lines)-1], realTarget, version, out)
	}
}
