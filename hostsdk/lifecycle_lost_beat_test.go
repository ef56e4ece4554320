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
// replica's lease there; its replay on the next beat was lost too. When the
// host's own (older) lease runs out, the registry still holds the replica
// ready on the lease that beat granted, so a registration is refused as a
// competing takeover (lease_live) and the host would refuse every action
// routed to it until that lease also ran out. The host replays the pending
// beat first, learns the lease, and renews it.
func TestPendingBeatIsReplayedWhenTheLocalLeaseRunsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, nil)
		b.awaitFirstBeat(t)
		// t1: the first beat renewed the lease to t1+30.
		b.cp.FailNext(2, hostsdktest.FaultDropResponse)
		time.Sleep(11 * time.Second) // +10: the beat commits (lease to t1+40); both answers are lost
		b.cp.FailNext(2, hostsdktest.FaultDropResponse)
		time.Sleep(10 * time.Second) // +20: its replay answers the committed lease; both answers lost again
		hbs := opsOf(b.cp, aip.OpHeartbeat)
		if last := hbs[len(hbs)-1]; !last.Replayed || last.Fault != hostsdktest.FaultDropResponse {
			t.Fatalf("heartbeats %+v: want the committed beat replayed and its answers lost", hbs)
		}
		time.Sleep(10 * time.Second) // +30: the host's lease runs out; the registry's lives to +40
		if rej := rejectedOps(b.cp, aip.OpRegister); len(rej) > 0 {
			t.Errorf("the host re-registered while the lease its lost beat renewed was live: %+v", rej)
		}
		time.Sleep(time.Second) // +31
		if !b.h.Ready() {
			t.Errorf("host not ready at +31 while the registry routes to it; operations %+v", b.cp.Operations())
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
		b := newBubbleFleet(t, nil)
		b.awaitFirstBeat(t)
		// t1: the first beat renewed the lease to t1+30. The beat at +10,
		// its replays at +20 and, the lease run out, at +30 (each attempt
		// sent twice) get unsigned answers: nothing is applied, and the
		// outcome is unknown to the host.
		b.cp.FailNext(6, hostsdktest.FaultUnsigned)
		time.Sleep(31 * time.Second)
		hbs := opsOf(b.cp, aip.OpHeartbeat)
		if len(hbs) != 7 || hbs[6].RequestID != hbs[1].RequestID || hbs[6].Fault != hostsdktest.FaultUnsigned {
			t.Fatalf("heartbeats %+v: want the first beat, then one request sent six times with unsigned answers", hbs)
		}
		regs := opsOf(b.cp, aip.OpRegister)
		if last := regs[len(regs)-1]; len(regs) != 2 || last.Outcome != aip.OutcomeLease {
			t.Fatalf("registrations %+v: want the lease recovered at +30, after the failed replay", regs)
		}
		if got := b.metric(t, hostsdk.MetricHeartbeatFailures); got != 3 {
			t.Errorf("%s = %v at +31; want 3: the beat at +10 and its replays at +20 and +30 failed", hostsdk.MetricHeartbeatFailures, got)
		}
	})
}
