package provider

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// NULPath returns where an action input holds the character U+0000 (a
// "\u0000" escape) in a string or a member name, as a JSON-pointer-like
// path ("/message/content", "/tags/2"; "" is the input itself), and
// false when it holds none or is not JSON. PostgreSQL cannot hold it in
// text, varchar or jsonb, nor compare with it: the server refuses a
// parameter holding it (invalid byte sequence for encoding "UTF8": 0x00,
// SQLSTATE 22021; some drivers refuse it first, as Ruby's pg and Python's
// psycopg2 do) and jsonb the escape (unsupported Unicode escape sequence,
// 22P05). That happens after the product accepted the request, and a
// product that does not catch it answers with a 500, an outcome the
// adapter cannot tell from a write that failed midway. RefuseNUL is the
// refusal an adapter for such a product makes before sending anything.
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

// RefuseNUL refuses an action whose input holds U+0000 (NULPath) when
// product keeps the input's text in PostgreSQL without removing the
// character first, as Chatwoot (Rails), Twenty (TypeORM) and Cal.diy
// (Prisma) do: a permanent, non-retryable error with the adapter's
// input_invalid code, naming the capability and where the character is.
// It returns nil when the input holds none. An adapter calls it before
// its first request, for reads too: a filter or search holding the
// character fails the same way, and would fail on every retry. A product
// that removes the character itself, or refuses it with a 4xx, needs no
// refusal (Dify: see its package).
func RefuseNUL(code, product string, call *hostsdk.Call) error {
	path, ok := NULPath(call.Action.Input)
	if !ok {
		return nil
	}
	return aip.NewProtocolError(code, aip.CategoryPermanent, false, 0,
		fmt.Sprintf("input of %s: %q holds the character U+0000, which %s cannot store or search for (its text is in PostgreSQL); remove it",
			call.Action.CapabilityID, path, product))
}
