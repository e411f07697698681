package uffd

import (
	"fmt"
	"strings"
)

// Feature is a set of UFFD_FEATURE_* bits: what UFFDIO_API negotiates.
type Feature uint64

// The feature bits of the kernel ABI.
const (
	FeaturePagefaultFlagWP  Feature = 1 << 0  // WP mode on anonymous memory; the WP flag in fault messages
	FeatureEventFork        Feature = 1 << 1  // fork delivers a new userfaultfd for the child
	FeatureEventRemap       Feature = 1 << 2  // mremap is reported
	FeatureEventRemove      Feature = 1 << 3  // madvise(DONTNEED/REMOVE) is reported
	FeatureMissingHugetlbfs Feature = 1 << 4  // MISSING on hugetlbfs
	FeatureMissingShmem     Feature = 1 << 5  // MISSING on shmem (memfd)
	FeatureEventUnmap       Feature = 1 << 6  // munmap is reported
	FeatureSigbus           Feature = 1 << 7  // faults raise SIGBUS instead of being reported
	FeatureThreadID         Feature = 1 << 8  // fault messages carry the faulting thread id
	FeatureMinorHugetlbfs   Feature = 1 << 9  // MINOR on hugetlbfs
	FeatureMinorShmem       Feature = 1 << 10 // MINOR on shmem: page cached, PTE absent
	FeatureExactAddress     Feature = 1 << 11 // fault addresses are not rounded to the page
	FeatureWPHugetlbfsShmem Feature = 1 << 12 // WP mode on hugetlbfs and shmem
	FeatureWPUnpopulated    Feature = 1 << 13 // WP on never-populated anonymous PTEs
	FeaturePoison           Feature = 1 << 14 // UFFDIO_POISON
	FeatureWPAsync          Feature = 1 << 15 // WP faults resolved by the kernel (dirty tracking)
	FeatureMove             Feature = 1 << 16 // UFFDIO_MOVE
	lastFeature                     = FeatureMove
)

var featureNames = [...]string{
	"PAGEFAULT_FLAG_WP", "EVENT_FORK", "EVENT_REMAP", "EVENT_REMOVE",
	"MISSING_HUGETLBFS", "MISSING_SHMEM", "EVENT_UNMAP", "SIGBUS",
	"THREAD_ID", "MINOR_HUGETLBFS", "MINOR_SHMEM", "EXACT_ADDRESS",
	"WP_HUGETLBFS_SHMEM", "WP_UNPOPULATED", "POISON", "WP_ASYNC", "MOVE",
}

// String names the bits, "|"-separated; unknown bits are shown in hex.
func (f Feature) String() string {
	if f == 0 {
		return "none"
	}
	var parts []string
	for i, name := range featureNames {
		if f&(1<<i) != 0 {
			parts = append(parts, name)
		}
	}
	if rest := f &^ (lastFeature<<1 - 1); rest != 0 {
		parts = append(parts, fmt.Sprintf("%#x", uint64(rest)))
	}
	return strings.Join(parts, "|")
}

// requirement says why the service needs a feature and which kernel first
// offered it, so a refusal at start-up can tell the operator what to upgrade.
type requirement struct {
	f      Feature
	kernel string
	why    string
}

// required lists the features the fault service cannot work without. Open
// refuses a kernel that lacks any of them.
var required = []requirement{
	{FeatureMissingShmem, "4.11", "absent pages of a memfd region must be reported"},
	{FeaturePagefaultFlagWP, "5.7", "write-protect faults must be reported"},
	{FeatureMinorShmem, "5.14", "cached but unmapped pages of a memfd must be reported (UFFDIO_CONTINUE)"},
	{FeatureWPHugetlbfsShmem, "5.19", "write protection must work on memfd (shmem) mappings"},
}

// Required is the set of features Open always requests.
var Required = func() Feature {
	var f Feature
	for _, r := range required {
		f |= r.f
	}
	return f
}()

// DefaultOptional is what Open requests beyond Required when the caller does
// not say otherwise, each only where the kernel offers it: thread ids (for
// diagnostics) and WP on unpopulated PTEs (harmless on shmem, which keeps WP
// markers anyway; it makes anonymous memory behave the same).
const DefaultOptional = FeatureThreadID | FeatureWPUnpopulated

// FeatureError reports a kernel that lacks features the service requires.
type FeatureError struct {
	Missing Feature // the required bits the kernel did not offer
	Kernel  string  // the oldest Linux release that offers all of them
	Offered Feature // what the kernel does offer
}

func (e *FeatureError) Error() string {
	var whys []string
	for _, r := range required {
		if e.Missing&r.f != 0 {
			whys = append(whys, fmt.Sprintf("%s (Linux %s: %s)", r.f, r.kernel, r.why))
		}
	}
	return fmt.Sprintf("uffd: the kernel lacks required userfaultfd features %s; Linux >= %s is needed (kernel offers %s)",
		strings.Join(whys, ", "), e.Kernel, e.Offered)
}

// Unwrap lets errors.Is(err, ErrUnsupported) match.
func (e *FeatureError) Unwrap() error { return ErrUnsupported }

// checkRequired returns a *FeatureError when offered lacks a required bit.
func checkRequired(offered Feature) error {
	missing := Required &^ offered
	if missing == 0 {
		return nil
	}
	kernel := ""
	for _, r := range required {
		if missing&r.f != 0 && versionLess(kernel, r.kernel) {
			kernel = r.kernel
		}
	}
	return &FeatureError{Missing: missing, Kernel: kernel, Offered: offered}
}

// versionLess compares dotted release numbers ("" is the smallest).
func versionLess(a, b string) bool {
	if a == "" {
		return b != ""
	}
	var a1, a2, b1, b2 int
	fmt.Sscanf(a, "%d.%d", &a1, &a2)
	fmt.Sscanf(b, "%d.%d", &b1, &b2)
	return a1 < b1 || (a1 == b1 && a2 < b2)
}

// Mode is a set of UFFDIO_REGISTER_MODE_* bits: which faults of a range are
// reported.
type Mode uint64

// Register modes.
const (
	// ModeMissing reports access to a page that is not in the page cache
	// (shmem) or not allocated (anonymous).
	ModeMissing Mode = 1 << 0
	// ModeWP reports writes to write-protected PTEs.
	ModeWP Mode = 1 << 1
	// ModeMinor reports access to a page that is in the page cache but has
	// no PTE in this process (shmem, hugetlbfs).
	ModeMinor Mode = 1 << 2
)

func (m Mode) String() string {
	if m == 0 {
		return "none"
	}
	var parts []string
	for i, name := range [...]string{"MISSING", "WP", "MINOR"} {
		if m&(1<<i) != 0 {
			parts = append(parts, name)
		}
	}
	if rest := m &^ 7; rest != 0 {
		parts = append(parts, fmt.Sprintf("%#x", uint64(rest)))
	}
	return strings.Join(parts, "|")
}

// Ioctls is the bitmask the kernel returns from UFFDIO_API and
// UFFDIO_REGISTER: bit n set means the request with number n is supported (on
// that range, for REGISTER).
type Ioctls uint64

// Has reports whether the request with number nr is in the set.
func (s Ioctls) Has(nr uint) bool { return s&(1<<nr) != 0 }

// The request numbers callers test with Has.
const (
	IoctlRegister     = nrRegister
	IoctlUnregister   = nrUnregister
	IoctlWake         = nrWake
	IoctlCopy         = nrCopy
	IoctlZeroPage     = nrZeroPage
	IoctlMove         = nrMove
	IoctlWriteProtect = nrWriteProtect
	IoctlContinue     = nrContinue
	IoctlPoison       = nrPoison
	IoctlAPI          = nrAPI
)

func (s Ioctls) String() string {
	names := map[uint]string{
		nrRegister: "REGISTER", nrUnregister: "UNREGISTER", nrWake: "WAKE", nrCopy: "COPY",
		nrZeroPage: "ZEROPAGE", nrMove: "MOVE", nrWriteProtect: "WRITEPROTECT",
		nrContinue: "CONTINUE", nrPoison: "POISON", nrAPI: "API",
	}
	var parts []string
	for nr := uint(0); nr < 64; nr++ {
		if !s.Has(nr) {
			continue
		}
		if n, ok := names[nr]; ok {
			parts = append(parts, n)
		} else {
			parts = append(parts, fmt.Sprintf("nr%#x", nr))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "|")
}
