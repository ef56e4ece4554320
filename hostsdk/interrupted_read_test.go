package hostsdk_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// panickingHandle's Handle panics.
type panickingHandle struct{ *testConnector }

func (c panickingHandle) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	c.countRun(call.Action.ID)
	panic("handle bug")
}

// readOnlyPanickingHandle is panickingHandle with read-only capabilities.
type readOnlyPanickingHandle struct{ panickingHandle }

func (c readOnlyPanickingHandle) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	return readOnlyConnector{c.testConnector}.Manifest(ctx, tenant)
}

// readOnlyStuck is stuckConnector with read-only capabilities.
type readOnlyStuck struct{ *stuckConnector }

func (c readOnlyStuck) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	return readOnlyConnector{c.testConnector}.Manifest(ctx, tenant)
}

// wantInterruptedRead checks that a read's action a, cut off live, is
// answered (to resp, then to a retry of the same action ID) and journaled
// failed connector_host.interrupted, retryable, with a message containing
// why, and that a status query answers the same.
func wantInterruptedRead(t *testing.T, f *fleet, target hostsdktest.Target, a *aip.Action, resp *hostsdktest.Response, why string) {
	t.Helper()
	ctx := ctxT(t)
	for _, delivery := range []string{"first", "retry"} {
		if delivery == "retry" {
			var err error
			if resp, err = f.d.Act(ctx, target, a); err != nil {
				t.Fatal(err)
			}
		}
		res, err := resp.Result()
		if err != nil || resp.Status != http.StatusOK || res.Status != aip.ResultFailed || res.Error == nil ||
			res.Error.Code != hostsdk.CodeInterrupted || !res.Error.IsRetryable() || res.Receipt == nil {
			t.Fatalf("%s delivery answered HTTP %d %s (%v); want a failed, retryable %s result with a receipt",
				delivery, resp.Status, resp.Raw, err, hostsdk.CodeInterrupted)
		}
		for _, w := range []string{why, "a read changes nothing"} {
			if !strings.Contains(res.Error.Message, w) {
				t.Errorf("%s delivery: message %q does not say %q", delivery, res.Error.Message, w)
			}
		}
	}
	rec, err := f.j.Action(ctx, a.ID)
	if err != nil || rec.Status != aip.StateFailed {
		t.Fatalf("journal record %s %q (%v), want failed", rec.Status, rec.Detail, err)
	}
	st, _, err := f.d.Status(ctx, target, a.ID, a.CapabilityID)
	if err != nil || st.State != aip.StateFailed || st.Result == nil || st.Result.Error == nil ||
		st.Result.Error.Code != hostsdk.CodeInterrupted || !st.Result.Error.IsRetryable() {
		t.Fatalf("status %+v (%v); want failed %s, retryable", st, err, hostsdk.CodeInterrupted)
	}
}

// wantUnknownMutation checks that a mutation's action a, cut off live, is
// answered outcome_unknown (to resp, then to a retry) and journaled so.
func wantUnknownMutation(t *testing.T, f *fleet, target hostsdktest.Target, a *aip.Action, resp *hostsdktest.Response, why string) {
	t.Helper()
	ctx := ctxT(t)
	if pe := wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown); !strings.Contains(pe.Message, why) {
		t.Errorf("message %q does not say %q", pe.Message, why)
	}
	retry, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, retry, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown)
	rec, err := f.j.Action(ctx, a.ID)
	if err != nil || rec.Status != aip.StateOutcomeUnknown {
		t.Fatalf("journal record %s %q (%v), want outcome_unknown", rec.Status, rec.Detail, err)
	}
}

// readAndWrite runs a test with the test connector as it is (a mutation's
// capabilities) and wrapped as read-only.
var readAndWrite = []struct {
	name string
	wrap func(*testConnector) hostsdk.Connector
}{
	{"read", func(c *testConnector) hostsdk.Connector { return readOnlyConnector{c} }},
	{"write", func(c *testConnector) hostsdk.Connector { return c }},
}

// TestPanicOfAReadIsInterrupted: a Handle that panics leaves a mutation's
// outcome unknown, but a read-only capability's action changed nothing:
// it fails connector_host.interrupted, retryable, now, to a retry and to
// a status query, as recovery fails a read a restart cut off. It used to
// be outcome_unknown, which told the caller never to send the read again.
// The panic's value and stack go to the host's log with the action ID,
// and only there: the answer used to quote the value (which may hold the
// input or the connector's internals), and nothing logged the stack.
func TestPanicOfAReadIsInterrupted(t *testing.T) {
	for _, c := range []struct {
		name string
		conn hostsdk.Connector
	}{{"read", readOnlyPanickingHandle{panickingHandle{newTestConnector()}}}, {"write", panickingHandle{newTestConnector()}}} {
		t.Run(c.name, func(t *testing.T) {
			f := newFleet(t)
			var logs hostsdktest.LogBuffer
			f.cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			_, target := f.start(t, c.conn)
			a := action(capEcho, `{"message":"x"}`)
			resp, err := f.d.Act(ctxT(t), target, a)
			if err != nil {
				t.Fatal(err)
			}
			if c.name == "read" {
				wantInterruptedRead(t, f, target, a, resp, "the connector panicked (its host logged the panic")
			} else {
				wantUnknownMutation(t, f, target, a, resp, "the connector panicked (its host logged the panic")
			}
			if strings.Contains(string(resp.Raw), "handle bug") {
				t.Errorf("the answer quotes the panic: %s", resp.Raw)
			}
			var logged bool
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, `"msg":"the connector panicked"`) && strings.Contains(line, a.ID) &&
					strings.Contains(line, `"panic":"handle bug"`) && strings.Contains(line, "interrupted_read_test.go") {
					logged = true
				}
			}
			if !logged {
				t.Errorf("the panic is not logged with its value, its stack and the action ID: %s", logs.String())
			}
		})
	}
}

// TestTimeoutOfAReadIsInterrupted: a Handle that answers its timeout_ms
// with only the context's error leaves a mutation's outcome unknown; a
// read-only capability's action fails connector_host.interrupted,
// retryable.
func TestTimeoutOfAReadIsInterrupted(t *testing.T) {
	for _, c := range []struct {
		name string
		conn *testConnector
		wrap func(*testConnector) hostsdk.Connector
	}{
		{"read", newTestConnector(), func(c *testConnector) hostsdk.Connector { return readOnlyConnector{c} }},
		{"write", newTestConnector(), func(c *testConnector) hostsdk.Connector { return c }},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFleet(t)
			_, target := f.start(t, c.wrap(c.conn))
			a := action(capBlock, `{"message":"x"}`) // returns ctx.Err() when its context ends
			ms := uint64(50)
			a.TimeoutMS = &ms
			resp, err := f.d.Act(ctxT(t), target, a)
			if err != nil {
				t.Fatal(err)
			}
			if c.name == "read" {
				wantInterruptedRead(t, f, target, a, resp, "the read timed out before the connector answered")
				if res, _ := resp.Result(); res == nil || !strings.Contains(res.Error.Message, "larger one") {
					t.Errorf("the timed-out read's answer does not say to give it a larger timeout_ms: %s", resp.Raw)
				}
			} else {
				wantUnknownMutation(t, f, target, a, resp, "the action timed out")
			}
			if n := c.conn.runCount(a.ID); n != 1 {
				t.Errorf("the action ran %d times", n)
			}
		})
	}
}

// TestAbandonedReadIsInterrupted: a read-only capability's Handle that
// ignores its context past Config.HandleGrace is abandoned like any
// other (it keeps its in-flight slot until it returns), but its action
// fails connector_host.interrupted, retryable, instead of outcome_unknown
// (TestConnectorThatIgnoresItsDeadlineIsAbandoned keeps a mutation's).
func TestAbandonedReadIsInterrupted(t *testing.T) {
	for _, mode := range []aip.ActionMode{aip.ModeSync, aip.ModeStreaming} {
		t.Run(string(mode), func(t *testing.T) {
			f := newFleet(t)
			f.cfg.HandleGrace = 50 * time.Millisecond
			conn := newStuckConnector()
			_, target := f.start(t, readOnlyStuck{conn})
			unstuck := false
			t.Cleanup(func() {
				if !unstuck {
					close(conn.unstick)
				}
			})
			a := action(capBlock, `{"message":"x"}`)
			if mode == aip.ModeStreaming {
				a.CapabilityID = capStream
			}
			a.Mode = mode
			ms := uint64(50)
			a.TimeoutMS = &ms
			resp, err := f.d.Act(ctxT(t), target, a)
			if err != nil {
				t.Fatal(err)
			}
			if mode == aip.ModeStreaming && len(resp.Chunks) != 1 {
				t.Errorf("the stream carried %d chunks before its result, want 1", len(resp.Chunks))
			}
			wantInterruptedRead(t, f, target, a, resp, "handle grace")
			if v := hostMetric(t, target.Endpoint, hostsdk.MetricAbandonedCalls); v != 1 {
				t.Errorf("%s = %v while the call runs, want 1", hostsdk.MetricAbandonedCalls, v)
			}
			close(conn.unstick)
			unstuck = true
			if mode == aip.ModeStreaming {
				<-conn.lateChunk
			}
			ctx := ctxT(t)
			for hostMetric(t, target.Endpoint, hostsdk.MetricAbandonedCalls) != 0 {
				select {
				case <-ctx.Done():
					t.Fatal("the returned call did not give its slot back")
				case <-time.After(5 * time.Millisecond):
				}
			}
			if rec, err := f.j.Action(ctx, a.ID); err != nil || rec.Status != aip.StateFailed {
				t.Fatalf("journal record after the late return: %s (%v), want failed still", rec.Status, err)
			}
		})
	}
}

// TestShutdownOfAReadIsInterrupted: an action the shutdown cancels at the
// drain timeout, whose Handle answers with only the context's error, is
// outcome_unknown for a mutation, and failed connector_host.interrupted,
// retryable, for a read-only capability; journaled so.
func TestShutdownOfAReadIsInterrupted(t *testing.T) {
	for _, c := range readAndWrite {
		t.Run(c.name, func(t *testing.T) {
			f := newFleet(t)
			f.cfg.DrainTimeout = 50 * time.Millisecond
			conn := newTestConnector()
			h, target := f.start(t, c.wrap(conn))
			ctx := ctxT(t)
			a := action(capBlock, `{"message":"x"}`) // returns ctx.Err() when its context ends
			answered := make(chan *hostsdktest.Response, 1)
			go func() {
				resp, err := f.d.Act(ctx, target, a)
				if err != nil {
					t.Error(err)
				}
				answered <- resp
			}()
			<-conn.started
			if err := h.Stop(ctx); err == nil || !strings.Contains(err.Error(), "drain timeout") {
				t.Errorf("Stop: %v, want the actions the drain timeout cancelled named", err)
			}
			resp := <-answered
			if resp == nil {
				t.FailNow()
			}
			rec, err := f.j.Action(ctx, a.ID)
			if err != nil {
				t.Fatal(err)
			}
			if c.name == "write" {
				if pe := wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown); !strings.Contains(pe.Message, "shutdown") {
					t.Errorf("message %q does not name the shutdown", pe.Message)
				}
				if rec.Status != aip.StateOutcomeUnknown {
					t.Fatalf("journal record %s, want outcome_unknown", rec.Status)
				}
				return
			}
			res, err := resp.Result()
			if err != nil || res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != hostsdk.CodeInterrupted ||
				!res.Error.IsRetryable() || !strings.Contains(res.Error.Message, "shutdown") {
				t.Fatalf("answered HTTP %d %s (%v); want a failed, retryable %s result naming the shutdown", resp.Status, resp.Raw, err, hostsdk.CodeInterrupted)
			}
			if rec.Status != aip.StateFailed {
				t.Fatalf("journal record %s, want failed", rec.Status)
			}
		})
	}
}

// TestReadTheConnectorCouldNotTellIsInterrupted: a Handle that answers
// ErrOutcomeUnknown leaves a mutation's outcome unknown, but for a
// read-only capability the host fails the action connector_host.interrupted,
// retryable, now, to a retry and to a status query, as recovery fails a
// read whose Reconcile answered ErrOutcomeUnknown. It used to be
// outcome_unknown live (final for the action ID, counted against nothing
// that changed) and interrupted after a restart.
func TestReadTheConnectorCouldNotTellIsInterrupted(t *testing.T) {
	for _, c := range readAndWrite {
		t.Run(c.name, func(t *testing.T) {
			f := newFleet(t)
			_, target := f.start(t, c.wrap(newTestConnector()))
			a := action(capEcho, `{"message":"unknown"}`) // answers ErrOutcomeUnknown
			resp, err := f.d.Act(ctxT(t), target, a)
			if err != nil {
				t.Fatal(err)
			}
			if c.name == "read" {
				wantInterruptedRead(t, f, target, a, resp, "the connector could not tell what the read did (provider timed out")
			} else {
				wantUnknownMutation(t, f, target, a, resp, "provider timed out")
			}
		})
	}
}

// TestInterruptedAdviceSurvivesALongProblem: the advice of a read's
// interrupted or unusable result (send it again; ask for less) is kept
// whole when what went wrong is longer than a message may be: the problem
// is cut, not the advice (the whole message was cut, advice first).
func TestInterruptedAdviceSurvivesALongProblem(t *testing.T) {
	read := &aip.Capability{ID: "x.read", Contract: &aip.CapabilityContract{SideEffects: []aip.SideEffect{aip.EffectRead}}}
	long := strings.Repeat("é", aip.MaxErrorMessageBytes)
	for name, err := range map[string]error{
		"interrupted": hostsdk.Interrupted(read, long),
		"unusable":    hostsdk.UnusableResult(read, long),
	} {
		pe, ok := err.(*aip.ProtocolError)
		if !ok {
			t.Fatalf("%s: %T %v, want a protocol error", name, err, err)
		}
		if len(pe.Message) > aip.MaxErrorMessageBytes || !utf8.ValidString(pe.Message) ||
			!(strings.HasSuffix(pe.Message, "send it again under a new action ID") || strings.HasSuffix(pe.Message, "else send it again")) {
			t.Errorf("%s: message of %d bytes ends %q", name, len(pe.Message), pe.Message[max(0, len(pe.Message)-80):])
		}
	}
}
