package metricsdoc

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

const guide = `# Guide

### Metrics reference

| Process | Metric | Type | Labels | Meaning |
|---|---|---|---|---|
| p | ` + "`aip_a_total`" + ` | counter | ` + "`code`" + ` | a |
| p | ` + "`aip_b`" + ` | gauge | — | b |
| p | ` + "`aip_c_total`" + ` | counter | ` + "`reason`" + ` | never observed |
| p | ` + "`aip_missing_total`" + ` | counter | — | not registered |
| q | ` + "`aip_q`" + ` | gauge | — | another process |

## Next
| p | ` + "`aip_after`" + ` | gauge | — | not in the section |
`

func TestCompare(t *testing.T) {
	path := filepath.Join(t.TempDir(), "guide.md")
	if err := os.WriteFile(path, []byte(guide), 0o600); err != nil {
		t.Fatal(err)
	}
	doc, err := Read(path, "p")
	if err != nil {
		t.Fatal(err)
	}
	if len(doc) != 4 {
		t.Fatalf("Read: %d metrics %v, want the 4 of process p", len(doc), doc)
	}
	reg := prometheus.NewRegistry()
	a := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aip_a_total", Help: "a"}, []string{"status"})
	a.WithLabelValues("x").Inc()
	reg.MustRegister(a,
		prometheus.NewCounter(prometheus.CounterOpts{Name: "aip_b", Help: "b"}),
		prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aip_c_total", Help: "c"}, []string{"reason"}),
		prometheus.NewGauge(prometheus.GaugeOpts{Name: "aip_undocumented", Help: "u"}),
		prometheus.NewGauge(prometheus.GaugeOpts{Name: "go_other", Help: "not ours"}),
	)
	got, err := Compare(doc, reg)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"aip_a_total has labels [status], documented with [code]",
		"aip_b is a counter, documented as a gauge",
		"aip_missing_total is documented but not registered",
		"aip_undocumented is served but not documented",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Compare (-want +got):\n%s", diff)
	}
	// The probe left nothing behind.
	if again, _ := Compare(doc, reg); !cmp.Equal(again, want) {
		t.Errorf("second Compare: %v", again)
	}
}

func TestReadRefusesAGuideWithoutTheSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "guide.md")
	if err := os.WriteFile(path, []byte("# Guide\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path, "p"); err == nil {
		t.Fatal("Read succeeded on a guide without the metrics reference")
	}
}
