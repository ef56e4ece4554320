package registrytest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// NewBackend builds a fresh, empty backend for one test. It must use
// opts.Clock for every time-dependent rule and opts.Limits as its limits,
// and release its resources with t.Cleanup.
type NewBackend func(t *testing.T, opts Options) Backend

// Run runs the conformance suite: every contract rule of package registry,
// every row of the seed's failure-boundary table, and the concurrency
// properties (converging duplicate resolves, no overbooking under load,
// paging during catalog writes, a consistent ledger after a mixed workload),
// and a seeded random workload checked against a simple model (model.go).
// It uses only the contracts, so any backend can run it.
func Run(t *testing.T, newBackend NewBackend) {
	t.Run("Catalog", func(t *testing.T) { runCatalog(t, newBackend) })
	t.Run("Records", func(t *testing.T) { runRecords(t, newBackend) })
	t.Run("Routing", func(t *testing.T) { runRouting(t, newBackend) })
	t.Run("Settlement", func(t *testing.T) { runSettlement(t, newBackend) })
	t.Run("Fleet", func(t *testing.T) { runFleet(t, newBackend) })
	t.Run("Boundaries", func(t *testing.T) { runBoundaries(t, newBackend) })
	t.Run("Concurrency", func(t *testing.T) { runConcurrency(t, newBackend) })
	t.Run("RouteConcurrency", func(t *testing.T) { runRouteConcurrency(t, newBackend) })
	t.Run("ScopeLimits", func(t *testing.T) { runScopeLimits(t, newBackend) })
	t.Run("Scale", func(t *testing.T) { runScale(t, newBackend) })
	t.Run("Lifecycle", func(t *testing.T) { runLifecycle(t, newBackend) })
	t.Run("Reroute", func(t *testing.T) { runReroute(t, newBackend) })
	t.Run("Orphans", func(t *testing.T) { runOrphans(t, newBackend) })
	t.Run("HandOuts", func(t *testing.T) { runHandOuts(t, newBackend) })
	t.Run("Unsent", func(t *testing.T) { runUnsent(t, newBackend) })
	t.Run("Events", func(t *testing.T) { runEvents(t, newBackend) })
	t.Run("Model", func(t *testing.T) { runModel(t, newBackend) })
}

// fx is one test's fixture: a fresh backend and helpers that fail the test
// on unexpected errors.
type fx struct {
	t     *testing.T
	ctx   context.Context
	clock *Clock
	b     Backend
}

func newFx(t *testing.T, nb NewBackend) *fx {
	return newFxLimits(t, nb, registry.Limits{})
}

func newFxLimits(t *testing.T, nb NewBackend, l registry.Limits) *fx {
	t.Helper()
	clock := NewClock(Epoch)
	b := nb(t, Options{Clock: clock, Limits: l})
	for _, c := range []struct {
		name  string
		unset bool
	}{
		{"Catalog", b.Catalog == nil}, {"Resolver", b.Resolver == nil}, {"Admin", b.Admin == nil},
		{"Fleet", b.Fleet == nil}, {"Lifecycle", b.Lifecycle == nil}, {"Rerouter", b.Rerouter == nil}, {"Orphans", b.Orphans == nil}, {"Replicas", b.Replicas == nil},
		{"Readiness", b.Readiness == nil},
	} {
		if c.unset {
			t.Fatalf("registrytest.Backend.%s is nil: the backend must set every contract of Backend", c.name)
		}
	}
	return &fx{t: t, ctx: t.Context(), clock: clock, b: b}
}

func (f *fx) must(err error) {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
}

// wantErr fails unless err matches target. A contract error the backend
// also wrapped as ErrStorage fails too: the caller would retry a definitive
// answer.
func (f *fx) wantErr(err, target error, what string) {
	f.t.Helper()
	if !errors.Is(err, target) {
		f.t.Fatalf("%s: got error %v, want %v", what, err, target)
	}
	if target != registry.ErrStorage && errors.Is(err, registry.ErrStorage) {
		f.t.Fatalf("%s: error %v matches %v but is also wrapped as %v", what, err, target, registry.ErrStorage)
	}
}

// wantField fails unless err is a *registry.FieldError matching target on
// field.
func (f *fx) wantField(err, target error, field, what string) {
	f.t.Helper()
	f.wantErr(err, target, what)
	var fe *registry.FieldError
	if !errors.As(err, &fe) {
		f.t.Fatalf("%s: error %v is not a *registry.FieldError", what, err)
	}
	if fe.Field != field {
		f.t.Fatalf("%s: error names field %q, want %q (%v)", what, fe.Field, field, err)
	}
}

func (f *fx) revision() uint64 {
	f.t.Helper()
	rev, err := f.b.Admin.CatalogRevision(f.ctx)
	f.must(err)
	return rev
}

// typ creates connector type ctype_<name> owned by owner-<name>.
func (f *fx) typ(name string) registry.ConnectorType {
	f.t.Helper()
	t := registry.ConnectorType{ID: "ctype_" + name, Name: name, Owner: "owner-" + name, Enabled: true}
	f.must(f.b.Admin.PutConnectorType(f.ctx, t))
	return t
}

// version admits cver_<name> of type t offering caps (built with Capability).
func (f *fx) version(t registry.ConnectorType, name string, status registry.VersionStatus, caps ...string) registry.ConnectorVersion {
	f.t.Helper()
	cs := make([]aip.Capability, len(caps))
	for i, c := range caps {
		cs[i] = Capability(c, "does "+c)
	}
	v := Version("cver_"+name, t.ID, name, t.Owner, status, Manifest("service:"+t.Name, cs))
	f.must(f.b.Admin.AdmitVersion(f.ctx, v))
	return v
}

// instance creates cinst_<name> of version v for tenant, enabled.
func (f *fx) instance(name string, v registry.ConnectorVersion, tenant string) registry.ConnectorInstance {
	f.t.Helper()
	i := registry.ConnectorInstance{
		ID: "cinst_" + name, ConnectorTypeID: v.ConnectorTypeID, VersionID: v.ID, TenantID: tenant,
		ConfigRevision: 1, SecretProviderRef: "secret://" + name, Status: registry.InstanceEnabled,
	}
	f.must(f.b.Admin.PutInstance(f.ctx, i))
	return i
}

// bind creates an enabled binding of tenant's capability to instance.
func (f *fx) bind(i registry.ConnectorInstance, capability string, priority uint32, policy string) registry.CapabilityBinding {
	f.t.Helper()
	b := registry.CapabilityBinding{
		TenantID: i.TenantID, CapabilityID: capability, InstanceID: i.ID, Priority: priority,
		PolicyRevision: 1, CredentialRevisionRef: "cred-rev-1", QuotaPolicyRef: policy, Enabled: true,
	}
	f.must(f.b.Admin.PutBinding(f.ctx, b))
	return b
}

// replica pre-provisions crepl_<name> of instance i: ready, lease 30 s from
// now, capacity 4, after applying mods.
func (f *fx) replica(name string, i registry.ConnectorInstance, mods ...func(*registry.ConnectorReplica)) registry.ConnectorReplica {
	f.t.Helper()
	r := Replica("crepl_"+name, i.ID, i.VersionID, f.clock.Now().Add(30*time.Second))
	for _, m := range mods {
		m(&r)
	}
	f.must(f.b.Admin.PutReplica(f.ctx, r))
	got, err := f.b.Admin.ConnectorReplica(f.ctx, r.ID)
	f.must(err)
	return got
}

// update re-reads a replica, applies mod and writes it with the next health
// revision, as the lifecycle service does.
func (f *fx) update(id string, mod func(*registry.ConnectorReplica)) registry.ConnectorReplica {
	f.t.Helper()
	r, err := f.b.Admin.ConnectorReplica(f.ctx, id)
	f.must(err)
	mod(&r)
	r.HealthRevision++
	f.must(f.b.Admin.PutReplica(f.ctx, r))
	got, err := f.b.Admin.ConnectorReplica(f.ctx, id)
	f.must(err)
	return got
}

func (f *fx) getReplica(id string) registry.ConnectorReplica {
	f.t.Helper()
	r, err := f.b.Admin.ConnectorReplica(f.ctx, id)
	f.must(err)
	return r
}

// request returns a route request for a fresh action.
func request(tenant, capability string) registry.RouteRequest {
	return registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tenant, CapabilityID: capability}
}

func (f *fx) resolve(req registry.RouteRequest) registry.RouteAssignment {
	f.t.Helper()
	a, err := f.b.Resolver.Resolve(f.ctx, req)
	f.must(err)
	return a
}

func (f *fx) settle(a registry.RouteAssignment, outcome registry.RouteSettlement) {
	f.t.Helper()
	f.must(f.b.Resolver.Settle(f.ctx, a, outcome))
}

func (f *fx) reservation(actionID string) registry.RouteReservation {
	f.t.Helper()
	r, err := f.b.Resolver.Reservation(f.ctx, actionID)
	f.must(err)
	return r
}

// checkLedger verifies that every admission counter equals the live
// reservations holding its scope, and every replica's active assignments
// equal the live reservations on it. replicaIDs lists the replicas to check.
func (f *fx) checkLedger(replicaIDs ...string) registry.Ledger {
	f.t.Helper()
	l, err := f.b.Fleet.Ledger(f.ctx)
	f.must(err)
	CheckLedger(f.t, l)
	perReplica := map[string]uint32{}
	for _, r := range l.Reservations {
		perReplica[r.ReplicaID]++
		// A reservation names when its assignment was made.
		a, err := f.b.Resolver.Assignment(f.ctx, r.ActionID)
		f.must(err)
		if one := f.reservation(r.ActionID); !r.AssignedAt.Equal(a.AssignedAt) || !one.AssignedAt.Equal(a.AssignedAt) {
			f.t.Fatalf("reservation of %s: assigned at %s in the ledger and %s alone, the assignment at %s", r.ActionID, r.AssignedAt, one.AssignedAt, a.AssignedAt)
		}
	}
	for _, id := range replicaIDs {
		if got, want := f.getReplica(id).ActiveAssignments, perReplica[id]; got != want {
			f.t.Fatalf("replica %s has %d active assignments, but %d live reservations", id, got, want)
		}
	}
	return l
}

// CheckLedger fails t unless every counter of l equals the number of live
// reservations holding its scope, and no scope held by a reservation is
// missing from the counters.
func CheckLedger(t testing.TB, l registry.Ledger) {
	t.Helper()
	type key struct {
		kind registry.AdmissionScopeKind
		key  string
	}
	held := map[key]uint32{}
	for _, r := range l.Reservations {
		if !r.Reserved {
			t.Fatalf("ledger lists released reservation of %s", r.ActionID)
		}
		for _, s := range r.Scopes {
			held[key{s.Kind, s.Key}]++
		}
	}
	for _, c := range l.Counters {
		if c.Active == 0 {
			t.Fatalf("ledger lists counter %s %q at zero", c.Kind, c.Key)
		}
		if got := held[key{c.Kind, c.Key}]; got != c.Active {
			t.Fatalf("counter %s %q is %d, but %d live reservations hold it", c.Kind, c.Key, c.Active, got)
		}
		delete(held, key{c.Kind, c.Key})
	}
	for k, n := range held {
		t.Fatalf("%d live reservations hold scope %s %q, which has no counter", n, k.kind, k.key)
	}
}
