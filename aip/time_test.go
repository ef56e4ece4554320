package aip

import (
	"encoding/json"
	"testing"
	"time"
)

// Timestamps are written as Rust's time crate writes RFC 3339: upstream
// re-serializes a parsed message before verifying its signature, so
// "05.690Z" signed here would be checked there as "05.69Z".
func TestTimestampWireFormMatchesRustTime(t *testing.T) {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		t    time.Time
		want string
	}{
		{base, `"2026-01-02T03:04:05Z"`},
		{base.Add(690 * time.Millisecond), `"2026-01-02T03:04:05.69Z"`},
		{base.Add(600 * time.Millisecond), `"2026-01-02T03:04:05.6Z"`},
		{base.Add(678 * time.Millisecond), `"2026-01-02T03:04:05.678Z"`},
		{base.Add(1*time.Millisecond + 999*time.Microsecond), `"2026-01-02T03:04:05.001Z"`},
		{base.In(time.FixedZone("x", 2*3600)), `"2026-01-02T03:04:05Z"`},
	}
	for _, tt := range tests {
		got, err := json.Marshal(At(tt.t))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tt.want {
			t.Errorf("At(%v) marshals as %s, want %s", tt.t, got, tt.want)
		}
		var back Timestamp
		if err := json.Unmarshal(got, &back); err != nil || !back.Equal(At(tt.t).Time) {
			t.Errorf("%s decodes as %v (%v), want %v", got, back, err, At(tt.t))
		}
	}
}
