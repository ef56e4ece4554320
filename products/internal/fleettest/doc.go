// Package fleettest runs product adapters as real aip-host processes in a
// real fleet: the control plane and the dispatcher on PostgreSQL
// (sidecar/sidecartest/realfleet), an aip-host replica registered with
// them, and a mock provider behind the product's published API document.
// An action sent to the dispatcher's API goes through the whole path
// (token, route, signed hop, the host's journal, the adapter, the
// provider) and back; SIGTERM drains the replica and it exits 0.
//
// The package has only tests. They need a test database
// (AIP_TEST_DATABASE_URL; `make test` starts one).
package fleettest
