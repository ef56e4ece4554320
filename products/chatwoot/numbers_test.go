package chatwoot

import (
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// JSON allows other spellings of an integer (42.0, 4.2e1) and the input
// schema accepts them: they name the same object, never another one (a
// path segment "4.2e1" reads as 4 to Chatwoot) and are not refused.
func TestIntegerSpellings(t *testing.T) {
	e := newEnv(t, nil)
	e.completed(t, hostsdktest.NewAction(CapabilityPrefix+"conversation.get", `{"conversation_id":4.2e1}`))
	if got := e.last(t); got.Path != accountPath+"/conversations/42" {
		t.Errorf("conversation_id 4.2e1: path %s", got.Path)
	}
	e.completed(t, hostsdktest.NewAction(CapabilityPrefix+"message.list", `{"conversation_id":42.0,"after":1E2}`))
	if got := e.last(t); got.Path != accountPath+"/conversations/42/messages" || got.Query.Get("after") != "100" {
		t.Errorf("message.list: path %s query %v", got.Path, got.Query)
	}
	out := e.completed(t, hostsdktest.NewAction(CapMessageCreate, `{"conversation_id":4.2e1,"content":"hi"}`))
	if got := e.last(t); got.Path != accountPath+"/conversations/42/messages" || out["conversation_id"] != float64(42) {
		t.Errorf("message:create: path %s output %v", got.Path, out)
	}
	e.completed(t, hostsdktest.NewAction(CapConversationHandoff, `{"conversation_id":42.0,"assignee_id":3e0}`))
	if got := e.last(t); got.Path != accountPath+"/conversations/42/assignments" || got.Body["assignee_id"] != float64(3) {
		t.Errorf("handoff: %+v", got)
	}
}
