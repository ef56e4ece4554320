package aip

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// mutations returns, for a JSON document, one variant per leaf value with
// that leaf changed, and one per object with an unknown member added. Each is
// labelled with its path.
func mutations(t *testing.T, doc []byte) map[string][]byte {
	t.Helper()
	var root any
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	if err := dec.Decode(&root); err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	var walk func(path string, v any, replace func(any))
	emit := func(path string) {
		b, err := json.Marshal(root)
		if err != nil {
			t.Fatal(err)
		}
		out[path] = b
	}
	walk = func(path string, v any, replace func(any)) {
		switch x := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				k := k
				walk(path+"."+k, x[k], func(nv any) { x[k] = nv })
			}
			x["zz_unknown"] = "injected"
			emit(path + ".+zz_unknown")
			delete(x, "zz_unknown")
		case []any:
			for i := range x {
				i := i
				walk(fmt.Sprintf("%s[%d]", path, i), x[i], func(nv any) { x[i] = nv })
			}
		case string:
			replace(x + "x")
			emit(path)
			replace(x)
		case json.Number:
			f, _ := x.Float64()
			replace(json.Number(strconv.FormatFloat(f+1, 'f', -1, 64)))
			emit(path)
			replace(x)
		case bool:
			replace(!x)
			emit(path)
			replace(x)
		case nil:
			replace("now-a-string")
			emit(path)
			replace(nil)
		}
	}
	walk("$", root, func(any) {})
	return out
}

func TestSignedRequestTamper(t *testing.T) {
	host := hostKey(t)
	sealed, err := Seal(host, SignedRequestField, fixedRegisterRequest(t))
	if err != nil {
		t.Fatal(err)
	}
	var w struct {
		Request   json.RawMessage `json:"request"`
		Signature string          `json:"signature"`
	}
	if err := json.Unmarshal(sealed, &w); err != nil {
		t.Fatal(err)
	}
	muts := mutations(t, w.Request)
	if len(muts) < 30 {
		t.Fatalf("only %d mutations: the walk is broken", len(muts))
	}
	for path, inner := range muts {
		body, _ := json.Marshal(map[string]any{"request": json.RawMessage(inner), "signature": w.Signature})
		r, err := OpenControlRequest(body)
		if err != nil {
			continue // refusing to parse is also a refusal
		}
		if err := r.VerifyFrom(host.DID()); err == nil {
			t.Errorf("mutation at %s still verifies", path)
		}
	}
	// The untouched message, re-encoded with other whitespace and member
	// order, still verifies: the signature is over the canonical form.
	var generic map[string]any
	_ = json.Unmarshal(sealed, &generic)
	reordered, _ := json.MarshalIndent(generic, "", "   ")
	r, err := OpenControlRequest(reordered)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.VerifyFrom(host.DID()); err != nil {
		t.Fatalf("re-encoded message no longer verifies: %v", err)
	}
}

func TestSignedUnknownMemberIsCoveredNotDropped(t *testing.T) {
	host := hostKey(t)
	req := fixedRegisterRequest(t)
	raw, _ := json.Marshal(req)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	m["future_field"] = map[string]any{"nested": true}
	sealed, err := Seal(host, SignedRequestField, m)
	if err != nil {
		t.Fatal(err)
	}
	r, err := OpenControlRequest(sealed)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.VerifyFrom(host.DID()); err != nil {
		t.Fatalf("a signed message with an unknown member must verify: %v", err)
	}
	if !bytes.Contains(r.Signed.Canonical, []byte(`"future_field":{"nested":true}`)) {
		t.Fatal("the unknown member was dropped from the signed form")
	}
	// Removing it breaks the signature.
	stripped := bytes.Replace(sealed, []byte(`"future_field":{"nested":true},`), nil, 1)
	if bytes.Equal(stripped, sealed) {
		t.Fatal("test setup: member not found")
	}
	r, err = OpenControlRequest(stripped)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.VerifyFrom(host.DID()); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("stripping a signed member: err = %v, want ErrBadSignature", err)
	}
}

func TestOpenRejectsMalformedWrappers(t *testing.T) {
	host := hostKey(t)
	sealed, _ := Seal(host, SignedRequestField, fixedRegisterRequest(t))
	sig := `"` + strings.Repeat("A", 86) + `=="`
	tests := map[string]string{
		"extra member":     `{"request":{},"signature":` + sig + `,"extra":1}`,
		"duplicate member": `{"request":{},"request":{},"signature":` + sig + `}`,
		"no signature":     `{"request":{}}`,
		"wrong field":      `{"response":{},"signature":` + sig + `}`,
		"inner not object": `{"request":[1],"signature":` + sig + `}`,
		"number signature": `{"request":{},"signature":5}`,
		"trailing data":    string(sealed) + `{}`,
		"not json":         `request`,
		"array":            `[]`,
	}
	for name, body := range tests {
		if _, err := Open([]byte(body), SignedRequestField); !errors.Is(err, ErrMalformedSigned) {
			t.Errorf("%s: err = %v, want ErrMalformedSigned", name, err)
		}
	}
}

func TestCheckWindow(t *testing.T) {
	now := fixedNow
	tests := []struct {
		name            string
		issued, expires time.Time
		want            error
	}{
		{"fresh", now, now.Add(30 * time.Second), nil},
		{"skewed within bound", now.Add(5 * time.Second), now.Add(20 * time.Second), nil},
		{"expired", now.Add(-31 * time.Second), now.Add(-time.Second), ErrMessageExpired},
		{"expires exactly now", now.Add(-10 * time.Second), now, ErrMessageExpired},
		{"future dated", now.Add(5*time.Second + time.Millisecond), now.Add(20 * time.Second), ErrMessageFromFuture},
		{"lifetime too long", now, now.Add(30*time.Second + time.Millisecond), ErrMessageLifetime},
		{"inverted", now, now.Add(-time.Second), ErrMessageWindowInvalid},
		{"zero lifetime", now, now, ErrMessageWindowInvalid},
	}
	for _, tt := range tests {
		err := CheckWindow(now, tt.issued, tt.expires)
		if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
			t.Errorf("%s: err = %v, want %v", tt.name, err, tt.want)
		}
	}
	// The two clock errors say which clock to check.
	if err := CheckWindow(now, now.Add(-31*time.Second), now.Add(-time.Second)); err == nil || !strings.Contains(err.Error(), "check both clocks") {
		t.Errorf("expired: %v does not say to check the clocks", err)
	}
	if err := CheckWindow(now, now.Add(time.Hour), now.Add(time.Hour+time.Second)); err == nil || !strings.Contains(err.Error(), "check the sender's clock") {
		t.Errorf("future: %v does not say to check the sender's clock", err)
	}
	// Each window error is distinct.
	all := []error{ErrMessageExpired, ErrMessageFromFuture, ErrMessageLifetime, ErrMessageWindowInvalid}
	for i := range all {
		for j := range all {
			if i != j && errors.Is(all[i], all[j]) {
				t.Errorf("%v matches %v", all[i], all[j])
			}
		}
	}
}

func TestOpenControlResponseChecks(t *testing.T) {
	ck := controlKey(t)
	resp := fixedLeaseResponse(t)
	sealed, _ := Seal(ck, SignedResponseField, resp)
	reqID := resp.RequestID

	if _, err := OpenControlResponse(sealed, ck.DID(), ck.PublicKey(), reqID, fixedNow); err != nil {
		t.Fatal(err)
	}
	imposter := hostKey(t)
	if _, err := OpenControlResponse(sealed, imposter.DID(), imposter.PublicKey(), reqID, fixedNow); !errors.Is(err, ErrBadSignature) {
		t.Errorf("unpinned signer: err = %v", err)
	}
	// Signed by another key that claims the pinned DID.
	forged := *resp
	forgedBody, _ := Seal(imposter, SignedResponseField, &forged)
	if _, err := OpenControlResponse(forgedBody, ck.DID(), ck.PublicKey(), reqID, fixedNow); !errors.Is(err, ErrBadSignature) {
		t.Errorf("forged signature: err = %v", err)
	}
	if _, err := OpenControlResponse(sealed, ck.DID(), ck.PublicKey(), "msg_other", fixedNow); !errors.Is(err, ErrMalformedSigned) {
		t.Errorf("wrong request id: err = %v", err)
	}
	if _, err := OpenControlResponse(sealed, ck.DID(), ck.PublicKey(), reqID, fixedNow.Add(time.Minute)); !errors.Is(err, ErrMessageExpired) {
		t.Errorf("expired response: err = %v", err)
	}
	if _, err := OpenControlResponse(sealed, ck.DID(), ck.PublicKey(), reqID, fixedNow.Add(-time.Minute)); !errors.Is(err, ErrMessageFromFuture) {
		t.Errorf("future response: err = %v", err)
	}
}

func TestControlOutcomeWireShapes(t *testing.T) {
	tests := []struct {
		o    ControlOutcome
		want string
	}{
		{LeaseOutcome(Lease{Sequence: 4, ExpiresAt: At(fixedNow)}), `{"lease":{"expires_at":"2026-01-02T03:04:05.678Z","sequence":4},"status":"lease"}`},
		{OfflineOutcome(), `{"status":"offline"}`},
		{RejectedOutcome(CodeControlRejected, "no", false), `{"code":"connector_control.rejected","message":"no","retryable":false,"status":"rejected"}`},
	}
	for _, tt := range tests {
		got, err := CanonicalJSON(tt.o)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tt.want {
			t.Errorf("got %s, want %s", got, tt.want)
		}
		var back ControlOutcome
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("decode %s: %v", got, err)
		}
		again, _ := CanonicalJSON(back)
		if !bytes.Equal(again, got) {
			t.Errorf("round trip: %s != %s", again, got)
		}
	}
	long := RejectedOutcome(CodeControlRejected, strings.Repeat("é", 1000), false)
	if len(long.Message) > MaxErrorMessageBytes {
		t.Errorf("message not truncated: %d bytes", len(long.Message))
	}
	for _, bad := range []string{`{"status":"granted"}`, `{"status":"lease"}`, `{"status":"rejected"}`} {
		var o ControlOutcome
		if err := json.Unmarshal([]byte(bad), &o); err == nil {
			t.Errorf("decoded %s without error", bad)
		}
	}
}

func TestControlCommandDecoding(t *testing.T) {
	for _, bad := range []string{
		`{"operation":"reboot","payload":{}}`,
		`{"operation":"heartbeat"}`,
		`{"operation":"heartbeat","payload":null}`,
		`{"operation":"heartbeat","payload":{"in_flight":"many"}}`,
	} {
		var c ControlCommand
		if err := json.Unmarshal([]byte(bad), &c); err == nil {
			t.Errorf("decoded %s without error", bad)
		}
	}
	var c ControlCommand
	if err := json.Unmarshal([]byte(`{"operation":"drain","payload":{"replica_id":"crepl_1","previous_sequence":9}}`), &c); err != nil {
		t.Fatal(err)
	}
	if c.Transition == nil || c.ReplicaID() != "crepl_1" || c.Transition.PreviousSequence != 9 {
		t.Fatalf("decoded %+v", c)
	}
}

func TestControlRequestDigestCoversPayload(t *testing.T) {
	a := fixedRegisterRequest(t)
	d1, err := ControlRequestDigest(a)
	if err != nil {
		t.Fatal(err)
	}
	// The digest of a decoded request (raw payload kept) equals the digest of
	// the request it was built from.
	sealed, _ := Seal(hostKey(t), SignedRequestField, a)
	r, _ := OpenControlRequest(sealed)
	d2, _ := ControlRequestDigest(&r.Request)
	if d1 != d2 {
		t.Fatalf("digest differs after the wire: %s vs %s", d1, d2)
	}
	b := fixedRegisterRequest(t)
	b.Command.Register.ConfigRevision++
	if d3, _ := ControlRequestDigest(b); d3 == d1 {
		t.Fatal("digest ignores the payload")
	}
	c := fixedRegisterRequest(t)
	c.RequestID = "msg_other"
	if d4, _ := ControlRequestDigest(c); d4 == d1 {
		t.Fatal("digest ignores the request id")
	}
}
