// Package dsmpb is the gRPC API of dsmd, generated from the protobuf
// definitions beside it (package dsm.v1):
//
//   - client.proto: the Client service that the dsm library calls on the
//     local dsmd over its Unix socket: regions, linearizable atomics on
//     aligned 8-byte words, and Sync. Mapping a region is not part of it; it
//     goes over the SCM_RIGHTS session of internal/mapproto.
//   - admin.proto: the Admin service that dsmctl calls: status and health,
//     members, Raft, region placement, per-page MSI state, statistics, and
//     reads and writes of region memory through the coherence protocol.
//   - types.proto: the messages both share, and the one table of error codes
//     that every RPC follows (NOT_FOUND for an unknown region,
//     INVALID_ARGUMENT for an out-of-range or misaligned request,
//     FAILED_PRECONDITION, UNAVAILABLE, ...).
//
// Import it as
//
//	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
//
// Invariants of the definitions, checked by the tests: every enum's zero
// value is UNSPECIFIED (a field left unset is never mistaken for a real
// value), and the checked-in Go code is what the pinned generators produce
// from the .proto files (see generate.go for how to regenerate).
//
// The package holds no behaviour. Servers validate every field of every
// request: a decoded message is only well formed protobuf, not a valid
// request.
package dsmpb
