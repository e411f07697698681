package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
)

// Operation kinds, as recorded.
const (
	opLoad      = "load"       // register: atomic load through Bytes()
	opStore     = "store"      // register: atomic store through Bytes()
	opCAS       = "cas"        // register: atomic compare-and-swap through Bytes()
	opPageWrite = "page-write" // WriteAt of a whole checksummed page
	opPageRead  = "page-read"  // ReadAt of a whole checksummed page
	opAdd       = "add"        // AddUint64(counter, 1)
	opCount     = "count"      // LoadUint64 of a counter (final reads)
	opRMW       = "rmw"        // Lock, read-modify-write of the pair, Unlock
	opPair      = "pair"       // LoadUint64 of both words of the pair (final reads)
	opLockWords = "lock-words" // LoadUint64 of the Mutex's ticket and now-serving words (final reads)
	opSync      = "sync"       // Region.Sync
	opMap       = "map"        // Dial and Map after the mapping died
)

// record is one line of a client's history file: the call of an operation
// (K "call", with what it does) or its return (K "ret", with its result).
// A client writes the call before it starts the operation and the return
// after, each with one write(2), so an operation that never returns (its
// thread blocked in a fault, its process killed) leaves its call behind.
type record struct {
	K string `json:"k"`
	// ID numbers the operations of one client process.
	ID uint64 `json:"id"`
	T  int64  `json:"t"` // time.Now().UnixNano(): every process shares the host's clock
	// The call.
	Op     string `json:"op,omitempty"`
	Worker int    `json:"w,omitempty"`
	Addr   int64  `json:"a,omitempty"`
	Arg    uint64 `json:"arg,omitempty"` // value stored, new value of a cas, seq written
	Old    uint64 `json:"old,omitempty"` // the value a cas compares with
	// The return.
	OK      bool   `json:"ok,omitempty"`
	Err     string `json:"err,omitempty"`
	Out     uint64 `json:"out,omitempty"`  // value loaded, new counter value, seq read, a of the pair
	Out2    uint64 `json:"out2,omitempty"` // b of the pair
	Swapped bool   `json:"sw,omitempty"`
	Status  string `json:"st,omitempty"` // of a page read: ok, zero, torn, wrong
	// Raw is the page a torn or wrong read returned (hex), for the
	// checker's account of the tear.
	Raw string `json:"raw,omitempty"`
}

// recorder appends records to a client's history file.
type recorder struct {
	mu   sync.Mutex
	f    *os.File
	next uint64
	now  func() int64
}

// call records the call of an operation and returns its id.
func (r *recorder) call(rec record) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	rec.K, rec.ID, rec.T = "call", r.next, r.now()
	r.write(rec)
	return rec.ID
}

// ret records the return of operation id; err is its error, or nil.
func (r *recorder) ret(id uint64, rec record, err error) {
	t := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	rec.K, rec.ID, rec.T = "ret", id, t
	rec.OK = err == nil
	if err != nil {
		rec.Err = strings.ReplaceAll(err.Error(), "\n", " ")
	}
	r.write(rec)
}

func (r *recorder) write(rec record) {
	b, _ := json.Marshal(rec)
	_, _ = r.f.Write(append(b, '\n'))
}

// Op is one operation of the merged history: a call and, unless it never
// returned, its return.
type Op struct {
	Proc   string `json:"proc"` // the client process: n2g1 is node 2's client, its first life
	Node   int    `json:"node"`
	Worker int    `json:"worker"`
	Final  bool   `json:"final,omitempty"` // a read of the final check, after the workload
	Kind   string `json:"op"`
	Addr   int64  `json:"addr"`
	Arg    uint64 `json:"arg,omitempty"`
	Old    uint64 `json:"old,omitempty"`
	Call   int64  `json:"call"`
	// Return is 0 for an operation that never returned.
	Return  int64  `json:"return,omitempty"`
	OK      bool   `json:"ok"`
	Err     string `json:"err,omitempty"`
	Out     uint64 `json:"out,omitempty"`
	Out2    uint64 `json:"out2,omitempty"`
	Swapped bool   `json:"swapped,omitempty"`
	Status  string `json:"status,omitempty"`
	Raw     string `json:"raw,omitempty"`
	// Killed is set on an operation that never returned because the nemesis
	// killed its client process (client-kill): not a hang.
	Killed bool `json:"killed,omitempty"`
	// Unacked is set by the checkers on an operation of a node whose dsmd
	// died without writing back, between that death and the moment the
	// client noticed it: it may have completed against the dead node's
	// cache (the dsm package documents that such accesses still see the
	// pages the machine held), so its success promises nothing.
	Unacked bool `json:"-"`
}

// acked says whether the operation returned success that counts.
func (o *Op) acked() bool { return o.OK && !o.Unacked }

// Pending says whether the operation never returned.
func (o *Op) Pending() bool { return o.Return == 0 }

// Failed says whether the operation returned an error.
func (o *Op) Failed() bool { return o.Return != 0 && !o.OK }

// readHistory reads one client's history file.
func readHistory(path, proc string, node int, final bool) ([]*Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		lines = append(lines, append([]byte(nil), sc.Bytes()...))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	byID := map[uint64]*Op{}
	var ops []*Op
	for i, l := range lines {
		var r record
		if err := json.Unmarshal(l, &r); err != nil {
			// A process killed in the middle of a write leaves a partial
			// last line; anything else is a bug.
			if i == len(lines)-1 {
				break
			}
			return nil, fmt.Errorf("%s:%d: %v", path, i+1, err)
		}
		switch r.K {
		case "call":
			o := &Op{Proc: proc, Node: node, Worker: r.Worker, Final: final, Kind: r.Op, Addr: r.Addr,
				Arg: r.Arg, Old: r.Old, Call: r.T}
			byID[r.ID] = o
			ops = append(ops, o)
		case "ret":
			o := byID[r.ID]
			if o == nil {
				return nil, fmt.Errorf("%s:%d: return of unknown operation %d", path, i+1, r.ID)
			}
			o.Return, o.OK, o.Err, o.Out, o.Out2, o.Swapped, o.Status = r.T, r.OK, r.Err, r.Out, r.Out2, r.Swapped, r.Status
			o.Raw = r.Raw
			if o.Return < o.Call {
				o.Return = o.Call
			}
		}
	}
	return ops, nil
}

// sortOps orders ops by call time.
func sortOps(ops []*Op) {
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
}

// writeHistory writes the merged history, one JSON object a line.
func writeHistory(path string, ops []*Op) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, o := range ops {
		if err := enc.Encode(o); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
