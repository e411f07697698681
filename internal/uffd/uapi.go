//go:build linux

package uffd

// The userfaultfd ABI, transcribed from the kernel's uapi header
// (include/uapi/linux/userfaultfd.h). golang.org/x/sys has the syscall number
// but none of the ioctls or structures, so they are spelled out here. Every
// structure is a run of naturally aligned 64-bit fields, so the Go layout is
// the C layout; uapi_test.go checks the sizes and the ioctl numbers.

import "unsafe"

// The ioctl type byte of every userfaultfd request.
const uffdioType = 0xAA

// The request numbers (the "nr" of _IOWR(0xAA, nr, struct)). The kernel also
// reports, after UFFDIO_API and UFFDIO_REGISTER, a bitmask with bit nr set for
// each request it supports (see Ioctls).
const (
	nrRegister     = 0x00
	nrUnregister   = 0x01
	nrWake         = 0x02
	nrCopy         = 0x03
	nrZeroPage     = 0x04
	nrMove         = 0x05
	nrWriteProtect = 0x06
	nrContinue     = 0x07
	nrPoison       = 0x08
	nrAPI          = 0x3F
)

// uffdAPI is the only API version the kernel knows.
const uffdAPI = 0xAA

// The Linux generic ioctl encoding (asm-generic/ioctl.h, used by x86 and
// arm64): dir<<30 | size<<16 | type<<8 | nr.
const (
	iocNone  = 0
	iocWrite = 1
	iocRead  = 2
)

func ioc(dir, typ, nr, size uintptr) uintptr {
	return dir<<30 | size<<16 | typ<<8 | nr
}

func iowr(nr, size uintptr) uintptr { return ioc(iocRead|iocWrite, uffdioType, nr, size) }
func ior(nr, size uintptr) uintptr  { return ioc(iocRead, uffdioType, nr, size) }

// The structures passed to the ioctls.
type (
	uffdioAPI struct {
		api      uint64
		features uint64
		ioctls   uint64
	}
	uffdioRange struct {
		start uint64
		len   uint64
	}
	uffdioRegister struct {
		rng    uffdioRange
		mode   uint64
		ioctls uint64
	}
	uffdioCopy struct {
		dst  uint64
		src  unsafe.Pointer // a pointer, not a uintptr, so a moved stack updates it
		len  uint64
		mode uint64
		copy int64 // out: bytes copied, or a negative errno
	}
	uffdioZeroPage struct {
		rng      uffdioRange
		mode     uint64
		zeropage int64 // out: bytes zeroed, or a negative errno
	}
	uffdioWriteProtect struct {
		rng  uffdioRange
		mode uint64
	}
	uffdioContinue struct {
		rng    uffdioRange
		mode   uint64
		mapped int64 // out: bytes mapped, or a negative errno
	}
	uffdioPoison struct {
		rng     uffdioRange
		mode    uint64
		updated int64 // out: bytes poisoned, or a negative errno
	}
)

// The request codes. UNREGISTER and WAKE are _IOR although the kernel only
// reads them: a historical mistake the ABI keeps.
var (
	reqAPI          = iowr(nrAPI, unsafe.Sizeof(uffdioAPI{}))
	reqRegister     = iowr(nrRegister, unsafe.Sizeof(uffdioRegister{}))
	reqUnregister   = ior(nrUnregister, unsafe.Sizeof(uffdioRange{}))
	reqWake         = ior(nrWake, unsafe.Sizeof(uffdioRange{}))
	reqCopy         = iowr(nrCopy, unsafe.Sizeof(uffdioCopy{}))
	reqZeroPage     = iowr(nrZeroPage, unsafe.Sizeof(uffdioZeroPage{}))
	reqWriteProtect = iowr(nrWriteProtect, unsafe.Sizeof(uffdioWriteProtect{}))
	reqContinue     = iowr(nrContinue, unsafe.Sizeof(uffdioContinue{}))
	reqPoison       = iowr(nrPoison, unsafe.Sizeof(uffdioPoison{}))
	// USERFAULTFD_IOC_NEW on /dev/userfaultfd: _IO(0xAA, 0x00).
	reqDevNew = ioc(iocNone, uffdioType, 0x00, 0)
)

// The layout checks: these fail to compile where a structure would not have
// the kernel's size (a 32-bit target, where unsafe.Pointer is 4 bytes).
var (
	_ [unsafe.Sizeof(uffdioCopy{}) - 40]byte
	_ [40 - unsafe.Sizeof(uffdioCopy{})]byte
	_ [unsafe.Sizeof(uffdioRegister{}) - 32]byte
	_ [32 - unsafe.Sizeof(uffdioRegister{})]byte
)

// Mode bits of the resolving ioctls.
const (
	copyModeDontWake         = 1 << 0
	copyModeWP               = 1 << 1
	zeroPageModeDontWake     = 1 << 0
	writeProtectModeWP       = 1 << 0
	writeProtectModeDontWake = 1 << 1
	continueModeDontWake     = 1 << 0
	continueModeWP           = 1 << 1
	poisonModeDontWake       = 1 << 0
)

// msgSize is sizeof(struct uffd_msg): the kernel writes whole messages only.
const msgSize = 32
