package provider

import (
	"encoding/json"
	"testing"
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
