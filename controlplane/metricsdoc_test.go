package controlplane_test

import (
	"path/filepath"
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
	doc, err := metricsdoc.Read(filepath.Join("..", "docs", "operator-guide.md"), "control plane")
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
