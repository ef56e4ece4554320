package provider

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestExcerpt(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"run_abc123", "run_abc123"},
		{strings.Repeat("a", MaxExcerptBytes), strings.Repeat("a", MaxExcerptBytes)},
		{strings.Repeat("a", MaxExcerptBytes+1), strings.Repeat("a", MaxExcerptBytes) + "…"},
		// "é" is 2 bytes and would straddle the bound: it is left out whole.
		{strings.Repeat("a", MaxExcerptBytes-1) + "é", strings.Repeat("a", MaxExcerptBytes-1) + "…"},
	} {
		got := Excerpt(tc.in)
		if got != tc.want || !utf8.ValidString(got) {
			t.Errorf("Excerpt(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
