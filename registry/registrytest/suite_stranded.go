package registrytest

import (
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// runStranded holds backends to FleetStatus.ReleaseStrandedReservations:
// the reservations left on a replica that went offline other than by lease
// expiry are released once the grace has passed, and only then.
func runStranded(t *testing.T, nb NewBackend) {
	t.Run("ReleasedAfterTheGrace", func(t *testing.T) { testStrandedRelease(t, nb) })
	t.Run("GraceRunsFromTheLastHandout", func(t *testing.T) { testStrandedHandout(t, nb) })
	t.Run("BoundedOldestLeaseFirst", func(t *testing.T) { testStrandedBounded(t, nb) })
	t.Run("LifecycleOffline", func(t *testing.T) { testStrandedLifecycle(t, nb) })
}

const strandedGrace = registry.StrandedReservationGrace

// releaseStranded calls ReleaseStrandedReservations with the production
// grace and fails the test on an error.
func (f *fx) releaseStranded(limit int) registry.StrandedRelease {
	f.t.Helper()
	rel, err := f.b.Fleet.ReleaseStrandedReservations(f.ctx, strandedGrace, limit)
	f.must(err)
	return rel
}

func (f *fx) wantStranded(limit int, want registry.StrandedRelease) {
	f.t.Helper()
	if got := f.releaseStranded(limit); got != want {
		f.t.Fatalf("ReleaseStrandedReservations(limit %d) at %s = %+v, want %+v", limit, f.clock.Now(), got, want)
	}
}

// goOffline takes a replica offline as an administrator does: a newer
// health revision, status offline, lease ended now.
func (f *fx) goOffline(id string) registry.ConnectorReplica {
	f.t.Helper()
	return f.update(id, func(r *registry.ConnectorReplica) { r.Status, r.LeaseExpiresAt = aip.ReplicaOffline, f.clock.Now() })
}

func testStrandedRelease(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.ConservativePolicy("quota:c")
	pol.CircuitFailureThreshold, pol.CircuitOpenMS = 1, 60_000
	w := newRouteWorld(f, &pol)
	hour := func(class string) func(*registry.ConnectorReplica) {
		return func(r *registry.ConnectorReplica) {
			r.LeaseExpiresAt, r.Capacity, r.Topology.CapacityClass = f.clock.Now().Add(time.Hour), 10, class
		}
	}
	gone := f.replica("gone", w.i, hour("c-gone"))
	live := f.replica("live", w.i, hour("c-live"))
	idle := f.replica("idle", w.i, hour("c-idle"))
	route := func(class string) registry.RouteAssignment {
		req := request("tenant-1", "alpha.read")
		req.Topology.CapacityClass = class
		return f.resolve(req)
	}
	a1, a2, b := route("c-gone"), route("c-gone"), route("c-live")
	// a2 is a retry: it holds the retry scope too.
	f.settle(a2, registry.SettlementCancelled)
	f.resolve(registry.RouteRequest{ActionID: a2.ActionID, TenantID: "tenant-1", CapabilityID: "alpha.read"})
	// A settled route on the replica is not relabelled.
	done := route("c-gone")
	f.settle(done, registry.SettlementCompleted)

	f.wantErr(errOfRelease(f.b.Fleet.ReleaseStrandedReservations(f.ctx, strandedGrace, 0)), registry.ErrInvalid, "limit 0")
	f.wantErr(errOfRelease(f.b.Fleet.ReleaseStrandedReservations(f.ctx, -time.Second, 1)), registry.ErrInvalid, "a negative grace")

	gone = f.goOffline(gone.ID)
	idle = f.goOffline(idle.ID)
	if gone.ActiveAssignments != 2 {
		t.Fatalf("the offline replica holds %d active assignments, want 2", gone.ActiveAssignments)
	}
	// During the grace the reservations are kept.
	f.wantStranded(10, registry.StrandedRelease{})
	f.clock.Advance(strandedGrace - time.Millisecond)
	f.wantStranded(10, registry.StrandedRelease{})
	for _, a := range []registry.RouteAssignment{a1, a2} {
		if !f.reservation(a.ActionID).Reserved {
			t.Fatalf("the reservation of %s was released during the grace", a.ActionID)
		}
	}
	f.checkLedger(gone.ID, live.ID, idle.ID)

	// Once it has passed they are released, and nothing else is.
	f.clock.Advance(time.Millisecond)
	f.wantStranded(10, registry.StrandedRelease{Replicas: 1, Reservations: 2})
	want := gone
	want.ActiveAssignments = 0
	if got := f.getReplica(gone.ID); !registry.ReplicaEqual(&got, &want) {
		t.Fatalf("after the release the replica is\n got %+v\nwant %+v (only its active assignments change)", got, want)
	}
	if got := f.getReplica(idle.ID); !registry.ReplicaEqual(&got, &idle) {
		t.Fatalf("an offline replica without reservations changed: %+v", got)
	}
	for _, a := range []registry.RouteAssignment{a1, a2} {
		if res := f.reservation(a.ActionID); res.Reserved || res.LastSettlement != registry.SettlementLeaseExpired || len(res.Scopes) != 0 {
			t.Fatalf("reservation on the offline replica after the grace: %+v", res)
		}
		kept, err := f.b.Resolver.Assignment(f.ctx, a.ActionID)
		f.must(err)
		if !kept.Equal(&a) {
			t.Fatalf("the release rewrote the assignment: %+v", kept)
		}
	}
	if res := f.reservation(done.ActionID); res.LastSettlement != registry.SettlementCompleted {
		t.Fatalf("the release relabelled a settled route: %+v", res)
	}
	if !f.reservation(b.ActionID).Reserved {
		t.Fatal("the release took a reservation on a live replica")
	}
	l := f.checkLedger(gone.ID, live.ID, idle.ID)
	if len(l.Reservations) != 1 || l.Reservations[0].ActionID != b.ActionID {
		t.Fatalf("ledger after the release: %+v", l)
	}
	// Idempotent: the next cycles find nothing.
	f.wantStranded(10, registry.StrandedRelease{})
	f.clock.Advance(time.Hour)
	f.wantStranded(10, registry.StrandedRelease{})

	// Late settlements of released routes change nothing: not the
	// replica's count, not its circuit, not the counters.
	f.settle(a1, registry.SettlementOutcomeUnknown)
	f.must(f.b.Orphans.SettleOrphan(f.ctx, a2, registry.SettlementOutcomeUnknown, a2.HandOut))
	if got := f.getReplica(gone.ID); !registry.ReplicaEqual(&got, &want) {
		t.Fatalf("a late settlement changed the replica: %+v", got)
	}
	for _, a := range []registry.RouteAssignment{a1, a2} {
		if res := f.reservation(a.ActionID); res.LastSettlement != registry.SettlementLeaseExpired {
			t.Fatalf("a late settlement relabelled the route: %+v", res)
		}
	}
	f.settle(b, registry.SettlementCompleted)
	if l := f.checkLedger(gone.ID, live.ID, idle.ID); len(l.Counters) != 0 || len(l.Reservations) != 0 {
		t.Fatalf("with every route settled or released the ledger holds %+v", l)
	}

	// The replica comes back and routes again; a late settlement of a
	// released route still changes nothing.
	f.update(gone.ID, func(r *registry.ConnectorReplica) {
		r.Status, r.LeaseExpiresAt = aip.ReplicaReady, f.clock.Now().Add(time.Hour)
	})
	c := route("c-gone")
	f.settle(a2, registry.SettlementOutcomeUnknown)
	f.settle(a1, registry.SettlementCompleted)
	back := f.getReplica(gone.ID)
	if back.ActiveAssignments != 1 || back.Circuit != (registry.CircuitState{}) {
		t.Fatalf("late settlements on the re-registered replica: active %d, circuit %+v; want 1 and closed", back.ActiveAssignments, back.Circuit)
	}
	if !f.reservation(c.ActionID).Reserved {
		t.Fatal("a late settlement released another route's reservation")
	}
	f.checkLedger(gone.ID, live.ID, idle.ID)
	f.settle(c, registry.SettlementCompleted)
	if l := f.checkLedger(gone.ID); len(l.Counters) != 0 {
		t.Fatalf("counters left: %+v", l.Counters)
	}
}

func errOfRelease(_ registry.StrandedRelease, err error) error { return err }

// testStrandedHandout: a reservation handed out again after its replica
// went offline (a Resolve returned it while held) is kept for the grace
// from that handout; its neighbour, handed out before, goes at the grace
// from the offline.
func testStrandedHandout(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newRouteWorld(f, nil)
	r := f.replica("a1", w.i, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now().Add(time.Hour) })
	reqA := request("tenant-1", "alpha.read")
	a := f.resolve(reqA)
	old := f.resolve(request("tenant-1", "alpha.read"))
	f.goOffline(r.ID)
	f.clock.Advance(10 * time.Minute)
	again, err := f.b.Resolver.Resolve(f.ctx, reqA)
	f.must(err)
	if !again.Equal(&a) {
		t.Fatal("a resolve of a held route changed its assignment")
	}
	handout := f.handedOut(a.ActionID)
	f.clock.Advance(strandedGrace - 10*time.Minute)
	f.wantStranded(10, registry.StrandedRelease{Replicas: 1, Reservations: 1})
	if res := f.reservation(old.ActionID); res.Reserved {
		t.Fatalf("the reservation handed out before the offline is kept: %+v", res)
	}
	if !f.reservation(a.ActionID).Reserved {
		t.Fatal("a reservation handed out after the offline was released before the grace from its handout")
	}
	f.checkLedger(r.ID)
	f.clock.Set(handout.Add(strandedGrace - time.Millisecond))
	f.wantStranded(10, registry.StrandedRelease{})
	f.clock.Set(handout.Add(strandedGrace))
	f.wantStranded(10, registry.StrandedRelease{Replicas: 1, Reservations: 1})
	if l := f.checkLedger(r.ID); len(l.Counters) != 0 || len(l.Reservations) != 0 {
		t.Fatalf("ledger after both releases: %+v", l)
	}
}

// testStrandedBounded: one call takes at most limit replicas, oldest lease
// end first, and a later call the rest.
func testStrandedBounded(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newRouteWorld(f, nil)
	var ids []string
	var held []registry.RouteAssignment
	for _, n := range []string{"r3", "r1", "r2"} {
		rep := f.replica(n, w.i, func(r *registry.ConnectorReplica) {
			r.LeaseExpiresAt, r.Topology.CapacityClass = f.clock.Now().Add(time.Hour), "class-"+n
		})
		ids = append(ids, rep.ID)
		for range 2 {
			req := request("tenant-1", "alpha.read")
			req.Topology.CapacityClass = "class-" + n
			held = append(held, f.resolve(req))
		}
	}
	// Offline in the order r1, r2, r3, a second apart.
	for _, id := range []string{ids[1], ids[2], ids[0]} {
		f.goOffline(id)
		f.clock.Advance(time.Second)
	}
	f.clock.Advance(strandedGrace)
	f.wantStranded(2, registry.StrandedRelease{Replicas: 2, Reservations: 4})
	if got := f.getReplica(ids[0]); got.ActiveAssignments != 2 {
		t.Fatalf("the replica with the newest lease end was released beyond the limit (active %d)", got.ActiveAssignments)
	}
	f.checkLedger(ids...)
	f.wantStranded(2, registry.StrandedRelease{Replicas: 1, Reservations: 2})
	f.wantStranded(2, registry.StrandedRelease{})
	if l := f.checkLedger(ids...); len(l.Counters) != 0 || len(l.Reservations) != 0 {
		t.Fatalf("ledger after the releases: %+v", l)
	}
	for _, a := range held {
		if res := f.reservation(a.ActionID); res.Reserved || res.LastSettlement != registry.SettlementLeaseExpired {
			t.Fatalf("reservation %+v", res)
		}
	}
}

// testStrandedLifecycle: replicas that went offline by the lifecycle (a
// clean offline after a drain, an unhealthy heartbeat) keep their
// reservations, which lease expiry never takes; after the grace they are
// released, the replica registers again, and a late settlement changes
// nothing.
func testStrandedLifecycle(t *testing.T, nb NewBackend) {
	f := newLfx(t, nb)
	clean, sick := f.provision("clean"), f.provision("sick")
	f.ok(f.registerCmd(clean))
	f.ok(f.registerCmd(sick))
	a := f.resolve(request("tenant-1", "alpha.read"))
	b := f.resolve(request("tenant-1", "alpha.read"))
	if f.getReplica(clean.ID).ActiveAssignments != 1 || f.getReplica(sick.ID).ActiveAssignments != 1 {
		t.Fatal("the two routes did not spread over the two replicas")
	}
	f.ok(f.transitionCmd(aip.OpDrain, clean.ID, 1))
	f.ok(f.transitionCmd(aip.OpOffline, clean.ID, 2))
	f.ok(f.cmd(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: sick.ID, PreviousSequence: 1, InFlight: 1, ConnectorReady: false})))
	for _, id := range []string{clean.ID, sick.ID} {
		if r := f.getReplica(id); r.Status != aip.ReplicaOffline || r.ActiveAssignments != 1 {
			t.Fatalf("replica %s after going offline: %s with %d active assignments", id, r.Status, r.ActiveAssignments)
		}
	}
	f.clock.Advance(strandedGrace - time.Millisecond)
	if n, err := f.b.Fleet.ExpireStaleReplicas(f.ctx, 10); err != nil || n != 0 {
		t.Fatalf("lease expiry took %d offline replicas (%v)", n, err)
	}
	f.wantStranded(10, registry.StrandedRelease{})
	f.clock.Advance(time.Millisecond)
	f.wantStranded(10, registry.StrandedRelease{Replicas: 2, Reservations: 2})
	if l := f.checkLedger(clean.ID, sick.ID); len(l.Counters) != 0 || len(l.Reservations) != 0 {
		t.Fatalf("ledger after the release: %+v", l)
	}
	// The clean replica registers again and takes a new route; the late
	// settlements of the released ones change nothing.
	f.ok(f.registerCmd(clean))
	c := f.resolve(request("tenant-1", "alpha.read"))
	f.settle(a, registry.SettlementOutcomeUnknown)
	f.settle(b, registry.SettlementCompleted)
	if r := f.getReplica(clean.ID); r.ActiveAssignments != 1 || r.Circuit != (registry.CircuitState{}) {
		t.Fatalf("the re-registered replica after late settlements: active %d, circuit %+v", r.ActiveAssignments, r.Circuit)
	}
	f.checkLedger(clean.ID, sick.ID)
	f.settle(c, registry.SettlementCompleted)
	if l := f.checkLedger(clean.ID, sick.ID); len(l.Counters) != 0 {
		t.Fatalf("counters left: %+v", l.Counters)
	}
}
