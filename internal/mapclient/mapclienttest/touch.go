package mapclienttest

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"time"
	"unsafe"
)

// TouchResult is what an access of Touch or TouchAsync did: it faulted at
// the page of the address, or else it read V (0 for a store that
// completed). Err reports a panic that was not a fault on that page.
type TouchResult struct {
	Faulted bool
	V       byte
	Err     error
}

// TouchAsync loads b[off] (stores 0xa5 to it if store) on a goroutine
// locked to its thread that turns memory faults into panics
// (debug.SetPanicOnFault), and reports on the returned channel. An access
// blocked in a page fault reports only once the fault is answered or
// woken: tests start it, do what should end the wait, then read.
func TouchAsync(b []byte, off int, store bool) <-chan TouchResult {
	res := make(chan TouchResult, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			page := uintptr(os.Getpagesize() - 1)
			want := uintptr(unsafe.Pointer(&b[off]))
			if f, ok := p.(interface{ Addr() uintptr }); ok && f.Addr()&^page == want&^page {
				res <- TouchResult{Faulted: true}
				return
			}
			res <- TouchResult{Err: fmt.Errorf("panic at %#x: %v", want, p)}
		}()
		if store {
			b[off] = 0xa5
			res <- TouchResult{}
			return
		}
		res <- TouchResult{V: b[off]}
	}()
	return res
}

// Touch is TouchAsync waited for: an access that does not report within
// wait is an error (its thread stays blocked in the kernel).
func Touch(b []byte, off int, store bool, wait time.Duration) TouchResult {
	select {
	case r := <-TouchAsync(b, off, store):
		return r
	case <-time.After(wait):
		return TouchResult{Err: fmt.Errorf("the access at offset %d did not return within %v", off, wait)}
	}
}
