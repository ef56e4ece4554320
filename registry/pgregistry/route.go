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

const (
	// lockRouting takes the action lock, then the shared publication lock
	// (the subquery, volatile, runs first).
	lockRouting = `SELECT pg_advisory_xact_lock_shared($2, $3) FROM (SELECT pg_advisory_xact_lock(hashtextextended($1, 0))) AS action`

	routeColumns = `action_id, capability_id, tenant_id, instance_id, version_id, manifest_digest, replica_id, endpoint,
	peer_principal_id, peer_principal_kind, peer_did, trust_domain, transport_profile, region, zone, capacity_class,
	catalog_revision, binding_policy_revision, credential_revision_ref, quota_policy_ref, replica_health_revision,
	fence_token, admission, assigned_at_ms, reserved, retry, last_settlement`
	selectRoute = `SELECT ` + routeColumns + ` FROM aip_registry.route_assignments WHERE action_id = $1`
	insertRoute = `INSERT INTO aip_registry.route_assignments (` + routeColumns + `, updated_at_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, true, false, NULL, $24)`

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

	// candidates: eligible replicas of valid bindings, in
	// registry.CompareCandidates order, with the catalog revision. $3 now, $4 capacity class ("" =
	// any), $5 forbid cross-region, $6 preferred region, $7 preferred zone,
	// $8 action ID.
	candidateSelect = `SELECT (SELECT revision FROM aip_registry.catalog_revision), b.priority, b.policy_revision, b.credential_revision_ref, b.quota_policy_ref, b.scope_key,
	i.type_id, v.manifest_digest,
	p.policy_ref, p.revision, p.enabled, p.max_global_in_flight, p.max_tenant_in_flight, p.max_connector_type_in_flight,
	p.max_instance_in_flight, p.max_binding_in_flight, p.max_tenant_retry_in_flight, p.circuit_failure_threshold, p.circuit_open_ms,
	r.replica_id, r.instance_id, r.version_id, r.endpoint, r.peer_principal_id, r.peer_principal_kind, r.peer_did,
	r.trust_domain, r.transport_profile, r.region, r.zone, r.capacity_class, r.status, r.lease_expires_at_ms, r.capacity,
	r.active_assignments, r.health_revision, r.last_control_request_id, r.last_control_request_digest,
	r.consecutive_failures, r.circuit_open_until_ms
` + chainJoins + `
JOIN aip_registry.connector_replicas r ON r.instance_id = i.instance_id AND r.version_id = i.version_id
WHERE ` + chainValid + `
	AND r.status = 'ready' AND r.lease_expires_at_ms > $3 AND r.active_assignments < r.capacity
	AND r.circuit_open_until_ms <= $3
	AND ($4 = '' OR r.capacity_class = $4)
	AND (NOT $5 OR r.region = $6)
	AND %s
ORDER BY b.priority, (r.region = $6) DESC, (r.zone = $7) DESC, r.active_assignments,
	substring(sha256(convert_to(r.replica_id || $8, 'UTF8')) FROM 1 FOR 8), b.instance_id, r.replica_id
LIMIT 1`
	firstBinding = `SELECT b.instance_id ` + chainJoins + ` WHERE ` + chainValid + ` ORDER BY b.priority, b.instance_id LIMIT 1`

	incrementReplica = `UPDATE aip_registry.connector_replicas SET active_assignments = active_assignments + 1 WHERE replica_id = $1`

	// reserveScopes is the guarded reservation of a route's admission
	// counters, taken in lock order ($1..$4 are the scopes' kinds, keys,
	// limits and indexes in the reservation, in lock order): each counter is
	// created at 1 or raised only while active < limit. When a scope is
	// full, scope_full aborts the transaction naming the first full scope.
	reserveScopes = `WITH scope AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::integer[]) WITH ORDINALITY AS s (kind, key, lim, idx, n)),
reserved AS (
	INSERT INTO aip_registry.admission_counters AS c (scope_kind, scope_key, active, reserve_limit)
	SELECT kind, key, 1, lim FROM scope ORDER BY n
	ON CONFLICT (scope_kind, scope_key) DO UPDATE SET active = c.active + 1, reserve_limit = excluded.reserve_limit
	WHERE c.active < excluded.reserve_limit
	RETURNING c.scope_kind, c.scope_key)
SELECT aip_registry.scope_full(s.idx) FROM scope s
WHERE NOT EXISTS (SELECT 1 FROM reserved r WHERE r.scope_kind = s.kind AND r.scope_key = s.key)
ORDER BY s.n LIMIT 1`
	// releaseScopes releases counters ($1 kinds, $2 keys, $3 amounts, in
	// lock order), locking them in that order first.
	releaseScopes = `WITH scope AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY AS s (kind, key, amount, n)),
locked AS (
	SELECT c.scope_kind, c.scope_key, s.amount FROM aip_registry.admission_counters c
	JOIN scope s ON c.scope_kind = s.kind AND c.scope_key = s.key
	ORDER BY s.n FOR UPDATE OF c)
UPDATE aip_registry.admission_counters c SET active = GREATEST(c.active - locked.amount, 0)
FROM locked WHERE c.scope_kind = locked.scope_kind AND c.scope_key = locked.scope_key`

	// reserveRoute re-reserves a released route for a retry; the route was
	// handed out again, so it can no longer be rerouted.
	reserveRoute = `UPDATE aip_registry.route_assignments SET reserved = true, retry = true, last_settlement = NULL,
	resolved_again = true, updated_at_ms = $2
WHERE action_id = $1 AND NOT reserved`
	// markResolvedAgain records that a Resolve returned a reserved route
	// again.
	markResolvedAgain = `UPDATE aip_registry.route_assignments SET resolved_again = true WHERE action_id = $1 AND NOT resolved_again`

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
	// that order) and its replica's count and circuit ($7 replica, $8
	// failures, $9 open until). The caller holds the action and replica
	// locks, so only the counters need the ordered locking.
	settleRoute = `WITH route AS (
	UPDATE aip_registry.route_assignments SET reserved = false, last_settlement = $2, updated_at_ms = $3
	WHERE action_id = $1 AND reserved RETURNING 1),
scope AS (
	SELECT * FROM unnest($4::text[], $5::text[], $6::bigint[]) WITH ORDINALITY AS s (kind, key, amount, n)),
locked AS (
	SELECT c.scope_kind, c.scope_key, s.amount FROM aip_registry.admission_counters c
	JOIN scope s ON c.scope_kind = s.kind AND c.scope_key = s.key
	ORDER BY s.n FOR UPDATE OF c),
released AS (
	UPDATE aip_registry.admission_counters c SET active = GREATEST(c.active - locked.amount, 0)
	FROM locked WHERE c.scope_kind = locked.scope_kind AND c.scope_key = locked.scope_key),
replica AS (
	UPDATE aip_registry.connector_replicas
	SET active_assignments = GREATEST(active_assignments - 1, 0), consecutive_failures = $8, circuit_open_until_ms = $9
	WHERE replica_id = $7)
SELECT count(*) FROM route`
)

var (
	// candidates excludes actions that have a route; rerouteCandidates
	// excludes the refusing replica ($9) instead.
	candidates        = candidateFor(`NOT EXISTS (SELECT 1 FROM aip_registry.route_assignments x WHERE x.action_id = $8)`)
	rerouteCandidates = candidateFor(`r.replica_id <> $9`)
	// takeCandidate locks the first candidate no other transaction holds
	// and counts the new assignment on it; takeCandidateWait waits for the
	// first candidate instead (its eligibility is re-checked once it is
	// released). Neither selects anything for an action that has a route.
	takeCandidate     = `WITH chosen AS (` + candidates + ` FOR UPDATE OF r SKIP LOCKED),` + countAssignment
	takeCandidateWait = `WITH chosen AS (` + candidates + ` FOR UPDATE OF r),` + countAssignment
	countAssignment   = `
counted AS (UPDATE aip_registry.connector_replicas r SET active_assignments = r.active_assignments + 1
	FROM chosen WHERE r.replica_id = chosen.replica_id)
SELECT * FROM chosen`
)

// pinnedReplica locks an existing route's replica with the state
// registry.PinnedReplicaUsable judges: its instance, the route's
// version and that version's type.
var pinnedReplica = `SELECT ` + replicaColumnsOf("r") + `,
	i.instance_id, i.type_id, i.version_id, i.tenant_id, i.config_revision, i.secret_provider_ref, i.status,
	v.status, t.enabled
FROM aip_registry.connector_replicas r
JOIN aip_registry.connector_instances i ON i.instance_id = r.instance_id
JOIN aip_registry.connector_versions v ON v.version_id = $2
JOIN aip_registry.connector_types t ON t.type_id = v.type_id
WHERE r.replica_id = $1
FOR UPDATE OF r`

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
}

func scanRoute(row pgx.Row) (storedRoute, error) {
	var (
		s                                   storedRoute
		a                                   = &s.a
		kind                                string
		catRev, polRev, healthRev, assigned int64
		cred, quota, last                   *string
		admission                           []byte
	)
	err := row.Scan(&a.ActionID, &a.CapabilityID, &a.TenantID, &a.InstanceID, &a.VersionID, &a.ManifestDigest, &a.ReplicaID,
		&a.Endpoint, &a.PeerPrincipalID, &kind, &a.PeerDID, &a.TrustDomain, &a.TransportProfile,
		&a.Topology.Region, &a.Topology.Zone, &a.Topology.CapacityClass, &catRev, &polRev, &cred, &quota, &healthRev,
		&a.FenceToken, &admission, &assigned, &s.reserved, &s.retry, &last)
	if err != nil {
		return s, err
	}
	a.PeerPrincipalKind = aip.PrincipalKind(kind)
	a.CatalogRevision, a.BindingPolicyRevision, a.ReplicaHealthRevision = uint64(catRev), uint64(polRev), uint64(healthRev)
	a.CredentialRevisionRef, a.QuotaPolicyRef = deref(cred), deref(quota)
	a.AssignedAt = fromMS(assigned)
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

// Resolve implements registry.Resolver. A new route costs two round trips:
// the action lock, the route lookup, the publication lock, the revision and
// the replica selection (FOR UPDATE SKIP LOCKED) go out in the batch that
// begins the transaction; the replica increment, the guarded counter
// reservations, the route insert and COMMIT in the second.
func (r *Registry) Resolve(ctx context.Context, req registry.RouteRequest) (registry.RouteAssignment, error) {
	if err := ctx.Err(); err != nil {
		return registry.RouteAssignment{}, err
	}
	if err := req.Validate(); err != nil {
		return registry.RouteAssignment{}, err
	}
	var out registry.RouteAssignment
	err := r.inPipe(ctx, r.data, "resolve action "+req.ActionID, func(p *pipe) error {
		now := r.clock()
		pref := &req.Topology
		args := []any{req.TenantID, req.CapabilityID, toMS(now), pref.CapacityClass, pref.ForbidCrossRegion, pref.Region, pref.Zone, req.ActionID}
		var (
			s             storedRoute
			routed, found bool
			c             candidate
		)
		b := &pgx.Batch{}
		b.Queue(lockRouting, req.ActionID, lockClass, lockCatalog)
		b.Queue(takeCandidate, args...).QueryRow(func(row pgx.Row) error {
			var err error
			c, err = scanCandidate(row)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			found = err == nil
			return err
		})
		if err := p.send(ctx, b); err != nil {
			return err
		}
		var err error
		if !found {
			// The action has a route, or nothing was lockable.
			if routed, c, err = r.fallback(ctx, p, &req, args, &s); err != nil {
				return err
			}
		}
		if routed {
			out, err = r.resume(ctx, p, &s, &req, now)
		} else {
			out, err = r.reserveNew(ctx, p, &req, &c, now)
		}
		return err
	})
	if err != nil {
		return registry.RouteAssignment{}, err
	}
	return out, nil
}

// resume returns an existing route, reserving its pinned scopes (plus the
// retry scope) and its pinned replica again when they were released.
func (r *Registry) resume(ctx context.Context, p *pipe, s *storedRoute, req *registry.RouteRequest, now time.Time) (registry.RouteAssignment, error) {
	a := &s.a
	if a.TenantID != req.TenantID || a.CapabilityID != req.CapabilityID {
		return registry.RouteAssignment{}, registry.RouteConflict(a, req)
	}
	if s.reserved {
		b := &pgx.Batch{}
		b.Queue(markResolvedAgain, a.ActionID)
		if err := p.commit(ctx, b); err != nil {
			return registry.RouteAssignment{}, err
		}
		return *a, nil
	}
	var (
		rep         registry.ConnectorReplica
		inst        registry.ConnectorInstance
		iRev        int64
		iStatus     string
		vStatus     string
		typeEnabled bool
		pinned      bool
	)
	b := &pgx.Batch{}
	b.Queue(pinnedReplica, a.ReplicaID, a.VersionID).QueryRow(func(row pgx.Row) error {
		var err error
		rep, err = scanReplicaWith(row, &inst.ID, &inst.ConnectorTypeID, &inst.VersionID, &inst.TenantID, &iRev,
			&inst.SecretProviderRef, &iStatus, &vStatus, &typeEnabled)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		pinned = err == nil
		return err
	})
	if err := p.send(ctx, b); err != nil {
		return registry.RouteAssignment{}, err
	}
	inst.ConfigRevision, inst.Status = uint64(iRev), registry.InstanceStatus(iStatus)
	v := registry.ConnectorVersion{ID: a.VersionID, Status: registry.VersionStatus(vStatus)}
	if !pinned || !registry.PinnedReplicaUsable(&rep, &inst, &v, typeEnabled, now) {
		return registry.RouteAssignment{}, fmt.Errorf("%w: action %s is pinned to replica %s of instance %s, which cannot take it now; it is never rerouted",
			registry.ErrReplicaUnavailable, a.ActionID, a.ReplicaID, a.InstanceID)
	}
	scopes := a.Admission.Scopes(true)
	b = &pgx.Batch{}
	b.Queue(incrementReplica, a.ReplicaID)
	queueReserve(b, scopes)
	b.Queue(reserveRoute, a.ActionID, toMS(now))
	if err := p.commit(ctx, b); err != nil {
		return registry.RouteAssignment{}, scopeFull(err, scopes)
	}
	return *a, nil
}

// fallback runs when the selection returned nothing: the action already
// has a route (the selection skips routed actions), or no candidate was
// lockable. In one round trip it reads the route and tells a missing
// binding from a missing replica; when eligible replicas exist but other
// routing transactions hold them, it waits (at most RouteLockWait) for the
// best one and takes it if it is still eligible once released.
func (r *Registry) fallback(ctx context.Context, p *pipe, req *registry.RouteRequest, args []any, s *storedRoute) (routed bool, c candidate, err error) {
	var (
		first *string
		found bool
	)
	b := &pgx.Batch{}
	queueRoute(b, req.ActionID, s, &routed)
	b.Queue(firstBinding, req.TenantID, req.CapabilityID).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&first)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	b.Queue(fmt.Sprintf("SET LOCAL lock_timeout = %d", r.routeLockWait.Milliseconds()))
	b.Queue(takeCandidateWait, args...).QueryRow(func(row pgx.Row) error {
		var err error
		c, err = scanCandidate(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		found = err == nil
		return err
	})
	b.Queue("SET LOCAL lock_timeout = 0")
	err = p.send(ctx, b)
	switch {
	case routed && err == nil:
		return true, c, nil
	case first == nil && err == nil:
		return false, c, fmt.Errorf("%w: tenant %s has no usable binding for capability %s",
			registry.ErrBindingUnavailable, req.TenantID, req.CapabilityID)
	case isLockTimeout(err):
		return false, c, fmt.Errorf("%w: every eligible replica for capability %s of tenant %s stayed locked by other routing transactions for %s",
			registry.ErrReplicaUnavailable, req.CapabilityID, req.TenantID, r.routeLockWait)
	case err != nil:
		return false, c, err
	case !found:
		return false, c, fmt.Errorf("%w: no eligible replica for capability %s of tenant %s (first binding: instance %s)",
			registry.ErrReplicaUnavailable, req.CapabilityID, req.TenantID, *first)
	}
	return false, c, nil
}

// reserveNew reserves the locked candidate and every admission scope of its
// binding's policy, inserts the route and commits, in one round trip.
func (r *Registry) reserveNew(ctx context.Context, p *pipe, req *registry.RouteRequest, c *candidate, now time.Time) (registry.RouteAssignment, error) {
	c.binding.TenantID, c.binding.CapabilityID = req.TenantID, req.CapabilityID
	pol := &r.implicit
	if c.policy != nil {
		pol = c.policy
	}
	admission := registry.NewReservation(pol, &c.binding, c.typeID, c.scopeKey)
	version := registry.ConnectorVersion{ID: c.replica.VersionID, ManifestDigest: c.manifestDigest}
	a := registry.NewAssignment(req, &c.binding, &version, &c.replica, c.revision, admission, aip.NewID(aip.PrefixRoute), now)
	doc, err := json.Marshal(a.Admission)
	if err != nil {
		return registry.RouteAssignment{}, fmt.Errorf("%w: encode the admission of %s: %v", registry.ErrInvalid, a.ActionID, err)
	}
	b := &pgx.Batch{}
	queueReserve(b, admission.BaseScopes)
	b.Queue(insertRoute, a.ActionID, a.CapabilityID, a.TenantID, a.InstanceID, a.VersionID, a.ManifestDigest, a.ReplicaID,
		a.Endpoint, a.PeerPrincipalID, string(a.PeerPrincipalKind), a.PeerDID, a.TrustDomain, a.TransportProfile,
		a.Topology.Region, a.Topology.Zone, a.Topology.CapacityClass, int64(a.CatalogRevision), int64(a.BindingPolicyRevision),
		nullable(a.CredentialRevisionRef), nullable(a.QuotaPolicyRef), int64(a.ReplicaHealthRevision), a.FenceToken, doc,
		toMS(a.AssignedAt))
	if err := p.commit(ctx, b); err != nil {
		return registry.RouteAssignment{}, scopeFull(err, admission.BaseScopes)
	}
	return a, nil
}

// queueReserve queues the guarded reservation of scopes in lock order
// (scopeOrder). A full scope aborts the transaction with SQLSTATE AIP01
// carrying the scope's index; scopeFull turns that into the registry error.
func queueReserve(b *pgx.Batch, scopes []registry.AdmissionScope) {
	if len(scopes) == 0 {
		return
	}
	order := scopeOrder(scopes)
	kinds, keys, limits, idx := make([]string, len(order)), make([]string, len(order)), make([]int64, len(order)), make([]int32, len(order))
	for n, i := range order {
		kinds[n], keys[n], limits[n], idx[n] = string(scopes[i].Kind), scopes[i].Key, int64(scopes[i].Limit), int32(i)
	}
	b.Queue(reserveScopes, kinds, keys, limits, idx)
}

// scopeFull translates the abort of a full scope into
// *registry.CapacityExceededError; other errors pass through.
func scopeFull(err error, scopes []registry.AdmissionScope) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "AIP01" {
		if i, convErr := strconv.Atoi(pgErr.Detail); convErr == nil && i >= 0 && i < len(scopes) {
			return registry.CapacityExceeded(scopes[i])
		}
	}
	return err
}

// scopeArrays returns the kinds, keys and amounts (one each) of scopes in
// lock order, for releaseScopes and settleRoute.
func scopeArrays(scopes []registry.AdmissionScope) (kinds, keys []string, amounts []int64) {
	order := scopeOrder(scopes)
	kinds, keys, amounts = make([]string, len(order)), make([]string, len(order)), make([]int64, len(order))
	for n, i := range order {
		kinds[n], keys[n], amounts[n] = string(scopes[i].Kind), scopes[i].Key, 1
	}
	return kinds, keys, amounts
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
	res := registry.RouteReservation{ActionID: s.a.ActionID, ReplicaID: s.a.ReplicaID, Reserved: s.reserved,
		LastSettlement: s.last, Scopes: []registry.AdmissionScope{}}
	if s.reserved {
		res.Retry = s.retry
		res.Scopes = slices.Clone(s.a.Admission.Scopes(s.retry))
	}
	return res
}

// Settle implements registry.Resolver. It costs two round trips: the
// action lock, the replica lock and the route read begin the transaction;
// the route release, the counter releases, the replica's count and circuit
// and COMMIT follow.
func (r *Registry) Settle(ctx context.Context, a registry.RouteAssignment, outcome registry.RouteSettlement) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !outcome.Valid() {
		return fmt.Errorf("%w: settlement outcome %q (want completed, outcome_unknown, cancelled or lease_expired)", registry.ErrInvalid, outcome)
	}
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
			return fmt.Errorf("route of action %s: %w", a.ActionID, registry.ErrNotFound)
		}
		if !s.a.Equal(&a) {
			return fmt.Errorf("%w: the assignment presented for action %s is not the stored one (fence %s)", registry.ErrFenceLost, a.ActionID, a.FenceToken)
		}
		if !s.reserved {
			return nil // released before (settled, or its lease expired): nothing to do
		}
		now := r.clock()
		circuit := registry.ApplySettlementToCircuit(registry.CircuitState{ConsecutiveFailures: uint32(failures), OpenUntil: fromMS(openMS)},
			outcome, &s.a.Admission, now)
		kinds, keys, amounts := scopeArrays(s.a.Admission.Scopes(s.retry))
		b = &pgx.Batch{}
		b.Queue(settleRoute, a.ActionID, string(outcome), toMS(now), kinds, keys, amounts,
			s.a.ReplicaID, int64(circuit.ConsecutiveFailures), toMS(circuit.OpenUntil))
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
