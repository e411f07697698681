package rdma

import (
	"errors"
	"testing"
)

func TestCheckOp(t *testing.T) {
	const size = 4096
	for _, c := range []struct {
		name   string
		k      OpKind
		off, n uint64
		acc    Access
		want   error
	}{
		{"read", OpRead, 0, size, AccessRemoteRead, nil},
		{"zero-length read at end", OpRead, size, 0, AccessRemoteRead, nil},
		{"write", OpWrite, 100, 10, AccessRemoteWrite, nil},
		{"cas", OpCAS, 8, 8, AccessRemoteAtomic, nil},
		{"faa last word", OpFAA, size - 8, 8, AccessRemoteAtomic, nil},
		{"read past end", OpRead, size - 1, 2, AccessAll, ErrOutOfBounds},
		{"offset past end", OpRead, size + 1, 0, AccessAll, ErrOutOfBounds},
		{"offset+len overflows", OpWrite, ^uint64(0), 2, AccessAll, ErrOutOfBounds},
		{"misaligned", OpCAS, 12, 8, AccessAll, ErrMisaligned},
		{"atomic of 4 bytes", OpFAA, 8, 4, AccessAll, ErrBadRequest},
		{"write denied", OpWrite, 0, 1, AccessRemoteRead | AccessRemoteAtomic, ErrAccessDenied},
		{"read denied", OpRead, 0, 1, AccessRemoteWrite, ErrAccessDenied},
		{"atomic denied", OpFAA, 0, 8, AccessRemoteRead | AccessRemoteWrite, ErrAccessDenied},
		{"too large", OpRead, 0, MaxTransfer + 1, AccessAll, ErrTooLarge},
		{"zero kind", 0, 0, 1, AccessAll, ErrBadRequest},
		{"unknown kind", 42, 0, 1, AccessAll, ErrBadRequest},
	} {
		err := CheckOp(c.k, c.off, c.n, size, c.acc)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: CheckOp = %v, want %v", c.name, err, c.want)
		}
	}
}

func TestCheckBatch(t *testing.T) {
	ok := []Op{{Kind: OpRead, Buf: make([]byte, MaxTransfer)}, {Kind: OpFAA}, {Kind: OpCAS}, {Kind: OpWrite}}
	if err := CheckBatch(ok); err != nil {
		t.Errorf("valid batch: %v", err)
	}
	if err := CheckBatch(nil); !errors.Is(err, ErrBadRequest) {
		t.Errorf("empty batch: %v", err)
	}
	if err := CheckBatch(make([]Op, MaxBatch+1)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized batch: %v", err)
	}
	if err := CheckBatch([]Op{{Kind: OpFAA}, {}}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("zero kind: %v", err)
	}
	if err := CheckBatch([]Op{{Kind: OpWrite, Buf: make([]byte, MaxTransfer+1)}}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized write: %v", err)
	}
	buf := make([]byte, MaxTransfer)
	var heavy []Op
	for n := 0; n <= MaxBatchBytes; n += MaxTransfer {
		heavy = append(heavy, Op{Kind: OpWrite, Buf: buf})
	}
	if err := CheckBatch(heavy); !errors.Is(err, ErrTooLarge) {
		t.Errorf("batch writing %d bytes: %v", len(heavy)*MaxTransfer, err)
	}
	// As many bytes in READs and in WRITEs is fine: the limit is per direction.
	var mixed []Op
	for n := 0; n < MaxBatchBytes; n += MaxTransfer {
		mixed = append(mixed, Op{Kind: OpWrite, Buf: buf}, Op{Kind: OpRead, Buf: buf})
	}
	if err := CheckBatch(mixed); err != nil {
		t.Errorf("batch moving %d bytes each way: %v", MaxBatchBytes, err)
	}
}

func TestExecuteAndWords(t *testing.T) {
	mem, err := Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer Free(mem)
	op := Op{Kind: OpWrite, Offset: 16, Buf: []byte("abc")}
	if err := Execute(mem, AccessAll, &op); err != nil || string(mem[16:19]) != "abc" {
		t.Fatalf("write: %v %q", err, mem[16:19])
	}
	op = Op{Kind: OpFAA, Offset: 8, Operand: 5}
	if err := Execute(mem, AccessAll, &op); err != nil || op.Result != 0 || LoadWord(mem, 8) != 5 {
		t.Fatalf("faa: %v result %d word %d", err, op.Result, LoadWord(mem, 8))
	}
	op = Op{Kind: OpCAS, Offset: 8, Compare: 4, Operand: 9}
	if err := Execute(mem, AccessAll, &op); err != nil || op.Result != 5 || LoadWord(mem, 8) != 5 {
		t.Fatalf("failed cas: %v result %d word %d", err, op.Result, LoadWord(mem, 8))
	}
	op = Op{Kind: OpWrite, Offset: 4095, Buf: []byte("xy")}
	if err := Execute(mem, AccessAll, &op); !errors.Is(err, ErrOutOfBounds) || mem[4095] != 0 {
		t.Fatalf("out of bounds write: %v, last byte %d", err, mem[4095])
	}
	StoreWord(mem, 0, 7)
	if CASWord(mem, 0, 7, 8) != 7 || AddWord(mem, 0, 2) != 8 || LoadWord(mem, 0) != 10 {
		t.Errorf("word helpers: final %d", LoadWord(mem, 0))
	}
	for _, off := range []uint64{4, 4096} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("LoadWord(%d) did not panic", off)
				}
			}()
			LoadWord(mem, off)
		}()
	}
}

func TestAccessString(t *testing.T) {
	if s := (AccessRemoteRead | AccessRemoteAtomic).String(); s != "r-a" {
		t.Errorf("got %q", s)
	}
	if s := AccessAll.String(); s != "rwa" {
		t.Errorf("got %q", s)
	}
}
