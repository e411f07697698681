package mapproto

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"
	"unsafe"
)

var leaseSamples = []Lease{
	{Incarnation: 0x1234_5678_9abc, Deadline: 90 * time.Second, State: LeaseServing, Epoch: 17},
	{Incarnation: 1, State: LeaseSuspended, Epoch: 3},
	{State: LeaseDraining, Deadline: 1<<63 - 1},
}

func TestLeaseRoundTrip(t *testing.T) {
	page := make([]uint64, 512)
	mem := bytesOf(page)
	for _, l := range leaseSamples {
		if err := StoreLease(mem, l); err != nil {
			t.Fatal(err)
		}
		got, err := LoadLease(mem)
		if err != nil || got != l {
			t.Fatalf("LoadLease after StoreLease(%v) = %v, %v", l, got, err)
		}
		snap := append([]byte(nil), mem[:LeaseRecordSize]...)
		dec, seq, err := DecodeLease(snap)
		if err != nil || dec != l {
			t.Fatalf("DecodeLease of the page = %v, %v, want %v", dec, err, l)
		}
		if !bytes.Equal(EncodeLease(l, seq), snap) {
			t.Fatalf("EncodeLease(%v, %d) = %x, the page holds %x", l, seq, EncodeLease(l, seq), snap)
		}
	}
}

// TestLeaseTorn: a record whose writer stopped in the middle never reads
// as a lease; nor do other layouts and bad fields.
func TestLeaseTorn(t *testing.T) {
	l := leaseSamples[0]
	if _, err := LoadLease(bytesOf(make([]uint64, 6))); !errors.Is(err, ErrMalformed) {
		t.Errorf("an all-zero page: %v, want ErrMalformed", err)
	}
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"odd sequence", EncodeLease(l, 7), ErrLeaseTorn},
		{"short", EncodeLease(l, 2)[:LeaseRecordSize-1], ErrMalformed},
		{"no state", EncodeLease(Lease{Deadline: time.Second}, 2), ErrMalformed},
		{"unknown state", EncodeLease(Lease{State: leaseStateEnd}, 2), ErrMalformed},
		{"negative deadline", EncodeLease(Lease{State: LeaseServing, Deadline: -1}, 2), ErrMalformed},
		{"other magic", append([]byte{'X'}, EncodeLease(l, 2)[1:]...), ErrMalformed},
	} {
		if _, _, err := DecodeLease(c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// A writer stopped after its first store.
	page := make([]uint64, 6)
	mem := bytesOf(page)
	StoreLease(mem, l)
	page[1]++
	if _, err := LoadLease(mem); !errors.Is(err, ErrLeaseTorn) {
		t.Errorf("a record being written: %v, want ErrLeaseTorn", err)
	}
}

// TestLeaseConcurrent: a reader racing a writer sees only records the
// writer wrote whole (every field of a record carries the same number).
func TestLeaseConcurrent(t *testing.T) {
	page := make([]uint64, 6)
	mem := bytesOf(page)
	StoreLease(mem, Lease{State: LeaseServing})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := uint64(1); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			StoreLease(mem, Lease{Incarnation: i, Deadline: time.Duration(i), State: LeaseServing, Epoch: i})
		}
	}()
	torn := 0
	for range 20000 {
		l, err := LoadLease(mem)
		if errors.Is(err, ErrLeaseTorn) {
			torn++
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if l.Incarnation != uint64(l.Deadline) || l.Incarnation != l.Epoch {
			t.Fatalf("torn record read: %v", l)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d of 20000 reads gave up on a record being written", torn)
}

// FuzzDecodeLease: DecodeLease never panics, and what it accepts encodes
// back to the same bytes.
func FuzzDecodeLease(f *testing.F) {
	for i, l := range leaseSamples {
		f.Add(EncodeLease(l, uint64(2*i)))
	}
	f.Add(EncodeLease(leaseSamples[0], 3))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, seq, err := DecodeLease(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if again := EncodeLease(l, seq); !bytes.Equal(again, b[:LeaseRecordSize]) {
			t.Fatalf("re-encoding %v: %x, want %x", l, again, b[:LeaseRecordSize])
		}
	})
}

// bytesOf is the memory of words as bytes (8-byte aligned, as a mapped
// page is).
func bytesOf(words []uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), 8*len(words))
}
