package hostsdk_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// leaseEndedWarning is the one warning a host logs when the control plane
// refused a beat because the lease is gone there.
const leaseEndedWarning = "the control plane ended the lease"

// newLoggedBubbleFleet is newBubbleFleet with the host's log in logs.
func newLoggedBubbleFleet(t *testing.T, logs *hostsdktest.LogBuffer) *bubbleFleet {
	t.Helper()
	return newBubbleFleet(t, func(c *hostsdk.Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
}

// registersSince returns the registrations the control plane saw after t0.
func registersSince(cp *hostsdktest.ControlPlane, t0 time.Time) []hostsdktest.Operation {
	var out []hostsdktest.Operation
	for _, o := range opsOf(cp, aip.OpRegister) {
		if o.At.After(t0) {
			out = append(out, o)
		}
	}
	return out
}

// wantNotServing checks that the host claims no lease: not Ready, /ready
// 503, and a new action refused with the signed not_ready (nothing ran).
func (b *bubbleFleet) wantNotServing(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	if b.h.Ready() {
		t.Errorf("%s: the host is ready", when)
	}
	if code, doc := b.readyDoc(t); code != http.StatusServiceUnavailable || doc.LeaseValid {
		t.Errorf("%s: /ready answered %d (lease_valid %v, lease %+v); want 503, no valid lease", when, code, doc.LeaseValid, doc.Lease)
	}
	resp, err := b.d.Act(ctx, hostsdktest.TargetOf(b.h, b.cfg), action(capEcho, `{"message":"routed after the lease ended"}`))
	if err != nil {
		t.Fatalf("%s: an action got no signed answer: %v", when, err)
	}
	if resp.Status != http.StatusServiceUnavailable || resp.ProtocolError() == nil || resp.ProtocolError().Code != hostsdk.CodeNotReady {
		t.Errorf("%s: a new action was answered %d %s; want the signed 503 %s", when, resp.Status, resp.Raw, hostsdk.CodeNotReady)
	}
}

// wantServing checks that the host holds a lease again and runs actions.
func (b *bubbleFleet) wantServing(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	if !b.h.Ready() {
		t.Errorf("%s: the host is not ready", when)
	}
	if code, _ := b.readyDoc(t); code != http.StatusOK {
		t.Errorf("%s: /ready answered %d; want 200", when, code)
	}
	resp, err := b.d.Act(ctx, hostsdktest.TargetOf(b.h, b.cfg), action(capEcho, `{"message":"after the recovery"}`))
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Errorf("%s: an action was answered %d %s; want it completed", when, resp.Status, resp.Raw)
	}
}

// TestLeaseEndedByTheControlPlaneEndsTheLocalLease: lease maintenance ended
// the replica's lease in the registry (it took the replica offline and
// released its reservations), and the control plane refuses the next beat
// saying so, signed. The host kept its local lease until its own recorded
// expiry: ready, /ready 200, new actions run for up to a lease TTL that
// the registry no longer backed, and it registered again only after that.
// It now ends the local lease at the refusal — new actions get the signed
// not_ready, /ready 503, the action already running finishes and is
// journaled — logs it once, and registers again at the next tick.
func TestLeaseEndedByTheControlPlaneEndsTheLocalLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs hostsdktest.LogBuffer
		b := newLoggedBubbleFleet(t, &logs)
		ctx := b.awaitFirstBeat(t)
		t1 := time.Now() // the first beat renewed the local lease to t1+30
		time.Sleep(time.Second)
		target := hostsdktest.TargetOf(b.h, b.cfg)
		running := action(capBlock, `{"message":"running when the lease ends"}`)
		answered := make(chan *hostsdktest.Response, 1)
		go func() {
			resp, err := b.d.Act(ctx, target, running)
			if err != nil {
				t.Error(err)
			}
			answered <- resp
		}()
		<-b.conn.started
		b.cp.ExpireLease(b.cfg.ReplicaID)

		time.Sleep(9*time.Second + 100*time.Millisecond) // t1+10.1: the beat at +10 was refused
		hbs := opsOf(b.cp, aip.OpHeartbeat)
		if last := hbs[len(hbs)-1]; last.At.Sub(t1) != 10*time.Second || last.Outcome != aip.OutcomeRejected ||
			!strings.HasPrefix(last.Message, aip.ControlRuleState+": ") {
			t.Fatalf("last heartbeat %+v; want the beat at t1+10 refused under the state rule", last)
		}
		b.wantNotServing(t, ctx, "after the control plane refused the beat, the local lease valid until t1+30")
		if warned := logs.Take(leaseEndedWarning); len(warned) != 1 || !strings.Contains(warned[0], "level=WARN") {
			t.Errorf("log lines saying the control plane ended the lease: %q; want one warning", warned)
		}
		if failed := logs.Take("heartbeat failed"); len(failed) != 0 {
			t.Errorf("the refusal was logged again as %q", failed)
		}

		// The action that was running finishes, journaled, and is answered.
		close(b.conn.release)
		resp := <-answered
		if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
			t.Fatalf("the action running when the lease ended was answered %d %s; want completed", resp.Status, resp.Raw)
		}
		if st, _, err := b.d.Status(ctx, target, running.ID, running.CapabilityID); err != nil || st.State != aip.StateCompleted {
			t.Errorf("status of the action running when the lease ended: %+v (%v); want completed in the journal", st, err)
		}
		if regs := registersSince(b.cp, t1); len(regs) != 0 {
			t.Fatalf("registrations %+v before the next tick; want none in a tight loop", regs)
		}

		time.Sleep(10 * time.Second) // t1+20.1: the tick at +20 registered again
		regs := registersSince(b.cp, t1)
		if len(regs) != 1 || regs[0].At.Sub(t1) != 20*time.Second || regs[0].Outcome != aip.OutcomeLease {
			t.Fatalf("registrations after the lease ended: %+v; want one, granted at the tick at t1+20", regs)
		}
		b.wantServing(t, ctx, "after the registration at the next tick")
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaReady || st.HealthRevision != regs[0].Sequence {
			t.Errorf("the registry holds %+v; want ready at sequence %d", st, regs[0].Sequence)
		}
		if got := b.metric(t, hostsdk.MetricLeaseRecoveries); got != 1 {
			t.Errorf("%s = %v, want 1", hostsdk.MetricLeaseRecoveries, got)
		}
	})
}

// TestLostFenceEndsTheLocalLease: another lifecycle request under the
// replica's key (a second process with the same replica ID and key) won
// the sequence fence, so the control plane refuses the host's beat under
// the sequence rule: the host holds no lease at its sequence any more. It
// stops claiming one at once, and from the next tick tries to register,
// which the registry refuses (lease_live) while the other process's lease
// lives; the host registers once that lease has run out.
func TestLostFenceEndsTheLocalLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs hostsdktest.LogBuffer
		b := newLoggedBubbleFleet(t, &logs)
		ctx := b.awaitFirstBeat(t)
		t1 := time.Now()
		time.Sleep(time.Second)
		st, _ := b.cp.Replica(b.cfg.ReplicaID)
		foreign := b.foreignBeat(t, st.HealthRevision) // the registry's lease now runs to t1+31
		if foreign.Status != aip.OutcomeLease {
			t.Fatalf("the other process's beat was answered %+v", foreign)
		}

		time.Sleep(9*time.Second + 100*time.Millisecond) // t1+10.1
		hbs := opsOf(b.cp, aip.OpHeartbeat)
		if last := hbs[len(hbs)-1]; last.At.Sub(t1) != 10*time.Second || last.Outcome != aip.OutcomeRejected ||
			!strings.HasPrefix(last.Message, aip.ControlRuleSequence+": ") {
			t.Fatalf("last heartbeat %+v; want the host's beat at t1+10 refused under the sequence rule", last)
		}
		b.wantNotServing(t, ctx, "after the beat lost the fence")
		if warned := logs.Take(leaseEndedWarning); len(warned) != 1 {
			t.Errorf("log lines saying the control plane ended the lease: %q; want one", warned)
		}

		time.Sleep(10 * time.Second) // t1+20.1: the next tick tried to register
		regs := registersSince(b.cp, t1)
		if len(regs) != 1 || regs[0].At.Sub(t1) != 20*time.Second || regs[0].Outcome != aip.OutcomeRejected ||
			!strings.HasPrefix(regs[0].Message, aip.ControlRuleLeaseLive+": ") {
			t.Fatalf("registrations %+v; want one at the tick at t1+20, refused while the other lease lives", regs)
		}
		b.wantNotServing(t, ctx, "while the other process's lease lives")

		time.Sleep(20 * time.Second) // t1+40.1: that lease ran out at +31
		regs = registersSince(b.cp, t1)
		if last := regs[len(regs)-1]; last.Outcome != aip.OutcomeLease {
			t.Fatalf("registrations %+v; want the host registered once the other lease ran out", regs)
		}
		b.wantServing(t, ctx, "after the other lease ran out")
	})
}

// TestRefusedReplayEndsTheLocalLease: the beat at the tick failed with the
// control plane's 503 (nothing applied; it stays pending), and lease
// maintenance had ended the lease. The retry replays the pending beat (same
// request ID), which the control plane refuses under the state rule: the
// replay's refusal ends the local lease as a fresh beat's does, and the
// next tick registers.
func TestRefusedReplayEndsTheLocalLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs hostsdktest.LogBuffer
		b := newLoggedBubbleFleet(t, &logs)
		ctx := b.awaitFirstBeat(t)
		t1 := time.Now()
		time.Sleep(time.Second)
		b.cp.ExpireLease(b.cfg.ReplicaID)
		b.cp.FailNext(2, hostsdktest.FaultUnavailable) // the beat at +10 and its resend
		time.Sleep(12 * time.Second)                   // t1+13: the retry (by +11) replayed it
		hbs := opsOf(b.cp, aip.OpHeartbeat)
		if len(hbs) != 4 {
			t.Fatalf("heartbeats %+v; want the first, the beat at +10 and its resend, and one retry", hbs)
		}
		beat, retry := hbs[1], hbs[3]
		if beat.Fault != hostsdktest.FaultUnavailable || retry.RequestID != beat.RequestID || retry.Outcome != aip.OutcomeRejected ||
			!strings.HasPrefix(retry.Message, aip.ControlRuleState+": ") || retry.At.Sub(t1) >= 20*time.Second {
			t.Fatalf("heartbeats %+v; want the beat at +10 replayed by a retry before +20 and refused under the state rule", hbs)
		}
		b.wantNotServing(t, ctx, "after the replay was refused")
		if warned := logs.Take(leaseEndedWarning); len(warned) != 1 {
			t.Errorf("log lines saying the control plane ended the lease: %q; want one", warned)
		}
		time.Sleep(7*time.Second + 100*time.Millisecond) // t1+20.1
		if regs := registersSince(b.cp, t1); len(regs) != 1 || regs[0].At.Sub(t1) != 20*time.Second || regs[0].Outcome != aip.OutcomeLease {
			t.Fatalf("registrations %+v; want one, granted at the tick at t1+20", regs)
		}
		if hbs := opsOf(b.cp, aip.OpHeartbeat); len(hbs) != 4 {
			t.Errorf("heartbeats %+v; want no beat after the refused replay", hbs[4:])
		}
		b.wantServing(t, ctx, "after the registration at the next tick")
	})
}

// foreignBeat sends, under the replica's key, a heartbeat at sequence seq
// that the host did not send (another process with the same replica ID
// and key), and returns the control plane's answer.
func (b *bubbleFleet) foreignBeat(t *testing.T, seq uint64) aip.ControlOutcome {
	t.Helper()
	key := b.cfg.SigningKey
	req := aip.NewControlRequest(time.Now(), key.DID(), aip.HeartbeatCommand(aip.Heartbeat{
		ReplicaID: b.cfg.ReplicaID, PreviousSequence: seq, ConnectorReady: true}))
	body, err := aip.Seal(key, aip.SignedRequestField, req)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	b.cp.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, aip.ControlPath, bytes.NewReader(body)))
	pub, err := aip.ParseDIDKey(b.cp.DID())
	if err != nil {
		t.Fatal(err)
	}
	cr, err := aip.OpenControlResponse(rec.Body.Bytes(), b.cp.DID(), pub, req.RequestID, time.Now())
	if err != nil {
		t.Fatalf("HTTP %d: %v: %s", rec.Code, err, rec.Body)
	}
	return cr.Outcome
}

// TestRefusalsThatDoNotEndTheLeaseKeepIt: only a refusal proving that the
// lease is gone ends it here. A signed refusal that says nothing of the
// lease, an unsigned answer, the control plane's 503 or a lost answer
// leave the local lease as it was (the retries of runHeartbeats renew it).
func TestRefusalsThatDoNotEndTheLeaseKeepIt(t *testing.T) {
	for _, fault := range []hostsdktest.Fault{hostsdktest.FaultReject, hostsdktest.FaultUnsigned, hostsdktest.FaultUnavailable, hostsdktest.FaultDropResponse} {
		t.Run(fault.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var logs hostsdktest.LogBuffer
				b := newLoggedBubbleFleet(t, &logs)
				ctx := b.awaitFirstBeat(t)
				t1 := time.Now()
				time.Sleep(time.Second)
				b.cp.FailNext(2, fault) // the beat at +10 and its resend
				time.Sleep(9*time.Second + 10*time.Millisecond)
				hbs := opsOf(b.cp, aip.OpHeartbeat)
				if last := hbs[len(hbs)-1]; last.At.Sub(t1) != 10*time.Second || last.Fault != fault {
					t.Fatalf("last heartbeat %+v; want the beat at t1+10 failed by %s", last, fault)
				}
				b.wantServing(t, ctx, "after a beat failed ("+fault.String()+")")
				if warned := logs.Take(leaseEndedWarning); len(warned) != 0 {
					t.Errorf("logged %q for a failure that does not end the lease", warned)
				}
				if regs := registersSince(b.cp, t1); len(regs) != 0 {
					t.Errorf("registrations %+v; want none", regs)
				}
			})
		})
	}
}

// TestDrainAfterTheLeaseEndedDoesNotRegister: a host whose lease the
// control plane ended drains (SIGTERM) before its next tick: it sends no
// drain (it holds no lease to drain) and never registers again.
func TestDrainAfterTheLeaseEndedDoesNotRegister(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, nil)
		ctx := b.awaitFirstBeat(t)
		t1 := time.Now()
		time.Sleep(time.Second)
		b.cp.ExpireLease(b.cfg.ReplicaID)
		time.Sleep(9*time.Second + 100*time.Millisecond) // the beat at +10 was refused
		b.wantNotServing(t, ctx, "after the control plane refused the beat")
		stopping := time.Now()
		_ = b.h.Stop(ctx) // its offline finds the replica offline already: unclean, as after a local expiry
		time.Sleep(time.Minute)
		if regs := registersSince(b.cp, t1); len(regs) != 0 {
			t.Errorf("registrations %+v; a draining host must not register", regs)
		}
		for _, o := range b.cp.Operations() {
			if o.Op == aip.OpDrain {
				t.Errorf("drain %+v sent %s into the shutdown; the host held no lease to drain", o, o.At.Sub(stopping))
			}
		}
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaOffline {
			t.Errorf("the registry holds the replica %s; want offline", st.Status)
		}
	})
}
