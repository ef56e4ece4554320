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
