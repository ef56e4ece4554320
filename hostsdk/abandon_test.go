package hostsdk_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// stuckConnector's test.block ignores its context: Handle (and
// HandleStream, after one chunk) returns only when unstick is closed, and
// reports what a chunk sent after that got. With lateWrites set, Handle
// also reports, once unstuck, what a state write and an event publication
// got.
type stuckConnector struct {
	*testConnector
	unstick    chan struct{}
	lateChunk  chan error
	lateWrites chan [2]error
}

func newStuckConnector() *stuckConnector {
	return &stuckConnector{testConnector: newTestConnector(), unstick: make(chan struct{}), lateChunk: make(chan error, 1)}
}

func (c *stuckConnector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	if call.Action.CapabilityID != capBlock {
		return c.testConnector.Handle(ctx, call)
	}
	c.countRun(call.Action.ID)
	c.started <- call.Action.ID
	<-c.unstick
	if c.lateWrites != nil {
		_, serr := call.State().Put(context.Background(), "test.late", call.Action.ID, "late", 0)
		_, perr := call.Events().Publish(context.Background(), "test.events", aip.Event{Kind: "test.late"})
		c.lateWrites <- [2]error{serr, perr}
	}
	return call.Complete(map[string]any{"message": "late"})
}

func (c *stuckConnector) HandleStream(ctx context.Context, call *hostsdk.Call, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	c.countRun(call.Action.ID)
	if err := chunks.Send(aip.ChunkProgress, map[string]int{"step": 0}); err != nil {
		return nil, err
	}
	c.started <- call.Action.ID
	<-c.unstick
	c.lateChunk <- chunks.Send(aip.ChunkProgress, map[string]int{"step": 1})
	return call.Complete(map[string]any{"message": "late"})
}

// hostMetric reads one sample from the /metrics of the host whose
// messages endpoint is endpoint.
func hostMetric(t *testing.T, endpoint, name string) float64 {
	t.Helper()
	resp, err := http.Get(strings.TrimSuffix(endpoint, hostsdk.PathMessages) + hostsdk.PathMetrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(page), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("metric %s not served", name)
	return 0
}

// TestConnectorThatIgnoresItsDeadlineIsAbandoned: a Handle that ignores
// its context and does not return is waited for Config.HandleGrace after
// the action's timeout_ms; then the action is journaled outcome_unknown
// and answered so (now and to a retry), and the call keeps its in-flight
// slot (aip_connector_host_abandoned_calls) until it returns, when its late result
// is dropped. The host used to wait for ever: the action stayed running in
// the journal, and every retry waited its timeout_ms and was told the
// action was in progress. A streaming call abandoned this way can no
// longer write to the response.
func TestConnectorThatIgnoresItsDeadlineIsAbandoned(t *testing.T) {
	for _, mode := range []aip.ActionMode{aip.ModeSync, aip.ModeStreaming} {
		t.Run(string(mode), func(t *testing.T) {
			f := newFleet(t)
			f.cfg.HandleGrace = 50 * time.Millisecond
			conn := newStuckConnector()
			_, target := f.start(t, conn)
			ctx := ctxT(t)
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
			for _, delivery := range []string{"first", "retry"} {
				resp, err := f.d.Act(ctx, target, a)
				if err != nil {
					t.Fatalf("%s delivery: %v", delivery, err)
				}
				var pe *aip.ProtocolError
				if mode == aip.ModeStreaming && delivery == "first" {
					// The stream had started: its last line is the error.
					if pe = resp.ProtocolError(); resp.Status != http.StatusOK || len(resp.Chunks) != 1 || pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
						t.Fatalf("stream answered %d, %d chunks, error %+v (body %s); want one chunk, then outcome_unknown", resp.Status, len(resp.Chunks), pe, resp.Raw)
					}
				} else {
					pe = wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown)
				}
				if delivery == "first" && !strings.Contains(pe.Message, "handle grace") {
					t.Errorf("message %q does not say the connector did not return", pe.Message)
				}
			}
			rec, err := f.j.Action(ctx, a.ID)
			if err != nil || rec.Status != aip.StateOutcomeUnknown {
				t.Fatalf("journal record %s %q (%v), want outcome_unknown", rec.Status, rec.Detail, err)
			}
			if v := hostMetric(t, target.Endpoint, hostsdk.MetricAbandonedCalls); v != 1 {
				t.Errorf("%s = %v while the call runs, want 1", hostsdk.MetricAbandonedCalls, v)
			}
			if v := hostMetric(t, target.Endpoint, hostsdk.MetricInFlight); v != 1 {
				t.Errorf("%s = %v while the abandoned call runs, want 1 (it keeps its slot)", hostsdk.MetricInFlight, v)
			}

			close(conn.unstick)
			unstuck = true
			if mode == aip.ModeStreaming {
				if err := <-conn.lateChunk; err == nil {
					t.Error("a chunk sent after the call was abandoned was accepted")
				}
			}
			for hostMetric(t, target.Endpoint, hostsdk.MetricInFlight) != 0 || hostMetric(t, target.Endpoint, hostsdk.MetricAbandonedCalls) != 0 {
				select {
				case <-ctx.Done():
					t.Fatal("the returned call did not give its slot back")
				case <-time.After(5 * time.Millisecond):
				}
			}
			rec, err = f.j.Action(ctx, a.ID)
			if err != nil || rec.Status != aip.StateOutcomeUnknown {
				t.Fatalf("journal record after the late return: %s (%v), want outcome_unknown still", rec.Status, err)
			}
			if n := conn.runCount(a.ID); n != 1 {
				t.Errorf("the action ran %d times", n)
			}
		})
	}
}

// TestHandleGraceIsValidated: HandleGrace out of its range is a
// configuration error naming the field.
func TestHandleGraceIsValidated(t *testing.T) {
	f := newFleet(t)
	for _, d := range []time.Duration{-time.Second, hostsdk.MaxHandleGrace + time.Millisecond} {
		cfg := f.cfg
		cfg.HandleGrace = d
		_, err := hostsdk.New(cfg, newTestConnector())
		if err == nil || !strings.Contains(err.Error(), "HandleGrace") {
			t.Errorf("HandleGrace %v: New error %v, want one naming HandleGrace", d, err)
		}
	}
}

// floodConnector streams large chunks, ignoring its context, until Send
// fails; sendErr gets that error.
type floodConnector struct {
	*testConnector
	sendErr chan error
}

func (c floodConnector) HandleStream(ctx context.Context, call *hostsdk.Call, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	c.countRun(call.Action.ID)
	pad := strings.Repeat("x", 256<<10)
	for i := 0; ; i++ {
		if err := chunks.Send(aip.ChunkProgress, map[string]any{"step": i, "pad": pad}); err != nil {
			c.sendErr <- err
			return nil, err
		}
	}
}

// TestStreamBlockedOnAReceiverThatDoesNotReadIsAbandoned: a streaming
// call blocked in ChunkWriter.Send because the receiver stopped reading
// (TCP back-pressure) cannot see its context. After its timeout_ms and
// HandleGrace it is abandoned like any other call: the blocked Send fails
// (at its write deadline, HandleGrace plus the chunk at 256 KiB/s) and the
// action is journaled outcome_unknown. The abandoning request waited for ever to close the
// chunk writer, whose lock the blocked Send held, so the action stayed
// running in the journal.
func TestStreamBlockedOnAReceiverThatDoesNotReadIsAbandoned(t *testing.T) {
	// In memory: a net.Pipe has no buffer, so the first chunk the client
	// does not read blocks the Send that writes it.
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{InMemory: true})
	ml := hostsdktest.NewMemListener()
	client := ml.Client()
	defer client.CloseIdleConnections()
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain, Client: client})
	f := &fleet{cp: cp, d: d, cfg: hostsdktest.HostConfig(t, cp, d, ml), j: memjournal.New()}
	f.cfg.Journal = f.j
	f.cfg.HandleGrace = 50 * time.Millisecond
	conn := floodConnector{testConnector: newTestConnector(), sendErr: make(chan error, 1)}
	_, target := f.start(t, conn)
	ctx := ctxT(t)

	a := action(capStream, `{"message":"flood"}`)
	a.Mode = aip.ModeStreaming
	ms := uint64(50)
	a.TimeoutMS = &ms
	raw := signedAction(t, f.d, target, a)
	resp := postRaw(t, ctx, client, target, raw)
	// The body is not read until the action settled.
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP %d, want the stream's 200", resp.StatusCode)
	}
	select {
	case err := <-conn.sendErr:
		if !errors.Is(err, hostsdk.ErrStreamClosed) {
			t.Errorf("the blocked Send failed with %v, want ErrStreamClosed", err)
		}
	case <-ctx.Done():
		t.Fatal("the Send blocked on the receiver never returned")
	}
	for {
		rec, err := f.j.Action(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Status == aip.StateOutcomeUnknown {
			break
		}
		if rec.Status.Terminal() {
			t.Fatalf("journaled %s, want outcome_unknown", rec.Status)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the action stayed %s", rec.Status)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestCallStuckAtShutdownIsJournaledBeforeStopReturns: an action whose
// call ignores the shutdown's cancellation is abandoned HandleGrace after
// it, and Stop waits for that: the action is journaled outcome_unknown
// before Stop returns (before a journal the host opened is closed), and
// the ShutdownError says the call still runs. Stop waited DrainTimeout
// after the cancellation, whatever HandleGrace was: with a longer grace it
// returned (and closed the journal) while the request was still waiting
// to journal the action, which stayed running, and it reported only
// "1 actions still in flight".
func TestCallStuckAtShutdownIsJournaledBeforeStopReturns(t *testing.T) {
	f := newFleet(t)
	// The request journals the action between the grace's end and
	// DrainTimeout later: a margin a loaded machine running -race needs
	// (20 ms was not always enough). The grace is twice DrainTimeout, so
	// a Stop waiting DrainTimeout only returns before the abandonment.
	f.cfg.DrainTimeout, f.cfg.DrainLinger = 200*time.Millisecond, time.Millisecond
	f.cfg.HandleGrace = 400 * time.Millisecond
	conn := newStuckConnector()
	h, target := f.start(t, conn)
	defer close(conn.unstick)
	ctx := ctxT(t)

	a := action(capBlock, `{"message":"x"}`) // no timeout_ms
	acted := make(chan struct{})
	go func() {
		defer close(acted)
		f.d.Act(ctx, target, a) // the host closes the connection at its shutdown
	}()
	<-conn.started
	err := h.Stop(ctx)
	var se *hostsdk.ShutdownError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "1 abandoned connector call still running") {
		t.Errorf("Stop: %v, want a *ShutdownError saying the abandoned call still runs", err)
	}
	// In words an operator acts on, not Go identifiers (journal.ErrClosed).
	for _, want := range []string{"by more than 400ms (the handle grace: --handle-grace-ms (AIP_CONNECTOR_HOST_HANDLE_GRACE_MS))",
		"what it returns is discarded", "check with the provider whether it took effect", "fix the connector so that a call returns"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Stop: %v, want it to say %q", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "ErrClosed") {
		t.Errorf("Stop: %v, names a Go error value", err)
	}
	rec, jerr := f.j.Action(ctx, a.ID)
	if jerr != nil || rec.Status != aip.StateOutcomeUnknown {
		t.Fatalf("journal record when Stop returned: %s %q (%v), want outcome_unknown", rec.Status, rec.Detail, jerr)
	}
	<-acted
}

// TestDrainDoesNotWaitForAbandonedCalls: a call the host abandoned (its
// action journaled and answered outcome_unknown) keeps its in-flight slot
// until it returns, but the drain does not wait for it: neither for one
// abandoned before the drain nor for one abandoned while the drain waits.
// The shutdown goes offline and its *ShutdownError names the calls still
// running; once Stop returned, what such a call still does fails cleanly
// (a state write with journal.ErrClosed, a publication with
// ErrNotServing). The drain waited DrainTimeout for them, and Stop waited
// DrainTimeout again after the offline: a minute each here, where the
// drain needs the abandonment of the second call (6 s) only.
func TestDrainDoesNotWaitForAbandonedCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var conn *stuckConnector
		b := newWrappedBubbleFleet(t, func(c *hostsdk.Config) {
			c.DrainTimeout, c.HandleGrace = time.Minute, time.Second
		}, func(tc *testConnector) hostsdk.Connector {
			conn = &stuckConnector{testConnector: tc, unstick: make(chan struct{}), lateWrites: make(chan [2]error, 2)}
			return conn
		})
		ctx := b.awaitFirstBeat(t)
		target := hostsdktest.TargetOf(b.h, b.cfg)
		timeout := func(a *aip.Action, d time.Duration) *aip.Action {
			ms := uint64(d.Milliseconds())
			a.TimeoutMS = &ms
			return a
		}

		before := timeout(action(capBlock, `{"message":"before"}`), 100*time.Millisecond)
		resp, err := b.d.Act(ctx, target, before)
		if err != nil {
			t.Fatal(err)
		}
		wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown)
		during := timeout(action(capBlock, `{"message":"during"}`), 5*time.Second)
		answered := make(chan *hostsdktest.Response, 1)
		go func() {
			resp, err := b.d.Act(ctx, target, during)
			if err != nil {
				t.Error(err)
			}
			answered <- resp
		}()
		<-conn.started
		<-conn.started

		start := time.Now()
		err = b.h.Stop(ctx)
		took := time.Since(start)
		var se *hostsdk.ShutdownError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), "2 abandoned connector calls still running") ||
			!strings.Contains(err.Error(), before.ID) || !strings.Contains(err.Error(), during.ID) {
			t.Errorf("Stop: %v, want a *ShutdownError naming the two abandoned calls", err)
		}
		if took >= b.cfg.DrainTimeout {
			t.Errorf("Stop took %s, at least the drain timeout (%s): it waited for calls already abandoned", took, b.cfg.DrainTimeout)
		}
		if resp := <-answered; resp != nil {
			wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown)
		}
		o := b.cp.Operations()
		if last := o[len(o)-1]; last.Op != aip.OpOffline || last.Outcome != aip.OutcomeOffline {
			t.Errorf("last operation %+v, want an accepted offline", last)
		}

		// Stop has returned; the calls return now.
		close(conn.unstick)
		for range 2 {
			late := <-conn.lateWrites
			if !errors.Is(late[0], journal.ErrClosed) {
				t.Errorf("a state write after Stop: %v, want an error matching journal.ErrClosed", late[0])
			}
			if !errors.Is(late[1], hostsdk.ErrNotServing) {
				t.Errorf("a publication after Stop: %v, want ErrNotServing", late[1])
			}
		}
		synctest.Wait()
		for _, id := range []string{before.ID, during.ID} {
			if rec, err := b.cfg.Journal.Action(ctx, id); err != nil || rec.Status != aip.StateOutcomeUnknown {
				t.Errorf("journal record of %s: %s (%v), want outcome_unknown", id, rec.Status, err)
			}
		}
	})
}

// TestCallStuckAtShutdownIsAnsweredOnItsConnection: an action whose call
// ignores its context is still running when the drain timeout passes; the
// host cancels it while the listener and its connection are still open,
// abandons it HandleGrace later, and the dispatcher (a real HTTP client
// over TCP) receives the signed outcome_unknown answer on the request it
// sent, synchronous or streaming. The host used to close the listener and
// then force-close the busy connections first (after waiting DrainTimeout
// for them), and to cancel the actions only after the offline transition:
// the answer was written to a closed connection and the dispatcher had to
// settle the action from its own timeout.
func TestCallStuckAtShutdownIsAnsweredOnItsConnection(t *testing.T) {
	for _, mode := range []aip.ActionMode{aip.ModeSync, aip.ModeStreaming} {
		t.Run(string(mode), func(t *testing.T) {
			f := newFleet(t)
			// The request has DrainTimeout after the abandonment to answer
			// (and the server's shutdown as long again): a margin for a
			// loaded machine running -race.
			f.cfg.DrainTimeout, f.cfg.DrainLinger, f.cfg.HandleGrace = 250*time.Millisecond, time.Millisecond, 100*time.Millisecond
			conn := newStuckConnector()
			h, target := f.start(t, conn)
			t.Cleanup(func() { close(conn.unstick) })
			ctx := ctxT(t)

			a := action(capBlock, `{"message":"x"}`) // no timeout_ms
			if mode == aip.ModeStreaming {
				a.CapabilityID, a.Mode = capStream, mode
			}
			type answer struct {
				resp *hostsdktest.Response
				err  error
			}
			answered := make(chan answer, 1)
			go func() {
				resp, err := f.d.Act(ctx, target, a)
				answered <- answer{resp, err}
			}()
			<-conn.started
			err := h.Stop(ctx)
			var se *hostsdk.ShutdownError
			if !errors.As(err, &se) || !strings.Contains(err.Error(), "1 abandoned connector call still running") || !strings.Contains(err.Error(), a.ID) {
				t.Errorf("Stop: %v, want a *ShutdownError naming the abandoned call", err)
			}
			got := <-answered
			if got.err != nil {
				t.Fatalf("the dispatcher got no signed answer: %v", got.err)
			}
			var pe *aip.ProtocolError
			if mode == aip.ModeStreaming {
				if pe = got.resp.ProtocolError(); got.resp.Status != http.StatusOK || len(got.resp.Chunks) != 1 || pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
					t.Fatalf("stream answered %d, %d chunks, error %+v (body %s); want one chunk, then outcome_unknown", got.resp.Status, len(got.resp.Chunks), pe, got.resp.Raw)
				}
			} else {
				pe = wantCode(t, got.resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown)
			}
			if !strings.Contains(pe.Message, "handle grace") {
				t.Errorf("message %q does not say the connector did not return", pe.Message)
			}
			if rec, err := f.j.Action(ctx, a.ID); err != nil || rec.Status != aip.StateOutcomeUnknown {
				t.Errorf("journal record %s (%v), want outcome_unknown", rec.Status, err)
			}
		})
	}
}
