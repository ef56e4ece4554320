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

// A timestamp is decoded only if it can be written back as RFC 3339 in UTC:
// an offset can push a four-digit year out of 0000..9999, and writing
// "10000-01-01T00:59:59Z" would produce JSON that no RFC 3339 parser,
// this package's included, accepts.
func TestTimestampRefusesYearsOutsideRFC3339(t *testing.T) {
	for _, in := range []string{
		`"9999-12-31T23:59:59-01:00"`, // 10000-01-01T00:59:59Z
		`"0000-01-01T00:00:00+01:00"`, // -0001-12-31T23:00:00Z
	} {
		var ts Timestamp
		if err := json.Unmarshal([]byte(in), &ts); err == nil {
			out, merr := json.Marshal(ts)
			t.Errorf("%s decodes (as %s, %v); want an error", in, out, merr)
		}
	}
	for _, in := range []string{`"9999-12-31T23:59:59Z"`, `"0000-01-01T00:00:00Z"`, `"9999-12-31T23:59:59+01:00"`} {
		var ts Timestamp
		if err := json.Unmarshal([]byte(in), &ts); err != nil {
			t.Errorf("%s: %v", in, err)
		}
	}
	if out, err := json.Marshal(At(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC))); err == nil {
		t.Errorf("year 10000 marshals as %s; want an error", out)
	}
	if out, err := json.Marshal(At(time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC))); err == nil {
		t.Errorf("year -1 marshals as %s; want an error", out)
	}
}

// Decoding accepts RFC 3339 only: Go's parser also takes a comma before
// the fraction and offsets such as +24:00 or +00:60, which RFC 3339 (and
// Rust's time crate, upstream) refuse.
func TestTimestampRefusesNonRFC3339Spellings(t *testing.T) {
	for _, in := range []string{
		`"2026-01-02T03:04:05,5Z"`,
		`"2026-01-02T03:04:05+24:00"`,
		`"2026-01-02T03:04:05+00:60"`,
		`"2026-01-02T03:04:05.5-24:00"`,
	} {
		var ts Timestamp
		if err := json.Unmarshal([]byte(in), &ts); err == nil {
			t.Errorf("%s decodes as %v; want an error", in, ts)
		}
	}
	for _, in := range []string{
		`"2026-01-02T03:04:05Z"`, `"2026-01-02T03:04:05.123456789Z"`,
		`"2026-01-02T03:04:05+23:59"`, `"2026-01-02T03:04:05.5-00:00"`,
	} {
		var ts Timestamp
		if err := json.Unmarshal([]byte(in), &ts); err != nil {
			t.Errorf("%s: %v", in, err)
		}
	}
}
