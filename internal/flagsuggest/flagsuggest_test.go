package flagsuggest

import (
	"flag"
	"testing"
)

func TestClosest(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	for _, n := range []string{"bind", "max-in-flight", "lease-ttl-ms", "replica-id", "region", "drain-timeout-ms", "drain-linger-ms", "zone"} {
		fs.String(n, "", "")
	}
	for _, c := range []struct{ given, want string }{
		{"max-in-flite", "max-in-flight"},    // misspelt
		{"max-inflight", "max-in-flight"},    // a dash left out
		{"--max-in-flight", "max-in-flight"}, // dashes are not part of the name
		{"MAX_IN_FLIGHT", "max-in-flight"},   // a variable's spelling
		{"lease-tll-ms", "lease-ttl-ms"},     // two letters swapped
		{"replica", "replica-id"},            // the start of one flag
		{"drain", ""},                        // the start of two
		{"bogus", ""},                        // nothing near
		{"zon", "zone"},
		{"x", ""},
		{"", ""},
	} {
		if got := Closest(fs, c.given); got != c.want {
			t.Errorf("Closest(%q) = %q, want %q", c.given, got, c.want)
		}
	}
}

func TestDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"abc", "", 3}, {"", "ab", 2}, {"kitten", "sitting", 3}, {"ab", "ba", 1}, {"flite", "flight", 3},
	} {
		if got := distance(c.a, c.b); got != c.want {
			t.Errorf("distance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
