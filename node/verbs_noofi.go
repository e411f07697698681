//go:build !ofi || !cgo

package node

import (
	"log/slog"

	"github.com/dsmkit/dsm/internal/ids"
)

// ofiCompiled: this dsmd can run --transport ofi.
const ofiCompiled = false

func listenOFI(ids.NodeID, string, string, *slog.Logger) (verbsEndpoint, error) {
	return nil, errNoOFI
}
