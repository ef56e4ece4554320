// Package archtest holds the test that enforces the import direction of
// ARCHITECTURE.md: aip imports nothing of this module, and hostsdk (outside
// hostsdk/pgruntime) never depends on pgx, chi, the registry or its backends,
// the dispatcher or the control plane.
package archtest
