package hostsdk_test

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// drainWithActionRunning starts a bubble fleet (10 s leases, heartbeats
// every 3 s, a drain that waits up to a minute), starts an action that
// blocks until released, runs faults (which queues control-plane faults
// at the right moment) and Stop. It returns the fleet, the Stop result's
// channel and the blocked action's answer's.
func drainWithActionRunning(t *testing.T, faults func(b *bubbleFleet, ctx context.Context)) (*bubbleFleet, <-chan error, <-chan *hostsdktest.Response) {
	t.Helper()
	b := newBubbleFleet(t, func(c *hostsdk.Config) {
		c.LeaseTTL, c.HeartbeatInterval, c.DrainTimeout = 10*time.Second, 3*time.Second, time.Minute
	})
	ctx := b.awaitFirstBeat(t)
	done := b.startBlocked(t, ctx)
	stopped := make(chan error, 1)
	faults(b, ctx)
	go func() { stopped <- b.h.Stop(ctx) }()
	return b, stopped, done
}

// finishDrain releases the blocked action and checks that the shutdown
// ends with the replica offline in the registry.
func finishDrain(t *testing.T, b *bubbleFleet, stopped <-chan error, done <-chan *hostsdktest.Response) error {
	t.Helper()
	close(b.conn.release)
	if resp := <-done; resp == nil || resp.Status != 200 {
		t.Errorf("the running action got no result: %+v", resp)
	}
	err := <-stopped
	if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaOffline {
		t.Errorf("after the shutdown (Stop: %v) the registry holds the replica %s; want offline", err, st.Status)
	}
	return err
}

// liveDraining fails the test unless the registry holds the replica
// draining with a live lease.
func liveDraining(t *testing.T, b *bubbleFleet, when string) {
	t.Helper()
	st, ok := b.cp.Replica(b.cfg.ReplicaID)
	if !ok || st.Status != aip.ReplicaDraining || !st.LeaseExpiresAt.After(time.Now()) {
		t.Fatalf("%s, the control plane holds %+v; want draining with a live lease", when, st)
	}
}

// TestFailedDrainReplayIsKeptForTheNextAttempt: a renewal of the draining
// lease whose answers were lost (applied: the registry is a sequence
// ahead), then whose replay fails too (the control plane unavailable for
// a moment), stays pending: the next renewal replays it again, learns the
// sequence, and renews from there, and the offline transition comes from
// the current sequence. The failed replay was forgotten: every later
// renewal was sent from the old sequence and refused, the draining lease
// lapsed in the registry with the action still running, and the offline
// was refused too, leaving the replica draining there.
func TestFailedDrainReplayIsKeptForTheNextAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, stopped, done := drainWithActionRunning(t, func(*bubbleFleet, context.Context) {})
		ctx := context.Background()
		if err := b.cp.Await(ctx, hasOp(aip.OpDrain)); err != nil {
			t.Fatal(err)
		}
		b.cp.FailNext(2, hostsdktest.FaultDropResponse) // the first renewal and its resend: applied, answers lost
		b.cp.FailNext(2, hostsdktest.FaultUnavailable)  // its replay at the next renewal and the resend
		time.Sleep(25 * time.Second)                    // 2.5 leases into the drain
		liveDraining(t, b, "25 s into a drain whose renewal's replay failed once")
		if err := finishDrain(t, b, stopped, done); err != nil {
			t.Errorf("shutdown: %v; want clean (the lost renewal was learned on replay)", err)
		}
	})
}

// TestFailedDrainIsRetriedByTheRenewals: a drain transition that did not
// get through at the start of the shutdown is replayed at each renewal
// interval while the drain lasts, so the registry does not go on routing
// actions to a replica that refuses them (the control plane unavailable:
// nothing applied) nor let the draining lease it granted lapse (the
// answers lost: applied). Without a first drain confirmed, no renewal ran:
// the registry held the replica ready, or draining with a lease that ran
// out, until the offline transition.
func TestFailedDrainIsRetriedByTheRenewals(t *testing.T) {
	for _, fault := range []hostsdktest.Fault{hostsdktest.FaultUnavailable, hostsdktest.FaultDropResponse} {
		t.Run(fault.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, stopped, done := drainWithActionRunning(t, func(b *bubbleFleet, _ context.Context) {
					b.cp.FailNext(2, fault) // the drain and its resend
				})
				time.Sleep(5 * time.Second)
				liveDraining(t, b, "5 s into a drain whose transition failed at first")
				time.Sleep(20 * time.Second)
				liveDraining(t, b, "25 s into a drain whose transition failed at first")
				err := finishDrain(t, b, stopped, done)
				if err == nil {
					t.Error("Stop = nil; the failed drain transition makes the shutdown unclean")
				}
			})
		})
	}
}

// TestOfflineRefusedAfterAnUnsettledDrainSaysWhy: a drain whose answers
// were lost, and whose replay before the offline transition fails too,
// leaves the host a sequence behind the registry: the offline is refused
// (the fence), and the shutdown's error says why and what it leaves — the
// replica draining in the registry until its lease expires — rather than
// only that the offline was refused. (The drain timeout, 5 s, is shorter
// than the heartbeat interval: the shutdown holds its listener for the
// lease, its drain not confirmed, only that long, and no renewal replays
// the drain before the offline step.)
func TestOfflineRefusedAfterAnUnsettledDrainSaysWhy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, func(c *hostsdk.Config) { c.DrainTimeout = 5 * time.Second })
		ctx := b.awaitFirstBeat(t)
		b.cp.FailNext(2, hostsdktest.FaultDropResponse) // the drain and its resend: applied, answers lost
		b.cp.FailNext(2, hostsdktest.FaultUnavailable)  // its replay before the offline, and the resend
		err := b.h.Stop(ctx)
		if err == nil || !strings.Contains(err.Error(), "may keep the replica draining until its lease expires") {
			t.Fatalf("Stop = %v; want the offline's refusal explained by the drain whose outcome is unknown", err)
		}
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaDraining {
			t.Errorf("the registry holds the replica %s; the test expects the drain applied and the offline refused", st.Status)
		}
	})
}
