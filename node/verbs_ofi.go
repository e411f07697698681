//go:build ofi && cgo

package node

import (
	"log/slog"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma/ofi"
)

// ofiCompiled: this dsmd can run --transport ofi.
const ofiCompiled = true

var _ verbsEndpoint = (*ofi.Transport)(nil)

// listenOFI opens a libfabric endpoint of provider (empty: libfabric
// chooses) on addr (host:port for the socket and verbs providers; shm
// ignores it).
func listenOFI(id ids.NodeID, addr, provider string, log *slog.Logger) (verbsEndpoint, error) {
	t, err := ofi.Listen(id, addr, ofi.Config{Provider: provider, Logger: log})
	if err != nil {
		return nil, err
	}
	log.Info("verbs: libfabric endpoint", "provider", t.Provider(), "addr", t.Addr())
	switch {
	case t.Provider() == "shm":
		log.Warn("verbs: shm checks no key at the target for READs and cross-memory-attach WRITEs, so a departed incarnation's verbs are stopped only by its own lease: a dsmd paused between its lease check and a post can land it after its departure (docs/operations.md, ofi)")
	case !ofiFenceTested(t.Provider()):
		log.Warn("verbs: this provider's refusal of a departed incarnation's keys at the target was not tested (tested: sockets, tcp;ofi_rxm); the fence rests on the provider invalidating a closed memory region's key (docs/operations.md, ofi)", "provider", t.Provider())
	}
	return t, nil
}

// ofiFenceTested reports whether the target-side fence (ofi.Transport.Fence:
// closed per-incarnation keys) was tested on provider.
func ofiFenceTested(provider string) bool {
	return provider == "sockets" || provider == "tcp;ofi_rxm"
}
