package sidecar_test

import (
	"os"
	"testing"

	"github.com/aipfleet/aipfleet/internal/procstat"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
)

// BenchmarkIdleRSS starts the aip-sidecar binary with a local connector
// child (this test binary serving the fake connector), waits until the
// replica serves (registered, heartbeats running, journal open) and
// reports the sidecar's resident set size (the child's is not counted).
func BenchmarkIdleRSS(b *testing.B) {
	fleet := sidecartest.NewFakeFleet(b)
	bin := sidecartest.Sidecar(b)
	var rss float64
	for range b.N {
		r := fleet.NewReplica(b, sidecartest.ReplicaOptions{})
		p := sidecartest.Start(b, bin, append(r.Env, "SIDECAR_TEST_CHILD=1", "AIP_SIDECAR_LOG_LEVEL=info"),
			"--local-socket", sidecartest.SocketPath(b, "c.sock"), "--exec", os.Args[0], "-test.run=^$")
		p.Await(b, "serving")
		kib, err := procstat.RSS(p.Cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		rss = float64(kib) / 1024
		p.Cmd.Process.Kill()
		p.Wait(b)
	}
	b.ReportMetric(rss, "idle-RSS-MiB")
}
