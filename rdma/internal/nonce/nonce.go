// Package nonce draws the incarnation nonces of the verbs backends: one
// random, non-zero 64-bit number per process endpoint.
package nonce

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
)

// New returns a random, non-zero nonce. It panics when the system has no
// randomness to give (an endpoint cannot tell its incarnations apart then).
func New() uint64 {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			panic(fmt.Sprintf("rdma: no randomness for an incarnation nonce: %v", err))
		}
		if n := binary.LittleEndian.Uint64(b[:]); n != 0 {
			return n
		}
	}
}
