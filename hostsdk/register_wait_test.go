package hostsdk_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
)

// waitFleet is a control plane (lease TTL 30 s) and the configuration of
// a host that is not started yet, inside a testing/synctest bubble, with
// the host's log.
type waitFleet struct {
	cp   *hostsdktest.ControlPlane
	cfg  hostsdk.Config
	logs *hostsdktest.LogBuffer
}

func newWaitFleet(t *testing.T) *waitFleet {
	t.Helper()
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{InMemory: true, LeaseTTL: 30 * time.Second})
	ml := hostsdktest.NewMemListener()
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain, Client: ml.Client()})
	cfg := hostsdktest.HostConfig(t, cp, d, ml)
	cfg.Journal = memjournal.New()
	logs := &hostsdktest.LogBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	return &waitFleet{cp: cp, cfg: cfg, logs: logs}
}

// start starts a host in the background; its Start's error arrives on the
// channel, and the host is stopped when the test ends.
func (w *waitFleet) start(t *testing.T, ctx context.Context) (*hostsdk.Host, <-chan error) {
	t.Helper()
	h, err := hostsdk.New(w.cfg, newTestConnector())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- h.Start(ctx) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		h.Stop(ctx)
	})
	return h, done
}

// granted returns the register operations the control plane answered with
// a lease.
func granted(cp *hostsdktest.ControlPlane) []hostsdktest.Operation {
	var out []hostsdktest.Operation
	for _, o := range opsOf(cp, aip.OpRegister) {
		if o.Outcome == aip.OutcomeLease {
			out = append(out, o)
		}
	}
	return out
}

// TestStartWaitsForTheControlPlane: a host started while the control
// plane restarts (here: answers its signed 503 for 40 s) failed its start
// after the registration's attempt and its resend, so every replica
// started meanwhile crash-looped under its supervisor (or stayed down).
// It now waits for the control plane, registering again with backoff,
// logs that it waits and for how long it waited, and registers once.
func TestStartWaitsForTheControlPlane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWaitFleet(t)
		w.cp.SetUnavailable(true)
		began := time.Now()
		h, done := w.start(t, context.Background())
		time.Sleep(40 * time.Second)
		select {
		case err := <-done:
			t.Fatalf("Start returned %v while the control plane was unavailable; want it to wait", err)
		default:
		}
		w.cp.SetUnavailable(false)
		back := time.Now()
		if err := <-done; err != nil {
			t.Fatalf("Start = %v; want the registration once the control plane is back", err)
		}
		if took := time.Since(back); took > 15*time.Second {
			t.Errorf("registered %s after the control plane was back; want within the longest backoff (10 s, +50%% jitter)", took)
		}
		regs := opsOf(w.cp, aip.OpRegister)
		if g := granted(w.cp); len(g) != 1 || g[0].Replayed {
			t.Fatalf("registrations granted: %+v; want exactly one", g)
		}
		// Backoff, not a busy loop: 1 s doubling to 10 s over 40 s is about
		// 8 attempts, each sent twice (the attempt and its resend).
		if len(regs) < 8 || len(regs) > 30 {
			t.Errorf("%d register requests in %s; want backoff from 1 s to 10 s", len(regs), time.Since(began))
		}
		if st, _ := w.cp.Replica(w.cfg.ReplicaID); st.Status != aip.ReplicaReady || !h.Ready() {
			t.Errorf("registry holds %+v, host ready %v; want it registered and ready", st, h.Ready())
		}
		logs := w.logs.String()
		for _, want := range []string{
			`level=WARN msg="the control plane is unavailable; waiting for it to answer the registration`,
			"control_plane=" + w.cfg.ControlPlaneEndpoint, "wait=2m0s", "--register-wait-ms",
			`msg="the control plane is still unavailable; registering again"`,
			`msg="registered after waiting for the control plane"`,
		} {
			if !strings.Contains(logs, want) {
				t.Errorf("the log does not say %q:\n%s", want, logs)
			}
		}
		if n := strings.Count(logs, "waiting for it to answer the registration"); n != 1 {
			t.Errorf("the wait was announced %d times; want once", n)
		}
		if n := strings.Count(logs, "still unavailable; registering again"); n > 40/5 {
			t.Errorf("%d retry lines in 40 s; want at most one every 5 s", n)
		}
	})
}

// TestStartGivesUpOnAControlPlaneThatNeverAnswers: the wait is bounded by
// --register-wait-ms; the start then fails with an error that names the
// control plane and the setting, having sent nothing the failed start
// must take back (every attempt was refused with the signed 503).
func TestStartGivesUpOnAControlPlaneThatNeverAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWaitFleet(t)
		w.cfg.RegisterWait = 30 * time.Second
		w.cp.SetUnavailable(true)
		began := time.Now()
		_, done := w.start(t, context.Background())
		err := <-done
		waited := time.Since(began)
		var re *hostsdk.RegisterError
		if !errors.As(err, &re) || !errors.Is(err, hostsdk.ErrControlUnavailable) {
			t.Fatalf("Start = %v; want a RegisterError wrapping ErrControlUnavailable", err)
		}
		for _, want := range []string{w.cfg.ControlPlaneEndpoint, "--register-wait-ms", "AIP_CONNECTOR_HOST_REGISTER_WAIT_MS", "30s"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Start = %v; want it to name %q", err, want)
			}
		}
		// The last attempt is made when the 30 s run out.
		if waited < 30*time.Second || waited > 30*time.Second+2*w.cfg.ControlTimeout {
			t.Errorf("gave up after %s; want 30 s (and the last attempt)", waited)
		}
		for _, o := range w.cp.Operations() {
			if o.Op != aip.OpRegister || o.Fault != hostsdktest.FaultUnavailable {
				t.Errorf("operation %+v; want only the registration's attempts, each refused 503 (nothing to replay or take offline)", o)
			}
		}
	})
}

// TestStartWaitReplaysALostRegistration: a registration the control plane
// applied but whose answers were lost, before an outage, is sent again
// during the wait as the same request (same request ID and payload): the
// control plane answers it with the lease it committed. A new request
// would be refused as lease_live (the lost registration's lease is live
// in the registry), and the host would wait for a lease that is its own.
func TestStartWaitReplaysALostRegistration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWaitFleet(t)
		w.cp.FailNext(2, hostsdktest.FaultDropResponse) // applied; the answers of the attempt and its resend are lost
		w.cp.SetUnavailable(true)                       // then an outage
		h, done := w.start(t, context.Background())
		time.Sleep(10 * time.Second)
		w.cp.SetUnavailable(false)
		back := time.Now()
		if err := <-done; err != nil {
			t.Fatalf("Start = %v; want the lost registration replayed", err)
		}
		if took := time.Since(back); took > 15*time.Second {
			t.Errorf("registered %s after the control plane was back; want no lease_live wait", took)
		}
		regs := opsOf(w.cp, aip.OpRegister)
		for _, o := range regs {
			if o.RequestID != regs[0].RequestID {
				t.Fatalf("register requests %+v; want every attempt to be the first request again", regs)
			}
			if strings.Contains(o.Message, aip.ControlRuleLeaseLive) {
				t.Fatalf("register refused as lease_live: %+v", o)
			}
		}
		last := regs[len(regs)-1]
		if last.Outcome != aip.OutcomeLease || !last.Replayed {
			t.Fatalf("last register %+v; want the replay answered with the committed lease", last)
		}
		st, _ := w.cp.Replica(w.cfg.ReplicaID)
		if st.Status != aip.ReplicaReady || st.HealthRevision != 1 || !h.Ready() {
			t.Errorf("registry holds %+v, host ready %v; want one registration (health revision 1), ready", st, h.Ready())
		}
	})
}

// TestStartWaitRegistersAgainAfterALostRegistrationExpired: a
// registration applied with its answers lost, then an outage longer than
// its lease: the replay is answered with the lease committed earlier,
// which has expired (the control plane's maintenance did not run), or
// refused (maintenance took the replica offline since: the replay rule).
// Either way the registration it replays is spent, and the host registers
// again with a new request instead of failing its start.
func TestStartWaitRegistersAgainAfterALostRegistrationExpired(t *testing.T) {
	for _, maintained := range []bool{false, true} {
		name := map[bool]string{false: "replay answers the expired lease", true: "replay refused after maintenance"}[maintained]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWaitFleet(t)
				w.cp.FailNext(2, hostsdktest.FaultDropResponse)
				w.cp.SetUnavailable(true)
				h, done := w.start(t, context.Background())
				time.Sleep(40 * time.Second) // the 30 s lease committed at 0 expired
				if maintained {
					w.cp.ExpireLease(w.cfg.ReplicaID)
				}
				w.cp.SetUnavailable(false)
				if err := <-done; err != nil {
					t.Fatalf("Start = %v; want a new registration", err)
				}
				regs := opsOf(w.cp, aip.OpRegister)
				last := regs[len(regs)-1]
				if last.RequestID == regs[0].RequestID || last.Outcome != aip.OutcomeLease || last.Replayed {
					t.Fatalf("register requests %+v; want a new request granted after the spent one", regs)
				}
				replay := regs[len(regs)-2]
				if replay.RequestID != regs[0].RequestID {
					t.Fatalf("register requests %+v; want the lost one replayed before the new one", regs)
				}
				if maintained && !strings.HasPrefix(replay.Message, "replay: ") {
					t.Errorf("replay answered %+v; want the replay rule's refusal", replay)
				}
				if st, _ := w.cp.Replica(w.cfg.ReplicaID); st.Status != aip.ReplicaReady || !h.Ready() {
					t.Errorf("registry holds %+v, host ready %v", st, h.Ready())
				}
			})
		})
	}
}

// openAfter fails the lifecycle requests of the first after (from the
// first one on) without sending them (a transport error: to the host,
// their outcome is unknown), then passes them to next.
type openAfter struct {
	next  http.RoundTripper
	after time.Duration
	mu    sync.Mutex
	first time.Time
}

func (o *openAfter) RoundTrip(r *http.Request) (*http.Response, error) {
	o.mu.Lock()
	if o.first.IsZero() {
		o.first = time.Now()
	}
	closed := time.Since(o.first) < o.after
	o.mu.Unlock()
	if closed {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, errors.New("connection reset by peer")
	}
	return o.next.RoundTrip(r)
}

// TestFailedStartAfterTheRegisterWaitGoesOffline: the wait's last attempt
// is applied and its answers are lost; the start fails, and (as a start
// failing at its first attempt did) replays that registration to learn
// that it was committed, then takes the replica offline rather than leave
// it routable with nobody serving it.
func TestFailedStartAfterTheRegisterWaitGoesOffline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWaitFleet(t)
		w.cfg.RegisterWait = 20 * time.Second
		// Requests reach the control plane only from the wait's last
		// attempt on (made when the 20 s from the first failed attempt run
		// out), whose answers are lost.
		w.cfg.ControlPlaneTransport = &openAfter{next: w.cfg.ControlPlaneTransport, after: w.cfg.RegisterWait}
		w.cp.FailNext(2, hostsdktest.FaultDropResponse)
		_, done := w.start(t, context.Background())
		err := <-done
		var re *hostsdk.RegisterError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), "--register-wait-ms") {
			t.Fatalf("Start = %v; want a RegisterError after the wait", err)
		}
		if strings.Contains(err.Error(), "may stay registered") {
			t.Errorf("Start = %v; the replay learned the outcome, and the replica went offline", err)
		}
		if st, _ := w.cp.Replica(w.cfg.ReplicaID); st.Status != aip.ReplicaOffline {
			t.Errorf("replica is %s after a failed start, want offline", st.Status)
		}
		regs := opsOf(w.cp, aip.OpRegister)
		if len(regs) != 3 || regs[1].RequestID != regs[0].RequestID || regs[2].RequestID != regs[0].RequestID || !regs[2].Replayed {
			t.Errorf("register requests %+v; want the last attempt, its resend, and its replay by the failed start", regs)
		}
		if diff := cmp.Diff([]aip.Operation{aip.OpRegister, aip.OpRegister, aip.OpRegister, aip.OpOffline}, ops(w.cp)); diff != "" {
			t.Errorf("lifecycle operations (-want +got):\n%s", diff)
		}
	})
}

// TestShutdownDuringTheRegisterWait: a shutdown requested while the start
// waits for the control plane ends the wait at once, and Run returns as
// for a shutdown requested while starting: cleanly, nothing registered.
func TestShutdownDuringTheRegisterWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWaitFleet(t)
		w.cp.SetUnavailable(true)
		h, err := hostsdk.New(w.cfg, newTestConnector())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- h.Run(ctx) }()
		time.Sleep(20 * time.Second)
		synctest.Wait()
		stop := time.Now()
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run stopped during the wait for the control plane = %v; want a clean stop", err)
		}
		if took := time.Since(stop); took > 0 {
			t.Errorf("Run returned %s after the stop; want at once", took)
		}
		if len(opsOf(w.cp, aip.OpRegister)) < 4 {
			t.Errorf("register requests %+v; want the wait to have registered again before the stop", w.cp.Operations())
		}
	})
}

// gaugeValue is the value of the unlabelled gauge name in h's metrics.
func gaugeValue(t *testing.T, h *hostsdk.Host, name string) float64 {
	t.Helper()
	mfs, err := h.MetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 && mf.GetMetric()[0].GetGauge() != nil {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s among the host's metrics", name)
	return 0
}

// TestRegisterWaitMetric: how long a start waited for a control plane
// that did not answer its registration was only in the log, which an
// operator cannot alert on. MetricRegisterWait says it, in seconds, once
// the host serves: 0 when the control plane answered at once, the wait's
// length when it did not.
func TestRegisterWaitMetric(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWaitFleet(t)
		h, done := w.start(t, context.Background())
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := gaugeValue(t, h, hostsdk.MetricRegisterWait); got != 0 {
			t.Errorf("%s = %v after a start the control plane answered at once, want 0", hostsdk.MetricRegisterWait, got)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		w := newWaitFleet(t)
		w.cp.SetUnavailable(true)
		h, done := w.start(t, context.Background())
		time.Sleep(40 * time.Second)
		w.cp.SetUnavailable(false)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// Waiting from the first failed attempt (each answered 503 at
		// once) until one answered, within the longest backoff (10 s,
		// +50% jitter) after the control plane was back.
		got := gaugeValue(t, h, hostsdk.MetricRegisterWait)
		if lo, hi := 40*time.Second, 55*time.Second; got < lo.Seconds() || got > hi.Seconds() {
			t.Errorf("%s = %v after a start that waited 40 s for the control plane, want %v to %v", hostsdk.MetricRegisterWait, got, lo.Seconds(), hi.Seconds())
		}
	})
}
