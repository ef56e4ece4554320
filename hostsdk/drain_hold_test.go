package hostsdk_test

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// TestListenerStaysUpWhileAFailedDrainLeavesTheReplicaRoutable: when the
// shutdown's drain does not get through, the registry holds the replica
// ready until the lease the control plane granted last expires, and the
// dispatcher goes on routing actions to it. The listener stays up until
// then, answering them with the signed not_ready (which the dispatcher
// reroutes on) rather than a refused connection (which it cannot: the
// action failed replica_unreachable), and the shutdown still ends within
// the termination grace the operator guide gives (drain timeout + 5 ×
// lifecycle timeout; no action ran, so no handle grace). The listener
// closed once the linger ended.
func TestListenerStaysUpWhileAFailedDrainLeavesTheReplicaRoutable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(*bubbleFleet, *hungControlPlane)
	}{
		{"control plane unavailable", func(b *bubbleFleet, _ *hungControlPlane) { b.cp.SetUnavailable(true) }},
		{"connection refused", func(_ *bubbleFleet, cp *hungControlPlane) { cp.refuse.Store(true) }},
		{"control plane hung", func(_ *bubbleFleet, cp *hungControlPlane) { cp.hang.Store(true) }},
		{"drain rejected", func(b *bubbleFleet, _ *hungControlPlane) { b.cp.FailNext(1, hostsdktest.FaultReject) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, cp := newHungFleet(t, 30*time.Second)
				ctx := b.awaitFirstBeat(t)
				synctest.Wait()
				st, _ := b.cp.Replica(b.cfg.ReplicaID)
				if st.Status != aip.ReplicaReady {
					t.Fatalf("the registry holds the replica %s before the shutdown; want ready", st.Status)
				}
				routable := st.LeaseExpiresAt // the registry routes actions here until then
				tc.fault(b, cp)
				start := time.Now()
				stopped := make(chan error, 1)
				go func() { stopped <- b.h.Stop(ctx) }()

				// Long past the linger (50 ms), a second before the lease
				// ends: an action routed now is refused, signed.
				time.Sleep(time.Until(routable) - time.Second)
				resp, err := b.d.Act(ctx, hostsdktest.TargetOf(b.h, b.cfg), action(capEcho, `{"message":"routed while the lease lives"}`))
				if err != nil {
					t.Fatalf("%s into the shutdown, with the drain not through and the lease valid for another second, an action got no signed answer: %v",
						time.Since(start), err)
				}
				wantCode(t, resp, http.StatusServiceUnavailable, hostsdk.CodeNotReady)

				err = <-stopped
				if err == nil {
					t.Error("Stop = nil; the drain transition failed, so the shutdown is unclean")
				}
				budget := b.cfg.DrainTimeout + 5*b.cfg.ControlTimeout
				if took := time.Since(start); took > budget {
					t.Errorf("Stop took %s; the termination grace counts %s for it (drain timeout + 5 × lifecycle timeout)", took, budget)
				}
			})
		})
	}
}

// TestListenerHoldEndsWhenTheDrainGetsThrough: a drain that failed at
// first and that a renewal's replay then gets through ends the hold: the
// registry routes nothing new here any more, so the listener stays up for
// the linger after the control plane accepted the drain (an action routed
// just before is on its way) and the shutdown goes on, without waiting
// for the ready lease granted before the drain to expire.
func TestListenerHoldEndsWhenTheDrainGetsThrough(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, func(c *hostsdk.Config) {
			c.LeaseTTL, c.HeartbeatInterval, c.DrainTimeout, c.DrainLinger = 30*time.Second, 3*time.Second, time.Minute, 2*time.Second
		})
		ctx := b.awaitFirstBeat(t)
		synctest.Wait()
		st, _ := b.cp.Replica(b.cfg.ReplicaID)
		b.cp.FailNext(2, hostsdktest.FaultUnavailable) // the drain and its resend: nothing applied
		stopped := make(chan error, 1)
		go func() { stopped <- b.h.Stop(ctx) }()
		// The first renewal, 3 s into the drain, replays it: accepted.
		time.Sleep(4 * time.Second)
		resp, err := b.d.Act(ctx, hostsdktest.TargetOf(b.h, b.cfg), action(capEcho, `{"message":"routed just before the drain"}`))
		if err != nil {
			t.Fatalf("an action sent 4 s into the shutdown, a second after the drain was accepted (within the 2 s linger after it), got no signed answer: %v", err)
		}
		wantCode(t, resp, http.StatusServiceUnavailable, hostsdk.CodeNotReady)
		if now, _ := b.cp.Replica(b.cfg.ReplicaID); now.Status != aip.ReplicaDraining {
			t.Fatalf("4 s into the shutdown the registry holds the replica %s; want draining (the first renewal replays the drain)", now.Status)
		}
		select {
		case err := <-stopped:
			if err == nil {
				t.Error("Stop = nil; the first drain transition failed, so the shutdown is unclean")
			}
		case <-time.After(time.Until(st.LeaseExpiresAt)):
			t.Fatalf("the shutdown still runs at %s, when the lease granted before the drain expires; the drain was accepted 3 s into it", st.LeaseExpiresAt)
		}
		if now, _ := b.cp.Replica(b.cfg.ReplicaID); now.Status != aip.ReplicaOffline {
			t.Errorf("after the shutdown the registry holds the replica %s; want offline", now.Status)
		}
	})
}
