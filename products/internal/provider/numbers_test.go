package provider

import (
	"encoding/json"
	"testing"
)

func TestIntegralNumbers(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"id":42}`, `{"id":42}`},
		{`{"id":42.0}`, `{"id":42}`},
		{`{"id":4.2e1,"n":[1E2,-3.0e0],"o":{"p":7.00}}`, `{"id":42,"n":[100,-3],"o":{"p":7}}`},
		{`{"x":1.5,"y":1e300,"z":9007199254740993.0,"s":"4.2e1"}`, `{"x":1.5,"y":1e300,"z":9007199254740993.0,"s":"4.2e1"}`},
		{`{"html":"<b>&","id":1.0}`, `{"html":"<b>&","id":1}`},
		{`not json`, `not json`},
	} {
		// Members are written in key order when rewritten; every want
		// here lists them so.
		if got := IntegralNumbers(json.RawMessage(tc.in)); string(got) != tc.want {
			t.Errorf("IntegralNumbers(%s) = %s; want %s", tc.in, got, tc.want)
		}
	}
	// Nothing to rewrite: the very same bytes.
	raw := json.RawMessage(`{ "b": 1, "a": 2.5 }`)
	if got := IntegralNumbers(raw); string(got) != string(raw) {
		t.Errorf("unchanged input rewritten: %s", got)
	}
}
