package controlplane_test

import (
	"testing"

	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// newPGBackend is the PostgreSQL variant of every scenario.
func newPGBackend(t *testing.T, clock *registrytest.Clock) backend {
	t.Helper()
	t.Skip("pgregistry does not implement registry.Lifecycle yet")
	return backend{}
}
