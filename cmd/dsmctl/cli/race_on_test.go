//go:build race

package cli

// raceEnabled: the test binary runs with the race detector, so TestBinary
// builds dsmctl with it too, from the packages that go test compiled for it
// already.
const raceEnabled = true
