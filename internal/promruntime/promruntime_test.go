package promruntime

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

func TestRegisterAddsRuntimeAndProcessMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	// An embedder's own Go collector is kept, not an error.
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		t.Fatal(err)
	}
	if err := Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := Register(reg); err != nil {
		t.Fatalf("registering twice: %v", err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range families {
		seen[f.GetName()] = true
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "process_open_fds"} {
		if !seen[name] {
			t.Errorf("%s missing from the registry", name)
		}
	}
}
