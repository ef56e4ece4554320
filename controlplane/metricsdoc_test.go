package controlplane_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/internal/metricsdoc"
)

// TestMetricsAreDocumented compares the control plane's metrics with the
// operator guide's metrics reference.
func TestMetricsAreDocumented(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, newMemBackend, func(c *controlplane.Config) { c.Metrics = reg })
	// A request, so that the vectors of requests have a sample.
	httptestRecorder(e.svc, []byte(`{}`))
	metricsdoc.Check(t, "control plane", reg)
}
