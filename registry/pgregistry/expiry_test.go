package pgregistry_test

import (
	"context"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
)

// TestExpiryPastAStuckCounterLock: a session stuck mid-transaction holding
// one tenant's admission counter (a dispatcher partitioned from the
// database) keeps that tenant's stale replica online, since its
// reservation cannot be released, but not the other tenants' stale
// replicas: lease maintenance expires those within its deadline, and the
// held one once the lock is gone.
func TestExpiryPastAStuckCounterLock(t *testing.T) {
	ctx := t.Context()
	r, dbURL, clock := openClock(t, pgregistry.Config{})
	w := seedWorld(t, r, clock, registry.FleetPolicy("quota:f"), 2, 1, 1, 4)
	if len(w.replicas) != 2 {
		t.Fatalf("seeded %d replicas, want 2", len(w.replicas))
	}
	// Tenant A's replica sorts first (equal leases, lower ID), so every
	// batch takes it first.
	repA, repB := w.replicas[0], w.replicas[1]
	tenantA, tenantB := tenantName(0), tenantName(1)
	routeA, err := r.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tenantA, CapabilityID: "alpha.read"})
	must(t, err)
	routeB, err := r.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tenantB, CapabilityID: "alpha.read"})
	must(t, err)
	if routeA.ReplicaID != repA.ID || routeB.ReplicaID != repB.ID {
		t.Fatalf("routes went to %s and %s, want %s and %s", routeA.ReplicaID, routeB.ReplicaID, repA.ID, repB.ID)
	}
	clock.Advance(2 * time.Hour)

	holder := connect(t, dbURL)
	tx, err := holder.Begin(ctx)
	must(t, err)
	defer tx.Rollback(context.Background())
	var locked int
	must(t, tx.QueryRow(ctx, `WITH l AS (SELECT 1 FROM aip_registry.admission_counters
		WHERE scope_kind = 'tenant' AND scope_key = $1 AND active > 0 FOR UPDATE) SELECT count(*) FROM l`, tenantA).Scan(&locked))
	if locked == 0 {
		t.Fatalf("no admission counter of %s to lock", tenantA)
	}

	state := func(id string) aip.ReplicaStatus {
		t.Helper()
		rep, err := r.ConnectorReplica(ctx, id)
		must(t, err)
		return rep.Status
	}
	reserved := func(a registry.RouteAssignment) bool {
		t.Helper()
		res, err := r.Reservation(ctx, a.ActionID)
		must(t, err)
		return res.Reserved
	}

	const deadline = 2 * time.Second
	dctx, cancel := context.WithTimeout(ctx, deadline)
	start := time.Now()
	n, err := r.ExpireStaleReplicas(dctx, 10)
	took := time.Since(start)
	cancel()
	if err != nil || n != 1 {
		t.Fatalf("ExpireStaleReplicas with %s's counter locked = %d, %v; want 1 (%s's replica)", tenantA, n, err, tenantB)
	}
	if took > deadline {
		t.Errorf("ExpireStaleReplicas took %s, past its %s deadline", took, deadline)
	}
	if s := state(repB.ID); s != aip.ReplicaOffline {
		t.Errorf("%s's replica is %s, want offline", tenantB, s)
	}
	if reserved(routeB) {
		t.Errorf("%s's reservation is still held", tenantB)
	}
	if s := state(repA.ID); s != aip.ReplicaReady {
		t.Errorf("%s's replica, whose counter is locked, is %s, want still ready", tenantA, s)
	}
	if !reserved(routeA) {
		t.Errorf("%s's reservation was released while its counter was locked", tenantA)
	}

	// Alone, the held replica still fails the call: the caller sees its
	// maintenance blocked.
	dctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
	n, err = r.ExpireStaleReplicas(dctx, 10)
	cancel()
	if err == nil || n != 0 {
		t.Fatalf("ExpireStaleReplicas with only the locked replica stale = %d, %v; want 0 and an error", n, err)
	}

	must(t, tx.Rollback(ctx))
	dctx, cancel = context.WithTimeout(ctx, deadline)
	n, err = r.ExpireStaleReplicas(dctx, 10)
	cancel()
	if err != nil || n != 1 {
		t.Fatalf("ExpireStaleReplicas after the lock ended = %d, %v; want 1 (%s's replica)", n, err, tenantA)
	}
	if s := state(repA.ID); s != aip.ReplicaOffline {
		t.Errorf("%s's replica is %s after the lock ended, want offline", tenantA, s)
	}
	if reserved(routeA) {
		t.Errorf("%s's reservation is still held after the lock ended", tenantA)
	}
	l, err := r.Ledger(ctx)
	must(t, err)
	if len(l.Counters) != 0 || len(l.Reservations) != 0 {
		t.Errorf("ledger after both expiries: %+v, want no counters or reservations", l)
	}
}
