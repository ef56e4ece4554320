package registrytest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/aipfleet/aipfleet/registry"
)

// Admission across scopes with different limits: a route is admitted when
// every scope of its reservation holds fewer routes than its limit, and
// refused naming the first scope that does not, whatever limits the other
// scopes have. A backend that splits its counters (pgregistry's stripes)
// must not refuse a route every scope has room for because the room of
// two scopes lies in different parts of their counters.
func runScopeLimits(t *testing.T, nb NewBackend) {
	t.Run("TenantBesideSmallerBindings", func(t *testing.T) { testTenantBesideSmallerBindings(t, nb) })
	t.Run("FreeRoomOfTwoScopesApart", func(t *testing.T) { testFreeRoomApart(t, nb) })
}

// scopeLimitWorld is one tenant with an instance of alpha bound for
// alpha.read and alpha.write, each binding under its own policy, and
// replicas with room for every route of the case.
type scopeLimitWorld struct {
	read, write registry.CapabilityBinding
	replicas    []string
}

func newScopeLimitWorld(f *fx, read, write registry.AdmissionPolicy) scopeLimitWorld {
	f.t.Helper()
	f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, read))
	if write.PolicyRef != read.PolicyRef {
		f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, write))
	}
	ct := f.typ("alpha")
	v := f.version(ct, "alpha1", registry.VersionActive, "alpha.read", "alpha.write")
	i := f.instance("a", v, "tenant-1")
	w := scopeLimitWorld{read: f.bind(i, "alpha.read", 0, read.PolicyRef), write: f.bind(i, "alpha.write", 0, write.PolicyRef)}
	for n := range 2 {
		w.replicas = append(w.replicas, f.replica(fmt.Sprintf("s%d", n), i, func(r *registry.ConnectorReplica) { r.Capacity = 40 }).ID)
	}
	return w
}

// wantRefused fails unless err is the refusal of scope kind with limit.
func (f *fx) wantRefused(err error, kind registry.AdmissionScopeKind, limit uint32, what string) {
	f.t.Helper()
	f.wantErr(err, registry.ErrCapacityExceeded, what)
	var full *registry.CapacityExceededError
	if !errors.As(err, &full) || full.Scope != kind || full.Limit != limit {
		f.t.Fatalf("%s: refused with %v, want scope %s at its limit of %d", what, err, kind, limit)
	}
}

// testTenantBesideSmallerBindings: tenant limit 6, binding limits 5. Five
// routes of alpha.read fill its binding; the sixth is refused by the
// binding, and a route of alpha.write is admitted (the tenant holds 5 of
// 6); the next is refused by the tenant.
func testTenantBesideSmallerBindings(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.ConservativePolicy("quota:small")
	pol.MaxTenantInFlight, pol.MaxBindingInFlight = 6, 5
	w := newScopeLimitWorld(f, pol, pol)
	for range 5 {
		f.resolve(request("tenant-1", "alpha.read"))
	}
	_, err := f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
	f.wantRefused(err, registry.ScopeBinding, 5, "a sixth route of alpha.read")
	a, err := f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.write"))
	if err != nil {
		t.Fatalf("a first route of alpha.write while the tenant holds 5 of its 6: %v", err)
	}
	_, err = f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.write"))
	f.wantRefused(err, registry.ScopeTenant, 6, "a second route of alpha.write, the tenant holding 6")
	f.settle(a, registry.SettlementCompleted)
	f.resolve(request("tenant-1", "alpha.write"))
	f.checkLedger(w.replicas...)
}

// testFreeRoomApart: tenant limit 16, alpha.read's binding limit 15,
// alpha.write's 100 (the global, type and instance limits far away).
// Fifteen routes of alpha.read fill its binding (a sixteenth is refused
// by it) and a route of alpha.write the tenant. Then, twice: a route of alpha.read settles, a
// route of alpha.write takes the tenant's room, an earlier route of
// alpha.write settles, and a route of alpha.read must be admitted (its
// binding holds 14 of 15, the tenant 15 of 16). With counters split in
// eight parts (shares 2 of the tenant's 16 each, 2 or 1 of 15), the
// room the settled route of alpha.read left in its binding's part is the
// part the new route of alpha.write took of the tenant, and the settled
// route of alpha.write freed a part of the tenant where the binding is
// full: a backend that reserves every scope of a route in the same part
// refused it.
func testFreeRoomApart(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	read := registry.ConservativePolicy("quota:read")
	read.MaxTenantInFlight, read.MaxBindingInFlight = 16, 15
	write := read
	write.PolicyRef, write.MaxBindingInFlight = "quota:write", 100
	w := newScopeLimitWorld(f, read, write)
	var reads []registry.RouteAssignment
	for range 15 {
		reads = append(reads, f.resolve(request("tenant-1", "alpha.read")))
	}
	_, err := f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
	f.wantRefused(err, registry.ScopeBinding, 15, "a 16th route of alpha.read")
	writes := []registry.RouteAssignment{f.resolve(request("tenant-1", "alpha.write"))}
	_, err = f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.write"))
	f.wantRefused(err, registry.ScopeTenant, 16, "a route of alpha.write, the tenant holding 16")
	for round := range 2 {
		f.settle(reads[round], registry.SettlementCompleted)
		writes = append(writes, f.resolve(request("tenant-1", "alpha.write")))
		f.settle(writes[round], registry.SettlementCompleted)
		a, err := f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
		if err != nil {
			t.Fatalf("round %d: a route of alpha.read while its binding holds 14 of 15 and the tenant 15 of 16: %v", round+1, err)
		}
		reads = append(reads, a)
		f.checkLedger(w.replicas...)
	}
	_, err = f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
	f.wantRefused(err, registry.ScopeTenant, 16, "a route of alpha.read, the tenant holding 16")
	_, err = f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.write"))
	f.wantRefused(err, registry.ScopeTenant, 16, "a route of alpha.write, the tenant holding 16")
	f.settle(writes[2], registry.SettlementCompleted)
	_, err = f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
	f.wantRefused(err, registry.ScopeBinding, 15, "a route of alpha.read, its binding holding 15")
	f.checkLedger(w.replicas...)
}
