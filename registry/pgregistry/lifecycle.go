package pgregistry

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/aipfleet/aipfleet/registry"
)

// The lifecycle contract (registry.Lifecycle) runs on the data pool only.
// One ApplyLifecycle call is one transaction: it locks the named replicas
// FOR UPDATE in ascending ID order (so concurrent calls cannot deadlock),
// loads the replay claims of the request IDs and, for registrations, the
// replicas' distinct instances and versions (each once per call), decides every command with
// registry.LifecycleBatch, then writes all changed replicas with one
// statement, stores the new claims with another and prunes a bounded batch
// of expired claims (claimPruneBatch more than it stores). A failure commits
// nothing, claims included.
//
// The lock waits are bounded (three quarters of the time left before the
// caller's deadline, boundLockWait): when a replica is held past that by
// another session (a dispatcher stuck mid-transaction holds its row until
// the server notices), the call is decided again in a second transaction
// that takes only the replicas no one holds (SKIP LOCKED), and the held
// replicas' commands are answered undecided (registry.LifecycleBatch.Held).
// Without the bound, every command coalesced with the held replica's would
// fail at the caller's deadline, batch after batch, for as long as its host
// resends.

var (
	_ registry.Lifecycle     = (*Registry)(nil)
	_ registry.ReplicaLister = (*Registry)(nil)
	_ registry.Readiness     = (*Registry)(nil)
)

// claimPruneBatch is how many expired replay claims one call deletes on top
// of the number of claims it stores: a call always prunes at least as many
// as it adds, so the claims table stays bounded whatever the batch size.
const claimPruneBatch = 256

const (
	lockLifecycleReplicas = `SELECT ` + replicaColumns + ` FROM aip_registry.connector_replicas
WHERE replica_id = ANY($1) ORDER BY replica_id FOR UPDATE`
	// lockFreeLifecycleReplicas takes the named replicas no other
	// transaction holds (the second pass after a lock timeout), and
	// existingReplicas names every one of them that exists, so that the
	// ones held elsewhere are told from the ones never provisioned.
	lockFreeLifecycleReplicas = lockLifecycleReplicas + ` SKIP LOCKED`
	existingReplicas          = `SELECT replica_id FROM aip_registry.connector_replicas WHERE replica_id = ANY($1)`
	selectClaims              = `SELECT request_id, digest, replica_id, expires_at_ms FROM aip_registry.control_replay WHERE request_id = ANY($1)`
	// registrationInstances and registrationVersions load the distinct
	// instances and versions of registering replicas, each row once however
	// many of its replicas register in the call: a version's manifest (up
	// to MaxManifestBytes) is fetched, decoded and qualified once per call,
	// not once per replica (re-registration after an outage sends a batch
	// of replicas of the same version). The foreign keys guarantee both
	// exist.
	registrationInstances = `SELECT ` + instanceColumns + ` FROM aip_registry.connector_instances
WHERE instance_id IN (SELECT instance_id FROM aip_registry.connector_replicas WHERE replica_id = ANY($1))`
	registrationVersions = `SELECT ` + versionColumns + ` FROM aip_registry.connector_versions
WHERE version_id IN (SELECT version_id FROM aip_registry.connector_replicas WHERE replica_id = ANY($1))`
	writeLifecycleReplicas = `UPDATE aip_registry.connector_replicas r SET status = u.status, lease_expires_at_ms = u.lease,
	capacity = u.capacity, health_revision = u.health, last_control_request_id = u.request_id,
	last_control_request_digest = u.digest, offline_reason = u.offline_reason, offline_at_ms = u.offline_at, updated_at_ms = $8
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[], $7::text[], $9::text[], $10::bigint[])
	AS u (id, status, lease, capacity, health, request_id, digest, offline_reason, offline_at)
WHERE r.replica_id = u.id`
	// insertClaims stores new claims; a stored claim with the same ID is
	// replaced only when it has expired. A live one (a concurrent call
	// claimed the ID first) is left alone and the call is retried.
	insertClaims = `INSERT INTO aip_registry.control_replay AS c (request_id, digest, replica_id, claimed_at_ms, expires_at_ms)
SELECT u.request_id, u.digest, u.replica_id, $5, u.expires FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) AS u (request_id, digest, replica_id, expires)
ON CONFLICT (request_id) DO UPDATE SET digest = excluded.digest, replica_id = excluded.replica_id,
	claimed_at_ms = excluded.claimed_at_ms, expires_at_ms = excluded.expires_at_ms
WHERE c.expires_at_ms <= $5`
	pruneClaims = `DELETE FROM aip_registry.control_replay WHERE request_id IN (
	SELECT request_id FROM aip_registry.control_replay WHERE expires_at_ms <= $1
	ORDER BY expires_at_ms LIMIT $2 FOR UPDATE SKIP LOCKED)`

	listReplicas = `SELECT ` + replicaColumns + ` FROM aip_registry.connector_replicas WHERE replica_id > $1 ORDER BY replica_id LIMIT $2`
)

// LifecycleReplica implements registry.Lifecycle.
func (r *Registry) LifecycleReplica(ctx context.Context, replicaID string) (registry.ConnectorReplica, error) {
	return r.ConnectorReplica(ctx, replicaID)
}

// ApplyLifecycle implements registry.Lifecycle.
func (r *Registry) ApplyLifecycle(ctx context.Context, cmds []registry.LifecycleCommand) ([]registry.LifecycleResult, error) {
	if err := registry.CheckLifecycleBatch(cmds); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out, err := r.applyLifecycle(ctx, cmds, false)
	if isLockTimeout(err) {
		// A replica was held by another session past the bounded wait:
		// decide the commands of the others, answer the held ones'
		// undecided.
		out, err = r.applyLifecycle(ctx, cmds, true)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// applyLifecycle is one attempt of ApplyLifecycle. When ctx has a deadline
// the wait for each lock is bounded (boundLockWait), so that a replica
// another session holds (a dispatcher stuck mid-transaction) fails the
// attempt with a lock timeout before the caller's deadline, rather than
// failing every command of the call at the deadline. With skipHeld the
// replicas are taken FOR UPDATE SKIP LOCKED instead, and the commands of
// the existing ones that could not be taken are left undecided
// (LifecycleBatch.Held).
func (r *Registry) applyLifecycle(ctx context.Context, cmds []registry.LifecycleCommand, skipHeld bool) ([]registry.LifecycleResult, error) {
	replicaIDs, requestIDs, registering := registry.LifecycleKeys(cmds)
	lock := lockLifecycleReplicas
	if skipHeld {
		lock = lockFreeLifecycleReplicas
	}
	var out []registry.LifecycleResult
	err := r.inTx(ctx, r.data, "apply lifecycle commands", func(tx pgx.Tx) error {
		if err := boundLockWait(ctx, tx); err != nil {
			return err
		}
		now := r.clock()
		nowMS := toMS(now)
		lb := registry.LifecycleBatch{
			Now:       now,
			Replicas:  make(map[string]*registry.ConnectorReplica, len(replicaIDs)),
			Instances: map[string]*registry.ConnectorInstance{},
			Versions:  map[string]*registry.LifecycleVersion{},
			Claims:    make(map[string]*registry.ReplayClaim),
		}
		b := &pgx.Batch{}
		var existing []string
		if skipHeld {
			b.Queue(existingReplicas, replicaIDs).Query(func(rows pgx.Rows) error {
				var err error
				existing, err = pgx.CollectRows(rows, pgx.RowTo[string])
				return err
			})
		}
		b.Queue(lock, replicaIDs).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				rep, err := scanReplica(rows)
				if err != nil {
					return err
				}
				lb.Replicas[rep.ID] = &rep
			}
			return rows.Err()
		})
		b.Queue(selectClaims, requestIDs).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var (
					c         registry.ReplayClaim
					expiresMS int64
				)
				if err := rows.Scan(&c.RequestID, &c.Digest, &c.ReplicaID, &expiresMS); err != nil {
					return err
				}
				c.ExpiresAt = fromMS(expiresMS)
				lb.Claims[c.RequestID] = &c
			}
			return rows.Err()
		})
		if len(registering) > 0 {
			b.Queue(registrationInstances, registering).Query(func(rows pgx.Rows) error {
				for rows.Next() {
					inst, err := scanInstance(rows)
					if err != nil {
						return err
					}
					lb.Instances[inst.ID] = &inst
				}
				return rows.Err()
			})
			b.Queue(registrationVersions, registering).Query(func(rows pgx.Rows) error {
				for rows.Next() {
					v, err := scanVersion(rows)
					if err != nil {
						return err
					}
					lv := registry.NewLifecycleVersion(&v)
					lb.Versions[v.ID] = &lv
				}
				return rows.Err()
			})
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		for _, id := range existing {
			if lb.Replicas[id] == nil {
				if lb.Held == nil {
					lb.Held = make(map[string]bool)
				}
				lb.Held[id] = true
			}
		}
		out = lb.Apply(cmds)
		changed, claims := lb.ChangedReplicas(), lb.NewClaims()
		b = &pgx.Batch{}
		if n := len(changed); n > 0 {
			ids, statuses, reqIDs, digests := make([]string, n), make([]string, n), make([]*string, n), make([]*string, n)
			leases, capacities, healths := make([]int64, n), make([]int64, n), make([]int64, n)
			reasons, offlineAts := make([]*string, n), make([]*int64, n)
			for i := range changed {
				c := &changed[i]
				ids[i], statuses[i], leases[i] = c.ID, string(c.Status), toMS(c.LeaseExpiresAt)
				capacities[i], healths[i] = int64(c.Capacity), int64(c.HealthRevision)
				reqIDs[i], digests[i] = nullable(c.LastControlRequestID), nullable(c.LastControlRequestDigest)
				reasons[i], offlineAts[i] = offlineColumns(c)
			}
			b.Queue(writeLifecycleReplicas, ids, statuses, leases, capacities, healths, reqIDs, digests, nowMS, reasons, offlineAts)
		}
		inserted := -1
		if n := len(claims); n > 0 {
			ids, digests, replicas, expires := make([]string, n), make([]string, n), make([]string, n), make([]int64, n)
			for i, c := range claims {
				ids[i], digests[i], replicas[i], expires[i] = c.RequestID, c.Digest, c.ReplicaID, toMS(c.ExpiresAt)
			}
			b.Queue(insertClaims, ids, digests, replicas, expires, nowMS).Exec(func(tag pgconn.CommandTag) error {
				inserted = int(tag.RowsAffected())
				return nil
			})
		}
		b.Queue(pruneClaims, nowMS, claimPruneBatch+len(claims))
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if inserted >= 0 && inserted != len(claims) {
			// A concurrent call claimed one of these request IDs first:
			// decide again, now seeing its claim.
			return &txRetry{err: errors.New("a concurrent lifecycle call claimed the same request ID")}
		}
		return nil
	})
	if err != nil {
		if retryable(err) {
			err = storageErr("apply lifecycle commands", err)
		}
		return nil, err
	}
	return out, nil
}

// ListReplicas implements registry.ReplicaLister.
func (r *Registry) ListReplicas(ctx context.Context, after string, limit int) ([]registry.ConnectorReplica, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rows, err := r.data.Query(ctx, listReplicas, after, registry.ClampReplicaPage(limit))
	if err != nil {
		return nil, storageErr("list replicas", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (registry.ConnectorReplica, error) { return scanReplica(row) })
	if err != nil {
		return nil, storageErr("list replicas", err)
	}
	if out == nil {
		out = []registry.ConnectorReplica{}
	}
	return out, nil
}

// Readiness implements registry.Readiness: the schema is this build's, the
// catalog revision is readable, and the data pool hands out a connection.
func (r *Registry) Readiness(ctx context.Context) (registry.StoreReadiness, error) {
	s := registry.StoreReadiness{Backend: "postgres", SchemaVersion: SchemaVersion}
	stats := r.PoolStats()
	s.Pool = &stats
	check := func(name string, err error) {
		c := registry.ReadinessCheck{Name: name, OK: err == nil}
		if err != nil {
			c.Message = err.Error()
		}
		s.Checks = append(s.Checks, c)
	}
	check("schema", r.VerifySchema(ctx))
	rev, err := r.CatalogRevision(ctx)
	s.CatalogRevision = rev
	check("catalog", err)
	var poolErr error
	if stats.DataMax == 0 {
		poolErr = fmt.Errorf("the data pool is closed")
	}
	check("pool", poolErr)
	return s, nil
}
