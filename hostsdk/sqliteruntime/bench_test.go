package sqliteruntime_test

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
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

// BenchmarkActionLifecycle measures what the host costs the journal per
// action: ClaimMessage + BeginAction + StartAction + FinishAction, from 32
// concurrent clients. It reports lifecycles/s and the p50/p99 latency of one
// whole lifecycle.
//
//	go test -run '^$' -bench ActionLifecycle -benchtime 20000x ./hostsdk/sqliteruntime/
func BenchmarkActionLifecycle(b *testing.B) {
	for _, mode := range []sqliteruntime.SyncMode{sqliteruntime.SyncFull, sqliteruntime.SyncNormal} {
		b.Run("sync="+string(mode), func(b *testing.B) {
			j, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: b.TempDir(), Sync: mode})
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			RunLifecycleBenchmark(b, j, 32)
		})
	}
}

// RunLifecycleBenchmark runs the four-call lifecycle from clients
// concurrent goroutines.
func RunLifecycleBenchmark(b *testing.B, j journal.Journal, clients int) {
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
			ok, err := j.ClaimMessage(ctx, msg, t0.Add(5*time.Minute), t0)
			if err != nil || !ok {
				b.Errorf("ClaimMessage: %v %v", ok, err)
				return
			}
			a := journal.Action{
				ActionID: aip.NewActionID(), CapabilityID: "echo.say", TenantID: "tenant-a",
				IdempotencyKey: "k", InputDigest: digest, FenceToken: "fence-1", MessageID: msg,
				ReceivedAt: t0,
			}
			if _, created, err := j.BeginAction(ctx, a); err != nil || !created {
				b.Errorf("BeginAction: %v %v", created, err)
				return
			}
			if err := j.StartAction(ctx, a.ActionID, time.Now()); err != nil {
				b.Errorf("StartAction: %v", err)
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
