package dispatch_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// TestReconcileSettlesOrphanedReservations: reservations no dispatcher
// will settle any more (its settlement failed for good, or the action was
// routed and never sent) are settled from the pinned replica's journal once
// they were last handed out longer than ReconcileAfter ago — a completed
// action completed, one the replica never received cancelled once no
// envelope of its last handout can still arrive — while an action still
// running, a never-received one whose envelope may still arrive, a young
// reservation, one handed out again while the pass looked at it and a
// replica that does not answer are left alone.
func TestReconcileSettlesOrphanedReservations(t *testing.T) {
	var (
		ahead atomic.Int64 // how far the dispatcher's clock is ahead
		lag   atomic.Int64 // how far the registry's clock is behind
		flaky *flakySettle
		// interfere, when set, runs before an orphan settlement.
		interfere atomic.Pointer[func(registry.RouteAssignment)]
	)
	w := newWorld(t, worldOptions{
		cfg: func(c *dispatch.Config) {
			c.ActionTimeout, c.MaxTimeout, c.HopSlack, c.RegistryTimeout = 10*time.Second, 10*time.Second, 100*time.Millisecond, time.Second
			c.ReconcileAfter = 12 * time.Second
			c.SettleRetryTimeout = -1 // the failed settlements stay failed
			c.Now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
		},
		resolver: func(r *memregistry.Registry) registry.Resolver {
			flaky = &flakySettle{Registry: r, fails: 1 << 30, err: errRegistryDown}
			return flaky
		},
		orphans: func(r *memregistry.Registry) dispatch.Orphans {
			return &interferingOrphans{Registry: r, before: func(a registry.RouteAssignment) {
				if f := interfere.Load(); f != nil {
					(*f)(a)
				}
			}}
		},
		regNow: func() time.Time { return time.Now().Add(-time.Duration(lag.Load())) },
	})
	w.startHost(8, 8)
	// handOutLongAgo routes a fresh action as if it had happened long
	// enough ago for any envelope sent then to be refused now.
	handOutLongAgo := func() string {
		t.Helper()
		lag.Store(int64(aip.MaxEnvelopeAge + aip.MaxEnvelopeSkew + time.Minute))
		defer lag.Store(0)
		id := aip.NewActionID()
		if _, err := w.reg.Resolve(w.ctx, registry.RouteRequest{ActionID: id, TenantID: tenant, CapabilityID: capSay}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	report := func() dispatch.ReconcileReport {
		t.Helper()
		rep, err := w.d.Reconcile(w.ctx)
		must(t, err)
		return rep
	}
	reserved := func(id string) registry.RouteReservation {
		t.Helper()
		res, err := w.reg.Reservation(w.ctx, id)
		must(t, err)
		return res
	}

	// An action that ran, whose settlement failed.
	done := aip.NewActionID()
	if status, resp := w.act(dispatch.ActionRequest{ActionID: done, CapabilityID: capSay, Input: say("done", "")}); status != http.StatusOK || resp.Settlement != "" {
		t.Fatalf("action answered %d: %+v", status, resp)
	}
	// One routed recently and not received yet: its envelope may still
	// arrive.
	unsentYoung := aip.NewActionID()
	if _, err := w.reg.Resolve(w.ctx, registry.RouteRequest{ActionID: unsentYoung, TenantID: tenant, CapabilityID: capSay}); err != nil {
		t.Fatal(err)
	}
	// An action still running.
	running := aip.NewActionID()
	finished := make(chan int)
	go func() {
		status, _ := w.act(dispatch.ActionRequest{ActionID: running, CapabilityID: capSay, Input: say("slow", `,"hold_ms":4000`)})
		finished <- status
	}()
	eventually(t, "the slow action to start", func() bool { return len(w.counter.runs(running)) == 1 })
	// Its status shows when its reservation was handed out.
	if st, e := w.d.Status(w.ctx, tenant, running); e != nil || !st.Reservation.Reserved || st.Reservation.HandedOutAt == nil ||
		!st.Reservation.HandedOutAt.Equal(reserved(running).HandedOutAt) || st.Reservation.HandedOutAt.IsZero() {
		t.Fatalf("status of a running action: %+v (error %v)", st.Reservation, e)
	}

	if rep := report(); rep != (dispatch.ReconcileReport{}) {
		t.Fatalf("young reservations were reconciled: %+v", rep)
	}
	// An action routed by a dispatcher that stopped before sending it, long
	// ago.
	unsent := handOutLongAgo()
	flaky.heal()
	ahead.Store(int64(13 * time.Second)) // within the hosts' clock skew window
	if rep := report(); rep != (dispatch.ReconcileReport{Stale: 4, Settled: 2, InProgress: 2}) {
		t.Fatalf("reconcile: %+v, want 4 stale, 2 settled, 2 in progress", rep)
	}
	if r := reserved(unsentYoung); !r.Reserved {
		t.Fatalf("a reservation whose envelope may still arrive was released: %+v", r)
	}
	if r := reserved(done); r.Reserved || r.LastSettlement != registry.SettlementCompleted {
		t.Fatalf("the action that ran: %+v, want settled completed", r)
	}
	if r := reserved(unsent); r.Reserved || r.LastSettlement != registry.SettlementCancelled {
		t.Fatalf("the action never sent: %+v, want settled cancelled", r)
	}
	if r := reserved(running); !r.Reserved {
		t.Fatalf("the running action's reservation was released: %+v", r)
	}
	if status := <-finished; status != http.StatusOK {
		t.Fatalf("the slow action answered %d", status)
	}
	if r := reserved(running); r.Reserved || r.LastSettlement != registry.SettlementCompleted {
		t.Fatalf("the slow action after its answer: %+v", r)
	}
	if n := len(w.counter.runs(done)) + len(w.counter.runs(unsent)) + len(w.counter.runs(running)); n != 2 {
		t.Fatalf("%d executions, want the two actions that were sent, once each", n)
	}
	a, err := w.reg.Assignment(w.ctx, unsentYoung)
	must(t, err)
	must(t, w.reg.Settle(w.ctx, a, registry.SettlementCancelled))

	// A client retries an orphaned action just as the pass settles it: the
	// pass learned "never received" before the retry's envelope could
	// arrive, so it must not release the reservation the retry now uses.
	retried := handOutLongAgo()
	fn := func(a registry.RouteAssignment) {
		if a.ActionID == retried {
			if _, err := w.reg.Resolve(w.ctx, registry.RouteRequest{ActionID: retried, TenantID: tenant, CapabilityID: capSay}); err != nil {
				t.Error(err)
			}
		}
	}
	interfere.Store(&fn)
	if rep := report(); rep != (dispatch.ReconcileReport{Stale: 1, InProgress: 1}) {
		t.Fatalf("reconcile of a reservation handed out again: %+v, want 1 stale, 1 in progress", rep)
	}
	interfere.Store(nil)
	if r := reserved(retried); !r.Reserved || r.LastSettlement != "" {
		t.Fatalf("a reservation handed out again during the pass was settled: %+v", r)
	}
	// Its retry's envelope may still arrive: the next pass leaves it too.
	if rep := report(); rep != (dispatch.ReconcileReport{Stale: 1, InProgress: 1}) {
		t.Fatalf("reconcile after the retry: %+v, want 1 stale, 1 in progress", rep)
	}
	a, err = w.reg.Assignment(w.ctx, retried)
	must(t, err)
	must(t, w.reg.Settle(w.ctx, a, registry.SettlementCancelled))

	// A replica that does not answer keeps its reservations.
	gone := handOutLongAgo()
	for _, h := range w.hosts {
		h.host.Stop(t.Context())
	}
	if rep := report(); rep != (dispatch.ReconcileReport{Stale: 1, Unanswered: 1}) {
		t.Fatalf("reconcile with the replica gone: %+v", rep)
	}
	if r := reserved(gone); !r.Reserved {
		t.Fatalf("a reservation on a replica that did not answer was released: %+v", r)
	}
}

// TestReconcileAfterOutlastsALongMaxTimeout: by default ReconcileAfter
// grows with MaxTimeout, so a long MaxTimeout needs no other setting.
func TestReconcileAfterOutlastsALongMaxTimeout(t *testing.T) {
	reg, _ := memregistry.New(memregistry.Config{})
	key, _ := aip.GenerateSigningKey()
	d, err := dispatch.New(dispatch.Config{SigningKey: key, PrincipalID: gatewayID, MaxTimeout: time.Hour},
		dispatch.Deps{Resolver: reg, Catalog: reg, Tokens: &countingVerifier{}, Reservations: reg})
	if err != nil {
		t.Fatalf("a long MaxTimeout with the default ReconcileAfter: %v", err)
	}
	d.Close()
}

// interferingOrphans calls before ahead of each orphan settlement.
type interferingOrphans struct {
	*memregistry.Registry
	before func(registry.RouteAssignment)
}

func (o *interferingOrphans) SettleOrphan(ctx context.Context, a registry.RouteAssignment, s registry.RouteSettlement, handOut uint64) error {
	o.before(a)
	return o.Registry.SettleOrphan(ctx, a, s, handOut)
}

// TestReconcileSettlesPrunedAsPruned: an orphaned reservation whose
// replica's journal pruned the action (aip.StatePruned: it may have
// completed there, and never runs there now) is released and settled
// pruned — not cancelled, which would tell a caller reading the action's
// status something nobody knows — and the replica's circuit is left as it
// is (a circuit that opens at the first outcome_unknown stays closed); a
// later retry of the action ID reserves the route again on its replica.
func TestReconcileSettlesPrunedAsPruned(t *testing.T) {
	w := newWorld(t, worldOptions{})
	pol := registry.ConservativePolicy("quota:pruned")
	pol.CircuitFailureThreshold, pol.CircuitOpenMS = 1, 60_000
	must(t, w.reg.PutAdmissionPolicy(w.ctx, pol))
	b, err := w.reg.CapabilityBinding(w.ctx, registry.BindingKey{TenantID: tenant, CapabilityID: capSay, InstanceID: w.instanceID})
	must(t, err)
	b.QuotaPolicyRef, b.PolicyRevision = pol.PolicyRef, b.PolicyRevision+1
	must(t, w.reg.PutBinding(w.ctx, b))
	replicaKey, _ := aip.GenerateSigningKey()
	fake := w.fakeReplica(aip.NewID(aip.PrefixReplica), replicaKey, fakeHandler(func(rw http.ResponseWriter, r *http.Request, req *aip.Envelope) {
		if q := req.Body.ActionStatusQuery; q != nil {
			signedReply(replicaKey, http.StatusOK, aip.Body{ActionStatus: &aip.ActionStatus{ActionID: q.ActionID, State: aip.StatePruned}})(rw, r, req)
			return
		}
		http.Error(rw, "unexpected", http.StatusBadRequest)
	}))
	act := aip.NewActionID()
	a, err := w.reg.Resolve(w.ctx, registry.RouteRequest{ActionID: act, TenantID: tenant, CapabilityID: capSay})
	must(t, err)
	if a.ReplicaID != fake || a.Admission.CircuitFailureThreshold != 1 {
		t.Fatalf("routed to %s with circuit threshold %d, want %s and 1", a.ReplicaID, a.Admission.CircuitFailureThreshold, fake)
	}
	d, res := reconcileAnHourLater(t, w, act)
	if res.Reserved || res.LastSettlement != registry.SettlementPruned {
		t.Fatalf("the pruned action's reservation: %+v, want released and settled pruned", res)
	}
	r, err := w.reg.ConnectorReplica(w.ctx, fake)
	must(t, err)
	if r.Circuit != (registry.CircuitState{}) || r.ActiveAssignments != 0 {
		t.Fatalf("the replica after the settlement: circuit %+v, %d active; want the circuit untouched and nothing active", r.Circuit, r.ActiveAssignments)
	}
	st, e := d.Status(w.ctx, tenant, act)
	if e != nil || st.Reservation.LastSettlement != registry.SettlementPruned || st.Replica.State != aip.StatePruned {
		t.Fatalf("the action's status: %+v (error %v), want last settlement pruned and the replica's state pruned", st, e)
	}
	again, err := w.reg.Resolve(w.ctx, registry.RouteRequest{ActionID: act, TenantID: tenant, CapabilityID: capSay})
	must(t, err)
	if again.ReplicaID != fake {
		t.Fatalf("the retry was routed to %s, want the pinned %s", again.ReplicaID, fake)
	}
	if res, err := w.reg.Reservation(w.ctx, act); err != nil || !res.Reserved {
		t.Fatalf("the retry's reservation: %+v, %v; want reserved again", res, err)
	}
}

// reconcileAnHourLater runs one reconciliation by a dispatcher whose clock
// is an hour ahead, so that act's reservation (the only one) is orphaned,
// requires it to find and settle that one, and returns that dispatcher
// (closed when the test ends) and act's reservation.
func reconcileAnHourLater(t *testing.T, w *world, act string) (*dispatch.Dispatcher, registry.RouteReservation) {
	t.Helper()
	d, err := dispatch.New(dispatch.Config{SigningKey: w.key, PrincipalID: gatewayID,
		Now: func() time.Time { return time.Now().Add(time.Hour) }},
		dispatch.Deps{Resolver: w.reg, Catalog: w.reg, Tokens: &countingVerifier{}, Reservations: w.reg})
	must(t, err)
	t.Cleanup(d.Close)
	rep, err := d.Reconcile(w.ctx)
	must(t, err)
	if rep != (dispatch.ReconcileReport{Stale: 1, Settled: 1}) {
		t.Fatalf("reconcile: %+v, want 1 stale, 1 settled", rep)
	}
	res, err := w.reg.Reservation(w.ctx, act)
	must(t, err)
	return d, res
}
