package pgregistry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// A storage failure in the middle of a transaction — after some of its
// statements ran — must leave no partial route, reservation, settlement,
// lifecycle change or catalog write. Failures are injected with triggers on
// the statement that runs late in each transaction, in two forms: the
// statement fails, or the server ends the connection (as a crash or a
// network cut does).

// failure is how an injected trigger fails.
type failure struct {
	name string
	body string
}

var failures = []failure{
	{"statement fails", `RAISE EXCEPTION 'injected storage failure' USING ERRCODE = 'XX000';`},
	{"connection lost", `PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(5);`},
}

// inject installs a trigger on table for event that fails the way f says,
// and returns a function removing it.
func inject(t *testing.T, admin *pgx.Conn, table, event, when string, f failure) func() {
	t.Helper()
	ctx := t.Context()
	if when != "" {
		when = "WHEN (" + when + ")"
	}
	sql := fmt.Sprintf(`
CREATE OR REPLACE FUNCTION aip_registry.test_fail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN %s RETURN NEW; END $$;
CREATE TRIGGER test_fail BEFORE %s ON aip_registry.%s FOR EACH ROW %s EXECUTE FUNCTION aip_registry.test_fail();`, f.body, event, table, when)
	if _, err := admin.Exec(ctx, sql); err != nil {
		t.Fatalf("inject failure: %v", err)
	}
	return func() {
		if _, err := admin.Exec(context.Background(), `DROP TRIGGER test_fail ON aip_registry.`+table); err != nil {
			t.Fatalf("remove injected failure: %v", err)
		}
	}
}

func wantStorage(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, registry.ErrStorage) {
		t.Fatalf("%s with an injected failure: %v, want registry.ErrStorage", what, err)
	}
}

func TestStorageFailureCommitsNothing(t *testing.T) {
	for _, f := range failures {
		t.Run(f.name, func(t *testing.T) { testStorageFailure(t, f) })
	}
}

func testStorageFailure(t *testing.T, f failure) {
	ctx := t.Context()
	r, dbURL, clock := openClock(t, pgregistry.Config{})
	w := seedWorld(t, r, clock, registry.ConservativePolicy("quota:c"), 1, 1, 1, 4)
	admin := connect(t, dbURL)
	rep := w.replicas[0]
	ledger := func() registry.Ledger {
		t.Helper()
		l, err := r.Ledger(ctx)
		must(t, err)
		registrytest.CheckLedger(t, l)
		return l
	}
	replica := func() registry.ConnectorReplica {
		t.Helper()
		got, err := r.ConnectorReplica(ctx, rep.ID)
		must(t, err)
		return got
	}

	// Resolve fails at the route insert, after the replica was counted,
	// or at the last admission counter, after the route was inserted and
	// the other counters reserved: no route, no count, no counter. The
	// first failures are of the two-round-trip route; a route made since
	// cached the binding, so the next are of the one-round-trip route.
	req := registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tenantName(0), CapabilityID: "alpha.read"}
	failResolve := func(table, event, when string) {
		t.Helper()
		undo := inject(t, admin, table, event, when, f)
		_, err := r.Resolve(ctx, req)
		wantStorage(t, "Resolve", err)
		undo()
		if _, err := r.Assignment(ctx, req.ActionID); !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("a failed Resolve left a route: %v", err)
		}
		if l := ledger(); len(l.Counters) != 0 || len(l.Reservations) != 0 || replica().ActiveAssignments != 0 {
			t.Fatalf("a failed Resolve left a reservation: %+v, replica active %d", l, replica().ActiveAssignments)
		}
	}
	for range 2 {
		failResolve("route_assignments", "INSERT", "")
		failResolve("admission_counters", "INSERT OR UPDATE", "NEW.scope_kind = 'binding'")
		warm, err := r.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tenantName(0), CapabilityID: "alpha.read"})
		must(t, err)
		must(t, r.Settle(ctx, warm, registry.SettlementCompleted))
	}
	a, err := r.Resolve(ctx, req)
	must(t, err)

	// Settle fails at the route release: the reservation, the counters, the
	// replica's count and its circuit stay as they were.
	before := ledger()
	undo := inject(t, admin, "route_assignments", "UPDATE", "OLD.reserved AND NOT NEW.reserved", f)
	wantStorage(t, "Settle", r.Settle(ctx, a, registry.SettlementOutcomeUnknown))
	undo()
	if l := ledger(); len(l.Reservations) != 1 || len(l.Counters) != len(before.Counters) {
		t.Fatalf("a failed Settle changed the ledger: %+v, before %+v", l, before)
	}
	if got := replica(); got.ActiveAssignments != 1 || got.Circuit.ConsecutiveFailures != 0 {
		t.Fatalf("a failed Settle changed the replica: %+v", got)
	}
	// A retry of the same Resolve returns the same route, reserving nothing
	// more.
	again, err := r.Resolve(ctx, req)
	must(t, err)
	if !again.Equal(&a) || replica().ActiveAssignments != 1 {
		t.Fatal("the route changed after a failed settlement")
	}

	// Lease expiry fails at the replica update: the route stays reserved.
	clock.Advance(2 * time.Hour)
	undo = inject(t, admin, "connector_replicas", "UPDATE", "NEW.status = 'offline'", f)
	_, err = r.ExpireStaleReplicas(ctx, 10)
	wantStorage(t, "ExpireStaleReplicas", err)
	undo()
	if res, err := r.Reservation(ctx, a.ActionID); err != nil || !res.Reserved {
		t.Fatalf("a failed expiry released the route: %+v, %v", res, err)
	}
	if got := replica(); got.Status != aip.ReplicaReady || got.ActiveAssignments != 1 {
		t.Fatalf("a failed expiry changed the replica: %+v", got)
	}
	must(t, r.Settle(ctx, a, registry.SettlementCompleted))
	if l := ledger(); len(l.Counters) != 0 || len(l.Reservations) != 0 {
		t.Fatalf("settling after the failures left %+v", l)
	}

	// A catalog write fails at the publication: nothing of it is visible
	// and the revision stays.
	rev, err := r.CatalogRevision(ctx)
	must(t, err)
	undo = inject(t, admin, "catalog_revision", "UPDATE", "", f)
	wantStorage(t, "PutAdmissionPolicy", r.PutAdmissionPolicy(ctx, registry.FleetPolicy("quota:late")))
	wantStorage(t, "Batch", r.Batch(ctx, func(ad registry.Administrator) error {
		return ad.PutAdmissionPolicy(ctx, registry.FleetPolicy("quota:batch"))
	}))
	undo()
	for _, ref := range []string{"quota:late", "quota:batch"} {
		if _, err := r.AdmissionPolicy(ctx, ref); !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("a failed catalog write left policy %s: %v", ref, err)
		}
	}
	if got, _ := r.CatalogRevision(ctx); got != rev {
		t.Fatalf("a failed catalog write moved the revision from %d to %d", rev, got)
	}
}

// TestLifecycleFailureCommitsNothing: a lifecycle batch that fails at its
// replay claims commits neither the replica change nor any claim, and the
// same command then succeeds.
func TestLifecycleFailureCommitsNothing(t *testing.T) {
	for _, f := range failures {
		t.Run(f.name, func(t *testing.T) {
			ctx := t.Context()
			r, dbURL, clock := openClock(t, pgregistry.Config{})
			admin := connect(t, dbURL)
			lw, err := registrytest.NewLifecycleWorld(ctx, r)
			must(t, err)
			prov := lw.ProvisionedReplica("crepl_lc", clock.Now())
			must(t, r.PutReplica(ctx, prov))
			cmd := registrytest.LifecycleCommand(clock.Now(), aip.RegisterCommand(lw.Registration(&prov)))
			undo := inject(t, admin, "control_replay", "INSERT", "", f)
			res, err := r.ApplyLifecycle(ctx, []registry.LifecycleCommand{cmd})
			undo()
			if err == nil || res != nil {
				t.Fatalf("ApplyLifecycle with an injected failure: %v, %v; want an error and no results", res, err)
			}
			wantStorage(t, "ApplyLifecycle", err)
			if got, err := r.ConnectorReplica(ctx, prov.ID); err != nil || got.Status != aip.ReplicaOffline || got.HealthRevision != 0 {
				t.Fatalf("a failed lifecycle call changed the replica: %+v, %v", got, err)
			}
			var claims int
			must(t, admin.QueryRow(ctx, `SELECT count(*) FROM aip_registry.control_replay`).Scan(&claims))
			if claims != 0 {
				t.Fatalf("a failed lifecycle call left %d replay claims", claims)
			}
			res, err = r.ApplyLifecycle(ctx, []registry.LifecycleCommand{cmd})
			must(t, err)
			if res[0].Err != nil || res[0].Replayed {
				t.Fatalf("retrying the failed registration: %+v", res[0])
			}
		})
	}
}

// TestReplayClaimsDoNotAccumulate: every lifecycle call prunes at least as
// many expired replay claims as it stores, so the claims table stays
// bounded with batches larger than the prune batch (the service coalesces
// up to registry.MaxLifecycleBatch commands into one call).
func TestReplayClaimsDoNotAccumulate(t *testing.T) {
	ctx := t.Context()
	r, dbURL, clock := openClock(t, pgregistry.Config{})
	admin := connect(t, dbURL)
	batch := func() []registry.LifecycleCommand {
		cmds := make([]registry.LifecycleCommand, registry.MaxLifecycleBatch)
		for i := range cmds {
			// Commands for replicas nobody provisioned are rejected, and
			// each claims its request ID.
			cmds[i] = registrytest.LifecycleCommand(clock.Now(), aip.HeartbeatCommand(aip.Heartbeat{
				ReplicaID: fmt.Sprintf("crepl_ghost%04d", i), ConnectorReady: true}))
		}
		return cmds
	}
	claims := func() (n int) {
		must(t, admin.QueryRow(ctx, `SELECT count(*) FROM aip_registry.control_replay`).Scan(&n))
		return n
	}
	for call := range 3 {
		res, err := r.ApplyLifecycle(ctx, batch())
		must(t, err)
		if !errors.Is(res[0].Err, registry.ErrNotFound) {
			t.Fatalf("a command for an unprovisioned replica: %v", res[0].Err)
		}
		// Only this call's claims are live; the earlier ones expired.
		if n := claims(); n != registry.MaxLifecycleBatch {
			t.Fatalf("after call %d the claims table holds %d claims, want the %d live ones", call+1, n, registry.MaxLifecycleBatch)
		}
		clock.Advance(aip.MaxMessageLifetime + registry.ReplayClaimGrace)
	}
}
