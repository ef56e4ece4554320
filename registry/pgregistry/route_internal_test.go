package pgregistry

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestCircuitChangeIsTheRule: the circuit a settlement writes in SQL
// (circuitChange's parameters applied by circuitFailures and
// circuitOpenUntil to the stored circuit) is registry.ApplySettlementToCircuit
// of the stored circuit, for every outcome, below, at and past the
// threshold, with and without an open circuit, and at the counter's limit.
func TestCircuitChangeIsTheRule(t *testing.T) {
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// The expressions read $31..$33; here they are $3..$5 after the stored
	// failures ($1) and open-until time ($2).
	renumber := strings.NewReplacer("$31", "$3", "$32", "$4", "$33", "$5")
	query := `SELECT ` + renumber.Replace(circuitFailures) + `, ` + renumber.Replace(circuitOpenUntil) + `
FROM (VALUES ($1::bigint, $2::bigint)) AS stored (consecutive_failures, circuit_open_until_ms)`

	now := registrytest.Epoch.Add(90 * time.Minute)
	open := now.Add(10 * time.Second)
	later := now.Add(time.Hour)
	outcomes := []registry.RouteSettlement{registry.SettlementCompleted, registry.SettlementOutcomeUnknown,
		registry.SettlementCancelled, registry.SettlementLeaseExpired}
	for _, threshold := range []uint32{0, 1, 3} {
		adm := registry.AdmissionReservation{CircuitFailureThreshold: threshold, CircuitOpenMS: 30_000}
		for _, stored := range []registry.CircuitState{
			{}, {ConsecutiveFailures: 1}, {ConsecutiveFailures: 2}, {ConsecutiveFailures: 2, OpenUntil: open},
			{ConsecutiveFailures: 5, OpenUntil: later}, {ConsecutiveFailures: 4294967295, OpenUntil: open},
		} {
			for _, outcome := range outcomes {
				want := registry.ApplySettlementToCircuit(stored, outcome, &adm, now)
				mode, th, until := circuitChange(outcome, &adm, now)
				var failures, openMS int64
				if err := conn.QueryRow(ctx, query, int64(stored.ConsecutiveFailures), toMS(stored.OpenUntil), mode, th, until).
					Scan(&failures, &openMS); err != nil {
					t.Fatal(err)
				}
				got := registry.CircuitState{ConsecutiveFailures: uint32(failures), OpenUntil: fromMS(openMS)}
				if got.ConsecutiveFailures != want.ConsecutiveFailures || !got.OpenUntil.Equal(want.OpenUntil) {
					t.Errorf("threshold %d, stored %+v, %s: SQL writes %+v, the rule says %+v", threshold, stored, outcome, got, want)
				}
			}
		}
	}
}

// TestTenantGates: a tenant's gate admits limit callers at once, each in a
// lane of its own; the next waits until one leaves (and gets the lane that
// was given back), or gives up with registry.ErrStorage after the timeout,
// or with the context's error; other tenants have their own gates; a gate
// nobody holds or waits for is dropped.
func TestTenantGates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		g := newTenantGates(2, time.Minute)
		laneA, a, err := g.enter(ctx, "tenant-a", "op")
		must(t, err)
		laneB, b, err := g.enter(ctx, "tenant-a", "op")
		must(t, err)
		if laneA == laneB || min(laneA, laneB) != 0 || max(laneA, laneB) != 1 {
			t.Fatalf("two callers of a gate of 2 got lanes %d and %d, want 0 and 1", laneA, laneB)
		}
		_, other, err := g.enter(ctx, "tenant-b", "op")
		must(t, err)

		type entry struct {
			lane  int
			leave func()
		}
		entered := make(chan entry)
		go func() {
			lane, leave, err := g.enter(ctx, "tenant-a", "op")
			if err != nil {
				t.Error(err)
			}
			entered <- entry{lane, leave}
		}()
		synctest.Wait()
		select {
		case <-entered:
			t.Fatal("a third caller entered a gate of 2")
		default:
		}
		a()
		c := <-entered
		if c.lane != laneA {
			t.Fatalf("the caller after lane %d left got lane %d", laneA, c.lane)
		}

		start := time.Now()
		if _, _, err := g.enter(ctx, "tenant-a", "op"); !errors.Is(err, registry.ErrStorage) || !strings.Contains(err.Error(), "tenant tenant-a") {
			t.Fatalf("a caller of a full gate: %v, want registry.ErrStorage naming the tenant", err)
		}
		if waited := time.Since(start); waited != time.Minute {
			t.Fatalf("a caller of a full gate gave up after %s, want the timeout (1m)", waited)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, _, err := g.enter(cctx, "tenant-a", "op"); !errors.Is(err, context.Canceled) {
			t.Fatalf("a caller whose context ended: %v, want context.Canceled", err)
		}
		b()
		c.leave()
		other()
		if len(g.gates) != 0 {
			t.Fatalf("gates left after every caller left: %v", g.gates)
		}
	})
}

// chainWorld is a tenant with two bindings of alpha.read: instance a
// (priority 0) and instance b (priority 5), one ready replica each.
type chainWorld struct {
	r     *Registry
	clock *registrytest.Clock
	a, b  registry.CapabilityBinding
	ra    registry.ConnectorReplica
	rb    registry.ConnectorReplica
}

func newChainWorld(t *testing.T) *chainWorld {
	t.Helper()
	ctx := t.Context()
	clock := registrytest.NewClock(registrytest.Epoch)
	r, err := Open(ctx, Config{ControlURL: pgtest.NewDatabase(t), Now: clock.Now, DataMaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	w := &chainWorld{r: r, clock: clock}
	ct := registry.ConnectorType{ID: "ctype_alpha", Name: "alpha", Owner: "owner-alpha", Enabled: true}
	must(t, r.PutConnectorType(ctx, ct))
	v := registrytest.Version("cver_alpha1", ct.ID, "1.0.0", ct.Owner, registry.VersionActive,
		registrytest.Manifest("service:alpha", []aip.Capability{registrytest.Capability("alpha.read", "reads")}))
	must(t, r.AdmitVersion(ctx, v))
	for i, id := range []string{"cinst_a", "cinst_b"} {
		must(t, r.PutInstance(ctx, registry.ConnectorInstance{ID: id, ConnectorTypeID: ct.ID, VersionID: v.ID, TenantID: "tenant-1",
			ConfigRevision: 1, SecretProviderRef: "secret://x", Status: registry.InstanceEnabled}))
		b := registry.CapabilityBinding{TenantID: "tenant-1", CapabilityID: "alpha.read", InstanceID: id, Priority: uint32(5 * i),
			PolicyRevision: 1, Enabled: true}
		must(t, r.PutBinding(ctx, b))
		rep := registrytest.Replica("crepl_"+id[len("cinst_"):], id, v.ID, clock.Now().Add(time.Hour))
		must(t, r.PutReplica(ctx, rep))
		if i == 0 {
			w.a, w.ra = b, rep
		} else {
			w.b, w.rb = b, rep
		}
	}
	return w
}

func (w *chainWorld) resolve(t *testing.T) registry.RouteAssignment {
	t.Helper()
	a, err := w.r.Resolve(t.Context(), registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: "tenant-1", CapabilityID: "alpha.read"})
	must(t, err)
	stored, err := w.r.Assignment(t.Context(), a.ActionID)
	must(t, err)
	if !stored.Equal(&a) {
		t.Fatalf("Resolve returned %+v, the registry stored %+v", a, stored)
	}
	return a
}

func (w *chainWorld) chain() *routeChain { return w.r.chains.get(chainKey{"tenant-1", "alpha.read"}) }

// TestRouteChainCache: the first route of a pair caches its best binding
// and the next goes straight to it (one round trip), making exactly the
// assignment the full selection makes; a catalog change is seen at once
// (the cached revision no longer matches, and the route is made the full
// way at the new revision); a best binding sharing its priority is never
// cached; a best binding without an eligible replica hands the route to
// the next binding and drops the cached chain.
func TestRouteChainCache(t *testing.T) {
	ctx := t.Context()
	w := newChainWorld(t)
	first := w.resolve(t)
	ch := w.chain()
	if ch == nil || ch.binding.InstanceID != "cinst_a" || ch.revision != first.CatalogRevision {
		t.Fatalf("after the first route the cached chain is %+v, want instance cinst_a at revision %d", ch, first.CatalogRevision)
	}
	second := w.resolve(t)
	if second.ReplicaID != w.ra.ID || second.CatalogRevision != first.CatalogRevision {
		t.Fatalf("the cached route went to %+v", second)
	}
	if d := cmp.Diff(first.Admission, second.Admission); d != "" {
		t.Fatalf("the cached route's admission differs from the first route's (-first +second):\n%s", d)
	}
	if w.chain() != ch {
		t.Fatal("a route on the cached chain replaced it")
	}
	// The caller owns what it gets: changing it changes nothing cached.
	second.Admission.BaseScopes[0].Limit = 1
	if w.chain().admission.BaseScopes[0].Limit == 1 {
		t.Fatal("an assignment shares its admission scopes with the cache")
	}

	// A new policy revision of the binding is a catalog change.
	w.a.PolicyRevision = 2
	must(t, w.r.PutBinding(ctx, w.a))
	third := w.resolve(t)
	if third.BindingPolicyRevision != 2 || third.CatalogRevision <= first.CatalogRevision {
		t.Fatalf("after a catalog change the route was made at binding policy revision %d, catalog revision %d",
			third.BindingPolicyRevision, third.CatalogRevision)
	}
	if ch := w.chain(); ch == nil || ch.revision != third.CatalogRevision {
		t.Fatalf("after a catalog change the cached chain is %+v", ch)
	}

	// The disabled best binding is never used again.
	w.a.PolicyRevision, w.a.Enabled = 3, false
	must(t, w.r.PutBinding(ctx, w.a))
	if got := w.resolve(t); got.InstanceID != "cinst_b" {
		t.Fatalf("with binding a disabled the route went to %s", got.InstanceID)
	}
	w.a.PolicyRevision, w.a.Enabled = 4, true
	must(t, w.r.PutBinding(ctx, w.a))
	w.resolve(t)
	if ch := w.chain(); ch == nil || ch.binding.InstanceID != "cinst_a" {
		t.Fatalf("binding a enabled again: cached chain %+v", ch)
	}

	// Binding a's replica full: the route goes to binding b and the chain
	// is dropped, then cached again once a has room.
	rep, err := w.r.ConnectorReplica(ctx, w.ra.ID)
	must(t, err)
	rep.Capacity, rep.HealthRevision = rep.ActiveAssignments, rep.HealthRevision+1
	must(t, w.r.PutReplica(ctx, rep))
	if got := w.resolve(t); got.InstanceID != "cinst_b" {
		t.Fatalf("with replica a full the route went to %s", got.InstanceID)
	}
	if ch := w.chain(); ch != nil {
		t.Fatalf("a chain whose binding had no room stayed cached: %+v", ch)
	}
	rep.Capacity, rep.HealthRevision = rep.Capacity+1, rep.HealthRevision+1
	must(t, w.r.PutReplica(ctx, rep))
	if got := w.resolve(t); got.InstanceID != "cinst_a" || w.chain() == nil {
		t.Fatalf("with room on replica a again the route went to %s (chain %+v)", got.InstanceID, w.chain())
	}

	// Two bindings of the same priority: the replicas decide, so nothing
	// is cached.
	w.b.Priority, w.b.PolicyRevision = 0, 2
	must(t, w.r.PutBinding(ctx, w.b))
	w.resolve(t)
	if ch := w.chain(); ch != nil {
		t.Fatalf("a best binding sharing its priority was cached: %+v", ch)
	}
}

// TestRouteChainRetry: a retried action is resumed on its route, with or
// without a cached chain.
func TestRouteChainRetry(t *testing.T) {
	ctx := t.Context()
	w := newChainWorld(t)
	a := w.resolve(t)
	if w.chain() == nil {
		t.Fatal("no chain cached")
	}
	must(t, w.r.Settle(ctx, a, registry.SettlementCancelled))
	again, err := w.r.Resolve(ctx, registry.RouteRequest{ActionID: a.ActionID, TenantID: "tenant-1", CapabilityID: "alpha.read"})
	must(t, err)
	if !again.Equal(&a) {
		t.Fatalf("the retried action got %+v, want its route %+v", again, a)
	}
	res, err := w.r.Reservation(ctx, a.ActionID)
	must(t, err)
	if !res.Reserved || !res.Retry {
		t.Fatalf("the retried route's reservation is %+v", res)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
