package pgregistry_test

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// rolesSQL returns deploy/postgres/roles.sql.
func rolesSQL(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "deploy", "postgres", "roles.sql"))
	if err != nil {
		t.Fatalf("read roles.sql: %v", err)
	}
	return string(b)
}

// applyRoles runs roles.sql as the superuser. Roles are cluster-wide and
// other test runs may apply the script at the same time: a concurrent
// catalog update is retried.
func applyRoles(t *testing.T, superURL, sql string) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		c := connect(t, superURL)
		_, err := c.Exec(t.Context(), sql)
		if err == nil {
			return
		}
		if attempt < 5 && strings.Contains(err.Error(), "concurrently") {
			time.Sleep(time.Duration(attempt+1) * 50 * time.Millisecond)
			continue
		}
		t.Fatalf("apply roles.sql: %v", err)
	}
}

// TestRoles applies deploy/postgres/roles.sql the documented way (roles,
// migration as the admin role, roles again) and proves what each role can
// and cannot do.
func TestRoles(t *testing.T) {
	ctx := t.Context()
	superURL := pgtest.NewDatabase(t)
	sql := rolesSQL(t)
	applyRoles(t, superURL, sql)
	adminURL := asRole(t, superURL, "aip_registry_admin")
	dataURL := asRole(t, superURL, "aip_registry_data")
	lifecycleURL := asRole(t, superURL, "aip_registry_lifecycle")

	// A session of the data or lifecycle role cut off mid-transaction does
	// not hold its locks for ever.
	for _, u := range []string{dataURL, lifecycleURL} {
		conn, err := pgx.Connect(ctx, u)
		must(t, err)
		var v string
		must(t, conn.QueryRow(ctx, "SHOW idle_in_transaction_session_timeout").Scan(&v))
		conn.Close(ctx)
		if v != "1min" {
			t.Errorf("idle_in_transaction_session_timeout is %q for %s, want 1min", v, u)
		}
	}

	// The data role cannot install the schema; the admin role can.
	if err := pgregistry.Migrate(ctx, dataURL); err == nil {
		t.Fatal("the data role installed the schema")
	}
	must(t, pgregistry.Migrate(ctx, adminURL))
	applyRoles(t, superURL, sql)
	applyRoles(t, superURL, sql) // idempotent

	clock := registrytest.NewClock(registrytest.Epoch)
	full, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: adminURL, DataURL: dataURL, Now: clock.Now})
	must(t, err)
	defer full.Close()
	lw, err := registrytest.NewLifecycleWorld(ctx, full)
	must(t, err)

	// The data role serves the data plane: catalog reads, routing,
	// settlement, replica writes, lease expiry, status and the ledger.
	ready := registrytest.Replica("crepl_ready", lw.Instance.ID, lw.Version.ID, clock.Now().Add(time.Minute))
	ready.PeerPrincipalID, ready.PeerPrincipalKind = lw.Version.Manifest.Agent.ID, lw.Version.Manifest.Agent.Kind
	must(t, full.PutReplica(ctx, ready))
	a, err := full.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: lw.Instance.TenantID, CapabilityID: "alpha.read"})
	must(t, err)
	must(t, full.Settle(ctx, a, registry.SettlementCompleted))
	if _, err := full.QueryCapabilities(ctx, registry.CatalogQuery{Limit: 5}, registry.ForTenant(lw.Instance.TenantID)); err != nil {
		t.Fatal(err)
	}
	if _, err := full.Status(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := full.Ledger(ctx); err != nil { // the dispatcher's reconciliation reads it
		t.Fatal(err)
	}
	clock.Advance(2 * time.Minute)
	if _, err := full.ExpireStaleReplicas(ctx, 10); err != nil {
		t.Fatal(err)
	}
	// The data role keeps the event log: the dispatcher appends verified
	// deliveries (a redelivery included) and reads a tenant's events.
	for range 2 {
		stored, err := full.AppendEvents(ctx, registrytest.EventBatch(lw.Instance.TenantID, "ready", "evt_1", "evt_2"))
		must(t, err)
		if stored[1].Sequence != 2 {
			t.Fatalf("events appended through the data role: %+v", stored)
		}
	}
	if p, err := full.Events(ctx, lw.Instance.TenantID, 0, 10); err != nil || len(p.Events) != 2 {
		t.Fatalf("events read through the data role: %+v, %v", p, err)
	}

	// The lifecycle role serves the lifecycle service.
	lc, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: lifecycleURL, Now: clock.Now})
	must(t, err)
	defer lc.Close()
	prov := lw.ProvisionedReplica("crepl_lc", clock.Now())
	must(t, full.PutReplica(ctx, prov))
	res, err := lc.ApplyLifecycle(ctx, []registry.LifecycleCommand{registrytest.LifecycleCommand(clock.Now(), aip.RegisterCommand(lw.Registration(&prov)))})
	must(t, err)
	if res[0].Err != nil {
		t.Fatalf("registration through the lifecycle role: %v", res[0].Err)
	}
	if rd, err := lc.Readiness(ctx); err != nil || !rd.Ready() {
		t.Fatalf("lifecycle role readiness: %+v, %v", rd, err)
	}
	// The control plane's maintenance and fleet views run on it too: a
	// route reserved on the registered replica is released when its lease
	// expires.
	held, err := full.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: lw.Instance.TenantID, CapabilityID: "alpha.read"})
	must(t, err)
	if held.ReplicaID != prov.ID {
		t.Fatalf("route went to %s, want the only live replica %s", held.ReplicaID, prov.ID)
	}
	if _, err := lc.Status(ctx); err != nil {
		t.Fatalf("fleet status through the lifecycle role: %v", err)
	}
	if _, err := lc.ListReplicas(ctx, "", 10); err != nil {
		t.Fatalf("replica list through the lifecycle role: %v", err)
	}
	clock.Advance(2 * time.Minute)
	if n, err := lc.ExpireStaleReplicas(ctx, 10); err != nil || n != 1 {
		t.Fatalf("lease maintenance through the lifecycle role: expired %d, %v; want 1", n, err)
	}
	if res, err := full.Reservation(ctx, held.ActionID); err != nil || res.Reserved {
		t.Fatalf("reservation after expiry through the lifecycle role: %+v, %v", res, err)
	}
	// It releases the reservations stranded on a replica that went
	// offline cleanly.
	rep, err := full.ConnectorReplica(ctx, prov.ID)
	must(t, err)
	res, err = lc.ApplyLifecycle(ctx, []registry.LifecycleCommand{registrytest.LifecycleCommand(clock.Now(), aip.RegisterCommand(lw.Registration(&rep)))})
	must(t, err)
	if res[0].Err != nil {
		t.Fatalf("registration again through the lifecycle role: %v", res[0].Err)
	}
	stranded, err := full.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: lw.Instance.TenantID, CapabilityID: "alpha.read"})
	must(t, err)
	res, err = lc.ApplyLifecycle(ctx, []registry.LifecycleCommand{registrytest.LifecycleCommand(clock.Now(),
		aip.TransitionCommand(aip.OpOffline, aip.Transition{ReplicaID: prov.ID, PreviousSequence: res[0].Replica.HealthRevision}))})
	must(t, err)
	if res[0].Err != nil {
		t.Fatalf("offline through the lifecycle role: %v", res[0].Err)
	}
	if rel, err := lc.ReleaseStrandedReservations(ctx, 0, 10); err != nil || rel != (registry.StrandedRelease{Replicas: 1, Reservations: 1}) {
		t.Fatalf("stranded release through the lifecycle role: %+v, %v; want 1 replica, 1 reservation", rel, err)
	}
	if res, err := full.Reservation(ctx, stranded.ActionID); err != nil || res.Reserved {
		t.Fatalf("stranded reservation after the release through the lifecycle role: %+v, %v", res, err)
	}
	// Its maintenance prunes old events (the data role may not)...
	if _, err := full.PruneEvents(ctx, registrytest.Epoch.Add(time.Hour), 10); !errors.Is(err, registry.ErrStorage) || !strings.Contains(err.Error(), "privilege") {
		t.Fatalf("PruneEvents through the data role: %v, want a privilege failure", err)
	}
	if n, err := lc.PruneEvents(ctx, registrytest.Epoch.Add(time.Hour), 10); err != nil || n != 2 {
		t.Fatalf("PruneEvents through the lifecycle role: %d, %v; want 2", n, err)
	}
	// (migration 0009's trigger remembered their IDs, which the data role
	// reads: delivered again, they are not stored again)
	if again, err := full.AppendEvents(ctx, registrytest.EventBatch(lw.Instance.TenantID, "ready", "evt_1")); err != nil || !again[0].Pruned {
		t.Fatalf("a pruned event appended again through the data role: %+v, %v; want it pruned, not stored", again, err)
	}
	// ...and, past the second horizon, forgets those IDs (the data role
	// may not): delivered again, the event is stored again.
	if _, err := full.ForgetPrunedEvents(ctx, registrytest.Epoch.Add(time.Hour), 10); !errors.Is(err, registry.ErrStorage) || !strings.Contains(err.Error(), "privilege") {
		t.Fatalf("ForgetPrunedEvents through the data role: %v, want a privilege failure", err)
	}
	if n, err := lc.ForgetPrunedEvents(ctx, registrytest.Epoch.Add(time.Hour), 10); err != nil || n != 2 {
		t.Fatalf("ForgetPrunedEvents through the lifecycle role: %d, %v; want 2", n, err)
	}
	if again, err := full.AppendEvents(ctx, registrytest.EventBatch(lw.Instance.TenantID, "ready", "evt_1")); err != nil || again[0].Pruned || again[0].Sequence == 0 {
		t.Fatalf("an event appended again after its ID was forgotten: %+v, %v; want it stored", again, err)
	}
	// ...but it cannot route, reserve or read or append events.
	if _, err := lc.Events(ctx, lw.Instance.TenantID, 0, 10); !errors.Is(err, registry.ErrStorage) || !strings.Contains(err.Error(), "privilege") {
		t.Fatalf("Events through the lifecycle role: %v, want a privilege failure", err)
	}
	_, err = lc.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: lw.Instance.TenantID, CapabilityID: "alpha.read"})
	if !errors.Is(err, registry.ErrStorage) || !strings.Contains(err.Error(), "privilege") {
		t.Fatalf("Resolve through the lifecycle role: %v, want a privilege failure", err)
	}

	// What the restricted roles may not do, statement by statement.
	denied := map[string][]string{
		"aip_registry_data": {
			`INSERT INTO aip_registry.connector_types (type_id, name, owner, enabled, updated_at_ms) VALUES ('ctype_x', 'x', 'x', true, 0)`,
			`UPDATE aip_registry.connector_types SET enabled = false`,
			`UPDATE aip_registry.connector_versions SET status = 'revoked'`,
			`INSERT INTO aip_registry.capability_definitions (capability_id, contract_digest, schema_digest, capability, size_bytes, search_text) VALUES ('x', 'x', 'x', '{}', 1, 'x')`,
			`UPDATE aip_registry.connector_instances SET status = 'disabled'`,
			`UPDATE aip_registry.capability_bindings SET enabled = false`,
			`DELETE FROM aip_registry.capability_bindings`,
			`UPDATE aip_registry.admission_policies SET enabled = false`,
			`UPDATE aip_registry.catalog_revision SET revision = revision + 1`,
			`INSERT INTO aip_registry.version_capabilities (version_id, capability_id) VALUES ('cver_alpha1', 'alpha.read')`,
			`DELETE FROM aip_registry.route_assignments`,
			`DELETE FROM aip_registry.connector_replicas`,
			`SELECT * FROM aip_registry.control_replay`,
			`TRUNCATE aip_registry.admission_counters`,
			`CREATE TABLE aip_registry.intruder (x int)`,
			`CREATE TABLE public.intruder (x int)`,
			`ALTER TABLE aip_registry.route_assignments ADD COLUMN x int`,
			`DROP TABLE aip_registry.route_assignments`,
			`DROP SCHEMA aip_registry CASCADE`,
			`CREATE INDEX intruder ON aip_registry.connector_replicas (endpoint)`,
			`UPDATE aip_registry.schema_migrations SET checksum = 'x'`,
			`UPDATE aip_registry.events SET event = '{}'`,
			`DELETE FROM aip_registry.events`,
			`TRUNCATE aip_registry.events`,
			`DELETE FROM aip_registry.event_log_heads`,
			`INSERT INTO aip_registry.pruned_events VALUES ('t', 'evt_x', 0)`,
			`DELETE FROM aip_registry.pruned_events`,
		},
		"aip_registry_lifecycle": {
			`INSERT INTO aip_registry.route_assignments (action_id) VALUES ('act_x')`,
			`DELETE FROM aip_registry.route_assignments`,
			`INSERT INTO aip_registry.route_history (action_id) VALUES ('act_x')`,
			`INSERT INTO aip_registry.admission_counters (scope_kind, scope_key, active, reserve_limit) VALUES ('tenant', 'x', 1, 1)`,
			`DELETE FROM aip_registry.admission_counters`,
			`SELECT * FROM aip_registry.capability_bindings`,
			`SELECT * FROM aip_registry.admission_policies`,
			`INSERT INTO aip_registry.connector_replicas (replica_id) VALUES ('crepl_x')`,
			`DELETE FROM aip_registry.connector_replicas`,
			`UPDATE aip_registry.connector_types SET enabled = false`,
			`UPDATE aip_registry.connector_instances SET status = 'disabled'`,
			`UPDATE aip_registry.catalog_revision SET revision = revision + 1`,
			`CREATE TABLE aip_registry.intruder (x int)`,
			`ALTER TABLE aip_registry.connector_replicas ADD COLUMN x int`,
			`DROP TABLE aip_registry.control_replay`,
			`SELECT aip_registry.scope_full(0)`,
			`SELECT aip_registry.scopes_full('0')`,
			`SELECT aip_registry.replica_taken()`,
			`SELECT * FROM aip_registry.events`,
			`SELECT event FROM aip_registry.events`,
			`INSERT INTO aip_registry.pruned_events VALUES ('t', 'evt_x', 0)`,
			`UPDATE aip_registry.pruned_events SET received_at_ms = 0`,
			`TRUNCATE aip_registry.pruned_events`,
			`INSERT INTO aip_registry.events (tenant_id, sequence) VALUES ('t', 1)`,
			`UPDATE aip_registry.events SET event = '{}'`,
			`DELETE FROM aip_registry.events WHERE event->>'id' = 'x'`,
			`SELECT * FROM aip_registry.event_log_heads`,
			`UPDATE aip_registry.event_log_heads SET last_sequence = 0`,
		},
	}
	for role, stmts := range denied {
		c := connect(t, asRole(t, superURL, role))
		for _, s := range stmts {
			_, err := c.Exec(ctx, s)
			if st := sqlState(err); st != "42501" {
				t.Errorf("%s ran %q: got %v (SQLSTATE %q), want insufficient_privilege (42501)", role, s, err, st)
			}
		}
	}

	// The admin role owns the schema: it can migrate (done above) and
	// change it.
	ad := connect(t, adminURL)
	if _, err := ad.Exec(ctx, `CREATE TABLE aip_registry.admin_scratch (x int); DROP TABLE aip_registry.admin_scratch`); err != nil {
		t.Fatalf("the admin role cannot change its schema: %v", err)
	}
}
