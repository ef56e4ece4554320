// Package registrytest is the conformance suite every registry backend must
// pass, and the fixtures it is built from.
//
// Run(t, newBackend) holds a backend (memregistry, pgregistry) to every rule
// of package registry through its contracts only: the catalog's visibility,
// paging and revisions; record validation and mutability; route resolution,
// pinning and admission; settlement and the circuit; hand-outs (a late
// settlement releases only its own reservation; orphan settlement compares
// hand-out numbers); lease maintenance; the
// seed's failure boundaries; the lifecycle contract of the control plane;
// the provably-not-started reroute; the event log (per-tenant sequences,
// all-or-nothing batches, redeliveries and conflicts, paging); and the
// concurrency properties (duplicate resolves converge, nothing is
// overbooked, pages never mix revisions, the ledger balances, concurrent
// appends get gapless sequences a paging reader never skips); and the
// routing core under several dispatchers at once, each with its own
// handle where the backend has more (Backend.Another): one assignment per
// action, exact hand-out numbers, balanced counters never over a limit
// during and after races of settlements, lease maintenance, drains and
// policy changes, the circuit breaker, and reroutes racing retries
// (suite_routeconc.go). Time is injected: the suite drives a
// Clock the backend must use for every time-dependent rule.
//
// SeedScale seeds the reference scale profile (1 000 connector types,
// 10 000 instances and replicas, 100 000 bindings) through any
// Administrator, for benchmarks and the PostgreSQL scale command.
package registrytest
