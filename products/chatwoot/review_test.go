package chatwoot

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/products/internal/provider"
	"github.com/aipfleet/aipfleet/products/internal/webhook"
)

// A provider (or a proxy in front of it) that echoes the credential in its
// error body must not get it into the action's error.
func TestEchoedCredentialIsRedacted(t *testing.T) {
	e := newEnv(t, nil)
	e.mock.setFault("GET /agents", fault{status: 401, body: `{"error":"api_access_token ` + testToken + ` is not valid"}`})
	res := e.Result(t, hostsdktest.NewAction(CapabilityPrefix+"agent.list", `{}`))
	if res.Status != aip.ResultFailed || res.Error.Code != provider.CodeUnauthorized {
		t.Fatalf("401: %s %+v", res.Status, res.Error)
	}
	if strings.Contains(res.Error.Message, testToken) || !strings.Contains(res.Error.Message, "is not valid") {
		t.Errorf("error message %q: want the provider's message without the credential", res.Error.Message)
	}
}

// Retry-After is seconds or an HTTP date (RFC 9110 §10.2.3); both become
// the result's retry hint.
func TestRetryAfterHTTPDate(t *testing.T) {
	e := newEnv(t, nil)
	at := time.Now().Add(90 * time.Second).UTC().Format(http1123)
	e.mock.setFault("GET /agents", fault{status: 429, body: `{"error":"slow down"}`})
	e.mock.setFaultHeaders("GET /agents", map[string]string{"Retry-After": at})
	res := e.Result(t, hostsdktest.NewAction(CapabilityPrefix+"agent.list", `{}`))
	if res.Status != aip.ResultFailed || res.Error.Code != provider.CodeRateLimited || !res.Error.IsRetryable() {
		t.Fatalf("429: %s %+v", res.Status, res.Error)
	}
	if ms := res.Error.RetryAfterMS; ms == nil || *ms < 60_000 || *ms > 90_000 {
		t.Errorf("retry_after_ms %v; want about 90 s from the HTTP date", ms)
	}
}

const http1123 = "Mon, 02 Jan 2006 15:04:05 GMT"

// A 4xx answer whose body is cut short still says the request was refused:
// a mutation so answered is failed (here rate limited, retryable), not
// outcome_unknown.
func TestRefusalWithCutBodyIsNotOutcomeUnknown(t *testing.T) {
	e := newEnv(t, nil)
	key := "POST /conversations/42/messages"
	e.mock.setFault(key, fault{status: 429, body: `{"error":"Too many req`})
	e.mock.setFaultHeaders(key, map[string]string{"Content-Length": "4096", "Retry-After": "7"})
	res := e.Result(t, hostsdktest.NewAction(CapMessageCreate, `{"conversation_id":42,"content":"x"}`))
	if res.Status != aip.ResultFailed || res.Error.Code != provider.CodeRateLimited || !res.Error.IsRetryable() {
		t.Fatalf("cut 429 on a mutation: %s %+v", res.Status, res.Error)
	}
	if ms := res.Error.RetryAfterMS; ms == nil || *ms != 7000 {
		t.Errorf("retry_after_ms %v, want 7000", ms)
	}
}

// A delivery whose account it cannot read, or that names another account
// in any of the places Chatwoot puts it, is refused, not taken for this
// account's.
func TestWebhookAccountMustBeThisOne(t *testing.T) {
	e := newEnv(t, nil)
	now := time.Now()
	for i, body := range []string{
		strings.Replace(incoming, `"account":{"id":7`, `"account":{"id":"8"`, 1),
		strings.Replace(incoming, `"account":{"id":7`, `"account":{"id":7.5`, 1),
		strings.Replace(incoming, `"account":{"id":7,"name":"Acme"}`, `"account":{"name":"Acme"},"account_id":8`, 1),
		strings.Replace(incoming, `"account":{"id":7,"name":"Acme"}`, `"account":{"id":7},"account_id":8`, 1),
		strings.Replace(incoming, `"account":{"id":7,"name":"Acme"}`, `"account":"Acme","account_id":"8"`, 1),
	} {
		a := e.post(t, signed("dlv-acct-"+strconv.Itoa(i), now, body))
		if a.status != 400 || a.code() != webhook.CodeInvalidDelivery {
			t.Errorf("%s: %d %v; want 400 %s", body, a.status, a.body, webhook.CodeInvalidDelivery)
		}
	}
	if n := e.pending(t); n != 0 {
		t.Errorf("refused deliveries stored %d batches", n)
	}
	// This account by either member: accepted.
	for i, body := range []string{incoming,
		strings.Replace(incoming, `"account":{"id":7,"name":"Acme"}`, `"account_id":7`, 1)} {
		if a := e.post(t, signed("dlv-ok-"+strconv.Itoa(i), now, body)); a.status != 200 {
			t.Errorf("%s: %d %v", body, a.status, a.body)
		}
	}
}

// Chatwoot's webhook data of a conversation (Conversations::EventDataPresenter
// #push_data) gives the display ID, the one the API's paths take, as its id,
// with no display_id member: at the top of conversation_* events and in the
// conversation member of message and typing events. The event data's
// conversation_id must be read from there, as a consumer replies with it.
func TestWebhookConversationIDOfCurrentPayloads(t *testing.T) {
	e := newEnv(t, nil)
	conv := `{"additional_attributes":{},"can_reply":true,"channel":"Channel::WebWidget","contact_inbox":{"id":5,"contact_id":9,"inbox_id":1,"source_id":"src-1"},` +
		`"id":42,"inbox_id":1,"messages":[{"id":101,"content":"Where is my order?","conversation_id":42,"message_type":0}],"labels":[],` +
		`"meta":{"sender":{"id":9,"name":"Alice","type":"contact"},"assignee":null,"assignee_type":null,"team":null,"hmac_verified":false},` +
		`"status":"open","custom_attributes":{},"snoozed_until":null,"unread_count":1,"first_reply_created_at":null,"priority":null,` +
		`"waiting_since":1764570000,"agent_last_seen_at":0,"contact_last_seen_at":0,"last_activity_at":1764570000,"timestamp":1764570000,` +
		`"created_at":1764570000,"updated_at":1764570000.5}`
	for _, tc := range []struct{ name, body string }{
		{"message_created", `{"account":{"id":7,"name":"Acme"},"additional_attributes":{},"content_attributes":{},"content_type":"text",` +
			`"content":"Where is my order?","conversation":` + conv + `,"created_at":"2026-12-01T08:00:00.000Z","id":101,` +
			`"inbox":{"id":1,"name":"Website"},"message_type":"incoming","private":false,"sender":{"id":9,"name":"Alice","type":"contact"},` +
			`"source_id":null,"event":"message_created"}`},
		{"conversation_typing_on", `{"event":"conversation_typing_on","user":{"id":3,"name":"Ada","type":"user"},"conversation":` + conv + `,"is_private":false}`},
		{"conversation_status_changed", strings.TrimSuffix(conv, "}") + `,"event":"conversation_status_changed","changed_attributes":[{"status":{"previous_value":"pending","current_value":"open"}}]}`},
	} {
		evs, err := e.conn.mapDelivery("dlv-"+tc.name, time.Now(), []byte(tc.body))
		if err != nil || len(evs) != 1 {
			t.Fatalf("%s: %v, %v", tc.name, evs, err)
		}
		var data struct {
			ConversationID *int64 `json:"conversation_id"`
		}
		if err := json.Unmarshal(evs[0].Data, &data); err != nil || data.ConversationID == nil || *data.ConversationID != 42 {
			t.Errorf("%s: event data conversation_id %v (%v); want 42, the conversation's id in Chatwoot's payload", tc.name, data.ConversationID, err)
		}
	}
}

// Chatwoot assigns the agent (team) it finds in the account: for an ID it
// does not have it assigns nobody, clearing the conversation's assignee
// (team), and answers 200 null. The handoff did not happen: a failed
// result that says so, and no note; an answer naming another agent is not
// the handoff asked for either, and what Chatwoot did is unknown.
func TestHandoffToUnknownAssignee(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct{ input, key, cleared string }{
		{`{"conversation_id":8,"assignee_id":999,"note":"over to you"}`, "POST /conversations/8/assignments", "assignee"},
		{`{"conversation_id":9,"team_id":999,"note":"over to you"}`, "POST /conversations/9/assignments", "team"},
	} {
		e.mock.setFault(tc.key, fault{200, `null`})
		res := e.Result(t, hostsdktest.NewAction(CapConversationHandoff, tc.input))
		if res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != CodeHandoffNotAssigned ||
			!strings.Contains(res.Error.Message, "999") || !strings.Contains(res.Error.Message, "(applied)") {
			t.Errorf("%s answered null: %s %+v; want failed %s naming the ID and what Chatwoot did", tc.input, res.Status, res.Error, CodeHandoffNotAssigned)
		}
		// The details say what Chatwoot did too: the assignee (team) is
		// cleared, though nothing asked for was assigned.
		if res.Error != nil {
			var d map[string]any
			if err := json.Unmarshal(res.Error.Details, &d); err != nil || d["assignment_applied"] != false || d["cleared"] != tc.cleared {
				t.Errorf("%s: details %s; want assignment_applied false and what was cleared", tc.input, res.Error.Details)
			}
		}
	}
	if n := e.mock.count("POST /conversations/8/messages") + e.mock.count("POST /conversations/9/messages"); n != 0 {
		t.Errorf("%d notes posted after a handoff that assigned nobody", n)
	}

	e.mock.setFault("POST /conversations/10/assignments", fault{200, `{"id":4,"name":"Bob"}`})
	a := hostsdktest.NewAction(CapConversationHandoff, `{"conversation_id":10,"assignee_id":3}`)
	if resp := e.Act(t, a); resp.ProtocolError() == nil || resp.ProtocolError().Code != hostsdk.CodeOutcomeUnknown {
		t.Errorf("another agent in the answer: HTTP %d %s; want outcome_unknown", resp.Status, resp.Raw)
	}
}

// A long message makes a webhook larger than an event holds (Chatwoot
// repeats the message in conversation.messages): the event keeps what
// fits, first without the repetition, then without the largest members,
// and always the IDs a consumer needs to read the rest through the API,
// rather than the payload's size and digest alone.
func TestWebhookLongMessageKeepsWhatFits(t *testing.T) {
	e := newEnv(t, nil)
	long := func(content string) string {
		return `{"event":"message_created","id":101,"content":"` + content + `","message_type":"incoming","private":false,` +
			`"content_attributes":{},"account":{"id":7,"name":"Acme"},"sender":{"id":9,"name":"Alice","type":"contact"},` +
			`"conversation":{"id":42,"inbox_id":1,"status":"open","messages":[{"id":101,"content":"` + content + `","conversation_id":42}]}}`
	}
	for _, tc := range []struct {
		name        string
		body        string
		wantOmitted []string
		wantContent bool
	}{
		{"repeated message", long(strings.Repeat("a", 120_000)), []string{"conversation.messages"}, true},
		{"message too long", long(strings.Repeat("é", 150_000)), []string{"conversation.messages", "content"}, false},
	} {
		evs, err := e.conn.mapDelivery("dlv-"+tc.name, time.Now(), []byte(tc.body))
		if err != nil || len(evs) != 1 {
			t.Fatalf("%s: %v, %v", tc.name, evs, err)
		}
		if raw, _ := json.Marshal(evs[0]); len(raw) > hostsdk.MaxEventBytes {
			t.Fatalf("%s: the event is %d bytes, over %d", tc.name, len(raw), hostsdk.MaxEventBytes)
		}
		var data struct {
			ConversationID int64    `json:"conversation_id"`
			Omitted        []string `json:"payload_omitted"`
			Bytes          int      `json:"payload_bytes"`
			Payload        struct {
				ID           int64           `json:"id"`
				Content      *string         `json:"content"`
				Sender       json.RawMessage `json:"sender"`
				Conversation struct {
					ID       int64           `json:"id"`
					Messages json.RawMessage `json:"messages"`
				} `json:"conversation"`
			} `json:"payload"`
		}
		if err := json.Unmarshal(evs[0].Data, &data); err != nil {
			t.Fatal(err)
		}
		pl := data.Payload
		if pl.ID != 101 || pl.Conversation.ID != 42 || len(pl.Sender) == 0 || pl.Conversation.Messages != nil || data.ConversationID != 42 {
			t.Errorf("%s: event data %.300s; want the message, conversation and sender IDs without conversation.messages", tc.name, evs[0].Data)
		}
		if (pl.Content != nil) != tc.wantContent || strings.Join(data.Omitted, ",") != strings.Join(tc.wantOmitted, ",") || data.Bytes != len(tc.body) {
			t.Errorf("%s: content kept %v, payload_omitted %v, payload_bytes %d; want %v, %v, %d",
				tc.name, pl.Content != nil, data.Omitted, data.Bytes, tc.wantContent, tc.wantOmitted, len(tc.body))
		}
		// Through the route: accepted and stored.
		if a := e.post(t, signed("dlv-route-"+strings.ReplaceAll(tc.name, " ", "-"), time.Now(), tc.body)); a.status != 200 || a.body["accepted_events"] != float64(1) {
			t.Errorf("%s: the route answered %d %v", tc.name, a.status, a.body)
		}
	}
}
