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
	log.Warn("verbs: on ofi no target refuses the verbs of a departed incarnation: a node cut off by a partition can land queued writes when it heals, and writes have been lost so (docs/operations.md, ofi); use the tcp transport where the network can partition")
	return t, nil
}
