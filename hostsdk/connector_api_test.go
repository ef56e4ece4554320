package hostsdk_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// funcConnector is the test connector with Handle (and, when set,
// Manifest) replaced by functions, for the cases of a connector author's
// code misbehaving.
type funcConnector struct {
	*testConnector
	handle   func(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error)
	manifest func(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error)
}

func (c *funcConnector) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	if c.manifest != nil {
		return c.manifest(ctx, tenant)
	}
	return c.testConnector.Manifest(ctx, tenant)
}

func (c *funcConnector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	if c.handle == nil {
		return c.testConnector.Handle(ctx, call)
	}
	return c.handle(ctx, call)
}

// completedWith returns a Handle that answers completed with raw as output.
func completedWith(raw string) func(context.Context, *hostsdk.Call) (*aip.ActionResult, error) {
	return func(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
		return &aip.ActionResult{ActionID: call.Action.ID, Status: aip.ResultCompleted, Output: json.RawMessage(raw)}, nil
	}
}

// TestResultThatCannotBeSignedIsOutcomeUnknown: a completed result whose
// output is JSON but not the I-JSON a signed answer is made of (a number
// beyond the double range, a member twice, a lone surrogate, nesting past
// the canonical depth once inside the envelope) cannot be returned: the
// action ran, so it is journaled outcome_unknown and every delivery is
// answered so. It was left running (the journal refused to digest it),
// answered as in progress until a restart, or journaled completed and
// answered unsigned.
func TestResultThatCannotBeSignedIsOutcomeUnknown(t *testing.T) {
	deep := strings.Repeat("[", 254) + strings.Repeat("]", 254)
	for name, output := range map[string]string{
		"number out of range": `{"n":1e400}`,
		"duplicate member":    `{"a":1,"a":2}`,
		"lone surrogate":      `{"a":"\ud800"}`,
		"nested too deep":     deep,
	} {
		t.Run(name, func(t *testing.T) {
			f := newFleet(t)
			conn := &funcConnector{testConnector: newTestConnector(), handle: completedWith(output)}
			_, target := f.start(t, conn)
			ctx := ctxT(t)
			a := action(capBlock, `{"message":"x"}`)
			for _, delivery := range []string{"first", "retry"} {
				resp, err := f.d.Act(ctx, target, &aip.Action{ID: a.ID, CapabilityID: a.CapabilityID, Input: a.Input})
				if err != nil {
					t.Fatalf("%s delivery: %v", delivery, err)
				}
				pe := wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown)
				if !strings.Contains(pe.Message, "cannot be carried in a signed answer") {
					t.Errorf("%s delivery: message %q does not say why", delivery, pe.Message)
				}
			}
			rec, err := f.j.Action(ctx, a.ID)
			if err != nil || rec.Status != aip.StateOutcomeUnknown || len(rec.Result) != 0 {
				t.Fatalf("journal record %s %q result %s (%v), want outcome_unknown without a result", rec.Status, rec.Detail, rec.Result, err)
			}
		})
	}
}

// TestInvalidProtocolErrorFromHandle: Handle failing with an
// *aip.ProtocolError that is not valid (no code, an unknown category) is
// a failed action with connector.failed naming the problem; carried as it
// was, every answer was an envelope the dispatcher refuses as malformed.
func TestInvalidProtocolErrorFromHandle(t *testing.T) {
	for name, pe := range map[string]*aip.ProtocolError{
		"no code":          {Message: "provider said no"},
		"unknown category": aip.NewProtocolError("my.code", "nonsense", false, 0, "provider said no"),
	} {
		t.Run(name, func(t *testing.T) {
			f := newFleet(t)
			conn := &funcConnector{testConnector: newTestConnector(), handle: func(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
				return nil, pe
			}}
			_, target := f.start(t, conn)
			ctx := ctxT(t)
			a := action(capBlock, `{"message":"x"}`)
			resp, err := f.d.Act(ctx, target, a)
			if err != nil {
				t.Fatal(err)
			}
			res, err := resp.Result()
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != hostsdk.CodeConnectorFailed ||
				!strings.Contains(res.Error.Message, "invalid protocol error") || !strings.Contains(res.Error.Message, "provider said no") {
				t.Fatalf("result %+v error %+v", res, res.Error)
			}
			checkInvalidProtocolErrorMessage(t, name, res.Error.Message)
			if rec, err := f.j.Action(ctx, a.ID); err != nil || rec.Status != aip.StateFailed {
				t.Fatalf("journal record %s (%v), want failed", rec.Status, err)
			}
		})
	}
}

// TestReconciledResultThatCannotBeSignedIsOutcomeUnknown: the same holds
// for a Reconciler's result. One that the journal could not digest (a
// member twice) blocked registration at every start; one it could (too
// deep once inside an envelope) was journaled and answered unsigned.
func TestReconciledResultThatCannotBeSignedIsOutcomeUnknown(t *testing.T) {
	for name, output := range map[string]string{
		"duplicate member": `{"a":1,"a":2}`,
		"nested too deep":  strings.Repeat("[", 254) + strings.Repeat("]", 254),
	} {
		t.Run(name, func(t *testing.T) {
			f := newFleet(t)
			conn := newTestConnector()
			a := action(capEcho, `{"message":"crashed"}`)
			leaveRunning(t, f.j, a, true)
			conn.reconcile = func(ctx context.Context, u *hostsdk.UncertainAction) (*aip.ActionResult, error) {
				return &aip.ActionResult{Status: aip.ResultCompleted, Output: json.RawMessage(output)}, nil
			}
			_, target := f.start(t, reconcilingConnector{conn})
			ctx := ctxT(t)
			rec, err := f.j.Action(ctx, a.ID)
			if err != nil || rec.Status != aip.StateOutcomeUnknown || !strings.Contains(rec.Detail, "cannot be carried in a signed answer") {
				t.Fatalf("journal record %s %q (%v), want outcome_unknown saying why", rec.Status, rec.Detail, err)
			}
			resp, err := f.d.Act(ctx, target, a)
			if err != nil {
				t.Fatal(err)
			}
			wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown)
		})
	}
}

// TestResultAtTheDepthLimitIsAnsweredToAStatusQuery: a status query's
// answer carries the journaled result one level deeper than the action's
// answer (body.action_status.result, not body.action_result). A result
// nested as deep as the action's answer could just carry was journaled
// completed, and every status query of it was answered unsigned (the
// answer could not be signed): it is outcome_unknown, as one a level
// deeper is.
func TestResultAtTheDepthLimitIsAnsweredToAStatusQuery(t *testing.T) {
	fits := func(wrapped string) bool { _, err := aip.Canonicalize([]byte(wrapped)); return err == nil }
	output := ""
	for n := 1; n < 300; n++ {
		o := strings.Repeat("[", n) + strings.Repeat("]", n)
		res := `{"action_id":"x","status":"completed","output":` + o + `}`
		if fits(`{"body":{"action_result":`+res+`}}`) && !fits(`{"body":{"action_status":{"result":`+res+`}}}`) {
			output = o
			break
		}
	}
	if output == "" {
		t.Fatal("no nesting fits an action's answer and not a status query's")
	}
	f := newFleet(t)
	conn := &funcConnector{testConnector: newTestConnector(), handle: completedWith(output)}
	_, target := f.start(t, conn)
	ctx := ctxT(t)
	a := action(capBlock, `{"message":"x"}`)
	resp, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown)
	st, _, err := f.d.Status(ctx, target, a.ID, a.CapabilityID)
	if err != nil {
		t.Fatalf("status query: %v", err)
	}
	if st.State != aip.StateOutcomeUnknown {
		t.Fatalf("status %s, want outcome_unknown", st.State)
	}
}

// TestInvalidProtocolErrorInFailedResult: a failed result whose error is
// not valid (call.Fail with an empty code or an unknown category) is, like
// the same error returned from Handle, a failed action with
// connector.failed naming the problem. It was journaled outcome_unknown,
// telling the caller the effect may have happened although the connector
// said the action failed, even for a read.
func TestInvalidProtocolErrorInFailedResult(t *testing.T) {
	for name, fail := range map[string]func(call *hostsdk.Call) *aip.ActionResult{
		"no code": func(call *hostsdk.Call) *aip.ActionResult {
			return call.Fail("", aip.CategoryPermanent, false, "provider said no")
		},
		"unknown category": func(call *hostsdk.Call) *aip.ActionResult {
			return call.Fail("my.code", "nonsense", false, "provider said no")
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFleet(t)
			conn := &funcConnector{testConnector: newTestConnector(), handle: func(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
				return fail(call), nil
			}}
			_, target := f.start(t, conn)
			ctx := ctxT(t)
			a := action(capBlock, `{"message":"x"}`)
			resp, err := f.d.Act(ctx, target, a)
			if err != nil {
				t.Fatal(err)
			}
			res, err := resp.Result()
			if err != nil {
				t.Fatalf("answer %d %s: %v", resp.Status, resp.Raw, err)
			}
			if res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != hostsdk.CodeConnectorFailed ||
				!strings.Contains(res.Error.Message, "invalid protocol error") || !strings.Contains(res.Error.Message, "provider said no") {
				t.Fatalf("result %+v error %+v", res, res.Error)
			}
			checkInvalidProtocolErrorMessage(t, name, res.Error.Message)
			if rec, err := f.j.Action(ctx, a.ID); err != nil || rec.Status != aip.StateFailed {
				t.Fatalf("journal record %s (%v), want failed", rec.Status, err)
			}
		})
	}
}

// checkInvalidProtocolErrorMessage: the message of a connector's invalid
// protocol error says what is wrong with it: one without a code says so,
// rather than quoting it as ": provider said no" after a colon of its own.
func checkInvalidProtocolErrorMessage(t *testing.T, name, msg string) {
	t.Helper()
	want := `the connector failed with an invalid protocol error (protocol error my.code: unknown category "nonsense"): my.code: provider said no`
	if name == "no code" {
		want = "the connector failed with an invalid protocol error: its code is empty (the connector must give every protocol error a code): provider said no"
	}
	if msg != want {
		t.Errorf("message %q, want %q", msg, want)
	}
}
