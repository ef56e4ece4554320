package controlplane_test

import (
	"testing"

	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/internal/pgtest"
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
