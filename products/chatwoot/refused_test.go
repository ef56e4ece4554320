package chatwoot

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// outcomeUnknown runs a, requires outcome_unknown (journaled so) and
// returns its message.
func (e *env) outcomeUnknown(t *testing.T, a *aip.Action) string {
	t.Helper()
	resp := e.Act(t, a)
	pe := resp.ProtocolError()
	if resp.Status != http.StatusBadGateway || pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
		t.Fatalf("%s: HTTP %d %+v, want outcome_unknown", a.CapabilityID, resp.Status, pe)
	}
	st, _, err := e.Dispatcher.Status(hostsdktest.Context(t), e.Target, a.ID, a.CapabilityID)
	if err != nil || st.State != aip.StateOutcomeUnknown {
		t.Fatalf("status %+v, %v", st, err)
	}
	return pe.Message
}

// Chatwoot answers 422 to a message for any error, also one raised after
// the message was committed (its after_create_commit callbacks): a 422
// after which the conversation holds the action's message is
// outcome_unknown naming that message, not a failed result.
func TestMessageStoredDespite422IsOutcomeUnknown(t *testing.T) {
	e := newEnv(t, nil)
	e.mock.setStoringFault("POST /conversations/8/messages", fault{422, `{"error":"Error connecting to Redis on redis:6379 (Errno::ECONNREFUSED)"}`})
	a := hostsdktest.NewAction(CapMessageCreate, `{"conversation_id":8,"content":"Your refund is on its way"}`)
	msg := e.outcomeUnknown(t, a)
	if !strings.Contains(msg, "stored the message all the same (message 901 of conversation 8)") || !strings.Contains(msg, "ECONNREFUSED") {
		t.Errorf("message %q does not name the stored message and what Chatwoot said", msg)
	}
	if e.mock.count("GET /conversations/8/messages") != 1 || e.mock.count("POST /conversations/8/messages") != 1 {
		t.Errorf("requests %+v, want the message once, then one read of the conversation's messages", e.mock.requests())
	}

	// The same for a handoff's note: the assignment was applied, and the
	// note may have been.
	e.mock.setStoringFault("POST /conversations/9/messages", fault{422, `{"error":"undefined method for nil"}`})
	h := hostsdktest.NewAction(CapConversationHandoff, `{"conversation_id":9,"assignee_id":3,"note":"n"}`)
	msg = e.outcomeUnknown(t, h)
	if !strings.Contains(msg, "assigned (applied)") || !strings.Contains(msg, "message 901 of conversation 9") {
		t.Errorf("handoff message %q", msg)
	}
}

// A 422 stays a failed result when the conversation's latest messages
// reach back to before the message was sent without it; it is
// outcome_unknown when they cannot be read, or are all too recent to
// rule it out.
func TestMessage422Lookup(t *testing.T) {
	e := newEnv(t, nil)
	refused := fault{422, `{"error":"Validation failed: Too many messages"}`}
	old := time.Now().Add(-time.Hour).Unix()
	recent := time.Now().Unix()
	page := func(path string, created int64) {
		for i := range latestMessages {
			e.mock.addMessages(path, map[string]any{"id": 200 + i, "content": "x", "message_type": 0, "private": false,
				"created_at": created, "content_attributes": map[string]any{}})
		}
	}

	// The default conversation: one message, not the action's.
	e.mock.setFault("POST /conversations/20/messages", refused)
	res := e.Result(t, hostsdktest.NewAction(CapMessageCreate, `{"conversation_id":20,"content":"x"}`))
	if res.Status != aip.ResultFailed || res.Error.Code != provider.CodeInvalidRequest || !strings.Contains(res.Error.Message, "Too many messages") {
		t.Errorf("short list: %s %+v", res.Status, res.Error)
	}
	// A full page, its oldest from an hour ago.
	page("/conversations/21/messages", old)
	e.mock.setFault("POST /conversations/21/messages", refused)
	res = e.Result(t, hostsdktest.NewAction(CapMessageCreate, `{"conversation_id":21,"content":"x"}`))
	if res.Status != aip.ResultFailed || res.Error.Code != provider.CodeInvalidRequest {
		t.Errorf("full page of old messages: %s %+v", res.Status, res.Error)
	}
	// A full page of messages from this very second.
	page("/conversations/22/messages", recent)
	e.mock.setFault("POST /conversations/22/messages", refused)
	a := hostsdktest.NewAction(CapMessageCreate, `{"conversation_id":22,"content":"x"}`)
	if msg := e.outcomeUnknown(t, a); !strings.Contains(msg, "too recent to rule it out") || !strings.Contains(msg, a.ID) {
		t.Errorf("full page of recent messages: %q", msg)
	}
	// The read fails.
	e.mock.setFault("POST /conversations/23/messages", refused)
	e.mock.setFault("GET /conversations/23/messages", fault{503, `{"error":"maintenance"}`})
	a = hostsdktest.NewAction(CapMessageCreate, `{"conversation_id":23,"content":"x"}`)
	if msg := e.outcomeUnknown(t, a); !strings.Contains(msg, "could not be read") || !strings.Contains(msg, "aip_action_id \""+a.ID) {
		t.Errorf("unreadable: %q", msg)
	}
	// Other refusals are not looked into.
	e.mock.setFault("POST /conversations/24/messages", fault{404, `{"description":"Conversation not found","errors":[]}`})
	res = e.Result(t, hostsdktest.NewAction(CapMessageCreate, `{"conversation_id":24,"content":"x"}`))
	if res.Status != aip.ResultFailed || res.Error.Code != provider.CodeNotFound || e.mock.count("GET /conversations/24/messages") != 0 {
		t.Errorf("404: %s %+v", res.Status, res.Error)
	}
}
