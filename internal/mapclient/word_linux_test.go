//go:build linux

package mapclient

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestWordAndPopulate(t *testing.T) {
	d := newFakeDaemon(t, 4)
	_, m := mapRegion(t, d)
	var v uint64
	if err := m.Word(int64(2*ps+8), false, func(w *uint64) { v = atomic.LoadUint64(w) }); err != nil {
		t.Fatal(err)
	}
	if v != 0x0303030303030303 {
		t.Fatalf("word of page 2 = %#x, want the daemon's fill", v)
	}
	if err := m.Word(int64(2*ps+8), true, func(w *uint64) { v = atomic.AddUint64(w, 1) }); err != nil || v != 0x0303030303030304 {
		t.Fatalf("Add = %#x, %v", v, err)
	}
	for _, off := range []int64{-8, 4, m.Len() - 4, m.Len()} {
		if err := m.Word(off, false, func(*uint64) { t.Error("op ran") }); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("Word(%d): %v, want ErrOutOfRange", off, err)
		}
	}
	if err := m.Populate(int64(ps)+10, 20, true); err != nil {
		t.Fatal(err)
	}
	if b := m.Bytes()[ps+10]; b != 2 {
		t.Fatalf("populated page 1 reads %d", b)
	}
	if err := m.Populate(m.Len()-1, 2, false); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("Populate across the end: %v", err)
	}
	if err := m.Populate(0, 0, false); err != nil {
		t.Fatalf("empty Populate: %v", err)
	}
}

// A Word waiting for its page when dsmd dies fails with ErrDaemonGone.
func TestWordDaemonGone(t *testing.T) {
	d := newFakeDaemon(t, 4, 1)
	_, m := mapRegion(t, d)
	res := make(chan error, 1)
	go func() {
		res <- m.Word(int64(ps), true, func(w *uint64) { atomic.AddUint64(w, 1) })
	}()
	waitFault(t, d, 1)
	d.Die()
	select {
	case err := <-res:
		if !errors.Is(err, ErrDaemonGone) {
			t.Fatalf("waiting Word: %v, want ErrDaemonGone", err)
		}
	case <-time.After(hangDeadline):
		t.Fatal("waiting Word not released after the daemon died")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Word(0, false, func(*uint64) {}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Word after Close: %v", err)
	}
	if err := m.Populate(0, 8, false); !errors.Is(err, ErrClosed) {
		t.Fatalf("Populate after Close: %v", err)
	}
}
