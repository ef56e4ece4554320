package pgregistry

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

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
	releaseExpiredRoutes = `UPDATE aip_registry.route_assignments SET reserved = false, last_settlement = 'lease_expired', updated_at_ms = $2
WHERE replica_id = ANY($1) AND reserved
RETURNING admission, retry, counter_stripe`
	expireReplicas = `UPDATE aip_registry.connector_replicas r SET status = 'offline', lease_expires_at_ms = u.lease,
	active_assignments = 0, health_revision = u.health, last_control_request_id = NULL, last_control_request_digest = NULL,
	updated_at_ms = $4
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
// later pass.
func (r *Registry) ExpireStaleReplicas(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if limit < 1 {
		return 0, fmt.Errorf("%w: expiry limit %d must be at least 1", registry.ErrInvalid, limit)
	}
	var n int
	err := r.inTx(ctx, r.data, "expire stale replicas", func(tx pgx.Tx) error {
		now := r.clock()
		nowMS := toMS(now)
		rows, err := tx.Query(ctx, staleReplicas, nowMS, limit)
		if err != nil {
			return err
		}
		stale, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (registry.ConnectorReplica, error) { return scanReplica(row) })
		if err != nil {
			return err
		}
		n = len(stale)
		if n == 0 {
			return nil
		}
		ids, leases, healths := make([]string, n), make([]int64, n), make([]int64, n)
		for i := range stale {
			registry.ExpireReplica(&stale[i], now)
			ids[i], leases[i], healths[i] = stale[i].ID, toMS(stale[i].LeaseExpiresAt), int64(stale[i].HealthRevision)
		}
		rows, err = tx.Query(ctx, releaseExpiredRoutes, ids, nowMS)
		if err != nil {
			return err
		}
		type scope struct {
			kind   registry.AdmissionScopeKind
			key    string
			stripe int16
		}
		held := map[scope]int64{}
		var (
			doc    []byte
			retry  bool
			stripe int16
		)
		_, err = pgx.ForEachRow(rows, []any{&doc, &retry, &stripe}, func() error {
			var a registry.AdmissionReservation
			if err := json.Unmarshal(doc, &a); err != nil {
				return err
			}
			for _, s := range a.Scopes(retry) {
				held[scope{s.Kind, s.Key, stripe}]++
			}
			return nil
		})
		if err != nil {
			return err
		}
		order := make([]scope, 0, len(held))
		for s := range held {
			order = append(order, s)
		}
		slices.SortFunc(order, func(a, b scope) int {
			return cmp.Or(compareScopes(a.kind, a.key, b.kind, b.key), cmp.Compare(a.stripe, b.stripe))
		})
		b := &pgx.Batch{}
		if len(order) > 0 {
			kinds, keys, amounts, stripes := make([]string, len(order)), make([]string, len(order)), make([]int64, len(order)), make([]int16, len(order))
			for n, s := range order {
				kinds[n], keys[n], amounts[n], stripes[n] = string(s.kind), s.key, held[s], s.stripe
			}
			b.Queue(releaseScopes, kinds, keys, amounts, stripes)
		}
		b.Queue(expireReplicas, ids, leases, healths, nowMS)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// Status implements registry.FleetStatus.
func (r *Registry) Status(ctx context.Context) (registry.FleetStatusSummary, error) {
	if err := ctx.Err(); err != nil {
		return registry.FleetStatusSummary{}, err
	}
	now := r.clock()
	s := registry.FleetStatusSummary{ObservedAt: now}
	var rev, types, versions, instances, replicas, ready, draining, offline, expired, capacity, active int64
	err := r.data.QueryRow(ctx, selectStatus, toMS(now)).Scan(&rev, &types, &versions, &instances, &replicas,
		&ready, &draining, &offline, &expired, &capacity, &active)
	if err != nil {
		return registry.FleetStatusSummary{}, storageErr("read fleet status", err)
	}
	s.CatalogRevision = uint64(rev)
	s.ConnectorTypes, s.ActiveVersions, s.EnabledInstances = int(types), int(versions), int(instances)
	s.Replicas, s.ReadyReplicas, s.DrainingReplicas, s.OfflineReplicas = int(replicas), int(ready), int(draining), int(offline)
	s.ExpiredLeases, s.ReadyCapacity, s.ActiveAssignments = int(expired), uint64(capacity), uint64(active)
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
