package memregistry

import (
	"context"
	"fmt"
	"testing"

	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestCatalogViewCacheIsBounded sends catalog queries with ever new
// profiles, as a tenant may (the profile is a query parameter of GET
// /aip/v1/capabilities): the views cached for them, a tenant's and the
// internal ones, stay within maxViews however many profiles are asked
// for, and the answers stay right.
func TestCatalogViewCacheIsBounded(t *testing.T) {
	ctx := context.Background()
	r, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := registrytest.NewLifecycleWorld(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	for _, rc := range []registry.ReadContext{registry.ForTenant(w.Instance.TenantID), registry.InternalRead()} {
		for i := range 2*maxViews + 10 {
			p, err := r.QueryCapabilities(ctx, registry.CatalogQuery{Profile: fmt.Sprintf("profile-%d", i)}, rc)
			if err != nil {
				t.Fatal(err)
			}
			if p.Total != 0 {
				t.Fatalf("profile-%d: %d capabilities, want none", i, p.Total)
			}
		}
		p, err := r.QueryCapabilities(ctx, registry.CatalogQuery{}, rc)
		if err != nil || p.Total == 0 {
			t.Fatalf("%+v without a profile: %d capabilities, %v", rc, p.Total, err)
		}
		r.mu.Lock()
		n := len(r.internalViews)
		for _, byProfile := range r.tenantViews {
			n += len(byProfile)
		}
		r.mu.Unlock()
		if n > maxViews {
			t.Fatalf("after queries as %+v the registry caches %d catalog views, more than maxViews (%d)", rc, n, maxViews)
		}
	}
}
