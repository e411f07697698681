//go:build invariants

package coherence

// invariantsOn turns on the internal consistency checks that run after
// every Step (go test -tags invariants ./coherence/...).
const invariantsOn = true
