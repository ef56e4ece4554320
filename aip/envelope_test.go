package aip

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestEnvelopeTamper(t *testing.T) {
	k := hostKey(t)
	signed, err := SignEnvelope(k, fixedActionEnvelope(t))
	if err != nil {
		t.Fatal(err)
	}
	muts := mutations(t, signed)
	if len(muts) < 40 {
		t.Fatalf("only %d mutations", len(muts))
	}
	for path, body := range muts {
		if path == "$.security.signature" {
			continue // changing the signature itself is covered below
		}
		if _, err := VerifyEnvelope(body, k.DID()); err == nil {
			t.Errorf("mutation at %s still verifies", path)
		}
	}
	var m map[string]any
	_ = json.Unmarshal(signed, &m)
	m["security"].(map[string]any)["signature"] = strings.Repeat("A", 86) + "=="
	body, _ := json.Marshal(m)
	if _, err := VerifyEnvelope(body, k.DID()); !errors.Is(err, ErrBadSignature) {
		t.Errorf("forged signature: err = %v", err)
	}
}

func TestVerifyEnvelopeChecks(t *testing.T) {
	k := hostKey(t)
	other := controlKey(t)
	signed, _ := SignEnvelope(k, fixedActionEnvelope(t))

	if v, err := VerifyEnvelope(signed, ""); err != nil || v.SignerDID != k.DID() {
		t.Fatalf("verify without expectation: %v", err)
	}
	if _, err := VerifyEnvelope(signed, other.DID()); !errors.Is(err, ErrBadSignature) {
		t.Errorf("unexpected signer: err = %v", err)
	}
	// A signature by another key under the first key's DID.
	env := fixedActionEnvelope(t)
	resigned, _ := SignEnvelope(other, env)
	swapped := strings.Replace(string(resigned), other.DID(), k.DID(), 1)
	if _, err := VerifyEnvelope([]byte(swapped), k.DID()); !errors.Is(err, ErrBadSignature) {
		t.Errorf("DID swap: err = %v", err)
	}
	// Unsigned.
	unsigned, _ := json.Marshal(fixedActionEnvelope(t))
	if _, err := VerifyEnvelope(unsigned, ""); !errors.Is(err, ErrBadSignature) {
		t.Errorf("unsigned: err = %v", err)
	}
	// Invalid JSON.
	if _, err := VerifyEnvelope([]byte(`{"a":1,"a":2}`), ""); !errors.Is(err, ErrMalformedEnvelope) {
		t.Errorf("duplicate members: err = %v", err)
	}
}

func TestEnvelopeValidate(t *testing.T) {
	k := hostKey(t)
	sign := func(mutate func(e *Envelope)) error {
		e := fixedActionEnvelope(t)
		mutate(e)
		b, err := SignEnvelope(k, e)
		if err != nil {
			return err
		}
		_, err = VerifyEnvelope(b, k.DID())
		return err
	}
	tests := map[string]func(e *Envelope){
		"type mismatch":  func(e *Envelope) { e.MessageType = TypeCancel },
		"bad version":    func(e *Envelope) { e.AIPVersion = "0.9" },
		"bad message id": func(e *Envelope) { e.MessageID = "msg_1" },
		"no sent_at":     func(e *Envelope) { e.SentAt = Timestamp{} },
		"bad action id":  func(e *Envelope) { e.Body.Action.ID = "x" },
		"bad mode":       func(e *Envelope) { e.Body.Action.Mode = "eventually" },
		"two bodies":     func(e *Envelope) { e.Body.Ack = &Ack{ActionID: "a", Status: AckAccepted} },
		"bad from kind":  func(e *Envelope) { e.From.Kind = "robot" },
	}
	for name, mutate := range tests {
		if err := sign(mutate); !errors.Is(err, ErrMalformedEnvelope) {
			t.Errorf("%s: err = %v, want ErrMalformedEnvelope", name, err)
		}
	}
	if err := sign(func(*Envelope) {}); err != nil {
		t.Fatalf("valid envelope: %v", err)
	}
}

func TestBodyDecoding(t *testing.T) {
	for _, bad := range []string{`{}`, `{"action":{},"ack":{}}`, `{"telepathy":{}}`, `[]`} {
		var b Body
		if err := json.Unmarshal([]byte(bad), &b); err == nil {
			t.Errorf("decoded %s without error", bad)
		}
	}
	var b Body
	if err := json.Unmarshal([]byte(`{"error":{"error":{"code":"x","message":"m","category":"temporary"}}}`), &b); err != nil {
		t.Fatal(err)
	}
	if b.Tag() != BodyError || b.Error.Error.Code != "x" {
		t.Fatalf("decoded %+v", b)
	}
}

func TestNewEnvelopeDerivesType(t *testing.T) {
	e, err := NewEnvelope(time.Now(), Body{Cancel: &Cancel{Target: CancelTarget{Action: NewActionID()}}})
	if err != nil {
		t.Fatal(err)
	}
	if e.MessageType != TypeCancel || e.Validate() != nil {
		t.Fatalf("envelope %+v: %v", e, e.Validate())
	}
	if _, err := NewEnvelope(time.Now(), Body{}); err == nil {
		t.Fatal("empty body accepted")
	}
}

func TestMessagePartRoundTrip(t *testing.T) {
	in := `[{"type":"text","text":"hi","format":"markdown"},{"type":"json","data":{"a":1},"schema":{"type":"object"}},{"type":"image","url":"https://x/y.png","alt":"y"}]`
	var parts []MessagePart
	if err := json.Unmarshal([]byte(in), &parts); err != nil {
		t.Fatal(err)
	}
	if parts[0].Text != "hi" || string(parts[1].Data) != `{"a":1}` || string(parts[2].Fields["url"]) != `"https://x/y.png"` {
		t.Fatalf("decoded %+v", parts)
	}
	out, _ := json.Marshal(parts)
	a, _ := Canonicalize([]byte(in))
	b, _ := Canonicalize(out)
	if string(a) != string(b) {
		t.Fatalf("round trip changed the parts:\n%s\n%s", a, b)
	}
}

func TestManifestDigestIgnoresAgentDID(t *testing.T) {
	m := &Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent:           Principal{ID: "agent:echo", Kind: PrincipalAgent, DID: hostKey(t).DID()},
		Profiles:        []string{NativeHTTPProfile},
		Capabilities:    []Capability{{ID: "echo.say", Name: "Say", Kind: KindTool, InputSchema: json.RawMessage(`{"type":"object"}`), Contract: testManifest().Capabilities[0].Contract}},
	}
	d1, err := ManifestDigest(m)
	if err != nil {
		t.Fatal(err)
	}
	m.Agent.DID = controlKey(t).DID()
	d2, _ := ManifestDigest(m)
	if d1 != d2 {
		t.Fatal("manifest digest depends on the agent DID")
	}
	if m.Agent.DID == "" {
		t.Fatal("ManifestDigest modified its argument")
	}
	m.Capabilities[0].Name = "Speak"
	if d3, _ := ManifestDigest(m); d3 == d1 {
		t.Fatal("manifest digest ignores the capabilities")
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	m.Capabilities = append(m.Capabilities, m.Capabilities[0])
	if err := m.Validate(); err == nil {
		t.Fatal("duplicate capability accepted")
	}
}
