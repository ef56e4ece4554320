package hostsdk_test

import (
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// applyThenHang passes lifecycle requests to next; once armed, the next
// request is passed on (the control plane decides it and answers), its
// answer is thrown away, and the attempt then waits until its context
// ends, as when a control plane commits a request but its answer never
// arrives.
type applyThenHang struct {
	next  http.RoundTripper
	armed atomic.Bool
}

func (a *applyThenHang) RoundTrip(r *http.Request) (*http.Response, error) {
	if !a.armed.CompareAndSwap(true, false) {
		return a.next.RoundTrip(r)
	}
	resp, err := a.next.RoundTrip(r)
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	<-r.Context().Done()
	return nil, context.Cause(r.Context())
}

// TestResendAfterALongTimeoutIsStillInItsWindow: with a lifecycle timeout
// of 30 s (the most --control-timeout-ms allows), a heartbeat the control
// plane applied but whose answer never came back is sent again when its
// attempt times out, 30 s after it was signed: its signed window (30 s) has
// run out by then. The resend went out byte-identical, so the control plane
// refused it as expired, definitively; the host took that for a decision,
// dropped the beat it may have applied and sent a fresh one from the old
// sequence, which the control plane refused (the applied beat had moved
// the sequence on), beat after beat, until the lease ran out. The resend
// is now the same request re-signed with a fresh window when the old one
// no longer covers it, and the control plane answers it with the lease it
// committed.
func TestResendAfterALongTimeoutIsStillInItsWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hang *applyThenHang
		b := newBubbleFleet(t, func(c *hostsdk.Config) {
			c.LeaseTTL, c.HeartbeatInterval, c.ControlTimeout = 2*time.Minute, 10*time.Second, hostsdk.MaxControlTimeout
			hang = &applyThenHang{next: c.ControlPlaneTransport}
			c.ControlPlaneTransport = hang
		})
		b.awaitFirstBeat(t)
		beats := len(opsOf(b.cp, aip.OpHeartbeat))
		hang.armed.Store(true)
		time.Sleep(45 * time.Second) // the next beat is applied, its answer lost; the resend 30 s later
		hbs := opsOf(b.cp, aip.OpHeartbeat)
		if len(hbs) < beats+2 {
			t.Fatalf("heartbeats %+v: want the hung beat and its resend", hbs)
		}
		hung, resend := hbs[beats], hbs[beats+1]
		if resend.RequestID != hung.RequestID || resend.Outcome != aip.OutcomeLease || !resend.Replayed || resend.Sequence != hung.Sequence {
			t.Errorf("the resend of the applied beat %+v was answered %+v; want the lease it committed, replayed", hung, resend)
		}
		time.Sleep(time.Minute)
		if rej := rejectedOps(b.cp, aip.OpHeartbeat); len(rej) > 0 {
			t.Errorf("heartbeats rejected: %+v", rej)
		}
		if got := b.metric(t, hostsdk.MetricHeartbeatFailures); got != 0 {
			t.Errorf("heartbeat failures %v, want 0: the resend learnt the applied beat's lease", got)
		}
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaReady || !b.h.Ready() {
			t.Errorf("replica %s, host ready %v; want both ready", st.Status, b.h.Ready())
		}
	})
}
