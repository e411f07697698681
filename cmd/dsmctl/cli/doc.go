// Package cli is dsmctl, the operator's command line for the DSM service,
// as an importable package: cmd/dsmctl/main.go only hands it the process's
// arguments and environment (Run, OSEnv), so tests run every command
// in-process against a fake Admin server.
//
// # Shape
//
// Every command talks to one dsmd through the Admin gRPC service
// (internal/rpc/dsm/v1), found at --addr, else $DSM_ADDR, else
// DefaultAddr (/run/dsm/dsmd.sock). The connection is made on the first
// request; each request is bounded by --timeout.
//
//	status                   cluster at a glance; the exit code is the health verdict
//	members, raft            membership and the directory's Raft state
//	region create|ls|info|rm regions and their placement
//	pages REGION             the MSI state of pages as a grid of letters (and colors)
//	top                      per-node rates, refreshed every second
//	get, put                 region memory through the coherence protocol
//	region export|import     a region's populated pages to a checked file
//	                         (internal/regionfile) and back, with a progress bar
//	bench                    one workload of the DSM microbenchmark grid, run from this client
//	completion               bash, zsh, fish and powershell completion scripts
//
// # Output
//
// Tables are aligned in plain text; ANSI colors are added only when stdout
// is a terminal, $NO_COLOR is unset and $TERM is not "dumb", and every
// colored element is also readable without color (letters and digits in
// the pages grid, words in tables). --json replaces the text with indented
// JSON whose fields are fixed by the structs of this package (top streams
// one object per line); fields may be added, never renamed.
//
// # Errors and exit codes
//
// A failure is one line on stderr, "dsmctl: " then what failed, where, and
// what to try; never a stack trace. gRPC status codes from dsmd are turned
// into that line (describe), with dsmd's message in the user's terms
// (userMessage: no internal package names, a bad region spec named by the
// argument that made it), and a socket that cannot be reached is
// explained by the dialer's own error (connection refused, no socket
// there). Exit codes: ExitOK, ExitError, ExitUsage, and for status
// ExitDegraded and ExitUnhealthy. Every wrong argument is ExitUsage,
// whether dsmctl finds it or dsmd answers INVALID_ARGUMENT; a command that
// only groups others (region, or none at all) prints its help to stderr
// and exits ExitUsage too.
//
// # Sizes
//
// Sizes and offsets take units: ParseSize reads 4096, 0x1000, 4KiB, 64GiB,
// 1TiB, 1.5GiB (bare K, M, G, T are binary too; kB, MB, GB, TB decimal).
package cli
