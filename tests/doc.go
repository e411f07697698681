// Package tests holds the multi-process integration tests of the DSM
// service: they build the real dsmd and dsmctl once (TestMain), start
// clusters of dsmd processes on loopback ports chosen free, and drive them
// through the real dsmctl binary, as an operator would.
//
// Run them with
//
//	go test -race ./tests/...
//
// -short skips the tests that start processes.
package tests
