package registrytest

import (
	"testing"

	"github.com/aipfleet/aipfleet/registry"
)

// RandomScopeWorkload is RandomWorkload under small admission limits that
// differ from scope to scope (global 7, tenant 5, connector type 6,
// instance 3, binding 2, tenant retries 3), so a backend that splits a
// scope's counter into parts by its limit (pgregistry's stripes) holds the
// scopes of one route in different parts, and releases, retries, reroutes,
// lease expiry and stranded releases must each find the parts the
// reservation took. Its checks are RandomWorkload's; at the end every
// reservation is settled and every counter must be back to zero. Its trace
// depends on the limits alone: a backend that admits exactly by each
// scope's own limit gives memregistry's.
func RandomScopeWorkload(t *testing.T, nb NewBackend, seed uint64, steps int) []string {
	t.Helper()
	return randomWorkload(t, nb, seed, steps, registry.AdmissionPolicy{
		PolicyRef: "quota:model", Revision: 1, Enabled: true,
		MaxGlobalInFlight: 7, MaxTenantInFlight: 5, MaxConnectorTypeInFlight: 6,
		MaxInstanceInFlight: 3, MaxBindingInFlight: 2, MaxTenantRetryInFlight: 3,
		CircuitFailureThreshold: 2, CircuitOpenMS: 3_000,
	})
}
