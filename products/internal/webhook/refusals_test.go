package webhook

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestRefusalsRateLimited: the first refusal of a kind is logged, those
// within RefusalLogEvery after it are counted, and the next line carries
// their count; kinds are limited apart, and a clock set back logs at once.
func TestRefusalsRateLimited(t *testing.T) {
	var buf bytes.Buffer
	r := &Refusals{Log: slog.New(slog.NewTextHandler(&buf, nil)), Route: "test webhook"}
	lines := func() []string { return takeLines(&buf) }
	now := time.Unix(1_800_000_000, 0)
	r.Warn(now, "timestamp", "refused: clock", "delivery", "d1")
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], "level=WARN") || !strings.Contains(got[0], `msg="test webhook: refused: clock"`) ||
		!strings.Contains(got[0], "delivery=d1") || strings.Contains(got[0], "not_logged_since") {
		t.Fatalf("first refusal logged %q", got)
	}
	r.Warn(now.Add(10*time.Second), "timestamp", "refused: clock", "delivery", "d2")
	r.Warn(now.Add(20*time.Second), "timestamp", "refused: clock", "delivery", "d3")
	if got := lines(); got != nil {
		t.Fatalf("refusals within %s of the last line logged %q", RefusalLogEvery, got)
	}
	r.Warn(now.Add(30*time.Second), "account", "refused: account", "delivery", "d4")
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], "delivery=d4") {
		t.Fatalf("another kind logged %q", got)
	}
	r.Warn(now.Add(RefusalLogEvery), "timestamp", "refused: clock", "delivery", "d5")
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], "delivery=d5") || !strings.Contains(got[0], "not_logged_since=2") {
		t.Fatalf("refusal a minute later logged %q, want the count of the two not logged", got)
	}
	r.Warn(now.Add(-time.Hour), "timestamp", "refused: clock", "delivery", "d6")
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], "delivery=d6") || strings.Contains(got[0], "not_logged_since") {
		t.Fatalf("refusal after the clock was set back logged %q", got)
	}
}

// takeLines returns the lines logged into buf since the last call (none:
// nil) and empties it.
func takeLines(buf *bytes.Buffer) []string {
	out := strings.Split(strings.TrimSpace(buf.String()), "\n")
	buf.Reset()
	if len(out) == 1 && out[0] == "" {
		return nil
	}
	return out
}
