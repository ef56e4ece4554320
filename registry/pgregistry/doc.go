// Package pgregistry is the PostgreSQL registry backend of the fleet: it
// implements the registry contracts (Catalog, Resolver, Reader,
// Administrator, FleetStatus, the Lifecycle contract with ReplicaLister and
// Readiness, the provably-not-started Rerouter, the OrphanSettler and the
// EventLog) on pgx v5 and passes the same registrytest conformance suite as memregistry.
//
// # Schema
//
// The schema lives in the aip_registry PostgreSQL schema and is installed by
// the embedded migrations (migrations/NNNN_name.sql), applied in one
// transaction under an advisory lock and recorded with their SHA-256
// checksums in aip_registry.schema_migrations. A changed applied migration
// (ErrMigrationChanged) or one this build does not know
// (ErrUnknownMigration) stops start-up with an error naming it. Each record
// kind has its own table with an indexed column for every selection and
// visibility predicate; documents that are immutable evidence (manifests,
// attestations, capability definitions, a route's admission snapshot) are
// jsonb beside them. The fleet is never one JSON document, and only opaque
// secret-provider and credential-revision references are stored, never
// credential values. Times are milliseconds from the injected clock, passed
// to SQL as parameters; the database clock is never used for a rule. Every
// text column has the "C" collation (migration 0006), so the database orders
// IDs byte by byte as Go and memregistry do, whatever the database's default
// collation: the catalog's cached views are searched in Go.
//
// # Pools and roles
//
// Open connects two pools. The control pool installs the schema and
// performs catalog and admission writes; the data pool serves catalog
// reads, route resolution, reservations and settlement, replica writes,
// lease expiry, fleet status and lifecycle commands. OpenDataPlane connects
// only the data pool, verifies that the installed schema is exactly
// SchemaVersion (ErrSchemaMismatch for an older, newer or missing one) and
// holds no control pool: its catalog writes fail with ErrNoControlPool. The
// pools normally use different roles (deploy/postgres/roles.sql):
// aip_registry_admin for the control pool, aip_registry_data for a
// dispatcher's data pool, aip_registry_lifecycle for the lifecycle
// service's. Lease expiry releases reservations, so it needs the data role.
// With Config.Service set (Dispatcher, LifecycleService), Open and
// OpenDataPlane check at start, with one catalog query
// (has_table_privilege and its kin), that the data pool's role holds
// every privilege roles.sql grants that service's role, and fail with a
// *RoleError naming the role, what it lacks and the fix: the wrong role's
// URL, or roles.sql not run again after a migration, would otherwise show
// only as failures of single requests or of the event retention. A role
// with more, such as the schema's owner or a superuser, passes.
//
// Every session of either pool is set up by pgsession.AfterConnect: a
// session idle in a transaction for a minute is ended (unless the role,
// the database or the URL sets idle_in_transaction_session_timeout);
// synchronous_commit off, whoever set it, becomes local, since a route
// assignment or settlement acknowledged and then lost in a server crash
// could let a retry of the action be routed to another replica and run
// twice (on, remote_write and remote_apply are kept); and the server gets
// TCP keepalives and tcp_user_timeout (pgsession.DetectDeadPeer, unless
// the session has some), so the sessions of a process whose machine died
// end within about two minutes rather than the system's two hours (15
// minutes while data sent to it is unacknowledged). LockApply's session
// gets them too: the apply lock it holds would otherwise stop every later
// apply for as long.
//
// # Locking
//
// Catalog publication takes the exclusive form of a database-scoped advisory
// lock and advances the revision in the same transaction (Batch holds it for
// all its writes: readers and new routes wait until it commits). Catalog
// readers take the shared form before reading the revision and the view or
// page, so a page and its total are exactly those of one revision. Every
// decision for one action is serialised by a per-action advisory lock. A
// new route reads its ranked candidates without locking them, then takes
// the first one no other transaction holds with FOR UPDATE ... SKIP
// LOCKED, re-checking its eligibility under the lock; only when every
// candidate is held by other routing transactions does it wait, at most
// Config.RouteLockWait, for them in rank order, and when none could be
// taken it reads again, a bounded number of times. No row lock is held
// across a round trip to the client: rows are locked only by the
// statements of a transaction's last pipelined batch, the one that
// commits, so the hot rows (a busy tenant's few replicas and admission
// counters) are held for the server-side execution of one batch. Admission
// counters are reserved with guarded updates (active < limit); a full scope
// aborts the transaction server-side (SQLSTATE AIP01), so nothing of the
// route commits. Locks are always taken in one order — the action, the
// publication, one replica row, the route row, then counters by scope kind
// (as a reservation lists them), key and stripe — and lifecycle batches
// lock their replicas in ascending ID order, so concurrent transactions
// cannot deadlock (a reroute that finds a scope's old stripe full for the
// new reservation is the one exception; see Reroute).
//
// # Striped admission counters
//
// Each scope's counter is kept in eight stripes (migration 0004). Stripe s
// of a scope with limit L admits L/8, plus one for the first L%8 stripes,
// so the stripes never admit more than L together, and a scope with a
// limit under eight has a share in that many stripes only. A route
// reserves each scope of its reservation in one of that scope's stripes
// and records them (migration 0011: counter_stripe when they share one,
// as they do unless a stripe was full, else counter_stripe -1 and
// scope_stripes); its settlement, reroute, lease expiry or stranded
// release releases each scope in its stripe. A reservation starts every
// scope in the stripe of its lane; when scopes' stripes are full, the
// statement names all of them and the reservation is made again, in a
// transaction of its own, with only those scopes moved to their next
// stripe not yet found full. A scope is refused when its stripes together
// hold its limit (the reservation then fails at once) or when every
// stripe with a share of it was found full, and the refusal names the
// first such scope of the reservation. So each scope is judged by its own
// limit, as in memregistry, whatever the limits beside it: with a tenant
// limit of 6 and binding limits of 5, a route of a second capability takes
// the tenant's sixth share in a stripe the first binding has none in.
// The stripes of a scope are found full one attempt at a time, so a
// reservation racing settlements of that scope can still be refused
// though the scope never held its limit at one instant (each stripe was
// full when it was tried; settlements freed some before the last one
// was). Reservations of one scope need not share a
// limit (two policies naming the same tenant, or a policy whose limit was
// lowered), so a reservation is also refused while the scope's stripes
// together hold its whole limit; that sum is read without locking the
// other stripes, so reservations of different limits made at the same
// moment in different stripes can still pass the lower limit by the ones
// in flight. Builds of schema version 10 and older know only
// counter_stripe: their statements cannot release or reroute a route
// with a stripe per scope (migration 0011's constraints refuse them),
// which this build then settles, expires or reroutes.
//
// A counter row stays locked until its transaction's commit has flushed
// the WAL, so with one row per scope a busy tenant's routing transactions
// took turns, one WAL flush each; the transactions a registry runs for a
// tenant at once start at different stripes (the lane of the tenant's
// gate they hold, offset by a random base per registry), so they do not
// wait for each other there and can share their WAL flushes. The ledger
// adds a scope's stripes up.
//
// # Lease maintenance
//
// ExpireStaleReplicas (run by the control plane's maintenance every
// cycle) takes up to its limit of stale replicas, oldest lease first, that
// no other transaction holds (FOR UPDATE SKIP LOCKED), releases their
// reservations (the route rows, then the counters by scope kind, key and
// stripe, in the lock order above) and takes them offline, all in one
// transaction. Maintenance transactions bound their lock waits on the
// server: with a deadline, lock_timeout is three quarters of the time
// left, so a row another session holds (a dispatcher stuck mid-transaction
// on a tenant's admission counter) fails the statement before the caller
// gives up, and the replica rows taken are released when the call returns.
// The stuck replica has the oldest lease, so every batch would take it
// first and fail; when the batch fails on a lock timeout, the replicas it
// took are expired again one per transaction, each re-taken only if still
// stale and free, with an equal share of the time left (its lock wait
// three quarters of that share), so the call still ends within the
// caller's deadline. Those that time out stay online for a later pass; the
// call fails only when it could expire none of them, so a lone stuck
// replica still fails the maintenance cycle (and the control plane's
// readiness reports it), while the other tenants' stale replicas are
// expired. ReleaseStrandedReservations takes its locks in the same order.
//
// Every write that takes a replica offline records why and when
// (offline_reason and offline_at_ms, migration 0013; registry.OfflineReason):
// lease expiry in the same statement, the lifecycle and administrator
// writes with the rest of the record. A row-level trigger clears them when
// a write leaves a replica ready or draining with a reason, which only a
// build of schema 12 still running during the upgrade does (its
// statements do not know the columns); its WHEN clause keeps it from
// running on this build's writes.
//
// # Round trips
//
// The hot paths are pipelined. A new route is two round trips (the
// advisory locks and the candidate read begin the transaction; the replica
// take, the route insert, the counter reservations and COMMIT end it), or
// one when its tenant and capability have a cached best binding: which
// binding a new route goes to, with its policy and admission reservation,
// is catalog state, so the registry keeps it per tenant and capability for
// the newest revision read, when that binding is the only one of its
// priority. Such a route sends the locks, one statement that checks that
// the catalog is still at the cached revision and ranks and takes the
// binding's replicas (FOR UPDATE ... SKIP LOCKED) and inserts the route,
// and the counter reservations at once; when that statement can take
// nothing it aborts the transaction and the route is made the
// two-round-trip way. A settlement is one round trip: one statement takes
// the action and replica locks and releases the route only if it equals
// the presented assignment column by column and the presented hand-out is
// at or after reserved_hand_out (the hand-out that made the reservation;
// migration 0008), with its replica's count and circuit and its counters.
// Every write that hands a route out raises hand_out, and records the
// caller's claim of the hand-out (hand_out_claim, with claim_hand_out its
// number; migration 0010), in the statement it already sends, so numbering
// and claiming hand-outs costs no round trip. ReleaseUnsent, which
// releases a claimed hand-out whose caller never learned that it
// committed, is rare and takes two round trips (unsent.go). A
// transaction of one batch needs no BEGIN or
// COMMIT: the statements of a pipelined batch, up to its Sync, run as one
// implicit transaction that commits at the Sync only if all of them
// succeeded.
//
// # Routing concurrency per tenant
//
// A busy tenant's routes and settlements share its few replicas and its
// admission counters' stripes, so in the database they take those rows a
// few transactions at a time however many are sent, and a transaction
// waiting there on a row lock costs the server
// CPU (lock-manager work, a sleep and a wake-up, a re-check of the row)
// that the transactions holding the rows need. The registry therefore runs
// at most Config.TenantRouteConcurrency routing transactions (resolutions,
// settlements, reroutes) of one tenant in the database at once, each in a
// lane of the tenant's gate, and queues the others in the process; tenants
// do not share the bound.
//
// Catalog views (the sorted capability IDs a tenant, or an internal read,
// sees at a revision) are cached for the newest revision read, and the
// immutable definitions with them, so a page costs one round trip (the
// shared lock and the revision) when its view is cached; a revision names
// one catalog state, so a cached view is exact. Config.DisableCatalogCache
// makes every page one SQL query instead. Connections use generic plans
// (plan_cache_mode=force_generic_plan): every statement is an index-driven
// lookup, and planning the nine-table route selection costs milliseconds.
//
// # Event log
//
// The event log (migration 0005) is two tables on the data pool: events,
// keyed by (tenant, sequence) and unique by (tenant, event ID), and
// event_log_heads, one row per tenant holding the last sequence given out.
// AppendEvents first reads the stored events with the batch's IDs, without
// a lock, and decides each event there (a redelivery returns the stored
// event, a conflict fails the batch, see registry.CheckRedelivery). The new
// events are then appended in one implicit transaction of one round trip:
// it locks the tenant's head row (INSERT ... ON CONFLICT DO UPDATE, which
// creates it on the tenant's first event), inserts the events numbered
// after it, in the batch's order, and advances it. An event another
// delivery stored after the first read breaks the unique key; the
// transaction rolls back and the append runs again and finds it.
//
// Sequences come from the per-tenant head row, not from a database
// sequence, on purpose. A sequence (bigserial) hands out numbers when rows
// are inserted, not when they commit: a transaction holding 41 can commit
// after another holding 42, and a reader that paged past 42 in between
// (after=42) would never see 41. It would also number a tenant's events
// with the gaps of every other tenant's and of every rolled-back append.
// The head row is locked until its transaction commits, so one tenant's
// appends commit one at a time in sequence order: when an event is
// visible, every event with a lower sequence is already visible, and
// sequences run 1, 2, 3, … per tenant without gaps. The price is that one
// tenant's appends take turns on that row for one statement batch and
// commit each (the lock is never held across a round trip to the client);
// appends of different tenants do not wait for each other. Events reads
// the primary key's range (tenant_id, sequence > after) in order, without
// locks.
//
// An event is stored twice in its row: as jsonb (event), whose numbers are
// PostgreSQL numerics, and as the text of the document cast to it
// (event_text, migration 0014), which reads return, so that an event's
// data reads back byte for byte as it was stored, as memregistry returns
// it. jsonb writes a number back in full (1e308 as 309 digits, 1e131071
// as 131072), reorders members and adds spaces: an event read from it
// could be some fifty times larger than it was delivered. A row stored
// without event_text (before 0014, or by a build of schema 13 still
// running during the upgrade) reads back as jsonb writes it, which
// CheckRedelivery compares by value. The jsonb is what builds of schema
// 13 read and what the digest of a pruned event is computed from. A
// number beyond numeric's range (written out, more than 131072 digits
// before the decimal point or 16383 after it: 1e131072, 1e-16384) would
// fail the insert: registry.EventBatch.Validate refuses such a batch
// before the append, as ErrInvalid naming the event and the number's path,
// as memregistry does, never as a storage failure a caller would retry.
//
// PruneEvents (the event retention, run by the control plane's maintenance
// on its lifecycle role; the data role may not delete events) deletes the
// events received before its cutoff, oldest first across tenants, by the
// index of migration 0007 on (received_at_ms, tenant_id, sequence). The
// head rows stay, so sequences go on after the deleted events (with a gap
// where they were). A statement-level trigger on events (migration 0009,
// running as the schema's owner) keeps the deleted events' IDs in
// pruned_events, with a digest of each one's content (migration 0012's
// event_replay_digest), which AppendEvents reads with the stored events in
// one statement, so an event pruned is not stored again; a delivery under
// a pruned ID is digested by the same function (one more round trip) and
// is ErrConflict when the digests differ. The digest walks the data
// recursively (a PL/pgSQL call per level where a number needs
// normalising), which is why registry.EventBatch.Validate bounds the
// data's depth (registry.MaxEventDataDepth, as deep as a signed delivery
// carries it): data nested several hundred levels would exhaust
// PostgreSQL's stack in the prune's trigger. ForgetPrunedEvents
// (the same maintenance, a second horizon later) deletes the IDs of the
// events received before its cutoff, oldest first, by the index
// pruned_events_by_received; an event whose ID it forgot is stored again
// if a host delivers it again.
//
// # Errors
//
// SQLSTATEs are translated here and nowhere else: serialization failures,
// deadlocks and unique-key races retry the transaction a bounded number of
// times, then fail with registry.ErrStorage; a missing privilege is
// registry.ErrStorage naming roles.sql; every other database failure is
// registry.ErrStorage, after which nothing may be inferred about a commit.
// A key PostgreSQL cannot hold in a text column (a NUL character, bytes that
// are not UTF-8) names no stored record: lookups, settlements and reroutes
// naming one are answered without a query, ErrNotFound or ErrFenceLost as
// in memregistry, never a storage failure a caller would retry.
package pgregistry
