package aip

import (
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// signRawEnvelope signs an envelope given as JSON text the way SignEnvelope
// does (security.did set, signature over the canonical form without
// security.signature), so a test can sign members no Envelope can hold.
func signRawEnvelope(t *testing.T, k *SigningKey, raw string) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		t.Fatal(err)
	}
	sec := map[string]json.RawMessage{}
	if s, ok := m["security"]; ok {
		if err := json.Unmarshal(s, &sec); err != nil {
			t.Fatal(err)
		}
	}
	did, _ := json.Marshal(k.DID())
	sec[SecurityDID] = did
	m["security"], _ = json.Marshal(sec)
	unsigned, _ := json.Marshal(m)
	canonical, err := Canonicalize(unsigned)
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := json.Marshal(EncodeSignature(k.Sign(canonical)))
	sec[SecuritySignature] = sig
	m["security"], _ = json.Marshal(sec)
	out, _ := json.Marshal(m)
	return out
}

// TestCaseVariantMembersAreRefused: encoding/json binds "From", "FROM" or
// "\u212aind" (KELVIN SIGN) to the fields from and kind; serde_json does not.
// A signed document carrying such a member means one thing to this package
// and another to the reference (or, with both spellings present, whichever
// comes last): it is refused, in envelopes, in lifecycle wrappers and in
// security members.
func TestCaseVariantMembersAreRefused(t *testing.T) {
	k := hostKey(t)
	honest, err := SignEnvelope(k, fixedActionEnvelope(t))
	if err != nil {
		t.Fatal(err)
	}
	var base map[string]any
	if err := json.Unmarshal(honest, &base); err != nil {
		t.Fatal(err)
	}
	delete(base["security"].(map[string]any), SecuritySignature)
	mutate := func(f func(m map[string]any)) string {
		b, _ := json.Marshal(base)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		f(m)
		out, _ := json.Marshal(m)
		return string(out)
	}
	intruder := map[string]any{"id": "service:intruder", "kind": "service", "trust_domain": "evil.example"}
	for name, raw := range map[string]string{
		"both spellings of from": mutate(func(m map[string]any) { m["From"] = intruder }),
		"only From":              mutate(func(m map[string]any) { m["From"] = intruder; delete(m, "from") }),
		"upper case sent_at":     mutate(func(m map[string]any) { m["SENT_AT"] = "2030-01-01T00:00:00Z" }),
		"kelvin sign in kind": mutate(func(m map[string]any) {
			from := m["from"].(map[string]any)
			from["\u212aind"] = "agent"
			delete(from, "kind")
		}),
		"long s in session_id": mutate(func(m map[string]any) { m["\u017fession_id"] = "sess_0194a3b2c1d07e3f8a9b0c1d2e3f4a99" }),
		"in the action": mutate(func(m map[string]any) {
			m["body"].(map[string]any)["action"].(map[string]any)["Capability_ID"] = "admin.delete_everything"
		}),
		"deep in the identity": mutate(func(m map[string]any) {
			tenant := m["body"].(map[string]any)["action"].(map[string]any)["identity"].(map[string]any)["tenant"].(map[string]any)
			tenant["ID"] = "tenant-victim"
		}),
	} {
		signed := signRawEnvelope(t, k, raw)
		if _, err := VerifyEnvelope(signed, k.DID()); !errors.Is(err, ErrMalformedEnvelope) || !errors.Is(err, ErrCaseVariantMember) {
			t.Errorf("%s: VerifyEnvelope = %v, want ErrMalformedEnvelope and ErrCaseVariantMember", name, err)
		}
	}

	// A signed route with a second spelling of tenant_id.
	routed := mutate(func(m map[string]any) {
		m["security"].(map[string]any)[SecurityConnectorRoute].(map[string]any)["Tenant_ID"] = "tenant-victim"
	})
	v, err := VerifyEnvelope(signRawEnvelope(t, k, routed), k.DID())
	if err != nil {
		t.Fatalf("free-form security members verify: %v", err)
	}
	var route ConnectorRoute
	if _, err := v.Envelope.SecurityValue(SecurityConnectorRoute, &route); !errors.Is(err, ErrCaseVariantMember) {
		t.Errorf("SecurityValue(connector_route with Tenant_ID) = %v (tenant %q), want ErrCaseVariantMember", err, route.TenantID)
	}

	// Free-form JSON keeps any names: input, extensions, trace.
	free := mutate(func(m map[string]any) {
		m["body"].(map[string]any)["action"].(map[string]any)["input"] = map[string]any{"Name": 1, "name": 2, "\u212a": 3}
		m["extensions"] = map[string]any{"X-Vendor": map[string]any{"From": "x"}}
		m["trace"] = map[string]any{"Traceparent": "x"}
	})
	if _, err := VerifyEnvelope(signRawEnvelope(t, k, free), k.DID()); err != nil {
		t.Errorf("case variants in free-form members: %v", err)
	}

	// Lifecycle wrappers: a second spelling of signer_did, and one in the
	// adjacently tagged command.
	req := fixedRegisterRequest(t)
	inner, _ := json.Marshal(req)
	for name, edit := range map[string]func(string) string{
		"Signer_DID": func(s string) string {
			return strings.Replace(s, `"signer_did"`, `"Signer_DID":"did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK","signer_did"`, 1)
		},
		"Operation": func(s string) string {
			return strings.Replace(s, `"operation"`, `"Operation":"heartbeat","operation"`, 1)
		},
		"payload Tenant_ID": func(s string) string {
			return strings.Replace(s, `"tenant_id"`, `"Tenant_ID":"tenant-victim","tenant_id"`, 1)
		},
	} {
		edited := edit(string(inner))
		if edited == string(inner) {
			t.Fatalf("%s: edit changed nothing", name)
		}
		body, err := SealJSON(k, SignedRequestField, []byte(edited))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := OpenControlRequest(body); !errors.Is(err, ErrMalformedSigned) || !errors.Is(err, ErrCaseVariantMember) {
			t.Errorf("%s: OpenControlRequest = %v, want ErrMalformedSigned and ErrCaseVariantMember", name, err)
		}
	}
	// Unknown lower case members still decode (and are covered).
	body, err := SealJSON(k, SignedRequestField, []byte(strings.Replace(string(inner), `"signer_did"`, `"future_member":1,"signer_did"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenControlRequest(body); err != nil {
		t.Errorf("an unknown member: %v", err)
	}
}

// TestEveryUnmarshalerIsChecked: a type of this package with its own
// UnmarshalJSON hides its members from checkMemberNames unless it
// implements memberNamesChecker or reads members by exact name. A new such
// type must be added to one of the two.
func TestEveryUnmarshalerIsChecked(t *testing.T) {
	exact := map[reflect.Type]bool{ // read by exact name, or no members at all
		reflect.TypeFor[Timestamp]():       true,
		reflect.TypeFor[MessagePart]():     true,
		reflect.TypeFor[ProfileBinding]():  true,
		reflect.TypeFor[json.RawMessage](): true,
	}
	seen := map[reflect.Type]bool{}
	var visit func(reflect.Type)
	visit = func(typ reflect.Type) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice || typ.Kind() == reflect.Array || typ.Kind() == reflect.Map {
			typ = typ.Elem()
		}
		if seen[typ] {
			return
		}
		seen[typ] = true
		if exact[typ] {
			return
		}
		pt := reflect.PointerTo(typ)
		if pt.Implements(unmarshalerType) && !pt.Implements(namesCheckerType) {
			t.Errorf("%s has an UnmarshalJSON but no checkMemberNames", typ)
		}
		if typ.Kind() == reflect.Struct && typ.PkgPath() == reflect.TypeFor[Envelope]().PkgPath() {
			for i := range typ.NumField() {
				visit(typ.Field(i).Type)
			}
		}
	}
	for _, root := range []reflect.Type{reflect.TypeFor[Envelope](), reflect.TypeFor[ControlRequest](), reflect.TypeFor[ControlResponse](),
		reflect.TypeFor[Manifest](), reflect.TypeFor[ConnectorRoute](), reflect.TypeFor[Registration](), reflect.TypeFor[Heartbeat](),
		reflect.TypeFor[Transition](), reflect.TypeFor[Lease](), reflect.TypeFor[Event]()} {
		visit(root)
	}
	if len(seen) < 20 {
		t.Fatalf("visited only %d types", len(seen))
	}
}

// TestSecurityValueStrict: the strict read refuses a member that matches
// no field of the value, as well as one that matches only when case is
// ignored; the plain read ignores the unknown member.
func TestSecurityValueStrict(t *testing.T) {
	env := &Envelope{Security: map[string]json.RawMessage{
		"known":   json.RawMessage(`{"tenant_id":"t"}`),
		"unknown": json.RawMessage(`{"tenant_id":"t","max_spend":100}`),
		"folded":  json.RawMessage(`{"tenant_id":"t","Tenant_ID":"u"}`),
	}}
	var route ConnectorRoute
	if ok, err := env.SecurityValueStrict("known", &route); !ok || err != nil || route.TenantID != "t" {
		t.Errorf("known members: %v, %v, %+v", ok, err, route)
	}
	if ok, err := env.SecurityValueStrict("unknown", &ConnectorRoute{}); !ok || err == nil || !strings.Contains(err.Error(), "max_spend") {
		t.Errorf("unknown member: %v, %v; want an error naming max_spend", ok, err)
	}
	if _, err := env.SecurityValue("unknown", &ConnectorRoute{}); err != nil {
		t.Errorf("SecurityValue with an unknown member: %v, want it ignored", err)
	}
	if _, err := env.SecurityValueStrict("folded", &ConnectorRoute{}); !errors.Is(err, ErrCaseVariantMember) {
		t.Errorf("case-variant member: %v, want ErrCaseVariantMember", err)
	}
	if ok, err := env.SecurityValueStrict("absent", &ConnectorRoute{}); ok || err != nil {
		t.Errorf("absent: %v, %v", ok, err)
	}
}

// TestDecodeStrict: a document for a reader that must understand all of
// it is one I-JSON value, an object for a struct, with every member a
// field by its exact name at every depth (through slices and maps too).
func TestDecodeStrict(t *testing.T) {
	type inner struct {
		Code string `json:"code"`
	}
	type doc struct {
		Name  string           `json:"name"`
		Items []inner          `json:"items,omitempty"`
		ByKey map[string]inner `json:"by_key,omitempty"`
		Raw   json.RawMessage  `json:"raw,omitempty"`
		Any   any              `json:"any,omitempty"`
	}
	for _, tc := range []struct {
		name, in string
		want     error  // errors.Is, or nil for any error with text
		text     string // in the error's text
	}{
		{"case variant", `{"Name":"x"}`, ErrCaseVariantMember, `"Name" is not "name"`},
		{"two case variants", `{"name":"a","NAME":"b"}`, ErrCaseVariantMember, `"NAME"`},
		{"kelvin sign", `{"name":"a","items":[{"\u212aode":"x"}]}`, nil, ""},
		{"unknown", `{"name":"a","extra":1}`, ErrUnknownMember, `"extra" (the members are any, by_key, items, name, raw)`},
		{"case variant in a slice", `{"items":[{"Code":"x"}]}`, ErrCaseVariantMember, `items: `},
		{"unknown in a map", `{"by_key":{"k":{"code":"x","more":1}}}`, ErrUnknownMember, `by_key: `},
		{"null", `null`, nil, "want one JSON object ({\"member\": value, ...}), not null"},
		{"array", `[]`, nil, "want one JSON object ({\"member\": value, ...}), not an array"},
		{"trailing data", `{"name":"a"} {}`, ErrInvalidJSON, ""},
		{"duplicate", `{"name":"a","name":"b"}`, ErrInvalidJSON, "duplicate"},
	} {
		var d doc
		err := DecodeStrict([]byte(tc.in), &d)
		if err == nil {
			t.Errorf("%s: %s decoded as %+v", tc.name, tc.in, d)
			continue
		}
		if tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: %q does not say %q", tc.name, err, tc.text)
		}
	}
	// Members inside a RawMessage or an interface are the reader's own.
	var d doc
	if err := DecodeStrict([]byte(`{"name":"a","items":[{"code":"c"}],"raw":{"Name":1},"any":{"X":1}}`), &d); err != nil {
		t.Fatal(err)
	}
	if d.Name != "a" || d.Items[0].Code != "c" || string(d.Raw) != `{"Name":1}` {
		t.Errorf("decoded %+v", d)
	}
	// A struct with its own UnmarshalJSON reads what it reads (a
	// Timestamp is a string).
	var ts Timestamp
	if err := DecodeStrict([]byte(`"2026-12-01T02:00:00.5Z"`), &ts); err != nil || ts.IsZero() {
		t.Errorf("timestamp: %v %v", ts, err)
	}
	// Not a struct: any I-JSON value of the type.
	var n []int
	if err := DecodeStrict([]byte(` [1,2]`), &n); err != nil || len(n) != 2 {
		t.Errorf("slice: %v %v", n, err)
	}
}

// TestDecodeStrictTypeErrorsSpeakJSON: a member of the wrong JSON type is
// named with its path and both types in JSON's terms; encoding/json's own
// text ("Go struct field .timeout_ms of type uint64") means nothing to a
// caller in another language.
func TestDecodeStrictTypeErrorsSpeakJSON(t *testing.T) {
	type inner struct {
		X int8 `json:"x"`
	}
	var v struct {
		Timeout *uint64        `json:"timeout_ms"`
		Input   map[string]any `json:"input"`
		N       inner          `json:"n"`
		Tags    []string       `json:"tags"`
		On      bool           `json:"on"`
	}
	for _, c := range []struct{ in, want string }{
		{`{"timeout_ms":"5"}`, `member "timeout_ms": a JSON string where a whole number from 0 to 18446744073709551615 is expected`},
		{`{"timeout_ms":-1}`, `member "timeout_ms": the number -1 where a whole number from 0 to 18446744073709551615 is expected`},
		{`{"n":{"x":1.5}}`, `member "n.x": the number 1.5 where a whole number from -128 to 127 is expected`},
		{`{"input":[1]}`, `member "input": a JSON array where an object is expected`},
		{`{"tags":"a"}`, `member "tags": a JSON string where an array is expected`},
		{`{"on":1}`, `member "on": the number 1 where true or false is expected`},
	} {
		err := DecodeStrict([]byte(c.in), &v)
		var te *MemberTypeError
		if !errors.As(err, &te) || err.Error() != c.want {
			t.Errorf("DecodeStrict(%s) = %v; want %q", c.in, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "Go struct") {
			t.Errorf("DecodeStrict(%s) names Go types: %v", c.in, err)
		}
	}
}

// rawTypeErrorer's UnmarshalJSON returns encoding/json's error for its own
// input unwrapped, so its Offset counts from that input, not from the
// document DecodeStrict was given.
type rawTypeErrorer struct{ X int }

func (r *rawTypeErrorer) UnmarshalJSON(data []byte) error {
	var w struct {
		X int `json:"x"`
	}
	err := json.Unmarshal(data, &w)
	r.X = w.X
	return err
}

// TestDecodeStrictTypeErrorsNameTheMember: the member of the wrong type is
// named by its path in the document — array elements by their index
// ("events[1].id": a batch of events otherwise leaves the sender to guess
// which one), map entries by their name, members of an embedded struct by
// their own name (encoding/json's path puts the Go field's name of the
// embedded struct in front) — and the type a field takes is said in JSON's
// terms for every kind of field, not only by its Go kind ([]byte takes a
// base64 string, json.Number a number, a type with UnmarshalText a
// string). A type error an UnmarshalJSON wrapped in its own words keeps
// them.
func TestDecodeStrictTypeErrorsNameTheMember(t *testing.T) {
	type item struct {
		X int `json:"x"`
	}
	type Embedded struct {
		Y uint8 `json:"y"`
	}
	type doc struct {
		Items  []item            `json:"items"`
		Grid   [][]bool          `json:"grid"`
		Events []Event           `json:"events"`
		ByKey  map[int]string    `json:"by_key"`
		Counts map[string]uint16 `json:"counts"`
		Blob   []byte            `json:"blob"`
		Num    json.Number       `json:"num"`
		Addr   netip.Addr        `json:"addr"`
		Parts  []MessagePart     `json:"parts"`
		Raw    *rawTypeErrorer   `json:"raw"`
		Nested map[string][]item `json:"nested"`
		Embedded
	}
	ev := `{"id":"evt_1","kind":"k","occurred_at":"2026-01-02T03:04:05Z"}`
	const i64 = "a whole number from -9223372036854775808 to 9223372036854775807"
	for _, c := range []struct{ in, want string }{
		{`{"items":[{"x":1},{"x":2},{"x":3},{"x":"a"}]}`, `member "items[3].x": a JSON string where ` + i64 + ` is expected`},
		{`{"items":[{"x":1}, {"x" : [1]}]}`, `member "items[1].x": a JSON array where ` + i64 + ` is expected`},
		{`{"grid":[[true],[false,"x"]]}`, `member "grid[1][1]": a JSON string where true or false is expected`},
		{`{"events":[` + ev + `,{"id":5,"kind":"k","occurred_at":"2026-01-02T03:04:05Z"}]}`, `member "events[1].id": the number 5 where a string is expected`},
		{`{"by_key":{"1":"a","abc":"b"}}`, `member "by_key": the member name "abc" where ` + i64 + ` is expected`},
		{`{"counts":{"a":1,"b.c":-1}}`, `member "counts.b.c": the number -1 where a whole number from 0 to 65535 is expected`},
		{`{"nested":{"k":[{"x":1},{"x":{}}]}}`, `member "nested.k[1].x": a JSON object where ` + i64 + ` is expected`},
		{`{"y":"s"}`, `member "y": a JSON string where a whole number from 0 to 255 is expected`},
		{`{"blob":5}`, `member "blob": the number 5 where a base64 string is expected`},
		{`{"num":true}`, `member "num": a JSON boolean where a number is expected`},
		{`{"addr":5}`, `member "addr": the number 5 where a string is expected`},
		{`{"raw":{"x":"a"}}`, `member "raw.x": a JSON string where ` + i64 + ` is expected`},
		{`{"parts":[{"type":"text","text":5}]}`, `aip: message part text: a JSON number where a string is expected`},
	} {
		var v doc
		err := DecodeStrict([]byte(c.in), &v)
		var te *MemberTypeError
		var ute *json.UnmarshalTypeError
		if !errors.As(err, &te) || !errors.As(err, &ute) || err.Error() != c.want {
			t.Errorf("DecodeStrict(%s) = %v;\n want %q", c.in, err, c.want)
		}
	}
}
