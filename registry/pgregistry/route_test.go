package pgregistry_test

import (
	"errors"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
)

// TestSettleComparesExactly: the settlement statement compares the
// presented assignment with the stored one column by column; what it
// cannot represent exactly never matches. An assigned-at time finer than
// the stored milliseconds is a different assignment (registry.ErrFenceLost,
// nothing released); a reservation without admission scopes presented with
// a nil scope list is the same assignment; a stored admission document the
// statement does not compare equal, though Go decodes it to the same
// reservation, is settled by the comparison in Go.
func TestSettleComparesExactly(t *testing.T) {
	ctx := t.Context()
	r, dbURL, clock := openClock(t, pgregistry.Config{})
	pol := registry.FleetPolicy("quota:open")
	pol.MaxTenantInFlight, pol.MaxInstanceInFlight, pol.MaxBindingInFlight, pol.MaxTenantRetryInFlight =
		registry.Unlimited, registry.Unlimited, registry.Unlimited, registry.Unlimited
	w := seedWorld(t, r, clock, pol, 1, 1, 1, 8)
	resolve := func() registry.RouteAssignment {
		t.Helper()
		a, err := r.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tenantName(0), CapabilityID: "alpha.read"})
		must(t, err)
		return a
	}
	reserved := func(a registry.RouteAssignment) bool {
		t.Helper()
		res, err := r.Reservation(ctx, a.ActionID)
		must(t, err)
		return res.Reserved
	}

	a := resolve()
	if len(a.Admission.BaseScopes) != 0 || a.Admission.BaseScopes == nil {
		t.Fatalf("a route under an unlimited policy holds scopes %#v, want an empty list", a.Admission.BaseScopes)
	}
	finer := a
	finer.AssignedAt = a.AssignedAt.Add(time.Microsecond)
	if err := r.Settle(ctx, finer, registry.SettlementCompleted); !errors.Is(err, registry.ErrFenceLost) {
		t.Fatalf("settling with an assigned-at time off by a microsecond: %v, want registry.ErrFenceLost", err)
	}
	if !reserved(a) {
		t.Fatal("a settlement with another assigned-at time released the route")
	}
	nilScopes := a
	nilScopes.Admission.BaseScopes = nil
	must(t, r.Settle(ctx, nilScopes, registry.SettlementCompleted))
	if reserved(a) {
		t.Fatal("the route is still reserved after its settlement with a nil scope list")
	}

	b := resolve()
	if _, err := connect(t, dbURL).Exec(ctx, `UPDATE aip_registry.route_assignments SET admission = admission || '{"note": "kept"}' WHERE action_id = $1`, b.ActionID); err != nil {
		t.Fatal(err)
	}
	must(t, r.Settle(ctx, b, registry.SettlementCompleted))
	if reserved(b) {
		t.Fatal("a route whose stored admission document carries an unknown member was not released")
	}
	got, err := r.ConnectorReplica(ctx, w.replicas[0].ID)
	must(t, err)
	if got.ActiveAssignments != 0 {
		t.Fatalf("replica active assignments %d after both settlements, want 0", got.ActiveAssignments)
	}
}

// TestResolveWaitsForLockedReplicas: when another transaction holds every
// eligible replica, Resolve skips them, then waits for them (at most
// RouteLockWait): it routes once they are released, and fails with
// registry.ErrReplicaUnavailable if they stay locked.
func TestResolveWaitsForLockedReplicas(t *testing.T) {
	ctx := t.Context()
	r, dbURL, clock := openClock(t, pgregistry.Config{RouteLockWait: 300 * time.Millisecond})
	seedWorld(t, r, clock, registry.FleetPolicy("quota:f"), 1, 1, 2, 4)
	req := func() registry.RouteRequest {
		return registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tenantName(0), CapabilityID: "alpha.read"}
	}
	_, err := r.Resolve(ctx, req()) // caches the binding, so the next route tries the one-round-trip way first
	must(t, err)
	holder := connect(t, dbURL)
	lockAll := func() {
		t.Helper()
		if _, err := holder.Exec(ctx, `BEGIN; SELECT 1 FROM aip_registry.connector_replicas FOR UPDATE`); err != nil {
			t.Fatal(err)
		}
	}

	lockAll()
	if _, err := r.Resolve(ctx, req()); !errors.Is(err, registry.ErrReplicaUnavailable) {
		t.Fatalf("Resolve with every replica locked throughout: %v, want registry.ErrReplicaUnavailable", err)
	}
	if _, err := holder.Exec(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}

	lockAll()
	waiter := connect(t, dbURL)
	done := make(chan error, 1)
	go func() {
		_, err := r.Resolve(ctx, req())
		done <- err
	}()
	// Release the replicas once the route waits for one of them.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		if err := waiter.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND locktype IN ('transactionid', 'tuple')
	AND pid IN (SELECT pid FROM pg_stat_activity WHERE datname = current_database()))`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Resolve returned %v before waiting for the locked replicas", err)
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("Resolve never waited for the locked replicas")
		}
	}
	if _, err := holder.Exec(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Resolve after the replicas were released: %v", err)
	}
}
