package pgregistry_test

import (
	"testing"

	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestModelMatchesMemregistry runs registrytest's seeded random workload on
// memregistry and on PostgreSQL and requires the same trace: every
// operation gives the same result class and picks the same replica on
// both backends.
func TestModelMatchesMemregistry(t *testing.T) {
	t.Parallel()
	compareWorkloads(t, registrytest.RandomWorkload, 11, 12, 13, 14, 15, 16)
}

// TestScopeModelMatchesMemregistry is TestModelMatchesMemregistry under
// limits that differ per scope (registrytest.RandomScopeWorkload): routes
// hold their scopes in different stripes, and admission, refusals and
// every release must still be memregistry's.
func TestScopeModelMatchesMemregistry(t *testing.T) {
	t.Parallel()
	compareWorkloads(t, registrytest.RandomScopeWorkload, 21, 22, 23, 24, 25, 26)
}

// compareWorkloads runs workload with each seed on memregistry and on
// PostgreSQL and requires the same trace.
func compareWorkloads(t *testing.T, workload func(*testing.T, registrytest.NewBackend, uint64, int) []string, seeds ...uint64) {
	t.Helper()
	mem := func(t *testing.T, opts registrytest.Options) registrytest.Backend {
		r, err := memregistry.New(memregistry.Config{Now: opts.Clock.Now, Limits: opts.Limits})
		if err != nil {
			t.Fatal(err)
		}
		return registrytest.Backend{Catalog: r, Resolver: r, Admin: r, Fleet: r, Lifecycle: r, Rerouter: r, Orphans: r, Replicas: r, Readiness: r, Events: r, EventPruner: r}
	}
	for _, seed := range seeds {
		want := workload(t, mem, seed, 200)
		got := workload(t, newBackend, seed, 200)
		for i := range max(len(want), len(got)) {
			var w, g string
			if i < len(want) {
				w = want[i]
			}
			if i < len(got) {
				g = got[i]
			}
			if w != g {
				t.Fatalf("seed %d: the backends diverge at trace line %d:\nmemregistry: %s\npgregistry:  %s", seed, i, w, g)
			}
		}
	}
}
