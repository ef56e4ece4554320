package main

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
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
		kib, err := vmRSS(p.cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		rss = float64(kib) / 1024
		p.cmd.Process.Kill()
		p.wait(b)
	}
	b.ReportMetric(rss, "idle-RSS-MiB")
}

// vmRSS reads VmRSS (KiB) from /proc/<pid>/status.
func vmRSS(pid int) (int, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
		}
	}
	return 0, os.ErrNotExist
}
