package dispatch_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// circuitPolicy binds capSay to a quota policy whose circuit opens after
// threshold outcome_unknown settlements in a row.
func circuitPolicy(t *testing.T, w *world, threshold uint32) {
	t.Helper()
	pol := registry.ConservativePolicy("quota:circuit")
	pol.CircuitFailureThreshold, pol.CircuitOpenMS = threshold, 60_000
	must(t, w.reg.PutAdmissionPolicy(w.ctx, pol))
	b, err := w.reg.CapabilityBinding(w.ctx, registry.BindingKey{TenantID: tenant, CapabilityID: capSay, InstanceID: w.instanceID})
	must(t, err)
	b.QuotaPolicyRef, b.PolicyRevision = pol.PolicyRef, b.PolicyRevision+1
	must(t, w.reg.PutBinding(w.ctx, b))
}

// TestInterruptedReadsTripTheCircuit: a read-only capability's action
// that the replica's connector timed out on is answered failed
// connector_host.interrupted (retryable: the read changed nothing), but
// settles outcome_unknown, as the same failure of a mutation does, so a
// replica whose reads keep hanging opens its circuit; a completed action
// closes it again. Settled completed, the failed answer reset the
// circuit instead, and such a replica was never taken out of routing.
func TestInterruptedReadsTripTheCircuit(t *testing.T) {
	w := newWorld(t, worldOptions{})
	circuitPolicy(t, w, 2)
	h := w.startHost(8, 8)
	timeout := uint64(100)
	for i := 1; i <= 2; i++ {
		status, resp := w.act(dispatch.ActionRequest{CapabilityID: capSay, Input: say("slow", `,"delay_ms":5000`), TimeoutMS: &timeout})
		if status != http.StatusOK || resp.Result == nil || resp.Result.Status != aip.ResultFailed || resp.Result.Error == nil ||
			resp.Result.Error.Code != hostsdk.CodeInterrupted || !resp.Result.Error.IsRetryable() {
			t.Fatalf("read %d timed out: %d %+v %+v; want 200, failed %s, retryable", i, status, resp.Result, resp.Error, hostsdk.CodeInterrupted)
		}
		if resp.Settlement != registry.SettlementOutcomeUnknown {
			t.Fatalf("read %d settled %q, want outcome_unknown", i, resp.Settlement)
		}
		rep, err := w.reg.ConnectorReplica(w.ctx, h.cfg.ReplicaID)
		must(t, err)
		if rep.Circuit.ConsecutiveFailures != uint32(i) {
			t.Fatalf("after read %d the circuit is %+v, want %d failures", i, rep.Circuit, i)
		}
		if open := !rep.Circuit.Closed(time.Now()); open != (i == 2) {
			t.Fatalf("after read %d the circuit is %+v: open %t", i, rep.Circuit, open)
		}
	}
	// With its circuit open, the replica takes no new action.
	if status, resp := w.act(dispatch.ActionRequest{CapabilityID: capSay, Input: say("x", "")}); status == http.StatusOK {
		t.Fatalf("an action was routed to the replica whose circuit is open: %+v", resp.Route)
	}
	w.idle()
}

// TestReconcileSettlesAnInterruptedReadOutcomeUnknown: an orphaned
// reservation whose replica's journal holds a failed
// connector_host.interrupted result settles outcome_unknown, as that
// answer would have (TestInterruptedReadsTripTheCircuit), counting toward
// the replica's circuit; another failed result settles completed.
func TestReconcileSettlesAnInterruptedReadOutcomeUnknown(t *testing.T) {
	for _, c := range []struct {
		code string
		want registry.RouteSettlement
	}{{hostsdk.CodeInterrupted, registry.SettlementOutcomeUnknown}, {"test.failed", registry.SettlementCompleted}} {
		t.Run(c.code, func(t *testing.T) {
			w := newWorld(t, worldOptions{})
			circuitPolicy(t, w, 1)
			replicaKey, _ := aip.GenerateSigningKey()
			fake := w.fakeReplica(aip.NewID(aip.PrefixReplica), replicaKey, fakeHandler(func(rw http.ResponseWriter, r *http.Request, req *aip.Envelope) {
				if q := req.Body.ActionStatusQuery; q != nil {
					res := &aip.ActionResult{ActionID: q.ActionID, Status: aip.ResultFailed,
						Error: aip.NewProtocolError(c.code, aip.CategoryConnector, true, 0, "the read was cut off")}
					signedReply(replicaKey, http.StatusOK, aip.Body{ActionStatus: &aip.ActionStatus{ActionID: q.ActionID, State: aip.StateFailed, Result: res}})(rw, r, req)
					return
				}
				http.Error(rw, "unexpected", http.StatusBadRequest)
			}))
			act := aip.NewActionID()
			if _, err := w.reg.Resolve(w.ctx, registry.RouteRequest{ActionID: act, TenantID: tenant, CapabilityID: capSay}); err != nil {
				t.Fatal(err)
			}
			_, res := reconcileAnHourLater(t, w, act)
			if res.Reserved || res.LastSettlement != c.want {
				t.Fatalf("reservation %+v, want released and settled %s", res, c.want)
			}
			r, err := w.reg.ConnectorReplica(w.ctx, fake)
			must(t, err)
			if failures := r.Circuit.ConsecutiveFailures; (failures == 1) != (c.want == registry.SettlementOutcomeUnknown) {
				t.Fatalf("the replica's circuit %+v after a settlement %s", r.Circuit, c.want)
			}
		})
	}
}
