package pgregistry

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// Route resolution and settlement run on the data pool, one transaction
// each. Locks are always taken in this order, so concurrent routing,
// settlement, lease expiry and lifecycle batches cannot deadlock:
//
//  1. the per-action advisory lock (pg_advisory_xact_lock on
//     hashtextextended(action_id, 0)), serialising every decision for one
//     action;
//  2. the shared publication lock, for a new route's revision-consistent
//     catalog view;
//  3. one replica row (FOR UPDATE ... SKIP LOCKED for a new route, FOR
//     UPDATE for a retry or a settlement);
//  4. the route row;
//  5. admission counters, one guarded statement per scope in (kind, key)
//     order.
//
// No row lock is held across a round trip to the client: rows are locked
// only by the statements of a transaction's last pipelined batch, the one
// that commits. The hot rows (a few replicas and the admission counters
// of a busy tenant, which every route and settlement updates) are
// therefore held for the server-side execution of one batch, never while
// the registry's process waits to be scheduled or for the network. The
// first batch of a new route takes only the advisory locks and reads; the
// rows it read are re-checked under their locks in the last one.

const (
	// lockRouting takes the action lock, then the shared publication lock
	// (the subquery, volatile, runs first).
	lockRouting = `SELECT pg_advisory_xact_lock_shared($2, $3) FROM (SELECT pg_advisory_xact_lock(hashtextextended($1, 0))) AS action`

	routeColumns = `action_id, capability_id, tenant_id, instance_id, version_id, manifest_digest, replica_id, endpoint,
	peer_principal_id, peer_principal_kind, peer_did, trust_domain, transport_profile, region, zone, capacity_class,
	catalog_revision, binding_policy_revision, credential_revision_ref, quota_policy_ref, replica_health_revision,
	fence_token, admission, assigned_at_ms, reserved, retry, last_settlement`
	// routeReadColumns are routeColumns, the route's counter stripe, its
	// updated_at_ms (every write to a reserved route hands it out: the
	// insert, a reservation again, a Resolve that returns it again, a
	// reroute; so while reserved that is when it was last handed out), its
	// last hand-out and the hand-out that made its reservation. Inserts
	// leave the hand-outs to their defaults (1: the first hand-out).
	routeReadColumns = routeColumns + `, counter_stripe, updated_at_ms, hand_out, reserved_hand_out, scope_stripes`
	selectRoute      = `SELECT ` + routeReadColumns + ` FROM aip_registry.route_assignments WHERE action_id = $1`

	// chainJoins and chainValid express the tenant chain of a binding: the
	// binding is enabled, its instance is the tenant's and enabled, the
	// instance's version is active and implements the capability, its type
	// is enabled, and its admission policy (if it names one) is enabled.
	chainJoins = `FROM aip_registry.capability_bindings b
JOIN aip_registry.connector_instances i ON i.instance_id = b.instance_id
JOIN aip_registry.connector_versions v ON v.version_id = i.version_id
JOIN aip_registry.connector_types t ON t.type_id = v.type_id
LEFT JOIN aip_registry.admission_policies p ON p.policy_ref = b.quota_policy_ref`
	chainValid = `b.tenant_id = $1 AND b.capability_id = $2 AND b.enabled
	AND i.tenant_id = b.tenant_id AND i.status = 'enabled' AND v.status = 'active' AND t.enabled
	AND EXISTS (SELECT 1 FROM aip_registry.version_capabilities vc WHERE vc.version_id = i.version_id AND vc.capability_id = b.capability_id)
	AND (b.quota_policy_ref IS NULL OR p.enabled)`

	// candidateSelect: eligible replicas of valid bindings, in
	// registry.CompareCandidates order, with the catalog revision. $3 now,
	// $4 capacity class ("" = any), $5 forbid cross-region, $6 preferred
	// region, $7 preferred zone, $8 action ID; %s is one more filter.
	candidateSelect = `SELECT (SELECT revision FROM aip_registry.catalog_revision), b.priority, b.policy_revision, b.credential_revision_ref, b.quota_policy_ref, b.scope_key,
	i.type_id, v.manifest_digest,
	p.policy_ref, p.revision, p.enabled, p.max_global_in_flight, p.max_tenant_in_flight, p.max_connector_type_in_flight,
	p.max_instance_in_flight, p.max_binding_in_flight, p.max_tenant_retry_in_flight, p.circuit_failure_threshold, p.circuit_open_ms,
	r.replica_id, r.instance_id, r.version_id, r.endpoint, r.peer_principal_id, r.peer_principal_kind, r.peer_did,
	r.trust_domain, r.transport_profile, r.region, r.zone, r.capacity_class, r.status, r.lease_expires_at_ms, r.capacity,
	r.active_assignments, r.health_revision, r.last_control_request_id, r.last_control_request_digest,
	r.consecutive_failures, r.circuit_open_until_ms, r.offline_reason, r.offline_at_ms
` + chainJoins + `
JOIN aip_registry.connector_replicas r ON r.instance_id = i.instance_id AND r.version_id = i.version_id
WHERE ` + chainValid + `
	AND r.status = 'ready' AND r.lease_expires_at_ms > $3 AND r.active_assignments < r.capacity
	AND r.circuit_open_until_ms <= $3
	AND ($4 = '' OR r.capacity_class = $4)
	AND (NOT $5 OR r.region = $6)
	AND %s
ORDER BY b.priority, (r.region = $6) DESC, (r.zone = $7) DESC, r.active_assignments,
	substring(sha256(convert_to(r.replica_id || $8, 'UTF8')) FROM 1 FOR 8), b.instance_id, r.replica_id`
	firstBinding = `SELECT b.instance_id ` + chainJoins + ` WHERE ` + chainValid + ` ORDER BY b.priority, b.instance_id LIMIT 1`

	incrementReplica = `UPDATE aip_registry.connector_replicas SET active_assignments = active_assignments + 1 WHERE replica_id = $1`

	// reserveScopes is the guarded reservation of a route's admission
	// counters, taken in lock order ($1..$6 are the scopes' kinds, keys,
	// their stripes' shares of their limits, their indexes in the
	// reservation, their stripes and their whole limits, in lock order):
	// each counter is created at 1 or raised only while active < the share,
	// and only while the scope's stripes together hold fewer than its whole
	// limit (stripes filled under a higher limit of the same scope: another
	// policy sharing it, or this one before its limit was lowered). When a
	// scope could not be reserved, scopes_full aborts the transaction naming
	// every such scope, marking those whose stripes together hold their
	// limit (stripeTry.refused).
	reserveScopes = `WITH scope AS (
	SELECT s.*, (SELECT COALESCE(sum(x.active), 0) FROM aip_registry.admission_counters x
		WHERE x.scope_kind = s.kind AND x.scope_key = s.key) AS held
	FROM unnest($1::text[], $2::text[], $3::bigint[], $4::integer[], $5::smallint[], $6::bigint[]) WITH ORDINALITY AS s (kind, key, lim, idx, stripe, total, n)),
reserved AS (
	INSERT INTO aip_registry.admission_counters AS c (scope_kind, scope_key, stripe, active, reserve_limit)
	SELECT kind, key, stripe, 1, lim FROM scope s
	WHERE held < total
	ORDER BY n
	ON CONFLICT (scope_kind, scope_key, stripe) DO UPDATE SET active = c.active + 1, reserve_limit = excluded.reserve_limit
	WHERE c.active < excluded.reserve_limit
	RETURNING c.scope_kind, c.scope_key)
SELECT aip_registry.scopes_full(string_agg(s.idx || CASE WHEN s.held >= s.total THEN '*' ELSE '' END, ',' ORDER BY s.idx))
FROM scope s
WHERE NOT EXISTS (SELECT 1 FROM reserved r WHERE r.scope_kind = s.kind AND r.scope_key = s.key)
HAVING count(*) > 0`
	// releaseScopes releases counters ($1 kinds, $2 keys, $3 amounts, $4
	// stripes, in lock order), locking them in that order first.
	releaseScopes = `WITH scope AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::smallint[]) WITH ORDINALITY AS s (kind, key, amount, stripe, n)),
locked AS (
	SELECT c.scope_kind, c.scope_key, c.stripe, s.amount FROM aip_registry.admission_counters c
	JOIN scope s ON c.scope_kind = s.kind AND c.scope_key = s.key AND c.stripe = s.stripe
	ORDER BY s.n FOR UPDATE OF c)
UPDATE aip_registry.admission_counters c SET active = GREATEST(c.active - locked.amount, 0)
FROM locked WHERE c.scope_kind = locked.scope_kind AND c.scope_key = locked.scope_key AND c.stripe = locked.stripe`

	// reserveRoute re-reserves a released route for a retry, in counter
	// stripes $3 and $5 (stripeColumns), as its next hand-out (which made
	// the reservation), with that hand-out's claim $4; the route was
	// handed out again, so it can no longer be rerouted.
	reserveRoute = `UPDATE aip_registry.route_assignments SET reserved = true, retry = true, last_settlement = NULL,
	resolved_again = true, updated_at_ms = $2, counter_stripe = $3, scope_stripes = $5, hand_out = hand_out + 1, reserved_hand_out = hand_out + 1,
		hand_out_claim = $4::text, claim_hand_out = hand_out + 1
WHERE action_id = $1 AND NOT reserved`
	// markResolvedAgain records that a Resolve returned a reserved route
	// again, at $2, as its next hand-out (sharing the reservation), with
	// that hand-out's claim $3 (NULL: it named none). Every statement that
	// hands a route out records its claim this way, with claim_hand_out
	// the hand-out's number (in an UPDATE every expression reads the row as
	// it was, so hand_out + 1 is the new hand-out); see unsent.go. Lease
	// maintenance releases reservations under the replica and route row
	// locks, not the action lock, so the route the Resolve read as
	// reserved may have been released since: then replica_taken aborts
	// the transaction and the route is read and judged again (a released
	// route is reserved again only if its pinned replica can take it).
	markResolvedAgain = `WITH again AS (
	UPDATE aip_registry.route_assignments SET resolved_again = true, updated_at_ms = $2, hand_out = hand_out + 1,
		hand_out_claim = $3::text, claim_hand_out = hand_out + 1
	WHERE action_id = $1 AND reserved RETURNING 1)
SELECT COALESCE((SELECT 1 FROM again), aip_registry.replica_taken())`

	// lockRouteReplica takes the action lock, then locks the replica of the
	// action's route (the lateral subquery depends on the lock's, so it runs
	// second); settlement
	// takes both before reading the route, so lease expiry (which takes the
	// replica first too) cannot release the route underneath it.
	lockRouteReplica = `SELECT r.consecutive_failures, r.circuit_open_until_ms
FROM (SELECT true AS locked FROM (SELECT pg_advisory_xact_lock(hashtextextended($1, 0))) AS l) AS action,
	LATERAL (SELECT consecutive_failures, circuit_open_until_ms FROM aip_registry.connector_replicas
		WHERE action.locked AND replica_id = (SELECT replica_id FROM aip_registry.route_assignments WHERE action_id = $1)
		FOR UPDATE) AS r`
	// settleRoute releases a reserved route in one statement: the route row,
	// its counters ($4..$6 kinds, keys and amounts in lock order, locked in
	// that order, in their stripes $10) and its replica's count and
	// circuit ($7 replica, $8 failures, $9 open until). The caller holds the
	// action and replica locks, so only the counters need the ordered
	// locking. It serves settleRead, the settlement that compares in Go.
	settleRoute = `WITH route AS (
	UPDATE aip_registry.route_assignments SET reserved = false, last_settlement = $2, updated_at_ms = $3, ` + releasedStripe + `
	WHERE action_id = $1 AND reserved RETURNING 1),
scope AS (
	SELECT * FROM unnest($4::text[], $5::text[], $6::bigint[], $10::smallint[]) WITH ORDINALITY AS s (kind, key, amount, stripe, n)),
locked AS (
	SELECT c.scope_kind, c.scope_key, c.stripe, s.amount FROM aip_registry.admission_counters c
	JOIN scope s ON c.scope_kind = s.kind AND c.scope_key = s.key AND c.stripe = s.stripe
	ORDER BY s.n FOR UPDATE OF c),
released AS (
	UPDATE aip_registry.admission_counters c SET active = GREATEST(c.active - locked.amount, 0)
	FROM locked WHERE c.scope_kind = locked.scope_kind AND c.scope_key = locked.scope_key AND c.stripe = locked.stripe),
replica AS (
	UPDATE aip_registry.connector_replicas
	SET active_assignments = GREATEST(active_assignments - 1, 0), consecutive_failures = $8, circuit_open_until_ms = $9
	WHERE replica_id = $7)
SELECT count(*) FROM route`

	// settleMatching is a settlement in one statement, in lock order: it
	// takes the action lock, locks the replica of the action's route, then
	// releases the route of action $1 as settlement $2 at $3 only if it is
	// reserved, every column of the assignment equals the presented one
	// ($4..$26, in routeColumns order after the action ID) and the
	// presented hand-out $34 settles the reservation
	// (registry.SettlesReservation: zero, or at or after
	// reserved_hand_out); if it did, it
	// decrements the replica's count and applies the circuit rule to it
	// ($31 circuit change, $32 threshold, $33 open until; see
	// circuitChange), then releases the route's counters ($27..$30: kinds,
	// keys and limits in lock order, and whether a scope is held only by a
	// retried reservation; $35 their indexes in the reservation) each in
	// its stripe (routeStripeSQL) with guarded upserts, which lock each counter's newest row in order without
	// re-running the statement's plan for it.
	// It returns the number of routes released (0 or 1). Every row it
	// changes is found under its lock at its newest version, so the
	// statement's snapshot, taken before the locks, decides nothing.
	settleMatching = `WITH action AS (
	SELECT pg_advisory_xact_lock(hashtextextended($1, 0))),
pinned AS (
	SELECT r.replica_id FROM aip_registry.connector_replicas r
	WHERE EXISTS (SELECT 1 FROM action)
		AND r.replica_id = (SELECT replica_id FROM aip_registry.route_assignments WHERE action_id = $1)
	FOR UPDATE OF r),
route AS (
	UPDATE aip_registry.route_assignments SET reserved = false, last_settlement = $2, updated_at_ms = $3, ` + releasedStripe + `
	WHERE action_id = $1 AND reserved AND EXISTS (SELECT 1 FROM pinned)
		AND capability_id = $4 AND tenant_id = $5 AND instance_id = $6
		AND version_id = $7 AND manifest_digest = $8 AND replica_id = $9 AND endpoint = $10
		AND peer_principal_id = $11 AND peer_principal_kind = $12 AND peer_did = $13 AND trust_domain = $14
		AND transport_profile = $15 AND region = $16 AND zone = $17 AND capacity_class = $18
		AND catalog_revision = $19 AND binding_policy_revision = $20
		AND credential_revision_ref IS NOT DISTINCT FROM $21::text AND quota_policy_ref IS NOT DISTINCT FROM $22::text
		AND replica_health_revision = $23 AND fence_token = $24 AND admission = $25::jsonb AND assigned_at_ms = $26
		AND ($34::bigint = 0 OR $34::bigint >= reserved_hand_out)
	RETURNING retry, counter_stripe, scope_stripes),
replica AS (
	UPDATE aip_registry.connector_replicas
	SET active_assignments = GREATEST(active_assignments - 1, 0),
		consecutive_failures = ` + circuitFailures + `,
		circuit_open_until_ms = ` + circuitOpenUntil + `
	WHERE replica_id = $9 AND EXISTS (SELECT 1 FROM route)
	RETURNING 1),
released AS (
	INSERT INTO aip_registry.admission_counters AS c (scope_kind, scope_key, stripe, active, reserve_limit)
	SELECT s.kind, s.key, st.stripe, 0, GREATEST(` + stripeShareSQL + `, 1)
	FROM unnest($27::text[], $28::text[], $29::bigint[], $30::boolean[], $35::integer[]) WITH ORDINALITY AS s (kind, key, lim, retry_only, idx, n)
	JOIN route ON route.retry OR NOT s.retry_only
	CROSS JOIN LATERAL (SELECT ` + routeStripeSQL + ` AS stripe) AS st
	WHERE EXISTS (SELECT 1 FROM replica)
	ORDER BY s.n
	ON CONFLICT (scope_kind, scope_key, stripe) DO UPDATE SET active = GREATEST(c.active - 1, 0)
	RETURNING 1)
SELECT count(*) FROM route`

	// circuitFailures and circuitOpenUntil are the circuit after a
	// settlement ($31 change, $32 threshold, $33 open until) in terms of
	// the stored one: registry.ApplySettlementToCircuit in SQL.
	circuitFailures = `CASE $31::integer WHEN 1 THEN 0
		WHEN 2 THEN LEAST(consecutive_failures + 1, 4294967295) ELSE consecutive_failures END`
	circuitOpenUntil = `CASE $31::integer WHEN 1 THEN 0
		WHEN 2 THEN CASE WHEN LEAST(consecutive_failures + 1, 4294967295) >= $32::bigint
			THEN GREATEST(circuit_open_until_ms, $33::bigint) ELSE circuit_open_until_ms END
		ELSE circuit_open_until_ms END`
)

// maxTakeCandidates bounds the ranked candidates a new route reads and
// then tries, in rank order, in its last batch.
const maxTakeCandidates = 8

// takeAttempts bounds the attempts of a new route whose last batch could
// take none of the candidates it listed (each was locked by another
// transaction, or stopped being eligible, by the time it was tried): each
// attempt reads the candidates again. The first attempt only skips locked
// candidates; the later ones wait for them when all are locked.
const takeAttempts = 3

var (
	// candidates reads, without locking, the best candidates of an action
	// that has no route; rerouteCandidates reads the best one other than
	// the refusing replica ($9); rerouteChosen re-reads the chosen replica
	// ($10) under its row lock, so it returns that replica or nothing.
	candidates        = candidateFor(`NOT EXISTS (SELECT 1 FROM aip_registry.route_assignments x WHERE x.action_id = $8)`) + "\nLIMIT " + strconv.Itoa(maxTakeCandidates)
	rerouteCandidates = candidateFor(`r.replica_id <> $9`) + "\nLIMIT 1"
	rerouteChosen     = candidateFor(`r.replica_id <> $9 AND r.replica_id = $10`) + "\nLIMIT 1"
)

// takeReplica is the last batch's first statement for a new route. Of the
// listed candidates ($1 replica IDs in rank order) it locks the first that
// no other transaction holds and that is still eligible at $2 (ready, lease
// unexpired, a free slot, circuit closed: the rest of the chain is catalog
// state, which the shared publication lock keeps as it was read). Only when
// every one is locked does it wait for them, in rank order, taking the
// first still eligible once released (takeReplicaWaiting only; the caller
// bounds that wait with lock_timeout). It counts the assignment on the
// taken replica and inserts the route from the locked row and the
// binding's decision ($3 action, $4 capability, $5 tenant, $6 manifest
// digest, $7 catalog revision, $8 binding policy revision, $9 credential
// revision, $10 quota policy, $11 fence token, $12 admission, $13 assigned
// at). It returns the taken candidate's position in the list and the
// health revision of the locked row (a heartbeat may have raised it since
// the read); when it took none, replica_taken aborts the transaction.
//
// takeReplica does not wait: when every candidate is locked it takes none.
// takeReplicaWaiting, which a retry uses, waits as described.
var (
	takeReplica = takeSelect(`free AS (` + takeFree + `),
chosen AS (SELECT * FROM free)`)
	takeReplicaWaiting = takeSelect(`free AS (` + takeFree + `),
waited AS (` + takeWaiting + `),
chosen AS (SELECT * FROM free UNION ALL SELECT * FROM waited)`)
)

// takeSelect completes a take statement whose CTEs (ending in chosen)
// select the replica.
func takeSelect(choice string) string {
	return "WITH " + choice + ",\n" + countAndRoute(routeParams{
		action: 3, capability: 4, tenant: 5, manifest: 6, catalogRevision: 7, policyRevision: 8,
		credential: 9, quota: 10, fence: 11, admission: 12, now: 13, stripe: 14, claim: 15, scopeStripes: 16,
	}, "replica_health_revision") + `
SELECT COALESCE((SELECT n FROM chosen), aip_registry.replica_taken()), (SELECT replica_health_revision FROM routed)`
}

// routeParams are the placeholder numbers of a new route's decision in a
// take statement.
type routeParams struct {
	action, capability, tenant, manifest, catalogRevision, policyRevision, credential, quota, fence, admission, now, stripe, claim, scopeStripes int
}

// countAndRoute renders the CTEs every take statement shares: counted
// counts the assignment on the replica CTE chosen locked, and routed
// inserts the route from that row and the decision in the placeholders p
// numbers (with the counter stripes of its reservation and the claim of its
// first hand-out), returning the expression returning.
func countAndRoute(p routeParams, returning string) string {
	return fmt.Sprintf(`counted AS (
	UPDATE aip_registry.connector_replicas r SET active_assignments = r.active_assignments + 1
	FROM chosen WHERE r.replica_id = chosen.replica_id
	RETURNING r.*),
routed AS (
	INSERT INTO aip_registry.route_assignments (%s, updated_at_ms, counter_stripe, hand_out_claim, claim_hand_out, scope_stripes)
	SELECT $%d::text, $%d::text, $%d::text, r.instance_id, r.version_id, $%d::text, r.replica_id, r.endpoint, r.peer_principal_id,
		r.peer_principal_kind, r.peer_did, r.trust_domain, r.transport_profile, r.region, r.zone, r.capacity_class,
		$%d::bigint, $%d::bigint, $%d::text, $%d::text, r.health_revision, $%d::text, $%d::jsonb, $%[12]d::bigint, true, false, NULL, $%[12]d::bigint,
		$%d::smallint, $%d::text, 1, $%d::smallint[]
	FROM counted r
	RETURNING %s)`, routeColumns, p.action, p.capability, p.tenant, p.manifest,
		p.catalogRevision, p.policyRevision, p.credential, p.quota, p.fence, p.admission, p.now, p.stripe, p.claim, p.scopeStripes, returning)
}

// takeChoice selects and locks the first listed candidate still eligible
// (%s: one more filter). takeFree skips locked rows; takeWaiting waits for
// them, and runs only when takeFree (CTE free) found none.
const takeChoice = `SELECT r.replica_id, c.n
	FROM unnest($1::text[]) WITH ORDINALITY AS c (replica_id, n)
	JOIN aip_registry.connector_replicas r ON r.replica_id = c.replica_id
	WHERE r.status = 'ready' AND r.lease_expires_at_ms > $2
		AND r.active_assignments < r.capacity AND r.circuit_open_until_ms <= $2%s
	ORDER BY c.n LIMIT 1
	FOR UPDATE OF r`

var (
	takeFree    = fmt.Sprintf(takeChoice, "") + " SKIP LOCKED"
	takeWaiting = fmt.Sprintf(takeChoice, "\n\t\tAND NOT EXISTS (SELECT 1 FROM free)")
)

// pinnedReplica reads an existing route's replica with the state
// registry.PinnedReplicaUnusable judges: its instance, the route's version
// and that version's type. takePinned re-checks the replica's part under
// its row lock in the last batch.
var pinnedReplica = `SELECT ` + replicaColumnsOf("r") + `,
	i.instance_id, i.type_id, i.version_id, i.tenant_id, i.config_revision, i.secret_provider_ref, i.status,
	v.status, t.enabled
FROM aip_registry.route_assignments a
JOIN aip_registry.connector_replicas r ON r.replica_id = a.replica_id
JOIN aip_registry.connector_instances i ON i.instance_id = r.instance_id
JOIN aip_registry.connector_versions v ON v.version_id = a.version_id
JOIN aip_registry.connector_types t ON t.type_id = v.type_id
WHERE a.action_id = $1`

// takePinned counts a retried route on its pinned replica ($1) if, under
// the row lock, it can still take it at $2 (ready or draining, lease
// unexpired, a free slot, circuit closed); otherwise replica_taken aborts
// the transaction.
const takePinned = `WITH counted AS (
	UPDATE aip_registry.connector_replicas SET active_assignments = active_assignments + 1
	WHERE replica_id = $1 AND status IN ('ready', 'draining') AND lease_expires_at_ms > $2
		AND active_assignments < capacity AND circuit_open_until_ms <= $2
	RETURNING 1)
SELECT COALESCE((SELECT 1 FROM counted), aip_registry.replica_taken())`

// candidateFor builds the candidate query with one more filter.
func candidateFor(filter string) string { return fmt.Sprintf(candidateSelect, filter) }

// isLockTimeout reports a lock_timeout expiry (SQLSTATE 55P03).
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// replicaColumnsOf returns replicaColumns qualified with alias.
func replicaColumnsOf(alias string) string {
	cols := strings.Split(replicaColumns, ",")
	for i, c := range cols {
		cols[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

// storedRoute is a route row: the assignment and its bookkeeping.
type storedRoute struct {
	a        registry.RouteAssignment
	reserved bool
	retry    bool
	last     registry.RouteSettlement
	stripe   int16 // counter_stripe: its reservation's stripe, or -1/-2 (scopeStripes; stripeColumns)
	// scopeStripes are the stripes of its reservation's scopes when they
	// differ (counter_stripe < 0).
	scopeStripes []int16
	updated      time.Time // while reserved: when it was last handed out
	// reservedBy is the hand-out that made the reservation (a.HandOut is
	// the last one).
	reservedBy uint64
}

// stripesOf returns the stripe of each scope of the route's reservation
// (its admission's Scopes(retry)).
func (s *storedRoute) stripesOf() []int16 {
	return stripesOf(s.stripe, s.scopeStripes, len(s.a.Admission.Scopes(s.retry)))
}

// stripesOf returns the stripes of a reservation of n scopes from its
// route's counter_stripe and scope_stripes.
func stripesOf(stripe int16, scopeStripes []int16, n int) []int16 {
	out := make([]int16, n)
	for i := range out {
		switch {
		case stripe >= 0:
			out[i] = stripe
		case i < len(scopeStripes):
			out[i] = scopeStripes[i]
		}
	}
	return out
}

func scanRoute(row pgx.Row) (storedRoute, error) {
	var (
		s                                            storedRoute
		a                                            = &s.a
		kind                                         string
		catRev, polRev, healthRev, assigned, updated int64
		handOut, reservedBy                          int64
		cred, quota, last                            *string
		admission                                    []byte
	)
	err := row.Scan(&a.ActionID, &a.CapabilityID, &a.TenantID, &a.InstanceID, &a.VersionID, &a.ManifestDigest, &a.ReplicaID,
		&a.Endpoint, &a.PeerPrincipalID, &kind, &a.PeerDID, &a.TrustDomain, &a.TransportProfile,
		&a.Topology.Region, &a.Topology.Zone, &a.Topology.CapacityClass, &catRev, &polRev, &cred, &quota, &healthRev,
		&a.FenceToken, &admission, &assigned, &s.reserved, &s.retry, &last, &s.stripe, &updated, &handOut, &reservedBy, &s.scopeStripes)
	if err != nil {
		return s, err
	}
	a.PeerPrincipalKind = aip.PrincipalKind(kind)
	a.CatalogRevision, a.BindingPolicyRevision, a.ReplicaHealthRevision = uint64(catRev), uint64(polRev), uint64(healthRev)
	a.CredentialRevisionRef, a.QuotaPolicyRef = deref(cred), deref(quota)
	a.AssignedAt, s.updated = fromMS(assigned), fromMS(updated)
	a.HandOut, s.reservedBy = uint64(handOut), uint64(reservedBy)
	s.last = registry.RouteSettlement(deref(last))
	if err := json.Unmarshal(admission, &a.Admission); err != nil {
		return s, fmt.Errorf("decode the admission of route %s: %w", a.ActionID, err)
	}
	return s, nil
}

// queueRoute queues the read of an action's route.
func queueRoute(b *pgx.Batch, actionID string, s *storedRoute, found *bool) {
	b.Queue(selectRoute, actionID).QueryRow(func(row pgx.Row) error {
		var err error
		*s, err = scanRoute(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		*found = err == nil
		return err
	})
}

// Resolve implements registry.Resolver. A new route costs two round
// trips and holds no row lock across either: the first batch begins the
// transaction, takes the action and shared publication locks and reads the
// ranked candidates without locking them; the assignment is built from that
// read; the last batch locks the first listed candidate no other
// transaction holds that is still eligible (FOR UPDATE ... SKIP LOCKED,
// re-checked under the lock), counts the assignment on it, inserts
// the route, reserves the admission counters and commits. When it can take
// no candidate it aborts server-side and the route is read and tried
// again, at most takeAttempts times in all; the first attempt only skips
// locked candidates, the later ones wait for them (at most RouteLockWait)
// when all are locked.
func (r *Registry) Resolve(ctx context.Context, req registry.RouteRequest) (registry.RouteAssignment, error) {
	if err := ctx.Err(); err != nil {
		return registry.RouteAssignment{}, err
	}
	if err := req.Validate(); err != nil {
		return registry.RouteAssignment{}, err
	}
	lane, leave, err := r.tenants.enter(ctx, req.TenantID, "resolve action "+req.ActionID)
	if err != nil {
		return registry.RouteAssignment{}, err
	}
	defer leave()
	var out registry.RouteAssignment
	err = striped(r.laneTry(lane), func(st *stripeTry) error {
		var err error
		out, err = r.resolveIn(ctx, &req, st)
		return err
	})
	return out, err
}

// resolveIn is Resolve with its reservation in the stripe st says.
func (r *Registry) resolveIn(ctx context.Context, req *registry.RouteRequest, st *stripeTry) (registry.RouteAssignment, error) {
	var out registry.RouteAssignment
	key := chainKey{req.TenantID, req.CapabilityID}
	ch := r.chains.get(key)
	if ch != nil {
		err := r.inPipe(ctx, r.data, "resolve action "+req.ActionID, func(p *pipe) error {
			var err error
			out, err = r.resolveBest(ctx, p, req, ch, st)
			return err
		})
		switch {
		case err == nil:
			return out, nil
		case !errors.Is(err, errReplicaTaken):
			return registry.RouteAssignment{}, err
		}
	}
	for attempt := 1; ; attempt++ {
		t := take{wait: attempt > 1, last: attempt == takeAttempts, cached: ch, stripes: st}
		err := r.inPipe(ctx, r.data, "resolve action "+req.ActionID, func(p *pipe) error {
			var err error
			out, err = r.resolve(ctx, p, req, t)
			return err
		})
		switch {
		case err == nil:
			return out, nil
		case !errors.Is(err, errReplicaTaken):
			return registry.RouteAssignment{}, err
		}
	}
}

// errReplicaTaken: the last batch of a new route could take none of the
// candidates it listed, or a held route read for a Resolve was released
// before the Resolve marked its hand-out; the route is read and tried
// again.
var errReplicaTaken = errors.New("pgregistry: every listed replica was taken")

// isReplicaTaken reports the abort of replica_taken (SQLSTATE AIP02).
func isReplicaTaken(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "AIP02"
}

// take says how an attempt of Resolve takes its replica: whether it waits
// for locked candidates, whether it is the last attempt, the cached chain
// of the pair, if any (the attempt replaces or drops it), and the stripe
// walk of its reservation.
type take struct {
	wait, last bool
	cached     *routeChain
	stripes    *stripeTry
}

// resolve is one attempt of Resolve in the transaction of p.
func (r *Registry) resolve(ctx context.Context, p *pipe, req *registry.RouteRequest, t take) (registry.RouteAssignment, error) {
	now := r.clock()
	pref := &req.Topology
	var (
		cands []candidate
		best  []bestBinding
	)
	b := &pgx.Batch{}
	b.Queue(lockRouting, req.ActionID, lockClass, lockCatalog)
	b.Queue(candidates, req.TenantID, req.CapabilityID, toMS(now), pref.CapacityClass, pref.ForbidCrossRegion, pref.Region, pref.Zone,
		req.ActionID).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			c, err := scanCandidate(rows)
			if err != nil {
				return err
			}
			cands = append(cands, c)
		}
		return rows.Err()
	})
	queueBestBindings(b, req, &best)
	if err := p.send(ctx, b); err != nil {
		return registry.RouteAssignment{}, err
	}
	if len(cands) > 0 {
		return r.reserveNew(ctx, p, req, cands, best, now, t)
	}
	// The action has a route, or no replica is eligible.
	if t.cached != nil {
		r.chains.drop(chainKey{req.TenantID, req.CapabilityID}, t.cached)
	}
	s, pin, err := r.fallback(ctx, p, req)
	if err != nil {
		return registry.RouteAssignment{}, err
	}
	return r.resume(ctx, p, &s, pin, req, now, t.stripes)
}

// pinned is an existing route's replica as resume judges it.
type pinned struct {
	found       bool
	replica     registry.ConnectorReplica
	instance    registry.ConnectorInstance
	version     registry.ConnectorVersion
	typeEnabled bool
}

// resume returns an existing route, reserving its pinned scopes (plus the
// retry scope) and its pinned replica again when they were released.
func (r *Registry) resume(ctx context.Context, p *pipe, s *storedRoute, pin *pinned, req *registry.RouteRequest, now time.Time, st *stripeTry) (registry.RouteAssignment, error) {
	a := &s.a
	if a.TenantID != req.TenantID || a.CapabilityID != req.CapabilityID {
		return registry.RouteAssignment{}, registry.RouteConflict(a, req)
	}
	// Under the action lock the route read is current: this is its next
	// hand-out.
	next := *a
	next.HandOut++
	if s.reserved {
		b := &pgx.Batch{}
		b.Queue(markResolvedAgain, a.ActionID, toMS(now), nullable(req.Claim))
		if err := p.commit(ctx, b); err != nil {
			if isReplicaTaken(err) {
				return registry.RouteAssignment{}, errReplicaTaken // released meanwhile: read it again
			}
			return registry.RouteAssignment{}, err
		}
		return next, nil
	}
	if !pin.found {
		return registry.RouteAssignment{}, registry.PinnedReplicaUnavailable(a, "the replica's record could not be read with its instance, version and type")
	}
	if why := registry.PinnedReplicaUnusable(&pin.replica, &pin.instance, &pin.version, pin.typeEnabled, now); why != "" {
		return registry.RouteAssignment{}, registry.PinnedReplicaUnavailable(a, why)
	}
	scopes := a.Admission.Scopes(true)
	stripes := st.stripes(scopes)
	stripe, perScope := stripeColumns(stripes)
	b := &pgx.Batch{}
	b.Queue(takePinned, a.ReplicaID, toMS(now))
	queueReserve(b, scopes, stripes)
	b.Queue(reserveRoute, a.ActionID, toMS(now), stripe, nullable(req.Claim), perScope)
	if err := p.commit(ctx, b); err != nil {
		if isReplicaTaken(err) {
			return registry.RouteAssignment{}, registry.PinnedReplicaUnavailable(a,
				"the replica stopped being ready or draining with a valid lease, a free slot and a closed circuit while the retry reserved it")
		}
		return registry.RouteAssignment{}, st.refused(err, scopes, stripes)
	}
	return next, nil
}

// fallback runs when the candidate read returned nothing: the action
// already has a route (the read skips routed actions), or no replica is
// eligible. In one round trip it reads the route with its pinned replica
// and tells a missing binding from a missing replica.
func (r *Registry) fallback(ctx context.Context, p *pipe, req *registry.RouteRequest) (storedRoute, *pinned, error) {
	var (
		s      storedRoute
		routed bool
		pin    pinned
		first  *string
	)
	b := &pgx.Batch{}
	queueRoute(b, req.ActionID, &s, &routed)
	b.Queue(pinnedReplica, req.ActionID).QueryRow(func(row pgx.Row) error {
		var (
			iRev             int64
			iStatus, vStatus string
			err              error
		)
		pin.replica, err = scanReplicaWith(row, &pin.instance.ID, &pin.instance.ConnectorTypeID, &pin.instance.VersionID,
			&pin.instance.TenantID, &iRev, &pin.instance.SecretProviderRef, &iStatus, &vStatus, &pin.typeEnabled)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		pin.instance.ConfigRevision, pin.instance.Status = uint64(iRev), registry.InstanceStatus(iStatus)
		pin.version.Status = registry.VersionStatus(vStatus)
		pin.found = err == nil
		return err
	})
	b.Queue(firstBinding, req.TenantID, req.CapabilityID).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&first)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	if err := p.send(ctx, b); err != nil {
		return s, nil, err
	}
	switch {
	case routed:
		pin.version.ID = s.a.VersionID
		return s, &pin, nil
	case first == nil:
		return s, nil, fmt.Errorf("%w: tenant %s has no usable binding for capability %s",
			registry.ErrBindingUnavailable, req.TenantID, req.CapabilityID)
	}
	return s, nil, fmt.Errorf("%w: no eligible replica for capability %s of tenant %s (first binding: instance %s)",
		registry.ErrReplicaUnavailable, req.CapabilityID, req.TenantID, *first)
}

// reserveNew takes the first of the read candidates of the best binding
// that is still free and eligible, counts the assignment on it, inserts
// the route, reserves every admission scope of the binding's policy and
// commits, in one round trip. All the candidates it lists belong to the
// best candidate's binding, so the admission reservation, the fence token
// and everything else but the replica are decided before the batch goes
// out; the route row takes the replica's columns from the locked row
// (only its health revision may differ from the read: identity columns
// never change).
func (r *Registry) reserveNew(ctx context.Context, p *pipe, req *registry.RouteRequest, cands []candidate, best []bestBinding, now time.Time, t take) (registry.RouteAssignment, error) {
	top := &cands[0]
	same := cands[:0:0]
	for i := range cands {
		if cands[i].replica.InstanceID == top.replica.InstanceID {
			same = append(same, cands[i])
		}
	}
	ids := make([]string, len(same))
	for i := range same {
		ids[i] = same[i].replica.ID
	}
	admission := r.admissionFor(req, top)
	doc, err := encodeAdmission(req.ActionID, &admission)
	if err != nil {
		return registry.RouteAssignment{}, err
	}
	fence := aip.NewID(aip.PrefixRoute)
	stripes := t.stripes.stripes(admission.BaseScopes)
	stripe, perScope := stripeColumns(stripes)
	var n, health int64
	b := &pgx.Batch{}
	sql := takeReplica
	if t.wait {
		sql = takeReplicaWaiting
		b.Queue(fmt.Sprintf("SET LOCAL lock_timeout = %d", r.routeLockWait.Milliseconds()))
	}
	b.Queue(sql, ids, toMS(now), req.ActionID, req.CapabilityID, req.TenantID, top.manifestDigest,
		int64(top.revision), int64(top.binding.PolicyRevision), nullable(top.binding.CredentialRevisionRef),
		nullable(top.binding.QuotaPolicyRef), fence, doc, toMS(now), stripe, nullable(req.Claim), perScope).QueryRow(func(row pgx.Row) error {
		if err := row.Scan(&n, &health); err != nil {
			return err
		}
		if n < 1 || int(n) > len(same) {
			return fmt.Errorf("route take returned candidate %d of %d", n, len(same))
		}
		return nil
	})
	if t.wait {
		b.Queue("SET LOCAL lock_timeout TO DEFAULT")
	}
	queueReserve(b, admission.BaseScopes, stripes)
	if err := p.commit(ctx, b); err != nil {
		switch {
		case isReplicaTaken(err) && t.last:
			return registry.RouteAssignment{}, fmt.Errorf("%w: no eligible replica for capability %s of tenant %s could be taken in %d attempts (instance %s)",
				registry.ErrReplicaUnavailable, req.CapabilityID, req.TenantID, takeAttempts, top.replica.InstanceID)
		case isReplicaTaken(err):
			return registry.RouteAssignment{}, errReplicaTaken
		case isLockTimeout(err):
			return registry.RouteAssignment{}, fmt.Errorf("%w: every eligible replica for capability %s of tenant %s stayed locked by other routing transactions for %s",
				registry.ErrReplicaUnavailable, req.CapabilityID, req.TenantID, r.routeLockWait)
		}
		return registry.RouteAssignment{}, t.stripes.refused(err, admission.BaseScopes, stripes)
	}
	c := &same[n-1]
	c.replica.HealthRevision = uint64(health)
	c.binding.TenantID, c.binding.CapabilityID = req.TenantID, req.CapabilityID
	switch ch := chainOf(best, c, admission, doc); {
	case ch != nil:
		ch.admission.BaseScopes = slices.Clone(admission.BaseScopes)
		r.chains.put(chainKey{req.TenantID, req.CapabilityID}, ch)
	case t.cached != nil:
		r.chains.drop(chainKey{req.TenantID, req.CapabilityID}, t.cached)
	}
	version := registry.ConnectorVersion{ID: c.replica.VersionID, ManifestDigest: top.manifestDigest}
	return registry.NewAssignment(req, &c.binding, &version, &c.replica, top.revision, admission, fence, now), nil
}

// queueReserve queues the guarded reservation of each of scopes in its
// stripe in stripes, in lock order (scopeOrder). Scopes that cannot be
// reserved abort the transaction with SQLSTATE AIP01 naming them;
// stripeTry.refused turns that into the registry error (and has striped
// try other stripes).
func queueReserve(b *pgx.Batch, scopes []registry.AdmissionScope, stripes []int16) {
	if len(scopes) == 0 {
		return
	}
	order := scopeOrder(scopes)
	kinds, keys, limits, idx, ordered, totals := make([]string, len(order)), make([]string, len(order)), make([]int64, len(order)),
		make([]int32, len(order)), make([]int16, len(order)), make([]int64, len(order))
	for n, i := range order {
		kinds[n], keys[n], idx[n], ordered[n], totals[n] = string(scopes[i].Kind), scopes[i].Key, int32(i), stripes[i], int64(scopes[i].Limit)
		limits[n] = stripeLimit(int64(scopes[i].Limit), stripes[i])
	}
	b.Queue(reserveScopes, kinds, keys, limits, idx, ordered, totals)
}

// scopeArrays returns the kinds, keys, amounts (one each) and stripes of
// scopes (each in its stripe in stripes) in lock order, for releaseScopes
// and settleRoute.
func scopeArrays(scopes []registry.AdmissionScope, stripes []int16) (kinds, keys []string, amounts []int64, ordered []int16) {
	order := scopeOrder(scopes)
	kinds, keys, amounts, ordered = make([]string, len(order)), make([]string, len(order)), make([]int64, len(order)), make([]int16, len(order))
	for n, i := range order {
		kinds[n], keys[n], amounts[n], ordered[n] = string(scopes[i].Kind), scopes[i].Key, 1, stripes[i]
	}
	return kinds, keys, amounts, ordered
}

// scopeRank orders scope kinds as a reservation lists them.
var scopeRank = map[registry.AdmissionScopeKind]int{
	registry.ScopeGlobal: 0, registry.ScopeTenant: 1, registry.ScopeConnectorType: 2,
	registry.ScopeInstance: 3, registry.ScopeBinding: 4, registry.ScopeTenantRetry: 5,
}

// compareScopes is the one order every transaction takes counter rows in:
// by kind as a reservation lists them, then by key. Taking them in the
// reservation's own order also makes the first full scope a transaction
// meets the first one the reservation names.
func compareScopes(ak registry.AdmissionScopeKind, akey string, bk registry.AdmissionScopeKind, bkey string) int {
	return cmp.Or(cmp.Compare(scopeRank[ak], scopeRank[bk]), strings.Compare(akey, bkey))
}

// scopeOrder returns the indexes of scopes in lock order.
func scopeOrder(scopes []registry.AdmissionScope) []int {
	idx := make([]int, len(scopes))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(x, y int) int {
		return compareScopes(scopes[x].Kind, scopes[x].Key, scopes[y].Kind, scopes[y].Key)
	})
	return idx
}

// candidate is one row of the candidates query.
type candidate struct {
	revision       uint64
	binding        registry.CapabilityBinding
	scopeKey       string
	typeID         string
	manifestDigest string
	policy         *registry.AdmissionPolicy // nil: the implicit policy
	replica        registry.ConnectorReplica
}

func scanCandidate(row pgx.Row) (candidate, error) {
	var (
		c                                          candidate
		revision, prio, polRev                     int64
		cred, quota                                *string
		pRef                                       *string
		pRev, pGlobal, pTenant, pType, pInst, pBnd *int64
		pRetry, pThreshold, pOpen                  *int64
		pEnabled                                   *bool
	)
	rep, err := scanReplicaPrefixed(row,
		[]any{&revision, &prio, &polRev, &cred, &quota, &c.scopeKey, &c.typeID, &c.manifestDigest,
			&pRef, &pRev, &pEnabled, &pGlobal, &pTenant, &pType, &pInst, &pBnd, &pRetry, &pThreshold, &pOpen})
	if err != nil {
		return c, err
	}
	c.replica, c.revision = rep, uint64(revision)
	c.binding = registry.CapabilityBinding{Priority: uint32(prio), PolicyRevision: uint64(polRev),
		CredentialRevisionRef: deref(cred), QuotaPolicyRef: deref(quota), InstanceID: rep.InstanceID, Enabled: true}
	if pRef != nil {
		c.policy = &registry.AdmissionPolicy{PolicyRef: *pRef, Revision: uint64(*pRev), Enabled: *pEnabled,
			MaxGlobalInFlight: uint32(*pGlobal), MaxTenantInFlight: uint32(*pTenant), MaxConnectorTypeInFlight: uint32(*pType),
			MaxInstanceInFlight: uint32(*pInst), MaxBindingInFlight: uint32(*pBnd), MaxTenantRetryInFlight: uint32(*pRetry),
			CircuitFailureThreshold: uint32(*pThreshold), CircuitOpenMS: uint64(*pOpen)}
	}
	return c, nil
}

// Assignment implements registry.Resolver.
func (r *Registry) Assignment(ctx context.Context, actionID string) (registry.RouteAssignment, error) {
	s, err := readOne(ctx, r, "route of action "+actionID, scanRoute, selectRoute, actionID)
	if err != nil {
		return registry.RouteAssignment{}, err
	}
	return s.a, nil
}

// Reservation implements registry.Resolver.
func (r *Registry) Reservation(ctx context.Context, actionID string) (registry.RouteReservation, error) {
	s, err := readOne(ctx, r, "route of action "+actionID, scanRoute, selectRoute, actionID)
	if err != nil {
		return registry.RouteReservation{}, err
	}
	return reservationOf(&s), nil
}

func reservationOf(s *storedRoute) registry.RouteReservation {
	res := registry.RouteReservation{ActionID: s.a.ActionID, ReplicaID: s.a.ReplicaID, AssignedAt: s.a.AssignedAt, Reserved: s.reserved,
		LastSettlement: s.last, Scopes: []registry.AdmissionScope{}, HandOut: s.a.HandOut}
	if s.reserved {
		res.HandedOutAt = s.updated
		res.Retry = s.retry
		res.Scopes = slices.Clone(s.a.Admission.Scopes(s.retry))
	}
	return res
}

// Settle implements registry.Resolver. It costs one round trip: one
// statement, run as its own transaction, that takes the action and replica
// locks and releases the route only if it is still reserved, equal, column
// by column, to the presented assignment, and reserved by the presented
// hand-out or an earlier one it shares (with its replica's count, the
// circuit rule applied to the stored circuit, and its counters). When
// nothing was released, a read of the route tells a missing route, a lost
// fence, a repeated settlement and a late one of an earlier hand-out
// apart.
func (r *Registry) Settle(ctx context.Context, a registry.RouteAssignment, outcome registry.RouteSettlement) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := outcome.Check(); err != nil {
		return err
	}
	if !assignmentStorable(&a) {
		return unstorableAssignment(ctx, r, &a, registry.SettleFenceLost)
	}
	adm := a.Admission
	if adm.BaseScopes == nil {
		adm.BaseScopes = []registry.AdmissionScope{} // stored as [], and equal to it
	}
	doc, err := encodeAdmission(a.ActionID, &adm)
	if err != nil {
		return err
	}
	assigned := toMS(a.AssignedAt)
	if !fromMS(assigned).Equal(a.AssignedAt) {
		assigned = -1 // not a stored time: matches no route
	}
	kinds, keys, limits, retryOnly, idx := settleScopes(&a.Admission)
	_, leave, err := r.tenants.enter(ctx, a.TenantID, "settle action "+a.ActionID)
	if err != nil {
		return err
	}
	defer leave()
	var released int64
	err = r.inPipe(ctx, r.data, "settle action "+a.ActionID, func(p *pipe) error {
		now := r.clock()
		mode, threshold, until := circuitChange(outcome, &a.Admission, now)
		b := &pgx.Batch{}
		b.Queue(settleMatching, a.ActionID, string(outcome), toMS(now),
			a.CapabilityID, a.TenantID, a.InstanceID, a.VersionID, a.ManifestDigest, a.ReplicaID, a.Endpoint,
			a.PeerPrincipalID, string(a.PeerPrincipalKind), a.PeerDID, a.TrustDomain, a.TransportProfile,
			a.Topology.Region, a.Topology.Zone, a.Topology.CapacityClass, int64(a.CatalogRevision), int64(a.BindingPolicyRevision),
			nullable(a.CredentialRevisionRef), nullable(a.QuotaPolicyRef), int64(a.ReplicaHealthRevision), a.FenceToken, doc, assigned,
			kinds, keys, limits, retryOnly, mode, threshold, until, int64(a.HandOut), idx).QueryRow(func(row pgx.Row) error { return row.Scan(&released) })
		return p.once(ctx, b)
	})
	if err != nil || released == 1 {
		return err
	}
	s, err := readOne(ctx, r, "route of action "+a.ActionID, scanRoute, selectRoute, a.ActionID)
	switch {
	case err != nil:
		return err
	case !s.a.Equal(&a):
		return registry.SettleFenceLost(&a)
	case !s.reserved:
		return nil // released before (settled, or its lease expired): nothing to do
	case !registry.SettlesReservation(a.HandOut, s.reservedBy):
		return nil // a late settlement of an earlier hand-out: not this reservation's
	}
	// Reserved and equal, yet the statement's comparison did not match:
	// settle with the comparison in Go.
	return r.settleRead(ctx, a, outcome, 0)
}

var _ registry.OrphanSettler = (*Registry)(nil)

// assignmentStorable reports whether every string of a presented
// assignment is storable: only such an assignment can equal a stored one.
func assignmentStorable(a *registry.RouteAssignment) bool {
	for _, s := range []string{a.ActionID, a.CapabilityID, a.TenantID, a.InstanceID, a.VersionID, a.ManifestDigest,
		a.ReplicaID, a.Endpoint, a.PeerPrincipalID, string(a.PeerPrincipalKind), a.PeerDID, a.TrustDomain, a.TransportProfile,
		a.Topology.Region, a.Topology.Zone, a.Topology.CapacityClass, a.CredentialRevisionRef, a.QuotaPolicyRef,
		a.FenceToken, a.Admission.PolicyRef} {
		if !storable(s) {
			return false
		}
	}
	for _, sc := range a.Admission.Scopes(true) {
		if !storable(string(sc.Kind)) || !storable(sc.Key) {
			return false
		}
	}
	return true
}

// unstorableAssignment answers a settlement or reroute presenting an
// assignment that is not storable, so equals no stored one, as memregistry
// does: ErrNotFound when the action has no route, else fenceLost's error.
func unstorableAssignment(ctx context.Context, r *Registry, a *registry.RouteAssignment, fenceLost func(*registry.RouteAssignment) error) error {
	if _, err := r.Assignment(ctx, a.ActionID); err != nil {
		return err
	}
	return fenceLost(a)
}

// SettleOrphan implements registry.OrphanSettler. It is rare (dispatch's
// reconciliation), so it takes settleRead's path: the action and replica
// locks, a read of the route, the comparisons in Go, then the release.
// The action lock orders it with every Resolve of the action, so a
// handout either happened before its read or waits for its commit.
func (r *Registry) SettleOrphan(ctx context.Context, a registry.RouteAssignment, outcome registry.RouteSettlement, handOut uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := outcome.Check(); err != nil {
		return err
	}
	if err := registry.CheckOrphanHandOut(a.ActionID, handOut); err != nil {
		return err
	}
	if !storable(a.ActionID) {
		return registry.RouteNotFound(a.ActionID)
	}
	_, leave, err := r.tenants.enter(ctx, a.TenantID, "settle orphaned action "+a.ActionID)
	if err != nil {
		return err
	}
	defer leave()
	return r.settleRead(ctx, a, outcome, handOut)
}

// settleScopes returns every scope a's admission may hold, in lock order:
// kinds, keys, limits, whether the scope is held only by a retried
// reservation (the retry scope) and its index in the reservation.
func settleScopes(a *registry.AdmissionReservation) (kinds, keys []string, limits []int64, retryOnly []bool, idx []int32) {
	scopes := a.Scopes(true)
	order := scopeOrder(scopes)
	kinds, keys, limits, retryOnly, idx = make([]string, len(order)), make([]string, len(order)), make([]int64, len(order)), make([]bool, len(order)), make([]int32, len(order))
	for n, i := range order {
		kinds[n], keys[n], limits[n], retryOnly[n], idx[n] = string(scopes[i].Kind), scopes[i].Key, int64(scopes[i].Limit), i >= len(a.BaseScopes), int32(i)
	}
	return kinds, keys, limits, retryOnly, idx
}

// Circuit changes of a settlement, as settleMatching applies them to the
// stored circuit.
const (
	circuitKeep  int32 = 0 // cancelled, lease_expired, pruned, or no circuit policy
	circuitReset int32 = 1 // completed
	circuitFail  int32 = 2 // outcome_unknown: count a failure, open at the threshold
)

// circuitChange is registry.ApplySettlementToCircuit as settleMatching
// applies it in SQL, where the stored circuit is known: the change, the
// threshold and the open-until time a failure that reaches the threshold
// sets (the circuit is never shortened).
func circuitChange(outcome registry.RouteSettlement, a *registry.AdmissionReservation, now time.Time) (mode int32, threshold, until int64) {
	switch {
	case outcome == registry.SettlementCompleted:
		return circuitReset, 0, 0
	case outcome == registry.SettlementOutcomeUnknown && a.CircuitFailureThreshold > 0:
		return circuitFail, int64(a.CircuitFailureThreshold), toMS(registry.Millis(now.Add(time.Duration(a.CircuitOpenMS) * time.Millisecond)))
	}
	return circuitKeep, 0, 0
}

// settleRead is the settlement that reads the route under its locks and
// compares it in Go before releasing it: two round trips, the second
// holding the replica lock taken in the first. Settle falls back to it only
// if its statement's comparison and Go's disagree (orphanSeen zero: a's
// hand-out must settle the reservation); SettleOrphan uses it with the
// hand-out its caller read as orphanSeen, releasing nothing if the route
// was handed out after that.
func (r *Registry) settleRead(ctx context.Context, a registry.RouteAssignment, outcome registry.RouteSettlement, orphanSeen uint64) error {
	return r.inPipe(ctx, r.data, "settle action "+a.ActionID, func(p *pipe) error {
		var (
			s                storedRoute
			found            bool
			failures, openMS int64
		)
		b := &pgx.Batch{}
		b.Queue(lockRouteReplica, a.ActionID).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&failures, &openMS)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		})
		queueRoute(b, a.ActionID, &s, &found)
		if err := p.send(ctx, b); err != nil {
			return err
		}
		if !found {
			return registry.RouteNotFound(a.ActionID)
		}
		if !s.a.Equal(&a) {
			return registry.SettleFenceLost(&a)
		}
		if !s.reserved {
			return nil // released before (settled, or its lease expired): nothing to do
		}
		switch {
		case orphanSeen != 0 && s.a.HandOut != orphanSeen:
			return registry.HandedOutAgain(a.ActionID, orphanSeen, s.a.HandOut)
		case orphanSeen == 0 && !registry.SettlesReservation(a.HandOut, s.reservedBy):
			return nil // a late settlement of an earlier hand-out: not this reservation's
		}
		now := r.clock()
		circuit := registry.ApplySettlementToCircuit(registry.CircuitState{ConsecutiveFailures: uint32(failures), OpenUntil: fromMS(openMS)},
			outcome, &s.a.Admission, now)
		kinds, keys, amounts, stripes := scopeArrays(s.a.Admission.Scopes(s.retry), s.stripesOf())
		b = &pgx.Batch{}
		b.Queue(settleRoute, a.ActionID, string(outcome), toMS(now), kinds, keys, amounts,
			s.a.ReplicaID, int64(circuit.ConsecutiveFailures), toMS(circuit.OpenUntil), stripes)
		return p.commit(ctx, b)
	})
}

// scanReplicaWith scans a row of replica columns followed by extra columns.
func scanReplicaWith(row pgx.Row, extra ...any) (registry.ConnectorReplica, error) {
	return scanReplicaRow(row, nil, extra)
}

// scanReplicaPrefixed scans a row of leading columns followed by replica
// columns.
func scanReplicaPrefixed(row pgx.Row, lead []any) (registry.ConnectorReplica, error) {
	return scanReplicaRow(row, lead, nil)
}
