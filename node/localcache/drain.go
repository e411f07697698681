package localcache

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/localsock"
	"github.com/dsmkit/dsm/internal/mapproto"
)

// Drain ends every client session, telling each why (an Error of
// mapproto.CodeUnavailable carrying reason: the library then makes the
// mapping inaccessible, so no store lands after this call), and refuses
// new sessions from then on. The cache goes on serving dsmd's own calls
// (Access, Flush), so that what the clients wrote can be written back:
// dsmd drains before it leaves the cluster.
func (c *Cache) Drain(reason string) {
	if reason == "" {
		reason = "dsmd is leaving the cluster"
	}
	c.mu.Lock()
	if c.closed || c.draining != "" {
		c.mu.Unlock()
		return
	}
	c.draining = reason
	cls := make([]*client, 0, len(c.clients))
	for cl := range c.clients {
		cls = append(cls, cl)
	}
	c.mu.Unlock()
	c.publishLease()
	c.endSessions(cls, mapproto.CodeUnavailable, reason)
}

// End ends everything that is tied to this Cache's dsmd incarnation, at
// once, as dsmd does when the cluster declared that incarnation failed (its
// pages moved on; a new incarnation starts in the same process with a new
// Cache): every client session is told reason and ended (an Error of
// mapproto.CodeUnavailable: the library makes the mapping inaccessible and
// every call on it fails with the reason), new sessions are refused with
// it, and dsmd's own calls (Access, Flush), those waiting and those to
// come, fail with ErrEnded and reason instead of waiting for a lease that
// this incarnation will never get again: the Coherence calls in flight are
// cancelled. Without End they waited until Close, which dsmd reaches only
// after it has stopped its RPC server (up to five seconds more).
//
// Invalidate and Downgrade go on working until Close (the engines may
// still give pages up); End is harmless after Drain, and a second End
// does nothing.
func (c *Cache) End(reason string) {
	if reason == "" {
		reason = "this dsmd incarnation was declared failed"
	}
	c.mu.Lock()
	if c.closed || c.endReason != "" {
		c.mu.Unlock()
		return
	}
	c.endReason = reason
	if c.draining == "" {
		c.draining = reason
	}
	cls := make([]*client, 0, len(c.clients))
	for cl := range c.clients {
		cls = append(cls, cl)
	}
	c.mu.Unlock()
	c.publishLease()
	// The sessions first: their faults then end quietly (their clients
	// are gone) rather than fail below.
	c.endSessions(cls, mapproto.CodeUnavailable, reason)
	c.gateMu.Lock()
	close(c.ended)
	c.flightEnd() // cancels the Coherence calls in flight; later ones start cancelled
	c.gateMu.Unlock()
	c.log.Info("ended: sessions closed and calls failed", "sessions", len(cls), "reason", reason)
}

// endErr is the error of a call made after End, or nil before.
func (c *Cache) endErr() error {
	select {
	case <-c.ended:
	default:
		return nil
	}
	c.mu.Lock()
	reason := c.endReason
	c.mu.Unlock()
	return fmt.Errorf("%w: %s", ErrEnded, reason)
}

// endSessions tells each client why its session ends (an Error of code
// with reason, written with a one-second deadline), closes its socket and
// stops serving it.
func (c *Cache) endSessions(cls []*client, code mapproto.Code, reason string) {
	msg, err := mapproto.Encode(mapproto.Msg{Type: mapproto.TypeError, Code: code, Text: reason})
	for _, cl := range cls {
		if cl.conn != nil {
			if err == nil {
				cl.conn.SetWriteDeadline(time.Now().Add(time.Second))
				cl.conn.Write(msg)
			}
			cl.conn.Close()
		}
		c.detach(cl)
	}
}

// Revoke ends the mappings of region rid whose process allowed no longer
// lets in (a region's access list changed): each is told why
// (Error{CodePermissionDenied}) and detached. Mappings made without
// Config.Admit are kept. It returns how many it ended.
func (c *Cache) Revoke(rid ids.RegionID, allowed func(localsock.Identity) bool, reason string) int {
	c.mu.Lock()
	r := c.regions[rid]
	c.mu.Unlock()
	if r == nil {
		return 0
	}
	var cls []*client
	r.mu.Lock()
	for cl := range r.clients {
		if cl.peer != nil && !allowed(cl.peer.Identity) {
			cls = append(cls, cl)
		}
	}
	r.mu.Unlock()
	if len(cls) > 0 {
		c.log.Info("mappings revoked", "region", r.name, "mappings", len(cls), "reason", reason)
	}
	c.endSessions(cls, mapproto.CodePermissionDenied, reason)
	return len(cls)
}

// FlushAll writes back every page held Modified, in every region (Flush of
// each), and returns how many it wrote back. It goes on past a region that
// fails and returns every error.
func (c *Cache) FlushAll(ctx context.Context) (int, error) {
	c.mu.Lock()
	rids := make([]ids.RegionID, 0, len(c.regions))
	for id := range c.regions {
		rids = append(rids, id)
	}
	c.mu.Unlock()
	slices.Sort(rids)
	total := 0
	var errs []error
	for _, id := range rids {
		n, err := c.Flush(ctx, id, 0, 0)
		total += n
		if err != nil && !errors.Is(err, ErrUnknownRegion) {
			errs = append(errs, fmt.Errorf("%s: %w", id, err))
		}
	}
	return total, errors.Join(errs...)
}
