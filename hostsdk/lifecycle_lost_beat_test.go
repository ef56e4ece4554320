package hostsdk_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// rejectedOps returns the operations of kind op the control plane rejected.
func rejectedOps(cp *hostsdktest.ControlPlane, op aip.Operation) []hostsdktest.Operation {
	var out []hostsdktest.Operation
	for _, o := range opsOf(cp, op) {
		if o.Outcome == aip.OutcomeRejected {
			out = append(out, o)
		}
	}
	return out
}

// An unhealthy beat (connector_ready=false) that the control plane applied
// but whose answers were lost took the replica offline and ended its lease.
// The next beat replays it and learns that; the connector being healthy
// again, the host must register at once (its lease is gone), not send a
// heartbeat on the lease the replay just ended, which the control plane
// refuses ("replica is offline; register again") and which leaves the
// replica out of routing for another heartbeat interval.
func TestReplayedUnhealthyBeatThenHealthyRegistersAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, nil)
		b.awaitFirstBeat(t)
		// t1: the first beat renewed the lease to t1+30.
		b.conn.setHealth(errUnhealthy)
		b.cp.FailNext(2, hostsdktest.FaultDropResponse)
		time.Sleep(11 * time.Second) // +10: the unhealthy beat commits; both answers are lost
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaOffline {
			t.Fatalf("replica is %s after the unhealthy beat", st.Status)
		}
		b.conn.setHealth(nil)
		time.Sleep(10 * time.Second) // +20: the beat replays the lost one, then recovers
		replayed := false
		for _, o := range opsOf(b.cp, aip.OpHeartbeat) {
			replayed = replayed || (o.Replayed && !o.ConnectorReady && o.Outcome == aip.OutcomeLease)
		}
		if !replayed {
			t.Fatalf("heartbeats %+v: want the lost unhealthy beat replayed", opsOf(b.cp, aip.OpHeartbeat))
		}
		if rej := rejectedOps(b.cp, aip.OpHeartbeat); len(rej) > 0 {
			t.Errorf("the host sent a heartbeat on the lease the replay ended: %+v", rej)
		}
		if !b.h.Ready() {
			t.Errorf("host not ready in the tick where it learnt its lease ended and it is healthy; registers: %+v", opsOf(b.cp, aip.OpRegister))
		}
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaReady {
			t.Errorf("replica is %s, want ready again", st.Status)
		}
	})
}

// A beat the control plane applied but whose answers were lost renewed the
// replica's lease there; its replays (its retries, and the next beat) were
// lost too. When the host's own (older) lease runs out, the registry still
// holds the replica ready on the lease that beat granted, so a
// registration is refused as a competing takeover (lease_live) and the
// host would refuse every action routed to it until that lease also ran
// out. The host replays the pending beat first, learns the lease, and
// renews it.
func TestPendingBeatIsReplayedWhenTheLocalLeaseRunsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var o *controlOutage
		b := newBubbleFleet(t, func(c *hostsdk.Config) {
			o = &controlOutage{next: c.ControlPlaneTransport, only: aip.OpHeartbeat}
			c.ControlPlaneTransport = o
		})
		b.awaitFirstBeat(t)
		t1 := time.Now() // the first beat renewed the lease to t1+30
		o.set(outageDropAnswers)
		// +10: the beat commits (lease to t1+40); the answers of its
		// sends, its retries and its replay at +20 are all lost, until the
		// last retry a second before the host's lease runs out at +30.
		time.Sleep(29500 * time.Millisecond)
		o.set(outageOff)
		hbs := opsOf(b.cp, aip.OpHeartbeat)[1:]
		for i, op := range hbs {
			if op.RequestID != hbs[0].RequestID || op.Replayed != (i > 0) || op.Outcome != aip.OutcomeLease {
				t.Fatalf("heartbeats %+v after the first: want one beat committed at +10, then only its replays", hbs)
			}
		}
		if len(hbs) <= 4 || o.failed(aip.OpHeartbeat) != len(hbs) {
			t.Fatalf("heartbeats %+v after the first, %d answers lost: want the beat at +10, its replay at +20 (each sent twice) and retries, every answer lost", hbs, o.failed(aip.OpHeartbeat))
		}
		time.Sleep(500 * time.Millisecond) // +30: the host's lease runs out; the registry's lives to +40
		if rej := rejectedOps(b.cp, aip.OpRegister); len(rej) > 0 {
			t.Errorf("the host re-registered while the lease its lost beat renewed was live: %+v", rej)
		}
		time.Sleep(time.Second) // +31
		if !b.h.Ready() {
			t.Errorf("host not ready at t1+%s while the registry routes to it; operations %+v", time.Since(t1), b.cp.Operations())
		}
		if got := b.metric(t, hostsdk.MetricLeaseRecoveries); got != 0 {
			t.Errorf("lease recoveries %v: the replica never lost its lease", got)
		}
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaReady || !st.LeaseExpiresAt.After(time.Now().Add(20*time.Second)) {
			t.Errorf("replica %s with lease until %s at +31; want ready and renewed", st.Status, st.LeaseExpiresAt)
		}
	})
}

// TestFailedBeatReplayAfterTheLeaseRanOutIsCounted: a beat whose answers
// did not verify (the control plane may have applied it) is replayed once
// the host's lease has run out; a replay that fails then is a failed
// renewal attempt, counted in aip_connector_host_heartbeat_failures_total
// like the failed beats before it, also when the lease recovery that
// follows in the same tick succeeds. It was only logged: the tick where
// the lease ran out counted nothing.
func TestFailedBeatReplayAfterTheLeaseRanOutIsCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var o *controlOutage
		b := newBubbleFleet(t, func(c *hostsdk.Config) {
			o = &controlOutage{next: c.ControlPlaneTransport, only: aip.OpHeartbeat}
			c.ControlPlaneTransport = o
		})
		b.awaitFirstBeat(t)
		t1 := time.Now()
		// The first beat renewed the lease to t1+30. The beat at +10, its
		// retries, its replay at +20 and, the lease run out, at +30 (each
		// attempt sent twice) get unsigned answers: nothing is applied,
		// and the outcome is unknown to the host.
		o.set(outageUnsigned)
		time.Sleep(31 * time.Second)
		o.set(outageOff)
		hbs := o.requests(aip.OpHeartbeat)[1:]
		for _, s := range hbs {
			if s.RequestID != hbs[0].RequestID || !s.Failed {
				t.Fatalf("heartbeats %+v after the first: want one request, every attempt answered unsigned", hbs)
			}
		}
		if last := hbs[len(hbs)-1]; len(hbs)%2 != 0 || !last.At.Equal(t1.Add(30*time.Second)) {
			t.Fatalf("heartbeats %+v after the first: want the last attempt's send and resend at +30, when the lease ran out", hbs)
		}
		regs := opsOf(b.cp, aip.OpRegister)
		if last := regs[len(regs)-1]; len(regs) != 2 || last.Outcome != aip.OutcomeLease {
			t.Fatalf("registrations %+v: want the lease recovered at +30, after the failed replay", regs)
		}
		if got, want := b.metric(t, hostsdk.MetricHeartbeatFailures), float64(len(hbs)/2); got != want {
			t.Errorf("%s = %v at +31; want %v: the beat at +10, its retries and its replays at +20 and +30 failed", hostsdk.MetricHeartbeatFailures, got, want)
		}
	})
}
