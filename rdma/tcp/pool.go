package tcp

import (
	"math/bits"
	"sync"
)

// Frame buffers come from power-of-two pools from 512 bytes to 1 MiB;
// larger frames are rare (large pages, big batches) and cost far more to
// move than to allocate, so they are not kept.
const (
	minPoolShift = 9
	maxPoolShift = 20
)

// buffer is a pooled frame buffer. The pools hold *buffer so that returning
// one does not allocate.
type buffer struct {
	b   []byte
	off int // bytes of b already sent, for a frame written in two parts
}

var bufPools [maxPoolShift - minPoolShift + 1]sync.Pool

// getBuf returns a buffer whose b has length n.
func getBuf(n int) *buffer {
	shift := minPoolShift
	if n > 1<<minPoolShift {
		shift = bits.Len(uint(n - 1))
	}
	if shift > maxPoolShift {
		return &buffer{b: make([]byte, n)}
	}
	if v := bufPools[shift-minPoolShift].Get(); v != nil {
		fb := v.(*buffer)
		fb.b = fb.b[:n]
		fb.off = 0
		return fb
	}
	return &buffer{b: make([]byte, n, 1<<shift)}
}

// putBuf returns fb to its pool; fb must not be used afterwards.
func putBuf(fb *buffer) {
	c := cap(fb.b)
	if c < 1<<minPoolShift || c > 1<<maxPoolShift || c&(c-1) != 0 {
		return
	}
	bufPools[bits.Len(uint(c))-1-minPoolShift].Put(fb)
}
