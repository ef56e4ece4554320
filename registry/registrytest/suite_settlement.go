package registrytest

import (
	"context"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

func runSettlement(t *testing.T, nb NewBackend) {
	t.Run("EveryOutcomeReleasesEveryCounter", func(t *testing.T) { testOutcomesRelease(t, nb) })
	t.Run("ExactAssignmentOrFenceLost", func(t *testing.T) { testFenceLost(t, nb) })
	t.Run("Idempotent", func(t *testing.T) { testSettleIdempotent(t, nb) })
	t.Run("Circuit", func(t *testing.T) { testCircuit(t, nb) })
	t.Run("UnstorableKeys", func(t *testing.T) { testUnstorableKeys(t, nb) })
}

func testOutcomesRelease(t *testing.T, nb NewBackend) {
	for _, outcome := range []registry.RouteSettlement{
		registry.SettlementCompleted, registry.SettlementOutcomeUnknown, registry.SettlementCancelled, registry.SettlementLeaseExpired,
	} {
		t.Run(string(outcome), func(t *testing.T) {
			f := newFx(t, nb)
			pol := registry.ConservativePolicy("quota:c")
			w := newRouteWorld(f, &pol)
			r := f.replica("a1", w.i)
			a := f.resolve(request("tenant-1", "alpha.read"))
			// A retried route holds the retry scope too.
			b := f.resolve(request("tenant-1", "alpha.read"))
			f.settle(b, registry.SettlementCancelled)
			b = f.resolve(registry.RouteRequest{ActionID: b.ActionID, TenantID: "tenant-1", CapabilityID: "alpha.read"})
			if l := f.checkLedger(r.ID); len(l.Counters) != 6 || len(l.Reservations) != 2 {
				t.Fatalf("ledger before settlement: %+v", l)
			}
			f.settle(a, outcome)
			f.settle(b, outcome)
			l := f.checkLedger(r.ID)
			if len(l.Counters) != 0 || len(l.Reservations) != 0 {
				t.Fatalf("%s left %+v", outcome, l)
			}
			for _, x := range []registry.RouteAssignment{a, b} {
				res := f.reservation(x.ActionID)
				if res.Reserved || res.LastSettlement != outcome || len(res.Scopes) != 0 {
					t.Fatalf("reservation after %s: %+v", outcome, res)
				}
				kept, err := f.b.Resolver.Assignment(f.ctx, x.ActionID)
				f.must(err)
				if !kept.Equal(&x) {
					t.Fatalf("settlement changed the assignment to %+v", kept)
				}
			}
		})
	}
}

func testFenceLost(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newRouteWorld(f, nil)
	r := f.replica("a1", w.i)
	a := f.resolve(request("tenant-1", "alpha.read"))
	for _, c := range []struct {
		name string
		mod  func(*registry.RouteAssignment)
	}{
		{"fence token", func(a *registry.RouteAssignment) { a.FenceToken = aip.NewID(aip.PrefixRoute) }},
		{"replica", func(a *registry.RouteAssignment) { a.ReplicaID = "crepl_other" }},
		{"endpoint", func(a *registry.RouteAssignment) { a.Endpoint = "https://elsewhere.test" }},
		{"health revision", func(a *registry.RouteAssignment) { a.ReplicaHealthRevision++ }},
		{"catalog revision", func(a *registry.RouteAssignment) { a.CatalogRevision++ }},
		{"assigned at", func(a *registry.RouteAssignment) { a.AssignedAt = a.AssignedAt.Add(time.Millisecond) }},
		{"admission scope", func(a *registry.RouteAssignment) { a.Admission.BaseScopes[0].Limit++ }},
		{"retry scope", func(a *registry.RouteAssignment) { a.Admission.RetryScope = nil }},
		{"credential", func(a *registry.RouteAssignment) { a.CredentialRevisionRef = "cred-rev-2" }},
	} {
		forged := a.Clone()
		c.mod(&forged)
		err := f.b.Resolver.Settle(f.ctx, forged, registry.SettlementCompleted)
		f.wantErr(err, registry.ErrFenceLost, "settling with a changed "+c.name)
		if res := f.reservation(a.ActionID); !res.Reserved {
			t.Fatalf("a fenced-off settlement (%s) released the reservation", c.name)
		}
	}
	other := a.Clone()
	other.ActionID = aip.NewActionID()
	f.wantErr(f.b.Resolver.Settle(f.ctx, other, registry.SettlementCompleted), registry.ErrNotFound, "settling an unknown action")
	f.wantErr(f.b.Resolver.Settle(f.ctx, a, "done"), registry.ErrInvalid, "an unknown outcome")
	f.checkLedger(r.ID)
	f.settle(a, registry.SettlementCompleted)
	f.checkLedger(r.ID)
}

func testSettleIdempotent(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newRouteWorld(f, nil)
	r := f.replica("a1", w.i)
	a := f.resolve(request("tenant-1", "alpha.read"))
	b := f.resolve(request("tenant-1", "alpha.read"))
	f.settle(a, registry.SettlementOutcomeUnknown)
	f.settle(a, registry.SettlementOutcomeUnknown)
	f.settle(a, registry.SettlementCompleted)
	if res := f.reservation(a.ActionID); res.LastSettlement != registry.SettlementOutcomeUnknown {
		t.Fatalf("a repeated settlement replaced the recorded outcome: %+v", res)
	}
	rep := f.getReplica(r.ID)
	if rep.ActiveAssignments != 1 || rep.Circuit.ConsecutiveFailures != 1 {
		t.Fatalf("repeated settlements changed the replica: active %d failures %d, want 1 and 1", rep.ActiveAssignments, rep.Circuit.ConsecutiveFailures)
	}
	if res := f.reservation(b.ActionID); !res.Reserved {
		t.Fatal("settling one action released another")
	}
	f.checkLedger(r.ID)
}

func testCircuit(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.FleetPolicy("quota:f")
	pol.CircuitFailureThreshold, pol.CircuitOpenMS = 2, 5000
	w := newRouteWorld(f, &pol)
	r := f.replica("a1", w.i, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now().Add(time.Hour) })
	settle := func(outcome registry.RouteSettlement) {
		t.Helper()
		f.settle(f.resolve(request("tenant-1", "alpha.read")), outcome)
	}
	circuit := func() registry.CircuitState { t.Helper(); return f.getReplica(r.ID).Circuit }

	settle(registry.SettlementOutcomeUnknown)
	if c := circuit(); c.ConsecutiveFailures != 1 || !c.Closed(f.clock.Now()) {
		t.Fatalf("after one unknown outcome: %+v, want 1 failure and closed", c)
	}
	settle(registry.SettlementCompleted)
	if c := circuit(); c != (registry.CircuitState{}) {
		t.Fatalf("completed did not reset the circuit: %+v", c)
	}
	settle(registry.SettlementOutcomeUnknown)
	settle(registry.SettlementCancelled) // cancellation keeps the count
	settle(registry.SettlementLeaseExpired)
	pruned := f.resolve(request("tenant-1", "alpha.read"))
	f.settle(pruned, registry.SettlementPruned) // the replica's journal pruned it: nothing about its health
	if res := f.reservation(pruned.ActionID); res.Reserved || res.LastSettlement != registry.SettlementPruned {
		t.Fatalf("a route settled pruned: %+v, want released with last settlement pruned", res)
	}
	if c := circuit(); c.ConsecutiveFailures != 1 {
		t.Fatalf("cancelled, lease_expired and pruned changed the failures: %+v", c)
	}
	f.clock.Advance(10 * time.Millisecond)
	opened := f.clock.Now()
	settle(registry.SettlementOutcomeUnknown)
	if c := circuit(); c.ConsecutiveFailures != 2 || !c.OpenUntil.Equal(opened.Add(5*time.Second)) {
		t.Fatalf("at the threshold: %+v, want 2 failures and open until %v", c, opened.Add(5*time.Second))
	}
	_, err := f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
	f.wantErr(err, registry.ErrReplicaUnavailable, "routing to an open circuit")
	f.clock.Advance(5*time.Second - time.Millisecond)
	_, err = f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
	f.wantErr(err, registry.ErrReplicaUnavailable, "a millisecond before the circuit closes")
	f.clock.Advance(time.Millisecond)
	// Half-open: one more unknown outcome reopens it at once.
	a := f.resolve(request("tenant-1", "alpha.read"))
	f.settle(a, registry.SettlementOutcomeUnknown)
	if c := circuit(); c.ConsecutiveFailures != 3 || !c.OpenUntil.Equal(f.clock.Now().Add(5*time.Second)) {
		t.Fatalf("after reopening: %+v", c)
	}
	// A completed settlement of work already in flight closes it.
	f.clock.Advance(5 * time.Second)
	b := f.resolve(request("tenant-1", "alpha.read"))
	c2 := f.resolve(request("tenant-1", "alpha.read"))
	f.settle(b, registry.SettlementOutcomeUnknown)
	f.settle(c2, registry.SettlementCompleted)
	if c := circuit(); c != (registry.CircuitState{}) {
		t.Fatalf("completed did not close the circuit: %+v", c)
	}
	f.resolve(request("tenant-1", "alpha.read"))
	f.checkLedger(r.ID)
}

func runFleet(t *testing.T, nb NewBackend) {
	t.Run("ExpireStaleReplicas", func(t *testing.T) { testExpiry(t, nb) })
	t.Run("Status", func(t *testing.T) { testStatus(t, nb) })
	t.Run("ReleaseStrandedReservations", func(t *testing.T) { runStranded(t, nb) })
}

func testExpiry(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.ConservativePolicy("quota:c")
	w := newRouteWorld(f, &pol)
	now := f.clock.Now()
	lease := func(d time.Duration) func(*registry.ConnectorReplica) {
		return func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = now.Add(d); r.Capacity = 10 }
	}
	r10 := f.replica("r10", w.i, lease(10*time.Second), func(r *registry.ConnectorReplica) { r.Topology.CapacityClass = "c10" })
	r20 := f.replica("r20", w.i, lease(20*time.Second), func(r *registry.ConnectorReplica) { r.Topology.CapacityClass = "c20" })
	r30 := f.replica("r30", w.i, lease(30*time.Second), func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaDraining })
	fresh := f.replica("fresh", w.i, lease(time.Hour), func(r *registry.ConnectorReplica) { r.Topology.CapacityClass = "cfresh" })
	off := f.replica("off", w.i, lease(0), func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaOffline })
	route := func(class string) registry.RouteAssignment {
		req := request("tenant-1", "alpha.read")
		req.Topology.CapacityClass = class
		return f.resolve(req)
	}
	a10, a20, aFresh := route("c10"), route("c20"), route("cfresh")
	b20 := route("c20")
	f.settle(b20, registry.SettlementCompleted)
	r10 = f.update(r10.ID, func(r *registry.ConnectorReplica) {
		r.LastControlRequestID, r.LastControlRequestDigest = aip.NewMessageID(), Digest("heartbeat")
	})

	n, err := f.b.Fleet.ExpireStaleReplicas(f.ctx, 5)
	f.must(err)
	if n != 0 {
		t.Fatalf("expired %d replicas before any lease ran out", n)
	}
	f.wantErr(errOf(f.b.Fleet.ExpireStaleReplicas(f.ctx, 0)), registry.ErrInvalid, "limit 0")

	f.clock.Advance(45 * time.Second) // r10, r20, r30 expired; fresh and off not eligible
	if s := f.status(); s.ExpiredLeases != 3 {
		t.Fatalf("status before expiry counts %d expired leases, want 3", s.ExpiredLeases)
	}
	n, err = f.b.Fleet.ExpireStaleReplicas(f.ctx, 2)
	f.must(err)
	if n != 2 {
		t.Fatalf("expired %d replicas with limit 2", n)
	}
	for _, c := range []struct {
		before  registry.ConnectorReplica
		expired bool
	}{{r10, true}, {r20, true}, {r30, false}} {
		got := f.getReplica(c.before.ID)
		if !c.expired {
			if !registry.ReplicaEqual(&got, &c.before) {
				t.Fatalf("replica %s was expired beyond the limit (oldest leases go first)", got.ID)
			}
			continue
		}
		want := c.before
		want.Status, want.ActiveAssignments, want.HealthRevision = aip.ReplicaOffline, 0, c.before.HealthRevision+1
		want.LastControlRequestID, want.LastControlRequestDigest = "", ""
		want.OfflineReason, want.OfflineAt = registry.OfflineLeaseExpired, f.clock.Now()
		if !registry.ReplicaEqual(&got, &want) {
			t.Fatalf("expired replica\n got %+v\nwant %+v", got, want)
		}
	}
	for _, a := range []registry.RouteAssignment{a10, a20} {
		if res := f.reservation(a.ActionID); res.Reserved || res.LastSettlement != registry.SettlementLeaseExpired {
			t.Fatalf("reservation on an expired replica: %+v", res)
		}
		kept, err := f.b.Resolver.Assignment(f.ctx, a.ActionID)
		f.must(err)
		if !kept.Equal(&a) {
			t.Fatalf("expiry rewrote the assignment: %+v", kept)
		}
		// A retry never reroutes: the pinned replica is offline.
		_, err = f.b.Resolver.Resolve(f.ctx, registry.RouteRequest{ActionID: a.ActionID, TenantID: a.TenantID, CapabilityID: a.CapabilityID})
		f.wantErr(err, registry.ErrReplicaUnavailable, "retrying on an expired replica")
	}
	if res := f.reservation(b20.ActionID); res.LastSettlement != registry.SettlementCompleted {
		t.Fatalf("expiry relabelled an already settled route: %+v", res)
	}
	if res := f.reservation(aFresh.ActionID); !res.Reserved {
		t.Fatal("expiry released a reservation on a live replica")
	}
	// Settling an expired route afterwards is a no-op.
	f.settle(a10, registry.SettlementCompleted)
	n, err = f.b.Fleet.ExpireStaleReplicas(f.ctx, 10)
	f.must(err)
	if n != 1 {
		t.Fatalf("second pass expired %d, want 1 (r30)", n)
	}
	if got := f.getReplica(off.ID); got.HealthRevision != off.HealthRevision {
		t.Fatal("an offline replica was expired again")
	}
	n, err = f.b.Fleet.ExpireStaleReplicas(f.ctx, 10)
	f.must(err)
	if n != 0 {
		t.Fatalf("third pass expired %d, want 0", n)
	}
	f.checkLedger(r10.ID, r20.ID, r30.ID, fresh.ID, off.ID)
	// An expired replica re-registers with a newer health revision; its
	// active assignments stay zero.
	f.update(r10.ID, func(r *registry.ConnectorReplica) {
		r.Status, r.LeaseExpiresAt = aip.ReplicaReady, f.clock.Now().Add(time.Minute)
	})
	route("c10")
	f.checkLedger(r10.ID)
}

func errOf(_ int, err error) error { return err }

func (f *fx) status() registry.FleetStatusSummary {
	f.t.Helper()
	s, err := f.b.Fleet.Status(f.ctx)
	f.must(err)
	return s
}

func testStatus(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	if s := f.status(); !s.ObservedAt.Equal(f.clock.Now()) || s.Replicas != 0 || s.ConnectorTypes != 0 || s.CatalogRevision != 0 {
		t.Fatalf("empty fleet status %+v", s)
	}
	w := newRouteWorld(f, nil)
	f.version(w.ct, "alpha2", registry.VersionAdmitted, "alpha.read")
	ct2 := f.typ("beta")
	vb := f.version(ct2, "beta1", registry.VersionActive, "beta.read")
	ib := f.instance("b", vb, "tenant-2")
	ib.Status, ib.ConfigRevision = registry.InstanceDisabled, 2
	f.must(f.b.Admin.PutInstance(f.ctx, ib))
	now := f.clock.Now()
	f.replica("ready1", w.i, func(r *registry.ConnectorReplica) { r.Capacity = 5 })
	f.replica("ready2", w.i, func(r *registry.ConnectorReplica) { r.Capacity = 7; r.LeaseExpiresAt = now.Add(time.Hour) })
	f.replica("drain", w.i, func(r *registry.ConnectorReplica) {
		r.Status = aip.ReplicaDraining
		r.LeaseExpiresAt = now.Add(time.Hour)
	})
	f.replica("off", w.i, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaOffline })
	// Offline replicas: pre-provisioned and never registered (health
	// revision 0); offline within RecentOfflineWindow of the observation
	// (a minute from now); and retired before it, the window's end
	// included.
	observed := now.Add(time.Minute)
	f.replica("unreg", w.i, func(r *registry.ConnectorReplica) {
		r.Status, r.HealthRevision, r.LeaseExpiresAt = aip.ReplicaOffline, 0, time.Time{}
	})
	f.replica("recent", w.i, func(r *registry.ConnectorReplica) {
		r.Status, r.HealthRevision, r.LeaseExpiresAt = aip.ReplicaOffline, 5, observed.Add(-registry.RecentOfflineWindow+time.Millisecond)
	})
	f.replica("retired1", w.i, func(r *registry.ConnectorReplica) {
		r.Status, r.HealthRevision, r.LeaseExpiresAt = aip.ReplicaOffline, 5, observed.Add(-registry.RecentOfflineWindow)
	})
	f.replica("retired2", w.i, func(r *registry.ConnectorReplica) {
		r.Status, r.HealthRevision, r.LeaseExpiresAt = aip.ReplicaOffline, 9, observed.Add(-30*24*time.Hour)
	})
	f.resolve(request("tenant-1", "alpha.read"))
	f.resolve(request("tenant-1", "alpha.read"))
	f.clock.Advance(time.Minute) // ready1's lease runs out
	s := f.status()
	want := registry.FleetStatusSummary{
		CatalogRevision: f.revision(), ConnectorTypes: 2, ActiveVersions: 2, EnabledInstances: 1,
		Replicas: 8, LiveReplicas: 3, ReadyReplicas: 1, DrainingReplicas: 1, ExpiredLeases: 1,
		OfflineReplicas: 5, UnregisteredReplicas: 1, RecentlyOfflineReplicas: 2, RetiredReplicas: 2,
		ReadyCapacity: 7, ActiveAssignments: 2, ObservedAt: f.clock.Now(),
	}
	if !s.ObservedAt.Equal(want.ObservedAt) {
		t.Fatalf("observed at %v, want the backend clock %v", s.ObservedAt, want.ObservedAt)
	}
	s.ObservedAt = want.ObservedAt
	if s != want {
		t.Fatalf("status\n got %+v\nwant %+v", s, want)
	}
}

func runBoundaries(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.FleetPolicy("quota:f")
	pol.MaxBindingInFlight = 1
	w := newRouteWorld(f, &pol)
	r := f.replica("a1", w.i)
	other := f.instance("other", w.v, "tenant-2")
	f.bind(other, "alpha.write", 0, "")
	f.replica("o1", other)

	t.Run("NoVerifiedTenant", func(t *testing.T) {
		_, err := f.b.Resolver.Resolve(f.ctx, registry.RouteRequest{ActionID: aip.NewActionID(), CapabilityID: "alpha.read"})
		f.wantErr(err, registry.ErrInvalid, "a request without a tenant")
		p, err := f.b.Catalog.QueryCapabilities(f.ctx, registry.CatalogQuery{Limit: 10}, registry.ReadContext{})
		f.must(err)
		if len(p.Capabilities) != 0 {
			t.Fatalf("catalog without a tenant returned %v", ids(p))
		}
	})
	t.Run("MissingBinding", func(t *testing.T) {
		_, err := f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.write"))
		f.wantErr(err, registry.ErrBindingUnavailable, "tenant-1 has no alpha.write binding (tenant-2 does)")
	})
	var held registry.RouteAssignment
	t.Run("AdmissionLimitReached", func(t *testing.T) {
		held = f.resolve(request("tenant-1", "alpha.read"))
		_, err := f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
		f.wantErr(err, registry.ErrCapacityExceeded, "binding limit 1")
		if got := f.getReplica(r.ID).ActiveAssignments; got != 1 {
			t.Fatalf("the refused request overbooked the replica: %d", got)
		}
	})
	t.Run("NoEligibleHost", func(t *testing.T) {
		f.settle(held, registry.SettlementCompleted)
		f.update(r.ID, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaDraining })
		_, err := f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
		f.wantErr(err, registry.ErrReplicaUnavailable, "only a draining replica")
		f.update(r.ID, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaReady })
		f.clock.Advance(time.Minute)
		_, err = f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
		f.wantErr(err, registry.ErrReplicaUnavailable, "only an expired replica")
		f.update(r.ID, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now().Add(time.Hour) })
	})
	t.Run("ChangedCatalogDuringPagination", func(t *testing.T) {
		f.bind(w.i, "alpha.write", 0, "")
		p, err := f.b.Catalog.QueryCapabilities(f.ctx, registry.CatalogQuery{Limit: 1}, registry.ForTenant("tenant-1"))
		f.must(err)
		f.must(f.b.Admin.SetConnectorTypeEnabled(f.ctx, w.ct.ID, true)) // no change: cursor still good
		_, err = f.b.Catalog.QueryCapabilities(f.ctx, registry.CatalogQuery{Limit: 1, Cursor: p.NextCursor}, registry.ForTenant("tenant-1"))
		f.must(err)
		f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, registry.FleetPolicy("quota:new")))
		_, err = f.b.Catalog.QueryCapabilities(f.ctx, registry.CatalogQuery{Limit: 1, Cursor: p.NextCursor}, registry.ForTenant("tenant-1"))
		f.wantErr(err, registry.ErrStaleCursor, "a cursor across a publication")
	})
	t.Run("AssignmentMismatch", func(t *testing.T) {
		a := f.resolve(request("tenant-1", "alpha.read"))
		_, err := f.b.Resolver.Resolve(f.ctx, registry.RouteRequest{ActionID: a.ActionID, TenantID: "tenant-2", CapabilityID: "alpha.read"})
		f.wantErr(err, registry.ErrConflict, "the same action for another tenant")
		stale := a.Clone()
		stale.FenceToken = aip.NewID(aip.PrefixRoute)
		f.wantErr(f.b.Resolver.Settle(f.ctx, stale, registry.SettlementCompleted), registry.ErrFenceLost, "a stale fence")
		f.settle(a, registry.SettlementCompleted)
	})
	t.Run("StorageFailureCommitsNothing", func(t *testing.T) {
		// A call that cannot complete (here: its context is done) returns an
		// error and changes nothing.
		dead, cancel := context.WithCancel(f.ctx)
		cancel()
		rev := f.revision()
		req := request("tenant-1", "alpha.read")
		if _, err := f.b.Resolver.Resolve(dead, req); err == nil {
			t.Fatal("Resolve with a done context succeeded")
		}
		if _, err := f.b.Resolver.Assignment(f.ctx, req.ActionID); err == nil {
			t.Fatal("a failed Resolve left an assignment")
		}
		if err := f.b.Admin.PutAdmissionPolicy(dead, registry.FleetPolicy("quota:dead")); err == nil {
			t.Fatal("PutAdmissionPolicy with a done context succeeded")
		}
		if f.revision() != rev {
			t.Fatal("a failed write moved the catalog revision")
		}
		a := f.resolve(req)
		if err := f.b.Resolver.Settle(dead, a, registry.SettlementCompleted); err == nil {
			t.Fatal("Settle with a done context succeeded")
		}
		if res := f.reservation(a.ActionID); !res.Reserved {
			t.Fatal("a failed Settle released the reservation")
		}
		if _, err := f.b.Fleet.ExpireStaleReplicas(dead, 10); err == nil {
			t.Fatal("ExpireStaleReplicas with a done context succeeded")
		}
		f.settle(a, registry.SettlementCompleted)
		f.checkLedger(r.ID)
	})
}
