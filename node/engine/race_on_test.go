//go:build race

package engine

// raceEnabled scales the CI seeds down under the race detector; the run
// without it does the full share.
const raceEnabled = true
