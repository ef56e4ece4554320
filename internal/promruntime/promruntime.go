// Package promruntime adds the Go runtime's and the process's Prometheus
// collectors (go_*, process_*: goroutines, heap, GC, resident memory, open
// file descriptors, CPU) to a registry a service created for itself, so
// that every aipfleet process exposes them beside its own aip_* metrics.
package promruntime

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Register adds the Go and process collectors to reg. Collectors reg
// already holds (an embedder registered them) are left as they are.
func Register(reg *prometheus.Registry) error {
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return err
			}
		}
	}
	return nil
}
