// Package systemd holds dsmd's systemd unit (dsmd.service), its tmpfiles.d
// and sysusers.d rules and an example configuration (dsmd.json), and their
// test. The package has no code: see docs/operations.md for installing them.
package systemd
