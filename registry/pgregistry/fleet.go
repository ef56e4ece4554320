package pgregistry

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/registry"
)

// Lease maintenance, fleet status and the reservation ledger run on the data
// pool.

const (
	// staleReplicas takes the oldest expired leases that no other
	// transaction holds.
	staleReplicas = `SELECT ` + replicaColumns + ` FROM aip_registry.connector_replicas
WHERE status <> 'offline' AND lease_expires_at_ms <= $1
ORDER BY lease_expires_at_ms, replica_id
LIMIT $2
FOR UPDATE SKIP LOCKED`
	// staleReplica takes the replica $2 if its lease is still expired at
	// $1 and no other transaction holds it.
	staleReplica = `SELECT ` + replicaColumns + ` FROM aip_registry.connector_replicas
WHERE replica_id = $2 AND status <> 'offline' AND lease_expires_at_ms <= $1
FOR UPDATE SKIP LOCKED`
	releaseExpiredRoutes = `UPDATE aip_registry.route_assignments SET reserved = false, last_settlement = 'lease_expired', updated_at_ms = $2,
	` + releasedStripe + `
WHERE replica_id = ANY($1) AND reserved
RETURNING replica_id, admission, retry, counter_stripe, scope_stripes`

	// strandedReplicas takes the offline replicas, oldest lease end first,
	// that hold a reservation handed out at or before the cutoff $1 and
	// that no other transaction holds. It starts from the live
	// reservations (route_assignments_reserved: as many rows as actions in
	// flight) and looks their replicas up by key, so it never reads the
	// offline replicas a fleet accumulates as it replaces replicas. The
	// replica IDs are collected into an array first (an init plan) so that
	// the planner cannot turn the lookup into a scan of every replica
	// joined to the reservations.
	strandedReplicas = `SELECT ` + replicaColumns + ` FROM aip_registry.connector_replicas
WHERE replica_id = ANY (ARRAY(SELECT DISTINCT replica_id FROM aip_registry.route_assignments WHERE reserved AND updated_at_ms <= $1))
AND status = 'offline' AND lease_expires_at_ms <= $1
ORDER BY lease_expires_at_ms, replica_id
LIMIT $2
FOR UPDATE SKIP LOCKED`
	// releaseStrandedRoutes releases the reservations on the taken
	// replicas handed out at or before the cutoff $2 (updated_at_ms is a
	// reserved route's last handout).
	releaseStrandedRoutes = `UPDATE aip_registry.route_assignments SET reserved = false, last_settlement = 'lease_expired', updated_at_ms = $3,
	` + releasedStripe + `
WHERE replica_id = ANY($1) AND reserved AND updated_at_ms <= $2
RETURNING replica_id, admission, retry, counter_stripe, scope_stripes`
	// unassignReplicas lowers each replica's active assignments by the
	// reservations released on it.
	unassignReplicas = `UPDATE aip_registry.connector_replicas r SET active_assignments = GREATEST(r.active_assignments - u.n, 0), updated_at_ms = $3
FROM unnest($1::text[], $2::bigint[]) AS u (id, n)
WHERE r.replica_id = u.id`
	expireReplicas = `UPDATE aip_registry.connector_replicas r SET status = 'offline', lease_expires_at_ms = u.lease,
	active_assignments = 0, health_revision = u.health, last_control_request_id = NULL, last_control_request_digest = NULL,
	offline_reason = 'lease_expired', offline_at_ms = $4, updated_at_ms = $4
FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u (id, lease, health)
WHERE r.replica_id = u.id`

	selectStatus = `SELECT (SELECT revision FROM aip_registry.catalog_revision),
	(SELECT count(*) FROM aip_registry.connector_types),
	(SELECT count(*) FROM aip_registry.connector_versions WHERE status = 'active'),
	(SELECT count(*) FROM aip_registry.connector_instances WHERE status = 'enabled'),
	count(*),
	count(*) FILTER (WHERE status = 'ready' AND lease_expires_at_ms > $1),
	count(*) FILTER (WHERE status = 'draining' AND lease_expires_at_ms > $1),
	count(*) FILTER (WHERE status = 'offline'),
	count(*) FILTER (WHERE status = 'offline' AND health_revision = 0),
	count(*) FILTER (WHERE status = 'offline' AND health_revision > 0 AND lease_expires_at_ms > $2),
	count(*) FILTER (WHERE status <> 'offline' AND lease_expires_at_ms <= $1),
	COALESCE(sum(capacity) FILTER (WHERE status = 'ready' AND lease_expires_at_ms > $1), 0)::bigint,
	COALESCE(sum(active_assignments), 0)::bigint
FROM aip_registry.connector_replicas`

	// selectCounters adds up each scope's stripes.
	selectCounters = `SELECT scope_kind, scope_key, sum(active)::bigint FROM aip_registry.admission_counters
GROUP BY scope_kind, scope_key HAVING sum(active) > 0 ORDER BY scope_kind, scope_key`
	selectReservations = `SELECT ` + routeReadColumns + ` FROM aip_registry.route_assignments WHERE reserved ORDER BY action_id`
)

// ExpireStaleReplicas implements registry.FleetStatus. Replicas another
// transaction holds are skipped (FOR UPDATE SKIP LOCKED) and taken by a
// later pass. It expires the batch in one transaction; when that one fails
// on a lock another session holds past its bounded wait (a route or counter
// row of a dispatcher stuck mid-transaction), it expires the replicas it
// had taken one per transaction instead (expireOneByOne), so one stuck
// lock does not keep every other stale replica online.
func (r *Registry) ExpireStaleReplicas(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if limit < 1 {
		return 0, fmt.Errorf("%w: expiry limit %d must be at least 1", registry.ErrInvalid, limit)
	}
	var taken []string
	err := r.inTx(ctx, r.data, "expire stale replicas", func(tx pgx.Tx) error {
		if err := boundLockWait(ctx, tx); err != nil {
			return err
		}
		var err error
		taken, err = expireTaken(ctx, tx, r.clock(), staleReplicas, limit)
		return err
	})
	switch {
	case err == nil:
		return len(taken), nil
	case isLockTimeout(err) && len(taken) > 0:
		return r.expireOneByOne(ctx, taken)
	default:
		return 0, err
	}
}

// expireOneByOne expires the replicas ids, which a batch that failed on a
// lock timeout had taken, each in a transaction of its own that
// re-takes it only if it is still stale and no other transaction holds it.
// Each transaction gets an equal share of the time left before ctx's
// deadline (the lock wait three quarters of it, boundLockWait), so the call
// ends within the caller's deadline however many of them wait; what a
// transaction does not use goes to the ones after it. A replica whose
// transaction times out on a lock stays online for a later pass. It fails
// only when it expired none and one of them timed out (with that error), or
// on any other failure (with the count expired before it).
func (r *Registry) expireOneByOne(ctx context.Context, ids []string) (int, error) {
	var (
		n       int
		lastErr error
	)
	for i, id := range ids {
		if ctx.Err() != nil {
			break
		}
		one, cancel := shareOfTimeLeft(ctx, len(ids)-i)
		var got []string
		err := r.inTx(one, r.data, "expire stale replica", func(tx pgx.Tx) error {
			if err := boundLockWait(one, tx); err != nil {
				return err
			}
			var err error
			got, err = expireTaken(one, tx, r.clock(), staleReplica, id)
			return err
		})
		timedOut := one.Err() != nil && ctx.Err() == nil
		cancel()
		switch {
		case err == nil:
			n += len(got)
		case isLockTimeout(err) || timedOut:
			lastErr = err
		default:
			return n, err
		}
	}
	switch {
	case n > 0:
		return n, nil
	case ctx.Err() != nil:
		return 0, storageErr("expire stale replicas", ctx.Err())
	default:
		return 0, lastErr // nil when none was still stale and free
	}
}

// shareOfTimeLeft returns ctx bounded to one k-th of the time left before
// its deadline, or ctx itself when it has none.
func shareOfTimeLeft(ctx context.Context, k int) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, time.Until(dl)/time.Duration(k))
}

// expireTaken expires, in tx at now, the replicas the query stale ($1 the
// time, $2 arg) takes FOR UPDATE: it releases their reservations (the
// route rows, then the counters in scope kind, key and stripe order, as the
// package comment's lock order has them) and takes them offline. It
// returns the IDs taken, also when a later statement failed.
func expireTaken(ctx context.Context, tx pgx.Tx, now time.Time, stale string, arg any) ([]string, error) {
	nowMS := toMS(now)
	rows, err := tx.Query(ctx, stale, nowMS, arg)
	if err != nil {
		return nil, err
	}
	reps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (registry.ConnectorReplica, error) { return scanReplica(row) })
	if err != nil || len(reps) == 0 {
		return nil, err
	}
	n := len(reps)
	ids, leases, healths := make([]string, n), make([]int64, n), make([]int64, n)
	for i := range reps {
		registry.ExpireReplica(&reps[i], now)
		ids[i], leases[i], healths[i] = reps[i].ID, toMS(reps[i].LeaseExpiresAt), int64(reps[i].HealthRevision)
	}
	rows, err = tx.Query(ctx, releaseExpiredRoutes, ids, nowMS)
	if err != nil {
		return ids, err
	}
	rel, err := collectReleased(rows)
	if err != nil {
		return ids, err
	}
	b := &pgx.Batch{}
	rel.queueCounters(b)
	b.Queue(expireReplicas, ids, leases, healths, nowMS)
	return ids, tx.SendBatch(ctx, b).Close()
}

// boundLockWait bounds the lock waits of a maintenance transaction on the
// server: when ctx has a deadline, lock_timeout is three quarters of the
// time left. So a row lock held by a stuck session (a dispatcher partitioned
// mid-transaction) fails the statement on the server before the caller
// gives up, and the transaction's own locks — the replica rows it took FOR
// UPDATE — are released when the call returns, not whenever the server
// notices the caller left (a cancel request can be delayed or lost).
// Without a deadline it leaves the server's setting.
func boundLockWait(ctx context.Context, tx pgx.Tx) error {
	dl, ok := ctx.Deadline()
	if !ok {
		return nil
	}
	ms := max(time.Until(dl)*3/4/time.Millisecond, 1)
	_, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", ms))
	return err
}

// ReleaseStrandedReservations implements registry.FleetStatus. Locks are
// taken in the global order of the package comment, as lease expiry takes
// them: the offline replicas (FOR UPDATE SKIP LOCKED, so another
// transaction's replica is left for a later call rather than waited for),
// then their route rows, then the counters by scope kind, key and stripe.
// A Resolve that hands one of the routes out again meanwhile waits for the
// replica lock, or has committed before the route update re-reads the row,
// which then no longer matches the cutoff and stays reserved.
func (r *Registry) ReleaseStrandedReservations(ctx context.Context, grace time.Duration, limit int) (registry.StrandedRelease, error) {
	var out registry.StrandedRelease
	if err := ctx.Err(); err != nil {
		return out, err
	}
	if err := registry.CheckStrandedRelease(grace, limit); err != nil {
		return out, err
	}
	err := r.inTx(ctx, r.data, "release stranded reservations", func(tx pgx.Tx) error {
		if err := boundLockWait(ctx, tx); err != nil {
			return err
		}
		out = registry.StrandedRelease{}
		now := r.clock()
		nowMS, cutoffMS := toMS(now), toMS(registry.StrandedCutoff(now, grace))
		rows, err := tx.Query(ctx, strandedReplicas, cutoffMS, limit)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
			rep, err := scanReplica(row)
			return rep.ID, err
		})
		if err != nil || len(ids) == 0 {
			return err
		}
		rows, err = tx.Query(ctx, releaseStrandedRoutes, ids, cutoffMS, nowMS)
		if err != nil {
			return err
		}
		rel, err := collectReleased(rows)
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		rel.queueCounters(b)
		reps, counts := make([]string, 0, len(rel.perReplica)), make([]int64, 0, len(rel.perReplica))
		for _, id := range ids {
			if n := rel.perReplica[id]; n > 0 {
				reps, counts = append(reps, id), append(counts, n)
				out.Reservations += int(n)
			}
		}
		b.Queue(unassignReplicas, reps, counts, nowMS)
		out.Replicas = len(ids)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return registry.StrandedRelease{}, err
	}
	return out, nil
}

// released adds up what a release of routes (lease expiry, stranded
// reservations) freed: per counter stripe, and per replica.
type released struct {
	held       map[heldScope]int64
	perReplica map[string]int64
}

type heldScope struct {
	kind   registry.AdmissionScopeKind
	key    string
	stripe int16
}

// collectReleased reads the rows (replica_id, admission, retry,
// counter_stripe, scope_stripes) of released routes: each scope is
// released in its stripe.
func collectReleased(rows pgx.Rows) (released, error) {
	rel := released{held: map[heldScope]int64{}, perReplica: map[string]int64{}}
	var (
		replica string
		doc     []byte
		retry   bool
		stripe  int16
		per     []int16
	)
	_, err := pgx.ForEachRow(rows, []any{&replica, &doc, &retry, &stripe, &per}, func() error {
		var a registry.AdmissionReservation
		if err := json.Unmarshal(doc, &a); err != nil {
			return err
		}
		scopes := a.Scopes(retry)
		stripes := stripesOf(stripe, per, len(scopes))
		for i, s := range scopes {
			rel.held[heldScope{s.Kind, s.Key, stripes[i]}]++
		}
		rel.perReplica[replica]++
		return nil
	})
	return rel, err
}

// queueCounters queues the release of the held counters, locked in scope
// kind, key and stripe order.
func (rel *released) queueCounters(b *pgx.Batch) {
	if len(rel.held) == 0 {
		return
	}
	order := make([]heldScope, 0, len(rel.held))
	for s := range rel.held {
		order = append(order, s)
	}
	slices.SortFunc(order, func(a, b heldScope) int {
		return cmp.Or(compareScopes(a.kind, a.key, b.kind, b.key), cmp.Compare(a.stripe, b.stripe))
	})
	kinds, keys, amounts, stripes := make([]string, len(order)), make([]string, len(order)), make([]int64, len(order)), make([]int16, len(order))
	for n, s := range order {
		kinds[n], keys[n], amounts[n], stripes[n] = string(s.kind), s.key, rel.held[s], s.stripe
	}
	b.Queue(releaseScopes, kinds, keys, amounts, stripes)
}

// Status implements registry.FleetStatus.
func (r *Registry) Status(ctx context.Context) (registry.FleetStatusSummary, error) {
	if err := ctx.Err(); err != nil {
		return registry.FleetStatusSummary{}, err
	}
	now := r.clock()
	s := registry.FleetStatusSummary{ObservedAt: now}
	var rev, types, versions, instances, replicas, ready, draining, offline, unregistered, recent, expired, capacity, active int64
	err := r.data.QueryRow(ctx, selectStatus, toMS(now), toMS(now.Add(-registry.RecentOfflineWindow))).Scan(&rev, &types, &versions, &instances, &replicas,
		&ready, &draining, &offline, &unregistered, &recent, &expired, &capacity, &active)
	if err != nil {
		return registry.FleetStatusSummary{}, storageErr("read fleet status", err)
	}
	s.CatalogRevision = uint64(rev)
	s.ConnectorTypes, s.ActiveVersions, s.EnabledInstances = int(types), int(versions), int(instances)
	s.Replicas, s.ReadyReplicas, s.DrainingReplicas, s.OfflineReplicas = int(replicas), int(ready), int(draining), int(offline)
	s.ExpiredLeases, s.ReadyCapacity, s.ActiveAssignments = int(expired), uint64(capacity), uint64(active)
	s.LiveReplicas = s.Replicas - s.OfflineReplicas
	s.UnregisteredReplicas, s.RecentlyOfflineReplicas = int(unregistered), int(recent)
	s.RetiredReplicas = s.OfflineReplicas - s.UnregisteredReplicas - s.RecentlyOfflineReplicas
	return s, nil
}

// Ledger implements registry.FleetStatus. It reads counters and
// reservations from one snapshot.
func (r *Registry) Ledger(ctx context.Context) (registry.Ledger, error) {
	if err := ctx.Err(); err != nil {
		return registry.Ledger{}, err
	}
	l := registry.Ledger{Counters: []registry.AdmissionCounter{}, Reservations: []registry.RouteReservation{}}
	err := r.inTxOpts(ctx, r.data, "read the ledger", pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		l.Counters, l.Reservations = l.Counters[:0], l.Reservations[:0]
		rows, err := tx.Query(ctx, selectCounters)
		if err != nil {
			return err
		}
		var (
			kind, key string
			active    int64
		)
		if _, err := pgx.ForEachRow(rows, []any{&kind, &key, &active}, func() error {
			l.Counters = append(l.Counters, registry.AdmissionCounter{Kind: registry.AdmissionScopeKind(kind), Key: key, Active: uint32(active)})
			return nil
		}); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, selectReservations)
		if err != nil {
			return err
		}
		routes, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (storedRoute, error) { return scanRoute(row) })
		if err != nil {
			return err
		}
		for i := range routes {
			l.Reservations = append(l.Reservations, reservationOf(&routes[i]))
		}
		return nil
	})
	if err != nil {
		return registry.Ledger{}, err
	}
	registry.SortLedger(&l)
	return l, nil
}
