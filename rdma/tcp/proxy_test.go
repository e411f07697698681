package tcp_test

import (
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// cutProxy is a TCP proxy between a requester and a responder that cuts
// the connections it carries when told to: right after the responder
// answered (the answer is dropped, so the batch executed and its response
// is lost), or at random points in either direction.
type cutProxy struct {
	ln     net.Listener
	target atomic.Pointer[string]

	mu     sync.Mutex
	pairs  map[*proxyPair]struct{}
	closed bool
	armed  int     // cut at the next bytes from the responder; under mu
	onCut  func()  // runs when an armed cut fires, before the pair closes; under mu
	prob   float64 // chance of a cut per chunk forwarded; under mu
	rng    *rand.Rand

	cuts atomic.Int64 // cuts made
	wg   sync.WaitGroup
}

type proxyPair struct{ client, server net.Conn }

func newCutProxy(t testing.TB, target string, seed uint64) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, pairs: map[*proxyPair]struct{}{}, rng: rand.New(rand.NewPCG(seed, seed))}
	p.setTarget(target)
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.close)
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

// setTarget makes new connections go to addr.
func (p *cutProxy) setTarget(addr string) { p.target.Store(&addr) }

// arm makes the proxy cut the connection that next carries bytes from the
// responder, dropping them; onCut (may be nil) runs first.
func (p *cutProxy) arm(onCut func()) {
	p.mu.Lock()
	p.armed++
	p.onCut = onCut
	p.mu.Unlock()
}

// setProb makes the proxy cut at random: each chunk forwarded in either
// direction is dropped, with both connections, with probability prob.
func (p *cutProxy) setProb(prob float64) {
	p.mu.Lock()
	p.prob = prob
	p.mu.Unlock()
}

func (p *cutProxy) acceptLoop() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", *p.target.Load())
		if err != nil {
			client.Close()
			continue
		}
		pr := &proxyPair{client: client, server: server}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			client.Close()
			server.Close()
			return
		}
		p.pairs[pr] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.forward(pr, client, server, false)
		go p.forward(pr, server, client, true)
	}
}

// forward copies from src to dst chunk by chunk, cutting when told to.
func (p *cutProxy) forward(pr *proxyPair, src, dst net.Conn, fromServer bool) {
	defer p.wg.Done()
	defer p.drop(pr)
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			cut := p.prob > 0 && p.rng.Float64() < p.prob
			var onCut func()
			if fromServer && p.armed > 0 {
				p.armed--
				cut, onCut = true, p.onCut
			}
			p.mu.Unlock()
			if cut {
				if onCut != nil {
					onCut()
				}
				p.cuts.Add(1)
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// drop closes both connections of a pair.
func (p *cutProxy) drop(pr *proxyPair) {
	pr.client.Close()
	pr.server.Close()
	p.mu.Lock()
	delete(p.pairs, pr)
	p.mu.Unlock()
}

func (p *cutProxy) close() {
	p.mu.Lock()
	p.closed = true
	pairs := p.pairs
	p.pairs = map[*proxyPair]struct{}{}
	p.mu.Unlock()
	p.ln.Close()
	for pr := range pairs {
		pr.client.Close()
		pr.server.Close()
	}
	p.wg.Wait()
}
