package echoconnector

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

// BenchmarkHostEcho measures actions through one host over its real HTTP
// listener: the dispatcher signs each action envelope, the host verifies it,
// checks the route, claims the message ID and journals the action in the
// embedded SQLite journal, echo records its side effect in the journal's
// state store, the host journals the result with its receipt and signs the
// answer, and the dispatcher verifies it. 32 clients send concurrently; the
// figures are actions/s and the p50/p99 latency seen by a client.
//
// sync=full is the host's default embedded journal (an fsync per group
// commit); sync=normal passes a journal opened with SyncNormal (commits
// survive a process kill, not a power loss).
func BenchmarkHostEcho(b *testing.B) {
	b.Run("sync=full", func(b *testing.B) { benchHostEcho(b, nil) })
	b.Run("sync=normal", func(b *testing.B) {
		benchHostEcho(b, func(c *hostsdk.Config) {
			j, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: c.StateDir, Sync: sqliteruntime.SyncNormal})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { j.Close() })
			c.Journal = j
		})
	})
}

func benchHostEcho(b *testing.B, edit func(*hostsdk.Config)) {
	const clients = 32
	_, d, _, target := newEchoWith(b, edit)
	ctx := ctxT(b)
	// Warm up connections and the journal.
	for range clients {
		if _, err := d.Act(ctx, target, say("warm", "")); err != nil {
			b.Fatal(err)
		}
	}
	var (
		next      atomic.Int64
		mu        sync.Mutex
		latencies = make([]time.Duration, 0, b.N)
		wg        sync.WaitGroup
	)
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	for range clients {
		wg.Go(func() {
			local := make([]time.Duration, 0, b.N/clients+1)
			for next.Add(1) <= int64(b.N) {
				a := say("bench", "")
				t0 := time.Now()
				resp, err := d.Act(ctx, target, a)
				elapsed := time.Since(t0)
				if err != nil {
					b.Error(err)
					return
				}
				if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
					b.Errorf("HTTP %d: %v", resp.Status, err)
					return
				}
				local = append(local, elapsed)
			}
			mu.Lock()
			latencies = append(latencies, local...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	if len(latencies) == 0 {
		return
	}
	slices.Sort(latencies)
	pct := func(p float64) float64 {
		return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(float64(len(latencies))/elapsed.Seconds(), "actions/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	// CPU use of the whole process (host and the 32 clients) in cores.
	b.ReportMetric(cpu.Seconds()/elapsed.Seconds(), "cpu-cores")
}

// cpuTime returns the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
