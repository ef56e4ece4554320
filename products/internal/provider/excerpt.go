package provider

import "github.com/aipfleet/aipfleet/aip"

// MaxExcerptBytes bounds an Excerpt.
const MaxExcerptBytes = 64

// Excerpt is a value a provider answered (an ID, a JSON member) for an
// error message: the value when it has at most MaxExcerptBytes bytes, else
// its first MaxExcerptBytes bytes, never half a UTF-8 sequence, and "…".
// Callers quote an ID with %q, so control characters show escaped.
func Excerpt(s string) string {
	if len(s) <= MaxExcerptBytes {
		return s
	}
	return aip.TruncateUTF8(s, MaxExcerptBytes) + "…"
}
