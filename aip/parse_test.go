package aip

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestVerifyEnvelopeUsesWhatItVerified: the signature covers the canonical
// form, which maps several spellings to one (an integer beyond u64 becomes
// a double; so do 1.0, 1.00 and 1e0). The envelope VerifyEnvelope returns
// must be the one it verified, so two bodies carrying the same signature
// decode the same, whatever spelling is on the wire: otherwise a signed
// {"amount": 18446744073709551616} rewritten in transit to
// 18446744073709551617 still verifies and reaches the connector (a Python
// or big-number parser reads integers exactly) as a different amount.
func TestVerifyEnvelopeUsesWhatItVerified(t *testing.T) {
	k := hostKey(t)
	env := fixedActionEnvelope(t)
	env.Body.Action.Input = json.RawMessage(`{"amount":18446744073709551616,"rate":0.1,"tag":"a"}`)
	signed, err := SignEnvelope(k, env)
	if err != nil {
		t.Fatal(err)
	}
	honest, err := VerifyEnvelope(signed, k.DID())
	if err != nil {
		t.Fatal(err)
	}
	for _, tamper := range []struct{ from, to string }{
		{"18446744073709551616", "18446744073709551617"},
		{"18446744073709551616", "18446744073709551999.000"},
		{`"rate":0.1`, `"rate":0.1000000000000000000001`},
		{`"tag":"a"`, `"tag":"\u0061"`},
	} {
		canonical := string(mustCanonical(t, signed))
		wire := strings.Replace(string(signed), tamper.from, tamper.to, 1)
		if wire == string(signed) {
			// SignEnvelope's output is canonical: the big integer is a double there.
			wire = strings.Replace(canonical, "1.8446744073709552e19", tamper.to, 1)
		}
		if wire == canonical {
			t.Fatalf("tamper %s -> %s changed nothing", tamper.from, tamper.to)
		}
		got, err := VerifyEnvelope([]byte(wire), k.DID())
		if err != nil {
			t.Fatalf("%s: the same canonical form must verify: %v", tamper.to, err)
		}
		if !bytes.Equal(got.Envelope.Body.Action.Input, honest.Envelope.Body.Action.Input) {
			t.Errorf("%s: verified input %s, but the signed input is %s", tamper.to, got.Envelope.Body.Action.Input, honest.Envelope.Body.Action.Input)
		}
	}
	// The signature stays available to the caller.
	var sig string
	if ok, err := honest.Envelope.SecurityValue(SecuritySignature, &sig); !ok || err != nil || len(sig) != 88 {
		t.Fatalf("security.signature after verification: %q %v %v", sig, ok, err)
	}
}

func mustCanonical(t *testing.T, b []byte) []byte {
	t.Helper()
	c, err := Canonicalize(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
