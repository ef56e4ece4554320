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
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
)

// crashedReplica starts a bubble fleet and stops its host while the control
// plane is unavailable, so that neither the drain nor the offline gets
// through: the registry keeps the replica ready with a live lease, as after
// a kill -9. It returns the fleet and when that lease expires.
func crashedReplica(t *testing.T) (*bubbleFleet, time.Time) {
	t.Helper()
	b := newCrashableFleet(t, nil)
	b.awaitFirstBeat(t)
	return b, b.crash(t)
}

// newCrashableFleet is the bubble fleet crashedReplica crashes (wrap as
// newWrappedBubbleFleet's).
func newCrashableFleet(t *testing.T, wrap func(*testConnector) hostsdk.Connector) *bubbleFleet {
	t.Helper()
	return newWrappedBubbleFleet(t, func(c *hostsdk.Config) {
		c.LeaseTTL, c.HeartbeatInterval, c.DrainTimeout, c.ControlTimeout = 20*time.Second, 5*time.Second, time.Second, time.Second
	}, wrap)
}

// crash stops the fleet's host while the control plane is unavailable (see
// crashedReplica) and returns when the lease the registry keeps expires.
func (b *bubbleFleet) crash(t *testing.T) time.Time {
	t.Helper()
	ctx := context.Background()
	b.cp.SetUnavailable(true)
	if err := b.h.Stop(ctx); err == nil {
		t.Fatal("Stop with the control plane unavailable was clean")
	}
	b.cp.SetUnavailable(false)
	st, _ := b.cp.Replica(b.cfg.ReplicaID)
	if st.Status != aip.ReplicaReady || !st.LeaseExpiresAt.After(time.Now()) {
		t.Fatalf("after the unclean stop the registry holds %+v; want ready with a live lease", st)
	}
	return st.LeaseExpiresAt
}

// TestRegistrationWaitsForThePreviousLease: a replica started again while
// the lease of its previous run is live in the registry (that run stopped
// without going offline) is refused (lease_live); it registers again, with
// a new request, once that lease has expired, instead of failing its start
// (which made a supervisor's restart loop, or a systemd start limit, the
// only way back).
func TestRegistrationWaitsForThePreviousLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, expires := crashedReplica(t)
		cfg := b.cfg
		cfg.Journal, cfg.Listener = memjournal.New(), hostsdktest.NewMemListener()
		h := hostsdktest.StartHost(t, cfg, newTestConnector())
		if !time.Now().After(expires) {
			t.Fatalf("registered at %s, before the previous lease expired at %s", time.Now(), expires)
		}
		var regs []hostsdktest.Operation
		for _, o := range opsOf(b.cp, aip.OpRegister) {
			if o.At.After(expires.Add(-20 * time.Second)) {
				regs = append(regs, o)
			}
		}
		if len(regs) < 2 || regs[0].Outcome != aip.OutcomeRejected || regs[len(regs)-1].Outcome != aip.OutcomeLease {
			t.Fatalf("registrations of the second run: %+v; want refused (lease_live), then granted", regs)
		}
		if regs[0].RequestID == regs[len(regs)-1].RequestID {
			t.Fatal("the registration was resent under the same request ID; want a new request")
		}
		if len(regs) > 4 {
			t.Errorf("%d registrations while waiting 20 s for the lease; want it to wait for the expiry the refusal names", len(regs))
		}
		if st, _ := b.cp.Replica(cfg.ReplicaID); st.Status != aip.ReplicaReady || !h.Ready() {
			t.Fatalf("after the wait the registry holds %+v, host ready %v", st, h.Ready())
		}
	})
}

// TestSIGTERMWhileWaitingForThePreviousLeaseIsClean: a stop requested
// while the start waits for the previous lease to expire ends the start
// cleanly: nothing was registered.
func TestSIGTERMWhileWaitingForThePreviousLeaseIsClean(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, expires := crashedReplica(t)
		cfg := b.cfg
		cfg.Journal, cfg.Listener = memjournal.New(), hostsdktest.NewMemListener()
		h, err := hostsdk.New(cfg, newTestConnector())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- h.Run(ctx) }()
		if err := b.cp.Await(context.Background(), func(ops []hostsdktest.Operation) bool {
			n := 0
			for _, o := range ops {
				if o.Op == aip.OpRegister && o.Outcome == aip.OutcomeRejected {
					n++
				}
			}
			return n > 0
		}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if !time.Now().Before(expires) {
			t.Fatal("the previous lease expired before the stop was requested")
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run stopped while waiting for the previous lease = %v; want a clean stop", err)
		}
	})
}

// TestLeaseLiveForTooLongFailsTheStart: a lease that stays live (another
// process heartbeats under this replica ID) fails the start once the wait
// passed MaxLeaseTTL, naming the likely cause.
func TestLeaseLiveForTooLongFailsTheStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, func(c *hostsdk.Config) {
			c.LeaseTTL, c.HeartbeatInterval = 20*time.Second, 5*time.Second
		})
		b.awaitFirstBeat(t)
		cfg := b.cfg
		cfg.Journal, cfg.Listener = memjournal.New(), hostsdktest.NewMemListener()
		h, err := hostsdk.New(cfg, newTestConnector())
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err = h.Start(context.Background())
		if err == nil || !strings.Contains(err.Error(), "another process may hold this replica ID") {
			t.Fatalf("Start beside a live replica with the same ID = %v; want the wait's failure naming the cause", err)
		}
		if waited := time.Since(start); waited < hostsdk.MaxLeaseTTL || waited > hostsdk.MaxLeaseTTL+time.Minute {
			t.Errorf("gave up after %s; want a little over MaxLeaseTTL (%s)", waited, hostsdk.MaxLeaseTTL)
		}
	})
}
