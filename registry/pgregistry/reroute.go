package pgregistry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// The provably-not-started reroute (registry.Rerouter) runs on the data
// pool as one pipelined transaction. It takes the locks of routing in their
// order: the action, the shared publication lock, then the refusing replica
// and the chosen one together in replica ID order (as lifecycle batches
// lock replicas, so two reroutes moving actions between the same replicas
// in opposite directions cannot wait on each other), then the counters of
// the released and of the new reservation. The release of the old
// reservation and the reservation of the new one run in the transaction's
// last round trip with its COMMIT: a full scope aborts it server-side, so
// the old reservation is never lost.

var _ registry.Rerouter = (*Registry)(nil)

// Compile-time guard: Registry pins routes a cancel is sent under.
var _ registry.RoutePinner = (*Registry)(nil)

const (
	// rerouteState reads whether the route was handed out again and its
	// history length.
	// A hand-out by a build that writes no claim reads as none ('', 0),
	// which no unsent claim matches.
	rerouteState = `SELECT resolved_again, (SELECT count(*) FROM aip_registry.route_history h WHERE h.action_id = $1),
	COALESCE(hand_out_claim, ''), COALESCE(claim_hand_out, 0)
FROM aip_registry.route_assignments WHERE action_id = $1`
	insertHistory = `INSERT INTO aip_registry.route_history (action_id, seq, replica_id, fence_token, assignment, superseded_at_ms)
VALUES ($1, $2, $3, $4, $5, $6)`
	releaseReplica = `UPDATE aip_registry.connector_replicas SET active_assignments = GREATEST(active_assignments - 1, 0) WHERE replica_id = $1`
	lockReplicas   = `SELECT replica_id FROM aip_registry.connector_replicas WHERE replica_id = ANY($1) ORDER BY replica_id FOR UPDATE`
	// replaceRoute makes the new assignment the action's current one,
	// reserved (not as a retry), handed out once: its hand-out is the
	// action's next, made the reservation and carries the claim $24.
	replaceRoute = `UPDATE aip_registry.route_assignments SET instance_id = $2, version_id = $3, manifest_digest = $4,
	replica_id = $5, endpoint = $6, peer_principal_id = $7, peer_principal_kind = $8, peer_did = $9, trust_domain = $10,
	transport_profile = $11, region = $12, zone = $13, capacity_class = $14, catalog_revision = $15,
	binding_policy_revision = $16, credential_revision_ref = $17, quota_policy_ref = $18, replica_health_revision = $19,
	fence_token = $20, admission = $21, assigned_at_ms = $22, reserved = true, retry = false, last_settlement = NULL,
	resolved_again = false, updated_at_ms = $22, counter_stripe = $23, scope_stripes = $25, hand_out = hand_out + 1, reserved_hand_out = hand_out + 1,
		hand_out_claim = $24::text, claim_hand_out = hand_out + 1
WHERE action_id = $1`
	selectHistory = `SELECT assignment FROM aip_registry.route_history WHERE action_id = $1 ORDER BY seq`
	routeExists   = `SELECT EXISTS (SELECT 1 FROM aip_registry.route_assignments WHERE action_id = $1)`
)

// Reroute implements registry.Rerouter.
func (r *Registry) Reroute(ctx context.Context, req registry.RerouteRequest) (registry.RouteAssignment, error) {
	if err := ctx.Err(); err != nil {
		return registry.RouteAssignment{}, err
	}
	cur := &req.Current
	rreq := registry.RerouteRouteRequest(&req)
	if err := rreq.Validate(); err != nil {
		return registry.RouteAssignment{}, err
	}
	if err := registry.CheckRerouteGrounds(&req); err != nil {
		return registry.RouteAssignment{}, err
	}
	if !assignmentStorable(cur) {
		return registry.RouteAssignment{}, unstorableAssignment(ctx, r, cur, registry.RerouteFenceLost)
	}
	_, leave, err := r.tenants.enter(ctx, rreq.TenantID, "reroute action "+cur.ActionID)
	if err != nil {
		return registry.RouteAssignment{}, err
	}
	defer leave()
	var out registry.RouteAssignment
	// The new reservation starts each scope the old one held at the
	// old one's stripe of it (the others at the old reservation's first
	// stripe), so the release and the reservation mostly lock the same
	// counter rows. Only when such a stripe is full for the new reservation
	// does it move on; two such reroutes crossing stripes in opposite
	// directions could then wait for each other, and PostgreSQL aborts one
	// (nothing is changed: the action stays on its current route).
	err = striped(&stripeTry{}, func(st *stripeTry) error {
		return r.inPipe(ctx, r.data, "reroute action "+cur.ActionID, func(p *pipe) error {
			return r.reroute(ctx, p, &req, &rreq, st, &out)
		})
	})
	if err != nil {
		return registry.RouteAssignment{}, err
	}
	return out, nil
}

// reroute is one attempt of Reroute in the transaction of p; it stores
// the new assignment in out.
func (r *Registry) reroute(ctx context.Context, p *pipe, req *registry.RerouteRequest, rreq *registry.RouteRequest, st *stripeTry, out *registry.RouteAssignment) error {
	cur := &req.Current
	now := r.clock()
	pref := &rreq.Topology
	args := []any{rreq.TenantID, rreq.CapabilityID, toMS(now), pref.CapacityClass, pref.ForbidCrossRegion, pref.Region, pref.Zone,
		rreq.ActionID, cur.ReplicaID}
	var (
		s             storedRoute
		routed, again bool
		history       int64
		claim         string // the last hand-out's claim (UnsentHolder)
		claimHandOut  int64
		first         *string
		c             candidate
		found         bool
	)
	b := &pgx.Batch{}
	b.Queue(lockRouting, cur.ActionID, lockClass, lockCatalog)
	queueRoute(b, cur.ActionID, &s, &routed)
	b.Queue(rerouteState, cur.ActionID).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&again, &history, &claim, &claimHandOut)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	b.Queue(firstBinding, rreq.TenantID, rreq.CapabilityID).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&first)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	queueCandidate(b, rerouteCandidates, args, &c, &found)
	if err := p.send(ctx, b); err != nil {
		return err
	}
	switch {
	case !routed:
		return registry.RouteNotFound(cur.ActionID)
	case !s.a.Equal(cur):
		return registry.RerouteFenceLost(cur)
	case again:
		return registry.RerouteUnsafe(cur)
	case history >= registry.MaxRouteHistory:
		return registry.RerouteHistoryFull(cur.ActionID)
	}
	if err := registry.UnsentHolder(req, claim, uint64(claimHandOut), s.a.HandOut); err != nil {
		return err
	}
	if first == nil {
		return fmt.Errorf("%w: tenant %s has no usable binding for capability %s",
			registry.ErrBindingUnavailable, rreq.TenantID, rreq.CapabilityID)
	}
	// Lock the refusing and the chosen replica in ID order (the order
	// lifecycle batches use), re-read the route (lease expiry may have
	// released it before the refusing replica was locked) and check the
	// choice again on the locked row; a choice that is no longer
	// eligible is replaced, until RouteLockWait has passed.
	deadline := time.Now().Add(r.routeLockWait)
	for {
		if !found {
			return fmt.Errorf("%w: no other eligible replica for capability %s of tenant %s (first binding: instance %s)",
				registry.ErrReplicaUnavailable, rreq.CapabilityID, rreq.TenantID, *first)
		}
		chosen := c.replica.ID
		found = false
		b := &pgx.Batch{}
		b.Queue(lockReplicas, []string{cur.ReplicaID, chosen})
		queueRoute(b, cur.ActionID, &s, &routed)
		queueCandidate(b, rerouteChosen, append(args, chosen), &c, &found)
		if err := p.send(ctx, b); err != nil {
			return err
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: the other eligible replicas for capability %s of tenant %s kept filling up for %s",
				registry.ErrReplicaUnavailable, rreq.CapabilityID, rreq.TenantID, r.routeLockWait)
		}
		b = &pgx.Batch{}
		queueCandidate(b, rerouteCandidates, args, &c, &found)
		if err := p.send(ctx, b); err != nil {
			return err
		}
	}
	// The old reservation's stripes (a retried attempt reads the same
	// route again).
	old := s.stripesOf()
	st.from, st.start = 0, map[scopeID]int16{}
	for i, sc := range s.a.Admission.Scopes(s.retry) {
		if i == 0 {
			st.from = int(old[i])
		}
		st.start[scopeID{sc.Kind, sc.Key}] = old[i]
	}
	var err error
	*out, err = r.commitReroute(ctx, p, rreq, &s, int(history), &c, now, st)
	return err
}

// queueCandidate queues a candidate query and scans its row, if any, into c.
func queueCandidate(b *pgx.Batch, sql string, args []any, c *candidate, found *bool) {
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		var err error
		*c, err = scanCandidate(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		*found = err == nil
		return err
	})
}

// commitReroute releases the old reservation (as cancelled, circuit
// untouched) if it is still held, reserves the new route's base scopes,
// keeps the old assignment as history and makes the new one current, and
// commits — in one round trip.
func (r *Registry) commitReroute(ctx context.Context, p *pipe, req *registry.RouteRequest, s *storedRoute, history int, c *candidate, now time.Time, st *stripeTry) (registry.RouteAssignment, error) {
	admission := r.admissionFor(req, c)
	stripes := st.stripes(admission.BaseScopes)
	stripe, perScope := stripeColumns(stripes)
	version := registry.ConnectorVersion{ID: c.replica.VersionID, ManifestDigest: c.manifestDigest}
	a := registry.NewAssignment(req, &c.binding, &version, &c.replica, c.revision, admission, aip.NewID(aip.PrefixRoute), now)
	a.HandOut = s.a.HandOut + 1 // replaceRoute's; the route row was read under the action lock
	doc, err := encodeAdmission(a.ActionID, &a.Admission)
	if err != nil {
		return registry.RouteAssignment{}, err
	}
	old, err := json.Marshal(s.a)
	if err != nil {
		return registry.RouteAssignment{}, fmt.Errorf("%w: encode the assignment of %s: %v", registry.ErrInvalid, a.ActionID, err)
	}
	b := &pgx.Batch{}
	b.Queue(incrementReplica, a.ReplicaID)
	if s.reserved {
		b.Queue(releaseReplica, s.a.ReplicaID)
		kinds, keys, amounts, held := scopeArrays(s.a.Admission.Scopes(s.retry), s.stripesOf())
		if len(kinds) > 0 {
			b.Queue(releaseScopes, kinds, keys, amounts, held)
		}
	}
	queueReserve(b, admission.BaseScopes, stripes)
	b.Queue(insertHistory, a.ActionID, history+1, s.a.ReplicaID, s.a.FenceToken, old, toMS(now))
	b.Queue(replaceRoute, a.ActionID, a.InstanceID, a.VersionID, a.ManifestDigest, a.ReplicaID, a.Endpoint,
		a.PeerPrincipalID, string(a.PeerPrincipalKind), a.PeerDID, a.TrustDomain, a.TransportProfile,
		a.Topology.Region, a.Topology.Zone, a.Topology.CapacityClass, int64(a.CatalogRevision), int64(a.BindingPolicyRevision),
		nullable(a.CredentialRevisionRef), nullable(a.QuotaPolicyRef), int64(a.ReplicaHealthRevision), a.FenceToken, doc,
		toMS(a.AssignedAt), stripe, nullable(req.Claim), perScope)
	if err := p.commit(ctx, b); err != nil {
		return registry.RouteAssignment{}, st.refused(err, admission.BaseScopes, stripes)
	}
	return a, nil
}

// RouteHistory implements registry.Rerouter.
func (r *Registry) RouteHistory(ctx context.Context, actionID string) ([]registry.RouteAssignment, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !storable(actionID) {
		return nil, registry.RouteNotFound(actionID)
	}
	var (
		exists bool
		out    = []registry.RouteAssignment{}
	)
	b := &pgx.Batch{}
	b.Queue(routeExists, actionID).QueryRow(func(row pgx.Row) error { return row.Scan(&exists) })
	b.Queue(selectHistory, actionID).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var doc []byte
			if err := rows.Scan(&doc); err != nil {
				return err
			}
			var a registry.RouteAssignment
			if err := json.Unmarshal(doc, &a); err != nil {
				return fmt.Errorf("decode a superseded assignment of %s: %w", actionID, err)
			}
			out = append(out, a)
		}
		return rows.Err()
	})
	conn, err := r.acquire(ctx, r.data, "read route history")
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return nil, storageErr("read route history of "+actionID, err)
	}
	if !exists {
		return nil, registry.RouteNotFound(actionID)
	}
	return out, nil
}

// pinRoute marks the route of action $1 resolved again (PinRoute); the
// caller holds the action lock, as Reroute does while it reads the flag.
// lockPinAction takes the action lock alone.
const lockPinAction = `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`

const pinRoute = `UPDATE aip_registry.route_assignments SET resolved_again = true WHERE action_id = $1`

// PinRoute implements registry.RoutePinner. It takes the action lock that
// Reroute and Resolve hold for their whole transaction, so a reroute
// either committed before it (and the assignment is not current: fence
// lost) or reads the mark.
func (r *Registry) PinRoute(ctx context.Context, a registry.RouteAssignment) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !assignmentStorable(&a) {
		return unstorableAssignment(ctx, r, &a, registry.RerouteFenceLost)
	}
	return r.inPipe(ctx, r.data, "pin route of action "+a.ActionID, func(p *pipe) error {
		var (
			s      storedRoute
			routed bool
		)
		b := &pgx.Batch{}
		b.Queue(lockPinAction, a.ActionID)
		queueRoute(b, a.ActionID, &s, &routed)
		if err := p.send(ctx, b); err != nil {
			return err
		}
		switch {
		case !routed:
			return registry.RouteNotFound(a.ActionID)
		case !s.a.Equal(&a):
			return registry.RerouteFenceLost(&a)
		}
		b = &pgx.Batch{}
		b.Queue(pinRoute, a.ActionID)
		return p.commit(ctx, b)
	})
}
