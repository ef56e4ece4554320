package registrytest

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// runUnsent holds backends to registry.UnsentReleaser: the release of a
// hand-out whose Resolve or Reroute committed while its caller got an
// error, so that the caller never sent the action.
func runUnsent(t *testing.T, nb NewBackend) {
	t.Run("ReleaseAfterLostCommit", func(t *testing.T) { testUnsentReleased(t, nb) })
	t.Run("ReleaseAfterLostRetryCommit", func(t *testing.T) { testUnsentRetryReleased(t, nb) })
	t.Run("LaterHandOutKeepsIt", func(t *testing.T) { testUnsentLaterHandOut(t, nb) })
	t.Run("SharedHandOutKeepsIt", func(t *testing.T) { testUnsentShared(t, nb) })
	t.Run("UnknownClaim", func(t *testing.T) { testUnsentUnknown(t, nb) })
	t.Run("Reroute", func(t *testing.T) { testUnsentReroute(t, nb) })
	t.Run("InvalidInput", func(t *testing.T) { testUnsentInvalid(t, nb) })
}

// unsent returns the backend's UnsentReleaser (its Resolver must be one).
func (f *fx) unsent() registry.UnsentReleaser {
	f.t.Helper()
	u, ok := f.b.Resolver.(registry.UnsentReleaser)
	if !ok {
		f.t.Fatalf("the backend's Resolver %T does not implement registry.UnsentReleaser", f.b.Resolver)
	}
	return u
}

// releaseUnsent calls ReleaseUnsent and fails unless it reports want.
func (f *fx) releaseUnsent(actionID, claim string, want bool, what string) {
	f.t.Helper()
	got, err := f.unsent().ReleaseUnsent(f.ctx, actionID, claim)
	f.must(err)
	if got != want {
		f.t.Fatalf("%s: ReleaseUnsent reported released %t, want %t", what, got, want)
	}
}

// claimed returns req with claim c.
func claimed(req registry.RouteRequest, c string) registry.RouteRequest {
	req.Claim = c
	return req
}

// unsentWorld is one replica whose policy opens the circuit at the second
// unknown outcome, with one unknown outcome counted already, so a release
// that touched the circuit would show.
func unsentWorld(f *fx) registry.ConnectorReplica {
	f.t.Helper()
	pol := registry.FleetPolicy("quota:u")
	pol.CircuitFailureThreshold, pol.CircuitOpenMS = 2, 60_000
	w := newRouteWorld(f, &pol)
	r := f.replica("u1", w.i, func(r *registry.ConnectorReplica) { r.Capacity = 10 })
	f.settle(f.resolve(request("tenant-1", "alpha.read")), registry.SettlementOutcomeUnknown)
	if c := f.getReplica(r.ID).Circuit; c.ConsecutiveFailures != 1 {
		f.t.Fatalf("after one unknown outcome the circuit is %+v, want one failure", c)
	}
	return r
}

// wantIdle fails unless no reservation and no counter is left and replica
// id counts no assignment.
func (f *fx) wantIdle(id, what string) {
	f.t.Helper()
	l := f.checkLedger(id)
	if len(l.Reservations) != 0 || len(l.Counters) != 0 {
		f.t.Fatalf("%s: the ledger still holds %+v", what, l)
	}
}

// testUnsentReleased: a new route whose Resolve's answer was lost is
// released by its claim — the reservation, the replica's count and every
// counter — as a cancelled settlement that leaves the circuit alone, once.
func testUnsentReleased(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	r := unsentWorld(f)
	circuit := f.getReplica(r.ID).Circuit
	a := f.resolve(claimed(request("tenant-1", "alpha.read"), "claim-lost-1"))
	f.releaseUnsent(a.ActionID, "claim-lost-1", true, "the claim of a lost commit")
	res := f.reservation(a.ActionID)
	if res.Reserved || res.LastSettlement != registry.SettlementCancelled || res.HandOut != 1 {
		t.Fatalf("after the release the reservation is %+v, want released as cancelled, hand-out 1", res)
	}
	f.wantIdle(r.ID, "after the release")
	if got := f.getReplica(r.ID).Circuit; !cmp.Equal(got, circuit) {
		t.Fatalf("the release changed the circuit: %+v, was %+v", got, circuit)
	}
	// Again: nothing left to release.
	f.releaseUnsent(a.ActionID, "claim-lost-1", false, "the same claim again")
	// The route stays pinned: a retry of the action reserves it again.
	b := f.resolve(claimed(registry.RouteRequest{ActionID: a.ActionID, TenantID: "tenant-1", CapabilityID: "alpha.read"}, "claim-retry"))
	if !b.Equal(&a) || b.HandOut != 2 {
		t.Fatalf("the retry after the release got hand-out %d (same route %t), want 2 of the same route", b.HandOut, b.Equal(&a))
	}
	f.settle(b, registry.SettlementCompleted)
	f.wantIdle(r.ID, "after the retry settled")
}

// testUnsentRetryReleased: a retry that reserved a released route again
// (with the retry scope), whose answer was lost, is released by its claim.
func testUnsentRetryReleased(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	r := unsentWorld(f)
	circuit := f.getReplica(r.ID).Circuit
	req := request("tenant-1", "alpha.read")
	a := f.resolve(claimed(req, "claim-first"))
	f.settle(a, registry.SettlementCompleted)
	circuit.ConsecutiveFailures = 0 // completed closes it
	b := f.resolve(claimed(req, "claim-second"))
	if res := f.reservation(b.ActionID); !res.Reserved || !res.Retry || b.HandOut != 2 {
		t.Fatalf("the retry reserved %+v with hand-out %d, want a retried reservation by hand-out 2", res, b.HandOut)
	}
	f.releaseUnsent(b.ActionID, "claim-first", false, "the first hand-out's claim, settled already")
	if res := f.reservation(b.ActionID); !res.Reserved {
		t.Fatalf("the first hand-out's claim released the retry's reservation: %+v", res)
	}
	f.releaseUnsent(b.ActionID, "claim-second", true, "the retry's claim")
	if res := f.reservation(b.ActionID); res.Reserved || res.LastSettlement != registry.SettlementCancelled {
		t.Fatalf("after the release the reservation is %+v", res)
	}
	f.wantIdle(r.ID, "after the release of the retry")
	if got := f.getReplica(r.ID).Circuit; !cmp.Equal(got, circuit) {
		t.Fatalf("the release changed the circuit: %+v, want %+v", got, circuit)
	}
}

// testUnsentLaterHandOut: once the route was handed out after the claimed
// hand-out — a client's retry of the action ID through another
// dispatcher, which may be sending it now — the claim releases nothing,
// whether the retry shared the reservation or made it again, and whether
// or not it named a claim.
func testUnsentLaterHandOut(t *testing.T, nb NewBackend) {
	for _, c := range []struct {
		name        string
		settleFirst bool   // the claimed reservation was settled (by lease expiry, say) before the retry
		retryClaim  string // "" names none
	}{
		{"SharedWithClaim", false, "claim-other"},
		{"SharedWithoutClaim", false, ""},
		{"ReservedAgainWithClaim", true, "claim-other"},
		{"ReservedAgainWithoutClaim", true, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFx(t, nb)
			r := unsentWorld(f)
			req := request("tenant-1", "alpha.read")
			a := f.resolve(claimed(req, "claim-lost"))
			if c.settleFirst {
				f.settle(a, registry.SettlementCancelled)
			}
			b := f.resolve(claimed(req, c.retryClaim))
			before := f.checkLedger(r.ID)
			rep := f.getReplica(r.ID)
			res := f.reservation(a.ActionID)
			f.releaseUnsent(a.ActionID, "claim-lost", false, "the claim of an earlier hand-out")
			if got := f.reservation(a.ActionID); !cmp.Equal(got, res) {
				t.Fatalf("the claim of an earlier hand-out changed the reservation: %+v, was %+v", got, res)
			}
			if diff := cmp.Diff(before, f.checkLedger(r.ID)); diff != "" {
				t.Fatalf("the claim of an earlier hand-out changed the ledger (-before +after):\n%s", diff)
			}
			if got := f.getReplica(r.ID); !registry.ReplicaEqual(&got, &rep) {
				t.Fatalf("the claim of an earlier hand-out changed the replica: %+v, was %+v", got, rep)
			}
			f.settle(b, registry.SettlementCompleted)
			f.wantIdle(r.ID, "after the retry settled")
		})
	}
}

// testUnsentShared: a claimed Resolve that returned a reservation another
// hand-out made (and whose holder may be sending the action) releases
// nothing: the reservation is its maker's to settle.
func testUnsentShared(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	r := unsentWorld(f)
	req := request("tenant-1", "alpha.read")
	a := f.resolve(claimed(req, "claim-sender"))
	b := f.resolve(claimed(req, "claim-lost"))
	if b.HandOut != 2 {
		t.Fatalf("the second Resolve is hand-out %d, want 2", b.HandOut)
	}
	before := f.checkLedger(r.ID)
	f.releaseUnsent(a.ActionID, "claim-lost", false, "the claim of a hand-out sharing the reservation")
	if res := f.reservation(a.ActionID); !res.Reserved {
		t.Fatalf("the shared hand-out's claim released the sender's reservation: %+v", res)
	}
	if diff := cmp.Diff(before, f.checkLedger(r.ID)); diff != "" {
		t.Fatalf("the shared hand-out's claim changed the ledger (-before +after):\n%s", diff)
	}
	f.settle(a, registry.SettlementCompleted)
	f.wantIdle(r.ID, "after the sender settled")
}

// testUnsentUnknown: an unknown action, a claim no hand-out named and a
// route whose hand-out named none change nothing and succeed.
func testUnsentUnknown(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	r := unsentWorld(f)
	f.releaseUnsent(aip.NewActionID(), "claim-nowhere", false, "an unknown action")
	a := f.resolve(claimed(request("tenant-1", "alpha.read"), "claim-real"))
	plain := f.resolve(request("tenant-1", "alpha.read"))
	before := f.checkLedger(r.ID)
	rep := f.getReplica(r.ID)
	f.releaseUnsent(a.ActionID, "claim-other", false, "a claim that never committed")
	f.releaseUnsent(a.ActionID, "claim-real-", false, "a claim one byte longer")
	f.releaseUnsent(a.ActionID, "CLAIM-REAL", false, "a claim in other case")
	f.releaseUnsent(plain.ActionID, "claim-real", false, "a hand-out that named no claim")
	if diff := cmp.Diff(before, f.checkLedger(r.ID)); diff != "" {
		t.Fatalf("claims that match nothing changed the ledger (-before +after):\n%s", diff)
	}
	if got := f.getReplica(r.ID); !registry.ReplicaEqual(&got, &rep) {
		t.Fatalf("claims that match nothing changed the replica: %+v, was %+v", got, rep)
	}
	f.settle(a, registry.SettlementCompleted)
	f.settle(plain, registry.SettlementCompleted)
	f.wantIdle(r.ID, "after both settled")
}

// testUnsentReroute: a reroute whose answer was lost is released by its
// claim (the new assignment's reservation; the old one the reroute
// released), and the claim of the hand-out it moved off releases nothing.
func testUnsentReroute(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	_, r1, r2 := twoReplicas(f, nil)
	a := f.resolve(claimed(request("tenant-1", "alpha.read"), "claim-resolve"))
	moved, err := f.rerouter().Reroute(f.ctx, registry.RerouteRequest{Current: a, Evidence: RefusalEvidence(a, registry.RefusalNotReady), Claim: "claim-reroute"})
	f.must(err)
	f.releaseUnsent(a.ActionID, "claim-resolve", false, "the claim of the hand-out rerouted off")
	if res := f.reservation(a.ActionID); !res.Reserved || res.ReplicaID != moved.ReplicaID {
		t.Fatalf("the rerouted hand-out's claim changed the new reservation: %+v", res)
	}
	f.releaseUnsent(a.ActionID, "claim-reroute", true, "the reroute's claim")
	if res := f.reservation(a.ActionID); res.Reserved || res.LastSettlement != registry.SettlementCancelled {
		t.Fatalf("after the release the reservation is %+v", res)
	}
	if l := f.checkLedger(r1.ID, r2.ID); len(l.Reservations) != 0 || len(l.Counters) != 0 {
		t.Fatalf("after the release the ledger holds %+v", l)
	}
	// The moved route stays current and pinned.
	cur, err := f.b.Resolver.Assignment(f.ctx, a.ActionID)
	f.must(err)
	if !cur.Equal(&moved) {
		t.Fatalf("after the release the current assignment is %+v, want the rerouted %+v", cur, moved)
	}
}

// testUnsentInvalid: a malformed claim or action ID is ErrInvalid, in
// Resolve (which then makes no route) and in ReleaseUnsent.
func testUnsentInvalid(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	r := unsentWorld(f)
	long := make([]byte, registry.MaxClaimBytes+1)
	for i := range long {
		long[i] = 'a'
	}
	for _, bad := range []string{"has space", "ü", string(long), "a/b", "claim\x00"} {
		req := claimed(request("tenant-1", "alpha.read"), bad)
		_, err := f.b.Resolver.Resolve(f.ctx, req)
		f.wantField(err, registry.ErrInvalid, "claim", "Resolve with claim "+bad)
		if _, err := f.b.Resolver.Assignment(f.ctx, req.ActionID); err == nil {
			t.Fatalf("Resolve with claim %q made a route", bad)
		}
		_, err = f.unsent().ReleaseUnsent(f.ctx, aip.NewActionID(), bad)
		f.wantField(err, registry.ErrInvalid, "claim", "ReleaseUnsent with claim "+bad)
	}
	_, err := f.unsent().ReleaseUnsent(f.ctx, aip.NewActionID(), "")
	f.wantField(err, registry.ErrInvalid, "claim", "ReleaseUnsent without a claim")
	_, err = f.unsent().ReleaseUnsent(f.ctx, "not-an-action", "claim-x")
	f.wantField(err, registry.ErrInvalid, "action_id", "ReleaseUnsent of a malformed action ID")
	if ok := registry.ValidClaim(string(long[:registry.MaxClaimBytes])); !ok {
		t.Fatalf("a claim of %d bytes is refused", registry.MaxClaimBytes)
	}
	f.wantIdle(r.ID, "after the refusals")
}
