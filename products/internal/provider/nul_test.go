package provider

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

func TestNULPath(t *testing.T) {
	for _, tc := range []struct {
		in   string
		path string
		ok   bool
	}{
		{`{"content":"hello"}`, "", false},
		{`{"content":"a\\u0000b"}`, "", false}, // an escaped backslash, then "u0000": no NUL
		{`{"content":"a\u0000b"}`, "/content", true},
		{`{"message":{"content":"x","tags":["a","\u0000"]}}`, "/message/tags/1", true},
		{`{"a/b~":"\u0000"}`, "/a~1b~0", true},
		{`{"k\u0000":1}`, "/k\u0000", true},
		{`"\u0000"`, "", true},
		{`{"n":1.5,"b":true,"z":null}`, "", false},
		{`{"broken":"\u0000"`, "", false}, // not JSON: the schema check refuses it
	} {
		path, ok := NULPath(json.RawMessage(tc.in))
		if path != tc.path || ok != tc.ok {
			t.Errorf("NULPath(%s) = %q, %v; want %q, %v", tc.in, path, ok, tc.path, tc.ok)
		}
	}
}

func TestRefuseNUL(t *testing.T) {
	call := func(input string) *hostsdk.Call {
		return &hostsdk.Call{Action: &aip.Action{ID: "act_1", CapabilityID: "cap:x:thing.create", Input: json.RawMessage(input)}}
	}
	if err := RefuseNUL("x.input_invalid", "X", call(`{"name":"a\\u0000b"}`)); err != nil {
		t.Errorf("an escaped backslash refused: %v", err)
	}
	err := RefuseNUL("x.input_invalid", "X", call(`{"record":{"name":"a\u0000b"}}`))
	var pe *aip.ProtocolError
	if !errors.As(err, &pe) || pe.Code != "x.input_invalid" || pe.Category != aip.CategoryPermanent || pe.IsRetryable() ||
		!strings.Contains(pe.Message, `"/record/name"`) || !strings.Contains(pe.Message, "U+0000") ||
		!strings.Contains(pe.Message, "cap:x:thing.create") || !strings.Contains(pe.Message, "X cannot store") {
		t.Errorf("RefuseNUL = %#v, want a permanent x.input_invalid naming the capability, /record/name and U+0000", err)
	}
}
