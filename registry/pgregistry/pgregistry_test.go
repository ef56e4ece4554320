package pgregistry_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// open opens a registry on a fresh database with the suite's clock and
// limits.
func open(t testing.TB, opts registrytest.Options) (*pgregistry.Registry, string) {
	return openWith(t, opts, pgregistry.Config{})
}

func openWith(t testing.TB, opts registrytest.Options, cfg pgregistry.Config) (*pgregistry.Registry, string) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	cfg.ControlURL, cfg.DataURL, cfg.DataMaxConns = url, url, 16
	if opts.Clock != nil {
		cfg.Now = opts.Clock.Now
	}
	cfg.Limits = opts.Limits
	if cfg.AcquireTimeout == 0 {
		// The suites check outcomes, not latency: on a loaded machine,
		// 200 concurrent resolves queued for one tenant's three routing
		// lanes (NoOverbookingUnderLoad) waited past the 5 s default and
		// failed as a storage error.
		cfg.AcquireTimeout = pgregistry.MaxAcquireTimeout
	}
	r, err := pgregistry.Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("open registry: %v", err)
	}
	t.Cleanup(r.Close)
	return r, url
}

func newBackend(t *testing.T, opts registrytest.Options) registrytest.Backend {
	t.Helper()
	r, url := open(t, opts)
	b := backendOf(r)
	b.Another = func(t *testing.T) registrytest.Backend {
		// Another dispatcher on the same database: its own Registry and
		// pools (small ones: the suites run several at once).
		t.Helper()
		cfg := pgregistry.Config{ControlURL: url, DataURL: url, ControlMaxConns: 2, DataMaxConns: 6, Now: opts.Clock.Now,
			Limits: opts.Limits, AcquireTimeout: pgregistry.MaxAcquireTimeout}
		other, err := pgregistry.Open(context.Background(), cfg)
		if err != nil {
			t.Fatalf("open another registry on the same database: %v", err)
		}
		t.Cleanup(other.Close)
		return backendOf(other)
	}
	return b
}

func backendOf(r *pgregistry.Registry) registrytest.Backend {
	return registrytest.Backend{Catalog: r, Resolver: r, Admin: r, Fleet: r, Lifecycle: r, Rerouter: r, Orphans: r, Replicas: r, Readiness: r, Events: r, EventPruner: r}
}

// TestConformance runs the registry conformance suite against PostgreSQL.
func TestConformance(t *testing.T) {
	t.Parallel()
	registrytest.Run(t, newBackend)
}

// TestConformanceSQLCatalog runs the suite again with the catalog view
// cache off, so the catalog's SQL page query is held to the same rules.
func TestConformanceSQLCatalog(t *testing.T) {
	t.Parallel()
	registrytest.Run(t, func(t *testing.T, opts registrytest.Options) registrytest.Backend {
		r, _ := openWith(t, opts, pgregistry.Config{DisableCatalogCache: true})
		return registrytest.Backend{Catalog: r, Resolver: r, Admin: r, Fleet: r, Lifecycle: r, Rerouter: r, Orphans: r, Replicas: r, Readiness: r, Events: r, EventPruner: r}
	})
}
