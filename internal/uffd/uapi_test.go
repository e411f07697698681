//go:build linux

package uffd

import (
	"testing"
	"unsafe"
)

// The request codes as the C preprocessor computes them from the kernel's
// uapi header (printed by a C program including <linux/userfaultfd.h>).
func TestRequestCodes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want uintptr
	}{
		{"UFFDIO_API", reqAPI, 0xc018aa3f},
		{"UFFDIO_REGISTER", reqRegister, 0xc020aa00},
		{"UFFDIO_UNREGISTER", reqUnregister, 0x8010aa01},
		{"UFFDIO_WAKE", reqWake, 0x8010aa02},
		{"UFFDIO_COPY", reqCopy, 0xc028aa03},
		{"UFFDIO_ZEROPAGE", reqZeroPage, 0xc020aa04},
		{"UFFDIO_WRITEPROTECT", reqWriteProtect, 0xc018aa06},
		{"UFFDIO_CONTINUE", reqContinue, 0xc020aa07},
		{"UFFDIO_POISON", reqPoison, 0xc020aa08},
		{"USERFAULTFD_IOC_NEW", reqDevNew, 0xaa00},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %#x, want %#x", tc.name, tc.got, tc.want)
		}
	}
}

func TestStructSizes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want uintptr
	}{
		{"uffdio_api", unsafe.Sizeof(uffdioAPI{}), 24},
		{"uffdio_range", unsafe.Sizeof(uffdioRange{}), 16},
		{"uffdio_register", unsafe.Sizeof(uffdioRegister{}), 32},
		{"uffdio_copy", unsafe.Sizeof(uffdioCopy{}), 40},
		{"uffdio_zeropage", unsafe.Sizeof(uffdioZeroPage{}), 32},
		{"uffdio_writeprotect", unsafe.Sizeof(uffdioWriteProtect{}), 24},
		{"uffdio_continue", unsafe.Sizeof(uffdioContinue{}), 32},
		{"uffdio_poison", unsafe.Sizeof(uffdioPoison{}), 32},
	} {
		if tc.got != tc.want {
			t.Errorf("sizeof(struct %s) = %d, want %d", tc.name, tc.got, tc.want)
		}
	}
	if off := unsafe.Offsetof(uffdioCopy{}.copy); off != 32 {
		t.Errorf("uffdio_copy.copy at %d, want 32", off)
	}
	if off := unsafe.Offsetof(uffdioContinue{}.mapped); off != 24 {
		t.Errorf("uffdio_continue.mapped at %d, want 24", off)
	}
}
