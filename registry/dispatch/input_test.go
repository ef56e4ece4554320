package dispatch_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// notRouted fails the test when the action has a route: a refused request
// must change nothing.
func (w *world) notRouted(id string) {
	w.t.Helper()
	if _, err := w.reg.Assignment(w.ctx, id); !errors.Is(err, registry.ErrNotFound) {
		w.t.Fatalf("refused action %s was routed (%v)", id, err)
	}
	if n := len(w.counter.runs(id)); n != 0 {
		w.t.Fatalf("refused action %s ran %d times", id, n)
	}
}

func errorCode(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error *aip.ProtocolError `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil {
		t.Fatalf("not an error answer: %s", body)
	}
	return e.Error.Code
}

// TestBodiesThatAreNotIJSONAreRefused: a body a signed envelope cannot
// carry (I-JSON, RFC 7493) is refused before admission with 400
// dispatch.request_invalid. Duplicate names were read last-wins (a proxy
// reading the first capability_id saw another action than the one run),
// and an input with a duplicate name, a number out of the double range or
// a lone surrogate was routed, reserved and then answered 502
// dispatch.replica_unreachable ("not sent"), as if the replica were down.
func TestBodiesThatAreNotIJSONAreRefused(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	for name, body := range map[string]string{
		"capability_id twice": `{"action_id":%q,"capability_id":"no.such","capability_id":"fleet.say","input":{"text":"x"}}`,
		"input member twice":  `{"action_id":%q,"capability_id":"fleet.say","input":{"text":"x","text":"y"}}`,
		"number too large":    `{"action_id":%q,"capability_id":"fleet.say","input":{"text":"x","n":1e400}}`,
		"lone surrogate":      `{"action_id":%q,"capability_id":"fleet.say","input":{"text":"\ud800"}}`,
	} {
		id := aip.NewActionID()
		status, out, _ := w.call(http.MethodPost, dispatch.PathActions, tenant, fmt.Sprintf(body, id))
		if status != http.StatusBadRequest || errorCode(t, out) != dispatch.CodeRequestInvalid {
			t.Errorf("%s: answer %d %s, want 400 %s", name, status, out, dispatch.CodeRequestInvalid)
		}
		w.notRouted(id)
	}
	w.idle()
}

// TestMemberNamesAreExact: the members of an action request are matched
// by their exact names, and the body is one JSON object. encoding/json
// matched them case-insensitively (folding U+212A KELVIN SIGN onto 'k'
// too): {"Capability_ID": ...} was run as capability_id, and a body with
// both "capability_id" and "CAPABILITY_ID" — no duplicate to the I-JSON
// check — ran the second while a proxy or any case-sensitive reader saw
// the first. A null body was answered 422 "capability_id is required" as
// if it were an empty object.
func TestMemberNamesAreExact(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	for name, body := range map[string]string{
		"capitalized member":      `{"action_id":%q,"Capability_ID":"fleet.say","input":{"text":"x"}}`,
		"two case variants":       `{"action_id":%q,"capability_id":"no.such","CAPABILITY_ID":"fleet.say","input":{"text":"x"}}`,
		"upper case mode":         `{"action_id":%q,"capability_id":"fleet.say","input":{"text":"x"},"MODE":"sync"}`,
		"kelvin sign for k":       `{"action_id":%q,"capability_id":"fleet.say","input":{"text":"x"},"idempotency_Key":"k1"}`,
		"escaped case variant":    `{"action_id":%q,"capability_id":"fleet.say","\u0049nput":{"text":"x"},"input":{"text":"y"}}`,
		"null body (%q unused)":   `null`,
		"string body (%q unused)": `"act"`,
	} {
		id := aip.NewActionID()
		if strings.Contains(body, "%q") {
			body = fmt.Sprintf(body, id)
		}
		status, out, _ := w.call(http.MethodPost, dispatch.PathActions, tenant, body)
		if status != http.StatusBadRequest || errorCode(t, out) != dispatch.CodeRequestInvalid {
			t.Errorf("%s: answer %d %s, want 400 %s", name, status, out, dispatch.CodeRequestInvalid)
		}
		w.notRouted(id)
	}
	// The message names the member and what it should be.
	_, out, _ := w.call(http.MethodPost, dispatch.PathActions, tenant, `{"Capability_ID":"fleet.say","input":{}}`)
	var e dispatch.ErrorResponse
	must(t, json.Unmarshal(out, &e))
	if !strings.Contains(e.Error.Message, `"Capability_ID"`) || !strings.Contains(e.Error.Message, `"capability_id"`) {
		t.Errorf("message %q does not name the member and its exact name", e.Error.Message)
	}
	if _, err := dispatch.DecodeActionRequest([]byte(`{"capability_id":"fleet.say","Input":{}}`)); err == nil {
		t.Error("DecodeActionRequest took a case variant of input")
	}
	w.idle()
}

// TestInputDepthIsBoundedBeforeRouting: an input nested up to
// MaxInputDepth levels reaches the replica and completes; one level more
// could not be signed (the envelope would pass the canonical JSON depth
// limit) and is refused with 422 dispatch.action_invalid before it is
// routed. It was routed, reserved and answered 502
// dispatch.replica_unreachable.
func TestInputDepthIsBoundedBeforeRouting(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	nested := func(depth int) json.RawMessage { // an object holding depth-1 nested arrays
		return json.RawMessage(`{"text":"deep","d":` + strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + `}`)
	}
	status, resp := w.act(dispatch.ActionRequest{CapabilityID: capSay, Input: nested(dispatch.MaxInputDepth)})
	if status != http.StatusOK || resp.Result == nil || resp.Result.Status != aip.ResultCompleted {
		t.Fatalf("input %d levels deep: answer %d %+v", dispatch.MaxInputDepth, status, resp.Error)
	}
	id := aip.NewActionID()
	status, out, _ := w.call(http.MethodPost, dispatch.PathActions, tenant,
		dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: nested(dispatch.MaxInputDepth + 1)})
	if status != http.StatusUnprocessableEntity || errorCode(t, out) != dispatch.CodeActionInvalid {
		t.Fatalf("input %d levels deep: answer %d %s, want 422 %s", dispatch.MaxInputDepth+1, status, out, dispatch.CodeActionInvalid)
	}
	w.notRouted(id)
	// Execute (the embedding entry point) checks the input the same way.
	id = aip.NewActionID()
	resp, status = w.d.Execute(w.ctx, tenant, dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: json.RawMessage(`{"text":"a","text":"b"}`)}, nil)
	if status != http.StatusUnprocessableEntity || resp.Error == nil || resp.Error.Code != dispatch.CodeActionInvalid {
		t.Fatalf("Execute with a duplicate input member: %d %+v", status, resp.Error)
	}
	w.notRouted(id)
	w.idle()
}

// TestActionTextFieldsAreCheckedBeforeRouting: a capability ID or an
// idempotency key a replica or the registry cannot take is refused by the
// dispatcher, before admission, with a message naming the field. An
// idempotency key with a NUL was routed, sent and refused by the replica's
// journal (connector_host.input_invalid), and a capability ID with a
// control character or surrounding spaces was refused by the registry in a
// route_request message after admission.
func TestActionTextFieldsAreCheckedBeforeRouting(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	for _, c := range []struct {
		body  string
		field string
	}{
		{`{"action_id":%q,"capability_id":"fleet.say","input":{"text":"x"},"idempotency_key":"a\u0000b"}`, "idempotency_key"},
		{`{"action_id":%q,"capability_id":"fleet.say\u0000","input":{"text":"x"}}`, "capability_id"},
		{`{"action_id":%q,"capability_id":" fleet.say","input":{"text":"x"}}`, "capability_id"},
		{`{"action_id":%q,"capability_id":"fleet.say\n","input":{"text":"x"}}`, "capability_id"},
	} {
		id := aip.NewActionID()
		status, out, _ := w.call(http.MethodPost, dispatch.PathActions, tenant, fmt.Sprintf(c.body, id))
		var e dispatch.ErrorResponse
		must(t, json.Unmarshal(out, &e))
		if status != http.StatusUnprocessableEntity || e.Error == nil || e.Error.Code != dispatch.CodeActionInvalid || !strings.HasPrefix(e.Error.Message, c.field) {
			t.Errorf("%s: answer %d %s, want 422 %s naming %s", c.body, status, out, dispatch.CodeActionInvalid, c.field)
		}
		w.notRouted(id)
	}
	w.idle()
}

// TestCancelBodiesAreStrict: a cancel body is empty or one I-JSON
// {"reason": ...} object and nothing else, like an action's; anything else
// is 400 and sends no cancel. A closing brace or bracket after the object
// was taken as the end of it, and the action was cancelled; so were a null
// body and a case variant of reason ({"Reason": ...}).
func TestCancelBodiesAreStrict(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	id := aip.NewActionID()
	if status, resp := w.act(dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: say("x", "")}); status != http.StatusOK {
		t.Fatalf("action: %d %+v", status, resp.Error)
	}
	path := dispatch.PathActions + "/" + id + "/cancel"
	for _, body := range []string{`{"reason":"x"}}`, `{"reason":"x"}]`, `{"reason":"x"} {}`, `{"reason":"x","reason":"y"}`, `{"why":"x"}`, `[]`,
		`null`, `"x"`, `{"Reason":"x"}`, `{"REASON":"x"}`} {
		status, out, _ := w.call(http.MethodPost, path, tenant, body)
		if status != http.StatusBadRequest || errorCode(t, out) != dispatch.CodeRequestInvalid {
			t.Errorf("cancel body %s: %d %s, want 400", body, status, out)
		}
	}
	// The documented answers of a reason too long and a body too large.
	for _, c := range []struct {
		body   string
		status int
		code   string
	}{
		{`{"reason":"` + strings.Repeat("r", dispatch.MaxCancelReasonBytes+1) + `"}`, http.StatusUnprocessableEntity, dispatch.CodeActionInvalid},
		{`{"reason":"` + strings.Repeat("r", 64<<10) + `"}`, http.StatusRequestEntityTooLarge, dispatch.CodeRequestTooLarge},
	} {
		if status, out, _ := w.call(http.MethodPost, path, tenant, c.body); status != c.status || errorCode(t, out) != c.code {
			t.Errorf("cancel body of %d bytes: %d %s, want %d %s", len(c.body), status, out, c.status, c.code)
		}
	}
	res, err := w.reg.Reservation(w.ctx, id)
	must(t, err)
	if res.LastSettlement != registry.SettlementCompleted {
		t.Fatalf("a refused cancel settled the route: %+v", res)
	}
	for _, body := range []any{nil, "", `{}`, `{"reason":"done"}` + "\n", `{"reason":"` + strings.Repeat("r", dispatch.MaxCancelReasonBytes) + `"}`} {
		if status, out, _ := w.call(http.MethodPost, path, tenant, body); status != http.StatusOK {
			t.Errorf("cancel body %v: %d %s", body, status, out)
		}
	}
}
