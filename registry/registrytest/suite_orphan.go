package registrytest

import (
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// runOrphans holds backends to registry.OrphanSettler and to
// RouteReservation.HandedOutAt and HandOut, which it relies on.
func runOrphans(t *testing.T, nb NewBackend) {
	t.Run("HandedOutAt", func(t *testing.T) { testHandedOutAt(t, nb) })
	t.Run("SettlesOnlyWhatWasNotHandedOutAgain", func(t *testing.T) { testSettleOrphan(t, nb) })
	t.Run("RacesWithResolve", func(t *testing.T) { testSettleOrphanRace(t, nb) })
}

// handedOut returns the action's HandedOutAt, checking that the ledger
// reports the same as Reservation.
func (f *fx) handedOut(actionID string) time.Time {
	f.t.Helper()
	one := f.reservation(actionID)
	l, err := f.b.Fleet.Ledger(f.ctx)
	f.must(err)
	for _, r := range l.Reservations {
		if r.ActionID == actionID && !r.HandedOutAt.Equal(one.HandedOutAt) {
			f.t.Fatalf("reservation of %s: handed out at %s in the ledger and %s alone", actionID, r.HandedOutAt, one.HandedOutAt)
		}
	}
	return one.HandedOutAt
}

func testHandedOutAt(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	_, r1, r2 := twoReplicas(f, nil)
	req := request("tenant-1", "alpha.read")
	a := f.resolve(req)
	if got := f.handedOut(a.ActionID); !got.Equal(a.AssignedAt) || !got.Equal(Epoch) {
		t.Fatalf("a new route was handed out at %s, want its assignment time %s", got, a.AssignedAt)
	}
	// Returned again while reserved: handed out again, same assignment.
	f.clock.Advance(time.Second)
	again := f.resolve(req)
	if !again.Equal(&a) {
		t.Fatal("a second resolve changed the assignment")
	}
	if got := f.handedOut(a.ActionID); !got.Equal(Epoch.Add(time.Second)) {
		t.Fatalf("a route returned again at %s reports handed out at %s", Epoch.Add(time.Second), got)
	}
	// Released: no handout to report.
	f.settle(a, registry.SettlementCompleted)
	if got := f.reservation(a.ActionID); !got.HandedOutAt.IsZero() {
		t.Fatalf("a settled route reports handed out at %s", got.HandedOutAt)
	}
	// Reserved again by a retry: handed out then; the assignment time stays.
	f.clock.Advance(time.Second)
	f.resolve(req)
	res := f.reservation(a.ActionID)
	if !res.HandedOutAt.Equal(Epoch.Add(2*time.Second)) || !res.AssignedAt.Equal(a.AssignedAt) {
		t.Fatalf("a retry at %s reserved the route again, yet it reports handed out at %s, assigned at %s (want %s)",
			Epoch.Add(2*time.Second), res.HandedOutAt, res.AssignedAt, a.AssignedAt)
	}
	// A reroute hands the new assignment out.
	b := f.resolve(request("tenant-1", "alpha.read"))
	f.clock.Advance(time.Second)
	moved, err := f.reroute(b, registry.RefusalNotReady)
	f.must(err)
	if got := f.handedOut(b.ActionID); !got.Equal(moved.AssignedAt) || !got.Equal(Epoch.Add(3*time.Second)) {
		t.Fatalf("a rerouted route reports handed out at %s, want %s", got, moved.AssignedAt)
	}
	// A resolve that fails hands nothing out.
	f.clock.Advance(time.Second)
	_, err = f.b.Resolver.Resolve(f.ctx, registry.RouteRequest{ActionID: b.ActionID, TenantID: "tenant-2", CapabilityID: "alpha.read"})
	f.wantErr(err, registry.ErrConflict, "resolve with another tenant")
	if got := f.handedOut(b.ActionID); !got.Equal(moved.AssignedAt) {
		t.Fatalf("a refused resolve moved the handout time to %s", got)
	}
	f.checkLedger(r1.ID, r2.ID)
}

func testSettleOrphan(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.FleetPolicy("quota:f")
	pol.CircuitFailureThreshold, pol.CircuitOpenMS = 1, 5000
	w := newRouteWorld(f, &pol)
	r := f.replica("a1", w.i, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now().Add(time.Minute) })
	req := request("tenant-1", "alpha.read")
	a := f.resolve(req)
	seen := f.reservation(a.ActionID).HandOut
	orphans := f.b.Orphans

	// Handed out again after the caller looked, in the same millisecond:
	// in use, not orphaned. Hand-outs are compared, not their times.
	f.resolve(req)
	before := f.reservation(a.ActionID)
	if !before.HandedOutAt.Equal(f.clock.Now()) || before.HandOut != seen+1 {
		t.Fatalf("handed out again at %s: %+v", f.clock.Now(), before)
	}
	f.wantErr(orphans.SettleOrphan(f.ctx, a, registry.SettlementCancelled, seen), registry.ErrConflict, "settling a route handed out again in the same millisecond")
	if got := f.reservation(a.ActionID); !got.Reserved || !got.HandedOutAt.Equal(before.HandedOutAt) || got.HandOut != before.HandOut {
		t.Fatalf("a refused orphan settlement changed the reservation to %+v", got)
	}
	if l := f.checkLedger(r.ID); len(l.Reservations) != 1 || len(l.Counters) == 0 {
		t.Fatalf("a refused orphan settlement released capacity: %+v", l)
	}

	// The contract's other answers, as Settle gives them, and hand-out 0.
	forged := a.Clone()
	forged.FenceToken = aip.NewID(aip.PrefixRoute)
	f.wantErr(orphans.SettleOrphan(f.ctx, forged, registry.SettlementCompleted, before.HandOut), registry.ErrFenceLost, "settling a forged assignment")
	unknown := a.Clone()
	unknown.ActionID = aip.NewActionID()
	f.wantErr(orphans.SettleOrphan(f.ctx, unknown, registry.SettlementCompleted, before.HandOut), registry.ErrNotFound, "settling an unknown action")
	f.wantErr(orphans.SettleOrphan(f.ctx, a, "done", before.HandOut), registry.ErrInvalid, "an unknown outcome")
	f.wantErr(orphans.SettleOrphan(f.ctx, a, registry.SettlementCompleted, 0), registry.ErrInvalid, "hand-out 0")
	f.wantErr(orphans.SettleOrphan(f.ctx, a, registry.SettlementCompleted, before.HandOut+1), registry.ErrConflict, "a hand-out not made yet")
	if got := f.reservation(a.ActionID); !got.Reserved {
		t.Fatal("a rejected orphan settlement released the reservation")
	}

	// Not handed out since: released like Settle, circuit rule included.
	// a is hand-out 1: SettleOrphan goes by the hand-out the caller read.
	f.must(orphans.SettleOrphan(f.ctx, a, registry.SettlementOutcomeUnknown, before.HandOut))
	res := f.reservation(a.ActionID)
	if res.Reserved || res.LastSettlement != registry.SettlementOutcomeUnknown {
		t.Fatalf("after the orphan settlement: %+v", res)
	}
	if l := f.checkLedger(r.ID); len(l.Reservations) != 0 || len(l.Counters) != 0 {
		t.Fatalf("the orphan settlement left %+v", l)
	}
	if rep := f.getReplica(r.ID); rep.Circuit.ConsecutiveFailures != 1 || !rep.Circuit.OpenUntil.After(f.clock.Now()) {
		t.Fatalf("outcome_unknown settled as an orphan did not count toward the circuit: %+v", rep.Circuit)
	}
	// Released already: succeeds and changes nothing.
	f.must(orphans.SettleOrphan(f.ctx, a, registry.SettlementCompleted, before.HandOut))
	if got := f.reservation(a.ActionID); got.LastSettlement != registry.SettlementOutcomeUnknown {
		t.Fatalf("a repeated orphan settlement replaced the recorded outcome: %+v", got)
	}

	// Released by lease expiry and reserved again (in the same
	// millisecond) after the caller looked: the new hand-out is in use.
	f.clock.Advance(6 * time.Second) // the circuit closes
	b := f.resolve(req)
	seen = f.reservation(a.ActionID).HandOut
	f.expireAndRecover(r.ID)
	f.resolve(req)
	f.wantErr(orphans.SettleOrphan(f.ctx, b, registry.SettlementCancelled, seen), registry.ErrConflict, "settling a route reserved again")
	if got := f.reservation(a.ActionID); !got.Reserved || got.HandOut != seen+1 {
		t.Fatalf("an orphan settlement of an earlier hand-out changed the reservation to %+v", got)
	}
	f.checkLedger(r.ID)
}

// testSettleOrphanRace: an orphan settlement and a Resolve of the same
// action at once. Either the settlement comes first (released, then the
// Resolve reserves the route again) or the Resolve does (the settlement is
// refused and the route stays reserved); never a route in use without its
// reservation.
func testSettleOrphanRace(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newRouteWorld(f, nil)
	r := f.replica("a1", w.i, func(r *registry.ConnectorReplica) {
		r.Capacity = 100
		r.LeaseExpiresAt = f.clock.Now().Add(time.Hour)
	})
	settledFirst, resolvedFirst := 0, 0
	for range 20 {
		req := request("tenant-1", "alpha.read")
		a := f.resolve(req)
		seen := f.reservation(a.ActionID).HandOut
		var (
			wg         sync.WaitGroup
			settleErr  error
			resolveErr error
			resolved   registry.RouteAssignment
		)
		wg.Go(func() { settleErr = f.b.Orphans.SettleOrphan(f.ctx, a, registry.SettlementCancelled, seen) })
		wg.Go(func() { resolved, resolveErr = f.b.Resolver.Resolve(f.ctx, req) })
		wg.Wait()
		f.must(resolveErr)
		res := f.reservation(a.ActionID)
		if !res.Reserved {
			t.Fatalf("a route resolved during an orphan settlement is not reserved: %+v (settlement: %v)", res, settleErr)
		}
		switch {
		case settleErr == nil:
			settledFirst++
			if !res.Retry || res.LastSettlement != "" {
				t.Fatalf("settled first, so the resolve must have reserved the route again as a retry: %+v", res)
			}
		default:
			resolvedFirst++
			f.wantErr(settleErr, registry.ErrConflict, "an orphan settlement after a resolve")
			if res.Retry {
				t.Fatalf("the orphan settlement was refused, yet the route was reserved again: %+v", res)
			}
		}
		f.settle(resolved, registry.SettlementCompleted) // the last hand-out settles either way
	}
	t.Logf("settled first %d times, resolved first %d times", settledFirst, resolvedFirst)
	if l := f.checkLedger(r.ID); len(l.Reservations) != 0 || len(l.Counters) != 0 {
		t.Fatalf("the races left %+v", l)
	}
}
