package sidecar

import (
	"path/filepath"
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
	doc, err := metricsdoc.Read(filepath.Join("..", "docs", "operator-guide.md"), "sidecar")
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := metricsdoc.Compare(doc, reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Error(d)
	}
}
