package hostsdk_test

import (
	"encoding/json"
	"sort"
	"strings"
)

func containsString(s, sub string) bool { return strings.Contains(s, sub) }

// metricNames returns the sorted metric names of a Prometheus text page.
func metricNames(page string) []string {
	seen := map[string]bool{}
	for _, line := range strings.Split(page, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		seen[name] = true
	}
	var out []string
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func jsonUnmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
