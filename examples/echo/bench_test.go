package main

import (
	"syscall"
	"testing"

	"github.com/aipfleet/aipfleet/internal/procstat"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
)

// BenchmarkIdleRSS starts the echo binary, waits until it serves (registered,
// heartbeats running, journal open) and reports its resident set size.
func BenchmarkIdleRSS(b *testing.B) {
	f := sidecartest.NewFakeFleet(b)
	var rss float64
	for range b.N {
		p := startEcho(b, newReplica(b, f))
		p.Await(b, "serving")
		kib, err := procstat.RSS(p.Cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		rss = float64(kib) / 1024
		p.Signal(b, syscall.SIGKILL)
		p.Wait(b)
	}
	b.ReportMetric(rss, "idle-RSS-MiB")
}
