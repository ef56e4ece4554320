package sidecar

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aipfleet/aipfleet/internal/metricsdoc"
)

// TestMetricsAreDocumented compares the metrics the sidecar adds to its
// host's with the operator guide's metrics reference (the host's own are
// compared by hostsdk's test).
func TestMetricsAreDocumented(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newEventsMetrics().collectors()...)
	metricsdoc.Check(t, "sidecar", reg)
}
