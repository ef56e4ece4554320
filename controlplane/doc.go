// Package controlplane is the connector fleet's lifecycle service: the
// narrow, signed authority through which connector hosts register, renew
// their leases with heartbeats, drain and go offline, plus the lease
// maintenance loop and read-only fleet status.
//
// # Authority
//
// The service holds only a data-pool view of the registry (Store: the
// registry.Lifecycle and registry.FleetStatus contracts); it cannot change
// the catalog. Every request is signed by the replica's own pre-provisioned
// key, and every answer is signed by the service's key, which hosts pin.
//
// # Request processing
//
// POST /aip/v1/connector-control takes a signed wrapper
// {"request": {...}, "signature": "..."} of at most 64 KiB and checks, in
// this order:
//
//  1. the body (size, the signed wrapper, the request's shape), read
//     within a budget the bodies being read share (Config.MaxReadBytes,
//     16 MiB; one address at most a quarter of it, its further requests
//     waiting for its own reads; aip_connector_control_reads_waiting);
//  2. the freshness window: issued_at at most 5 s ahead of the service's
//     clock, expires_at after now and after issued_at, lifetime at most 30 s
//     (a request that expired while the service itself did not run — its
//     own ticker stopped for over 5 s, as under SIGSTOP — is refused with
//     a message that says so, not one that suggests the clocks; a resent
//     copy of a request already refused so is logged at debug);
//  3. the replica named by the command is pre-provisioned (an ID that is
//     no replica record ID, "crepl_" and up to 250 letters, digits, '.',
//     '_' or '-', is refused so without a registry lookup);
//  4. the request's signer_did is the replica's peer DID;
//  5. the Ed25519 signature over the canonical request;
//  6. the request digest (aip.ControlRequestDigest);
//  7. replay and the operation's rules, decided by the registry in one
//     atomic unit with the state change (registry.DecideLifecycle).
//
// Answers are signed responses (aip.ControlResponse) whose outcome is a
// lease (register, heartbeat, drain), offline (offline) or a rejection:
//
//	HTTP 200  lease / offline
//	HTTP 403  connector_control.rejected, retryable false: a definitive
//	          decision (malformed request, window, unknown replica, signer,
//	          signature, replay, or a lifecycle rule)
//	HTTP 413  connector_control.rejected, retryable false: body over 64 KiB
//	HTTP 503  connector_control.unavailable, retryable true: the registry
//	          could not decide (storage failure, timeout, shutting down,
//	          or the replica's record held by another database session
//	          past the bounded lock wait: the requests coalesced with it
//	          are decided), or MaxRequestsPerReplica (4) of the replica's requests are
//	          already being decided; nothing was committed, resend the
//	          same bytes
//	HTTP 500  unsigned {"error":{"code":"connector_control.response_signing",
//	          ...}} when the service cannot sign its answer
//
// A rule rejection consumes its request ID (resending it is answered with
// the replay rejection); a 503 never does, so the byte-identical retry of a
// request that failed retryably is decided afresh. The exact committed
// request sent again (a lost response) is answered with the identical lease.
//
// # Coalescing
//
// Concurrent requests are coalesced: a small pool of batch workers takes
// whatever requests are queued (up to Config.MaxBatch) and applies them
// with one registry.Lifecycle.ApplyLifecycle call, group-commit style, so a
// PostgreSQL backend commits many heartbeats per transaction while every
// request keeps its own replay and sequence semantics. A replica has at
// most MaxRequestsPerReplica requests queued or in a batch, so one
// replica flooding the service cannot delay the others' heartbeats.
//
// # Maintenance
//
// Every Config.MaintenanceInterval (1 s) the maintenance loop expires stale
// leases in bounded batches (up to 8 × 500), releasing their reservations,
// releases in as many batches the reservations stranded on replicas offline
// for longer than registry.StrandedReservationGrace (15 min; counted in
// aip_connector_control_stranded_reservations_released_total), and
// refreshes the fleet gauges; each store call is bounded by
// Config.StoreTimeout, and storage errors and timeouts back off
// exponentially with jitter up to Config.MaintenanceMaxBackoff (30 s).
// When the store implements registry.EventPruner, a cycle also deletes,
// at most once a minute, the event log's events received longer than
// Config.EventRetention ago (30 days; KeepEventsForever keeps them), in
// batches of 1000 up to 10 (when those leave events behind, the next
// cycle prunes again, so pruning keeps up with any rate of events that
// fits in the cycles' batches); a failure is logged and counted
// (aip_connector_control_event_prune_failures_total) without failing the
// cycle. The log keeps the IDs of the events it prunes (so that a host
// delivering one again does not have it stored twice); after the events,
// the same pruning forgets, in as many batches, the IDs of events received
// longer than Config.PrunedEventIDsRetention ago (365 days;
// KeepPrunedEventIDsForever keeps them), counted in
// aip_connector_control_pruned_event_ids_forgotten_total, failures in
// aip_connector_control_pruned_event_ids_forget_failures_total: an event
// delivered again after its ID was forgotten is stored again.
//
// # Other routes
//
// GET /health (process), GET /ready (store readiness: schema version,
// catalog revision, pool state; 503 naming the failing checks), GET /metrics
// (Prometheus text), GET /.well-known/jwks.json (the signing key, kid = its
// did:key), and the operator reads GET /aip/v1/fleet/status and
// GET /aip/v1/fleet/replicas.
//
// The fleet views (every replica's endpoint, identity and load) answer only
// requests Config.OperatorAuth admits — in aipfleet control-plane, those
// with an operator token of a trusted issuer — and 401 with the reason to
// the rest; without OperatorAuth they answer no one. The messages of
// failing /ready checks go to operators, to local peers (loopback, with no
// proxy forwarding header; none with Config.HideLocalReadyDetail) and to
// the log (when they change); other peers read which checks fail.
package controlplane
