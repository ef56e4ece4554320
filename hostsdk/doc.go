// Package hostsdk runs a Go connector as a replica of the AIP connector
// fleet. A connector author implements Connector (tenant-scoped discovery
// and the handling of one action) and hands it to New; Host.Run does the
// rest: the ten-step bootstrap, a durable runtime journal, the native AIP
// surface, a lease held through jittered signed heartbeats, recovery of
// crashed work, and a clean drain on SIGTERM or Ctrl-C (NotifyStop is the
// signal context for a main: SIGHUP too, unless ignored as under nohup).
//
// # A main
//
//	func run(ctx context.Context, args []string, getenv func(string) string) error {
//		cfg, err := hostsdk.LoadConfig(args, getenv)
//		if err != nil {
//			return err
//		}
//		host, err := hostsdk.New(cfg, myconnector.New())
//		if err != nil {
//			return err
//		}
//		ctx, stop := hostsdk.NotifyStop(ctx)
//		defer stop()
//		return host.Run(ctx) // nil only for a clean drain and offline
//	}
//
// examples/echo is a complete connector built this way and tested with
// package hostsdktest.
//
// # Configuration
//
// Config's zero-value knobs mean the documented defaults. LoadConfig (or
// BindFlags, for programs with flags of their own) reads the common host
// contract from flags and AIP_CONNECTOR_HOST_* environment variables (a flag
// wins over its variable): --bind, --public-endpoint,
// --control-plane-endpoint, --event-endpoint, --control-plane-did or --control-plane-did-file,
// --signing-seed-file, --connector-type-id, --version-id, --instance-id,
// --replica-id, --tenant-id, --gateway-principal-id (default
// service:aipfleet-dispatch, the dispatcher's own default), --gateway-did or
// --gateway-did-file, --trust-domain, --region, --zone, --capacity-class,
// --artifact-digest, --secret-provider-ref, --config-revision,
// --allow-insecure-loopback-http, --max-in-flight, --lease-ttl-ms,
// --heartbeat-interval-ms, --drain-timeout-ms, --drain-linger-ms,
// --health-probe-timeout-ms, --handle-grace-ms,
// --control-timeout-ms, --register-wait-ms (default 120000: how long the
// start waits for a control plane that does not answer; 0 does not wait),
// --ready-detail (local, the default, or none: who reads the error texts
// of failing /ready checks),
// --tls-ca-certificate-file, --state-dir and
// --database-url-file for the journal, the optional identity the
// connector is given (--tenant-system, --membership-id,
// --external-account-id with --external-account-system, and the tenant
// credential reference --credential-id, --credential-issuer,
// --credential-scope, --credential-revision-ref, all or none) and
// --credential-revision-policy-file. Every invalid value is reported as a
// *ConfigError naming the flag, the variable and the accepted range. Secrets
// come only from files, which must be regular files (a symlink is followed,
// so a Kubernetes secret volume's keys can be named) owned by the host's
// user or root and readable by their owner only (aip.ReadSecretFile: a file
// root owns may be group-readable for a host that is not root), in
// directories only the host's user or root can change (each directory of
// the path, and each symlink, owned by one of them; none writable by group
// or others unless root's and sticky, as /tmp, or on a read-only mount, or
// writable only by its owner's private group: see aip.ReadSecretFile).
//
// The connector sees the configured identity, never the action's: on
// TenantContext (Call.Tenant, Connector.Manifest's tenant) and as every
// action's identity, which replaces whatever the action carried: tenant
// {id, system}, external_account, service_account (the dispatcher's
// principal the message was verified against) and credential_ref.
//
// # Bootstrap
//
// Start (and Run) perform, in order, each step with a log line, an
// OpenTelemetry span and its own error type (see StepError):
//
//  1. validate the configuration and its files; a credential revision
//     policy must authorize --credential-revision-ref (ValidateError);
//  2. open the runtime journal and install its schema, then call
//     Config.AfterOpenJournal if set (OpenJournalError);
//  3. tenant-scoped discovery, Connector.Manifest (DiscoverError);
//  4. bind the manifest to the trust domain and the signing principal and
//     compute the manifest digest (BindManifestError);
//  5. build the native gateway and product routes, bind the listener
//     (BuildRoutesError);
//  6. recover durable work (RecoverError); from here on, when the journal
//     has served this replica ID before (it has an origin: see Native
//     ingress, "Before the host serves"), the native ingress is served,
//     refusing every action it cannot answer from the journal;
//  7. probe storage and connector health (ProbeError);
//  8. send the signed register (RegisterError). While the control plane
//     does not answer (ErrControlUnavailable: down, restarting, its
//     database failing over), it logs that it waits and registers again
//     with jittered exponential backoff for up to Config.RegisterWait (2
//     minutes by default), sending the same request again while the
//     outcome of its attempts is unknown, so that one applied with its
//     answer lost is answered with its lease; then the start fails naming
//     the control plane and --register-wait-ms. Refused because the
//     replica's lease is still live in the registry (lease_live: a run
//     that stopped without going offline, such as a kill -9), it waits
//     until that lease can have expired and registers again with a new
//     request, for at most MaxLeaseTTL plus 10 s; any other signed
//     rejection fails the start;
//  9. apply the lease and start heartbeats (ApplyLeaseError);
//  10. serve (ServeError): run actions, and serve every other route.
//
// A shutdown requested while the host starts (ctx cancelled in Run:
// SIGTERM, Ctrl-C) stops the bootstrap, which then releases what it did
// (a registration is taken offline); Run returns nil when that left
// nothing behind. A step that failed for a reason of its own — its error
// does not come from the cancellation (it wraps neither context.Canceled
// nor the context's cause) — is a failed start even when the shutdown
// request arrived meanwhile, and Run returns its error, so a supervisor
// sees it.
//
// # The runtime journal
//
// Every action is journaled before the connector runs it, with the replay
// registry of native message IDs, a receipt hash chain, a provider-event
// outbox and a compare-and-set state store (Call.State). By default the host
// opens the embedded SQLite journal (package sqliteruntime) in StateDir
// (default .aipfleet/host-<replica ID>) and closes it when it stops. A main
// may instead have another journal.Journal opened at step 2 (for example
// pgruntime with Config.DatabaseURLFile) with Config.OpenJournal, so that a
// bad setting or file is refused before the database is touched; the host
// then closes it when it stops. A journal passed open as Config.Journal is
// the caller's, who closes it after Run returns. A journal belongs to one tenant
// and one connector type: step 2 records the host's in a journal that names
// none and refuses a journal that names others (ErrJournalOwner).
//
// Finished actions are kept for Config.ActionRetention (30 days by
// default; KeepActionsForever keeps them), then pruned in the background
// with their receipts and their values in the connector's
// ActionStateKeeper namespaces. The journal's prune horizon then refuses
// any action routed before it (its fence token, a UUIDv7, carries the
// assignment time) with a signed 410 connector_host.action_expired, so a
// pruned action is never run a second time.
//
// Recovery runs before registration: actions journaled but never started
// are failed (they never ran), and a cancel that arrived before its action
// is completed as cancelled; actions left running go to the connector's
// Reconciler, or become outcome_unknown without one (a read-only
// capability's that none settled fails connector_host.interrupted: it
// changed nothing). The summary is shown
// in /ready; any recovery error blocks registration.
//
// # Native ingress
//
// POST /aip/v1/messages accepts a signed native envelope of at most 4 MiB
// (a larger Content-Length is refused unread). The bodies being read before
// their signature is checked hold at most MaxIngressReadBytes (64 MiB)
// together, so unauthenticated senders cannot grow the host's memory, and
// one remote address (IPv4, or an IPv6 /64) at most
// MaxIngressReadBytesPerPeer (a quarter), so one sender that opens many
// connections and trickles its bodies cannot keep the dispatcher's
// messages waiting. A message beyond the budget waits for it, and one over
// its sender's share waits for that sender's own reads only (both counted
// in aip_connector_host_ingress_reads_waiting, by reason budget or peer_share); it is
// never refused, since the refusal of an unread message could not be
// signed. Once its reservation is granted, a body must arrive at 256 KiB/s
// after a 5 s grace (21 s for 4 MiB) or is refused unsigned.
// The host verifies the dispatcher's signature and identity against the
// pinned gateway DID and principal, then the pinned security.connector_route
// against this replica (it holds the members of aip.ConnectorRoute and no
// other, a registry fence token, route_ and a UUIDv7, and
// approval_authorization exactly when the message is an action carrying an
// approval; the host does not import approvals, the dispatcher verified
// it), and claims the message ID in the replay registry
// (every message signed by the dispatcher, refusals included: of a route
// that does not match, a fence token or sent_at ahead of the replica's
// clock, so a refused envelope can never execute later; only one older than
// MaxMessageAge, never accepted later, is not claimed). Then:
//
//   - action: refused with a signed 503 connector_host.not_ready (retry
//     after one heartbeat interval) while draining, without a valid lease,
//     when not ready or before the host serves (see below), or a signed
//     429 connector_host.capacity above
//     MaxInFlight, refusals that tell the dispatcher the action did not
//     start here and so are given only for an action ID neither running in
//     this process nor journaled (a delivery of one that is waits for it —
//     at most its own timeout_ms, then a signed 409
//     connector_host.action_in_progress — or is answered from the journal,
//     whatever the replica's state, one routed before the journal's prune
//     horizon, or before the journal served the replica (its replica
//     health revision below the journal's origin: origin.go), gets the
//     signed 410 connector_host.action_expired, and one
//     the journal cannot tell about gets storage_unavailable); with
//     Config.CredentialRevisionPolicyFile, the route's
//     credential_revision_ref is then checked against the policy, read
//     again for every action and cancel: a revision it does not allow gets
//     a signed 403 connector_host.credential_revision_denied, a policy that
//     cannot be read a signed 503 connector_host.credential_revision_unavailable
//     (retry after 1 s), given like the refusals above (message ID claimed,
//     nothing journaled or run, only for an action the journal does not
//     hold) but not proof for a reroute: the dispatcher answers them to its
//     client; the input is validated against the capability's
//     input_schema; the action is journaled, run, and its result journaled
//     with a receipt (ActionResult.Receipt). When the write journaling it
//     fails, the host reads the record back: one journaled by this very
//     message (the write committed and only its answer was lost) is run
//     and answered; otherwise the answer is storage_unavailable (a write
//     the journal cannot tell about even then stays running, never run,
//     until the next start's recovery), and storage is not ready from then
//     on (see Lease and heartbeats). An action ID already journaled
//     returns the journaled result and never runs twice (a different
//     capability, idempotency key or input is another action under the
//     same ID: a signed 409 connector_host.idempotency_conflict); that answer
//     carries the same receipt as the first (the journal's ReceiptFor
//     finds it by action ID). An action whose outcome is unknown (the
//     connector said so, panicked, timed out, gave up when its stream's
//     receiver went away, or a crash interrupted it) is
//     answered with a signed 502 connector_host.outcome_unknown, then and
//     on every delivery — except a read-only capability's (ReadOnly) that
//     the connector's panic, a hang past HandleGrace, a timeout, the
//     shutdown or its stream's receiver going away cut off before the
//     connector said what it did, or whose connector answered
//     ErrOutcomeUnknown: it changed
//     nothing, so it is journaled and answered failed
//     connector_host.interrupted, retryable (Interrupted), as recovery
//     fails a read a restart cut off;
//   - cancel (action-scoped), once the credential revision policy (when
//     configured) allows its route's revision: cancels the running Handle's context, tells a
//     Canceler, and answers the action's journaled result; a cancel that
//     arrives first journals a cancelled record so the action never runs
//     (in two writes; a record the second write failed to finish is
//     finished cancelled by the next delivery of the action or of the
//     cancel);
//   - action_status_query: answers a signed action_status from the journal
//     (not_found when there is no record, pruned when there is none and the
//     action may be older than what was pruned); it works while draining
//     and without a lease.
//
// Before the host serves (step 10), from the end of recovery (step 6) on,
// the native ingress is served by the same code with one difference: no
// action runs. This is the window in which the registration may wait: a
// replica killed and started again at once is refused as lease_live until
// the lease of its previous run expires (up to the lease TTL), a control
// plane that does not answer is waited for (RegisterWait), and meanwhile
// the registry routes new actions to the replica under its previous lease.
// Their connections, accepted by the bound listener, used to wait
// unanswered until the host registered or their timeout ended; now an
// action the journal holds is answered from its record, one routed
// before the prune horizon or the journal's origin gets action_expired,
// a journal that cannot tell gets storage_unavailable, and any other
// action the signed 503 connector_host.not_ready (its message ID claimed
// first), which a dispatcher presents to move the action to another
// replica. Cancels and status queries are answered as when ready. The
// refusal is true because the refused envelope can never run here (its
// message ID is claimed in the durable replay registry before the
// answer, so a replay, early or once the host serves, is refused) and
// because the action did not start here: the host journals every action
// before running it, one journal serves a replica ID at a time (the
// SQLite journal's lock, pgruntime's advisory lock), recovery has settled
// what the previous run left received or running, and an action routed
// while another journal served the replica ID (its route's replica health
// revision below this journal's origin) is refused with action_expired
// instead. A journal without an origin for this replica ID (a new one, a
// lost state directory) proves nothing about any route the registry can
// send before the registration: the host serves nothing early on it, and
// the actions wait as before (answered action_expired once it serves;
// answering that at once would release their reservations while the
// registry goes on routing new actions here, each lost at once too, and
// an unsigned 503 would be settled as an uncertain outcome). Either way,
// /health answers from recovery on (a liveness probe must not kill a
// replica that only waits out its previous lease) and /ready answers 503
// not_ready until the host serves; every other route (/metrics, the
// manifest, the JWKS, product routes) waits until the host serves, as its
// connection waited in the listener's queue before, so no product webhook
// runs before the host serves; after a failed start their connections are
// closed unanswered.
//
// Every answer is a signed envelope in response to the request, except the
// unsigned 400 schema.envelope.invalid and envelope.decode.invalid for a body
// that is not a usable envelope, 413 for an oversized one, the unsigned 401
// connector_host.authentication for a message not signed by the pinned
// dispatcher, and the unsigned 500 connector_host.response_signing. Each
// answer write (a JSON answer, or one NDJSON line of a stream) has a
// deadline of HandleGrace (at least 10 s) plus its size at 256 KiB/s: an answer the
// receiver does not take by then is logged as undelivered and the request
// ends (its action's outcome was journaled first, so a retry or a status
// query gets it), instead of holding the action's in-flight slot, and a
// drain, for ever. The
// 401 is unsigned on purpose: the replica signs nothing in response to a
// message it could not authenticate, so no one can obtain its signed
// refusal of a message ID of their choosing (the dispatcher's own, copied
// with a broken signature) and pass it off as its answer to the real one.
//
// A streaming action (mode streaming) of a Streamer is answered with 200 and
// Content-Type application/x-ndjson: one signed stream_chunk envelope per
// line (sequence 0, 1, 2, ...), then the signed final action_result (or
// error) envelope as the last line. The final result is journaled like a
// synchronous one. Streaming output travels in the response instead of a
// callback endpoint; actions carrying a callback are refused.
//
// The host also serves GET /aip/v1/manifest (the bound manifest), /health,
// /ready (ReadyDocument; the error texts of failing probes and of recovery
// only to loopback peers whose request carries no proxy forwarding
// header, and to none with Config.HideLocalReadyDetail; fixed texts to
// others), /metrics (every metric
// under the prefix aip_connector_host_: the lifecycle guide's eight; the
// event delivery metrics events_delivered_total,
// event_delivery_failures_total, events_refused_total and events_pending;
// the retention metrics journal_actions_pruned_total and
// actions_expired_total; ingress_reads_waiting and abandoned_calls; plus
// the Go runtime's and the process's own, on a registry the host owns) and
// /.well-known/jwks.json.
// Product-owned routes (RouteProvider) share the listener.
//
// # Lease and heartbeats
//
// Lifecycle requests are signed with the replica key; answers must be signed
// by the pinned control-plane DID, answer the request and be fresh. Each
// attempt is bounded by ControlTimeout; after a transport or other ambiguous
// failure the same request is sent once more (the identical bytes, or, when
// the first attempt used up its signed window, the same request ID and
// payload signed with a fresh one). The first heartbeat falls
// uniformly in [0.75·I, 1.25·I], then every I on a fixed grid, skipping
// ticks missed while a beat ran long. Each tick probes storage and connector
// health; an unhealthy host reports connector_ready=false, which takes it
// offline. A connector that can serve but not all of what it fronts
// returns Degraded from CheckHealth: it stays ready, /ready's connector
// detail reads "connector is ready but degraded" (with its detail to
// loopback peers) and the host logs when it becomes degraded and when it
// no longer is. Storage is unhealthy also from the moment an action's own
// journal write (its accept, its outcome, a message claim, an early
// cancel's record) fails for a storage reason, not a conflict or a refused
// record: on a nearly full volume the probe's one small row may fit where
// an action's records do not. Ready, /ready and the next beat say so at
// once, and storage is healthy again only once a probe has also written as
// much as that write, at least 64 KiB (a value in the host's reserved state
// namespace, set back to null after).
//
// A beat that failed for a reason that may pass (ErrControlUnavailable: no
// connection, no answer or none that verifies, the control plane's signed
// 503) is retried before the next tick while the local lease is valid: the
// n-th retry in a row after a delay drawn uniformly in [d/2, d], d doubling
// from 1 s up to I/2, so the replicas of a fleet spread their retries
// over a control plane that is coming back, and a last one 1 s (I/4 when
// less) before the local lease runs out. A retry is the tick's renewal
// again, with the health the host recorded last (no new probe): one
// lifecycle request at a time, none while draining, and none once the
// local lease has run out (the next tick recovers it). A signed refusal
// (a lost fence, a lease the registry ended) is not retried before the
// next tick. One saying that the replica holds no lease at the host's
// sequence there (the sequence or state rule: lease maintenance ended
// the lease, the replica was taken offline, another lifecycle request won
// the fence) ends the local lease at once, whether it answered a fresh
// beat or a replay: Ready is false, /ready answers 503 and new actions
// get the signed connector_host.not_ready (the actions already running
// finish and are journaled), the host logs one warning ("the control
// plane ended the lease") and re-registers at the next tick, as after a
// local expiry — not while draining. Any other refusal, an unsigned
// answer, a 503, a timeout or a lost answer leaves the local lease as
// it is. Each failed attempt, a tick's or a retry's, counts in
// MetricHeartbeatFailures. A replica so keeps its lease through an outage
// that ends 1.5 s or more before its local lease does (for a control
// plane that does not answer, earlier by the two ControlTimeouts each
// attempt then waits): every replica through one shorter than the lease
// TTL less I and those 1.5 s, since the lease each holds when the outage
// begins was renewed up to I earlier.
//
// A heartbeat whose answers were all lost may have been applied
// and moved the lease sequence on, so the next attempt (a retry, a beat,
// or a drain) replays that same request first to learn its outcome,
// instead of losing the fence with a fresh one. It does so also once the local lease has run
// out, before re-registering (unless the control plane answered every
// attempt of it with a signed 503, which applies nothing): the lease that
// beat renewed may still live in the registry, which refuses a
// registration until it ends, and an unhealthy beat it applied ended the
// lease, so a host healthy again registers at once. A drain whose outcome
// is unknown is replayed the same way, at each renewal of the draining
// lease and before the offline transition, and stays pending (never a
// second drain from the same sequence) until the control plane decides
// it. The
// local lease runs on this host's clock: from the moment the request was sent, for what was left of
// the lease when the control plane signed its answer (its expires_at less
// its issued_at), so it ends here no later than the control plane ends it
// whatever the two clocks' offset (the lease /ready shows is this one).
// After the local lease expires (or the control plane ended it), a healthy host re-registers,
// reusing the exact request after an ambiguous failure and a fresh request
// ID after a rejection (or after a replay answering a lease that has
// expired since, which is not counted as a recovery). A registration whose
// answers were lost is also replayed before the drain and offline
// transitions, so a shutdown learns the sequence it may have committed.
//
// # Drain
//
// On SIGTERM or Ctrl-C (ctx cancelled in Run) or Stop, the host performs the
// nine steps documented on its shutdown: draining flag, signed drain (skipped
// without a valid lease, when the registry routes nothing here anyway),
// heartbeats stop, new actions refused and event publication stopped, the
// listener kept while the actions being handled finish (at most
// DrainTimeout; connector calls abandoned after HandleGrace, whose actions
// were journaled and answered outcome_unknown, or failed
// connector_host.interrupted for a read, are not waited for) and
// for at least DrainLinger, so actions routed just before the drain get a
// signed not_ready that a dispatcher may use to reroute them (when the
// drain did not get through, while the lease the control plane granted
// last is valid and the registry may still route actions here: until it
// expires, at most DrainTimeout after the drain step), the actions
// still running then cancelled while their connections are open (each call
// returns, or is abandoned HandleGrace later, and its request journals the
// outcome and writes the signed answer on its connection), graceful HTTP
// shutdown, heartbeat worker stopped (and the event delivery loop, after a
// last pass over the due outbox batches), signed offline, and a
// nil result only when all of it was clean (otherwise a *ShutdownError).
// From the drain to the offline the draining lease is renewed each
// heartbeat interval with another signed drain, so a drain longer than the
// lease keeps the replica draining in the registry (and its running
// actions' reservations held) until it goes offline. A first drain that
// failed with its outcome unknown is replayed at those intervals too, so
// the registry does not go on routing actions here while the host drains.
// A drain (the first, a renewal or a replay) that the control plane
// refuses because the replica holds no lease at its sequence there (the
// sequence or state rule, as for a heartbeat) ends the local lease at
// once: the actions running finish, but nothing is renewed, the listener
// is not held for that lease, no offline is sent and nothing registers
// again; the *ShutdownError's one failure for it says "the control plane
// ended the lease, refusing the drain".
//
// An abandoned call still running when Stop returns is named in the
// *ShutdownError. The host cannot end it (a goroutine cannot be killed):
// it runs until it returns or the process exits, what it returns is
// dropped, its State calls fail with journal.ErrClosed and its
// publications with ErrNotServing.
//
// # Provider events
//
// EventPublisher stores provider events in the journal's durable outbox.
// With Config.EventEndpoint (--event-endpoint) and channels in its
// manifest (without them nothing can be published), the host delivers the
// outbox to the dispatcher's connector-event ingress (aip.EventsPath) from
// the moment it serves until it stops, through the drain: a loop woken by each
// publication, and every 750 to 1250 ms, claims due batches, sends each as
// an aip.discovery.v1.event_stream_response envelope signed with the
// replica key (from the bound agent principal, to the gateway principal,
// security.connector_event with the replica's identity, current lease
// sequence and the batch's channel), and removes the batch once the
// dispatcher's answer verifies against the pinned gateway DID and answers
// the delivery. A batch that fails for a transient reason (no answer,
// connector_event.unavailable or capacity, an answer that does not verify)
// is retried whole after min(1000·2^min(attempts,6), 60000) +
// rand(0..1000) ms; one whose sender the dispatcher refuses
// (connector_event.not_authorized) is retried whole after the maximum,
// logged at error level with its code. A batch of several events the
// dispatcher refuses permanently for its content
// (connector_event.invalid, idempotency_conflict, or a permanent code the
// host does not know) is split in two, so one bad event does not hold
// back its batch-mates: the halves, with the batch's ID plus ".0" and
// ".1", are enqueued before the batch is removed, and are due at once;
// bisecting again isolates a bad event of 100 in 14 more deliveries. A
// crash in the middle of a split loses nothing: the batch is refused and
// split into the same parts again, and an event delivered twice is stored
// once. A batch of one event refused so is never dropped (the cause may be
// fixed, a dispatcher's limit for example) but retried every hour plus up
// to 5 minutes, each refusal counted in aip_connector_host_events_refused_total and
// logged at error level with the batch, the event ID and the dispatcher's
// code and message. The metrics aip_connector_host_events_delivered_total and
// aip_connector_host_event_delivery_failures_total{code} count the outcomes, and the
// gauge aip_connector_host_events_pending is the outbox's batches. Without
// an event endpoint, batches stay in the outbox (counted in /ready), a
// connector whose manifest declares channels gets a startup warning, and
// publication is refused once 10000 batches wait. A manifest declaring a
// channel the fleet's event log cannot store (aip.CheckChannelID: more
// than 256 bytes, a control or invisible formatting character, white
// space at either end) fails the bootstrap's bind_manifest step. Publish
// refuses at once what the fleet's event ingress would refuse (such a
// channel ID, a malformed event ID, a kind or data holding NUL, data that is not an object or holds a number
// beyond a double's range, occurred_at more than aip.MaxEnvelopeSkew
// ahead), so no batch waits that can never go.
// An event the provider may deliver more than once (a retried webhook)
// takes its ID from DeriveEventID, so every copy is stored once. An
// EventSource keeps its polling cursor in EventPublisher.State, the
// journal-backed state store, so a host restarted on the same journal
// resumes from it.
package hostsdk
