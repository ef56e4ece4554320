package webhook

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// MaxInlinePayload is the largest payload a route copies into an event's
// data; a larger one is cut down to it (TrimPayload), leaving room within
// hostsdk.MaxEventBytes (256 KiB) for the rest of the event. The products
// do not deliver a refused delivery again, so a route cuts a payload down
// rather than refusing its event as too large.
const MaxInlinePayload = 192 << 10

// Trim says what TrimPayload may leave out of a payload (a JSON object).
type Trim struct {
	// First are the members left out before any other, in order, when
	// present: a member's name, or "outer.inner" for a member of a member
	// that is an object (Chatwoot's conversation.messages, which repeats
	// the message).
	First []string
	// Keep are the members never left out: those naming the event and
	// what it is about, which let a consumer read the rest through the
	// product's API.
	Keep []string
	// Inner names a member that is an object whose own members are left
	// out one by one (but InnerKeep), competing by size with the
	// payload's, rather than the member whole (Twenty's record, whose id
	// stays). "" for none; it should be in Keep.
	Inner     string
	InnerKeep []string
}

// TrimPayload returns payload, a JSON object, cut down to at most max
// bytes, and the members it left out, in the order it left them out:
// first those of t.First that are present, then the largest members
// (t.Inner's own members counted apart, t.Inner's first among equals in
// size) but t.Keep's and t.InnerKeep's, largest first, the first in
// order among equals; an inner member is named "inner.member". Its error
// says when the payload is not an object or still exceeds max with only
// what t keeps. A payload within max is returned as it is.
//
// The payload is encoded once more at the end, not at every member left
// out: a payload of many small members costs a sort, not a pass per
// member.
func TrimPayload(payload []byte, max int, t Trim) (json.RawMessage, []string, error) {
	if len(payload) <= max {
		return payload, []string{}, nil
	}
	var p map[string]json.RawMessage
	if err := json.Unmarshal(payload, &p); err != nil || p == nil {
		return nil, nil, fmt.Errorf("the payload is not a JSON object")
	}
	omitted := []string{}
	for _, name := range t.First {
		outer, inner, nested := strings.Cut(name, ".")
		if !nested {
			if _, ok := p[name]; ok {
				delete(p, name)
				omitted = append(omitted, name)
			}
			continue
		}
		var o map[string]json.RawMessage
		if json.Unmarshal(p[outer], &o) != nil || o == nil {
			continue
		}
		if _, ok := o[inner]; !ok {
			continue
		}
		delete(o, inner)
		raw, err := json.Marshal(o)
		if err != nil {
			return nil, nil, err
		}
		p[outer] = raw
		omitted = append(omitted, name)
	}
	// Encoded and decoded once, the members hold their values as the
	// encoding writes them (compact, HTML characters escaped), so a
	// member left out takes at least len(name)+len(value)+3 bytes (its
	// quotes and colon) off the encoding, and one more (a comma) when
	// its object holds others: size stays an upper bound.
	raw, err := json.Marshal(p)
	if err != nil {
		return nil, nil, err
	}
	if len(raw) <= max {
		return raw, omitted, nil
	}
	p = nil
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, nil, err
	}
	var inner map[string]json.RawMessage
	if t.Inner != "" && (json.Unmarshal(p[t.Inner], &inner) != nil || inner == nil) {
		inner = nil
	}
	type member struct {
		name  string
		inner bool
		size  int
	}
	keep, innerKeep := set(t.Keep), set(t.InnerKeep)
	var members []member
	for k, v := range p {
		if !keep[k] && !(inner != nil && k == t.Inner) {
			members = append(members, member{k, false, len(v)})
		}
	}
	for k, v := range inner {
		if !innerKeep[k] {
			members = append(members, member{k, true, len(v)})
		}
	}
	slices.SortFunc(members, func(a, b member) int {
		switch {
		case a.size != b.size:
			return b.size - a.size
		case a.inner != b.inner:
			if a.inner {
				return -1
			}
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	size := len(raw)
	innerChanged := false
	for _, m := range members {
		if size <= max {
			break
		}
		from := p
		if m.inner {
			from = inner
			innerChanged = true
			omitted = append(omitted, t.Inner+"."+m.name)
		} else {
			omitted = append(omitted, m.name)
		}
		size -= len(m.name) + m.size + 3
		if len(from) > 1 {
			size-- // its comma
		}
		delete(from, m.name)
	}
	if innerChanged {
		if p[t.Inner], err = json.Marshal(inner); err != nil {
			return nil, nil, err
		}
	}
	if raw, err = json.Marshal(p); err != nil {
		return nil, nil, err
	}
	if len(raw) > max {
		return nil, nil, fmt.Errorf("the payload is %d bytes with only the members that name its event (%s); at most %d fit",
			len(raw), strings.Join(slices.Sorted(maps.Keys(p)), ", "), max)
	}
	return raw, omitted, nil
}

func set(keys []string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}
