// Package metricsdoc reads the metrics reference of docs/operator-guide.md
// (its "Metrics reference" table) and compares it with the collectors a
// process registers, so that the documented names, types and labels stay
// those the code serves. Each component's tests call Compare with its own
// registry.
package metricsdoc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Heading is the heading of the table Read parses.
const Heading = "### Metrics reference"

// Prefix is the prefix of the metrics the reference documents; others (the
// Go runtime's) are not compared.
const Prefix = "aip_"

// Metric is one documented metric.
type Metric struct {
	Name   string
	Type   string   // counter, gauge or histogram
	Labels []string // sorted label names
}

var backticked = regexp.MustCompile("`([^`]+)`")

// Read returns the metrics the reference in the guide at path documents for
// process (its "Process" column), by name.
func Read(path, process string) (map[string]Metric, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	_, table, ok := strings.Cut(string(raw), "\n"+Heading+"\n")
	if !ok {
		return nil, fmt.Errorf("metricsdoc: %s has no %q section", path, Heading)
	}
	out := map[string]Metric{}
	rows := 0
	for _, line := range strings.Split(table, "\n") {
		if strings.HasPrefix(line, "#") {
			break
		}
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| Process ") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) < 5 {
			return nil, fmt.Errorf("metricsdoc: row %q has %d cells, want Process | Metric | Type | Labels | Meaning", line, len(cells))
		}
		rows++
		if strings.TrimSpace(cells[0]) != process {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		m := Metric{Name: name, Type: strings.TrimSpace(cells[2]), Labels: []string{}}
		for _, l := range backticked.FindAllStringSubmatch(cells[3], -1) {
			m.Labels = append(m.Labels, l[1])
		}
		sort.Strings(m.Labels)
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("metricsdoc: %s is documented twice for the %s", name, process)
		}
		out[name] = m
	}
	if rows == 0 {
		return nil, fmt.Errorf("metricsdoc: the %q section of %s has no table rows", Heading, path)
	}
	return out, nil
}

// Compare returns every difference between the documented metrics and
// those reg serves: a metric reg serves that is undocumented or documented
// with another type or other labels, and a documented metric reg does not
// register. A vector no sample has been observed on yet is absent from a
// scrape; Compare still finds it registered (a registration of the same
// name with another help string is refused), but can check its type and
// labels only once it has a sample.
func Compare(doc map[string]Metric, reg *prometheus.Registry) ([]string, error) {
	families, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	var diffs []string
	served := map[string]bool{}
	for _, f := range families {
		name := f.GetName()
		if !strings.HasPrefix(name, Prefix) {
			continue
		}
		served[name] = true
		d, ok := doc[name]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("%s is served but not documented", name))
			continue
		}
		if typ := typeName(f.GetType()); typ != d.Type {
			diffs = append(diffs, fmt.Sprintf("%s is a %s, documented as a %s", name, typ, d.Type))
		}
		if labels := labelNames(f); !slices.Equal(labels, d.Labels) {
			diffs = append(diffs, fmt.Sprintf("%s has labels %v, documented with %v", name, labels, d.Labels))
		}
	}
	for name := range doc {
		if served[name] {
			continue
		}
		registered, err := isRegistered(reg, name)
		if err != nil {
			return nil, err
		}
		if !registered {
			diffs = append(diffs, fmt.Sprintf("%s is documented but not registered", name))
		}
	}
	sort.Strings(diffs)
	return diffs, nil
}

// isRegistered reports whether reg holds a collector named name: a probe of
// that name with a help string no collector has is refused exactly then.
func isRegistered(reg *prometheus.Registry, name string) (bool, error) {
	probe := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "metricsdoc probe " + name})
	err := reg.Register(probe)
	if err == nil {
		reg.Unregister(probe)
		return false, nil
	}
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		return true, nil
	}
	if strings.Contains(err.Error(), "has different label names or a different help string") {
		return true, nil
	}
	return false, fmt.Errorf("metricsdoc: probe %s: %w", name, err)
}

func typeName(t dto.MetricType) string {
	switch t {
	case dto.MetricType_COUNTER:
		return "counter"
	case dto.MetricType_GAUGE:
		return "gauge"
	case dto.MetricType_HISTOGRAM:
		return "histogram"
	case dto.MetricType_SUMMARY:
		return "summary"
	}
	return strings.ToLower(t.String())
}

func labelNames(f *dto.MetricFamily) []string {
	seen := map[string]bool{}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			seen[l.GetName()] = true
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Guide is the path of the operator guide from the module root.
const Guide = "docs/operator-guide.md"

// Check is a component test's whole comparison: it reads the metrics
// reference of the module's operator guide (found from the working
// directory up to go.mod) for process and reports every difference from
// what reg serves as a test error.
func Check(t testing.TB, process string, reg *prometheus.Registry) {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("metricsdoc: no go.mod above the working directory, so no %s to compare with", Guide)
		}
		dir = parent
	}
	doc, err := Read(filepath.Join(dir, Guide), process)
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := Compare(doc, reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Error(d)
	}
}
