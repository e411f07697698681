package directory

import (
	"time"

	"github.com/dsmkit/dsm/internal/ids"
)

// Reconnecting after a partition. memberlist declares a member dead when
// it stops answering probes, and from then on it neither probes it nor
// exchanges state with it (it gossips to the dead only while it has news,
// for a few rounds). Both sides of a partition declare the other dead, so
// when the network heals nothing brings them together again: each side
// goes on as a cluster of its own, and the Raft voters on the other side
// stay unreachable. reconnectLoop does what Serf's reconnect does: it
// joins the last gossip address of every member gossip holds dead, which
// is a push-pull exchange of state; the member then learns it was declared
// dead, refutes it with a higher memberlist incarnation, and is alive
// again everywhere. Every replica runs it, so the side that holds the
// leader and the side cut away both try.

const (
	// reconnectFast is how long a dead member is tried every
	// Timing.GossipReconnect; after that, every reconnectSlow (a machine
	// that is gone for good costs one dial now and then until an operator
	// removes it).
	reconnectFast = 5 * time.Minute
	reconnectSlow = 30 * time.Second
)

// reconnectLoop runs until the directory closes.
func (d *Directory) reconnectLoop() {
	defer d.wg.Done()
	tick := time.NewTicker(d.cfg.Timing.GossipReconnect)
	defer tick.Stop()
	deadSince := map[ids.NodeID]time.Time{}
	tried := map[ids.NodeID]time.Time{}
	for {
		select {
		case <-d.closeCh:
			return
		case <-tick.C:
		}
		now := time.Now()
		addrs := d.reconnectTargets(now, deadSince, tried)
		if len(addrs) == 0 {
			continue
		}
		// Join dials each address in turn (up to TCPTimeout each) and
		// merges the state of those that answer.
		if n, err := d.ml.Join(addrs); n > 0 {
			d.log.Info("directory: reached members gossip held dead", "addrs", addrs, "reached", n)
			select {
			case d.gossip.signal <- struct{}{}:
			default:
			}
		} else {
			d.log.Debug("directory: members gossip holds dead still unreachable", "addrs", addrs, "err", err)
		}
	}
}

// reconnectTargets returns the gossip addresses to try now: members that
// gossip holds dead (not left), whose incarnation is still the one the
// member table knows of (a node restarted since has joined by itself),
// due by their schedule. It updates deadSince and tried.
func (d *Directory) reconnectTargets(now time.Time, deadSince, tried map[ids.NodeID]time.Time) []string {
	d.gossip.drain()
	view := d.View()
	gs := d.gossip.snapshot()
	var addrs []string
	for _, id := range sortedKeys(gs) {
		e := gs[id]
		if id == d.cfg.NodeID || e.state != gossipDead || e.addr == "" {
			delete(deadSince, id)
			delete(tried, id)
			continue
		}
		if m, ok := view.Member(id); ok && m.Nonce != 0 && m.Nonce != e.meta.Nonce {
			continue // a later incarnation holds the id
		}
		since, ok := deadSince[id]
		if !ok {
			since = now
			deadSince[id] = now
		}
		every := d.cfg.Timing.GossipReconnect
		if now.Sub(since) > reconnectFast {
			every = reconnectSlow
		}
		if t, ok := tried[id]; ok && now.Sub(t) < every {
			continue
		}
		tried[id] = now
		addrs = append(addrs, e.addr)
	}
	return addrs
}
