//go:build linux

package uffd

import (
	"errors"
	"strings"
	"testing"
)

func TestFeatureString(t *testing.T) {
	if got := (FeatureMissingShmem | FeatureMinorShmem).String(); got != "MISSING_SHMEM|MINOR_SHMEM" {
		t.Errorf("got %q", got)
	}
	if got := (FeatureMove | 1<<40).String(); got != "MOVE|0x10000000000" {
		t.Errorf("got %q", got)
	}
	if got := (ModeMissing | ModeWP | ModeMinor).String(); got != "MISSING|WP|MINOR" {
		t.Errorf("got %q", got)
	}
	if got := Ioctls(1<<IoctlCopy | 1<<IoctlContinue).String(); got != "COPY|CONTINUE" {
		t.Errorf("got %q", got)
	}
}

func TestCheckRequired(t *testing.T) {
	if err := checkRequired(Required | FeatureThreadID); err != nil {
		t.Fatalf("all required offered: %v", err)
	}
	// A 5.10 kernel: no MINOR_SHMEM (5.14), no WP on shmem (5.19).
	old := Required &^ (FeatureMinorShmem | FeatureWPHugetlbfsShmem)
	err := checkRequired(old)
	var fe *FeatureError
	if !errors.As(err, &fe) || !errors.Is(err, ErrUnsupported) {
		t.Fatalf("got %v, want a *FeatureError matching ErrUnsupported", err)
	}
	if fe.Missing != FeatureMinorShmem|FeatureWPHugetlbfsShmem || fe.Kernel != "5.19" {
		t.Fatalf("missing %s kernel %s", fe.Missing, fe.Kernel)
	}
	for _, want := range []string{"MINOR_SHMEM", "WP_HUGETLBFS_SHMEM", "Linux >= 5.19"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
}

func TestParseFDInfo(t *testing.T) {
	info, err := parseFDInfo([]byte("pos:\t0\nflags:\t02004002\nmnt_id:\t16\nino:\t1057\npending:\t2\ntotal:\t3\nAPI:\taa:80001d21:c000000000000003\n"))
	if err != nil {
		t.Fatal(err)
	}
	if info.pending != 2 || info.total != 3 || !info.initialized ||
		info.features != FeatureMissingShmem|FeatureMinorShmem|FeatureWPHugetlbfsShmem|FeaturePagefaultFlagWP|FeatureThreadID|1<<11 {
		t.Fatalf("parsed %+v (features %s)", info, info.features)
	}
	if _, err := parseFDInfo([]byte("pos:\t0\n")); !errors.Is(err, ErrNotUserfaultfd) {
		t.Fatalf("no API line: %v", err)
	}
	if _, err := parseFDInfo([]byte("API:\tzz:1\n")); !errors.Is(err, ErrNotUserfaultfd) {
		t.Fatalf("bad API line: %v", err)
	}
}

func FuzzParseFDInfo(f *testing.F) {
	f.Add([]byte("pending:\t0\ntotal:\t0\nAPI:\taa:0:0\n"))
	f.Add([]byte("API:\t::\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		info, err := parseFDInfo(b)
		if err == nil && info.features&featureInitialized != 0 {
			t.Fatalf("internal bit leaked into features: %s", info.features)
		}
	})
}
