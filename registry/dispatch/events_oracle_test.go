package dispatch_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
)

// TestEventRefusalIsNoSigningOracle: whoever can reach the ingress, and
// has read a host's delivery on the wire, cannot get from the dispatcher
// an envelope the host takes for the answer to that delivery. The host
// takes a dispatcher-signed connector_event.invalid answering its message
// ID for a refusal of its events' content (it splits the batch and holds
// each event back for an hour), and a connector_event.not_authorized for
// a refusal of its identity. Every refusal of a delivery not yet
// authenticated as the registered replica's was such an envelope,
// in_response_to the message ID the delivery named and addressed to the
// principal it named: anyone could copy a host's message ID into a
// delivery of their own (signed with their own key, or with the host's
// signature broken) and put the dispatcher's signed refusal in place of
// its real answer. Such refusals are now unsigned: a host retries an
// unsigned answer with backoff, as one that never came.
func TestEventRefusalIsNoSigningOracle(t *testing.T) {
	w := newEventWorld(t, eventWorldOptions{})
	attacker, _ := aip.GenerateSigningKey()
	genuine := w.delivery(event("k", `{"n":1}`))
	genuineRaw := genuine.sign(t)

	// copyOf is a delivery naming the genuine one's message ID, sender
	// and correlation, modified by mod and signed with the attacker's key.
	copyOf := func(mod func(dl *eventDelivery)) []byte {
		dl := w.delivery(event("k", `{"n":2}`))
		dl.env.MessageID = genuine.env.MessageID
		dl.env.CorrelationID = genuine.env.CorrelationID
		dl.key = attacker
		if mod != nil {
			mod(dl)
		}
		return dl.sign(t)
	}
	broken := bytes.Clone(genuineRaw)
	i := bytes.Index(broken, []byte(`"signature":"`)) + len(`"signature":"`)
	if broken[i] == 'A' {
		broken[i] = 'B'
	} else {
		broken[i] = 'A'
	}
	for name, raw := range map[string][]byte{
		"the genuine delivery, its signature broken": broken,
		"signed with another key":                    copyOf(nil),
		"no security.connector_event": copyOf(func(dl *eventDelivery) {
			dl.ce = aip.ConnectorEvent{}
		}),
		"an unknown replica": copyOf(func(dl *eventDelivery) { dl.ce.ReplicaID = aip.NewID(aip.PrefixReplica) }),
		"not an event stream": copyOf(func(dl *eventDelivery) {
			dl.env.Body = aip.Body{Ack: &aip.Ack{Status: aip.AckAccepted}}
			dl.env.MessageType = aip.TypeAck
		}),
	} {
		resp, err := w.srv.Client().Post(w.srv.URL+aip.EventsPath, "application/json", bytes.NewReader(raw))
		must(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		must(t, err)
		if resp.StatusCode == http.StatusOK {
			t.Fatalf("%s: accepted", name)
		}
		// What the host checks before it takes an answer for its own.
		if v, err := aip.VerifyEnvelope(body, w.d.DID()); err == nil {
			if v.Envelope.InResponseTo != nil && v.Envelope.InResponseTo.Message == genuine.env.MessageID {
				t.Errorf("%s: HTTP %d with an envelope signed by the dispatcher answering the genuine delivery %s: %s",
					name, resp.StatusCode, genuine.env.MessageID, body)
			}
			continue
		}
		// The refusal still says why, unsigned.
		var unsigned struct {
			Error *aip.ProtocolError `json:"error"`
		}
		if err := json.Unmarshal(body, &unsigned); err != nil || unsigned.Error == nil || unsigned.Error.Message == "" {
			t.Errorf("%s: HTTP %d, want an unsigned error saying why: %s", name, resp.StatusCode, body)
		}
	}
	// The genuine delivery is still stored and answered, signed.
	status, ans, _ := w.postRaw(genuineRaw)
	if status != http.StatusOK || ans.InResponseTo == nil || ans.InResponseTo.Message != genuine.env.MessageID {
		t.Fatalf("the genuine delivery: HTTP %d %+v", status, ans.Body.Error)
	}
}
