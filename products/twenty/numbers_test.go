package twenty

import (
	"testing"
)

// JSON allows other spellings of an integer (5.0, 1e0) and the input
// schema's "integer" accepts them: they are read as the integers they are,
// not refused after the host validated them.
func TestIntegerSpellings(t *testing.T) {
	e := newEnv(t, nil)
	e.mock.seed("companies", map[string]any{"name": "Acme"})
	var out map[string]any
	e.complete(t, action(OpList, `{"object":"companies","limit":5.0,"depth":1e0}`), &out)
	r := e.mock.last(t)
	if r.Path != "/rest/companies" || r.Query.Get("limit") != "5" || r.Query.Get("depth") != "1" {
		t.Errorf("record.list request %s %v", r.Path, r.Query)
	}
	e.complete(t, action(OpMetadataFields, `{"limit":2E0}`), &out)
	if r := e.mock.last(t); r.Query.Get("limit") != "2" {
		t.Errorf("metadata.fields query %v", r.Query)
	}
}
