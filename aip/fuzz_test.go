package aip

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzCanonicalJSON: canonicalization never panics, its output is valid
// JSON, a fixed point, and survives a round trip through a generic decoder:
// canonical(parse(canonical(x))) == canonical(x).
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/","literals":[null,true,false]}`,
		`{"\u20ac":"Euro","\r":"CR","\ufb33":"Dalet","1":"One","\ud83d\ude00":"Emoji","\u0080":"Control","\u00f6":"o"}`,
		`[1e21,1e-7,-0,5e-324,1.7976931348623157e308]`,
		`{"a":{"b":[{"c":"<>&"}]}}`, `"\u2028"`, `123456789012345678901234`, `{}`, `[]`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Canonicalize(data)
		if err != nil {
			return
		}
		if !json.Valid(c) {
			t.Fatalf("canonical output is not valid JSON: %q", c)
		}
		again, err := Canonicalize(c)
		if err != nil || !bytes.Equal(again, c) {
			t.Fatalf("not a fixed point: %q -> %q (%v)", c, again, err)
		}
		var v any
		dec := json.NewDecoder(bytes.NewReader(c))
		dec.UseNumber() // numbers keep their text, as serde_json keeps integers
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("encoding/json cannot parse %q: %v", c, err)
		}
		m, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("re-marshal: %v", err)
		}
		round, err := Canonicalize(m)
		if err != nil || !bytes.Equal(round, c) {
			t.Fatalf("round trip changed the canonical form:\n%q\n%q (%v)", c, round, err)
		}
	})
}

// FuzzParseDIDKey: never panics, and whatever it accepts encodes back to
// the same identifier.
func FuzzParseDIDKey(f *testing.F) {
	f.Add("did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp")
	f.Add("did:key:z6Mkv4fhuJNepggTLQ4LtYSsiYFayjovLj1fpKMeqe9ss2Gw")
	f.Add("did:key:zQ3shokFTS3brHcDQrn82RUDfCZESWL1ZdCEJwekUDPQiYBme")
	f.Add("did:web:example.com")
	f.Add("did:key:z111111")
	f.Fuzz(func(t *testing.T, did string) {
		pub, err := ParseDIDKey(did)
		if err != nil {
			return
		}
		if got := DIDKey(pub); got != did {
			t.Fatalf("ParseDIDKey(%q) accepted a non-canonical form of %q", did, got)
		}
	})
}

// FuzzVerifySignedRequest: decoding and verifying arbitrary bodies never
// panics, and the only bodies that verify against the host's DID carry the
// exact signed request (any re-encoding of it, never a changed one).
func FuzzVerifySignedRequest(f *testing.F) {
	host := hostKey(f)
	reg, err := Seal(host, SignedRequestField, fixedRegisterRequest(f))
	if err != nil {
		f.Fatal(err)
	}
	hb := &ControlRequest{RequestID: "msg_0194a3b2c1d07e3f8a9b0c1d2e3f4a70", IssuedAt: At(fixedNow), ExpiresAt: At(fixedNow.Add(MaxMessageLifetime)),
		SignerDID: host.DID(), Command: HeartbeatCommand(Heartbeat{ReplicaID: "crepl_0194a3b2c1d07e3f8a9b0c1d2e3f4a01", PreviousSequence: 7, InFlight: 3, ConnectorReady: true})}
	hbSealed, _ := Seal(host, SignedRequestField, hb)
	originals := [][]byte{}
	for _, sealed := range [][]byte{reg, hbSealed} {
		r, err := OpenControlRequest(sealed)
		if err != nil {
			f.Fatal(err)
		}
		originals = append(originals, r.Signed.Canonical)
		f.Add(sealed)
		f.Add(bytes.Replace(sealed, []byte(`"previous_sequence":7`), []byte(`"previous_sequence":8`), 1))
		f.Add(bytes.Replace(sealed, []byte(`{"request":{`), []byte(`{"request":{"x":1,`), 1))
	}
	f.Add([]byte(`{"request":{},"signature":""}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := OpenControlRequest(body)
		if err != nil {
			return
		}
		_, _ = ControlRequestDigest(&r.Request)
		if err := r.VerifyFrom(host.DID()); err != nil {
			return
		}
		for _, o := range originals {
			if bytes.Equal(r.Signed.Canonical, o) {
				return
			}
		}
		t.Fatalf("accepted a request that was never signed: %s", r.Signed.Canonical)
	})
}
