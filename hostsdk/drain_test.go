package hostsdk_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

func hasOp(op aip.Operation) func([]hostsdktest.Operation) bool {
	return func(ops []hostsdktest.Operation) bool {
		return slices.ContainsFunc(ops, func(o hostsdktest.Operation) bool { return o.Op == op })
	}
}

func TestDrainWithActionsInFlight(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	h, target := f.start(t, conn)
	ctx := ctxT(t)

	inflight := []*aip.Action{action(capBlock, `{"message":"a"}`), action(capBlock, `{"message":"b"}`)}
	results := make(chan *hostsdktest.Response, len(inflight))
	for _, a := range inflight {
		go func() {
			resp, err := f.d.Act(ctx, target, a)
			if err != nil {
				t.Error(err)
			}
			results <- resp
		}()
		<-conn.started
	}

	stopped := make(chan error, 1)
	go func() { stopped <- h.Stop(ctx) }()
	if err := f.cp.Await(ctx, hasOp(aip.OpDrain)); err != nil {
		t.Fatal(err)
	}
	// Draining: new actions get the signed 503, the listener still answers.
	refused := action(capEcho, `{"message":"new"}`)
	env, err := f.d.Envelope(target, aip.Body{Action: refused}, f.d.Route(target, refused.ID, refused.CapabilityID, ""))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := f.d.Sign(env)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.d.Post(ctx, target, raw, env.MessageID)
	if err != nil {
		t.Fatal(err)
	}
	pe := wantCode(t, resp, http.StatusServiceUnavailable, hostsdk.CodeNotReady)
	if pe.RetryAfterMS == nil || *pe.RetryAfterMS != uint64(hostsdk.DefaultHeartbeatInterval.Milliseconds()) || !pe.IsRetryable() {
		t.Errorf("not_ready error %+v", pe)
	}
	// The refused envelope entered the replay registry: it can never execute.
	resp, err = f.d.Post(ctx, target, raw, env.MessageID)
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, resp, http.StatusConflict, hostsdk.CodeReplay)
	// Status queries still work while draining.
	if st, _, err := f.d.Status(ctx, target, inflight[0].ID, capBlock); err != nil || st.State != aip.StateRunning {
		t.Errorf("status while draining: %+v, %v", st, err)
	}
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned %v with actions in flight", err)
	default:
	}
	close(conn.release)
	for range inflight {
		if res, err := (<-results).Result(); err != nil || res.Status != aip.ResultCompleted {
			t.Errorf("in-flight action: %+v, %v", res, err)
		}
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if diff := cmp.Diff([]aip.Operation{aip.OpRegister, aip.OpDrain, aip.OpOffline}, ops(f.cp)); diff != "" {
		t.Errorf("lifecycle operations (-want +got):\n%s", diff)
	}
	if st, _ := f.cp.Replica(f.cfg.ReplicaID); st.Status != aip.ReplicaOffline {
		t.Errorf("replica is %s after shutdown", st.Status)
	}
	if err := h.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestShutdownReportsFailures(t *testing.T) {
	t.Run("drain rejected", func(t *testing.T) {
		f := newFleet(t)
		// The listener stays up while the lease the drain did not end
		// lives, for at most the drain timeout.
		f.cfg.DrainTimeout = 200 * time.Millisecond
		h, _ := f.start(t, newTestConnector())
		f.cp.FailNext(1, hostsdktest.FaultReject)
		err := h.Stop(ctxT(t))
		var se *hostsdk.ShutdownError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), "registry drain") || strings.Contains(err.Error(), "offline") {
			t.Fatalf("Stop: %v", err)
		}
		// The offline transition still went out, last.
		if got := ops(f.cp); got[len(got)-1] != aip.OpOffline {
			t.Errorf("operations %v", got)
		}
	})
	t.Run("offline unavailable", func(t *testing.T) {
		f := newFleet(t)
		h, _ := f.start(t, newTestConnector())
		f.cp.FailNext(1, 0) // drain goes through
		f.cp.FailNext(2, hostsdktest.FaultUnavailable)
		err := h.Stop(ctxT(t))
		if !errors.Is(err, hostsdk.ErrControlUnavailable) || !strings.Contains(err.Error(), "registry offline transition") {
			t.Fatalf("Stop: %v", err)
		}
		// One byte-identical resend after the ambiguous failure.
		o := f.cp.Operations()
		last, prev := o[len(o)-1], o[len(o)-2]
		if last.Op != aip.OpOffline || prev.Op != aip.OpOffline || last.RequestID != prev.RequestID {
			t.Errorf("offline attempts %+v %+v", prev, last)
		}
	})
	t.Run("drain timeout", func(t *testing.T) {
		f := newFleet(t)
		f.cfg.DrainTimeout = 50 * time.Millisecond
		conn := newTestConnector()
		h, target := f.start(t, conn)
		ctx := ctxT(t)
		done := make(chan *hostsdktest.Response, 1)
		a := action(capBlock, `{"message":"stuck"}`)
		go func() {
			resp, _ := f.d.Act(ctx, target, a)
			done <- resp
		}()
		<-conn.started
		err := h.Stop(ctx)
		if !strings.Contains(errString(err), "actions: 1 action still running at the drain timeout cancelled") {
			t.Fatalf("Stop: %v", err)
		}
		// Cancelled before the server shut down, it was answered on its
		// connection.
		if resp := <-done; resp == nil {
			t.Error("the cancelled action got no answer")
		} else {
			wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown)
		}
		if st, _ := f.j.Action(context.Background(), a.ID); st.Status != aip.StateOutcomeUnknown {
			t.Errorf("interrupted action is %s, want outcome_unknown", st.Status)
		}
	})
}

func TestStopBeforeStartAndIdempotent(t *testing.T) {
	f := newFleet(t)
	h, err := hostsdk.New(f.cfg, newTestConnector())
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Stop(ctxT(t)); err != nil {
		t.Fatalf("Stop before Start: %v", err)
	}
	if err := h.Start(ctxT(t)); !errors.Is(err, hostsdk.ErrAlreadyStarted) {
		t.Fatalf("Start after Stop: %v", err)
	}
}

func TestStopHonoursItsDeadline(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	h, target := f.start(t, conn)
	ctx := ctxT(t)
	done := make(chan struct{})
	go func() {
		f.d.Act(ctx, target, action(capBlock, `{"message":"hold"}`))
		close(done)
	}()
	<-conn.started
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := h.Stop(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop past its deadline: %v", err)
	}
	close(conn.release)
	<-done
	if err := h.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestRunDrainsOnCancel(t *testing.T) {
	f := newFleet(t)
	conn := &eventSourceConnector{testConnector: newTestConnector(), running: make(chan struct{})}
	h, err := hostsdk.New(f.cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	errc := make(chan error, 1)
	go func() { errc <- h.Run(ctx) }()
	<-conn.running // step 10 started the event source: the host serves
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if conn.err != nil || conn.published == "" {
		t.Errorf("publish while serving: %q, %v", conn.published, conn.err)
	}
	if n, _ := f.j.PendingEvents(context.Background()); n != 1 {
		t.Errorf("outbox holds %d batches, want 1", n)
	}
	if diff := cmp.Diff([]aip.Operation{aip.OpRegister, aip.OpDrain, aip.OpOffline}, ops(f.cp)); diff != "" {
		t.Errorf("operations (-want +got):\n%s", diff)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// eventSourceConnector publishes one event when it starts, then waits.
type eventSourceConnector struct {
	*testConnector
	running   chan struct{}
	published string
	err       error
}

func (c *eventSourceConnector) RunEvents(ctx context.Context, events *hostsdk.EventPublisher) error {
	c.published, c.err = events.Publish(ctx, "test.events", aip.Event{Kind: "test.started"})
	close(c.running)
	<-ctx.Done()
	return ctx.Err()
}

// cancelAfterRegister cancels the bootstrap context once the register
// answer has been received, so the failure happens after registration.
type cancelAfterRegister struct {
	next   http.RoundTripper
	cancel context.CancelFunc
	once   sync.Once
}

func (c *cancelAfterRegister) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	c.once.Do(c.cancel) // the first lifecycle request is register
	return resp, err
}

// A bootstrap cancelled after the replica registered takes it offline
// instead of leaving it ready until its lease expires.
func TestCancelledStartAfterRegisterGoesOffline(t *testing.T) {
	f := newFleet(t)
	ctx, cancel := context.WithCancel(ctxT(t))
	rt := f.cfg.ControlPlaneTransport
	if rt == nil {
		rt = http.DefaultTransport
	}
	f.cfg.ControlPlaneTransport = &cancelAfterRegister{next: rt, cancel: cancel}
	h, err := hostsdk.New(f.cfg, newTestConnector())
	if err != nil {
		t.Fatal(err)
	}
	err = h.Start(ctx)
	var stepErr hostsdk.StepError
	if !errors.As(err, &stepErr) || stepErr.Step() < hostsdk.StepRegister {
		t.Fatalf("Start = %v, want a failure from register on", err)
	}
	if diff := cmp.Diff([]aip.Operation{aip.OpRegister, aip.OpOffline}, ops(f.cp)); diff != "" {
		t.Errorf("lifecycle operations (-want +got):\n%s", diff)
	}
	if st, _ := f.cp.Replica(f.cfg.ReplicaID); st.Status != aip.ReplicaOffline {
		t.Errorf("replica is %s after a failed start", st.Status)
	}
}

// The listener keeps answering for DrainLinger after the drain began, even
// with nothing in flight: an action routed just before the registry saw the
// drain gets the signed not_ready, which proves it did not start here.
func TestDrainLingerRefusesWithSignedNotReady(t *testing.T) {
	f := newFleet(t)
	f.cfg.DrainLinger = 3 * time.Second
	h, target := f.start(t, newTestConnector())
	ctx := ctxT(t)

	stopped := make(chan error, 1)
	go func() { stopped <- h.Stop(ctx) }()
	if err := f.cp.Await(ctx, hasOp(aip.OpDrain)); err != nil {
		t.Fatal(err)
	}
	resp, err := f.d.Act(ctx, target, action(capEcho, `{"message":"late"}`))
	if err != nil {
		t.Fatalf("an action sent during the linger got no answer: %v", err)
	}
	wantCode(t, resp, http.StatusServiceUnavailable, hostsdk.CodeNotReady)
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
}

// A connection that was opened but never carried a request does not hold
// the shutdown: with a 1 s drain timeout the shutdown is still clean.
func TestShutdownClosesUnusedConnections(t *testing.T) {
	f := newFleet(t)
	f.cfg.DrainTimeout = time.Second
	h, _ := f.start(t, newTestConnector())
	conn, err := net.Dial("tcp", h.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := h.Stop(ctxT(t)); err != nil {
		t.Fatalf("Stop with an unused connection open: %v", err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatal("the unused connection is still open after shutdown")
	}
}

// failAfterFirst passes the first lifecycle request on and fails the
// others without sending them.
type failAfterFirst struct {
	next http.RoundTripper
	n    atomic.Int32
}

func (f *failAfterFirst) RoundTrip(r *http.Request) (*http.Response, error) {
	if f.n.Add(1) > 1 {
		return nil, errors.New("test: control plane unreachable")
	}
	return f.next.RoundTrip(r)
}

// TestShutdownWhileStartingIsClean: Run whose context is cancelled while
// the host starts (SIGTERM during bootstrap) returns nil when the start
// left nothing behind — the replica registered and went offline again —
// so a supervisor sees a clean stop; when the offline fails, and the
// replica stays registered until its lease ends, Run says so.
func TestShutdownWhileStartingIsClean(t *testing.T) {
	for _, offlineFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("offline fails %v", offlineFails), func(t *testing.T) {
			f := newFleet(t)
			ctx, cancel := context.WithCancel(ctxT(t))
			rt := f.cfg.ControlPlaneTransport
			if rt == nil {
				rt = http.DefaultTransport
			}
			if offlineFails {
				rt = &failAfterFirst{next: rt}
			}
			f.cfg.ControlPlaneTransport = &cancelAfterRegister{next: rt, cancel: cancel}
			h, err := hostsdk.New(f.cfg, newTestConnector())
			if err != nil {
				t.Fatal(err)
			}
			err = h.Run(ctx)
			switch {
			case !offlineFails && err != nil:
				t.Fatalf("Run cancelled while starting, offline confirmed: %v; want nil", err)
			case offlineFails && (err == nil || !errors.Is(err, context.Canceled)):
				t.Fatalf("Run cancelled while starting, offline failed: %v; want the start's error", err)
			}
			want := []aip.Operation{aip.OpRegister, aip.OpOffline}
			if offlineFails {
				want = want[:1]
			}
			if diff := cmp.Diff(want, ops(f.cp)); diff != "" {
				t.Errorf("lifecycle operations (-want +got):\n%s", diff)
			}
		})
	}
}

// signalDuringRegister cancels the host's context the way
// signal.NotifyContext does on SIGTERM (with a cause that does not wrap
// context.Canceled) while the first lifecycle request, register, is in
// flight, before it reaches the control plane.
type signalDuringRegister struct {
	next   http.RoundTripper
	cancel context.CancelCauseFunc
	once   sync.Once
}

func (s *signalDuringRegister) RoundTrip(r *http.Request) (*http.Response, error) {
	first := false
	s.once.Do(func() { first = true })
	if first {
		s.cancel(errors.New("terminated signal received"))
		<-r.Context().Done()
	}
	return s.next.RoundTrip(r)
}

// TestShutdownDuringRegistrationIsClean: a SIGTERM that arrives while the
// registration is in flight is a shutdown requested while starting, as
// one between two steps is: the registration's outcome is settled (here:
// it is replayed, committed, and taken offline) and Run returns nil. The
// HTTP client reports such a cancellation as the context's cause
// ("terminated signal received"), not context.Canceled, and Run took it
// for a failed start: the process exited 1 and logged a failed step.
func TestShutdownDuringRegistrationIsClean(t *testing.T) {
	f := newFleet(t)
	var logs hostsdktest.LogBuffer
	f.cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	ctx, cancel := context.WithCancelCause(ctxT(t))
	defer cancel(nil)
	rt := f.cfg.ControlPlaneTransport
	if rt == nil {
		rt = http.DefaultTransport
	}
	f.cfg.ControlPlaneTransport = &signalDuringRegister{next: rt, cancel: cancel}
	h, err := hostsdk.New(f.cfg, newTestConnector())
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Run(ctx); err != nil {
		t.Fatalf("Run with SIGTERM during the registration: %v; want nil (nothing left registered)", err)
	}
	if diff := cmp.Diff([]aip.Operation{aip.OpRegister, aip.OpOffline}, ops(f.cp)); diff != "" {
		t.Errorf("lifecycle operations (-want +got):\n%s", diff)
	}
	if strings.Contains(logs.String(), "bootstrap step failed") {
		t.Errorf("the shutdown was logged as a failed step:\n%s", logs.String())
	}
}

// TestFailedStartSaysWhatItLeftBehind: a start whose registration's
// outcome stays unknown (the control plane unreachable for the replay too)
// says, in Run's error, that the replica may stay registered until its
// lease expires; the error named only the failed step, and the warning
// was in the log alone.
func TestFailedStartSaysWhatItLeftBehind(t *testing.T) {
	f := newFleet(t)
	rt := f.cfg.ControlPlaneTransport
	if rt == nil {
		rt = http.DefaultTransport
	}
	f.cfg.ControlPlaneTransport = &dropAll{next: rt}
	f.cfg.RegisterWait = 500 * time.Millisecond // it registers again once, then fails the start
	h, err := hostsdk.New(f.cfg, newTestConnector())
	if err != nil {
		t.Fatal(err)
	}
	err = h.Run(ctxT(t))
	var re *hostsdk.RegisterError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "may stay registered until its lease expires") {
		t.Fatalf("Run: %v; want the RegisterError saying the replica may stay registered", err)
	}
}

// TestFailedStartAfterARefusedConnectionLeavesNothing: a registration
// that never left the host (the control plane's port refused the
// connection) cannot have been committed: the failed start neither
// replays it nor says the replica may stay registered.
func TestFailedStartAfterARefusedConnectionLeavesNothing(t *testing.T) {
	f := newFleet(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now: every dial is refused
	u, err := url.Parse(f.cfg.ControlPlaneEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	f.cfg.ControlPlaneEndpoint = u.String()
	rt := f.cfg.ControlPlaneTransport
	if rt == nil {
		rt = http.DefaultTransport
	}
	tries := &countTries{next: rt}
	f.cfg.ControlPlaneTransport = tries
	f.cfg.RegisterWait = hostsdk.NoRegisterWait
	h, err := hostsdk.New(f.cfg, newTestConnector())
	if err != nil {
		t.Fatal(err)
	}
	err = h.Run(ctxT(t))
	var re *hostsdk.RegisterError
	if !errors.As(err, &re) {
		t.Fatalf("Run: %v; want a RegisterError", err)
	}
	if strings.Contains(err.Error(), "may stay registered") {
		t.Fatalf("Run: %v; nothing was sent, so nothing can stay registered", err)
	}
	// The registration's attempt and its one resend; no replay of it
	// (nor an offline) after the failed start.
	if n := tries.n.Load(); n != 2 {
		t.Errorf("%d lifecycle requests were tried; want 2 (the registration and its resend, no replay)", n)
	}
}

// countTries counts the lifecycle requests tried.
type countTries struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *countTries) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// dropAll sends every lifecycle request and loses every answer.
type dropAll struct{ next http.RoundTripper }

func (d *dropAll) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := d.next.RoundTrip(r)
	if err == nil {
		resp.Body.Close()
	}
	return nil, errors.New("test: connection reset")
}
