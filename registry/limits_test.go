package registry_test

import (
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// TestHostLimitsAgree: the bounds a host checks its settings with when it
// starts (aip's) are the registry's bounds for the records the
// registration must equal: a larger one lets a host start that no
// registration can admit, a smaller one refuses a host the registry holds.
func TestHostLimitsAgree(t *testing.T) {
	for _, l := range []struct {
		name string
		host int
	}{
		{"aip.MaxTenantIDBytes", aip.MaxTenantIDBytes},
		{"aip.MaxSecretProviderRefBytes", aip.MaxSecretProviderRefBytes},
	} {
		if l.host != registry.MaxIdentifierBytes {
			t.Errorf("%s = %d, registry.MaxIdentifierBytes = %d", l.name, l.host, registry.MaxIdentifierBytes)
		}
	}
}
