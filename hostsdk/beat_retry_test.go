package hostsdk_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// outageMode is how controlOutage fails the lifecycle requests it lets
// through to no control plane.
type outageMode int

const (
	outageOff         outageMode = iota
	outageRefuse                 // every dial fails (nothing listens): nothing is sent
	outageHang                   // connected, no answer until the attempt's timeout
	outageUnsigned               // an unsigned 502 from a proxy in front of it: nothing is decided
	outageDropAnswers            // the control plane decides each request; its answer is lost
)

// sentRequest is one lifecycle request that reached controlOutage.
type sentRequest struct {
	At        time.Time
	Op        aip.Operation
	RequestID string
	Failed    bool // controlOutage failed it; otherwise the control plane answered
}

// controlOutage sits between a host and its control plane. While its mode
// is set it fails the requests (of operation only, when set) as mode says;
// otherwise it passes them on. It records every request and the most it
// saw in flight at once.
type controlOutage struct {
	next http.RoundTripper
	only aip.Operation

	mu          sync.Mutex
	mode        outageMode
	sent        []sentRequest
	inFlight    int
	maxInFlight int
}

func (o *controlOutage) set(mode outageMode) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.mode = mode
}

func (o *controlOutage) RoundTrip(r *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	req, err := aip.OpenControlRequest(body)
	if err != nil {
		return nil, err
	}
	s := sentRequest{At: time.Now(), Op: req.Request.Command.Operation, RequestID: req.Request.RequestID}
	o.mu.Lock()
	mode := o.mode
	if o.only != "" && s.Op != o.only {
		mode = outageOff
	}
	s.Failed = mode != outageOff
	o.sent = append(o.sent, s)
	o.inFlight++
	o.maxInFlight = max(o.maxInFlight, o.inFlight)
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		o.inFlight--
		o.mu.Unlock()
	}()
	switch mode {
	case outageRefuse:
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	case outageHang:
		<-r.Context().Done()
		return nil, context.Cause(r.Context())
	case outageUnsigned:
		return &http.Response{StatusCode: http.StatusBadGateway, Header: http.Header{"Content-Type": {"text/plain"}},
			Body: io.NopCloser(strings.NewReader("bad gateway")), Request: r}, nil
	case outageDropAnswers:
		resp, err := o.next.RoundTrip(r)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	}
	return o.next.RoundTrip(r)
}

// requests returns the recorded requests of operation op ("": all).
func (o *controlOutage) requests(op aip.Operation) []sentRequest {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []sentRequest
	for _, s := range o.sent {
		if op == "" || s.Op == op {
			out = append(out, s)
		}
	}
	return out
}

func (o *controlOutage) failed(op aip.Operation) int {
	n := 0
	for _, s := range o.requests(op) {
		if s.Failed {
			n++
		}
	}
	return n
}

// newOutageFleet is a bubble fleet with leases of ttl, heartbeats every
// interval and lifecycle timeouts of 500 ms, whose control plane
// controlOutage can make unreachable.
func newOutageFleet(t *testing.T, ttl, interval time.Duration) (*bubbleFleet, *controlOutage) {
	t.Helper()
	var o *controlOutage
	b := newBubbleFleet(t, func(c *hostsdk.Config) {
		c.LeaseTTL, c.HeartbeatInterval, c.ControlTimeout = ttl, interval, 500*time.Millisecond
		o = &controlOutage{next: c.ControlPlaneTransport}
		c.ControlPlaneTransport = o
	})
	return b, o
}

// TestBeatRetriesRideOutAnOutageShorterThanTheLease: a control plane
// unreachable for 10 s, more than two heartbeat intervals (3 s) but less
// than the lease (12 s), starting just after a beat. A failed beat was
// retried only at the next tick: the beats at +3, +6 and +9 failed, the
// lease ran out at +12 (the tick due then comes too late), and the host
// refused actions and registered again although the control plane had
// been back for 2 s. A beat that failed for a reason that may pass is now
// retried with backoff before the next tick while the lease is valid, so
// the first retry after the outage renews the lease: no recovery, the
// replica never leaves routing. Each failed attempt, a tick's or a
// retry's (a request and its resend), counts in
// aip_connector_host_heartbeat_failures_total, and one lifecycle request
// at most is in flight at a time.
func TestBeatRetriesRideOutAnOutageShorterThanTheLease(t *testing.T) {
	for _, c := range []struct {
		name string
		mode outageMode // 0: the control plane's own signed 503s
	}{
		{"connection refused", outageRefuse},
		{"no answer", outageHang},
		{"unsigned 502", outageUnsigned},
		{"signed 503", outageOff},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const ttl, interval = 12 * time.Second, 3 * time.Second
				b, o := newOutageFleet(t, ttl, interval)
				b.awaitFirstBeat(t)
				t1 := time.Now() // the first beat renewed the lease to t1+12
				time.Sleep(100 * time.Millisecond)
				if c.mode == outageOff {
					b.cp.SetUnavailable(true)
				} else {
					o.set(c.mode)
				}
				time.Sleep(10 * time.Second) // to t1+10.1: the ticks at +3, +6, +9 and their retries fail
				if !b.h.Ready() {
					t.Error("host not ready during an outage shorter than its lease")
				}
				b.cp.SetUnavailable(false)
				o.set(outageOff)
				time.Sleep(6 * time.Second) // to t1+16.1, past the lease the outage would have cost
				failed := o.failed(aip.OpHeartbeat)
				for _, op := range opsOf(b.cp, aip.OpHeartbeat) {
					if op.Fault == hostsdktest.FaultUnavailable {
						failed++
					}
				}
				// An attempt whose first request failed and whose resend
				// got through is no failure.
				if got := b.metric(t, hostsdk.MetricHeartbeatFailures); got != float64(failed/2) || got <= 3 {
					t.Errorf("%s = %v after %d failed heartbeat requests; want one per failed attempt (a request and its resend), more than the 3 ticks'", hostsdk.MetricHeartbeatFailures, got, failed)
				}
				var renewed time.Time
				for _, op := range opsOf(b.cp, aip.OpHeartbeat) {
					if op.Outcome == aip.OutcomeLease && op.At.After(t1) {
						renewed = op.At
						break
					}
				}
				if renewed.IsZero() || !renewed.Before(t1.Add(ttl)) {
					t.Errorf("first renewal after the outage at t1+%s; want one before the lease ran out at t1+%s", renewed.Sub(t1), ttl)
				}
				if regs := opsOf(b.cp, aip.OpRegister); len(regs) != 1 {
					t.Errorf("registrations %+v; want only the first: the lease was never lost", regs)
				}
				if got := b.metric(t, hostsdk.MetricLeaseRecoveryAttempts); got != 0 {
					t.Errorf("%s = %v, want 0", hostsdk.MetricLeaseRecoveryAttempts, got)
				}
				if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaReady || !b.h.Ready() {
					t.Errorf("replica %s, host ready %v; want both ready", st.Status, b.h.Ready())
				}
				for _, op := range rejectedOps(b.cp, aip.OpHeartbeat) {
					if op.Fault == 0 {
						t.Errorf("heartbeat rejected: %+v", op)
					}
				}
				o.mu.Lock()
				most := o.maxInFlight
				o.mu.Unlock()
				if most != 1 {
					t.Errorf("%d lifecycle requests in flight at once; want one at a time", most)
				}
			})
		})
	}
}

// TestBeatRetryReplaysALostAnswerExactly: a retry that the control plane,
// back from an outage, applied but whose answers were lost is replayed by
// the next retry with the same request ID and payload, and the control
// plane answers it with the lease it committed: no fresh beat loses the
// fence, no re-registration.
func TestBeatRetryReplaysALostAnswerExactly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, o := newOutageFleet(t, 30*time.Second, 10*time.Second)
		b.awaitFirstBeat(t)
		t1 := time.Now()
		time.Sleep(100 * time.Millisecond)
		o.set(outageRefuse)
		time.Sleep(11 * time.Second) // to t1+11.1: the tick at +10 and its first retry (by +11) refused
		o.set(outageOff)
		b.cp.FailNext(2, hostsdktest.FaultDropResponse) // the next retry and its resend: applied, answers lost
		time.Sleep(8 * time.Second)                     // to t1+19.1, before the next tick
		hbs := opsOf(b.cp, aip.OpHeartbeat)
		if len(hbs) != 4 {
			t.Fatalf("heartbeats %+v: want the first beat, the retry whose answers were lost and its resend, and the replay", hbs)
		}
		lost, resend, replay := hbs[1], hbs[2], hbs[3]
		refused := o.requests(aip.OpHeartbeat)[1]
		if lost.Fault != hostsdktest.FaultDropResponse || resend.Fault != hostsdktest.FaultDropResponse || lost.RequestID != refused.RequestID {
			t.Fatalf("heartbeats %+v: want the beat refused at +10 (request %s) applied by a retry, its answers lost", hbs, refused.RequestID)
		}
		if (lost.At.Sub(t1))%(10*time.Second) == 0 || (replay.At.Sub(t1))%(10*time.Second) == 0 {
			t.Errorf("the lost beat at t1+%s and its replay at t1+%s; want both sent by retries, between the ticks", lost.At.Sub(t1), replay.At.Sub(t1))
		}
		if replay.RequestID != lost.RequestID || replay.Digest != lost.Digest || !replay.Replayed ||
			replay.Outcome != aip.OutcomeLease || replay.Sequence != lost.PreviousSequence+1 {
			t.Errorf("the retry after the lost answers %+v; want %s (digest %s) replayed and answered the lease it committed", replay, lost.RequestID, lost.Digest)
		}
		time.Sleep(5 * time.Second) // the tick at +20 renews from the replayed sequence
		hbs = opsOf(b.cp, aip.OpHeartbeat)
		if last := hbs[len(hbs)-1]; last.RequestID == lost.RequestID || last.Outcome != aip.OutcomeLease || last.PreviousSequence != replay.Sequence {
			t.Errorf("the tick after the replay %+v; want a fresh beat from sequence %d", last, replay.Sequence)
		}
		if rej := rejectedOps(b.cp, aip.OpHeartbeat); len(rej) > 0 {
			t.Errorf("heartbeats rejected: %+v", rej)
		}
		if regs := opsOf(b.cp, aip.OpRegister); len(regs) != 1 || !b.h.Ready() {
			t.Errorf("registrations %+v, host ready %v; want only the first, and ready", regs, b.h.Ready())
		}
	})
}

// TestNoFasterRetryAfterARefusal: a beat the control plane refused with
// its signed word (a definitive rejection; a lease it ended, whose fence
// the beat lost) is not retried before the next tick: a retry would be
// refused alike. After the refusal of a lease it ended, the next tick
// registers instead (the local lease ended with the refusal).
func TestNoFasterRetryAfterARefusal(t *testing.T) {
	for _, c := range []struct {
		name    string
		refuse  func(b *bubbleFleet)
		beats   []time.Duration // after t1, by t1+25
		refused int             // beats refused by t1+25
		regs    int             // registrations after t1, by t1+25
	}{
		{"rejected", func(b *bubbleFleet) { b.cp.FailNext(1, hostsdktest.FaultReject) }, []time.Duration{0, 10 * time.Second, 20 * time.Second}, 1, 0},
		{"lease ended", func(b *bubbleFleet) { b.cp.ExpireLease(b.cfg.ReplicaID) }, []time.Duration{0, 10 * time.Second}, 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBubbleFleet(t, nil)
				b.awaitFirstBeat(t)
				t1 := time.Now()
				time.Sleep(time.Second)
				c.refuse(b)
				time.Sleep(24 * time.Second) // to t1+25: ticks at +10 and +20
				hbs := opsOf(b.cp, aip.OpHeartbeat)
				var at []time.Duration
				for _, op := range hbs {
					at = append(at, op.At.Sub(t1))
				}
				if !slices.Equal(at, c.beats) {
					t.Errorf("heartbeats at t1+%v; want only the ticks at +%v", at, c.beats)
				}
				if regs := registersSince(b.cp, t1); len(regs) != c.regs || (c.regs > 0 && regs[0].At.Sub(t1) != 20*time.Second) {
					t.Errorf("registrations %+v; want %d, at the tick at +20", regs, c.regs)
				}
				if rej := rejectedOps(b.cp, aip.OpHeartbeat); len(rej) != c.refused {
					t.Errorf("refused heartbeats %+v; want %d", rej, c.refused)
				}
				if got := b.metric(t, hostsdk.MetricHeartbeatFailures); got != float64(c.refused) {
					t.Errorf("%s = %v, want %d", hostsdk.MetricHeartbeatFailures, got, c.refused)
				}
			})
		})
	}
}

// TestBeatRetriesStopWhenDraining: the retries of a beat that failed end
// when the host drains: from the drain on, a heartbeat is sent only as the
// shutdown's replay of the beat whose outcome is unknown, right before
// each of its drain and offline transitions, and nothing once it stopped.
func TestBeatRetriesStopWhenDraining(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, o := newOutageFleet(t, 30*time.Second, 10*time.Second)
		ctx := b.awaitFirstBeat(t)
		time.Sleep(100 * time.Millisecond)
		o.set(outageRefuse)
		time.Sleep(10200 * time.Millisecond) // the tick at t1+10 failed; a retry is due by +11
		stopping := time.Now()
		err := b.h.Stop(ctx)
		var se *hostsdk.ShutdownError
		if !errors.As(err, &se) {
			t.Errorf("Stop = %v; want a *ShutdownError: the drain and offline transitions were refused", err)
		}
		stopped := time.Now()
		time.Sleep(time.Minute)
		// A refused request fails at once: a transition and the replay
		// before it are sent at the same instant.
		transitions := map[time.Time]bool{}
		for _, s := range o.requests("") {
			if s.Op == aip.OpDrain || s.Op == aip.OpOffline {
				transitions[s.At] = true
			}
		}
		for _, s := range o.requests("") {
			if s.Op == aip.OpHeartbeat && !s.At.Before(stopping) && !transitions[s.At] {
				t.Errorf("heartbeat %s sent at +%s into the shutdown, not before a drain or offline transition", s.RequestID, s.At.Sub(stopping))
			}
			if s.At.After(stopped) {
				t.Errorf("%s %s sent %s after Stop returned", s.Op, s.RequestID, s.At.Sub(stopped))
			}
		}
	})
}
