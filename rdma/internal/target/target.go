// Package target is the registration table of the software backends (mem
// and tcp): it hands out keys, finds a registration by key, and executes
// remote operations on it so that a deregistration never races with an
// operation in flight.
package target

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// Table holds one node's registrations. Lookups are lock-free; an
// operation holds its registration's read lock while it touches the memory,
// and Deregister takes the write lock, so once Deregister returns no
// operation touches the memory any more.
type Table struct {
	node ids.NodeID

	mu      sync.Mutex // serializes writers of regs
	nextKey uint64
	regs    atomic.Pointer[map[uint64]*Reg]
}

// New returns an empty table for node whose keys are numbered from 1 (the
// simulations' deterministic keys).
func New(node ids.NodeID) *Table { return NewFrom(node, 1) }

// NewFrom returns an empty table for node whose keys are numbered from
// first (not 0). A transport whose process may restart under the same node
// id starts from a random key, so that the keys of one incarnation are not
// the keys of the next: a batch meant for the old process's memory fails
// at the new one (rdma.ErrUnknownKey) instead of reaching memory that
// happens to carry the same number.
func NewFrom(node ids.NodeID, first uint64) *Table {
	if first == 0 {
		first = 1
	}
	t := &Table{node: node, nextKey: first}
	m := map[uint64]*Reg{}
	t.regs.Store(&m)
	return t
}

// Reg is one registration.
type Reg struct {
	t      *Table
	desc   rdma.Descriptor
	mem    []byte
	mu     sync.RWMutex
	closed bool // under mu
}

// Descriptor implements rdma.Registration.
func (r *Reg) Descriptor() rdma.Descriptor { return r.desc }

// Bytes implements rdma.Registration.
func (r *Reg) Bytes() []byte { return r.mem }

// Deregister implements rdma.Registration.
func (r *Reg) Deregister() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return errors.New("rdma: registration already deregistered")
	}
	r.closed = true
	r.mu.Unlock()
	r.t.remove(r.desc.RKey.Key)
	return nil
}

// Register adds mem with rights acc. Keys are never reused, so an operation
// that names a revoked key fails instead of reaching newer memory.
func (t *Table) Register(mem []byte, acc rdma.Access) (*Reg, error) {
	if len(mem) == 0 {
		return nil, errors.New("rdma: register of empty memory")
	}
	if acc&^rdma.AccessAll != 0 {
		return nil, fmt.Errorf("rdma: unknown access bits %#x", uint8(acc))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	key := t.nextKey
	t.nextKey++
	if t.nextKey == 0 {
		t.nextKey = 1 // 0 is no key
	}
	r := &Reg{t: t, mem: mem, desc: rdma.Descriptor{
		Node: t.node, RKey: rdma.RKey{Key: key}, Len: uint64(len(mem)), Access: acc,
	}}
	old := *t.regs.Load()
	m := make(map[uint64]*Reg, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[key] = r
	t.regs.Store(&m)
	return r, nil
}

func (t *Table) remove(key uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.regs.Load()
	m := make(map[uint64]*Reg, len(old))
	for k, v := range old {
		if k != key {
			m[k] = v
		}
	}
	t.regs.Store(&m)
}

// Execute performs op on the registration it names.
func (t *Table) Execute(op *rdma.Op) error {
	r := (*t.regs.Load())[op.RKey.Key]
	if r == nil {
		return fmt.Errorf("%w: %#x", rdma.ErrUnknownKey, op.RKey.Key)
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return fmt.Errorf("%w: %#x", rdma.ErrUnknownKey, op.RKey.Key)
	}
	return rdma.Execute(r.mem, r.desc.Access, op)
}

// ExecuteBatch runs ops in order, stopping at the first failure as a queue
// pair does, and returns that failure.
func (t *Table) ExecuteBatch(ops []rdma.Op) error {
	for i := range ops {
		if err := t.Execute(&ops[i]); err != nil {
			ops[i].Err = err
			rdma.FlushAfter(ops, i)
			return err
		}
		ops[i].Err = nil
	}
	return nil
}
