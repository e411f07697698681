//go:build race

package tests

// raceEnabled: the test binary runs with the race detector, so the dsmd and
// dsmctl it builds do too.
const raceEnabled = true
