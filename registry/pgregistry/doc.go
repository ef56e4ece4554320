// Package pgregistry is the PostgreSQL registry backend of the fleet: it
// implements the five registry contracts (Catalog, Resolver, Reader,
// Administrator, FleetStatus) on pgx v5 and passes the same registrytest
// conformance suite as memregistry.
//
// # Schema
//
// The schema lives in the aip_registry PostgreSQL schema and is installed by
// the embedded migrations (migrations/NNNN_name.sql), applied in one
// transaction under an advisory lock and recorded with their checksums in
// aip_registry.schema_migrations. A changed or unknown migration stops
// start-up with an error naming it. Each record kind has its own table with
// an indexed column for every selection and visibility predicate; the fleet
// is never one JSON document, and only opaque secret-provider and
// credential-revision references are stored, never credential values.
//
// # Pools
//
// Open connects two pools. The control pool installs the schema and
// performs catalog and admission writes; the data pool serves catalog
// reads, route resolution, reservations and settlement, replica writes,
// lease expiry and fleet status. OpenDataPlane connects only the data pool,
// verifies that the installed schema is exactly SchemaVersion (refusing an
// older or newer one) and holds no control pool: its catalog writes fail
// with ErrNoControlPool. The two pools can use roles with different grants
// (deploy/postgres/roles.sql).
//
// # Locking
//
// Catalog publication takes the exclusive form of a database-scoped advisory
// lock and advances the revision in the same transaction; catalog readers
// take the shared form before reading the revision and the page, so a page
// and its total are exactly those of one revision. Every decision for one
// action is serialised by a per-action advisory lock. A new route selects
// its replica with FOR UPDATE ... SKIP LOCKED, retrying a bounded number of
// times when every eligible replica is held by another routing transaction;
// admission counters are reserved with guarded updates (active < limit).
// Locks are always taken in one order (action, publication, replica, route,
// counters by kind and key) so concurrent transactions cannot deadlock.
// Time comes from the injected clock and is passed to SQL as parameters.
//
// # Errors
//
// SQLSTATEs are translated here and nowhere else: serialization failures,
// deadlocks and unique-key races retry the transaction a bounded number of
// times, then fail with registry.ErrStorage; every other database failure is
// registry.ErrStorage, after which nothing may be inferred about a commit.
package pgregistry
