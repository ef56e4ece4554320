// Package dispatch is the central side of a route: the action entry point
// of the fleet. It authenticates the caller's tenant from a bearer token,
// admits the action through a per-tenant fair scheduler, resolves its
// durable route in the registry, sends the native action envelope — signed
// with the dispatcher's gateway key and carrying the pinned
// security.connector_route — to the assigned replica, verifies the
// replica's signed answer, and settles the route's capacity.
//
// # Library
//
// New(Config, Deps) builds a Dispatcher from a Config (the gateway key and
// principal, limits, timeouts, observability) and its collaborators
// (registry.Resolver, registry.Catalog, an optional registry.Rerouter, a
// TokenVerifier, an optional HTTP client, an optional registry.EventLog
// with its registry.Reader). Run serves the HTTP API until its context
// ends; Handler returns the same API for embedding (the
// development fleet runs it in-process on memregistry). Execute, Cancel,
// Status and Capabilities are the operations behind the API. Each takes
// the tenant it acts for from its caller (the API's handlers pass the
// token's claim) and holds it to the rule of a token's tenant_id claim
// (ValidTenantID): a tenant that is empty, longer than 256 bytes, or holds
// a control or invisible formatting character is answered 401
// dispatch.unauthorized (CodeUnauthorized), as such a token is.
//
// # Admission
//
// Scheduler bounds in-flight actions globally (1 024) and per tenant
// (128), and queued actions by count (4 096, 512 per tenant), bytes
// (64 MiB) and age (30 s); waiting tenants are served in weighted round
// robin. A negative queue bound queues nothing (aipfleet dispatch
// --max-queued 0). Overload is connector.scheduler_overloaded (429).
//
// # Settlement
//
// A verified action_result for the action settles completed — except a
// failed connector_host.interrupted (a read-only capability's action the
// replica's connector crashed, hung or timed out on, or a restart cut
// off: the client is told it failed and may send the read again), which
// settles outcome_unknown so that the replica's circuit counts it, as it
// counts the same failure of a mutation. A verified
// signed error settles cancelled when the replica answered before this
// delivery ran anything (input invalid, idempotency conflict, action in
// progress, a refusal that was not rerouted, ...) and outcome_unknown when
// its own answer is that the outcome is uncertain (outcome unknown,
// execution, storage, replay). Everything unverified — a timeout, a reset
// connection, an unsigned or garbled answer, an answer for another action —
// settles outcome_unknown, and the route stays pinned: retrying the action
// ID returns to the same replica, whose journal answers without running it
// again. A hop that never got a connection to the replica (a refused or
// timed-out dial: net/http writes nothing before it has one) settles
// outcome_unknown too, counting toward the replica's circuit; when this
// request held the assignment's only hand-out (its claim), nothing exists
// under the fence to run later and the action moves to another replica
// (registry.RerouteRequest.Unsent); otherwise the client is told that
// nothing of its request was delivered (dispatch.replica_unreachable, 503,
// retryable). A settlement the registry did not confirm (a storage failure or a
// timeout) is retried in the background for Config.SettleRetryTimeout;
// Run's shutdown waits for those retries within ShutdownTimeout, and Close
// gives them up. A reservation no dispatcher settled (one crashed, or its
// retries gave up) is settled from the pinned replica's journal by
// Reconcile, which Run calls every Config.ReconcileInterval, once the
// reservation was last handed out Config.ReconcileAfter ago, through
// registry.OrphanSettler (Deps.Reservations), which refuses a
// reservation a client's retry picked up meanwhile (it compares the
// hand-out number the pass read). Every settlement presents the hand-out
// it holds (registry.RouteAssignment.HandOut): the execution's and its
// background retries' the one its Resolve or Reroute returned, a cancel's
// the one it looked up before sending the cancel; a settlement of a
// hand-out whose reservation was released and made again since for a
// retry changes nothing (docs/routing.md, "Hand-outs").
//
// A Resolve or Reroute that failed in a way that may have committed (a
// storage failure, a context error: anything but a definite refusal) sent
// nothing; when the registry implements registry.UnsentReleaser, each such
// call carries a fresh random claim, and the dispatcher releases the
// hand-out it names in the background (bounded by SettleRetryTimeout, at
// most 1024 pending at once), so
// a reservation made for an action that was never sent does not wait for
// reconciliation (docs/routing.md, "Lost commits").
//
// # Provably-not-started reroute
//
// The one exception to pinning: when the pinned replica answers the action
// envelope with its signed refusal (connector_host.not_ready or
// connector_host.capacity), the dispatcher presents the envelope it sent
// and the refusal as registry.RefusalEvidence to the registry's Rerouter,
// which verifies it, moves the action to another replica under a new fence
// token and keeps the old assignment as history — unless the assignment
// was handed out more than once, in which case another envelope may exist
// and the route stays pinned. At most Config.MaxReroutes (2) reroutes
// happen per request. docs/routing.md gives the safety argument.
//
// # Connector events
//
// With Deps.Events (and Deps.Records), POST aip.EventsPath is the fleet's
// connector-event ingress: a host delivers a batch of provider events as
// an aip.discovery.v1.event_stream_response envelope signed with its key,
// naming its replica, lease sequence and channel in
// security.connector_event. The dispatcher checks the envelope (size,
// type, addressee, sent_at) and the sender against the registry (the
// replica's DID and principal, instance, tenant, lease and lease sequence,
// the active version's manifest digest and channels), stamps each event's
// data with aip_connector (ConnectorStamp), appends the batch to the
// tenant's registry.EventLog and answers with a signed event_stream of the
// events as stored; refusals are signed errors with the
// connector_event.* codes. GET PathEvents pages through the authenticated
// tenant's log. docs/dispatch-api.md has both routes.
//
// # Tracing
//
// One trace per action: dispatch.action (the entry point, attributes
// aip.tenant_id, aip.capability_id, aip.action_id, aip.replica_id,
// aip.outcome), with children dispatch.admission, dispatch.resolve,
// dispatch.send (one per hop; its context travels in the envelope's trace
// member, so the host's hostsdk.message span and the connector's span are
// its children), dispatch.reroute and dispatch.settle. A caller's W3C
// traceparent and tracestate are continued; its baggage is not read, so no
// member a caller chose is signed into an envelope.
package dispatch
