// Package memfd is the page cache of a mapped region: an anonymous
// memory file (memfd_create) that dsmd owns and every local client maps, so
// processes on one node share physical pages with zero copies (design §4).
//
// Create makes a file of the region's size. It is sparse: a 1 TiB region
// costs nothing until pages are touched, and each touched page costs one
// page. The file is sealed against resizing (a client that shrank it would
// make every other mapping SIGBUS) and against further seals; punching holes
// stays allowed. Clients receive the descriptor over the Unix socket and adopt
// it with FromFD, which refuses anything that is not a memfd sealed against
// shrinking.
//
// Map maps a range MAP_SHARED. PunchHole drops pages from the cache and from
// every mapping in every process: that is how dsmd invalidates a page, and
// the next access of a userfaultfd-registered client is a MISSING fault.
// CachedPages (lseek SEEK_DATA/SEEK_HOLE) and Resident (mincore) observe
// without faulting anything in; both report the page cache, not whether a
// given process has the page mapped.
//
// Mapping.PopulateRead and PopulateWrite (MADV_POPULATE_READ/WRITE) enter
// the faults of a range from a syscall, so a goroutine waiting for dsmd waits
// in the kernel rather than inside a load instruction; EINTR (a signal while
// waiting) is retried. DontFork (MADV_DONTFORK) keeps a registered mapping
// out of forked children.
//
// Invariant for dsmd: reading its own mapping of a hole allocates a zero page
// in the cache (shared shmem mappings have no zero page), so dsmd touches a
// page only to install its contents.
package memfd
