package hostsdk_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
)

// bubbleFleet is a fleet inside a testing/synctest bubble: the control plane
// is reached in memory and the host listens on a MemListener.
type bubbleFleet struct {
	cp     *hostsdktest.ControlPlane
	d      *hostsdktest.Dispatcher
	client *http.Client
	cfg    hostsdk.Config
	h      *hostsdk.Host
	conn   *testConnector
}

func newBubbleFleet(t *testing.T, edit func(*hostsdk.Config)) *bubbleFleet {
	t.Helper()
	return newWrappedBubbleFleet(t, edit, nil)
}

// newWrappedBubbleFleet is newBubbleFleet with the test connector wrapped
// by wrap (nil: not wrapped) before the host gets it.
func newWrappedBubbleFleet(t *testing.T, edit func(*hostsdk.Config), wrap func(*testConnector) hostsdk.Connector) *bubbleFleet {
	t.Helper()
	ttl := 30 * time.Second
	if edit != nil {
		var c hostsdk.Config
		edit(&c)
		if c.LeaseTTL != 0 {
			ttl = c.LeaseTTL
		}
	}
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{InMemory: true, LeaseTTL: ttl})
	ml := hostsdktest.NewMemListener()
	client := ml.Client()
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain, Client: client})
	cfg := hostsdktest.HostConfig(t, cp, d, ml)
	cfg.Journal = memjournal.New()
	if edit != nil {
		edit(&cfg)
	}
	conn := newTestConnector()
	var hc hostsdk.Connector = conn
	if wrap != nil {
		hc = wrap(conn)
	}
	h := hostsdktest.StartHost(t, cfg, hc)
	return &bubbleFleet{cp: cp, d: d, client: client, cfg: cfg, h: h, conn: conn}
}

// awaitFirstBeat waits for the registration and the first heartbeat and
// returns the context the test goes on with.
func (b *bubbleFleet) awaitFirstBeat(t *testing.T) context.Context {
	t.Helper()
	ctx := context.Background()
	if err := b.cp.Await(ctx, func(o []hostsdktest.Operation) bool { return len(o) >= 2 }); err != nil {
		t.Fatal(err)
	}
	return ctx
}

// startBlocked sends an action that blocks in the connector until
// b.conn.release is closed, waits until it runs, and returns the channel
// its answer arrives on.
func (b *bubbleFleet) startBlocked(t *testing.T, ctx context.Context) <-chan *hostsdktest.Response {
	t.Helper()
	target := hostsdktest.TargetOf(b.h, b.cfg)
	done := make(chan *hostsdktest.Response, 1)
	go func() {
		resp, err := b.d.Act(ctx, target, action(capBlock, `{"message":"slow"}`))
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	<-b.conn.started
	return done
}

// metric reads one sample from the host's /metrics.
func (b *bubbleFleet) metric(t *testing.T, name string) float64 {
	t.Helper()
	v, ok := scrapeMetric(t, b.client, name)
	if !ok {
		t.Fatalf("metric %s not found", name)
	}
	return v
}

func opsOf(cp *hostsdktest.ControlPlane, op aip.Operation) []hostsdktest.Operation {
	var out []hostsdktest.Operation
	for _, o := range cp.Operations() {
		if o.Op == op {
			out = append(out, o)
		}
	}
	return out
}

func TestFirstHeartbeatJitter(t *testing.T) {
	// Several hosts in one bubble: each first beat falls in [7.5s, 12.5s]
	// after registration (the exact bounds are tested in
	// TestFirstBeatDelayBounds).
	for range 3 {
		synctest.Test(t, func(t *testing.T) {
			b := newBubbleFleet(t, nil)
			if err := b.cp.Await(context.Background(), func(o []hostsdktest.Operation) bool { return len(o) >= 2 }); err != nil {
				t.Fatal(err)
			}
			o := b.cp.Operations()
			if o[0].Op != aip.OpRegister || o[1].Op != aip.OpHeartbeat {
				t.Fatalf("operations %v %v", o[0].Op, o[1].Op)
			}
			if d := o[1].At.Sub(o[0].At); d < 7500*time.Millisecond || d > 12500*time.Millisecond {
				t.Errorf("first heartbeat %s after registration, want within [7.5s, 12.5s]", d)
			}
			if o[1].PreviousSequence != o[0].Sequence || !o[1].ConnectorReady {
				t.Errorf("heartbeat %+v after register %+v", o[1], o[0])
			}
		})
	}
}

func TestMissedTicksAreSkipped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, func(c *hostsdk.Config) {
			c.HealthProbeTimeout = 30 * time.Second
			c.LeaseTTL = 60 * time.Second
		})
		b.awaitFirstBeat(t)
		t1 := time.Now()
		// The next probe takes 25s: the beat due at t1+10 goes out at
		// t1+35; the grid slots t1+20 and t1+30 are skipped, not replayed.
		b.conn.probeDelay.Store(int64(25 * time.Second))
		time.Sleep(15 * time.Second)
		b.conn.probeDelay.Store(0)
		time.Sleep(40 * time.Second) // to t1+55
		var got []time.Duration
		for _, o := range opsOf(b.cp, aip.OpHeartbeat) {
			got = append(got, o.At.Sub(t1))
		}
		want := []time.Duration{0, 35 * time.Second, 40 * time.Second, 50 * time.Second}
		if len(got) != len(want) {
			t.Fatalf("heartbeats at %v after the first, want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("heartbeats at %v after the first, want %v", got, want)
			}
		}
	})
}

func TestLeaseExpiryAndRecovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, nil)
		b.awaitFirstBeat(t)
		// t1: the first heartbeat renewed the lease to t1+30.
		b.cp.SetUnavailable(true)
		time.Sleep(25 * time.Second) // t1+25: beats at +10, +20 and their retries failed
		// Each failed attempt (a request and its resend) counts.
		failedBeats := func() float64 {
			n := 0
			for _, o := range opsOf(b.cp, aip.OpHeartbeat) {
				if o.Fault == hostsdktest.FaultUnavailable {
					n++
				}
			}
			return float64(n / 2)
		}
		if got, want := b.metric(t, hostsdk.MetricHeartbeatFailures), failedBeats(); got != want || got <= 2 {
			t.Errorf("heartbeat failures %v, want %v: the beats at +10 and +20 and their retries", got, want)
		}
		if !b.h.Ready() {
			t.Error("a failed heartbeat must not drop a valid lease")
		}
		time.Sleep(10 * time.Second) // t1+35: the lease expired at +30; recovery at +30 was ambiguous
		if b.h.Ready() {
			t.Error("host is ready after its lease expired")
		}
		regs := opsOf(b.cp, aip.OpRegister)
		if len(regs) != 3 || regs[1].RequestID != regs[2].RequestID {
			t.Fatalf("register attempts %+v: want one ambiguous attempt sent twice with the same ID", regs)
		}
		ambiguousID := regs[1].RequestID

		// +40: a definitive rejection of the pending request.
		b.cp.SetUnavailable(false)
		b.cp.FailNext(1, hostsdktest.FaultReject)
		time.Sleep(10 * time.Second)
		regs = opsOf(b.cp, aip.OpRegister)
		if len(regs) != 4 || regs[3].RequestID != ambiguousID || regs[3].Outcome != aip.OutcomeRejected {
			t.Fatalf("after an ambiguous failure the same request must be reused: %+v", regs[3])
		}
		// +50: a fresh request ID; its answer is lost, the resend replays it.
		b.cp.FailNext(1, hostsdktest.FaultDropResponse)
		time.Sleep(10 * time.Second)
		regs = opsOf(b.cp, aip.OpRegister)
		if len(regs) != 6 {
			t.Fatalf("register attempts %d, want 6", len(regs))
		}
		if fresh := regs[4].RequestID; fresh == ambiguousID || regs[5].RequestID != fresh || !regs[5].Replayed || regs[5].Outcome != aip.OutcomeLease {
			t.Fatalf("after a rejection a fresh request must be used and replayed after the lost answer: %+v %+v", regs[4], regs[5])
		}
		if !b.h.Ready() {
			t.Fatal("host is not ready after lease recovery")
		}
		for name, want := range map[string]float64{
			hostsdk.MetricHeartbeatFailures:     failedBeats() + 2, // and the recoveries at +30, +40
			hostsdk.MetricLeaseRecoveryAttempts: 3,                 // +30, +40, +50
			hostsdk.MetricLeaseRecoveries:       1,
		} {
			if got := b.metric(t, name); got != want {
				t.Errorf("%s = %v, want %v", name, got, want)
			}
		}

		// An unhealthy host reports connector_ready=false, goes offline and
		// does not re-register until it is healthy again.
		b.conn.setHealth(errUnhealthy)
		time.Sleep(20 * time.Second) // +60 heartbeat (not ready), +70 nothing
		hbs := opsOf(b.cp, aip.OpHeartbeat)
		if last := hbs[len(hbs)-1]; last.ConnectorReady || last.Outcome != aip.OutcomeLease {
			t.Errorf("unhealthy heartbeat %+v", last)
		}
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaOffline {
			t.Errorf("replica is %s after an unhealthy heartbeat", st.Status)
		}
		if got := b.metric(t, hostsdk.MetricLeaseRecoveryAttempts); got != 3 {
			t.Errorf("an unhealthy host attempted recovery: attempts %v", got)
		}
		if got := b.metric(t, hostsdk.MetricReady); got != 0 {
			t.Errorf("ready gauge %v while unhealthy", got)
		}
		b.conn.setHealth(nil)
		time.Sleep(10 * time.Second) // +80: healthy again, re-registers
		if got := b.metric(t, hostsdk.MetricLeaseRecoveries); got != 2 || !b.h.Ready() {
			t.Errorf("recoveries %v, ready %v after health returned", got, b.h.Ready())
		}
	})
}

func TestDrainInBubbleSendsOfflineLast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, nil)
		time.Sleep(time.Minute)
		if err := b.h.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		o := b.cp.Operations()
		if o[len(o)-1].Op != aip.OpOffline || o[len(o)-2].Op != aip.OpDrain {
			t.Fatalf("last operations %v %v", o[len(o)-2].Op, o[len(o)-1].Op)
		}
		n := len(o)
		time.Sleep(time.Minute)
		if len(b.cp.Operations()) != n {
			t.Error("heartbeats continued after shutdown")
		}
	})
}

// A lease recovery whose registration committed but whose answers were all
// lost is replayed later with the same request ID. If the control plane was
// unreachable for longer than the lease, the replay answers the committed
// lease, which has expired by then: that is no recovery. The host must not
// count or log it as one, and registers afresh (the replica is eligible: its
// lease expired).
func TestReplayedRecoveryWithExpiredLeaseIsNoRecovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, nil)
		b.awaitFirstBeat(t)
		// t1: the first heartbeat renewed the lease to t1+30.
		b.cp.SetUnavailable(true)
		// Beats at +10, +20 and their retries failed, the last retry a
		// second before the lease runs out at +30.
		time.Sleep(29500 * time.Millisecond)
		b.cp.SetUnavailable(false)
		b.cp.FailNext(2, hostsdktest.FaultDropResponse)
		time.Sleep(5500 * time.Millisecond) // +35: recovery at +30 commits, both answers lost
		regs := opsOf(b.cp, aip.OpRegister)
		if len(regs) != 3 || regs[1].RequestID != regs[2].RequestID || regs[2].Fault != hostsdktest.FaultDropResponse {
			t.Fatalf("register attempts %+v: want one committed recovery whose answers were dropped", regs)
		}
		b.cp.SetUnavailable(true)
		time.Sleep(40 * time.Second) // +70: the committed lease (to +60) expired meanwhile
		b.cp.SetUnavailable(false)
		time.Sleep(10 * time.Second) // +80: the pending request is replayed
		regs = opsOf(b.cp, aip.OpRegister)
		var replayed bool
		for _, r := range regs {
			replayed = replayed || r.Replayed
		}
		if !replayed {
			t.Fatalf("register attempts %+v: want the committed recovery replayed", regs)
		}
		if !b.h.Ready() {
			if got := b.metric(t, hostsdk.MetricLeaseRecoveries); got != 0 {
				t.Errorf("lease recoveries %v while the host holds no valid lease", got)
			}
		}
		time.Sleep(10 * time.Second) // +90
		if !b.h.Ready() {
			t.Fatalf("host not ready after the control plane returned: %+v", opsOf(b.cp, aip.OpRegister))
		}
		if got := b.metric(t, hostsdk.MetricLeaseRecoveries); got != 1 {
			t.Errorf("lease recoveries %v, want 1", got)
		}
	})
}

// The heartbeat prunes the replay registry of every expired message ID, not
// only a first batch: a replica receiving more messages per heartbeat
// interval than one batch holds would otherwise grow it without bound.
func TestHeartbeatPrunesAllExpiredMessageIDs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, nil)
		ctx := context.Background()
		const n = 1000
		past := time.Now().Add(-time.Hour)
		for range n {
			if ok, err := b.cfg.Journal.ClaimMessage(ctx, aip.NewMessageID(), past.Add(time.Minute), past); err != nil || !ok {
				t.Fatal(ok, err)
			}
		}
		if err := b.cp.Await(ctx, func(o []hostsdktest.Operation) bool { return len(o) >= 2 }); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the first heartbeat tick has finished
		left, err := b.cfg.Journal.PruneMessages(ctx, time.Now(), 10*n)
		if err != nil {
			t.Fatal(err)
		}
		if left != 0 {
			t.Errorf("%d of %d expired message IDs left after a heartbeat", left, n)
		}
	})
}

// A replica its own unhealthy heartbeat took offline holds no lease: on
// SIGTERM there is no routing left to drain, and the control plane refuses
// a drain of an offline replica. The host goes straight to the offline
// transition, and the shutdown is clean.
func TestStopWhileOfflineSkipsTheDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, nil)
		b.conn.setHealth(errUnhealthy)
		time.Sleep(15 * time.Second) // the first heartbeat reports connector_ready=false
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaOffline {
			t.Fatalf("replica is %s after an unhealthy heartbeat", st.Status)
		}
		if err := b.h.Stop(context.Background()); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if got, want := ops(b.cp), []aip.Operation{aip.OpRegister, aip.OpHeartbeat, aip.OpOffline}; !slices.Equal(got, want) {
			t.Errorf("operations %v, want %v", got, want)
		}
	})
}

// stuckHealth is a connector whose health check, once stuck, ignores its
// context until released.
type stuckHealth struct {
	*testConnector
	stuck   atomic.Bool
	release chan struct{}
}

func (c *stuckHealth) CheckHealth(ctx context.Context) error {
	if c.stuck.Load() {
		<-c.release
		return errUnhealthy
	}
	return nil
}

// The probe timeout bounds the health check even when the connector ignores
// its context: the heartbeat goes on (reporting connector_ready=false)
// instead of waiting for the check, and the lease is not lost silently.
func TestHealthProbeTimeoutBoundsAStuckCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{InMemory: true})
		ml := hostsdktest.NewMemListener()
		d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain, Client: ml.Client()})
		cfg := hostsdktest.HostConfig(t, cp, d, ml)
		cfg.Journal = memjournal.New()
		conn := &stuckHealth{testConnector: newTestConnector(), release: make(chan struct{})}
		hostsdktest.StartHost(t, cfg, conn)
		defer close(conn.release) // the check returns at last, before the host stops

		conn.stuck.Store(true)
		time.Sleep(20 * time.Second) // the first heartbeat is due within 12.5s; the probe times out after 2s
		hbs := opsOf(cp, aip.OpHeartbeat)
		if len(hbs) == 0 {
			t.Fatal("no heartbeat: the stuck health check held the heartbeat worker")
		}
		if hbs[0].ConnectorReady {
			t.Errorf("heartbeat %+v reports a connector whose check timed out as ready", hbs[0])
		}
	})
}

type panickyHealth struct{ *testConnector }

func (panickyHealth) CheckHealth(ctx context.Context) error { panic("health check bug") }

// A health check that panics makes the replica not ready; it does not end
// the process (the check runs on a goroutine of the host's).
func TestPanickingHealthCheckIsNotReady(t *testing.T) {
	f := newFleet(t)
	err := startErr(t, f, panickyHealth{newTestConnector()})
	var pe *hostsdk.ProbeError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "health check bug") {
		t.Fatalf("Start: %v, want a *ProbeError naming the panic", err)
	}
}

// A heartbeat the control plane applied but whose answers (the send and its
// resend) were both lost has moved the lease sequence on. The retry of the
// beat (within a second) replays that same request and learns the
// sequence, so the replica stays ready; a fresh request with the old
// previous_sequence would be refused (the fence) and leave the replica
// unable to act until its lease ran out.
func TestLostHeartbeatAnswerIsReplayed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, nil)
		b.awaitFirstBeat(t)
		b.cp.FailNext(2, hostsdktest.FaultDropResponse)
		time.Sleep(11 * time.Second) // the beat at +10 commits; both answers are lost; its retry by +11
		hbs := opsOf(b.cp, aip.OpHeartbeat)
		if len(hbs) != 4 {
			t.Fatalf("heartbeats %+v: want the first beat, one committed beat whose answers were dropped, and its retry", hbs)
		}
		lost, next := hbs[1], hbs[3]
		if lost.Fault != hostsdktest.FaultDropResponse || hbs[2].RequestID != lost.RequestID || hbs[2].Fault != hostsdktest.FaultDropResponse {
			t.Fatalf("heartbeats %+v: want one committed beat whose answers were dropped", hbs)
		}
		if next.RequestID != lost.RequestID || !next.Replayed || next.Outcome != aip.OutcomeLease {
			t.Fatalf("the retry after the lost answers %+v; want the same request replayed", next)
		}
		time.Sleep(10 * time.Second) // and a fresh one after it, at +20
		hbs = opsOf(b.cp, aip.OpHeartbeat)
		if last := hbs[len(hbs)-1]; last.RequestID == lost.RequestID || last.Outcome != aip.OutcomeLease {
			t.Fatalf("the following beat %+v; want a fresh request renewing the lease", last)
		}
		if !b.h.Ready() {
			t.Fatal("host is not ready")
		}
		if regs := opsOf(b.cp, aip.OpRegister); len(regs) != 1 {
			t.Errorf("register attempts %d, want only the first", len(regs))
		}
	})
}

// A drain right after a heartbeat whose answers were lost replays that beat
// first, so the drain and offline transitions carry the sequence it moved
// to and the shutdown is clean.
func TestDrainAfterALostHeartbeatAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, nil)
		ctx := b.awaitFirstBeat(t)
		b.cp.FailNext(2, hostsdktest.FaultDropResponse)
		time.Sleep(11 * time.Second) // the beat commits; both answers are lost
		if err := b.h.Stop(ctx); err != nil {
			t.Fatalf("shutdown after a lost heartbeat answer: %v", err)
		}
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaOffline {
			t.Errorf("replica is %s after shutdown", st.Status)
		}
	})
}

// A drain the control plane applied but whose answers were both lost has
// moved the lease sequence on; the offline transition replays it first, so
// the replica still goes offline instead of staying draining until its
// lease runs out.
func TestOfflineAfterALostDrainAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, nil)
		ctx := b.awaitFirstBeat(t)
		b.cp.FailNext(2, hostsdktest.FaultDropResponse) // the drain and its resend
		err := b.h.Stop(ctx)
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaOffline {
			t.Fatalf("replica is %s after shutdown (Stop: %v); want offline", st.Status, err)
		}
		if err == nil || !strings.Contains(err.Error(), "drain") {
			t.Errorf("Stop = %v; the drain's lost answers still make the shutdown unclean", err)
		}
	})
}

// TestLeaseEndsOnTheHostsClock: a control plane whose clock is 4 s ahead of
// the host's (within the 5 s the lifecycle window allows) grants a 30 s
// lease; the host holds it for 30 s from sending the heartbeat on its own
// clock, not until the control plane's absolute expiry read on the host's
// clock (4 s longer: 4 s of actions after lease maintenance released the
// replica's reservations).
func TestLeaseEndsOnTheHostsClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ahead = 4 * time.Second
		cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{InMemory: true, LeaseTTL: 30 * time.Second,
			Now: func() time.Time { return time.Now().Add(ahead) }})
		ml := hostsdktest.NewMemListener()
		d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain, Client: ml.Client()})
		cfg := hostsdktest.HostConfig(t, cp, d, ml)
		cfg.Journal = memjournal.New()
		h := hostsdktest.StartHost(t, cfg, newTestConnector())
		if err := cp.Await(context.Background(), func(o []hostsdktest.Operation) bool { return len(o) >= 2 }); err != nil {
			t.Fatal(err)
		}
		cp.SetUnavailable(true)
		beats := opsOf(cp, aip.OpHeartbeat)
		sentHere := beats[len(beats)-1].At.Add(-ahead) // the beat, on the host's clock
		time.Sleep(time.Until(sentHere.Add(29 * time.Second)))
		if !h.Ready() {
			t.Fatal("the host dropped its lease before 30 s")
		}
		time.Sleep(2 * time.Second) // 31 s after the beat
		if h.Ready() {
			t.Fatal("the host still holds its lease 31 s after the beat that renewed it for 30 s (it read the control plane's expiry on its own, slower clock)")
		}
	})
}

// TestDrainRenewsItsLeaseWhileActionsRun: a drain that outlasts the lease it
// was granted (actions still running) renews the draining lease each
// heartbeat interval, so the registry keeps the replica draining — lease
// maintenance would take it offline and release the reservations of the
// actions still running — and the offline transition comes from the
// current sequence once they finished.
func TestDrainRenewsItsLeaseWhileActionsRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, func(c *hostsdk.Config) {
			c.LeaseTTL, c.HeartbeatInterval, c.DrainTimeout = 10*time.Second, 3*time.Second, time.Minute
		})
		ctx := b.awaitFirstBeat(t)
		done := b.startBlocked(t, ctx)
		stopped := make(chan error, 1)
		go func() { stopped <- b.h.Stop(ctx) }()
		time.Sleep(25 * time.Second) // 2.5 leases into the drain
		st, ok := b.cp.Replica(b.cfg.ReplicaID)
		if !ok || st.Status != aip.ReplicaDraining || !st.LeaseExpiresAt.After(time.Now()) {
			t.Fatalf("25 s into a drain with an action running, the control plane holds %+v; want draining with a live lease", st)
		}
		if n := len(opsOf(b.cp, aip.OpDrain)); n < 5 {
			t.Errorf("%d drain transitions in 25 s at a 3 s interval, want the drain and its renewals", n)
		}
		close(b.conn.release)
		if resp := <-done; resp == nil {
			t.Error("the running action got no answer")
		} else if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
			t.Errorf("the running action: %+v, %v", res, err)
		}
		if err := <-stopped; err != nil {
			t.Fatalf("shutdown: %v", err)
		}
		o := b.cp.Operations()
		if last := o[len(o)-1]; last.Op != aip.OpOffline || last.Outcome != aip.OutcomeOffline {
			t.Fatalf("last operation %+v, want an accepted offline", last)
		}
		// The renewals stopped with the drain.
		n := len(b.cp.Operations())
		time.Sleep(time.Minute)
		if len(b.cp.Operations()) != n {
			t.Error("lifecycle requests after the shutdown")
		}
	})
}

// TestShortGrantedLeaseIsReported: a control plane granting 10 s leases to
// a host that beats every 6 s (its own --lease-ttl-ms allows that) makes
// the lease lapse between beats; the host says so at registration, with
// what to change.
func TestShortGrantedLeaseIsReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, c := range []struct {
			ttl  time.Duration
			warn bool
		}{{10 * time.Second, true}, {12 * time.Second, false}} {
			cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{InMemory: true, LeaseTTL: c.ttl})
			ml := hostsdktest.NewMemListener()
			d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain, Client: ml.Client()})
			cfg := hostsdktest.HostConfig(t, cp, d, ml)
			cfg.Journal = memjournal.New()
			cfg.HeartbeatInterval = 6 * time.Second
			var logs hostsdktest.LogBuffer
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			h := hostsdktest.StartHost(t, cfg, newTestConnector())
			if got := strings.Contains(logs.String(), "lease shorter than two heartbeat intervals"); got != c.warn {
				t.Errorf("granted lease %s, heartbeat 6s: warned %v, want %v\n%s", c.ttl, got, c.warn, logs.String())
			}
			if err := h.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
}
