package pgregistry_test

import (
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// BenchmarkHotTenant measures resolve+settle on the shape of the
// end-to-end fleet, where every route and settlement updates the same few
// rows: one tenant, one instance, one binding under the implicit policy
// (tenant, instance and binding counters), three replicas of capacity 64.
// Each op resolves a fresh action and settles it as completed; it reports
// ops/s and the p50 and p99 of each call. Point AIP_TEST_DATABASE_URL at a
// server with fsync on for realistic figures:
//
//	AIP_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:55433/postgres?sslmode=disable \
//	  go test -run '^$' -bench HotTenant -benchtime 5000x ./registry/pgregistry
func BenchmarkHotTenant(b *testing.B) {
	for _, workers := range []int{1, 32} {
		b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) { benchmarkHotTenant(b, workers) })
	}
}

func benchmarkHotTenant(b *testing.B, workers int) {
	r, _ := open(b, registrytest.Options{})
	ctx := b.Context()
	ct := registry.ConnectorType{ID: "ctype_alpha", Name: "alpha", Owner: "owner-alpha", Enabled: true}
	must(b, r.PutConnectorType(ctx, ct))
	v := registrytest.Version("cver_alpha1", ct.ID, "1.0.0", ct.Owner, registry.VersionActive,
		registrytest.Manifest("service:alpha", []aip.Capability{registrytest.Capability("alpha.read", "reads")}))
	must(b, r.AdmitVersion(ctx, v))
	inst := registry.ConnectorInstance{ID: "cinst_hot", ConnectorTypeID: ct.ID, VersionID: v.ID, TenantID: tenantName(0),
		ConfigRevision: 1, SecretProviderRef: "secret://hot", Status: registry.InstanceEnabled}
	must(b, r.PutInstance(ctx, inst))
	must(b, r.PutBinding(ctx, registry.CapabilityBinding{TenantID: inst.TenantID, CapabilityID: "alpha.read", InstanceID: inst.ID,
		PolicyRevision: 1, Enabled: true}))
	for n := range 3 {
		rep := registrytest.Replica("crepl_hot-"+strconv.Itoa(n), inst.ID, v.ID, time.Now().Add(time.Hour))
		rep.Capacity = 64
		must(b, r.PutReplica(ctx, rep))
	}

	run := func(n int) (resolve, settle []time.Duration) {
		resolve, settle = make([]time.Duration, n), make([]time.Duration, n)
		var (
			next atomic.Int64
			wg   sync.WaitGroup
		)
		for range workers {
			wg.Go(func() {
				for {
					i := next.Add(1) - 1
					if i >= int64(n) {
						return
					}
					start := time.Now()
					a, err := r.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: inst.TenantID, CapabilityID: "alpha.read"})
					if err != nil {
						b.Error(err)
						return
					}
					resolved := time.Now()
					if err := r.Settle(ctx, a, registry.SettlementCompleted); err != nil {
						b.Error(err)
						return
					}
					resolve[i], settle[i] = resolved.Sub(start), time.Since(resolved)
				}
			})
		}
		wg.Wait()
		return resolve, settle
	}
	run(200) // connections, prepared statements, the cached binding
	b.ResetTimer()
	start := time.Now()
	resolve, settle := run(b.N)
	elapsed := time.Since(start)
	b.StopTimer()
	pct := func(ds []time.Duration, p float64) float64 {
		slices.Sort(ds)
		return float64(ds[min(len(ds)-1, int(p*float64(len(ds))))].Microseconds()) / 1000
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	b.ReportMetric(pct(resolve, 0.50), "resolve_p50_ms")
	b.ReportMetric(pct(resolve, 0.99), "resolve_p99_ms")
	b.ReportMetric(pct(settle, 0.50), "settle_p50_ms")
	b.ReportMetric(pct(settle, 0.99), "settle_p99_ms")
	b.ReportMetric(0, "ns/op")
}
