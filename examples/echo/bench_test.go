package main

import (
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/internal/procstat"
)

// BenchmarkIdleRSS starts the echo binary, waits until it serves (registered,
// heartbeats running, journal open) and reports its resident set size.
func BenchmarkIdleRSS(b *testing.B) {
	cp := hostsdktest.NewControlPlane(b, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(b, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	var rss float64
	for range b.N {
		r := newReplicaEnv(b, cp, d)
		p := startEcho(b, r)
		p.await(b, "serving", "", "")
		kib, err := procstat.RSS(p.cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		rss = float64(kib) / 1024
		p.cmd.Process.Kill()
		p.wait(b)
	}
	b.ReportMetric(rss, "idle-RSS-MiB")
}
