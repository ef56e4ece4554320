package dispatch_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// TestEnvelopeTooLargeForAReplicaIsNotSent: an input within the request
// bounds whose signed envelope would exceed what a replica reads
// (aip.MaxMessageBytes) is refused before it is sent, as a request too
// large, settling cancelled. It was sent, the replica's unsigned 413 was
// an unverified answer: dispatch.outcome_unknown, settled outcome_unknown
// against the replica's circuit, on every retry.
func TestEnvelopeTooLargeForAReplicaIsNotSent(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	id := aip.NewActionID()
	input := json.RawMessage(`{"text":"` + strings.Repeat("x", aip.MaxMessageBytes-700) + `"}`)
	status, resp := w.act(dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: input})
	if status != http.StatusRequestEntityTooLarge || resp.Error == nil || resp.Error.Code != dispatch.CodeRequestRejected ||
		resp.Settlement != registry.SettlementCancelled {
		t.Fatalf("answer %d: error %+v settlement %q", status, resp.Error, resp.Settlement)
	}
	if n := len(w.counter.runs(id)); n != 0 {
		t.Fatalf("the action ran %d times", n)
	}
	w.idle()
}

// TestActionTooLargeToAdmitSaysWhatCounts: a body within --max-body-bytes
// whose action weighs more than the scheduler admits (its input, capability
// ID and idempotency key plus the request overhead) is refused 413
// connector.request_rejected with a message that says what was counted and
// what to do. It said only "dispatch: request too large: 4194651 bytes, at
// most 4194304", for a body of fewer than 4194304 bytes.
func TestActionTooLargeToAdmitSaysWhatCounts(t *testing.T) {
	w := newWorld(t, worldOptions{})
	input := json.RawMessage(`{"text":"` + strings.Repeat("x", dispatch.DefaultMaxRequestBytes-300) + `"}`)
	status, resp := w.act(dispatch.ActionRequest{CapabilityID: capSay, Input: input})
	if status != http.StatusRequestEntityTooLarge || resp.Error == nil || resp.Error.Code != dispatch.CodeRequestRejected || resp.Route != nil {
		t.Fatalf("answer %d: error %+v route %+v", status, resp.Error, resp.Route)
	}
	for _, want := range []string{"input, capability ID and idempotency key", "nothing was dispatched", "send a smaller input"} {
		if !strings.Contains(resp.Error.Message, want) {
			t.Errorf("message %q does not say %q", resp.Error.Message, want)
		}
	}
	if strings.HasPrefix(resp.Error.Message, "dispatch:") {
		t.Errorf("message %q starts with the Go error's package prefix", resp.Error.Message)
	}
	w.idle()
}
