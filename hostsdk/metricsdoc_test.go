package hostsdk_test

import (
	"path/filepath"
	"testing"

	"github.com/aipfleet/aipfleet/internal/metricsdoc"
)

// TestMetricsAreDocumented compares a running host's metrics with the
// operator guide's metrics reference.
func TestMetricsAreDocumented(t *testing.T) {
	f := newFleet(t)
	h, _ := f.start(t, newTestConnector())
	doc, err := metricsdoc.Read(filepath.Join("..", "docs", "operator-guide.md"), "host")
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := metricsdoc.Compare(doc, h.MetricsRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Error(d)
	}
}
