package node

import (
	"fmt"
	"os"
	"strings"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/tlsconf"
	"github.com/dsmkit/dsm/rdma"
	"github.com/dsmkit/dsm/rdma/tcp"
)

// Transports dsmd runs over (--transport).
const (
	TransportTCP = "tcp"
	TransportOFI = "ofi"
)

// verbsEndpoint is what a node needs of its verbs endpoint: an
// rdma.Transport (one-sided operations, messages to the engines' handler)
// with incarnation fencing. Nonce is the incarnation the node publishes in
// the directory; ExpectNonce names the incarnation of a peer that may be
// reached, so that a restarted peer's new process is reached only once the
// directory names it (with its new descriptors). Both backends implement
// it: rdma/tcp always, rdma/ofi when dsmd is built with the ofi tag.
type verbsEndpoint interface {
	rdma.Transport
	Nonce() uint64
	ExpectNonce(id ids.NodeID, nonce uint64)
}

var _ verbsEndpoint = (*tcp.Transport)(nil)

// errNoOFI is the error of --transport ofi in a dsmd built without the
// libfabric backend.
var errNoOFI = fmt.Errorf("this dsmd was built without libfabric support (build tag ofi): build it with `go build -tags ofi ./cmd/dsmd` (cgo and libfabric 1.17 or later), or run --transport %s", TransportTCP)

// ofiProvider is the libfabric provider dsmd asks for: --ofi-provider, or
// else $FI_PROVIDER when it names one provider (libfabric itself applies
// a list or an exclusion in it), or else none: libfabric chooses.
func (c Config) ofiProvider() string {
	if c.OFIProvider != "" {
		return c.OFIProvider
	}
	if p := strings.TrimSpace(os.Getenv("FI_PROVIDER")); p != "" && !strings.ContainsAny(p, ",^") {
		return p
	}
	return ""
}

// listenVerbs opens the node's verbs endpoint on the configured transport.
func (n *Node) listenVerbs(id ids.NodeID) (verbsEndpoint, error) {
	log := n.log.With("part", "verbs")
	switch n.cfg.transport() {
	case TransportOFI:
		return listenOFI(id, n.addrs.Verbs, n.cfg.ofiProvider(), log)
	case TransportTCP:
	default:
		return nil, fmt.Errorf("unknown transport %q", n.cfg.Transport)
	}
	vcfg := tcp.Config{Logger: log}
	if n.tls != nil {
		vcfg.TLS = &tcp.TLS{
			Server:    n.tls.ServerConfig(tlsconf.AnyNode),
			Client:    n.tls.ClientConfig(tlsconf.AnyNode),
			PeerNode:  tlsconf.PeerNode,
			Plaintext: n.cfg.VerbsPlaintext,
		}
	}
	return tcp.Listen(id, n.addrs.Verbs, vcfg)
}

// transport is the configured transport ("" is tcp).
func (c Config) transport() string {
	if c.Transport == "" {
		return TransportTCP
	}
	return c.Transport
}

// verbsKind names the transport behind a published verbs address: "tcp"
// for host:port, "ofi PROVIDER" for an ofi address ("ofi:PROVIDER:NAME").
// A cluster runs on one kind: an endpoint cannot reach another kind's.
func verbsKind(addr string) string {
	rest, ok := strings.CutPrefix(addr, "ofi:")
	if !ok {
		return TransportTCP
	}
	if i := strings.LastIndexByte(rest, ':'); i > 0 {
		return TransportOFI + " " + rest[:i]
	}
	return TransportOFI
}
