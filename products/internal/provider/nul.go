package provider

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// NULPath returns where an action input holds the character U+0000 (a
// "\u0000" escape) in a string or a member name, as a JSON-pointer-like
// path ("/message/content", "/tags/2"; "" is the input itself), and
// false when it holds none or is not JSON. Products that keep text in
// PostgreSQL (Chatwoot, through Rails) cannot store it: the driver
// refuses the statement after the request was accepted, which the
// product answers with a 500, an outcome the adapter cannot tell from a
// write that failed midway. An adapter refuses such an input before
// sending anything.
func NULPath(raw json.RawMessage) (string, bool) {
	if bytes.IndexByte(raw, 0) < 0 && !bytes.Contains(raw, []byte(`\u0000`)) {
		return "", false // the common case: no escape to read
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", false
	}
	var walk func(v any, path string) (string, bool)
	walk = func(v any, path string) (string, bool) {
		switch v := v.(type) {
		case string:
			return path, strings.IndexByte(v, 0) >= 0
		case []any:
			for i, e := range v {
				if p, ok := walk(e, path+"/"+strconv.Itoa(i)); ok {
					return p, true
				}
			}
		case map[string]any:
			for k, e := range v {
				p := path + "/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(k)
				if strings.IndexByte(k, 0) >= 0 {
					return p, true
				}
				if p, ok := walk(e, p); ok {
					return p, true
				}
			}
		}
		return "", false
	}
	return walk(v, "")
}
