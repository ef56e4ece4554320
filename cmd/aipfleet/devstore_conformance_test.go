package main

import (
	"path/filepath"
	"testing"

	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestDevRegistryConformance: the dev registry (memregistry persisted to a
// snapshot file) keeps the registry contracts the dispatcher and control
// plane rely on, the route pin of a cancel included.
func TestDevRegistryConformance(t *testing.T) {
	registrytest.Run(t, func(t *testing.T, opts registrytest.Options) registrytest.Backend {
		reg, stop := devRegistryWith(t, filepath.Join(t.TempDir(), "registry.json"), memregistry.Config{Now: opts.Clock.Now, Limits: opts.Limits})
		t.Cleanup(stop)
		b := registrytest.Backend{Catalog: reg, Resolver: reg, Admin: reg, Fleet: reg, Lifecycle: reg, Rerouter: reg,
			Orphans: reg, Replicas: reg, Readiness: reg, Events: reg}
		if p, ok := any(reg).(registry.EventPruner); ok {
			b.EventPruner = p
		}
		return b
	})
}
