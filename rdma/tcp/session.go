package tcp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// outSession is the requester's side of its session with one peer node:
// the sequence numbers of its batches and which of them are finished. It
// outlives connections, addresses and RemovePeer, so that a number is
// never reused towards the same node by this incarnation.
type outSession struct {
	mu    sync.Mutex
	next  uint64        // the next sequence number; from 1; under mu
	floor atomic.Uint64 // every number below is finished; written under mu
	// done marks the numbers in [floor, next) finished out of order, one
	// bit per number modulo maxInFlight; under mu.
	done [maxInFlight / 64]uint64
	// freed is closed when the floor moves, for acquirers waiting for room;
	// nil when nobody waits. Under mu.
	freed chan struct{}
}

func newOutSession() *outSession {
	s := &outSession{next: 1}
	s.floor.Store(1)
	return s
}

// acquire hands out the next sequence number, waiting while maxInFlight
// numbers are unfinished.
func (s *outSession) acquire(ctx context.Context) (uint64, error) {
	s.mu.Lock()
	for s.next-s.floor.Load() >= maxInFlight {
		if s.freed == nil {
			s.freed = make(chan struct{})
		}
		ch := s.freed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		s.mu.Lock()
	}
	seq := s.next
	s.next++
	s.mu.Unlock()
	return seq, nil
}

// release finishes seq: it will never be sent again, and once every lower
// number is finished too the responder may forget its outcome.
func (s *outSession) release(seq uint64) {
	s.mu.Lock()
	floor := s.floor.Load()
	if seq != floor {
		s.done[seq%maxInFlight/64] |= 1 << (seq % 64)
		s.mu.Unlock()
		return
	}
	floor++
	for floor < s.next {
		w, bit := &s.done[floor%maxInFlight/64], uint64(1)<<(floor%64)
		if *w&bit == 0 {
			break
		}
		*w &^= bit
		floor++
	}
	s.floor.Store(floor)
	if s.freed != nil {
		close(s.freed)
		s.freed = nil
	}
	s.mu.Unlock()
}

// inSession is the responder's side of one requester incarnation's
// session: the outcomes of its recent batches, so that a batch re-sent
// after a broken connection is answered from here instead of executing
// again.
//
// Every request of the session executes under mu, whichever connection
// carried it: the check for a recorded outcome, the execution and the
// recording are one step. A connection executes only while it is up, and
// a new connection of the session shuts the older ones down before it
// serves, so once a request of the new connection executed, nothing left
// on an older one ever will. A batch of READs only changes nothing and is
// not recorded (a copy re-sent executes again); any other batch that
// executed at least one op is recorded with a copy of its response until
// the requester's floor passes it.
type inSession struct {
	id    uint64 // unique within this incarnation; sent in the hello
	node  ids.NodeID
	nonce uint64 // the requester's incarnation

	// Under the transport's mu.
	evicted   bool      // removed from the transport's table
	conns     int       // serving connections bound to the session
	idleSince time.Time // when conns last dropped to zero
	lastHello time.Time

	mu    sync.Mutex
	dead  bool   // evicted: nothing executes in it any more; under mu
	floor uint64 // requests below were finished by the requester; under mu
	// ring holds recorded responses, the one of sequence number q at
	// q%maxInFlight; allocated on the first record. Under mu.
	ring []record
}

// record is the response of one executed batch. A small response (a
// WRITE's or a few atomics') is kept inline, a larger one in a pooled
// buffer.
type record struct {
	seq   uint64
	n     int     // length of the response; 0: empty
	resp  *buffer // holds the response when n > len(small)
	small [smallRecord]byte
}

// smallRecord fits the response of a batch of up to three atomics.
const smallRecord = hdrLen + 3*resultLen

// bytes returns the recorded response.
func (r *record) bytes() []byte {
	if r.resp != nil {
		return r.resp.b[:r.n]
	}
	return r.small[:r.n]
}

func (r *record) set(seq uint64, b []byte) {
	r.seq, r.n = seq, len(b)
	if len(b) <= len(r.small) {
		copy(r.small[:], b)
		return
	}
	r.resp = getBuf(len(b))
	copy(r.resp.b, b)
}

var errSessionGone = errors.New("tcp: the requester's session was evicted")

// serve answers request id of the session: from the record when the batch
// executed before, by executing it on c otherwise. It returns no buffer
// for a request below the floor, which was finished at the requester and
// must not execute again.
func (s *inSession) serve(c *conn, id, floor uint64, wops []wireOp) (*buffer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return nil, errSessionGone
	}
	if c.isDown() {
		// Superseded by a newer connection of the session (or closing):
		// what is still buffered here must not execute after the requests
		// of the newer one.
		return nil, errConnDown
	}
	if id == 0 || floor > id {
		return nil, fmt.Errorf("%w: request %d with floor %d", ErrProtocol, id, floor)
	}
	s.advance(floor)
	if id < s.floor {
		return nil, nil
	}
	if id-s.floor >= maxInFlight {
		return nil, fmt.Errorf("%w: request %d beyond the window of floor %d", ErrProtocol, id, s.floor)
	}
	if s.ring != nil {
		if r := &s.ring[id%maxInFlight]; r.n > 0 && r.seq == id {
			b := r.bytes()
			fb := getBuf(len(b))
			copy(fb.b, b)
			return fb, nil
		}
	}
	fb, effects := c.execute(id, wops)
	if effects {
		if s.ring == nil {
			s.ring = make([]record, maxInFlight)
		}
		r := &s.ring[id%maxInFlight]
		s.drop(r)
		r.set(id, fb.b)
	}
	return fb, nil
}

// advance moves the floor up to floor, dropping the records below it.
func (s *inSession) advance(floor uint64) {
	if floor <= s.floor {
		return
	}
	if s.ring != nil {
		if floor-s.floor >= maxInFlight {
			for i := range s.ring {
				s.drop(&s.ring[i])
			}
		} else {
			for q := s.floor; q < floor; q++ {
				if r := &s.ring[q%maxInFlight]; r.n > 0 && r.seq == q {
					s.drop(r)
				}
			}
		}
	}
	s.floor = floor
}

func (s *inSession) drop(r *record) {
	if r.resp != nil {
		putBuf(r.resp)
		r.resp = nil
	}
	r.seq, r.n = 0, 0
}

// kill ends the session: its records are dropped and nothing executes in
// it any more. A requester that reconnects gets a new session id and
// learns from it that the outcomes of its unfinished batches are lost.
func (s *inSession) kill() {
	s.mu.Lock()
	s.dead = true
	for i := range s.ring {
		s.drop(&s.ring[i])
	}
	s.ring = nil
	s.mu.Unlock()
}

// Bounds of the responder's session tables.
const (
	// sessionsPerNode is how many incarnations of one node keep a table:
	// the current one and the one before (which may still be finishing
	// what it had in flight when it was replaced).
	sessionsPerNode = 2
	// maxSessions bounds the tables of all nodes together.
	maxSessions = 1024
)

// openSession returns the session of requester incarnation nonce of node
// for a connection completing its handshake, making it when there is none,
// and the connections of the sessions it evicted to make room, which the
// caller shuts down once it released t.mu. The connection binds to the
// session with bindSession. Called with t.mu held.
func (t *Transport) openSession(node ids.NodeID, nonce uint64) (*inSession, []*conn) {
	now := time.Now()
	key := sessionKey{node, nonce}
	if s := t.sessions[key]; s != nil {
		s.lastHello = now
		return s, nil
	}
	// Sweep: tables that nobody connected to for SessionLinger, then the
	// oldest incarnations of the node beyond sessionsPerNode, then the
	// least recently greeted beyond maxSessions.
	var evict []*inSession
	same := 0
	var oldestSame, oldest *inSession
	for _, s := range t.sessions {
		if s.conns == 0 && now.Sub(s.idleSince) > t.cfg.SessionLinger {
			evict = append(evict, s)
			continue
		}
		if s.node == node {
			same++
			if oldestSame == nil || s.lastHello.Before(oldestSame.lastHello) {
				oldestSame = s
			}
		}
		if oldest == nil || s.lastHello.Before(oldest.lastHello) {
			oldest = s
		}
	}
	if same >= sessionsPerNode {
		evict = append(evict, oldestSame)
		if oldest == oldestSame {
			oldest = nil
		}
	}
	if len(t.sessions)-len(evict) >= maxSessions && oldest != nil {
		evict = append(evict, oldest)
	}
	var down []*conn
	for _, s := range evict {
		down = append(down, t.evictSession(s)...)
	}
	t.lastSession++
	s := &inSession{id: t.lastSession, node: node, nonce: nonce, lastHello: now, idleSince: now}
	t.sessions[key] = s
	return s, down
}

type sessionKey struct {
	node  ids.NodeID
	nonce uint64
}

// evictSession removes s, after which nothing executes in it, and returns
// its connections for the caller to shut down. Called with t.mu held.
func (t *Transport) evictSession(s *inSession) []*conn {
	k := sessionKey{s.node, s.nonce}
	if t.sessions[k] == s {
		delete(t.sessions, k)
	}
	s.evicted = true
	s.kill()
	var down []*conn
	for _, c := range t.inbound {
		if c != nil && c.sess == s {
			down = append(down, c)
		}
	}
	return down
}

// bindSession attaches the new serving connection c to its session and
// returns the session's older connections for the caller to shut down:
// the requester keeps one connection to a node, so an older one is dead
// on its side. Called with t.mu held.
func (t *Transport) bindSession(c *conn) []*conn {
	var old []*conn
	for _, o := range t.inbound {
		if o != nil && o != c && o.sess == c.sess {
			old = append(old, o)
		}
	}
	c.sess.conns++
	return old
}

// unbindSession detaches a serving connection that is down. Called with
// t.mu held.
func (t *Transport) unbindSession(c *conn) {
	if s := c.sess; s != nil {
		s.conns--
		if s.conns == 0 {
			s.idleSince = time.Now()
		}
	}
}

// The outcome of a batch whose request may have reached the peer and
// whose response did not come back.
func outcomeUnknown(peer ids.NodeID, cause error) error {
	if errors.Is(cause, rdma.ErrClosed) {
		return fmt.Errorf("%w: %w", rdma.ErrClosed, rdma.ErrOutcomeUnknown)
	}
	var pe *rdma.PeerError
	if errors.As(cause, &pe) && pe.Peer == peer {
		cause = pe.Err
	}
	if !errors.Is(cause, rdma.ErrPeerUnreachable) {
		cause = fmt.Errorf("%w: %w", rdma.ErrPeerUnreachable, cause)
	}
	return &rdma.PeerError{Peer: peer, Err: fmt.Errorf("%w: %w", rdma.ErrOutcomeUnknown, cause)}
}
