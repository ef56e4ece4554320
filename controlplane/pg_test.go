package controlplane_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// newPGBackend is the PostgreSQL variant of every scenario: a fresh
// database whose schema the administrator installs (control pool), and a
// data-plane-only registry for the service, as in production.
func newPGBackend(t *testing.T, clock *registrytest.Clock) backend {
	t.Helper()
	url := pgtest.NewDatabase(t)
	admin, err := pgregistry.Open(t.Context(), pgregistry.Config{ControlURL: url, Now: clock.Now, DataMaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	openData := func(t *testing.T) controlplane.Store {
		t.Helper()
		data, err := pgregistry.OpenDataPlane(t.Context(), pgregistry.Config{DataURL: url, Now: clock.Now, DataMaxConns: 8})
		if err != nil {
			t.Fatal(err)
		}
		if !data.DataPlaneOnly() {
			t.Fatal("OpenDataPlane returned a registry with a control pool")
		}
		t.Cleanup(data.Close)
		return data
	}
	return backend{
		Backend: registrytest.Backend{Catalog: admin, Resolver: admin, Admin: admin, Fleet: admin, Lifecycle: admin},
		Store:   openData(t),
		// A restarted control plane connects anew to the same database.
		reopen: openData,
		dbURL:  url,
	}
}

// TestMaintenanceBlockedByALockIsBounded: a maintenance cycle that waits on
// a row lock another session holds (a dispatcher stuck mid-transaction, e.g.
// partitioned from the database, holding the admission counters the expired
// replica's reservation must release) gives up after StoreTimeout and
// counts as a failed cycle, so /ready stops reporting a healthy maintenance
// loop; it does not wait for as long as the lock is held.
func TestMaintenanceBlockedByALockIsBounded(t *testing.T) {
	e := newEnv(t, newPGBackend, func(c *controlplane.Config) {
		// The loop runs (for /ready) but its first cycle is an hour away:
		// the test runs the cycles itself.
		c.DisableMaintenance, c.MaintenanceInterval, c.MaintenanceMaxBackoff = false, time.Hour, time.Hour
		c.StoreTimeout = 200 * time.Millisecond
	})
	h := e.provision("a1")
	r, _ := h.send(h.registration())
	r.lease(t)
	a, err := e.b.Resolver.Resolve(e.ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: "tenant-1", CapabilityID: "alpha.read"})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(leaseTTL + time.Second)

	conn, err := pgx.Connect(e.ctx, e.b.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	var locked int
	if err := tx.QueryRow(e.ctx, `WITH l AS (SELECT 1 FROM aip_registry.admission_counters WHERE active > 0 FOR UPDATE) SELECT count(*) FROM l`).Scan(&locked); err != nil || locked == 0 {
		t.Fatalf("locking the admission counters of route %s: %d rows, %v", a.ActionID, locked, err)
	}
	var holder int32
	if err := tx.QueryRow(e.ctx, `SELECT pg_backend_pid()`).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	// settled waits until the cycle that gave up left no session behind in
	// a transaction (still waiting for the lock, or aborted and not yet
	// rolled back): it would hold the replica's row, which the next cycle
	// skips (FOR UPDATE SKIP LOCKED). The server ends it by itself: the
	// maintenance transactions bound their lock waits (lock_timeout).
	settled := func() {
		t.Helper()
		probe, err := pgx.Connect(e.ctx, e.b.dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer probe.Close(context.Background())
		deadline := time.Now().Add(30 * time.Second)
		for {
			var busy int
			if err := probe.QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
				AND pid NOT IN (pg_backend_pid(), $1) AND state <> 'idle'`, holder).Scan(&busy); err != nil {
				t.Fatal(err)
			}
			if busy == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d sessions of a cycle that gave up were still in a transaction after 30s", busy)
			}
			time.Sleep(10 * time.Millisecond) // polling the server's sessions
		}
	}

	for cycle := range 3 {
		done := make(chan error, 1)
		go func() {
			_, err := e.svc.Maintain(e.ctx)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Fatalf("cycle %d expired the replica while its route was locked", cycle+1)
			}
			settled()
		case <-time.After(time.Minute):
			tx.Rollback(context.Background())
			<-done
			t.Fatalf("cycle %d was still blocked on the lock after a minute (StoreTimeout 200ms)", cycle+1)
		}
	}
	if doc := readyDoc(t, e.svc); doc.Status != "not_ready" || !contains(doc.Failing, "maintenance") {
		t.Fatalf("/ready after three blocked cycles: %s, failing %v", doc.Status, doc.Failing)
	}
	// Once the lock is released the next cycle expires the replica.
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := e.svc.Maintain(e.ctx); err != nil || n != 1 {
		t.Fatalf("Maintain after the lock ended = %d, %v; want 1 replica expired", n, err)
	}
}

// TestReadyOnPostgres checks what /ready reports of a data-plane-only
// PostgreSQL registry: the schema version, the catalog revision and a pool
// state without any control (catalog-admin) pool.
func TestReadyOnPostgres(t *testing.T) {
	e := newEnv(t, newPGBackend)
	doc := readyDoc(t, e.svc)
	if doc.Status != "ready" || doc.Backend != "postgres" || doc.SchemaVersion != pgregistry.SchemaVersion {
		t.Fatalf("ready document %+v", doc)
	}
	if rev, err := e.b.Admin.CatalogRevision(e.ctx); err != nil || doc.CatalogRevision != rev || rev == 0 {
		t.Fatalf("catalog revision %d, registry %d (%v)", doc.CatalogRevision, rev, err)
	}
	if doc.Pool == nil || doc.Pool.ControlMax != 0 || doc.Pool.ControlSize != 0 || doc.Pool.DataMax == 0 {
		t.Fatalf("pool %+v: want a data pool and no control pool", doc.Pool)
	}
	for _, want := range []string{"store.schema", "store.catalog", "store.pool", "service"} {
		if !contains(checkNames(doc), want) {
			t.Fatalf("checks %v lack %s", checkNames(doc), want)
		}
	}
}
