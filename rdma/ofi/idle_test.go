//go:build ofi

package ofi

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestIdleCPU reports (it asserts nothing: timings are for benchmarks) the
// CPU time that two connected endpoints, idle, spend per second of wall
// time, per provider: the process's utime+stime from /proc/self/stat over
// DSM_OFI_IDLE_CPU seconds. It runs only when that variable is set:
//
//	DSM_OFI_IDLE_CPU=10 go test -tags ofi -run '^TestIdleCPU$' -v ./rdma/ofi
func TestIdleCPU(t *testing.T) {
	secs, _ := strconv.Atoi(os.Getenv("DSM_OFI_IDLE_CPU"))
	if secs <= 0 {
		t.Skip("set DSM_OFI_IDLE_CPU=<seconds> to measure")
	}
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			pair(t, prov)
			time.Sleep(time.Second) // let start-up work settle
			c0, w0 := procCPU(t), time.Now()
			time.Sleep(time.Duration(secs) * time.Second)
			c1, w1 := procCPU(t), time.Now()
			pct := 100 * (c1 - c0).Seconds() / w1.Sub(w0).Seconds()
			t.Logf("%s: two idle endpoints used %.2f%% of a CPU (%.2f%% each) over %v",
				prov, pct, pct/2, w1.Sub(w0).Round(time.Millisecond))
		})
	}
}

// procCPU is the process's user and system CPU time so far.
func procCPU(t *testing.T) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skip(err)
	}
	// Fields after the command name, which is in parentheses: state is
	// field 3, utime 14, stime 15 (in clock ticks, 100 a second here).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}
