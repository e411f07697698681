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
