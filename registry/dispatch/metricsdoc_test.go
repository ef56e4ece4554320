package dispatch_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/metricsdoc"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// TestMetricsAreDocumented compares the dispatcher's metrics with the
// operator guide's metrics reference.
func TestMetricsAreDocumented(t *testing.T) {
	d, reg := metricsDispatcher(t)
	// A request, so that the vector of requests has a sample.
	d.Handler().ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/health", nil))
	metricsdoc.Check(t, "dispatcher", reg)
}

// metricsDispatcher is a dispatcher on an empty memregistry whose metrics
// go to the returned registry; it is closed when the test ends.
func metricsDispatcher(t *testing.T) (*dispatch.Dispatcher, *prometheus.Registry) {
	t.Helper()
	key, _ := aip.GenerateSigningKey()
	store, err := memregistry.New(memregistry.Config{})
	must(t, err)
	verifier, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: []tenanttoken.Issuer{{Name: issuer, DIDs: []string{key.DID()}}}})
	must(t, err)
	reg := prometheus.NewRegistry()
	d, err := dispatch.New(dispatch.Config{SigningKey: key, PrincipalID: gatewayID, Metrics: reg},
		dispatch.Deps{Resolver: store, Catalog: store, Tokens: verifier})
	must(t, err)
	t.Cleanup(func() { d.Close() })
	return d, reg
}
