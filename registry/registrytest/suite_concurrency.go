package registrytest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

func runConcurrency(t *testing.T, nb NewBackend) {
	t.Run("DuplicateResolvesConverge", func(t *testing.T) { testConverge(t, nb) })
	t.Run("NoOverbookingUnderLoad", func(t *testing.T) { testNoOverbooking(t, nb) })
	t.Run("NoOverbookingOfReplicas", func(t *testing.T) { testNoReplicaOverbooking(t, nb) })
	t.Run("PagingDuringCatalogWrites", func(t *testing.T) { testPagingDuringWrites(t, nb) })
	t.Run("LedgerAfterMixedWorkload", func(t *testing.T) { testMixedWorkload(t, nb) })
}

// parallel runs fn(0..n-1) on n goroutines released together and waits.
func parallel(n int, fn func(i int)) {
	var start, done sync.WaitGroup
	start.Add(1)
	for i := range n {
		done.Go(func() {
			start.Wait()
			fn(i)
		})
	}
	start.Done()
	done.Wait()
}

func testConverge(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newRouteWorld(f, nil)
	var reps []string
	for i := range 4 {
		reps = append(reps, f.replica(fmt.Sprintf("r%d", i), w.i).ID)
	}
	req := request("tenant-1", "alpha.read")
	const n = 64
	got := make([]registry.RouteAssignment, n)
	errs := make([]error, n)
	parallel(n, func(i int) { got[i], errs[i] = f.b.Resolver.Resolve(f.ctx, req) })
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("resolve %d: %v", i, errs[i])
		}
		if !got[i].Equal(&got[0]) {
			t.Fatalf("resolve %d returned %+v, resolve 0 returned %+v", i, got[i], got[0])
		}
	}
	l := f.checkLedger(reps...)
	if len(l.Reservations) != 1 {
		t.Fatalf("64 duplicate resolves made %d reservations", len(l.Reservations))
	}
}

func testNoOverbooking(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.ConservativePolicy("quota:c")
	pol.MaxTenantInFlight, pol.MaxBindingInFlight, pol.MaxInstanceInFlight = 10, 7, 9
	f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, pol))
	ct := f.typ("alpha")
	v := f.version(ct, "alpha1", registry.VersionActive, "alpha.read", "alpha.write")
	i1, i2 := f.instance("a", v, "tenant-1"), f.instance("b", v, "tenant-1")
	for _, i := range []registry.ConnectorInstance{i1, i2} {
		f.bind(i, "alpha.read", 0, pol.PolicyRef)
		f.bind(i, "alpha.write", 1, pol.PolicyRef)
	}
	var reps []registry.ConnectorReplica
	for n, i := range []registry.ConnectorInstance{i1, i1, i2} {
		reps = append(reps, f.replica(fmt.Sprintf("r%d", n), i, func(r *registry.ConnectorReplica) { r.Capacity = 5 }))
	}
	const n = 200
	results := make([]error, n)
	assigned := make([]registry.RouteAssignment, n)
	parallel(n, func(k int) {
		capability := "alpha.read"
		if k%2 == 1 {
			capability = "alpha.write"
		}
		assigned[k], results[k] = f.b.Resolver.Resolve(f.ctx, request("tenant-1", capability))
	})
	ok, capacity, unavailable := 0, 0, 0
	perReplica := map[string]int{}
	for k, err := range results {
		switch {
		case err == nil:
			ok++
			perReplica[assigned[k].ReplicaID]++
		case errors.Is(err, registry.ErrCapacityExceeded):
			capacity++
		case errors.Is(err, registry.ErrReplicaUnavailable):
			unavailable++
		default:
			t.Fatalf("resolve %d: unexpected error %v", k, err)
		}
	}
	// Replica capacity is 15 but the tenant limit is 10.
	if ok == 0 || ok > 10 || capacity == 0 {
		t.Fatalf("%d resolves succeeded and %d hit an admission limit, want 1..10 and some", ok, capacity)
	}
	for _, r := range reps {
		if perReplica[r.ID] > int(r.Capacity) {
			t.Fatalf("replica %s got %d routes over capacity %d", r.ID, perReplica[r.ID], r.Capacity)
		}
	}
	l := f.checkLedger(reps[0].ID, reps[1].ID, reps[2].ID)
	for _, c := range l.Counters {
		limit := map[registry.AdmissionScopeKind]uint32{
			registry.ScopeGlobal: pol.MaxGlobalInFlight, registry.ScopeTenant: pol.MaxTenantInFlight,
			registry.ScopeConnectorType: pol.MaxConnectorTypeInFlight, registry.ScopeInstance: pol.MaxInstanceInFlight,
			registry.ScopeBinding: pol.MaxBindingInFlight,
		}[c.Kind]
		if c.Active > limit {
			t.Fatalf("counter %s %q is %d, over its limit %d", c.Kind, c.Key, c.Active, limit)
		}
	}
	if len(l.Reservations) != ok {
		t.Fatalf("%d live reservations for %d successful resolves", len(l.Reservations), ok)
	}
	t.Logf("200 concurrent resolves: %d routed, %d capacity exceeded, %d no replica", ok, capacity, unavailable)
}

func testNoReplicaOverbooking(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.FleetPolicy("quota:f")
	pol.MaxTenantInFlight, pol.MaxBindingInFlight, pol.MaxInstanceInFlight = 1000, 1000, 1000
	w := newRouteWorld(f, &pol)
	var ids []string
	for n := range 5 {
		ids = append(ids, f.replica(fmt.Sprintf("r%d", n), w.i, func(r *registry.ConnectorReplica) { r.Capacity = 3 }).ID)
	}
	const n = 200
	errs := make([]error, n)
	parallel(n, func(k int) { _, errs[k] = f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read")) })
	ok := 0
	for k, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, registry.ErrReplicaUnavailable):
		default:
			t.Fatalf("resolve %d: %v", k, err)
		}
	}
	// Every slot is taken exactly once (no bounded-retry shortfall when
	// contention is over, so check again serially).
	for ok < 15 {
		if _, err := f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read")); err != nil {
			break
		}
		ok++
	}
	if ok != 15 {
		t.Fatalf("%d routes on 5 replicas of capacity 3, want exactly 15", ok)
	}
	for _, id := range ids {
		if got := f.getReplica(id).ActiveAssignments; got != 3 {
			t.Fatalf("replica %s has %d active, want 3", id, got)
		}
	}
	f.checkLedger(ids...)
}

func testPagingDuringWrites(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	names := pagingWorld(f, 24)
	rc := registry.ForTenant("tenant-1")
	key := registry.BindingKey{TenantID: "tenant-1", CapabilityID: names[5], InstanceID: "cinst_p"}
	stop := make(chan struct{})
	var writer sync.WaitGroup
	writes := 0
	writer.Go(func() {
		b, err := f.b.Admin.CapabilityBinding(f.ctx, key)
		if err != nil {
			t.Error(err)
			return
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			b.Enabled = !b.Enabled
			b.PolicyRevision++
			if err := f.b.Admin.PutBinding(f.ctx, b); err != nil {
				t.Error(err)
				return
			}
			writes++
		}
	})
	complete, stale := 0, 0
	for range 200 {
		var seen []string
		var rev uint64
		q := registry.CatalogQuery{Limit: 5}
		for page := 0; ; page++ {
			p, err := f.b.Catalog.QueryCapabilities(f.ctx, q, rc)
			if errors.Is(err, registry.ErrStaleCursor) {
				stale++
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if page == 0 {
				rev = p.CatalogRevision
			} else if p.CatalogRevision != rev {
				t.Fatalf("page %d at revision %d mixed with a read that began at %d", page, p.CatalogRevision, rev)
			}
			seen = append(seen, ids(p)...)
			if p.NextCursor == "" {
				if !slices.IsSorted(seen) || len(slices.Compact(slices.Clone(seen))) != len(seen) {
					t.Fatalf("one read returned %v", seen)
				}
				if len(seen) != p.Total || (len(seen) != len(names) && len(seen) != len(names)-1) {
					t.Fatalf("one read returned %d of total %d (want %d or %d)", len(seen), p.Total, len(names), len(names)-1)
				}
				complete++
				break
			}
			q.Cursor = p.NextCursor
		}
	}
	close(stop)
	writer.Wait()
	t.Logf("paging during %d catalog writes: %d complete reads, %d stale cursors", writes, complete, stale)
}

func testMixedWorkload(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.ConservativePolicy("quota:c")
	pol.MaxTenantInFlight, pol.MaxTenantRetryInFlight, pol.CircuitFailureThreshold, pol.CircuitOpenMS = 12, 3, 3, 200
	f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, pol))
	ct := f.typ("alpha")
	v := f.version(ct, "alpha1", registry.VersionActive, "alpha.read", "alpha.write")
	var ids []string
	for n, tenant := range []string{"tenant-1", "tenant-1", "tenant-2"} {
		i := f.instance(fmt.Sprintf("i%d", n), v, tenant)
		f.bind(i, "alpha.read", uint32(n), pol.PolicyRef)
		f.bind(i, "alpha.write", 0, "")
		for k := range 2 {
			ids = append(ids, f.replica(fmt.Sprintf("i%dr%d", n, k), i, func(r *registry.ConnectorReplica) { r.Capacity = 3 }).ID)
		}
	}
	outcomes := []registry.RouteSettlement{registry.SettlementCompleted, registry.SettlementOutcomeUnknown, registry.SettlementCancelled, registry.SettlementLeaseExpired}
	var mu sync.Mutex
	var held []registry.RouteAssignment
	var routed []registry.RouteRequest
	worker := func(seed int) {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		for range 60 {
			switch op := rng.IntN(10); {
			case op < 4: // new route
				tenant := []string{"tenant-1", "tenant-2"}[rng.IntN(2)]
				capability := []string{"alpha.read", "alpha.write"}[rng.IntN(2)]
				req := request(tenant, capability)
				a, err := f.b.Resolver.Resolve(f.ctx, req)
				if err == nil {
					mu.Lock()
					held, routed = append(held, a), append(routed, req)
					mu.Unlock()
				} else if !expectedRouteError(err) {
					t.Error(err)
				}
			case op < 7: // settle something
				mu.Lock()
				var a registry.RouteAssignment
				if len(held) > 0 {
					k := rng.IntN(len(held))
					a = held[k]
					held = slices.Delete(held, k, k+1)
				}
				mu.Unlock()
				if a.ActionID != "" {
					if err := f.b.Resolver.Settle(f.ctx, a, outcomes[rng.IntN(len(outcomes))]); err != nil {
						t.Error(err)
					}
				}
			case op < 9: // retry an earlier action
				mu.Lock()
				var req registry.RouteRequest
				if len(routed) > 0 {
					req = routed[rng.IntN(len(routed))]
				}
				mu.Unlock()
				if req.ActionID != "" {
					a, err := f.b.Resolver.Resolve(f.ctx, req)
					if err == nil {
						mu.Lock()
						held = append(held, a)
						mu.Unlock()
					} else if !expectedRouteError(err) {
						t.Error(err)
					}
				}
			default: // lifecycle: heartbeat or expire
				if rng.IntN(3) == 0 {
					f.clock.Advance(100 * time.Millisecond)
					if _, err := f.b.Fleet.ExpireStaleReplicas(f.ctx, 2); err != nil {
						t.Error(err)
					}
				} else {
					heartbeat(t, f, ids[rng.IntN(len(ids))])
				}
			}
		}
	}
	parallel(8, worker)
	if t.Failed() {
		return
	}
	f.checkLedger(ids...)
	// Settle everything still held; everything must drain to zero.
	for _, a := range held {
		f.must(f.b.Resolver.Settle(f.ctx, a, registry.SettlementCompleted))
	}
	l := f.checkLedger(ids...)
	if len(l.Counters) != 0 || len(l.Reservations) != 0 {
		t.Fatalf("after settling everything the ledger holds %+v", l)
	}
	s := f.status()
	if s.ActiveAssignments != 0 {
		t.Fatalf("fleet status counts %d active assignments after settling everything", s.ActiveAssignments)
	}
}

// heartbeat renews a replica's lease as the lifecycle service would,
// retrying when a concurrent settlement changed its registry-owned state.
func heartbeat(t *testing.T, f *fx, id string) {
	for attempt := 0; ; attempt++ {
		r, err := f.b.Admin.ConnectorReplica(f.ctx, id)
		if err != nil {
			t.Error(err)
			return
		}
		r.Status = aip.ReplicaReady
		r.LeaseExpiresAt = f.clock.Now().Add(time.Second)
		r.HealthRevision++
		err = f.b.Admin.PutReplica(f.ctx, r)
		if err == nil {
			return
		}
		if !errors.Is(err, registry.ErrConflict) || attempt > 100 {
			t.Errorf("heartbeat %s: %v", id, err)
			return
		}
	}
}

func expectedRouteError(err error) bool {
	return errors.Is(err, registry.ErrCapacityExceeded) || errors.Is(err, registry.ErrReplicaUnavailable)
}

func runScale(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	p := ScaleProfile{
		ConnectorTypes: 12, Capabilities: 40, CapabilitiesPerVersion: 8, Instances: 60, ReplicasPerInstance: 2,
		Tenants: 6, BindingsPerInstance: 3, ReplicaCapacity: 2, LeaseUntil: f.clock.Now().Add(time.Hour), Seed: 3,
	}
	fleet, err := SeedScale(f.ctx, f.b.Admin, p)
	f.must(err)
	if len(fleet.Bindings) != 180 || fleet.Replicas != 120 {
		t.Fatalf("seeded %d bindings and %d replicas, want 180 and 120", len(fleet.Bindings), fleet.Replicas)
	}
	again, err := SeedScale(f.ctx, f.b.Admin, p)
	f.must(err)
	if !slices.Equal(again.Targets, fleet.Targets) {
		t.Fatal("seeding the same profile twice produced different fleets")
	}
	for _, tenant := range fleet.Tenants {
		all, total := f.readAll(registry.CatalogQuery{Limit: 7}, registry.ForTenant(tenant))
		if total != fleet.Visible[tenant] || len(all) != total {
			t.Fatalf("tenant %s sees %d (total %d), want %d", tenant, len(all), total, fleet.Visible[tenant])
		}
	}
	for _, tg := range fleet.Targets {
		a := f.resolve(request(tg.TenantID, tg.CapabilityID))
		f.settle(a, registry.SettlementCompleted)
	}
	s := f.status()
	if s.ReadyReplicas != 120 || s.ActiveVersions != 12 || s.EnabledInstances != 60 || s.ActiveAssignments != 0 {
		t.Fatalf("scale fleet status %+v", s)
	}
}
