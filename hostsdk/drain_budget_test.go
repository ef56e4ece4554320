package hostsdk_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// hungControlPlane passes lifecycle requests to next until hang or refuse
// is set. With hang it answers none: each request waits until its context
// ends (the attempt's ControlTimeout, or its caller's cancellation), as
// with a control plane that stopped answering. With refuse every dial
// fails as on a port nothing listens on (the request is not sent).
type hungControlPlane struct {
	next   http.RoundTripper
	hang   atomic.Bool
	refuse atomic.Bool
}

func (h *hungControlPlane) RoundTrip(r *http.Request) (*http.Response, error) {
	if h.refuse.Load() {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	if h.hang.Load() {
		<-r.Context().Done()
		return nil, context.Cause(r.Context())
	}
	return h.next.RoundTrip(r)
}

// newHungFleet is a bubble fleet (leases of ttl, heartbeats every 3 s, a
// drain of up to a minute, 5 s lifecycle timeouts) whose control plane
// can be made to stop answering or refuse connections.
func newHungFleet(t *testing.T, ttl time.Duration) (*bubbleFleet, *hungControlPlane) {
	t.Helper()
	var hung *hungControlPlane
	b := newBubbleFleet(t, func(c *hostsdk.Config) {
		c.LeaseTTL, c.HeartbeatInterval, c.DrainTimeout = ttl, 3*time.Second, time.Minute
		c.ControlTimeout = 5 * time.Second
		hung = &hungControlPlane{next: c.ControlPlaneTransport}
		c.ControlPlaneTransport = hung
	})
	return b, hung
}

// TestShutdownDoesNotWaitForARenewalInFlight: the shutdown's lifecycle
// requests stay within the termination-grace budget's share for them
// (docs/operator-guide.md: 5 × the lifecycle timeout) when the control
// plane stops answering during a drain whose first transition's answers
// were lost. The renewals then replay that drain every heartbeat
// interval, each replay taking up to two lifecycle timeouts; the
// shutdown waited for the one in flight before its offline step (which
// replays the drain again, then sends the offline), so Stop returned
// 29 s after the drain's last action ended instead of 20 s. A renewal cut
// short is a drain whose outcome is unknown like any other: the offline
// step replays it.
func TestShutdownDoesNotWaitForARenewalInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, hung := newHungFleet(t, 10*time.Second)
		ctx := b.awaitFirstBeat(t)
		done := b.startBlocked(t, ctx)
		b.cp.FailNext(2, hostsdktest.FaultDropResponse) // the drain and its resend: applied, answers lost
		stopped := make(chan error, 1)
		go func() { stopped <- b.h.Stop(ctx) }()
		if err := b.cp.Await(ctx, hasOp(aip.OpDrain)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		hung.hang.Store(true)
		// The first renewal (3 s into the drain) replays the drain; it
		// waits 2 × 5 s for answers that do not come.
		time.Sleep(4 * time.Second)
		released := time.Now()
		close(b.conn.release)
		if resp := <-done; resp == nil || resp.Status != 200 {
			t.Errorf("the running action got no result: %+v", resp)
		}
		err := <-stopped
		if err == nil {
			t.Error("Stop = nil; the drain and offline transitions failed")
		}
		budget := 5 * b.cfg.ControlTimeout
		if took := time.Since(released); took > budget {
			t.Errorf("Stop returned %s after the drain's last action ended; the lifecycle requests' share of the termination grace is %s (5 × the lifecycle timeout)", took, budget)
		}
	})
}

// TestShutdownLifecycleStepsStayWithinTheirBudget: with a heartbeat whose
// answers were lost pending and then a control plane that stopped
// answering, the shutdown's drain step replayed the heartbeat (two
// lifecycle timeouts) before its drain (two more), and the offline step
// replayed the heartbeat and the drain before the offline: ten lifecycle
// timeouts where the termination grace counts five. Each step now has
// two, replays included. (The host's lease, 10 s from the beat before the
// lost one, runs out during the drain step, so the shutdown does not hold
// its listener for it: TestListenerStaysUpWhileAFailedDrainLeavesTheReplicaRoutable.)
func TestShutdownLifecycleStepsStayWithinTheirBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, hung := newHungFleet(t, 10*time.Second)
		ctx := b.awaitFirstBeat(t)
		beats := len(opsOf(b.cp, aip.OpHeartbeat))
		b.cp.FailNext(2, hostsdktest.FaultDropResponse) // the next beat and its resend: applied, answers lost
		if err := b.cp.Await(ctx, func(ops []hostsdktest.Operation) bool {
			n := 0
			for _, o := range ops {
				if o.Op == aip.OpHeartbeat {
					n++
				}
			}
			return n >= beats+2
		}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		hung.hang.Store(true)
		start := time.Now()
		if err := b.h.Stop(ctx); err == nil {
			t.Error("Stop = nil; the drain and offline transitions failed")
		}
		budget := b.cfg.DrainLinger + 5*b.cfg.ControlTimeout
		if took := time.Since(start); took > budget {
			t.Errorf("Stop took %s with no action in flight; the drain linger and the lifecycle requests' share of the termination grace are %s", took, budget)
		}
	})
}

// TestShutdownWithoutControlPlaneKeepsTheDrainTimeout: a host stopped
// while its control plane does not answer (stopped, hung) exits within
// the drain timeout (two lifecycle timeouts when those are longer: the
// drain request and its resend), as docs/operator-guide.md ("When the
// control plane goes away") says. The drain's requests (two lifecycle
// timeouts), then the hold until the lease expired (up to a drain timeout
// after them), then the offline's requests (two more) added up: 25 s
// with aipfleet dev's settings (5 s drain timeout, 15 s leases), 40 s with
// a 20 s drain timeout. The shutdown's error ends saying what is left to
// do: nothing, the lease runs out by itself; check with fleet status.
func TestShutdownWithoutControlPlaneKeepsTheDrainTimeout(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ttl, drain time.Duration
	}{
		{"aipfleet dev's settings", 15 * time.Second, 5 * time.Second},
		{"drain timeout shorter than the lease", 30 * time.Second, 20 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var hung *hungControlPlane
				b := newBubbleFleet(t, func(c *hostsdk.Config) {
					c.LeaseTTL, c.HeartbeatInterval, c.DrainTimeout = tc.ttl, 3*time.Second, tc.drain
					c.ControlTimeout = 5 * time.Second
					hung = &hungControlPlane{next: c.ControlPlaneTransport}
					c.ControlPlaneTransport = hung
				})
				ctx := b.awaitFirstBeat(t)
				synctest.Wait()
				hung.hang.Store(true)
				start := time.Now()
				err := b.h.Stop(ctx)
				took := time.Since(start)
				if err == nil {
					t.Fatal("Stop = nil; the drain and offline transitions failed")
				}
				if bound := max(b.cfg.DrainTimeout, 2*b.cfg.ControlTimeout); took > bound {
					t.Errorf("Stop took %s with the control plane not answering; the operator guide bounds it by %s", took, bound)
				}
				for _, want := range []string{"registry offline transition", "runs out by itself", "`aipfleet fleet status`"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("the shutdown error does not say %q:\n%v", want, err)
					}
				}
			})
		})
	}
}
