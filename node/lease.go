package node

import (
	"context"
	"time"

	"github.com/dsmkit/dsm/directory"
)

// guardLease keeps local access to pages within this node's lease
// (docs/failover.md §9): the page cache serves faults only while a
// majority of the Raft voters grants the node a lease. When the lease
// ends, the cache is suspended: every page held is punched out of every
// mapping and the Modified ones are set aside, within the lease's
// revocation budget, before the majority may commit this incarnation's
// departure and move its homes and tenures. When a majority grants again
// the cache resumes, and the pages set aside come back Modified without a
// round trip. The node starts suspended: nothing is served before the
// first lease. When the directory says this incarnation departed (declared
// failed, or removed), the lease never comes back and Run ends it.
func (n *Node) guardLease(ctx context.Context) {
	suspended := false
	for {
		l := n.dir.Lease()
		if l.Departed != nil {
			n.departed(l.Departed)
		}
		if now := directory.LeaseClock(); now < l.Until {
			// The lease page first: a Resume below shows its deadline.
			n.cache.SetLease(n.dir.Nonce(), l.Until-watchdogMargin(n.dir.LeaseRevoke()), uint64(n.dir.Epoch()))
			if suspended {
				if n.eng != nil {
					n.eng.suspend(false)
				}
				n.cache.Resume()
				suspended = false
				n.stats.leaseResumes.Add(1)
				n.log.Info("lease granted: local access to pages resumed", "holds_for", (l.Until - now).Round(time.Millisecond).String())
			}
			t := time.NewTimer(l.Until - now)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-l.Changed:
				t.Stop()
				continue
			case <-t.C:
			}
			if directory.LeaseClock() < n.dir.Lease().Until {
				continue // extended just now
			}
		}
		if !suspended {
			suspended = true
			n.suspendForLease(ctx, l.Until != 0)
		}
		select {
		case <-ctx.Done():
			return
		case <-l.Changed:
		}
	}
}

// watchdogMargin is how much earlier than the lease's Until the deadline
// on the lease page falls (docs/failover.md §9, "The library's watchdog"):
// a third of the revocation budget R (100 ms with the default timings).
//
// dsmd starts to suspend at Until and must be done by Until + R, when a
// majority may fence this incarnation and move its pages. A client's
// watchdog, woken by its timer at the page's deadline, still has to be
// scheduled and make its mapping PROT_NONE (a TLB flush on every CPU
// that runs one of its threads), and on a loaded machine that takes
// milliseconds to tens of them. With the deadline at Until - R/3, a
// watchdog that needs up to R/3 has cut its process off no later than dsmd
// itself would have started to suspend, and one that needs up to 4R/3 is
// still done before the lease is over. It costs the clients of a healthy
// dsmd nothing: a grant moves Until every LeasePeriod, far ahead of the
// deadline.
func watchdogMargin(revoke time.Duration) time.Duration { return revoke / 3 }

// suspendForLease suspends the page cache within the revocation budget.
func (n *Node) suspendForLease(ctx context.Context, held bool) {
	budget := n.dir.LeaseRevoke()
	if held && n.eng != nil {
		// The engines first: from now on no verb of this incarnation
		// is posted, so none can land after a majority moved what it
		// held (both transports' fences refuse them at the target
		// too, on ofi where the provider checks keys there). The
		// cache's suspension then cancels the
		// calls that wait on them.
		n.eng.suspend(true)
	}
	sctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	st, err := n.cache.Suspend(sctx)
	if !held {
		n.log.Info("no lease yet: faults wait until a majority of the voters grants one")
		return
	}
	n.stats.leaseSuspends.Add(1)
	if err != nil {
		n.log.Error("lease over: local access not revoked within the budget", "budget", budget, "took", st.Duration,
			"punched", st.Punched, "aside", st.Aside, "err", err)
		// Keep going: the cache stays suspended and a second pass
		// finishes what the first could not.
		if _, err := n.cache.Suspend(ctx); err != nil && ctx.Err() == nil {
			n.log.Error("lease over: suspend", "err", err)
		}
		return
	}
	n.log.Warn("lease over: no majority of the voters granted one in time; local access to pages suspended until one does",
		"took", st.Duration, "punched", st.Punched, "aside", st.Aside, "budget", budget)
}
