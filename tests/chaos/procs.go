package chaos

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// proc is one process the harness started: a dsmd or a client.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	// exit is the process's wait status, set before done closes.
	exit error
	// expect is set before the harness signals the process in a way that
	// ends it (kill, leave, stop), so that its exit is not reported as a
	// crash.
	expect atomic.Bool
}

// startProc starts cmd with its output appended to logPath, registered in
// the pid file so that a later run can end it if this one dies first.
func (h *harness) startProc(name string, cmd *exec.Cmd, logPath string) (*proc, error) {
	lf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(lf, "==== chaos: %s starts at %s: %s\n", name, time.Now().UTC().Format(time.RFC3339Nano), strings.Join(cmd.Args, " "))
	cmd.Stdout, cmd.Stderr = lf, lf
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// The process dies with the harness.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	h.pids.add(cmd.Process.Pid)
	go func() {
		p.exit = cmd.Wait()
		fmt.Fprintf(lf, "==== chaos: %s exited at %s: %v\n", name, time.Now().UTC().Format(time.RFC3339Nano), exitString(p.exit))
		lf.Close()
		h.pids.remove(cmd.Process.Pid)
		close(p.done)
	}()
	return p, nil
}

func exitString(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) signal(s syscall.Signal) error {
	if !p.running() {
		return fmt.Errorf("%s is not running", p.name)
	}
	return p.cmd.Process.Signal(s)
}

// wait waits up to d for the process to exit and says whether it did.
func (p *proc) wait(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// kill sends SIGKILL (and SIGCONT, for a stopped process) and waits.
func (p *proc) kill() {
	p.expect.Store(true)
	if p.running() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		<-p.done
	}
}

// pidFile records the pids of the processes a run started, with their start
// times, so that the next run ends exactly those if this one was killed.
type pidFile struct {
	mu   sync.Mutex
	path string
	pids map[int]string
}

// stateDir holds the lock and the pid file of the harness.
const stateDir = "/run/dsmchaos"

func newPidFile(path string) *pidFile { return &pidFile{path: path, pids: map[int]string{}} }

// startTime is field 22 of /proc/PID/stat: with the pid, it names one
// process for good.
func startTime(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		f := strings.Fields(s[i+1:])
		if len(f) > 19 {
			return f[19]
		}
	}
	return ""
}

func (pf *pidFile) add(pid int) {
	pf.mu.Lock()
	defer pf.mu.Unlock()
	pf.pids[pid] = startTime(pid)
	pf.save()
}

func (pf *pidFile) remove(pid int) {
	pf.mu.Lock()
	defer pf.mu.Unlock()
	delete(pf.pids, pid)
	pf.save()
}

func (pf *pidFile) save() {
	var b strings.Builder
	for pid, st := range pf.pids {
		fmt.Fprintf(&b, "%d %s\n", pid, st)
	}
	_ = os.WriteFile(pf.path, []byte(b.String()), 0o644)
}

// killStale ends the processes an earlier run recorded in path and that
// still run (same pid, same start time).
func killStale(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var killed []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var pid int
		var st string
		if n, _ := fmt.Sscan(sc.Text(), &pid, &st); n != 2 || pid <= 1 {
			continue
		}
		if startTime(pid) == st {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			killed = append(killed, strconv.Itoa(pid))
		}
	}
	return killed
}

// cpuLimiter limits a process to a share of one CPU with a cgroup: v2's
// cpu.max where the unified hierarchy has the cpu controller, else v1's CFS
// quota.
type cpuLimiter struct {
	dir string // the cgroup of this harness's slowed processes
	v2  bool
}

func newCPULimiter() (*cpuLimiter, error) {
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && strings.Contains(string(b), "cpu") {
		return &cpuLimiter{dir: "/sys/fs/cgroup/dsmchaos", v2: true}, nil
	}
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"); err == nil {
		return &cpuLimiter{dir: "/sys/fs/cgroup/cpu/dsmchaos"}, nil
	}
	return nil, errors.New("no cgroup cpu controller (v2 cpu.max or v1 cpu.cfs_quota_us)")
}

// limit moves pid into the cgroup and limits it to pct percent of a CPU.
func (l *cpuLimiter) limit(pid, pct int) error {
	if err := os.MkdirAll(l.dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(l.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return err
	}
	quota := 100000 * pct / 100
	if l.v2 {
		return os.WriteFile(filepath.Join(l.dir, "cpu.max"), []byte(fmt.Sprintf("%d 100000", quota)), 0)
	}
	if err := os.WriteFile(filepath.Join(l.dir, "cpu.cfs_period_us"), []byte("100000"), 0); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(l.dir, "cpu.cfs_quota_us"), []byte(strconv.Itoa(quota)), 0)
}

// unlimit lifts the limit; the processes stay in the cgroup.
func (l *cpuLimiter) unlimit() error {
	if l.v2 {
		return os.WriteFile(filepath.Join(l.dir, "cpu.max"), []byte("max 100000"), 0)
	}
	return os.WriteFile(filepath.Join(l.dir, "cpu.cfs_quota_us"), []byte("-1"), 0)
}

// cleanCgroups moves whatever is left in the harness's cgroups to their
// parent and removes them.
func cleanCgroups() {
	for _, dir := range []string{"/sys/fs/cgroup/dsmchaos", "/sys/fs/cgroup/cpu/dsmchaos"} {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, pid := range strings.Fields(string(b)) {
			_ = os.WriteFile(filepath.Join(filepath.Dir(dir), "cgroup.procs"), []byte(pid), 0)
		}
		_ = os.Remove(dir)
	}
}

// diskSource is the source name of the harness's tmpfs mounts, by which a
// later run finds and unmounts those a killed run left.
const diskSource = "dsmchaos-disk"

func mountDisk(dir string, size int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return sh("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0755", size), diskSource, dir)
}

// cleanMounts unmounts every tmpfs of the harness.
func cleanMounts() {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 2 && f[0] == diskSource {
			_ = sh("umount", "-l", f[1])
		}
	}
}

// fillDisk writes a file into dir until the file system is full.
func fillDisk(dir string) (int64, error) {
	f, err := os.Create(filepath.Join(dir, fillerName))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		m, err := f.Write(buf)
		n += int64(m)
		if errors.Is(err, syscall.ENOSPC) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

const fillerName = "chaos-filler"
