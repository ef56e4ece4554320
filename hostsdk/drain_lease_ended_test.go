package hostsdk_test

import (
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// linesWith returns the lines of logs that contain substr, leaving logs
// as they are.
func linesWith(logs *hostsdktest.LogBuffer, substr string) []string {
	var out []string
	for line := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

// wantLeaseEndedShutdown checks the result of a shutdown whose drain the
// control plane refused because the lease was gone: unclean, with that
// refusal its last failure (of failures), saying so; and no offline
// transition or registration sent.
func (b *bubbleFleet) wantLeaseEndedShutdown(t *testing.T, err error, logs *hostsdktest.LogBuffer, failures int) {
	t.Helper()
	var se *hostsdk.ShutdownError
	if !errors.As(err, &se) || len(se.Errs) != failures {
		t.Errorf("Stop = %v; want %d failures", err, failures)
	} else if last := se.Errs[failures-1].Error(); !strings.HasPrefix(last, "registry drain: the control plane ended the lease, refusing the drain: ") ||
		!strings.Contains(last, "no offline transition is sent") {
		t.Errorf("Stop = %v; want the last failure the drain's refusal, saying the control plane ended the lease", err)
	}
	if lines := linesWith(logs, "the control plane ended the lease"); len(lines) != 1 || !strings.Contains(lines[0], "level=ERROR") {
		t.Errorf("log lines saying the control plane ended the lease: %q; want the one shutdown failure", lines)
	}
	if lines := linesWith(logs, "renew the draining lease"); len(lines) != 0 {
		t.Errorf("the refusal was logged again as %q", lines)
	}
	if offs := opsOf(b.cp, aip.OpOffline); len(offs) != 0 {
		t.Errorf("offline transitions %+v; the replica held no lease at that sequence to take offline", offs)
	}
	if regs := opsOf(b.cp, aip.OpRegister); len(regs) != 1 {
		t.Errorf("registrations %+v; a stopping host must not register again", regs[1:])
	}
}

// TestRefusedDrainEndsTheLocalLease: lease maintenance ended the
// replica's lease (it took the replica offline) before the host, stopping,
// sent its drain, which the control plane refused under the state rule,
// signed. The host went on as if it held the lease until its own expiry:
// /ready said lease_valid, it held its listener open until then for
// actions the registry no longer routed to it, and sent an offline
// transition the control plane refused too (two failures for one cause).
// It now ends the local lease at the refusal, as a refused heartbeat
// does: the action running finishes and is answered, the listener closes
// once the linger has passed, and the one failure says what happened.
func TestRefusedDrainEndsTheLocalLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs hostsdktest.LogBuffer
		b := newLoggedBubbleFleet(t, &logs)
		ctx := b.awaitFirstBeat(t)
		time.Sleep(time.Second) // the first beat renewed the local lease for another 29 s
		running := b.startBlocked(t, ctx)
		b.cp.ExpireLease(b.cfg.ReplicaID)
		stopped := make(chan error, 1)
		go func() { stopped <- b.h.Stop(ctx) }()
		synctest.Wait()

		drains := opsOf(b.cp, aip.OpDrain)
		if len(drains) != 1 || drains[0].Outcome != aip.OutcomeRejected || !strings.HasPrefix(drains[0].Message, aip.ControlRuleState+": ") {
			t.Fatalf("drains %+v; want one, refused under the state rule", drains)
		}
		b.wantNotServing(t, ctx, "after the control plane refused the drain")

		time.Sleep(5 * time.Second)
		close(b.conn.release)
		released := time.Now()
		if res, err := (<-running).Result(); err != nil || res.Status != aip.ResultCompleted {
			t.Errorf("the action running at the drain: %v %+v; want it completed", err, res)
		}
		err := <-stopped
		if took := time.Since(released); took > time.Second {
			t.Errorf("Stop returned %s after the last action finished; the listener was held for a lease the control plane had ended", took)
		}
		b.wantLeaseEndedShutdown(t, err, &logs, 1)
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaOffline {
			t.Errorf("the registry holds the replica %s; want offline", st.Status)
		}
	})
}

// TestRefusedDrainRenewalEndsTheLocalLease: the control plane accepted
// the shutdown's drain, then ended the draining lease (lease maintenance,
// an operator's offline), and refused the next renewal under the state
// rule. The host renewed again at every tick until its local lease ran
// out, logging each refusal, kept /ready's lease_valid, and sent an
// offline transition the control plane refused. It now ends the local
// lease at the first refused renewal and stops renewing; the action
// running still finishes.
func TestRefusedDrainRenewalEndsTheLocalLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs hostsdktest.LogBuffer
		b := newLoggedBubbleFleet(t, &logs)
		ctx := b.awaitFirstBeat(t)
		time.Sleep(time.Second)
		running := b.startBlocked(t, ctx)
		stopping := time.Now()
		stopped := make(chan error, 1)
		go func() { stopped <- b.h.Stop(ctx) }()
		synctest.Wait()
		if drains := opsOf(b.cp, aip.OpDrain); len(drains) != 1 || drains[0].Outcome != aip.OutcomeLease {
			t.Fatalf("drains %+v; want the shutdown's drain accepted", drains)
		}
		b.cp.ExpireLease(b.cfg.ReplicaID)

		interval := hostsdk.DefaultHeartbeatInterval
		time.Sleep(interval + 100*time.Millisecond) // the renewal was refused
		drains := opsOf(b.cp, aip.OpDrain)
		if last := drains[len(drains)-1]; len(drains) != 2 || last.At.Sub(stopping) != interval ||
			last.Outcome != aip.OutcomeRejected || !strings.HasPrefix(last.Message, aip.ControlRuleState+": ") {
			t.Fatalf("drains %+v; want the renewal a heartbeat interval into the shutdown refused under the state rule", drains)
		}
		b.wantNotServing(t, ctx, "after the control plane refused the renewal of the draining lease")

		time.Sleep(2*interval - time.Second) // two more ticks; the draining lease ran to 30 s
		if drains := opsOf(b.cp, aip.OpDrain); len(drains) != 2 {
			t.Errorf("drains %+v; want none after the refused renewal", drains[2:])
		}
		close(b.conn.release)
		if res, err := (<-running).Result(); err != nil || res.Status != aip.ResultCompleted {
			t.Errorf("the action running at the drain: %v %+v; want it completed", err, res)
		}
		b.wantLeaseEndedShutdown(t, <-stopped, &logs, 1)
	})
}

// TestRefusedDrainReplayEndsTheLocalLease: the shutdown's drain got the
// control plane's signed 503 (nothing applied; it stays pending, and the
// listener is held while the lease it granted last may keep the replica
// routable), then lease maintenance ended the lease. The renewal's replay
// of the pending drain (same request ID) was refused under the state
// rule; the host sent a fresh drain, refused alike, at every tick, held
// its listener until its local lease ran out and sent an offline
// transition. The replay's refusal now ends the local lease, the hold
// with it, and the shutdown ends.
func TestRefusedDrainReplayEndsTheLocalLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs hostsdktest.LogBuffer
		b := newLoggedBubbleFleet(t, &logs)
		ctx := b.awaitFirstBeat(t)
		time.Sleep(time.Second)                        // the local lease runs for another 29 s
		b.cp.FailNext(2, hostsdktest.FaultUnavailable) // the drain and its resend
		stopping := time.Now()
		stopped := make(chan error, 1)
		go func() { stopped <- b.h.Stop(ctx) }()
		synctest.Wait()
		b.cp.ExpireLease(b.cfg.ReplicaID)

		interval := hostsdk.DefaultHeartbeatInterval
		time.Sleep(interval + 100*time.Millisecond)
		drains := opsOf(b.cp, aip.OpDrain)
		if len(drains) != 3 || drains[2].RequestID != drains[0].RequestID || drains[2].At.Sub(stopping) != interval ||
			drains[2].Outcome != aip.OutcomeRejected || !strings.HasPrefix(drains[2].Message, aip.ControlRuleState+": ") {
			t.Fatalf("drains %+v; want the drain and its resend answered 503, then its replay at the renewal refused under the state rule", drains)
		}
		select {
		case err := <-stopped:
			var se *hostsdk.ShutdownError
			if !errors.As(err, &se) || !errors.Is(se.Errs[0], hostsdk.ErrControlUnavailable) {
				t.Errorf("Stop = %v; want the 503 of the drain its first failure", err)
			}
			b.wantLeaseEndedShutdown(t, err, &logs, 2)
		default:
			t.Fatalf("the shutdown goes on after the control plane ended the lease, holding the listener for it: %s", logs.String())
		}
	})
}
