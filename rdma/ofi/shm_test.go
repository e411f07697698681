//go:build ofi

package ofi

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// FuzzShmPeerOf feeds arbitrary shm endpoint names, as the directory could
// carry them in a peer's address, to the parser that derives the peer's
// process id and doorbell path: the path must name a file directly in
// /dev/shm with this package's prefix, and only when a process id was found.
func FuzzShmPeerOf(f *testing.F) {
	f.Add([]byte("dsm_ofi_1234_2_7\x00"))
	f.Add([]byte("fi_shm://dsm_ofi_1_1_1"))
	f.Add([]byte("dsm_ofi_x_1_1\x00"))
	f.Add([]byte("dsm_ofi_1_../../etc\x00"))
	f.Fuzz(func(t *testing.T, name []byte) {
		pid, bell := shmPeerOf(name)
		if (pid > 0) != (bell != "") {
			t.Fatalf("%q: pid %d, doorbell %q", name, pid, bell)
		}
		if bell == "" {
			return
		}
		dir, file := filepath.Split(bell)
		rest, ok := strings.CutPrefix(file, shmPrefix)
		pidStr, _, _ := strings.Cut(rest, "_")
		if p, err := strconv.Atoi(pidStr); dir != shmDir+"/" || !ok || err != nil || p != pid || !strings.HasSuffix(file, bellSuffix) {
			t.Fatalf("%q: doorbell %q outside %s or misnamed (pid %d)", name, bell, shmDir, pid)
		}
	})
}

// TestProcessRuns checks the liveness test of shm peers on this process
// and on a process id that cannot exist.
func TestProcessRuns(t *testing.T) {
	if !processRuns(os.Getpid()) {
		t.Error("this process does not run")
	}
	if processRuns(1 << 30) {
		t.Error("pid 2^30 runs")
	}
}
