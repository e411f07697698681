//go:build linux

package localcache

import "sync/atomic"

// Stats is a snapshot of the Cache's counters, for metrics and tests.
// Counters only grow; ResidentPages, DirtyPages, Clients and FaultsInFlight
// are current values.
type Stats struct {
	// Fault messages read from clients' userfaultfds, by kind, re-deliveries
	// included.
	FaultsMissing, FaultsMinor, FaultsWP uint64
	// FaultsWrite counts the fault messages that were writes.
	FaultsWrite uint64
	// ReadMisses, WriteMisses: calls of Coherence.ReadMiss and WriteMiss;
	// Upgrades: the WriteMisses on a page held Shared (no data wanted).
	ReadMisses, WriteMisses, Upgrades uint64
	// MissErrors: Coherence misses that failed (the fault is retried).
	MissErrors uint64
	// LocalResolves: resolutions that needed no Coherence call (the page was
	// held well enough already: another client's fault, or a re-delivery).
	LocalResolves uint64
	// Installs: pages that went from Invalid to Shared or Modified.
	Installs uint64
	// Invalidations and Downgrades that changed a page (from the engine).
	Invalidations, Downgrades uint64
	// Evictions to make room; Writebacks, the evicted pages that were
	// Modified; EvictErrors, evictions the engine refused.
	Evictions, Writebacks, EvictErrors uint64
	// ResidentPages held Shared or Modified; DirtyPages held Modified.
	// Pages of every region count one each, whatever their size.
	ResidentPages, DirtyPages int64
	// ResidentBytes and DirtyBytes are the same pages in bytes (each
	// counts its region's page size).
	ResidentBytes, DirtyBytes int64
	// Clients attached (mappings served); FaultsInFlight, pages being
	// resolved for some client.
	Clients, FaultsInFlight int64
	// SessionErrors: sessions refused or ended by a protocol error.
	SessionErrors uint64
	// Poisoned: faults given up on after the client's FaultTimeout (the
	// page was unavailable) and resolved with UFFDIO_POISON; Unpoisoned:
	// those pages served again later (the client was told).
	Poisoned, Unpoisoned uint64
	// Suspended: the Cache is suspended now (Suspend); Suspends counts the
	// suspensions begun. AsidePages: Modified pages set aside by Suspend
	// and not restored or given up yet (they count in ResidentPages and
	// DirtyPages). Restores: pages put back from their aside copy, with no
	// Coherence call. LostPages: Modified pages dropped by
	// DiscardSuspended.
	Suspended          bool
	Suspends, Restores uint64
	AsidePages         int64
	LostPages          uint64
}

// Faults is the number of fault messages read, all kinds.
func (s Stats) Faults() uint64 { return s.FaultsMissing + s.FaultsMinor + s.FaultsWP }

type counters struct {
	missing, minor, wp, writes               atomic.Uint64
	readMisses, writeMisses, upgrades        atomic.Uint64
	missErrors, localResolves, installs      atomic.Uint64
	invalidations, downgrades                atomic.Uint64
	evictions, writebacks, evictErrors       atomic.Uint64
	sessionErrors, poisoned, unpoisoned      atomic.Uint64
	resident, dirty, clients, faultsInFlight atomic.Int64
	residentBytes, dirtyBytes                atomic.Int64
	suspends, restores, lost                 atomic.Uint64
	aside                                    atomic.Int64
}

// Stats returns a snapshot of the counters.
func (c *Cache) Stats() Stats {
	s := &c.st
	return Stats{
		FaultsMissing: s.missing.Load(), FaultsMinor: s.minor.Load(), FaultsWP: s.wp.Load(),
		FaultsWrite: s.writes.Load(),
		ReadMisses:  s.readMisses.Load(), WriteMisses: s.writeMisses.Load(), Upgrades: s.upgrades.Load(),
		MissErrors: s.missErrors.Load(), LocalResolves: s.localResolves.Load(), Installs: s.installs.Load(),
		Invalidations: s.invalidations.Load(), Downgrades: s.downgrades.Load(),
		Evictions: s.evictions.Load(), Writebacks: s.writebacks.Load(), EvictErrors: s.evictErrors.Load(),
		ResidentPages: s.resident.Load(), DirtyPages: s.dirty.Load(),
		ResidentBytes: s.residentBytes.Load(), DirtyBytes: s.dirtyBytes.Load(),
		Clients: s.clients.Load(), FaultsInFlight: s.faultsInFlight.Load(),
		SessionErrors: s.sessionErrors.Load(),
		Poisoned:      s.poisoned.Load(), Unpoisoned: s.unpoisoned.Load(),
		Suspended: c.suspended.Load(), Suspends: s.suspends.Load(), Restores: s.restores.Load(),
		AsidePages: s.aside.Load(), LostPages: s.lost.Load(),
	}
}
