package journaltest

import (
	"context"
	"encoding/json"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// BenchmarkLifecycle measures what a host costs a journal per action, on
// the host's own path (hostsdk's ingress): AcceptAction (the message claim
// and the action journaled as running, one commit) then FinishAction (the
// result and its receipt, one commit), from clients concurrent goroutines (b.SetParallelism rounded up to a multiple of
// GOMAXPROCS). It reports lifecycles/s and the p50 and p99 latency of one
// whole lifecycle in milliseconds. Each backend calls it from its own
// BenchmarkActionLifecycle.
func BenchmarkLifecycle(b *testing.B, j journal.Journal, clients int) {
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((clients + procs - 1) / procs)
	result := json.RawMessage(`{"status":"completed","output":{"echo":"hello"}}`)
	digest := aip.DigestBytes([]byte(`{"input":"hello"}`))

	var mu sync.Mutex
	var lat []time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		local := make([]time.Duration, 0, 1024)
		for pb.Next() {
			t0 := time.Now()
			msg := aip.NewMessageID()
			a := journal.Action{
				ActionID: aip.NewActionID(), CapabilityID: "echo.say", TenantID: "tenant-a",
				IdempotencyKey: "k", InputDigest: digest, FenceToken: "fence-1", MessageID: msg,
				ReceivedAt: t0,
			}
			acc, err := j.AcceptAction(ctx, msg, t0.Add(5*time.Minute), t0, a)
			if err != nil || !acc.Claimed || !acc.Created {
				b.Errorf("AcceptAction: %+v %v", acc, err)
				return
			}
			if _, err := j.FinishAction(ctx, a.ActionID, aip.StateCompleted, result, "", time.Now()); err != nil {
				b.Errorf("FinishAction: %v", err)
				return
			}
			local = append(local, time.Since(t0))
		}
		mu.Lock()
		lat = append(lat, local...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "lifecycles/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}
