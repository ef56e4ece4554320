package memregistry_test

import (
	"context"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// scaleRegistry returns a registry seeded with the reference scale profile
// (1 000 types, 1 000 capabilities, 10 000 instances with one replica each,
// 100 tenants, 100 000 bindings). Each benchmark seeds its own, so the
// assignments one benchmark retains do not burden the next one's heap.
func scaleRegistry(b *testing.B) (*memregistry.Registry, *registrytest.ScaleFleet) {
	b.Helper()
	clock := registrytest.NewClock(registrytest.Epoch)
	r, err := memregistry.New(memregistry.Config{Now: clock.Now})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	fleet, err := registrytest.SeedScale(context.Background(), r, registrytest.DefaultScaleProfile(registrytest.Epoch.Add(24*time.Hour)))
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("seeded the scale profile in %v", time.Since(start).Round(time.Millisecond))
	return r, fleet
}

// BenchmarkResolveSettle resolves a new route for a fresh action and
// settles it as completed, on one goroutine, cycling through every routable
// tenant and capability.
func BenchmarkResolveSettle(b *testing.B) {
	r, fleet := scaleRegistry(b)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tg := fleet.Targets[i%len(fleet.Targets)]
		i++
		a, err := r.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tg.TenantID, CapabilityID: tg.CapabilityID})
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Settle(ctx, a, registry.SettlementCompleted); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "resolve+settle/s")
}

// BenchmarkCatalogPage reads 50-item pages of one tenant's catalog,
// following cursors to the end and starting over, rotating tenants.
func BenchmarkCatalogPage(b *testing.B) {
	r, fleet := scaleRegistry(b)
	ctx := context.Background()
	b.ReportAllocs()
	q := registry.CatalogQuery{Limit: 50}
	tenant := 0
	for b.Loop() {
		p, err := r.QueryCapabilities(ctx, q, registry.ForTenant(fleet.Tenants[tenant]))
		if err != nil {
			b.Fatal(err)
		}
		if len(p.Capabilities) == 0 {
			b.Fatal("empty page")
		}
		q.Cursor = p.NextCursor
		if q.Cursor == "" {
			tenant = (tenant + 1) % len(fleet.Tenants)
		}
	}
}

// BenchmarkCatalogPageAfterWrite changes one of a tenant's bindings (a new
// policy revision) before every read of that tenant's first 50-item page,
// so each read rebuilds the tenant's view: the worst case of
// BenchmarkCatalogPage.
func BenchmarkCatalogPageAfterWrite(b *testing.B) {
	r, fleet := scaleRegistry(b)
	ctx := context.Background()
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		key := fleet.Bindings[(n*7919)%len(fleet.Bindings)]
		n++
		bind, err := r.CapabilityBinding(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		bind.PolicyRevision++
		if err := r.PutBinding(ctx, bind); err != nil {
			b.Fatal(err)
		}
		p, err := r.QueryCapabilities(ctx, registry.CatalogQuery{Limit: 50}, registry.ForTenant(key.TenantID))
		if err != nil || len(p.Capabilities) != 50 {
			b.Fatalf("page of %d: %v", len(p.Capabilities), err)
		}
	}
}
