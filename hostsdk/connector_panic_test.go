package hostsdk_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

type panickingRoutes struct{ *testConnector }

func (panickingRoutes) Routes(ctx context.Context, rc *hostsdk.RouteContext) ([]hostsdk.Route, error) {
	panic("routes bug")
}

type panickingNamespaces struct{ *testConnector }

func (panickingNamespaces) ActionStateNamespaces() []string { panic("namespaces bug") }

type panickingEvents struct {
	*testConnector
	running chan struct{}
}

func (c panickingEvents) RunEvents(ctx context.Context, events *hostsdk.EventPublisher) error {
	close(c.running)
	<-ctx.Done()
	panic("event loop bug")
}

type panickingCancel struct{ *testConnector }

func (panickingCancel) Cancel(ctx context.Context, call *hostsdk.Call, reason string) error {
	panic("cancel bug")
}

// logPanics makes f's hosts log to a buffer, which it returns (any log, not
// only panics).
func logPanics(f *fleet) *hostsdktest.LogBuffer {
	var logs hostsdktest.LogBuffer
	f.cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	return &logs
}

// wantPanicLogged checks that logs hold the connector's panic in method,
// with its value and a stack reaching this file.
func wantPanicLogged(t *testing.T, logs *hostsdktest.LogBuffer, method, value string) {
	t.Helper()
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"msg":"the connector panicked"`) && strings.Contains(line, `"method":"`+method+`"`) &&
			strings.Contains(line, `"panic":"`+value+`"`) && strings.Contains(line, "connector_panic_test.go") {
			return
		}
	}
	t.Errorf("the panic in %s is not logged with its value and stack: %s", method, logs.String())
}

// TestPanickingConnectorMethodsFailTheirStep: a panic in Manifest, Routes
// or Reconcile fails its bootstrap step with the step's error type naming
// the method, and one in ActionStateNamespaces fails New, instead of
// ending the process (and, in Reconcile, leaving the action running in
// the journal for the next start: never settled by a guess).
func TestPanickingConnectorMethodsFailTheirStep(t *testing.T) {
	t.Run("Manifest", func(t *testing.T) {
		f := newFleet(t)
		logs := logPanics(f)
		conn := &funcConnector{testConnector: newTestConnector(),
			manifest: func(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) { panic("manifest bug") }}
		err := startErr(t, f, conn)
		var de *hostsdk.DiscoverError
		if !errors.As(err, &de) || !strings.Contains(err.Error(), "Manifest panicked: manifest bug") {
			t.Fatalf("Start: %v, want a *DiscoverError naming the panic", err)
		}
		wantPanicLogged(t, logs, "Manifest", "manifest bug")
	})
	t.Run("Routes", func(t *testing.T) {
		f := newFleet(t)
		logs := logPanics(f)
		err := startErr(t, f, panickingRoutes{newTestConnector()})
		var be *hostsdk.BuildRoutesError
		if !errors.As(err, &be) || !strings.Contains(err.Error(), "Routes panicked: routes bug") {
			t.Fatalf("Start: %v, want a *BuildRoutesError naming the panic", err)
		}
		wantPanicLogged(t, logs, "Routes", "routes bug")
	})
	t.Run("Reconcile", func(t *testing.T) {
		f := newFleet(t)
		logs := logPanics(f)
		conn := newTestConnector()
		a := action(capEcho, `{"message":"crashed"}`)
		leaveRunning(t, f.j, a, true)
		conn.reconcile = func(ctx context.Context, a *hostsdk.UncertainAction) (*aip.ActionResult, error) {
			panic("reconcile bug")
		}
		err := startErr(t, f, reconcilingConnector{conn})
		var re *hostsdk.RecoverError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), "Reconcile panicked: reconcile bug") {
			t.Fatalf("Start: %v, want a *RecoverError naming the panic", err)
		}
		if rec, err := f.j.Action(context.Background(), a.ID); err != nil || rec.Status != aip.StateRunning {
			t.Fatalf("journal record %s (%v), want still running", rec.Status, err)
		}
		wantPanicLogged(t, logs, "Reconcile", "reconcile bug")
	})
	t.Run("ActionStateNamespaces", func(t *testing.T) {
		f := newFleet(t)
		logs := logPanics(f)
		_, err := hostsdk.New(f.cfg, panickingNamespaces{newTestConnector()})
		var ve *hostsdk.ValidateError
		if !errors.As(err, &ve) || !strings.Contains(err.Error(), "ActionStateNamespaces panicked: namespaces bug") {
			t.Fatalf("New: %v, want a *ValidateError naming the panic", err)
		}
		wantPanicLogged(t, logs, "ActionStateNamespaces", "namespaces bug")
	})
}

// TestPanickingEventSourceIsAShutdownFailure: RunEvents runs on a
// goroutine of the host's, where a panic ended the process; it is the
// event source's failure in the shutdown's error instead.
func TestPanickingEventSourceIsAShutdownFailure(t *testing.T) {
	f := newFleet(t)
	logs := logPanics(f)
	conn := panickingEvents{newTestConnector(), make(chan struct{})}
	h, err := hostsdk.New(f.cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	<-conn.running
	err = h.Stop(ctxT(t))
	var se *hostsdk.ShutdownError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "event source") || !strings.Contains(err.Error(), "RunEvents panicked: event loop bug") {
		t.Fatalf("Stop: %v, want a *ShutdownError naming the event source's panic", err)
	}
	wantPanicLogged(t, logs, "RunEvents", "event loop bug")
}

// TestPanickingCancelerStillAnswersTheCancel: a panic in Canceler.Cancel
// is logged like its error; the cancel is still answered with the
// action's journaled result (it lost its answer and its connection).
func TestPanickingCancelerStillAnswersTheCancel(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	_, target := f.start(t, panickingCancel{conn})
	ctx := ctxT(t)
	a := action(capBlock, `{"message":"x"}`)
	acted := make(chan error, 1)
	go func() { _, err := f.d.Act(ctx, target, a); acted <- err }()
	<-conn.started
	resp, err := f.d.Cancel(ctx, target, a.ID, a.CapabilityID, "user asked")
	if err != nil {
		t.Fatalf("cancel: %v", err)
	}
	if resp.Status != http.StatusOK {
		t.Fatalf("cancel answered %d: %s", resp.Status, resp.Raw)
	}
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCancelled {
		t.Fatalf("cancel answered %+v, %v", res, err)
	}
	if err := <-acted; err != nil {
		t.Fatal(err)
	}
}

// togglingHealth panics in CheckHealth while panicking is set.
type togglingHealth struct {
	*testConnector
	panicking *atomic.Bool
}

func (c togglingHealth) CheckHealth(ctx context.Context) error {
	if c.panicking.Load() {
		panic("health check bug")
	}
	return nil
}

// TestPanickingHealthCheckLogsItsStackOnce: a CheckHealth that panics at
// every probe is logged with its value and stack once, and again after a
// healthy check; before, no stack was logged at all.
func TestPanickingHealthCheckLogsItsStackOnce(t *testing.T) {
	f := newFleet(t)
	logs := logPanics(f)
	var panicking atomic.Bool
	h, _ := f.start(t, togglingHealth{newTestConnector(), &panicking})
	ready := func() {
		t.Helper()
		resp, err := http.Get("http://" + h.Addr().String() + "/ready")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	logged := func() int {
		n := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, `"msg":"the connector panicked"`) && strings.Contains(line, `"method":"CheckHealth"`) {
				n++
			}
		}
		return n
	}
	panicking.Store(true)
	for range 3 {
		ready()
	}
	wantPanicLogged(t, logs, "CheckHealth", "health check bug")
	if n := logged(); n != 1 {
		t.Errorf("three probes of a panicking check logged the panic %d times, want once", n)
	}
	panicking.Store(false)
	ready()
	panicking.Store(true)
	ready()
	if n := logged(); n != 2 {
		t.Errorf("the panic after a healthy check logged %d panics in all, want 2", n)
	}
}
