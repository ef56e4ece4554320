package provider

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
)

// maxExactInteger is the largest integer a JSON number (an IEEE 754
// double to most readers) holds exactly: 2^53 - 1.
const maxExactInteger = 1<<53 - 1

// IntegralNumbers returns an action input with every number whose value
// is an integer of at most 2^53 - 1 in magnitude written as that integer
// (42.0, 4.2e1 and 42E0 become 42), and raw itself when it holds none to
// rewrite or is not JSON. JSON Schema's "integer" accepts those spellings
// (draft 2020-12 §6.1.1: a number with a zero fractional part), so an input
// the host validated may carry them; the adapters decode integers into Go
// integers and put them in paths and queries, where "42.0" would be
// refused, or read as another number by the provider (Rails reads the path
// segment "4.2e1" as 4). Other numbers are left as they are.
func IntegralNumbers(raw json.RawMessage) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return raw
	}
	changed := false
	var walk func(v any) any
	walk = func(v any) any {
		switch v := v.(type) {
		case json.Number:
			s := v.String()
			if _, err := strconv.ParseInt(s, 10, 64); err == nil {
				return v
			}
			f, err := strconv.ParseFloat(s, 64)
			if err != nil || f != math.Trunc(f) || math.Abs(f) > maxExactInteger {
				return v
			}
			changed = true
			return json.Number(strconv.FormatInt(int64(f), 10))
		case map[string]any:
			for k, m := range v {
				v[k] = walk(m)
			}
		case []any:
			for i, m := range v {
				v[i] = walk(m)
			}
		}
		return v
	}
	v = walk(v)
	if !changed {
		return raw
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return raw
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}
