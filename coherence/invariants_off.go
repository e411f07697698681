//go:build !invariants

package coherence

const invariantsOn = false
