package pgregistry_test

import (
	"slices"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestExplainAtScale seeds an index-representative scale profile through
// the Batch administrator, analyzes it, and checks the plans PostgreSQL
// chooses for the routing, catalog, expiry and lifecycle queries: each uses
// its index and none reads the bindings, replicas, instances, routes or
// version capabilities sequentially.
//
// The profile keeps the reference profile's per-tenant shape (100
// instances and 1 000 bindings per tenant, one replica per instance) with
// 20 tenants instead of 100, so `make test` seeds it in seconds under the
// race detector; the reference profile's plans are printed by
// `registry-bench -explain`.
func TestExplainAtScale(t *testing.T) {
	ctx := t.Context()
	r, dbURL, clock := openClock(t, pgregistry.Config{})
	p := registrytest.ScaleProfile{
		ConnectorTypes: 100, Capabilities: 200, CapabilitiesPerVersion: 20,
		Instances: 2000, ReplicasPerInstance: 1, Tenants: 20, BindingsPerInstance: 10,
		ReplicaCapacity: 64, LeaseUntil: clock.Now().Add(time.Hour), Seed: 7,
	}
	start := time.Now()
	var fleet *registrytest.ScaleFleet
	must(t, r.Batch(ctx, func(admin registry.Administrator) error {
		var err error
		fleet, err = registrytest.SeedScale(ctx, admin, p)
		return err
	}))
	seeded := time.Since(start)
	// Routes exist in any fleet that has worked: give route_assignments
	// rows so its plans are the ones a working fleet gets. Routes are kept
	// after their settlement, so few of them are reserved (in flight) at
	// any time: one in eight here.
	for i, tg := range fleet.Targets {
		if i%4 != 0 {
			continue
		}
		a, err := r.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tg.TenantID, CapabilityID: tg.CapabilityID})
		must(t, err)
		if i%32 != 4 {
			must(t, r.Settle(ctx, a, registry.SettlementCompleted))
		}
	}
	if _, err := connect(t, dbURL).Exec(ctx, "ANALYZE"); err != nil {
		t.Fatal(err)
	}
	t.Logf("seeded %d bindings and %d replicas in %s", len(fleet.Bindings), fleet.Replicas, seeded.Round(time.Millisecond))

	tg := fleet.Targets[len(fleet.Targets)/2]
	plans, err := r.ExplainQueries(ctx, tg.TenantID, tg.CapabilityID, false)
	must(t, err)
	// Bindings and replicas are never read sequentially; the per-tenant and
	// per-route queries read nothing large sequentially. (The internal view
	// reads every definition by design; small tables such as policies,
	// types and versions may be scanned when that is cheaper.)
	never := []string{"capability_bindings", "connector_replicas"}
	neverForTenant := []string{"connector_instances", "route_assignments", "version_capabilities", "control_replay"}
	wantIndex := map[string][]string{
		"route selection (candidates)":                   {"connector_replicas_instance", "route_assignments_pkey"},
		"route selection (take, FOR UPDATE SKIP LOCKED)": {"connector_replicas_pkey"},
		"route selection (cached binding)":               {"connector_replicas_instance", "route_assignments_pkey"},
		"route lookup":                                   {"route_assignments_pkey"},
		"lease expiry selection":                         {"connector_replicas_live_lease"},
		"stranded reservation selection":                 {"route_assignments_reserved", "connector_replicas_pkey"},
		"lifecycle replica lock":                         {"connector_replicas_pkey"},
	}
	bindingIndexes := []string{"capability_bindings_enabled", "capability_bindings_pkey"}
	for _, pl := range plans {
		for _, table := range pl.SeqScans {
			if slices.Contains(never, table) || (pl.Name != "internal catalog view" && slices.Contains(neverForTenant, table)) {
				t.Errorf("%s reads %s sequentially:\n%s", pl.Name, table, pl.Plan)
			}
		}
		for _, ix := range wantIndex[pl.Name] {
			if !slices.Contains(pl.Indexes, ix) {
				t.Errorf("%s does not use index %s (uses %v):\n%s", pl.Name, ix, pl.Indexes, pl.Plan)
			}
		}
		switch pl.Name {
		case "route selection (candidates)", "first valid binding", "tenant catalog view", "tenant catalog page (SQL path)":
			if !slices.ContainsFunc(bindingIndexes, func(ix string) bool { return slices.Contains(pl.Indexes, ix) }) {
				t.Errorf("%s does not look bindings up by index (uses %v):\n%s", pl.Name, pl.Indexes, pl.Plan)
			}
		}
	}
	if len(plans) != 11 {
		t.Fatalf("ExplainQueries returned %d plans, want 11", len(plans))
	}
	if testing.Verbose() {
		for _, pl := range plans {
			t.Logf("%s (sequential scans %v):\n%s", pl.Name, pl.SeqScans, pl.Plan)
		}
	}
}
