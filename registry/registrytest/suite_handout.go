package registrytest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// runHandOuts holds backends to the numbering of hand-outs
// (RouteAssignment.HandOut) and to what a settlement of each releases.
func runHandOuts(t *testing.T, nb NewBackend) {
	t.Run("Numbers", func(t *testing.T) { testHandOutNumbers(t, nb) })
	t.Run("LateSettlementAfterLeaseExpiry", func(t *testing.T) { testLateSettlementAfterExpiry(t, nb) })
	t.Run("SettleRetryAfterReservedAgain", func(t *testing.T) { testSettleRetryAfterReservedAgain(t, nb) })
	t.Run("SharedReservation", func(t *testing.T) { testSharedHandOut(t, nb) })
	t.Run("ZeroHandOut", func(t *testing.T) { testZeroHandOut(t, nb) })
}

// wantHandOut fails unless a, the stored assignment and the reservation
// all report hand-out n.
func (f *fx) wantHandOut(a registry.RouteAssignment, n uint64, what string) {
	f.t.Helper()
	stored, err := f.b.Resolver.Assignment(f.ctx, a.ActionID)
	f.must(err)
	if res := f.reservation(a.ActionID); a.HandOut != n || stored.HandOut != n || res.HandOut != n {
		f.t.Fatalf("%s: hand-out %d returned, %d stored, %d in the reservation; want %d", what, a.HandOut, stored.HandOut, res.HandOut, n)
	}
}

func testHandOutNumbers(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	_, r1, r2 := twoReplicas(f, nil)
	req := request("tenant-1", "alpha.read")
	a := f.resolve(req)
	f.wantHandOut(a, 1, "a new route")

	// Returned while held: the next hand-out, the same route (and the same
	// route on the wire).
	again := f.resolve(req)
	f.wantHandOut(again, 2, "a route returned while held")
	if !again.Equal(&a) || !cmp.Equal(again.Route(nil), a.Route(nil)) {
		t.Fatal("handing the route out again changed the assignment or its connector_route")
	}
	// A refused resolve hands nothing out.
	_, err := f.b.Resolver.Resolve(f.ctx, registry.RouteRequest{ActionID: a.ActionID, TenantID: "tenant-2", CapabilityID: "alpha.read"})
	f.wantErr(err, registry.ErrConflict, "resolve with another tenant")
	f.wantHandOut(again, 2, "after a refused resolve")

	// Released, the number stays; reserved again: the next one.
	f.settle(again, registry.SettlementCompleted)
	f.wantHandOut(again, 2, "a settled route")
	third := f.resolve(req)
	f.wantHandOut(third, 3, "a route reserved again")

	// A reroute's assignment goes on with the action's numbers.
	b := f.resolve(request("tenant-1", "alpha.read"))
	moved, err := f.reroute(b, registry.RefusalNotReady)
	f.must(err)
	f.wantHandOut(moved, 2, "a rerouted route")
	f.settle(third, registry.SettlementCompleted)
	f.settle(moved, registry.SettlementCompleted)
	if l := f.checkLedger(r1.ID, r2.ID); len(l.Reservations) != 0 {
		t.Fatalf("every route settled, yet the ledger holds %+v", l.Reservations)
	}
}

// expireAndRecover lets replica id's lease lapse, runs lease expiry (which
// releases its reservations as lease_expired) and brings it back ready.
func (f *fx) expireAndRecover(id string) {
	f.t.Helper()
	f.clock.Set(f.getReplica(id).LeaseExpiresAt)
	n, err := f.b.Fleet.ExpireStaleReplicas(f.ctx, 10)
	f.must(err)
	if n == 0 {
		f.t.Fatalf("replica %s was not expired", id)
	}
	f.update(id, func(r *registry.ConnectorReplica) {
		r.Status, r.LeaseExpiresAt = aip.ReplicaReady, f.clock.Now().Add(time.Hour)
	})
}

// testLateSettlementAfterExpiry is the sequence of a dispatcher whose
// reservation lease maintenance released while it was still sending: D1
// is handed the route (hand-out 1), its replica's lease expires and the
// reservation is released, the replica recovers, a retry reserves the
// pinned route again (hand-out 2) for D2, and then D1's hop ends and D1
// settles. D1's settlement must leave hand-out 2's reservation, counters,
// replica count and circuit as they were; D2's releases them.
func testLateSettlementAfterExpiry(t *testing.T, nb NewBackend) {
	for _, late := range []registry.RouteSettlement{registry.SettlementCompleted, registry.SettlementOutcomeUnknown, registry.SettlementCancelled} {
		t.Run(string(late), func(t *testing.T) {
			f := newFx(t, nb)
			pol := registry.FleetPolicy("quota:f")
			pol.CircuitFailureThreshold, pol.CircuitOpenMS = 1, 5000
			w := newRouteWorld(f, &pol)
			r := f.replica("a1", w.i, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now().Add(time.Minute) })
			req := request("tenant-1", "alpha.read")
			d1 := f.resolve(req)
			f.expireAndRecover(r.ID)
			if res := f.reservation(d1.ActionID); res.Reserved || res.LastSettlement != registry.SettlementLeaseExpired {
				t.Fatalf("after lease expiry: %+v", res)
			}
			d2 := f.resolve(req)
			f.wantHandOut(d2, 2, "the retry after lease expiry")
			before := f.checkLedger(r.ID)
			rep := f.getReplica(r.ID)

			f.settle(d1, late) // D1's hop ends
			if got := f.reservation(d1.ActionID); !got.Reserved || !got.Retry || got.LastSettlement != "" || got.HandOut != 2 {
				t.Fatalf("a late %s settlement of hand-out 1 released hand-out 2's reservation: %+v", late, got)
			}
			if diff := cmp.Diff(before, f.checkLedger(r.ID)); diff != "" {
				t.Fatalf("a late %s settlement of hand-out 1 changed the ledger (-before +after):\n%s", late, diff)
			}
			if got := f.getReplica(r.ID); !registry.ReplicaEqual(&got, &rep) {
				t.Fatalf("a late %s settlement of hand-out 1 changed the replica: %+v, was %+v", late, got, rep)
			}

			f.settle(d2, registry.SettlementOutcomeUnknown) // D2's hop ends
			if got := f.reservation(d2.ActionID); got.Reserved || got.LastSettlement != registry.SettlementOutcomeUnknown {
				t.Fatalf("D2's settlement of its own hand-out: %+v", got)
			}
			if got := f.getReplica(r.ID); got.Circuit.ConsecutiveFailures != 1 {
				t.Fatalf("D2's outcome_unknown counted %d failures, want 1", got.Circuit.ConsecutiveFailures)
			}
			if l := f.checkLedger(r.ID); len(l.Reservations) != 0 || len(l.Counters) != 0 {
				t.Fatalf("both hand-outs settled, yet the ledger holds %+v", l)
			}
		})
	}
}

// testSettleRetryAfterReservedAgain: D1's settlement of hand-out 1
// committed but D1 did not learn it (a timeout) and retries it in the
// background; meanwhile the client retried the action and hand-out 2
// reserved the route again. The retried settlement of hand-out 1 must
// neither release hand-out 2 nor count its outcome a second time.
func testSettleRetryAfterReservedAgain(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.FleetPolicy("quota:f")
	pol.CircuitFailureThreshold, pol.CircuitOpenMS = 3, 5000
	w := newRouteWorld(f, &pol)
	r := f.replica("a1", w.i, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now().Add(time.Hour) })
	req := request("tenant-1", "alpha.read")
	d1 := f.resolve(req)
	f.settle(d1, registry.SettlementOutcomeUnknown) // committed; D1 saw a timeout
	d2 := f.resolve(req)
	before := f.checkLedger(r.ID)
	f.settle(d1, registry.SettlementOutcomeUnknown) // D1's retry
	if got := f.reservation(d2.ActionID); !got.Reserved || got.HandOut != 2 {
		t.Fatalf("the retried settlement of hand-out 1 released hand-out 2: %+v", got)
	}
	if diff := cmp.Diff(before, f.checkLedger(r.ID)); diff != "" {
		t.Fatalf("the retried settlement of hand-out 1 changed the ledger (-before +after):\n%s", diff)
	}
	if got := f.getReplica(r.ID).Circuit.ConsecutiveFailures; got != 1 {
		t.Fatalf("hand-out 1's outcome_unknown counted %d times, want once", got)
	}
	f.settle(d2, registry.SettlementCompleted)
	if l := f.checkLedger(r.ID); len(l.Reservations) != 0 || len(l.Counters) != 0 {
		t.Fatalf("both hand-outs settled, yet the ledger holds %+v", l)
	}
}

// testSharedHandOut: two callers handed the same reservation (the second
// Resolve returned it while held). Whichever settles first releases it;
// the other's settlement changes nothing — also after a third hand-out
// reserved the route again.
func testSharedHandOut(t *testing.T, nb NewBackend) {
	for _, first := range []int{0, 1} {
		t.Run([]string{"MakerFirst", "SharerFirst"}[first], func(t *testing.T) {
			f := newFx(t, nb)
			w := newRouteWorld(f, nil)
			r := f.replica("a1", w.i, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now().Add(time.Hour) })
			req := request("tenant-1", "alpha.read")
			holders := []registry.RouteAssignment{f.resolve(req), f.resolve(req)}
			f.settle(holders[first], registry.SettlementCancelled)
			if got := f.reservation(req.ActionID); got.Reserved || got.LastSettlement != registry.SettlementCancelled {
				t.Fatalf("the first settlement of a shared reservation (hand-out %d): %+v", holders[first].HandOut, got)
			}
			third := f.resolve(req)
			f.wantHandOut(third, 3, "reserved again after a shared reservation")
			f.settle(holders[1-first], registry.SettlementCompleted)
			if got := f.reservation(req.ActionID); !got.Reserved {
				t.Fatalf("the second settlement of a shared reservation (hand-out %d) released hand-out 3's: %+v", holders[1-first].HandOut, got)
			}
			f.settle(third, registry.SettlementCompleted)
			if l := f.checkLedger(r.ID); len(l.Reservations) != 0 || len(l.Counters) != 0 {
				t.Fatalf("every hand-out settled, yet the ledger holds %+v", l)
			}
		})
	}
}

// testZeroHandOut: an assignment that does not know its hand-out (decoded
// from JSON written before hand-outs were numbered) settles whatever the
// route holds, as every settlement did before.
func testZeroHandOut(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newRouteWorld(f, nil)
	r := f.replica("a1", w.i, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now().Add(time.Minute) })
	req := request("tenant-1", "alpha.read")
	old := f.resolve(req)
	old.HandOut = 0
	f.expireAndRecover(r.ID)
	f.resolve(req) // hand-out 2
	f.settle(old, registry.SettlementCompleted)
	if got := f.reservation(req.ActionID); got.Reserved || got.LastSettlement != registry.SettlementCompleted {
		t.Fatalf("a settlement without a hand-out did not release the route's reservation: %+v", got)
	}
	if l := f.checkLedger(r.ID); len(l.Reservations) != 0 || len(l.Counters) != 0 {
		t.Fatalf("the ledger holds %+v", l)
	}
}
