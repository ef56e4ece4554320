package memregistry_test

import (
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newBackend(t *testing.T, opts registrytest.Options) registrytest.Backend {
	t.Helper()
	r, err := memregistry.New(memregistry.Config{Now: opts.Clock.Now, Limits: opts.Limits})
	if err != nil {
		t.Fatal(err)
	}
	return registrytest.Backend{Catalog: r, Resolver: r, Admin: r, Fleet: r, Lifecycle: r, Rerouter: r, Orphans: r, Replicas: r, Readiness: r, Events: r, EventPruner: r}
}

func TestConformance(t *testing.T) { registrytest.Run(t, newBackend) }

func TestNewRejectsBadLimits(t *testing.T) {
	for _, l := range []registry.Limits{
		{MaxPageSize: -1},
		{MaxCapabilityBytes: 10 << 20},
	} {
		if _, err := memregistry.New(memregistry.Config{Limits: l}); !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", l, err)
		}
	}
	if _, err := memregistry.New(memregistry.Config{}); err != nil {
		t.Fatalf("New with defaults: %v", err)
	}
}
