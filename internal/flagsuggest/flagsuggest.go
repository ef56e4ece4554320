// Package flagsuggest finds the flag a mistyped flag name most likely
// meant, for the "unknown flag" errors of hostsdk.LoadConfig, the host
// programs (internal/hostrun.ParseFlags: aip-host, aip-sidecar) and the
// aipfleet CLI.
package flagsuggest

import (
	"flag"
	"strings"
)

// Closest returns the name (without dashes) of the flag of fs that name,
// an unknown flag's name, most likely meant, or "" when none is close:
// the same name in another letter case or with '_' for '-' (a variable's
// spelling), else the one flag it is the start of (at least 3
// characters), else the nearest within a third of its length in edits
// (a letter added, left out, changed or two swapped).
func Closest(fs *flag.FlagSet, name string) string {
	given := normalize(strings.TrimLeft(name, "-"))
	if given == "" {
		return ""
	}
	var exact, prefix, near string
	prefixes, best := 0, len(given)/3+1
	fs.VisitAll(func(f *flag.Flag) {
		known := normalize(f.Name)
		switch {
		case known == given:
			if exact == "" {
				exact = f.Name
			}
			return
		case len(given) >= 3 && strings.HasPrefix(known, given):
			prefixes++
			prefix = f.Name
		}
		if d := distance(given, known); d < best {
			best, near = d, f.Name
		}
	})
	switch {
	case exact != "":
		return exact
	case prefixes == 1:
		return prefix
	}
	return near
}

func normalize(s string) string {
	return strings.ReplaceAll(strings.ToLower(s), "_", "-")
}

// distance is the optimal string alignment distance of a and b: the
// insertions, deletions, substitutions and transpositions of adjacent
// bytes that turn one into the other.
func distance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
