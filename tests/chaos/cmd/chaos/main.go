// Command chaos runs the DSM service's chaos harness: real dsmd clusters in
// network namespaces under a seeded nemesis, with clients that record every
// operation, and checkers for linearizability, exact counters, durability
// and availability. See package github.com/dsmkit/dsm/tests/chaos and
// docs/reliability.md; `make chaos SEEDS=N DURATION=60s` runs it.
package main

import (
	"os"

	"github.com/dsmkit/dsm/tests/chaos"
)

func main() {
	os.Exit(chaos.Main(os.Args[1:], os.Stdout, os.Stderr))
}
