package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// BenchmarkEndToEnd measures client → dispatcher → host → echo → back with
// three echo hosts, the PostgreSQL registry and 32 concurrent clients:
// b.N echo.say actions, each a fresh action ID (resolve, signed hop,
// journaled execution, settlement). It reports actions/s and the p50 and
// p99 latency seen by the clients. Point AIP_TEST_DATABASE_URL at the
// server to measure (fsync on for realistic figures), for example:
//
//	AIP_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:55433/postgres?sslmode=disable \
//	  go test -run '^$' -bench EndToEnd -benchtime 5000x ./internal/e2e
func BenchmarkEndToEnd(b *testing.B) {
	const clients = 32
	f := newFleet(b, fleetOptions{replicas: 3, logLevel: "warn"})
	tok := f.token(tenantID)
	send := func() (time.Duration, error) {
		start := time.Now()
		status, resp, err := f.send(context.Background(), tok, aip.NewActionID(), "bench", "")
		if err == nil && (status != http.StatusOK || resp.Result == nil) {
			b.Errorf("action answered %d: %+v", status, resp.Error)
		}
		return time.Since(start), err
	}
	// Warm up connections, pools and caches.
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range 10 {
				if _, err := send(); err != nil {
					b.Error(err)
				}
			}
		})
	}
	wg.Wait()

	latencies := make([]time.Duration, b.N)
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				d, err := send()
				if err != nil {
					b.Error(err)
				}
				latencies[i] = d
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(latencies)
	pct := func(p float64) float64 {
		return float64(latencies[min(len(latencies)-1, int(p*float64(len(latencies))))].Microseconds()) / 1000
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "actions/s")
	b.ReportMetric(pct(0.50), "p50_ms")
	b.ReportMetric(pct(0.99), "p99_ms")
	b.ReportMetric(0, "ns/op")
	b.Logf("dispatcher stage means: %s", stageMeans(f.apiURL+"/metrics"))
}

// stageMeans reads the dispatcher's stage histograms and returns the mean
// of each stage since it started.
func stageMeans(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	sums, counts := map[string]float64{}, map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		for suffix, m := range map[string]map[string]float64{"_sum": sums, "_count": counts} {
			prefix := "aip_dispatch_stage_duration_seconds" + suffix + `{stage="`
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				stage, value, _ := strings.Cut(rest, `"} `)
				v, _ := strconv.ParseFloat(value, 64)
				m[stage] = v
			}
		}
	}
	var out []string
	for _, stage := range []string{"admission", "resolve", "hop", "reroute", "settle"} {
		if counts[stage] > 0 {
			out = append(out, fmt.Sprintf("%s %.2fms", stage, 1000*sums[stage]/counts[stage]))
		}
	}
	return strings.Join(out, ", ")
}
