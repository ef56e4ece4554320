package hostsdk_test

import (
	"testing"

	"github.com/aipfleet/aipfleet/internal/metricsdoc"
)

// TestMetricsAreDocumented compares a running host's metrics with the
// operator guide's metrics reference.
func TestMetricsAreDocumented(t *testing.T) {
	f := newFleet(t)
	h, _ := f.start(t, newTestConnector())
	metricsdoc.Check(t, "host", h.MetricsRegistry())
}
