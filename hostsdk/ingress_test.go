package hostsdk_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

func TestDuplicateActionNeverRunsTwice(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ctx := ctxT(t)

	a := action(capEcho, `{"message":"once"}`)
	env, err := f.d.Envelope(target, aip.Body{Action: a}, f.d.Route(target, a.ID, a.CapabilityID, ""))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := f.d.Sign(env)
	if err != nil {
		t.Fatal(err)
	}
	first, err := f.d.Post(ctx, target, raw, env.MessageID)
	if err != nil {
		t.Fatal(err)
	}
	r1, err := first.Result()
	if err != nil {
		t.Fatal(err)
	}

	// A new message with the same action ID: the journaled result, no run.
	second, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := second.Result()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r1.Output, r2.Output) || r2.Status != aip.ResultCompleted {
		t.Errorf("duplicate answered %s %s, first %s", r2.Status, r2.Output, r1.Output)
	}
	if r1.Receipt == nil || r2.Receipt == nil || *r1.Receipt != *r2.Receipt {
		t.Errorf("duplicate carries receipt %+v, first %+v; want the same journaled receipt", r2.Receipt, r1.Receipt)
	}
	if n := conn.runCount(a.ID); n != 1 {
		t.Errorf("connector ran %d times, want 1", n)
	}

	// The same action ID with another input is a conflict.
	other := *a
	other.Input = json.RawMessage(`{"message":"different"}`)
	resp, err := f.d.Act(ctx, target, &other)
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, resp, http.StatusConflict, hostsdk.CodeIdempotencyConflict)

	// The exact envelope again is a replay.
	resp, err = f.d.Post(ctx, target, raw, env.MessageID)
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, resp, http.StatusConflict, hostsdk.CodeReplay)
	if n := conn.runCount(a.ID); n != 1 {
		t.Errorf("connector ran %d times, want 1", n)
	}
}

func TestIngressRefusals(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ctx := ctxT(t)

	t.Run("not an envelope", func(t *testing.T) {
		resp, err := f.d.Post(ctx, target, []byte(`{"hello":1}`), "")
		if resp == nil || resp.Status != http.StatusBadRequest || !strings.Contains(string(resp.Raw), hostsdk.CodeSchemaInvalid) {
			t.Fatalf("got %+v, %v", resp, err)
		}
	})
	t.Run("invalid envelope", func(t *testing.T) {
		a := action(capEcho, `{"message":"x"}`)
		env, _ := f.d.Envelope(target, aip.Body{Action: a}, f.d.Route(target, a.ID, a.CapabilityID, ""))
		env.MessageID = "msg_not-a-uuid"
		raw, _ := f.d.Sign(env)
		resp, _ := f.d.Post(ctx, target, raw, env.MessageID)
		if resp.Status != http.StatusBadRequest || !strings.Contains(string(resp.Raw), hostsdk.CodeDecodeInvalid) {
			t.Fatalf("got %d %s", resp.Status, resp.Raw)
		}
	})
	t.Run("wrong signer", func(t *testing.T) {
		other := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
		resp, err := other.Act(ctx, target, action(capEcho, `{"message":"x"}`))
		wantUnsigned(t, resp, err, http.StatusUnauthorized, hostsdk.CodeAuthentication)
	})
	t.Run("wrong sender principal", func(t *testing.T) {
		a := action(capEcho, `{"message":"x"}`)
		env, _ := f.d.Envelope(target, aip.Body{Action: a}, f.d.Route(target, a.ID, a.CapabilityID, ""))
		env.From.ID = "service:someone-else"
		// The answer goes to the (unexpected) sender, so the dispatcher's
		// own verification refuses it; check the status and code only.
		resp, _ := f.d.Send(ctx, target, env)
		if resp.Status != http.StatusUnauthorized || !strings.Contains(string(resp.Raw), hostsdk.CodeRouteMismatch) {
			t.Fatalf("got %d %s", resp.Status, resp.Raw)
		}
	})
	t.Run("route for another replica", func(t *testing.T) {
		a := action(capEcho, `{"message":"x"}`)
		route := f.d.Route(target, a.ID, a.CapabilityID, "")
		route.ReplicaID = aip.NewID(aip.PrefixReplica)
		env, _ := f.d.Envelope(target, aip.Body{Action: a}, route)
		resp, err := f.d.Send(ctx, target, env)
		if err != nil {
			t.Fatal(err)
		}
		wantCode(t, resp, http.StatusForbidden, hostsdk.CodeRouteMismatch)
	})
	t.Run("route for another action", func(t *testing.T) {
		a := action(capEcho, `{"message":"x"}`)
		env, _ := f.d.Envelope(target, aip.Body{Action: a}, f.d.Route(target, aip.NewActionID(), a.CapabilityID, ""))
		resp, _ := f.d.Send(ctx, target, env)
		wantCode(t, resp, http.StatusForbidden, hostsdk.CodeRouteMismatch)
	})
	t.Run("input does not match the schema", func(t *testing.T) {
		a := action(capEcho, `{"message":7}`)
		resp, _ := f.d.Act(ctx, target, a)
		wantCode(t, resp, http.StatusBadRequest, hostsdk.CodeInputInvalid)
		st, _, err := f.d.Status(ctx, target, a.ID, a.CapabilityID)
		if err != nil || st.State != aip.StateNotFound {
			t.Errorf("status %+v, %v: an invalid action must not be journaled", st, err)
		}
	})
	t.Run("unknown capability", func(t *testing.T) {
		resp, _ := f.d.Act(ctx, target, action("test.nope", `{"message":"x"}`))
		wantCode(t, resp, http.StatusBadRequest, hostsdk.CodeCapabilityUnknown)
	})
	t.Run("body too large", func(t *testing.T) {
		big := `{"message":"` + strings.Repeat("x", aip.MaxMessageBytes) + `"}`
		resp, err := f.d.Act(ctx, target, action(capEcho, big))
		if resp == nil || resp.Status != http.StatusRequestEntityTooLarge {
			t.Fatalf("got %+v, %v", resp, err)
		}
	})
}

func TestFailedAndUnknownOutcomes(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ctx := ctxT(t)

	a := action(capEcho, `{"message":"fail"}`)
	resp, _ := f.d.Act(ctx, target, a)
	res, err := resp.Result()
	if err != nil || res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != "test.failed" || res.Receipt == nil {
		t.Errorf("failed action answered %+v, %v", res, err)
	}

	u := action(capEcho, `{"message":"unknown"}`)
	resp, _ = f.d.Act(ctx, target, u)
	wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown)
	resp, _ = f.d.Act(ctx, target, u)
	wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown)
	if n := conn.runCount(u.ID); n != 1 {
		t.Errorf("outcome_unknown action ran %d times, want 1", n)
	}
	st, _, err := f.d.Status(ctx, target, u.ID, u.CapabilityID)
	if err != nil || st.State != aip.StateOutcomeUnknown {
		t.Errorf("status %+v, %v", st, err)
	}

}

// countingConnector is a test connector that counts each action's runs.
type countingConnector interface {
	hostsdk.Connector
	runCount(actionID string) int64
}

// readOnlyConnector is testConnector with capabilities that only read
// (over the network, as product adapters declare their reads).
type readOnlyConnector struct{ *testConnector }

func (c readOnlyConnector) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	m, err := c.testConnector.Manifest(ctx, tenant)
	if err != nil {
		return nil, err
	}
	for i := range m.Capabilities {
		m.Capabilities[i].Contract.SideEffects = []aip.SideEffect{aip.EffectRead, aip.EffectExternalNetwork}
	}
	return m, nil
}

// TestOutputNotMatchingItsSchema: a connector that completes an action with
// an output its capability's output_schema refuses has done what the action
// asked. For a capability with effects (test.echo writes) the action is
// outcome_unknown, never failed, which would invite sending it again, and
// runs once; for a read-only one it is failed with output_invalid (nothing
// to undo, and a retry is harmless; its message does not tell the caller to
// check an effect, as the write's does). The output is not kept either way.
// Both are logged with the action ID: the read's failure is the
// connector's bug, which only the caller saw before.
func TestOutputNotMatchingItsSchema(t *testing.T) {
	ctx := ctxT(t)
	for _, c := range []struct {
		name string
		conn countingConnector
		log  string
	}{{"write", newTestConnector(), `"msg":"action outcome unknown"`},
		{"read", readOnlyConnector{newTestConnector()}, `"msg":"the connector's result of a read cannot be used; journaled failed connector_host.output_invalid"`}} {
		t.Run(c.name, func(t *testing.T) {
			f := newFleet(t)
			logs := logPanics(f)
			_, target := f.start(t, c.conn)
			b := action(capEcho, `{"message":"bad-output"}`)
			for range 2 {
				resp, _ := f.d.Act(ctx, target, b)
				if c.name == "read" {
					res, err := resp.Result()
					if err != nil || res.Status != aip.ResultFailed || res.Error.Code != hostsdk.CodeOutputInvalid || len(res.Output) != 0 {
						t.Fatalf("bad output of a read answered %+v, %v", res, err)
					}
					// A read changed nothing: the write's advice to check
					// its effect before a resend contradicted the read's.
					if m := res.Error.Message; !strings.Contains(m, "output_schema of "+capEcho) || !strings.Contains(m, "the read changed nothing") ||
						strings.Contains(m, "check the effect") {
						t.Errorf("message %q; want the schema problem and that the read changed nothing, without checking an effect", m)
					}
					continue
				}
				pe := wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown)
				for _, w := range []string{"completed", "output_schema of " + capEcho, "check the effect before sending the action again"} {
					if !strings.Contains(pe.Message, w) {
						t.Errorf("message %q does not say %q", pe.Message, w)
					}
				}
			}
			if runs := c.conn.runCount(b.ID); runs != 1 {
				t.Errorf("the action ran %d times, want 1", runs)
			}
			st, _, err := f.d.Status(ctx, target, b.ID, b.CapabilityID)
			want := aip.StateOutcomeUnknown
			if c.name == "read" {
				want = aip.StateFailed
			}
			if err != nil || st.State != want {
				t.Errorf("status %+v, %v; want %s", st, err, want)
			}
			logged := false
			for _, line := range strings.Split(logs.String(), "\n") {
				logged = logged || strings.Contains(line, c.log) && strings.Contains(line, b.ID) && strings.Contains(line, "output_schema of "+capEcho)
			}
			if !logged {
				t.Errorf("no log line %s with the action ID and the output_schema problem:\n%s", c.log, logs.String())
			}
		})
	}
}

func TestCapacityRefusalIsFinal(t *testing.T) {
	f := newFleet(t)
	f.cfg.MaxInFlight = 1
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ctx := ctxT(t)

	blocked := action(capBlock, `{"message":"hold"}`)
	done := make(chan *hostsdktest.Response)
	go func() {
		resp, err := f.d.Act(ctx, target, blocked)
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	<-conn.started

	a := action(capEcho, `{"message":"x"}`)
	route := f.d.Route(target, a.ID, a.CapabilityID, "")
	env, _ := f.d.Envelope(target, aip.Body{Action: a}, route)
	raw, _ := f.d.Sign(env)
	resp, err := f.d.Post(ctx, target, raw, env.MessageID)
	if err != nil {
		t.Fatal(err)
	}
	pe := wantCode(t, resp, http.StatusTooManyRequests, hostsdk.CodeCapacity)
	if pe.RetryAfterMS == nil || *pe.RetryAfterMS != 100 || !pe.IsRetryable() {
		t.Errorf("capacity error %+v", pe)
	}
	// The signed refusal names the action and fence it refuses.
	var echoed aip.ConnectorRoute
	if ok, err := resp.Envelope.SecurityValue(aip.SecurityConnectorRoute, &echoed); !ok || err != nil || echoed != route {
		t.Errorf("the refusal's security.connector_route is %+v (present %v, %v), want the request's %+v", echoed, ok, err, route)
	}
	close(conn.release)
	if res, err := (<-done).Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Errorf("blocked action: %+v, %v", res, err)
	}
	// The refused envelope can never execute later.
	resp, _ = f.d.Post(ctx, target, raw, env.MessageID)
	wantCode(t, resp, http.StatusConflict, hostsdk.CodeReplay)
	if n := conn.runCount(a.ID); n != 0 {
		t.Errorf("refused action ran %d times", n)
	}
}

func TestCancel(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ctx := ctxT(t)

	a := action(capBlock, `{"message":"hold"}`)
	done := make(chan *hostsdktest.Response)
	go func() {
		resp, err := f.d.Act(ctx, target, a)
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	<-conn.started
	resp, err := f.d.Cancel(ctx, target, a.ID, a.CapabilityID, "user changed their mind")
	if err != nil {
		t.Fatal(err)
	}
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCancelled {
		t.Fatalf("cancel answered %+v, %v", res, err)
	}
	if res, err := (<-done).Result(); err != nil || res.Status != aip.ResultCancelled {
		t.Errorf("cancelled action answered %+v, %v", res, err)
	}
	if conn.cancels.Load() != 1 {
		t.Errorf("Canceler called %d times", conn.cancels.Load())
	}

	// A cancel before the action arrives: the action never runs.
	early := action(capEcho, `{"message":"late"}`)
	resp, _ = f.d.Cancel(ctx, target, early.ID, early.CapabilityID, "")
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCancelled {
		t.Fatalf("early cancel answered %+v, %v", res, err)
	}
	resp, _ = f.d.Act(ctx, target, early)
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCancelled {
		t.Errorf("action after its cancel answered %+v, %v", res, err)
	}
	if n := conn.runCount(early.ID); n != 0 {
		t.Errorf("cancelled action ran %d times", n)
	}

	// A late cancel keeps the terminal result.
	c := action(capEcho, `{"message":"done"}`)
	f.d.Act(ctx, target, c)
	resp, _ = f.d.Cancel(ctx, target, c.ID, c.CapabilityID, "")
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Errorf("late cancel answered %+v, %v", res, err)
	}
}

func TestStreaming(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ctx := ctxT(t)

	a := action(capStream, `{"message":"s","n":3}`)
	a.Mode = aip.ModeStreaming
	resp, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ContentType != hostsdk.ContentTypeNDJSON || len(resp.Chunks) != 3 {
		t.Fatalf("content type %q, %d chunks: %s", resp.ContentType, len(resp.Chunks), resp.Raw)
	}
	for i, c := range resp.Chunks {
		if c.Sequence != uint64(i) || c.ActionID != a.ID || c.Kind != aip.ChunkProgress {
			t.Errorf("chunk %d: %+v", i, c)
		}
	}
	res, err := resp.Result()
	if err != nil || res.Status != aip.ResultCompleted || string(res.Output) != `{"chunks":3,"message":"s"}` {
		t.Errorf("final %+v, %v", res, err)
	}
	// A duplicate returns the journaled final result only.
	resp, err = f.d.Act(ctx, target, a)
	if err != nil || len(resp.Chunks) != 0 {
		t.Fatalf("duplicate: %v, %d chunks", err, len(resp.Chunks))
	}
	if r2, _ := resp.Result(); r2 == nil || string(r2.Output) != string(res.Output) {
		t.Errorf("duplicate answered %+v", r2)
	}
	if n := conn.runCount(a.ID); n != 1 {
		t.Errorf("streamed action ran %d times", n)
	}
}

func TestActionStatusQuery(t *testing.T) {
	f := newFleet(t)
	_, target := f.start(t, newTestConnector())
	ctx := ctxT(t)
	a := action(capEcho, `{"message":"q"}`)
	st, _, err := f.d.Status(ctx, target, a.ID, a.CapabilityID)
	if err != nil || st.State != aip.StateNotFound || st.Result != nil {
		t.Fatalf("before: %+v, %v", st, err)
	}
	f.d.Act(ctx, target, a)
	st, _, err = f.d.Status(ctx, target, a.ID, a.CapabilityID)
	if err != nil || st.State != aip.StateCompleted || st.Result == nil || st.Result.Status != aip.ResultCompleted || st.UpdatedAt.IsZero() {
		t.Fatalf("after: %+v, %v", st, err)
	}
}

// receiptlessJournal loses every receipt once lose is set: a terminal
// action without one is a broken journal.
type receiptlessJournal struct {
	*memjournal.Journal
	lose atomic.Bool
}

func (j *receiptlessJournal) ReceiptFor(ctx context.Context, actionID string) (journal.Receipt, error) {
	if j.lose.Load() {
		return journal.Receipt{}, fmt.Errorf("%w: no receipt for action %s", journal.ErrNotFound, actionID)
	}
	return j.Journal.ReceiptFor(ctx, actionID)
}

// TestDuplicateWithoutReceiptIsAStorageError: the answer to a duplicate
// always carries the journaled receipt; a terminal action without one is
// never answered as if receipts were optional.
func TestDuplicateWithoutReceiptIsAStorageError(t *testing.T) {
	f := newFleet(t)
	j := &receiptlessJournal{Journal: f.j}
	f.cfg.Journal = j
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ctx := ctxT(t)

	a := action(capEcho, `{"message":"once"}`)
	first, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := first.Result(); err != nil || r.Receipt == nil {
		t.Fatalf("first answer %+v, %v; want a result with a receipt", r, err)
	}
	j.lose.Store(true)
	second, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, second, http.StatusServiceUnavailable, hostsdk.CodeStorageUnavailable)
	if n := conn.runCount(a.ID); n != 1 {
		t.Errorf("connector ran %d times, want 1", n)
	}
}

// An action arriving while an early cancel is being journaled (its record
// begun, not yet finished as cancelled) is not refused as an idempotency
// conflict (nobody sent it another input) nor run: it finishes the
// record cancelled itself, as the cancel would, and is answered cancelled;
// the cancel, whose own write then finds the record finished, answers the
// same journaled result.
func TestActionDuringEarlyCancel(t *testing.T) {
	f := newFleet(t)
	j := &gatedFinishJournal{Journal: f.j, reached: make(chan struct{}), release: make(chan struct{})}
	f.cfg.Journal = j
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ctx := ctxT(t)
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(j.release) }) }
	t.Cleanup(release) // on failure, so the host can stop

	a := action(capEcho, `{"message":"racing its cancel"}`)
	cancelled := make(chan *hostsdktest.Response, 1)
	go func() {
		resp, err := f.d.Cancel(ctx, target, a.ID, a.CapabilityID, "")
		if err != nil {
			t.Error(err)
		}
		cancelled <- resp
	}()
	<-j.reached // the cancel has begun the record and waits to finish it
	if rec, err := f.j.Action(ctx, a.ID); err != nil || rec.Status != aip.StateReceived {
		t.Fatalf("record between the cancel's writes: %+v, %v", rec, err)
	}
	resp, _ := f.d.Act(ctx, target, a)
	first, err := resp.Result()
	if err != nil || first.Status != aip.ResultCancelled || first.Receipt == nil {
		t.Fatalf("action during its cancel answered HTTP %d %+v, %v (body %s); want cancelled", resp.Status, first, err, resp.Raw)
	}
	release()
	if resp = <-cancelled; resp == nil {
		t.Fatal("the cancel got no answer")
	}
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCancelled || res.Receipt == nil || *res.Receipt != *first.Receipt {
		t.Fatalf("the cancel answered HTTP %d %+v, %v (body %s); want the same cancelled result", resp.Status, res, err, resp.Raw)
	}
	resp, _ = f.d.Act(ctx, target, a)
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCancelled {
		t.Errorf("action after its cancel committed answered %+v, %v", res, err)
	}
	if n := conn.runCount(a.ID); n != 0 {
		t.Errorf("cancelled action ran %d times", n)
	}
}

// gatedFinishJournal holds the first FinishAction until release, after
// telling reached.
type gatedFinishJournal struct {
	*memjournal.Journal
	gated            atomic.Bool
	reached, release chan struct{}
}

func (j *gatedFinishJournal) FinishAction(ctx context.Context, actionID string, st aip.ActionState, result json.RawMessage, detail string, at time.Time) (journal.Receipt, error) {
	if j.gated.CompareAndSwap(false, true) {
		close(j.reached)
		<-j.release
	}
	return j.Journal.FinishAction(ctx, actionID, st, result, detail, at)
}

// flakyFinishJournal fails FinishAction while failures remain, the way a
// PostgreSQL journal does during a failover.
type flakyFinishJournal struct {
	*memjournal.Journal
	failures atomic.Int32
	attempts atomic.Int32
}

func (j *flakyFinishJournal) FinishAction(ctx context.Context, actionID string, state aip.ActionState, result json.RawMessage, detail string, at time.Time) (journal.Receipt, error) {
	j.attempts.Add(1)
	if j.failures.Add(-1) >= 0 {
		return journal.Receipt{}, errors.New("storage: connection refused")
	}
	return j.Journal.FinishAction(ctx, actionID, state, result, detail, at)
}

// TestOutcomeWriteRetriedUntilJournaled: an outcome the journal could not
// store at first is written again until it is; the action is answered with
// its result (and receipt), and a retry of it is answered from the
// journal, not left running until the replica restarts.
func TestOutcomeWriteRetriedUntilJournaled(t *testing.T) {
	f := newFleet(t)
	j := &flakyFinishJournal{Journal: f.j}
	f.cfg.Journal = j
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ctx := ctxT(t)

	j.failures.Store(3)
	a := action(capEcho, `{"message":"after a failover"}`)
	resp, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	r, err := resp.Result()
	if err != nil || r.Status != aip.ResultCompleted || r.Receipt == nil {
		t.Fatalf("answer %+v, %v (body %s); want the completed result with its receipt", r, err, resp.Raw)
	}
	if n := j.attempts.Load(); n != 4 {
		t.Errorf("%d outcome writes, want 4 (3 failed, then stored)", n)
	}
	st, _, err := f.d.Status(ctx, target, a.ID, a.CapabilityID)
	if err != nil || st.State != aip.StateCompleted {
		t.Fatalf("journaled state %+v, %v; want completed", st, err)
	}
	again, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	if r2, err := again.Result(); err != nil || r2.Status != aip.ResultCompleted || r2.Receipt == nil || r2.Receipt.ID != r.Receipt.ID {
		t.Fatalf("retry answered %+v, %v; want the journaled result", r2, err)
	}
	if n := conn.runCount(a.ID); n != 1 {
		t.Errorf("connector ran %d times, want 1", n)
	}
}

// TestOutcomeWriteStopsAtShutdown: an outcome the journal never takes is
// retried only until the host stops; the host still stops, and the action
// stays running in the journal for recovery to reconcile at the next start.
func TestOutcomeWriteStopsAtShutdown(t *testing.T) {
	f := newFleet(t)
	j := &flakyFinishJournal{Journal: f.j}
	f.cfg.Journal = j
	f.cfg.DrainTimeout = 200 * time.Millisecond
	conn := newTestConnector()
	h, target := f.start(t, conn)
	ctx := ctxT(t)

	j.failures.Store(1 << 30)
	a := action(capEcho, `{"message":"storage gone"}`)
	answered := make(chan *hostsdktest.Response, 1)
	go func() {
		resp, _ := f.d.Act(ctx, target, a)
		answered <- resp
	}()
	for j.attempts.Load() < 2 {
		select {
		case <-ctx.Done():
			t.Fatal("the outcome write was not retried")
		case <-time.After(10 * time.Millisecond):
		}
	}
	h.Stop(ctx)
	resp := <-answered
	if resp != nil && resp.Status == http.StatusOK {
		t.Fatalf("answered %s; want an error: the outcome was never journaled", resp.Raw)
	}
	rec, err := f.j.Action(ctx, a.ID)
	if err != nil || rec.Status != aip.StateRunning {
		t.Fatalf("journal record %+v, %v; want running, for recovery", rec, err)
	}
}

// TestHugeActionTimeoutDoesNotExpireAtOnce: a timeout_ms too large for a
// time.Duration bounds nothing; it must not wrap round to a deadline that
// has already passed.
func TestHugeActionTimeoutDoesNotExpireAtOnce(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	_, target := f.start(t, conn)
	for _, ms := range []uint64{9_223_372_036_855, 1 << 53} {
		a := action(capBlock, `{"message":"no hurry"}`)
		a.TimeoutMS = &ms
		answered := make(chan *hostsdktest.Response, 1)
		go func() {
			resp, _ := f.d.Act(ctxT(t), target, a)
			answered <- resp
		}()
		var resp *hostsdktest.Response
		select {
		case <-conn.started:
			select {
			case conn.release <- struct{}{}:
				resp = <-answered
			case resp = <-answered: // the action ended without being released
			}
		case resp = <-answered: // the action never started
		}
		if r, err := resp.Result(); err != nil || r.Status != aip.ResultCompleted {
			t.Fatalf("timeout_ms %d: answer %+v, %v (body %s); want completed", ms, r, err, resp.Raw)
		}
	}
}

// TestResultTooLargeToAnswer: a result no signed answer can carry within
// what a dispatcher reads is journaled outcome_unknown (the action ran; the
// caller cannot learn its result) and answered so, now and on a retry,
// rather than answered with a message the dispatcher refuses to read every
// time. A read-only capability's is a failed result instead
// (output_invalid, saying to ask for less): the read changed nothing, so
// the caller may ask again for less, and the dispatcher does not count it
// against the replica as an unknown outcome.
func TestResultTooLargeToAnswer(t *testing.T) {
	for _, c := range []struct {
		name  string
		conn  countingConnector
		state aip.ActionState
	}{{"write", newTestConnector(), aip.StateOutcomeUnknown}, {"read", readOnlyConnector{newTestConnector()}, aip.StateFailed}} {
		t.Run(c.name, func(t *testing.T) {
			f := newFleet(t)
			_, target := f.start(t, c.conn)
			ctx := ctxT(t)
			a := action(capEcho, `{"message":"huge-output"}`)
			for range 2 {
				resp, err := f.d.Act(ctx, target, a)
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.Raw) > aip.MaxMessageBytes {
					t.Fatalf("the answer is %d bytes, more than a dispatcher reads", len(resp.Raw))
				}
				if c.state == aip.StateFailed {
					res, err := resp.Result()
					if err != nil || res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != hostsdk.CodeOutputInvalid ||
						!strings.Contains(res.Error.Message, "more than the") || !strings.Contains(res.Error.Message, "ask for less") {
						t.Fatalf("answer %+v, %v (body %.300s); want failed output_invalid saying to ask for less", res, err, resp.Raw)
					}
					continue
				}
				if pe := wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown); !strings.Contains(pe.Message, "more than the") {
					t.Errorf("message %q does not say the result was too large", pe.Message)
				}
			}
			rec, err := f.j.Action(ctx, a.ID)
			if err != nil || rec.Status != c.state || (c.state == aip.StateOutcomeUnknown && len(rec.Result) != 0) {
				t.Fatalf("journal record %s, %d result bytes, %v; want %s", rec.Status, len(rec.Result), err, c.state)
			}
			if n := c.conn.runCount(a.ID); n != 1 {
				t.Errorf("connector ran %d times, want 1", n)
			}
		})
	}
}

// TestReadOnly: only a contract whose side effects are read, with or
// without external_network, is read-only. An empty list says nothing a
// failed result could rely on: a connector that left its effects out may
// write, and a failed result would invite sending its action again.
func TestReadOnly(t *testing.T) {
	for _, c := range []struct {
		effects []aip.SideEffect
		want    bool
	}{
		{[]aip.SideEffect{aip.EffectRead}, true},
		{[]aip.SideEffect{aip.EffectRead, aip.EffectExternalNetwork}, true},
		{[]aip.SideEffect{aip.EffectExternalNetwork}, false},
		{[]aip.SideEffect{aip.EffectRead, aip.EffectWrite}, false},
		{[]aip.SideEffect{}, false},
		{nil, false},
	} {
		if got := hostsdk.ReadOnly(&aip.Capability{ID: "x", Contract: &aip.CapabilityContract{SideEffects: c.effects}}); got != c.want {
			t.Errorf("ReadOnly(side_effects %v) = %v, want %v", c.effects, got, c.want)
		}
	}
	if hostsdk.ReadOnly(nil) {
		t.Error("ReadOnly(nil) = true")
	}
	if hostsdk.ReadOnly(&aip.Capability{ID: "x"}) {
		t.Error("ReadOnly of a capability without a contract = true")
	}
}
