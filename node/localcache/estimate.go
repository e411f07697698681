//go:build linux

package localcache

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsmkit/dsm/internal/memfd"
	"github.com/dsmkit/dsm/internal/uffd"
)

// estimateSample bounds the pages EstimateSuspend revokes to measure.
const estimateSample = 1024

// EstimateSuspend measures how long a Suspend of pages held pages would
// take on this machine in the worst case, for dsmd to check at start that
// its CapacityPages can be revoked within its revocation budget
// (docs/failover.md §9). The worst case is every page Modified, written by
// a client, and alone in its 2 MiB of the region (no two runs merge into
// one write protection; see revoke), in a region of pages of pageSize
// bytes (0: DefaultPageSize) mapped by one client: each page costs one
// write protection, one copy, and its share of the punch (a TLB flush per
// page table). It revokes a sample of up to 1024 such pages of a scratch
// memfd, mapped and written in this process (and registered with a
// userfaultfd for the write protection, where the kernel allows it), and
// scales the time taken to pages. Each further client that maps the pages
// adds about one write protection and one punch share per page
// (BenchmarkSuspend, sparse layout).
//
// It allocates the sample's memory (twice, briefly: 8 MiB for 4 KiB pages,
// plus a page table per page) and takes a few tens of milliseconds; the
// figure is as noisy as the machine.
func EstimateSuspend(pages int, pageSize int64) (time.Duration, error) {
	if pages <= 0 {
		return 0, nil
	}
	if pageSize == 0 {
		pageSize = max(DefaultPageSize, int64(os.Getpagesize()))
	}
	if pageSize <= 0 || pageSize%int64(os.Getpagesize()) != 0 {
		return 0, fmt.Errorf("%w: page size %d", ErrBadRegion, pageSize)
	}
	n := min(pages, estimateSample)
	stride := max(pageSize, wpMergeGap) // one page per 2 MiB
	size := int64(n) * stride
	src, err := memfd.Create("dsm-estimate", size)
	if err != nil {
		return 0, fmt.Errorf("localcache: estimate: %w", err)
	}
	defer src.Close()
	mp, err := src.Map(0, size, memfd.ReadWrite)
	if err != nil {
		return 0, fmt.Errorf("localcache: estimate: %w", err)
	}
	defer mp.Unmap()
	mem := mp.Bytes()
	for i := range n {
		mem[int64(i)*stride] = 1 // allocated, mapped and dirty, as a client's page
	}
	fd, err := unix.MemfdCreate("dsm-estimate-aside", unix.MFD_CLOEXEC)
	if err != nil {
		return 0, fmt.Errorf("localcache: estimate: %w", err)
	}
	aside := os.NewFile(uintptr(fd), "memfd:dsm-estimate-aside")
	defer aside.Close()
	if err := aside.Truncate(size); err != nil {
		return 0, fmt.Errorf("localcache: estimate: %w", err)
	}
	// Nothing touches the mapping once it is write-protected: a store
	// would wait for a fault nobody reads.
	var u *uffd.UFFD
	if uu, err := uffd.Open(uffd.Options{NoOptional: true}); err == nil {
		if _, err := uu.Register(mp.Addr(), uint64(size), uffd.ModeWP); err == nil {
			u = uu
			defer func() {
				u.Unregister(mp.Addr(), uint64(size))
				u.Close()
			}()
		} else {
			uu.Close()
		}
	}
	start := time.Now()
	for i := range n {
		off := int64(i) * stride
		if u != nil {
			if err := u.WriteProtect(mp.Addr()+uint64(off), uint64(pageSize), true, 0); err != nil {
				return 0, fmt.Errorf("localcache: estimate: %w", err)
			}
		}
	}
	for i := range n {
		off := int64(i) * stride
		if _, err := copyRange(int(aside.Fd()), src.Fd(), off, pageSize); err != nil {
			return 0, fmt.Errorf("localcache: estimate: %w", err)
		}
	}
	if err := src.PunchHole(0, size); err != nil {
		return 0, fmt.Errorf("localcache: estimate: %w", err)
	}
	took := time.Since(start)
	return took * time.Duration(pages) / time.Duration(n), nil
}
