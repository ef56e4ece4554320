package chatwoot

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

func TestMessageCreate(t *testing.T) {
	e := newEnv(t, nil)
	a := hostsdktest.NewAction(CapMessageCreate, `{"conversation_id":42,"content":"Hello from AIP","private":true}`)
	out := e.completed(t, a)
	if out["message_id"] != float64(101) || out["conversation_id"] != float64(42) || out["private"] != true {
		t.Errorf("output %v", out)
	}
	got := e.last(t)
	if got.Method != "POST" || got.Path != accountPath+"/conversations/42/messages" || got.Token != testToken {
		t.Fatalf("request %+v", got)
	}
	want := map[string]any{"content": "Hello from AIP", "message_type": "outgoing", "private": true,
		"content_attributes": map[string]any{ActionIDAttribute: a.ID}}
	if diff := cmp.Diff(want, got.Body); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}

	// The same action again: journaled, Chatwoot not called again.
	e.completed(t, a)
	if n := e.mock.count("POST /conversations/42/messages"); n != 1 {
		t.Errorf("POST messages %d times, want 1", n)
	}

	// A distinct idempotency key is recorded next to the action ID, scoped
	// as every provider gets it (provider.ScopedIdempotencyKey), never as
	// the caller chose it: content_attributes reach the contact's widget.
	b := hostsdktest.NewAction(CapMessageCreate, `{"conversation_id":42,"content":"again"}`)
	b.IdempotencyKey = "order-77-reply"
	e.completed(t, b)
	attrs := e.last(t).Body["content_attributes"].(map[string]any)
	scoped := provider.ScopedIdempotencyKey(hostsdktest.TenantID, CapMessageCreate, "order-77-reply")
	if attrs[ActionIDAttribute] != b.ID || attrs["aip_idempotency_key"] != scoped || e.last(t).Body["private"] != false {
		t.Errorf("second message body %v; want content_attributes.aip_idempotency_key %s", e.last(t).Body, scoped)
	}
	if raw, _ := json.Marshal(e.last(t).Body); strings.Contains(string(raw), "order-77-reply") {
		t.Errorf("the caller's idempotency key reached Chatwoot as it is: %s", raw)
	}
}

func TestConversationStatus(t *testing.T) {
	e := newEnv(t, nil)
	out := e.completed(t, hostsdktest.NewAction(CapConversationStatus, `{"conversation_id":5,"status":"resolved"}`))
	if out["status"] != "resolved" || out["conversation_id"] != float64(5) {
		t.Errorf("output %v", out)
	}
	got := e.last(t)
	if got.Path != accountPath+"/conversations/5/toggle_status" || !cmp.Equal(got.Body, map[string]any{"status": "resolved"}) {
		t.Errorf("request %+v", got)
	}
	// success false from Chatwoot is a failed result.
	e.mock.setFault("POST /conversations/6/toggle_status", fault{200, `{"meta":{},"payload":{"success":false,"current_status":"open","conversation_id":6}}`})
	res := e.Result(t, hostsdktest.NewAction(CapConversationStatus, `{"conversation_id":6,"status":"pending"}`))
	if res.Status != aip.ResultFailed || res.Error.Code != "chatwoot.status_not_changed" {
		t.Errorf("success false: %s %+v", res.Status, res.Error)
	}
}

func TestConversationHandoff(t *testing.T) {
	e := newEnv(t, nil)
	a := hostsdktest.NewAction(CapConversationHandoff, `{"conversation_id":8,"assignee_id":3,"note":"Customer asks for a refund"}`)
	out := e.completed(t, a)
	if out["assigned"] != true || out["assignee_id"] != float64(3) || out["note_message_id"] != float64(101) {
		t.Errorf("output %v", out)
	}
	reqs := e.mock.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want assignment then note", len(reqs))
	}
	if reqs[0].Path != accountPath+"/conversations/8/assignments" || !cmp.Equal(reqs[0].Body, map[string]any{"assignee_id": float64(3)}) {
		t.Errorf("assignment %+v", reqs[0])
	}
	wantNote := map[string]any{"content": "Customer asks for a refund", "message_type": "outgoing", "private": true,
		"content_attributes": map[string]any{ActionIDAttribute: a.ID}}
	if diff := cmp.Diff(wantNote, reqs[1].Body); diff != "" {
		t.Errorf("note (-want +got):\n%s", diff)
	}

	// A team handoff without a note makes one call.
	out = e.completed(t, hostsdktest.NewAction(CapConversationHandoff, `{"conversation_id":9,"team_id":2}`))
	if got := e.last(t); got.Path != accountPath+"/conversations/9/assignments" || !cmp.Equal(got.Body, map[string]any{"team_id": float64(2)}) {
		t.Errorf("team assignment %+v", got)
	}
	if _, noted := out["note_message_id"]; noted || out["team_id"] != float64(2) {
		t.Errorf("output %v", out)
	}
}

func TestHandoffNoteRefusedSaysAssignmentApplied(t *testing.T) {
	e := newEnv(t, nil)
	e.mock.setFault("POST /conversations/8/messages", fault{422, `{"description":"content is too long","errors":[]}`})
	res := e.Result(t, hostsdktest.NewAction(CapConversationHandoff, `{"conversation_id":8,"assignee_id":3,"note":"n"}`))
	if res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != CodeHandoffNoteFailed {
		t.Fatalf("result %s %+v", res.Status, res.Error)
	}
	if !strings.Contains(res.Error.Message, "assigned (applied)") || !strings.Contains(res.Error.Message, "content is too long") {
		t.Errorf("message %q does not say the assignment applied and why the note failed", res.Error.Message)
	}
	var details struct {
		AssignmentApplied bool              `json:"assignment_applied"`
		NoteAdded         bool              `json:"note_added"`
		NoteError         aip.ProtocolError `json:"note_error"`
	}
	if err := json.Unmarshal(res.Error.Details, &details); err != nil || !details.AssignmentApplied || details.NoteAdded ||
		details.NoteError.Code != provider.CodeInvalidRequest {
		t.Errorf("details %s (%v)", res.Error.Details, err)
	}
	if e.mock.count("POST /conversations/8/assignments") != 1 {
		t.Error("the assignment was not made once")
	}
}

// TestConversationCreateRefusedSaysContactInboxMayHaveChanged: Chatwoot
// links the contact to the inbox (and in an email, SMS, Twilio or
// WhatsApp inbox gives another contact's contact inbox holding the
// source ID a new one) before the transaction that creates the
// conversation, so a create it refuses there leaves that done; the
// failure said only Chatwoot's refusal, as if nothing had changed. It
// says what may have changed and how to check; refusals that come before
// the link (404 of the inbox or contact, 401, 403, 429, and the 422
// "source_id should be unique") and a create without inbox_id and
// contact_id stay as they were.
func TestConversationCreateRefusedSaysContactInboxMayHaveChanged(t *testing.T) {
	e := newEnv(t, nil)
	const linked = `{"source_id":"ada@example.com","inbox_id":3,"contact_id":9,"assignee_id":77,"message":{"content":"hi"}}`
	for _, tc := range []struct {
		name  string
		fault fault
		input string
		note  bool
	}{
		{"422 in the create's transaction", fault{422, `{"message":"Assignee must exist","attributes":["assignee"]}`}, linked, true},
		{"404 of the inbox or contact", fault{404, `{"error":"Resource could not be found"}`}, linked, false},
		{"401", fault{401, `{"error":"You are not authorized to do this action"}`}, linked, false},
		{"source ID of another contact in an API inbox", fault{422, `{"error":"source_id should be unique"}`}, linked, false},
		{"source ID only", fault{422, `{"message":"Assignee must exist","attributes":["assignee"]}`},
			`{"source_id":"ada@example.com","assignee_id":77}`, false},
	} {
		e.mock.setFault("POST /conversations", tc.fault)
		res := e.Result(t, hostsdktest.NewAction(CapabilityPrefix+"conversation.create", tc.input))
		if res.Status != aip.ResultFailed || res.Error == nil {
			t.Errorf("%s: result %s %+v, want failed", tc.name, res.Status, res.Error)
			continue
		}
		msg := res.Error.Message
		said := strings.Contains(msg, `no conversation was created, but Chatwoot first links contact 9 to inbox 3 with source_id "ada@example.com"`) &&
			strings.Contains(msg, "another contact's contact inbox") && strings.Contains(msg, "contact.get of contact 9") &&
			strings.Contains(msg, "contact.search with q the source ID")
		if said != tc.note {
			t.Errorf("%s: message %q; want it to say what may have changed: %v", tc.name, msg, tc.note)
		}
		var chatwootSaid string
		json.Unmarshal([]byte(tc.fault.body), &struct {
			Message *string `json:"message"`
			Error   *string `json:"error"`
		}{&chatwootSaid, &chatwootSaid})
		if !strings.Contains(msg, chatwootSaid) {
			t.Errorf("%s: message %q does not say what Chatwoot said (%q)", tc.name, msg, chatwootSaid)
		}
	}

	// No answer: outcome_unknown, saying the link may be made too.
	e.mock.setFault("POST /conversations", fault{status: 0})
	resp := e.Act(t, hostsdktest.NewAction(CapabilityPrefix+"conversation.create", linked))
	if pe := resp.ProtocolError(); resp.Status != http.StatusBadGateway || pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown ||
		!strings.Contains(pe.Message, "the conversation may or may not have been created, and Chatwoot first links contact 9 to inbox 3") {
		t.Errorf("no answer: HTTP %d %+v, want outcome_unknown saying the contact inbox may have changed", resp.Status, pe)
	}
}

func TestHandoffNoteUnknownIsOutcomeUnknown(t *testing.T) {
	e := newEnv(t, nil)
	e.mock.setFault("POST /conversations/8/messages", fault{status: 0})
	a := hostsdktest.NewAction(CapConversationHandoff, `{"conversation_id":8,"assignee_id":3,"note":"n"}`)
	resp := e.Act(t, a)
	pe := resp.ProtocolError()
	if resp.Status != http.StatusBadGateway || pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown ||
		!strings.Contains(pe.Message, "assigned (applied)") {
		t.Fatalf("HTTP %d %+v", resp.Status, pe)
	}
	st, _, err := e.Dispatcher.Status(hostsdktest.Context(t), e.Target, a.ID, a.CapabilityID)
	if err != nil || st.State != aip.StateOutcomeUnknown {
		t.Fatalf("status %+v, %v", st, err)
	}
}

// TestCatalogue runs every catalogue operation through the host and
// checks the request Chatwoot received (the spec check has already
// matched it against the document) and the output.
func TestCatalogue(t *testing.T) {
	// Every operation, the opt-in agent administration included.
	e := newEnv(t, func(c *Config) { c.Operations = operationSuffixes() })
	cases := []struct {
		suffix, input     string
		method, path, raw string // raw query
		body              map[string]any
		wantData          string // a fragment of output.data
	}{
		{"account.get", `{}`, "GET", "", "", nil, `"name":"Acme Support"`},
		{"agent.list", `{}`, "GET", "/agents", "", nil, `"email":"ada@acme.test"`},
		{"conversation.list", `{"assignee_type":"unassigned","status":"pending","q":"refund","inbox_id":1,"team_id":2,"labels":["vip","billing"],"page":2}`,
			"GET", "/conversations", "assignee_type=unassigned&inbox_id=1&labels=vip%2Cbilling&page=2&q=refund&status=pending&team_id=2", nil, `"all_count":1`},
		{"conversation.meta", `{"status":"all","labels":["vip"]}`, "GET", "/conversations/meta", "labels=vip&status=all", nil, `"unassigned_count":2`},
		{"conversation.get", `{"conversation_id":42}`, "GET", "/conversations/42", "", nil, `"id":42`},
		{"message.list", `{"conversation_id":42,"before":300}`, "GET", "/conversations/42/messages", "before=300", nil, `"content":"hi"`},
		{"contact.list", `{"sort":"-last_activity_at","page":3}`, "GET", "/contacts", "page=3&sort=-last_activity_at", nil, `"name":"Alice"`},
		{"contact.search", `{"q":"alice@acme.test"}`, "GET", "/contacts/search", "q=alice%40acme.test", nil, `"current_page":1`},
		{"contact.get", `{"contact_id":9}`, "GET", "/contacts/9", "", nil, `"id":9`},
		{"contact.create", `{"inbox_id":1,"name":"Bob","email":"bob@acme.test","custom_attributes":{"tier":"gold"}}`, "POST", "/contacts", "",
			map[string]any{"inbox_id": float64(1), "name": "Bob", "email": "bob@acme.test", "custom_attributes": map[string]any{"tier": "gold"}}, `"source_id":"src-1"`},
		{"contact.update", `{"contact_id":9,"phone_number":"+15550100","blocked":false}`, "PUT", "/contacts/9", "",
			map[string]any{"phone_number": "+15550100", "blocked": false}, `null`},
		{"contact.delete", `{"contact_id":9}`, "DELETE", "/contacts/9", "", nil, `null`},
		{"contact.filter", `{"page":2,"payload":[{"attribute_key":"email","filter_operator":"contains","values":["acme.test"],"query_operator":"AND"},` +
			`{"attribute_key":"country_code","filter_operator":"equal_to","values":["DE","AT"]}]}`, "POST", "/contacts/filter", "page=2",
			map[string]any{"payload": []any{
				map[string]any{"attribute_key": "email", "filter_operator": "contains", "values": []any{"acme.test"}, "query_operator": "AND"},
				map[string]any{"attribute_key": "country_code", "filter_operator": "equal_to", "values": []any{"DE", "AT"}}}}, `"name":"Carol"`},
		{"contact.conversation.list", `{"contact_id":9}`, "GET", "/contacts/9/conversations", "", nil, `"id":42`},
		{"contact.label.list", `{"contact_id":9}`, "GET", "/contacts/9/labels", "", nil, `"payload":["vip","billing"]`},
		{"contact.label.update", `{"contact_id":9,"labels":["vip"]}`, "POST", "/contacts/9/labels", "",
			map[string]any{"labels": []any{"vip"}}, `"payload":["vip"]`},
		{"conversation.create", `{"source_id":"src-1","inbox_id":1,"contact_id":9,"status":"pending","team_id":2,"snoozed_until":"2030-07-21T17:32:28Z",` +
			`"custom_attributes":{"order":"A-1"},"message":{"content":"Your order shipped","template_params":{"name":"shipping","category":"UTILITY","language":"en_US","processed_params":{"1":"A-1"}}}}`,
			"POST", "/conversations", "", map[string]any{"source_id": "src-1", "inbox_id": float64(1), "contact_id": float64(9), "status": "pending",
				"team_id": float64(2), "snoozed_until": "2030-07-21T17:32:28Z", "custom_attributes": map[string]any{"order": "A-1"},
				"message": map[string]any{"content": "Your order shipped", "template_params": map[string]any{"name": "shipping", "category": "UTILITY",
					"language": "en_US", "processed_params": map[string]any{"1": "A-1"}}}}, `"id":77`},
		{"conversation.update", `{"conversation_id":42,"priority":"urgent"}`, "PATCH", "/conversations/42", "",
			map[string]any{"priority": "urgent"}, `"priority":"urgent"`},
		{"conversation.filter", `{"payload":[{"attribute_key":"status","filter_operator":"equal_to","values":["pending"]}]}`, "POST", "/conversations/filter", "",
			map[string]any{"payload": []any{map[string]any{"attribute_key": "status", "filter_operator": "equal_to", "values": []any{"pending"}}}}, `"unassigned_count":1`},
		{"conversation.priority", `{"conversation_id":42,"priority":"none"}`, "POST", "/conversations/42/toggle_priority", "",
			map[string]any{"priority": "none"}, `null`},
		{"conversation.custom_attributes", `{"conversation_id":42,"custom_attributes":{"order_id":"12345"}}`, "POST", "/conversations/42/custom_attributes", "",
			map[string]any{"custom_attributes": map[string]any{"order_id": "12345"}}, `"order_id":"12345"`},
		{"conversation.label.list", `{"conversation_id":42}`, "GET", "/conversations/42/labels", "", nil, `"payload":["vip","billing"]`},
		{"conversation.label.update", `{"conversation_id":42,"labels":[]}`, "POST", "/conversations/42/labels", "",
			map[string]any{"labels": []any{}}, `"payload":[]`},
		{"message.delete", `{"conversation_id":42,"message_id":100}`, "DELETE", "/conversations/42/messages/100", "", nil, `null`},
		{"canned_response.list", `{}`, "GET", "/canned_responses", "", nil, `"short_code":"refund"`},
		{"canned_response.create", `{"short_code":"hi","content":"Hello!"}`, "POST", "/canned_responses", "",
			map[string]any{"short_code": "hi", "content": "Hello!"}, `"id":2`},
		{"canned_response.update", `{"canned_response_id":1,"content":"Refunds take 3 days."}`, "PATCH", "/canned_responses/1", "",
			map[string]any{"content": "Refunds take 3 days."}, `"content":"Refunds take 3 days."`},
		{"canned_response.delete", `{"canned_response_id":1}`, "DELETE", "/canned_responses/1", "", nil, `null`},
		{"agent.create", `{"name":"Bea","email":"bea@acme.test","role":"agent","auto_offline":true}`, "POST", "/agents", "",
			map[string]any{"name": "Bea", "email": "bea@acme.test", "role": "agent", "auto_offline": true}, `"confirmed":false`},
		{"agent.update", `{"agent_id":3,"role":"administrator","availability_status":"busy"}`, "PATCH", "/agents/3", "",
			map[string]any{"role": "administrator", "availability_status": "busy"}, `"role":"administrator"`},
		{"agent.delete", `{"agent_id":3}`, "DELETE", "/agents/3", "", nil, `null`},
		{"inbox.list", `{}`, "GET", "/inboxes", "", nil, `"website_token":"public-widget"`},
		{"inbox.get", `{"inbox_id":1}`, "GET", "/inboxes/1", "", nil, `"channel_type":"Channel::Email"`},
		{"team.list", `{}`, "GET", "/teams", "", nil, `"is_member":true`},
		{"team.get", `{"team_id":2}`, "GET", "/teams/2", "", nil, `"name":"Billing"`},
		{"label.list", `{}`, "GET", "/labels", "", nil, `"title":"vip"`},
		{"custom_attribute_definition.list", `{"attribute_model":"1"}`, "GET", "/custom_attribute_definitions", "attribute_model=1", nil,
			`"attribute_model":"contact_attribute"`},
	}
	seen := map[string]bool{}
	for _, tc := range cases {
		seen[tc.suffix] = true
		before := e.mock.count("GET ")
		out := e.completed(t, hostsdktest.NewAction(CapabilityPrefix+tc.suffix, tc.input))
		if tc.suffix == "account.get" {
			// Health probes read the account too: check the count and the
			// last such request.
			if e.mock.count("GET ") <= before {
				t.Error("account.get did not read the account")
			}
			all := e.mock.all()
			if got := all[len(all)-1]; got.Path != accountPath || got.Token != testToken || len(got.Query) != 0 {
				t.Errorf("account.get sent %+v", got)
			}
			if data, _ := json.Marshal(out["data"]); !strings.Contains(string(data), tc.wantData) {
				t.Errorf("account.get: output data %s lacks %s", data, tc.wantData)
			}
			continue
		}
		got := e.last(t)
		if got.Method != tc.method || got.Path != accountPath+tc.path || got.Query.Encode() != tc.raw || got.Token != testToken {
			t.Errorf("%s: sent %s %s?%s, want %s %s?%s", tc.suffix, got.Method, got.Path, got.Query.Encode(), tc.method, accountPath+tc.path, tc.raw)
		}
		if diff := cmp.Diff(tc.body, got.Body); diff != "" {
			t.Errorf("%s: body (-want +got):\n%s", tc.suffix, diff)
		}
		data, _ := json.Marshal(out["data"])
		if !strings.Contains(string(data), tc.wantData) {
			t.Errorf("%s: output data %s lacks %s", tc.suffix, data, tc.wantData)
		}
		if strings.Contains(string(data), inboxSecret) {
			t.Errorf("%s: output data %s carries a channel credential", tc.suffix, data)
		}
	}
	for _, s := range operationSuffixes() {
		if !seen[s] {
			t.Errorf("catalogue operation %s is not exercised", s)
		}
	}
	// contact.update answered 204: status recorded.
	out := e.completed(t, hostsdktest.NewAction(CapabilityPrefix+"contact.update", `{"contact_id":9,"name":"Al"}`))
	if out["status"] != float64(204) {
		t.Errorf("contact.update output %v", out)
	}
}

func TestProviderErrors(t *testing.T) {
	e := newEnv(t, nil)
	ctx := hostsdktest.Context(t)

	// A 4xx on a read: failed with the matching code, not retryable.
	res := e.Result(t, hostsdktest.NewAction(CapabilityPrefix+"contact.get", `{"contact_id":404}`))
	if res.Status != aip.ResultFailed || res.Error.Code != provider.CodeNotFound || res.Error.IsRetryable() {
		t.Errorf("404: %s %+v", res.Status, res.Error)
	}
	// A 4xx on a mutation: failed (nothing applied).
	e.mock.setFault("POST /conversations/42/messages", fault{403, `{"description":"Access denied","errors":[]}`})
	res = e.Result(t, hostsdktest.NewAction(CapMessageCreate, `{"conversation_id":42,"content":"x"}`))
	if res.Status != aip.ResultFailed || res.Error.Code != provider.CodeForbidden || !strings.Contains(res.Error.Message, "Access denied") {
		t.Errorf("403: %s %+v", res.Status, res.Error)
	}
	// A 5xx on a read: failed and retryable.
	e.mock.setFault("GET /conversations", fault{503, `{"error":"maintenance"}`})
	res = e.Result(t, hostsdktest.NewAction(CapabilityPrefix+"conversation.list", `{}`))
	if res.Status != aip.ResultFailed || res.Error.Code != provider.CodeUnavailable || !res.Error.IsRetryable() {
		t.Errorf("read 503: %s %+v", res.Status, res.Error)
	}

	// A 5xx or a dropped connection on a mutation: outcome_unknown, and the
	// same action ID again does not reach Chatwoot.
	e.mock.setFault("POST /conversations/43/messages", fault{500, `{"error":"boom"}`})
	e.mock.setFault("POST /conversations/44/toggle_status", fault{status: 0})
	e.mock.setFault("PUT /contacts/45", fault{502, ``})
	e.mock.setFault("DELETE /contacts/46", fault{500, `{"error":"boom"}`})
	e.mock.setFault("DELETE /conversations/42/messages/47", fault{status: 0})
	e.mock.setFault("POST /conversations/48/labels", fault{503, ``})
	for _, tc := range []struct {
		a   *aip.Action
		key string
	}{
		{hostsdktest.NewAction(CapMessageCreate, `{"conversation_id":43,"content":"x"}`), "POST /conversations/43/messages"},
		{hostsdktest.NewAction(CapConversationStatus, `{"conversation_id":44,"status":"open"}`), "POST /conversations/44/toggle_status"},
		{hostsdktest.NewAction(CapabilityPrefix+"contact.update", `{"contact_id":45,"name":"x"}`), "PUT /contacts/45"},
		{hostsdktest.NewAction(CapabilityPrefix+"contact.delete", `{"contact_id":46}`), "DELETE /contacts/46"},
		{hostsdktest.NewAction(CapabilityPrefix+"message.delete", `{"conversation_id":42,"message_id":47}`), "DELETE /conversations/42/messages/47"},
		{hostsdktest.NewAction(CapabilityPrefix+"conversation.label.update", `{"conversation_id":48,"labels":["vip"]}`), "POST /conversations/48/labels"},
	} {
		for range 2 {
			resp := e.Act(t, tc.a)
			if pe := resp.ProtocolError(); resp.Status != http.StatusBadGateway || pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
				t.Errorf("%s: HTTP %d %s", tc.key, resp.Status, resp.Raw)
			}
		}
		st, _, err := e.Dispatcher.Status(ctx, e.Target, tc.a.ID, tc.a.CapabilityID)
		if err != nil || st.State != aip.StateOutcomeUnknown {
			t.Errorf("%s: status %+v, %v", tc.key, st, err)
		}
		if n := e.mock.count(tc.key); n != 1 {
			t.Errorf("%s reached Chatwoot %d times, want 1", tc.key, n)
		}
	}

	// A delete Chatwoot refuses (404): failed, nothing applied.
	res = e.Result(t, hostsdktest.NewAction(CapabilityPrefix+"contact.delete", `{"contact_id":404}`))
	if res.Status != aip.ResultFailed || res.Error.Code != provider.CodeNotFound || res.Error.IsRetryable() {
		t.Errorf("delete 404: %s %+v", res.Status, res.Error)
	}
	// A filter is a POST the document does not say changes nothing: a 5xx
	// or a dropped connection leaves the outcome unknown, as on any
	// mutation.
	e.mock.setFault("POST /conversations/filter", fault{503, `{"error":"maintenance"}`})
	e.mock.setFault("POST /contacts/filter", fault{status: 0})
	for _, suffix := range []string{"conversation.filter", "contact.filter"} {
		resp := e.Act(t, hostsdktest.NewAction(CapabilityPrefix+suffix, `{"payload":[{"attribute_key":"status","filter_operator":"equal_to","values":["open"]}]}`))
		if pe := resp.ProtocolError(); resp.Status != http.StatusBadGateway || pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
			t.Errorf("%s 5xx/dropped: HTTP %d %s", suffix, resp.Status, resp.Raw)
		}
	}

	// A refused token: provider.unauthorized.
	e.mock.setFault("GET /agents", fault{401, `{"error":"Invalid Access Token"}`})
	res = e.Result(t, hostsdktest.NewAction(CapabilityPrefix+"agent.list", `{}`))
	if res.Status != aip.ResultFailed || res.Error.Code != provider.CodeUnauthorized {
		t.Errorf("401: %s %+v", res.Status, res.Error)
	}
}

func TestInputSchemaRejections(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct{ capability, input string }{
		{CapMessageCreate, `{"conversation_id":42}`},
		{CapMessageCreate, `{"conversation_id":42,"content":""}`},
		{CapMessageCreate, `{"conversation_id":0,"content":"x"}`},
		{CapMessageCreate, `{"conversation_id":42,"content":"x","message_type":"incoming"}`},
		{CapConversationStatus, `{"conversation_id":42,"status":"snoozed"}`},
		{CapConversationStatus, `{"conversation_id":42,"status":"resolve"}`},
		{CapConversationHandoff, `{"conversation_id":42,"note":"no assignee"}`},
		// Chatwoot ignores team_id next to assignee_id: both are refused, not one dropped.
		{CapConversationHandoff, `{"conversation_id":42,"assignee_id":3,"team_id":2}`},
		{CapabilityPrefix + "conversation.list", `{"status":"closed"}`},
		{CapabilityPrefix + "conversation.list", `{"labels":"vip"}`},
		// Chatwoot splits a label at commas: one with a comma would be two.
		{CapabilityPrefix + "conversation.list", `{"labels":["vip,billing"]}`},
		{CapabilityPrefix + "contact.label.update", `{"contact_id":9,"labels":["vip,billing"]}`},
		{CapabilityPrefix + "contact.search", `{}`},
		{CapabilityPrefix + "contact.update", `{"contact_id":9}`},
		{CapabilityPrefix + "contact.create", `{"name":"no inbox"}`},
		{CapabilityPrefix + "contact.get", `{"contact_id":"9/../../agents"}`},
		{CapabilityPrefix + "account.get", `{"extra":1}`},
		{CapabilityPrefix + "conversation.create", `{"inbox_id":1,"message":{"content":"no source"}}`},
		{CapabilityPrefix + "conversation.create", `{"source_id":"s","message":{"content":"x","content_attributes":{}}}`},
		{CapabilityPrefix + "conversation.create", `{"source_id":"s","status":"snoozed"}`},
		{CapabilityPrefix + "conversation.create", `{"source_id":"s","snoozed_until":"tomorrow"}`},
		{CapabilityPrefix + "conversation.update", `{"conversation_id":42}`},
		{CapabilityPrefix + "conversation.update", `{"conversation_id":42,"priority":"critical"}`},
		{CapabilityPrefix + "conversation.priority", `{"conversation_id":42}`},
		{CapabilityPrefix + "conversation.custom_attributes", `{"conversation_id":42,"custom_attributes":"tier=gold"}`},
		{CapabilityPrefix + "conversation.label.update", `{"conversation_id":42,"labels":"vip"}`},
		{CapabilityPrefix + "conversation.label.update", `{"conversation_id":42,"labels":["vip","vip"]}`},
		{CapabilityPrefix + "conversation.filter", `{"payload":[]}`},
		{CapabilityPrefix + "conversation.filter", `{"payload":[{"attribute_key":"status","filter_operator":"is_present","values":["x"]}]}`},
		{CapabilityPrefix + "contact.filter", `{"payload":[{"attribute_key":"email","values":["x"]}]}`},
		{CapabilityPrefix + "message.delete", `{"conversation_id":42}`},
		{CapabilityPrefix + "contact.label.update", `{"contact_id":9}`},
		{CapabilityPrefix + "canned_response.create", `{"short_code":"hi"}`},
		{CapabilityPrefix + "canned_response.update", `{"canned_response_id":1}`},
		{CapabilityPrefix + "custom_attribute_definition.list", `{}`},
		{CapabilityPrefix + "custom_attribute_definition.list", `{"attribute_model":"contact_attribute"}`},
		{CapabilityPrefix + "team.get", `{"team_id":0}`},
	} {
		resp := e.Act(t, hostsdktest.NewAction(tc.capability, tc.input))
		if pe := resp.ProtocolError(); resp.Status != http.StatusBadRequest || pe == nil || pe.Code != hostsdk.CodeInputInvalid {
			t.Errorf("%s %s: HTTP %d %s", tc.capability, tc.input, resp.Status, resp.Raw)
		}
	}
	if reqs := e.mock.requests(); len(reqs) != 0 {
		t.Errorf("rejected inputs reached Chatwoot: %+v", reqs)
	}
}

// mutations are the catalogue's mutations: risk/side effect/retry safety.
var mutations = map[string]string{
	"contact.create":                 "medium/write/unsafe",
	"contact.update":                 "medium/write/safe_with_idempotency_key",
	"contact.delete":                 "high/delete/safe_with_idempotency_key",
	"contact.label.update":           "medium/write/safe_with_idempotency_key",
	"conversation.create":            "medium/send_message/unsafe",
	"conversation.update":            "medium/write/safe_with_idempotency_key",
	"conversation.priority":          "medium/write/safe_with_idempotency_key",
	"conversation.custom_attributes": "medium/write/safe_with_idempotency_key",
	"conversation.label.update":      "medium/write/safe_with_idempotency_key",
	"message.delete":                 "high/delete/safe_with_idempotency_key",
	"canned_response.create":         "medium/write/unsafe",
	"canned_response.update":         "medium/write/safe_with_idempotency_key",
	"canned_response.delete":         "high/delete/safe_with_idempotency_key",
	"agent.create":                   "high/identity/unsafe",
	"agent.update":                   "high/identity/safe_with_idempotency_key",
	"agent.delete":                   "high/identity/safe_with_idempotency_key",
	// The filters are POSTs the document does not say change nothing.
	"conversation.filter": "low/write/safe_with_idempotency_key",
	"contact.filter":      "low/write/safe_with_idempotency_key",
}

// TestFilterConditionOperators: the operators joining filter conditions
// are checked before Chatwoot is called.
func TestFilterConditionOperators(t *testing.T) {
	e := newEnv(t, nil)
	cond := `{"attribute_key":"status","filter_operator":"equal_to","values":["open"]`
	for _, tc := range []struct{ payload, want string }{
		{`[` + cond + `},` + cond + `}]`, "payload[0]: query_operator (AND or OR) is required"},
		{`[` + cond + `,"query_operator":"OR"}]`, "payload[0]: leave query_operator out on the last condition"},
		{`[` + cond + `,"query_operator":"AND"},` + cond + `,"query_operator":"AND"}]`, "payload[1]: leave query_operator out"},
	} {
		for _, suffix := range []string{"conversation.filter", "contact.filter"} {
			res := e.Result(t, hostsdktest.NewAction(CapabilityPrefix+suffix, `{"payload":`+tc.payload+`}`))
			if res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != "chatwoot.input_invalid" ||
				res.Error.IsRetryable() || !strings.Contains(res.Error.Message, tc.want) {
				t.Errorf("%s %s: %s %+v", suffix, tc.payload, res.Status, res.Error)
			}
		}
	}
	if reqs := e.mock.requests(); len(reqs) != 0 {
		t.Errorf("refused filters reached Chatwoot: %+v", reqs)
	}
}

// TestAgentAdministrationIsOptIn: without an operations file listing them,
// agent.create, agent.update and agent.delete are not offered and the
// host refuses them before Chatwoot is called.
func TestAgentAdministrationIsOptIn(t *testing.T) {
	e := newEnv(t, nil)
	for _, in := range []struct{ suffix, input string }{
		{"agent.create", `{"name":"Eve","email":"eve@acme.test","role":"administrator"}`},
		{"agent.update", `{"agent_id":3,"role":"administrator"}`},
		{"agent.delete", `{"agent_id":3}`},
	} {
		resp := e.Act(t, hostsdktest.NewAction(CapabilityPrefix+in.suffix, in.input))
		if pe := resp.ProtocolError(); resp.Status != http.StatusBadRequest || pe == nil || pe.Code != hostsdk.CodeCapabilityUnknown {
			t.Errorf("%s by default: HTTP %d %s", in.suffix, resp.Status, resp.Raw)
		}
	}
	if reqs := e.mock.requests(); len(reqs) != 0 {
		t.Errorf("agent administration reached Chatwoot: %+v", reqs)
	}

	// Listed, it runs; a 404 for an unknown agent is failed not_found.
	e = newEnv(t, func(c *Config) { c.Operations = []string{"agent.list", "agent.update"} })
	e.mock.setFault("PATCH /agents/99", fault{404, `{"description":"Agent not found","errors":[]}`})
	res := e.Result(t, hostsdktest.NewAction(CapabilityPrefix+"agent.update", `{"agent_id":99,"role":"agent"}`))
	if res.Status != aip.ResultFailed || res.Error.Code != provider.CodeNotFound {
		t.Errorf("agent.update 404: %s %+v", res.Status, res.Error)
	}
	for _, input := range []string{`{"agent_id":3}`, `{"agent_id":3,"role":"owner"}`, `{"agent_id":3,"role":"agent","name":"x"}`} {
		resp := e.Act(t, hostsdktest.NewAction(CapabilityPrefix+"agent.update", input))
		if pe := resp.ProtocolError(); resp.Status != http.StatusBadRequest || pe == nil || pe.Code != hostsdk.CodeInputInvalid {
			t.Errorf("agent.update %s: HTTP %d %s", input, resp.Status, resp.Raw)
		}
	}
	out := e.completed(t, hostsdktest.NewAction(CapabilityPrefix+"agent.update", `{"agent_id":3,"role":"agent"}`))
	if got := e.last(t); got.Method != "PATCH" || got.Path != accountPath+"/agents/3" || !cmp.Equal(got.Body, map[string]any{"role": "agent"}) {
		t.Errorf("agent.update sent %+v", got)
	}
	if data, _ := json.Marshal(out["data"]); !strings.Contains(string(data), `"role":"agent"`) {
		t.Errorf("agent.update output %v", out)
	}
}

func TestManifest(t *testing.T) {
	e := newEnv(t, nil)
	m, err := e.conn.Manifest(hostsdktest.Context(t), hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	bound, _, err := hostsdk.BindManifest(m, "example.test")
	if err != nil {
		t.Fatal(err)
	}
	if bound.Agent.ID != "agent:chatwoot:7" || !slices.Contains(bound.Profiles, Profile) || !slices.Contains(bound.Profiles, WebhookProfile) {
		t.Errorf("agent %s profiles %v", bound.Agent.ID, bound.Profiles)
	}
	var ids []string
	for _, c := range bound.Capabilities {
		ids = append(ids, c.ID)
		rest, ok := strings.CutPrefix(c.ID, CapabilityPrefix)
		composite := slices.Contains([]string{CapMessageCreate, CapConversationStatus, CapConversationHandoff}, c.ID)
		if !ok || (!composite && lookupOperation(rest) == nil) {
			t.Errorf("capability %s does not follow cap:chatwoot:<suffix>", c.ID)
		}
		var s map[string]any
		if err := json.Unmarshal(c.InputSchema, &s); err != nil || s["type"] != "object" || s["additionalProperties"] != false || s["required"] == nil {
			t.Errorf("%s: input schema is not a closed object with required: %s", c.ID, c.InputSchema)
		}
		if c.Description == "" || c.Risk == "" || c.Contract == nil {
			t.Errorf("%s: description, risk or contract missing", c.ID)
		}
		if c.RequiresHumanApproval != nil && *c.RequiresHumanApproval {
			t.Errorf("%s requires approval", c.ID)
		}
		suffix := strings.TrimPrefix(c.ID, CapabilityPrefix)
		mutation := composite || mutations[suffix] != ""
		if got := c.Contract.SideEffects[0] != aip.EffectRead; got != mutation {
			t.Errorf("%s: mutation %v, want %v", c.ID, got, mutation)
		}
		if mutation && (c.Contract.Idempotency.Requirement != aip.IdempotencyRequired || c.Contract.Execution.SupportsRetry) {
			t.Errorf("%s: a mutation without a required idempotency key or with retries: %+v", c.ID, c.Contract)
		}
		if !mutation && c.Contract.Execution.RetrySafety != aip.RetrySafe {
			t.Errorf("%s: a read that is not retry-safe", c.ID)
		}
	}
	// The table itself: whatever is not a GET is a mutation, and a DELETE
	// is high risk.
	for _, op := range catalogue {
		if op.Method != http.MethodGet && !op.Mutation || op.Method == http.MethodDelete && op.Risk != aip.RiskHigh {
			t.Errorf("%s: %s with mutation %v and risk %s; a non-GET is a mutation and a DELETE is high risk", op.Suffix, op.Method, op.Mutation, op.Risk)
		}
	}
	// Agent administration is opt-in: not offered by default.
	if len(ids) != 3+len(catalogue)-3 {
		t.Errorf("%d capabilities: %v", len(ids), ids)
	}
	for _, s := range []string{"agent.create", "agent.update", "agent.delete"} {
		if slices.Contains(ids, CapabilityPrefix+s) {
			t.Errorf("%s is offered by default", s)
		}
	}
	var compat map[string]int
	if err := json.Unmarshal(bound.Compatibility, &compat); err != nil ||
		!cmp.Equal(compat, map[string]int{"catalog_operations_supported": 37, "catalog_operations_admitted": 34, "composite_operations": 3}) {
		t.Errorf("compatibility %s", bound.Compatibility)
	}
	if len(bound.Channels) != 1 || !strings.Contains(string(bound.Channels[0]), `"id":"chatwoot-webhooks"`) {
		t.Errorf("channels %s", bound.Channels)
	}
	raw, _ := json.Marshal(bound)
	if strings.Contains(string(raw), testToken) || strings.Contains(string(raw), testSecret) {
		t.Error("the manifest holds a credential")
	}

	// Every operation admitted: each mutation of the table above is
	// offered, and no other catalogue operation is a mutation.
	all, err := New(Config{BaseURL: e.conn.cfg.BaseURL, AccountID: 3, Token: provider.NewSecret("t"), Operations: operationSuffixes()})
	if err != nil {
		t.Fatal(err)
	}
	m, _ = all.Manifest(hostsdktest.Context(t), hostsdk.TenantContext{})
	found := 0
	for _, c := range m.Capabilities[3:] {
		suffix := strings.TrimPrefix(c.ID, CapabilityPrefix)
		got := string(c.Risk) + "/" + string(c.Contract.SideEffects[0]) + "/" + string(c.Contract.Execution.RetrySafety)
		if want, ok := mutations[suffix]; ok {
			found++
			if got != want {
				t.Errorf("%s: %s, want %s", c.ID, got, want)
			}
		} else if got != "low/read/safe" {
			t.Errorf("%s: %s, want low/read/safe", c.ID, got)
		}
	}
	if len(m.Capabilities) != 3+len(catalogue) || found != len(mutations) {
		t.Errorf("all admitted: %d capabilities, %d of %d mutations", len(m.Capabilities), found, len(mutations))
	}

	// Restricted catalogue, outbound only: no channel, no webhook profile.
	conn, err := New(Config{BaseURL: e.conn.cfg.BaseURL, AccountID: 3, Token: provider.NewSecret("t"),
		Operations: []string{"contact.get", "conversation.list", "agent.delete"}})
	if err != nil {
		t.Fatal(err)
	}
	m, _ = conn.Manifest(hostsdktest.Context(t), hostsdk.TenantContext{})
	ids = nil
	for _, c := range m.Capabilities {
		ids = append(ids, c.ID)
	}
	want := []string{CapMessageCreate, CapConversationStatus, CapConversationHandoff,
		CapabilityPrefix + "agent.delete", CapabilityPrefix + "conversation.list", CapabilityPrefix + "contact.get"}
	if !cmp.Equal(ids, want) || len(m.Channels) != 0 || slices.Contains(m.Profiles, WebhookProfile) {
		t.Errorf("restricted manifest: %v channels %s profiles %v", ids, m.Channels, m.Profiles)
	}
}

func TestCheckHealth(t *testing.T) {
	e := newEnv(t, nil)
	n := e.mock.count("GET ")
	if err := e.conn.CheckHealth(hostsdktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if e.mock.count("GET ") != n+1 {
		t.Error("health did not read the account")
	}
	// A wrong token (the mock checks its value) fails health, and the
	// error does not carry the token.
	wrong, err := New(Config{BaseURL: e.conn.cfg.BaseURL, AccountID: testAccount, Token: provider.NewSecret("wrong-token-123")})
	if err != nil {
		t.Fatal(err)
	}
	err = wrong.CheckHealth(hostsdktest.Context(t))
	if err == nil || !strings.Contains(err.Error(), "401") || strings.Contains(err.Error(), "wrong-token-123") {
		t.Errorf("health with a wrong token: %v", err)
	}
	if got := e.mock.all(); got[len(got)-1].Token != "wrong-token-123" {
		t.Errorf("health sent token %q", got[len(got)-1].Token)
	}
}

// TestNULRefused: an input holding U+0000 (a "\u0000" escape) anywhere,
// in a value or a member name, of a mutation or a read, is refused
// chatwoot.input_invalid naming where it is, and Chatwoot is not called:
// it keeps text in PostgreSQL, which cannot store the character, and
// answers with a 500 that a mutation could only report as outcome_unknown.
// An escaped backslash followed by "u0000" is text, and goes.
func TestNULRefused(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct {
		capability, input, path string
	}{
		{CapMessageCreate, `{"conversation_id":42,"content":"Hello\u0000 from AIP"}`, `"/content"`},
		{CapabilityPrefix + "conversation.create", `{"source_id":"s","inbox_id":1,"contact_id":9,"message":{"content":"x\u0000"}}`, `"/message/content"`},
		{CapabilityPrefix + "contact.search", `{"q":"alice\u0000"}`, `"/q"`},
		{CapabilityPrefix + "conversation.custom_attributes", `{"conversation_id":42,"custom_attributes":{"ti\u0000er":"gold"}}`, `"/custom_attributes/ti\x00er"`},
	} {
		res := e.Result(t, hostsdktest.NewAction(tc.capability, tc.input))
		if res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != "chatwoot.input_invalid" ||
			res.Error.IsRetryable() || !strings.Contains(res.Error.Message, tc.path) || !strings.Contains(res.Error.Message, "U+0000") {
			t.Errorf("%s %s: %s %+v, want failed chatwoot.input_invalid naming %s", tc.capability, tc.input, res.Status, res.Error, tc.path)
		}
	}
	if reqs := e.mock.requests(); len(reqs) != 0 {
		t.Errorf("inputs holding U+0000 reached Chatwoot: %+v", reqs)
	}
	e.completed(t, hostsdktest.NewAction(CapMessageCreate, `{"conversation_id":42,"content":"C:\\u0000 is text"}`))
}
