package dispatch_test

import (
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
// they are older than ReconcileAfter — a completed action completed, one
// the replica never received cancelled — while an action still running,
// a young reservation and a replica that does not answer are left alone.
func TestReconcileSettlesOrphanedReservations(t *testing.T) {
	var ahead atomic.Int64 // how far the dispatcher's clock is ahead
	w, flaky := flakyWorld(t, 1<<30, registryDown, func(c *dispatch.Config) {
		c.ActionTimeout, c.MaxTimeout, c.HopSlack, c.RegistryTimeout = 10*time.Second, 10*time.Second, 100*time.Millisecond, time.Second
		c.ReconcileAfter = 12 * time.Second
		c.SettleRetryTimeout = -1 // the failed settlements stay failed
		c.Now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	})
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
	// An action routed by a dispatcher that stopped before sending it.
	unsent := aip.NewActionID()
	if _, err := w.reg.Resolve(w.ctx, registry.RouteRequest{ActionID: unsent, TenantID: tenant, CapabilityID: capSay}); err != nil {
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

	if rep := report(); rep != (dispatch.ReconcileReport{}) {
		t.Fatalf("young reservations were reconciled: %+v", rep)
	}
	flaky.heal()
	ahead.Store(int64(13 * time.Second)) // within the hosts' clock skew window
	if rep := report(); rep != (dispatch.ReconcileReport{Stale: 3, Settled: 2, InProgress: 1}) {
		t.Fatalf("reconcile: %+v, want 3 stale, 2 settled, 1 in progress", rep)
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

	// A replica that does not answer keeps its reservations.
	gone := aip.NewActionID()
	if _, err := w.reg.Resolve(w.ctx, registry.RouteRequest{ActionID: gone, TenantID: tenant, CapabilityID: capSay}); err != nil {
		t.Fatal(err)
	}
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
