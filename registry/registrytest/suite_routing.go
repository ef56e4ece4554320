package registrytest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

func runRouting(t *testing.T, nb NewBackend) {
	t.Run("NewRoute", func(t *testing.T) { testNewRoute(t, nb) })
	t.Run("OrderPriorityFirst", func(t *testing.T) { testOrderPriority(t, nb) })
	t.Run("SecondInstanceOnNewVersion", func(t *testing.T) { testSecondInstanceOnNewVersion(t, nb) })
	t.Run("OrderRegionZoneLoad", func(t *testing.T) { testOrderTopology(t, nb) })
	t.Run("OrderActionHash", func(t *testing.T) { testOrderHash(t, nb) })
	t.Run("Filters", func(t *testing.T) { testFilters(t, nb) })
	t.Run("BindingUnavailable", func(t *testing.T) { testBindingUnavailable(t, nb) })
	t.Run("ExistingAssignment", func(t *testing.T) { testExistingAssignment(t, nb) })
	t.Run("PinnedRetry", func(t *testing.T) { testPinnedRetry(t, nb) })
	t.Run("PinnedReplicaUnavailable", func(t *testing.T) { testPinnedUnavailable(t, nb) })
	t.Run("AdmissionScopes", func(t *testing.T) { testAdmissionScopes(t, nb) })
	t.Run("AdmissionLimits", func(t *testing.T) { testAdmissionLimits(t, nb) })
	t.Run("AdmissionLimitsDifferOnOneScope", func(t *testing.T) { testMixedLimits(t, nb) })
	t.Run("RetryScope", func(t *testing.T) { testRetryScope(t, nb) })
	t.Run("InvalidRequests", func(t *testing.T) { testInvalidRequests(t, nb) })
}

// routeWorld: type alpha with an active version offering alpha.read, an
// instance for tenant-1 bound to alpha.read under policy (or the implicit
// policy when policy is nil).
type routeWorld struct {
	ct registry.ConnectorType
	v  registry.ConnectorVersion
	i  registry.ConnectorInstance
	b  registry.CapabilityBinding
}

func newRouteWorld(f *fx, policy *registry.AdmissionPolicy) routeWorld {
	var w routeWorld
	ref := ""
	if policy != nil {
		f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, *policy))
		ref = policy.PolicyRef
	}
	w.ct = f.typ("alpha")
	w.v = f.version(w.ct, "alpha1", registry.VersionActive, "alpha.read", "alpha.write")
	w.i = f.instance("a", w.v, "tenant-1")
	w.b = f.bind(w.i, "alpha.read", 0, ref)
	return w
}

func testNewRoute(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.ConservativePolicy("quota:c")
	w := newRouteWorld(f, &pol)
	r := f.replica("a1", w.i, func(r *registry.ConnectorReplica) {
		r.Topology = aip.Topology{Region: "eu-west", Zone: "eu-west-1a", CapacityClass: "large"}
		r.HealthRevision = 7
	})
	f.clock.Advance(1500 * time.Millisecond)
	req := request("tenant-1", "alpha.read")
	a := f.resolve(req)
	wantScopes := []registry.AdmissionScope{
		{Kind: registry.ScopeGlobal, Key: registry.GlobalScopeKey, Limit: 10000},
		{Kind: registry.ScopeTenant, Key: "tenant-1", Limit: 1000},
		{Kind: registry.ScopeConnectorType, Key: w.ct.ID, Limit: 2000},
		{Kind: registry.ScopeInstance, Key: w.i.ID, Limit: 500},
		{Kind: registry.ScopeBinding, Key: registry.BindingScopeKey(w.b.Key()), Limit: 250},
	}
	want := registry.RouteAssignment{
		ActionID: req.ActionID, CapabilityID: "alpha.read", TenantID: "tenant-1",
		InstanceID: w.i.ID, VersionID: w.v.ID, ManifestDigest: w.v.ManifestDigest,
		ReplicaID: r.ID, Endpoint: r.Endpoint, PeerPrincipalID: r.PeerPrincipalID, PeerPrincipalKind: r.PeerPrincipalKind,
		PeerDID: r.PeerDID, TrustDomain: r.TrustDomain, TransportProfile: r.TransportProfile, Topology: r.Topology,
		CatalogRevision: f.revision(), BindingPolicyRevision: 1, CredentialRevisionRef: "cred-rev-1", QuotaPolicyRef: "quota:c",
		ReplicaHealthRevision: 7, FenceToken: a.FenceToken,
		Admission: registry.AdmissionReservation{
			PolicyRef: "quota:c", PolicyRevision: 1, BaseScopes: wantScopes,
			RetryScope:              &registry.AdmissionScope{Kind: registry.ScopeTenantRetry, Key: "tenant-1", Limit: 100},
			CircuitFailureThreshold: 5, CircuitOpenMS: 30000,
		},
		AssignedAt: f.clock.Now(),
	}
	if !a.Equal(&want) {
		t.Fatalf("assignment\n got %+v\nwant %+v", a, want)
	}
	if err := aip.ValidateID(aip.PrefixRoute, a.FenceToken); err != nil {
		t.Fatalf("fence token: %v", err)
	}
	stored, err := f.b.Resolver.Assignment(f.ctx, req.ActionID)
	f.must(err)
	if !stored.Equal(&a) {
		t.Fatalf("Assignment() = %+v, want the resolved %+v", stored, a)
	}
	res := f.reservation(req.ActionID)
	if !res.Reserved || res.Retry || res.ReplicaID != r.ID || res.LastSettlement != "" || !slices.Equal(res.Scopes, wantScopes) {
		t.Fatalf("reservation %+v", res)
	}
	if got := f.getReplica(r.ID).ActiveAssignments; got != 1 {
		t.Fatalf("replica active assignments %d, want 1", got)
	}
	f.checkLedger(r.ID)

	// The pinned connector_route for the dispatcher.
	mode := aip.ModeStreaming
	route := a.Route(&mode)
	cred, quota := "cred-rev-1", "quota:c"
	wantRoute := aip.ConnectorRoute{
		ActionID: req.ActionID, CapabilityID: "alpha.read", TenantID: "tenant-1", InstanceID: w.i.ID, ReplicaID: r.ID,
		VersionID: w.v.ID, ManifestDigest: w.v.ManifestDigest, CatalogRevision: a.CatalogRevision, BindingPolicyRevision: 1,
		CredentialRevisionRef: &cred, QuotaPolicyRef: &quota, ReplicaHealthRevision: 7, FenceToken: a.FenceToken, OriginalMode: &mode,
	}
	if got, _ := aip.CanonicalJSON(route); string(got) != string(must(aip.CanonicalJSON(wantRoute))) {
		t.Fatalf("route %s, want %s", got, must(aip.CanonicalJSON(wantRoute)))
	}
	// Fresh fence token per assignment.
	b := f.resolve(request("tenant-1", "alpha.read"))
	if b.FenceToken == a.FenceToken {
		t.Fatal("two assignments share a fence token")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func testOrderPriority(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	ct := f.typ("alpha")
	v := f.version(ct, "alpha1", registry.VersionActive, "alpha.read")
	// Priority 0 instance: remote region, busy. Priority 1 instance: the
	// preferred region and zone, idle. Priority wins.
	hi := f.instance("hi", v, "tenant-1")
	lo := f.instance("lo", v, "tenant-1")
	f.bind(hi, "alpha.read", 0, "")
	f.bind(lo, "alpha.read", 1, "")
	far := f.replica("far", hi, func(r *registry.ConnectorReplica) {
		r.Topology = aip.Topology{Region: "us", Zone: "us-1", CapacityClass: "standard"}
		r.Capacity = 10
	})
	near := f.replica("near", lo, func(r *registry.ConnectorReplica) {
		r.Topology = aip.Topology{Region: "eu", Zone: "eu-1", CapacityClass: "standard"}
	})
	pref := registry.RouteTopologyPreference{Region: "eu", Zone: "eu-1"}
	for range 3 {
		req := request("tenant-1", "alpha.read")
		req.Topology = pref
		if a := f.resolve(req); a.ReplicaID != far.ID {
			t.Fatalf("routed to %s, want the priority-0 replica %s", a.ReplicaID, far.ID)
		}
	}
	// When the priority-0 replica cannot take work, the next priority does.
	f.update(far.ID, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaDraining })
	req := request("tenant-1", "alpha.read")
	req.Topology = pref
	if a := f.resolve(req); a.ReplicaID != near.ID {
		t.Fatalf("routed to %s, want %s", a.ReplicaID, near.ID)
	}
	// Re-prioritising a binding (newer policy revision) changes new routes.
	b, err := f.b.Admin.CapabilityBinding(f.ctx, registry.BindingKey{TenantID: "tenant-1", CapabilityID: "alpha.read", InstanceID: lo.ID})
	f.must(err)
	f.update(far.ID, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaReady })
	b.Priority, b.PolicyRevision = 0, 2
	f.must(f.b.Admin.PutBinding(f.ctx, b))
	req = request("tenant-1", "alpha.read")
	req.Topology = pref
	if a := f.resolve(req); a.ReplicaID != near.ID {
		t.Fatalf("after re-prioritising routed to %s, want the region match %s", a.ReplicaID, near.ID)
	}
}

// testSecondInstanceOnNewVersion is the registry side of the blue/green
// version upgrade (docs/operator-guide.md, "A new connector version"): a
// second instance of the tenant on the new version, bound at a lower
// priority number than the old one, with pre-provisioned replicas that
// have not registered. The tenant's catalog lists a capability both
// versions offer once (one definition fleet-wide) and one only the new
// version offers as soon as it is bound; new routes stay on the old
// instance until a replica of the new one is ready, then go to it; a route
// pinned to the old instance stays there; disabling the old instance's
// binding changes nothing the tenant sees.
func testSecondInstanceOnNewVersion(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	ct := f.typ("alpha")
	tenant := registry.ForTenant("tenant-1")
	v1 := f.version(ct, "alpha1", registry.VersionActive, "alpha.read")
	// The new release keeps alpha.read, byte for byte, and adds alpha.write.
	v2 := f.version(ct, "alpha2", registry.VersionActive, "alpha.read", "alpha.write")
	blue := f.instance("blue", v1, "tenant-1")
	blueRead := f.bind(blue, "alpha.read", 1, "")
	old := f.replica("old", blue)
	pinned := f.resolve(request("tenant-1", "alpha.read"))
	if pinned.ReplicaID != old.ID {
		t.Fatalf("routed to %s, want %s", pinned.ReplicaID, old.ID)
	}
	f.wantVisible(tenant, "alpha.read")

	green := f.instance("green", v2, "tenant-1")
	f.bind(green, "alpha.read", 0, "")
	f.bind(green, "alpha.write", 0, "")
	f.wantVisible(tenant, "alpha.read", "alpha.write")
	fresh := f.replica("new", green, func(r *registry.ConnectorReplica) {
		r.Status, r.HealthRevision, r.LeaseExpiresAt = aip.ReplicaOffline, 0, time.Time{}
	})
	// Bound first, but not registered: the old instance keeps serving.
	for range 3 {
		if a := f.resolve(request("tenant-1", "alpha.read")); a.ReplicaID != old.ID || a.VersionID != v1.ID {
			t.Fatalf("before the new replica registered, routed to %s (version %s), want %s", a.ReplicaID, a.VersionID, old.ID)
		}
	}
	_, err := f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.write"))
	f.wantErr(err, registry.ErrReplicaUnavailable, "a capability only the new instance offers, before its replica registered")

	// Registered: every new route goes to the new version.
	f.update(fresh.ID, func(r *registry.ConnectorReplica) {
		r.Status, r.LeaseExpiresAt = aip.ReplicaReady, f.clock.Now().Add(30*time.Second)
	})
	for _, c := range []string{"alpha.read", "alpha.read", "alpha.write"} {
		if a := f.resolve(request("tenant-1", c)); a.ReplicaID != fresh.ID || a.InstanceID != green.ID || a.VersionID != v2.ID {
			t.Fatalf("%s routed to %s (instance %s, version %s), want %s", c, a.ReplicaID, a.InstanceID, a.VersionID, fresh.ID)
		}
	}
	// An action routed before stays pinned to the old replica.
	req := request("tenant-1", "alpha.read")
	req.ActionID = pinned.ActionID
	if a := f.resolve(req); a.ReplicaID != old.ID || a.FenceToken != pinned.FenceToken {
		t.Fatalf("a retry of %s went to %s under %s, want %s under %s", pinned.ActionID, a.ReplicaID, a.FenceToken, old.ID, pinned.FenceToken)
	}

	// Retiring the old instance's binding hides nothing.
	blueRead.Enabled, blueRead.PolicyRevision = false, 2
	f.must(f.b.Admin.PutBinding(f.ctx, blueRead))
	f.wantVisible(tenant, "alpha.read", "alpha.write")
	if a := f.resolve(request("tenant-1", "alpha.read")); a.ReplicaID != fresh.ID {
		t.Fatalf("after disabling the old binding routed to %s, want %s", a.ReplicaID, fresh.ID)
	}
}

func testOrderTopology(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newRouteWorld(f, nil)
	topo := func(region, zone string) func(*registry.ConnectorReplica) {
		return func(r *registry.ConnectorReplica) {
			r.Topology = aip.Topology{Region: region, Zone: zone, CapacityClass: "standard"}
			r.Capacity = 20
		}
	}
	usZone := f.replica("us1", w.i, topo("us", "z1"))
	euOther := f.replica("eu2", w.i, topo("eu", "z2"))
	euZone := f.replica("eu1", w.i, topo("eu", "z1"))
	pick := func(pref registry.RouteTopologyPreference) registry.RouteAssignment {
		req := request("tenant-1", "alpha.read")
		req.Topology = pref
		return f.resolve(req)
	}
	// Region beats zone: eu/z2 wins over us/z1 when only the region matters.
	if a := pick(registry.RouteTopologyPreference{Region: "eu", Zone: "z2"}); a.ReplicaID != euOther.ID {
		t.Fatalf("region+zone eu/z2 routed to %s, want %s", a.ReplicaID, euOther.ID)
	}
	// Region and zone matches beat load: eu1 wins twice although eu2 and
	// us1 carry less.
	for range 2 {
		if a := pick(registry.RouteTopologyPreference{Region: "eu", Zone: "z1"}); a.ReplicaID != euZone.ID {
			t.Fatalf("eu/z1 routed to %s, want %s", a.ReplicaID, euZone.ID)
		}
	}
	// A zone preference alone favours both z1 replicas over eu2; between
	// them, the less loaded one (us1, no assignments) wins.
	if a := pick(registry.RouteTopologyPreference{Zone: "z1"}); a.ReplicaID != usZone.ID {
		t.Fatalf("zone z1 routed to %s, want the idle %s", a.ReplicaID, usZone.ID)
	}
	// Without preferences, load decides: us1 has 1, eu2 has 1, eu1 has 2.
	a := pick(registry.RouteTopologyPreference{})
	if a.ReplicaID != usZone.ID && a.ReplicaID != euOther.ID {
		t.Fatalf("no preference routed to %s, want one of the least loaded", a.ReplicaID)
	}
	// A region preference is not a filter unless cross-region is forbidden.
	f.update(euZone.ID, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaDraining })
	f.update(euOther.ID, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaDraining })
	if a := pick(registry.RouteTopologyPreference{Region: "eu"}); a.ReplicaID != usZone.ID {
		t.Fatalf("region eu with eu draining routed to %s, want cross-region %s", a.ReplicaID, usZone.ID)
	}
	req := request("tenant-1", "alpha.read")
	req.Topology = registry.RouteTopologyPreference{Region: "eu", ForbidCrossRegion: true}
	_, err := f.b.Resolver.Resolve(f.ctx, req)
	f.wantErr(err, registry.ErrReplicaUnavailable, "cross-region forbidden")
	f.checkLedger(usZone.ID, euOther.ID, euZone.ID)
}

func testOrderHash(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newRouteWorld(f, nil)
	reps := []registry.ConnectorReplica{
		f.replica("h1", w.i, func(r *registry.ConnectorReplica) { r.Capacity = 100 }),
		f.replica("h2", w.i, func(r *registry.ConnectorReplica) { r.Capacity = 100 }),
		f.replica("h3", w.i, func(r *registry.ConnectorReplica) { r.Capacity = 100 }),
	}
	seen := map[string]int{}
	for range 24 {
		req := request("tenant-1", "alpha.read")
		want := slices.MinFunc(reps, func(a, b registry.ConnectorReplica) int {
			ca := registry.RouteCandidate{InstanceID: a.InstanceID, ReplicaID: a.ID, Topology: a.Topology}
			cb := registry.RouteCandidate{InstanceID: b.InstanceID, ReplicaID: b.ID, Topology: b.Topology}
			return registry.CompareCandidates(&req.Topology, req.ActionID, &ca, &cb)
		})
		a := f.resolve(req)
		if a.ReplicaID != want.ID {
			t.Fatalf("action %s routed to %s, want %s (hash order)", req.ActionID, a.ReplicaID, want.ID)
		}
		seen[a.ReplicaID]++
		f.settle(a, registry.SettlementCompleted) // keep loads equal
	}
	if len(seen) < 2 {
		t.Fatalf("24 actions all hashed to one replica: %v", seen)
	}
}

func testFilters(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.FleetPolicy("quota:f")
	pol.CircuitFailureThreshold, pol.CircuitOpenMS = 1, 60_000
	w := newRouteWorld(f, &pol)
	good := f.replica("good", w.i, func(r *registry.ConnectorReplica) { r.Topology.CapacityClass = "gpu" })
	unavailable := func(what string, req registry.RouteRequest) {
		t.Helper()
		_, err := f.b.Resolver.Resolve(f.ctx, req)
		f.wantErr(err, registry.ErrReplicaUnavailable, what)
		_, err = f.b.Resolver.Assignment(f.ctx, req.ActionID)
		f.wantErr(err, registry.ErrNotFound, what+": no assignment")
	}
	// Each replica below fails one filter; the only good one is taken out
	// in turn.
	f.replica("draining", w.i, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaDraining })
	f.replica("offline", w.i, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaOffline })
	f.replica("expired", w.i, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now() })
	full := f.replica("full", w.i, func(r *registry.ConnectorReplica) { r.Capacity = 1; r.Topology.CapacityClass = "tiny" })
	// Fill "full" and open the circuit of "good".
	tiny := request("tenant-1", "alpha.read")
	tiny.Topology.CapacityClass = "tiny"
	if a := f.resolve(tiny); a.ReplicaID != full.ID {
		t.Fatalf("capacity class tiny routed to %s", a.ReplicaID)
	}
	tiny.ActionID = aip.NewActionID()
	unavailable("full replica", tiny)

	a := f.resolve(request("tenant-1", "alpha.read"))
	if a.ReplicaID != good.ID {
		t.Fatalf("routed to %s, want %s", a.ReplicaID, good.ID)
	}
	f.settle(a, registry.SettlementOutcomeUnknown) // threshold 1: open
	unavailable("circuit open", registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: "tenant-1", CapabilityID: "alpha.read", Topology: registry.RouteTopologyPreference{CapacityClass: "gpu"}})
	f.clock.Advance(time.Minute)
	// The circuit closed, but expired leases, draining and offline
	// replicas still never take new work; the capacity class filters.
	f.update(good.ID, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now().Add(time.Minute) })
	if a := f.resolve(registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: "tenant-1", CapabilityID: "alpha.read", Topology: registry.RouteTopologyPreference{CapacityClass: "gpu"}}); a.ReplicaID != good.ID {
		t.Fatalf("routed to %s after the circuit closed, want %s", a.ReplicaID, good.ID)
	}
	unavailable("no replica of that class", registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: "tenant-1", CapabilityID: "alpha.read", Topology: registry.RouteTopologyPreference{CapacityClass: "huge"}})
	// A replica of an older version is not eligible after a rollout.
	v2 := f.version(w.ct, "alpha2", registry.VersionActive, "alpha.read")
	i := w.i
	i.VersionID, i.ConfigRevision = v2.ID, 2
	f.must(f.b.Admin.PutInstance(f.ctx, i))
	unavailable("replicas of the previous version", request("tenant-1", "alpha.read"))
	fresh := f.replica("v2", i)
	if a := f.resolve(request("tenant-1", "alpha.read")); a.ReplicaID != fresh.ID || a.VersionID != v2.ID {
		t.Fatalf("after rollout routed to %s (%s), want %s", a.ReplicaID, a.VersionID, fresh.ID)
	}
	f.checkLedger(good.ID, full.ID, fresh.ID)
}

func testBindingUnavailable(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.FleetPolicy("quota:f")
	w := newRouteWorld(f, &pol)
	f.replica("a1", w.i, func(r *registry.ConnectorReplica) { r.Capacity = 10 })
	other := f.instance("other", w.v, "tenant-2")
	f.bind(other, "alpha.write", 0, "")
	f.replica("o1", other)
	none := func(what, tenant, capability string) {
		t.Helper()
		_, err := f.b.Resolver.Resolve(f.ctx, request(tenant, capability))
		f.wantErr(err, registry.ErrBindingUnavailable, what)
	}
	f.resolve(request("tenant-1", "alpha.read"))
	none("no binding for the capability", "tenant-1", "alpha.write") // tenant-2 has one: never used
	none("no binding for the tenant", "tenant-3", "alpha.read")      // tenant-1 has one: never used
	none("an unknown capability", "tenant-1", "nothing.here")
	toggle := []struct {
		what    string
		off, on func()
	}{
		{"binding disabled", func() {
			b := w.b
			b.Enabled, b.PolicyRevision = false, 2
			f.must(f.b.Admin.PutBinding(f.ctx, b))
		}, func() {
			b := w.b
			b.Enabled, b.PolicyRevision = true, 3
			f.must(f.b.Admin.PutBinding(f.ctx, b))
		}},
		{"instance disabled", func() {
			i := w.i
			i.Status, i.ConfigRevision = registry.InstanceDisabled, 2
			f.must(f.b.Admin.PutInstance(f.ctx, i))
		}, func() {
			i := w.i
			i.Status, i.ConfigRevision = registry.InstanceEnabled, 3
			f.must(f.b.Admin.PutInstance(f.ctx, i))
		}},
		{"version not active", func() { f.must(f.b.Admin.SetVersionStatus(f.ctx, w.v.ID, registry.VersionAdmitted)) },
			func() { f.must(f.b.Admin.SetVersionStatus(f.ctx, w.v.ID, registry.VersionActive)) }},
		{"type disabled", func() { f.must(f.b.Admin.SetConnectorTypeEnabled(f.ctx, w.ct.ID, false)) },
			func() { f.must(f.b.Admin.SetConnectorTypeEnabled(f.ctx, w.ct.ID, true)) }},
		{"admission policy disabled", func() {
			p := pol
			p.Enabled, p.Revision = false, 2
			f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, p))
		}, func() {
			p := pol
			p.Enabled, p.Revision = true, 3
			f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, p))
		}},
	}
	for _, c := range toggle {
		c.off()
		none(c.what, "tenant-1", "alpha.read")
		c.on()
		f.resolve(request("tenant-1", "alpha.read"))
	}
}

func testExistingAssignment(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newRouteWorld(f, nil)
	r1 := f.replica("a1", w.i)
	f.bind(w.i, "alpha.write", 0, "")
	req := request("tenant-1", "alpha.read")
	a := f.resolve(req)
	// A better replica appears; the preference changes: the route stays.
	f.replica("a2", w.i, func(r *registry.ConnectorReplica) { r.Topology.Region = "eu"; r.Capacity = 50 })
	again := req
	again.Topology = registry.RouteTopologyPreference{Region: "eu", ForbidCrossRegion: true}
	b := f.resolve(again)
	if !b.Equal(&a) {
		t.Fatalf("second resolve returned %+v, want the existing %+v", b, a)
	}
	if got := f.getReplica(r1.ID).ActiveAssignments; got != 1 {
		t.Fatalf("a repeated resolve reserved again: %d active", got)
	}
	wrongTenant := req
	wrongTenant.TenantID = "tenant-2"
	_, err := f.b.Resolver.Resolve(f.ctx, wrongTenant)
	f.wantErr(err, registry.ErrConflict, "existing action, other tenant")
	wrongCap := req
	wrongCap.CapabilityID = "alpha.write"
	_, err = f.b.Resolver.Resolve(f.ctx, wrongCap)
	f.wantErr(err, registry.ErrConflict, "existing action, other capability")
	f.checkLedger(r1.ID)
}

func testPinnedRetry(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.ConservativePolicy("quota:c")
	w := newRouteWorld(f, &pol)
	r1 := f.replica("a1", w.i)
	req := request("tenant-1", "alpha.read")
	a := f.resolve(req)
	f.settle(a, registry.SettlementOutcomeUnknown)
	if res := f.reservation(req.ActionID); res.Reserved || res.LastSettlement != registry.SettlementOutcomeUnknown {
		t.Fatalf("after settlement: %+v", res)
	}
	// A better replica appears and the pinned one drains: the retry still
	// goes to the pinned replica, reserving base and retry scopes.
	f.replica("a2", w.i, func(r *registry.ConnectorReplica) { r.Capacity = 50 })
	f.update(r1.ID, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaDraining })
	b := f.resolve(req)
	if !b.Equal(&a) {
		t.Fatalf("retry returned %+v, want the pinned %+v", b, a)
	}
	res := f.reservation(req.ActionID)
	wantScopes := a.Admission.Scopes(true)
	if !res.Reserved || !res.Retry || res.LastSettlement != "" || !slices.Equal(res.Scopes, wantScopes) {
		t.Fatalf("retry reservation %+v, want scopes %v", res, wantScopes)
	}
	if res.Scopes[len(res.Scopes)-1].Kind != registry.ScopeTenantRetry {
		t.Fatalf("retry reservation lacks the tenant_retry scope: %v", res.Scopes)
	}
	if got := f.getReplica(r1.ID).ActiveAssignments; got != 1 {
		t.Fatalf("pinned replica active %d, want 1", got)
	}
	f.checkLedger(r1.ID)
	f.settle(b, registry.SettlementCompleted)
	l := f.checkLedger(r1.ID)
	if len(l.Counters) != 0 || len(l.Reservations) != 0 {
		t.Fatalf("settling the retry left %+v", l)
	}
	// The assignment is kept after settlement.
	kept, err := f.b.Resolver.Assignment(f.ctx, req.ActionID)
	f.must(err)
	if !kept.Equal(&a) {
		t.Fatalf("kept assignment %+v, want %+v", kept, a)
	}
}

func testPinnedUnavailable(t *testing.T, nb NewBackend) {
	standard := func() registry.RouteRequest {
		req := request("tenant-1", "alpha.read")
		req.Topology.CapacityClass = aip.DefaultCapacityClass
		return req
	}
	cases := []struct {
		name     string
		cut, fix func(f *fx, w routeWorld, r registry.ConnectorReplica)
		why      string // what the error tells the operator
	}{
		{"offline", func(f *fx, _ routeWorld, r registry.ConnectorReplica) {
			f.update(r.ID, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaOffline })
		}, func(f *fx, _ routeWorld, r registry.ConnectorReplica) {
			f.update(r.ID, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaReady })
		}, "the replica is offline"},
		{"lease expired", func(f *fx, _ routeWorld, r registry.ConnectorReplica) {
			f.clock.Advance(time.Minute)
		}, func(f *fx, _ routeWorld, r registry.ConnectorReplica) {
			f.update(r.ID, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now().Add(time.Minute) })
		}, "the replica's lease expired at"},
		{"full", func(f *fx, _ routeWorld, r registry.ConnectorReplica) {
			f.resolve(standard()) // the pinned replica's two slots
			f.resolve(standard())
		}, nil, "the replica is at its capacity of 2 actions in flight"},
		{"circuit open", func(f *fx, _ routeWorld, r registry.ConnectorReplica) {
			x := f.resolve(standard())
			f.settle(x, registry.SettlementOutcomeUnknown) // threshold 1
		}, func(f *fx, _ routeWorld, r registry.ConnectorReplica) {
			f.clock.Advance(time.Second)
			f.update(r.ID, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now().Add(time.Minute) })
		}, "the replica's circuit is open until"},
		{"version revoked", func(f *fx, w routeWorld, _ registry.ConnectorReplica) {
			f.must(f.b.Admin.SetVersionStatus(f.ctx, w.v.ID, registry.VersionRevoked))
		}, nil, "is revoked, not active"},
		{"version deactivated", func(f *fx, w routeWorld, _ registry.ConnectorReplica) {
			f.must(f.b.Admin.SetVersionStatus(f.ctx, w.v.ID, registry.VersionAdmitted))
		}, func(f *fx, w routeWorld, _ registry.ConnectorReplica) {
			f.must(f.b.Admin.SetVersionStatus(f.ctx, w.v.ID, registry.VersionActive))
		}, "is admitted, not active"},
		{"type disabled", func(f *fx, w routeWorld, _ registry.ConnectorReplica) {
			f.must(f.b.Admin.SetConnectorTypeEnabled(f.ctx, w.ct.ID, false))
		}, func(f *fx, w routeWorld, _ registry.ConnectorReplica) {
			f.must(f.b.Admin.SetConnectorTypeEnabled(f.ctx, w.ct.ID, true))
		}, "connector type ctype_alpha is disabled"},
		{"instance disabled", func(f *fx, w routeWorld, _ registry.ConnectorReplica) {
			i := w.i
			i.Status, i.ConfigRevision = registry.InstanceDisabled, 2
			f.must(f.b.Admin.PutInstance(f.ctx, i))
		}, func(f *fx, w routeWorld, _ registry.ConnectorReplica) {
			i := w.i
			i.Status, i.ConfigRevision = registry.InstanceEnabled, 3
			f.must(f.b.Admin.PutInstance(f.ctx, i))
		}, "is disabled"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFx(t, nb)
			pol := registry.FleetPolicy("quota:f")
			pol.CircuitFailureThreshold, pol.CircuitOpenMS = 1, 1000
			w := newRouteWorld(f, &pol)
			r := f.replica("pinned", w.i, func(r *registry.ConnectorReplica) { r.Capacity = 2 })
			req := request("tenant-1", "alpha.read")
			a := f.resolve(req)
			f.settle(a, registry.SettlementCancelled)
			// Another healthy replica is available; it must not be used. Its
			// capacity class keeps standard-class requests on the pinned one.
			spare := f.replica("spare", w.i, func(r *registry.ConnectorReplica) { r.Capacity = 10; r.Topology.CapacityClass = "reserve" })
			c.cut(f, w, r)
			_, err := f.b.Resolver.Resolve(f.ctx, req)
			f.wantErr(err, registry.ErrReplicaUnavailable, c.name)
			if !strings.Contains(err.Error(), c.why) {
				t.Fatalf("%s: error %q does not say why (%q)", c.name, err, c.why)
			}
			kept, err := f.b.Resolver.Assignment(f.ctx, req.ActionID)
			f.must(err)
			if !kept.Equal(&a) {
				t.Fatalf("the failed retry changed the assignment to %+v", kept)
			}
			if res := f.reservation(req.ActionID); res.Reserved {
				t.Fatalf("the failed retry left a reservation %+v", res)
			}
			if got := f.getReplica(spare.ID).ActiveAssignments; got != 0 {
				t.Fatalf("the failed retry used the spare replica (%d active)", got)
			}
			f.checkLedger(r.ID, spare.ID)
			if c.fix != nil {
				c.fix(f, w, r)
				if b := f.resolve(req); !b.Equal(&a) {
					t.Fatalf("after repair the retry returned %+v, want %+v", b, a)
				}
				f.checkLedger(r.ID, spare.ID)
			}
		})
	}
}

func testAdmissionScopes(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newRouteWorld(f, nil) // implicit fleet policy
	f.replica("a1", w.i)
	a := f.resolve(request("tenant-1", "alpha.read"))
	imp := registry.ImplicitAdmissionPolicy()
	want := registry.AdmissionReservation{
		PolicyRef: "", PolicyRevision: imp.Revision,
		BaseScopes: []registry.AdmissionScope{
			{Kind: registry.ScopeTenant, Key: "tenant-1", Limit: imp.MaxTenantInFlight},
			{Kind: registry.ScopeInstance, Key: w.i.ID, Limit: imp.MaxInstanceInFlight},
			{Kind: registry.ScopeBinding, Key: registry.BindingScopeKey(w.b.Key()), Limit: imp.MaxBindingInFlight},
		},
		RetryScope:              &registry.AdmissionScope{Kind: registry.ScopeTenantRetry, Key: "tenant-1", Limit: imp.MaxTenantRetryInFlight},
		CircuitFailureThreshold: imp.CircuitFailureThreshold, CircuitOpenMS: imp.CircuitOpenMS,
	}
	got := registry.RouteAssignment{Admission: a.Admission}
	if wantA := (registry.RouteAssignment{Admission: want}); !got.Equal(&wantA) {
		t.Fatalf("implicit reservation %+v, want %+v", a.Admission, want)
	}
	if a.QuotaPolicyRef != "" || a.Route(nil).QuotaPolicyRef != nil {
		t.Fatalf("implicit policy route carries quota policy %q", a.QuotaPolicyRef)
	}
}

func testAdmissionLimits(t *testing.T, nb NewBackend) {
	limits := []struct {
		scope registry.AdmissionScopeKind
		set   func(p *registry.AdmissionPolicy)
	}{
		{registry.ScopeGlobal, func(p *registry.AdmissionPolicy) { p.MaxGlobalInFlight = 2 }},
		{registry.ScopeTenant, func(p *registry.AdmissionPolicy) { p.MaxTenantInFlight = 2 }},
		{registry.ScopeConnectorType, func(p *registry.AdmissionPolicy) { p.MaxConnectorTypeInFlight = 2 }},
		{registry.ScopeInstance, func(p *registry.AdmissionPolicy) { p.MaxInstanceInFlight = 2 }},
		{registry.ScopeBinding, func(p *registry.AdmissionPolicy) { p.MaxBindingInFlight = 2 }},
	}
	for _, l := range limits {
		t.Run(string(l.scope), func(t *testing.T) {
			f := newFx(t, nb)
			pol := registry.ConservativePolicy("quota:c")
			l.set(&pol)
			w := newRouteWorld(f, &pol)
			r := f.replica("a1", w.i, func(r *registry.ConnectorReplica) { r.Capacity = 10 })
			// alpha.write on the same instance shares every scope but the binding.
			f.bind(w.i, "alpha.write", 0, "quota:c")
			first := f.resolve(request("tenant-1", "alpha.read"))
			capability := "alpha.write"
			if l.scope == registry.ScopeBinding {
				capability = "alpha.read"
			}
			f.resolve(request("tenant-1", capability))
			req := request("tenant-1", capability)
			_, err := f.b.Resolver.Resolve(f.ctx, req)
			var ce *registry.CapacityExceededError
			if !errors.As(err, &ce) || !errors.Is(err, registry.ErrCapacityExceeded) {
				t.Fatalf("third resolve: %v, want *CapacityExceededError", err)
			}
			if ce.Scope != l.scope || ce.Limit != 2 || ce.RetryAfter <= 0 || ce.RetryAfter > time.Minute {
				t.Fatalf("capacity error %+v, want scope %s limit 2 and bounded retry guidance", ce, l.scope)
			}
			_, err = f.b.Resolver.Assignment(f.ctx, req.ActionID)
			f.wantErr(err, registry.ErrNotFound, "refused action has no assignment")
			if got := f.getReplica(r.ID).ActiveAssignments; got != 2 {
				t.Fatalf("replica active %d after a refused resolve, want 2", got)
			}
			f.checkLedger(r.ID)
			f.settle(first, registry.SettlementCompleted)
			f.resolve(req)
			f.checkLedger(r.ID)
		})
	}
}

// testMixedLimits: a scope's in-flight count is checked against the limit
// of the reservation being made, however many of the scope's reservations
// were made under a higher limit (another policy sharing the scope, or the
// same policy before its limit was lowered). Each tenant holds eight
// reservations under limit 8 and releases all but one of them (a different
// one per tenant); then one reservation under limit 1 is refused.
func testMixedLimits(t *testing.T, nb NewBackend) {
	for _, lowered := range []bool{false, true} {
		name := "SecondPolicy"
		if lowered {
			name = "LoweredLimit"
		}
		t.Run(name, func(t *testing.T) {
			f := newFx(t, nb)
			wide := registry.FleetPolicy("quota:wide")
			wide.MaxTenantInFlight, wide.MaxInstanceInFlight, wide.MaxBindingInFlight = 8, registry.Unlimited, registry.Unlimited
			wide.MaxTenantRetryInFlight = registry.Unlimited
			narrow := wide
			narrow.PolicyRef, narrow.MaxTenantInFlight = "quota:narrow", 1
			f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, wide))
			f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, narrow))
			ct := f.typ("alpha")
			v := f.version(ct, "alpha1", registry.VersionActive, "alpha.read", "alpha.write")
			const tenants = 8
			held := make([]registry.RouteAssignment, tenants)
			var released []registry.RouteAssignment
			for j := range tenants {
				tenant := fmt.Sprintf("tenant-%d", j)
				i := f.instance(fmt.Sprintf("a%d", j), v, tenant)
				f.bind(i, "alpha.read", 0, wide.PolicyRef)
				f.bind(i, "alpha.write", 0, narrow.PolicyRef)
				f.replica(fmt.Sprintf("a%d", j), i, func(r *registry.ConnectorReplica) { r.Capacity = 100 })
				for k := range 8 {
					a := f.resolve(request(tenant, "alpha.read"))
					if k == j {
						held[j] = a
					} else {
						released = append(released, a)
					}
				}
				if _, err := f.b.Resolver.Resolve(f.ctx, request(tenant, "alpha.read")); !errors.Is(err, registry.ErrCapacityExceeded) {
					t.Fatalf("%s: ninth resolve under limit 8: %v, want ErrCapacityExceeded", tenant, err)
				}
			}
			for _, a := range released {
				f.settle(a, registry.SettlementCompleted)
			}
			capability := "alpha.write"
			if lowered {
				wide.Revision, wide.MaxTenantInFlight = 2, 1
				f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, wide))
				capability = "alpha.read"
			}
			for j := range tenants {
				tenant := fmt.Sprintf("tenant-%d", j)
				req := request(tenant, capability)
				_, err := f.b.Resolver.Resolve(f.ctx, req)
				var ce *registry.CapacityExceededError
				if !errors.As(err, &ce) || ce.Scope != registry.ScopeTenant || ce.Limit != 1 {
					t.Fatalf("%s: resolve under tenant limit 1 with one reservation in flight: %v, want the tenant scope full", tenant, err)
				}
				f.settle(held[j], registry.SettlementCompleted)
				f.resolve(req)
			}
			f.checkLedger()
		})
	}
}

func testRetryScope(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.FleetPolicy("quota:f")
	pol.MaxTenantRetryInFlight = 1
	w := newRouteWorld(f, &pol)
	r := f.replica("a1", w.i)
	x, y := request("tenant-1", "alpha.read"), request("tenant-1", "alpha.read")
	ax, ay := f.resolve(x), f.resolve(y)
	f.settle(ax, registry.SettlementOutcomeUnknown)
	f.settle(ay, registry.SettlementOutcomeUnknown)
	rx := f.resolve(x) // the one retry slot
	_, err := f.b.Resolver.Resolve(f.ctx, y)
	var ce *registry.CapacityExceededError
	if !errors.As(err, &ce) || ce.Scope != registry.ScopeTenantRetry {
		t.Fatalf("second concurrent retry: %v, want tenant_retry capacity", err)
	}
	// New work is not limited by the retry scope.
	f.resolve(request("tenant-1", "alpha.read"))
	f.settle(rx, registry.SettlementCompleted) // the retry's hand-out (ax's reservation is gone)
	f.resolve(y)
	f.checkLedger(r.ID)
}

func testInvalidRequests(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newRouteWorld(f, nil)
	f.replica("a1", w.i)
	for _, c := range []struct {
		field string
		mod   func(*registry.RouteRequest)
	}{
		{"tenant_id", func(r *registry.RouteRequest) { r.TenantID = "" }},
		{"action_id", func(r *registry.RouteRequest) { r.ActionID = "" }},
		{"action_id", func(r *registry.RouteRequest) { r.ActionID = "msg_0190f2a0b1c27d3e8f9a0b1c2d3e4f50" }},
		{"capability_id", func(r *registry.RouteRequest) { r.CapabilityID = "" }},
		{"topology.region", func(r *registry.RouteRequest) { r.Topology.Region = "eu west" }},
		{"topology.forbid_cross_region", func(r *registry.RouteRequest) { r.Topology.ForbidCrossRegion = true }},
	} {
		req := request("tenant-1", "alpha.read")
		c.mod(&req)
		_, err := f.b.Resolver.Resolve(f.ctx, req)
		f.wantField(err, registry.ErrInvalid, c.field, "request with bad "+c.field)
	}
	l := f.checkLedger()
	if len(l.Reservations) != 0 {
		t.Fatalf("invalid requests reserved capacity: %+v", l)
	}
}
