package provider

import (
	"errors"
	"net/http"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"0", 0},
		{" 7 ", 7 * time.Second},
		{"-3", 0},
		{"99999999999", MaxRetryAfter},
		{"999999999999999999999999", MaxRetryAfter}, // more digits than an int64 holds: still a long wait
		{"3s", 0},
		{"soon", 0},
		{"", 0},
		// An HTTP date (IMF-fixdate and the two obsolete forms).
		{"Sun, 01 Mar 2026 12:02:00 GMT", 2 * time.Minute},
		{"Sunday, 01-Mar-26 12:00:30 GMT", 30 * time.Second},
		{"Sun Mar  1 12:00:05 2026", 5 * time.Second},
		{"Sun, 01 Mar 2026 11:59:00 GMT", 0}, // already past
		{"Sun, 01 Mar 2026 12:00:00 GMT", 0},
		{"Fri, 01 Mar 2030 12:00:00 GMT", MaxRetryAfter},
	} {
		if got := ParseRetryAfter(tc.in, now); got != tc.want {
			t.Errorf("ParseRetryAfter(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// A 429 or 503 whose Retry-After is an HTTP date carries the wait in the
// error and in the protocol error's retry_after_ms: it used to be read as
// seconds only, so the hint was lost.
func TestRetryAfterHTTPDate(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", time.Now().Add(10*time.Minute).UTC().Format(http.TimeFormat))
			w.WriteHeader(status)
		}, nil)
		_, err := c.Do(t.Context(), Request{Method: "GET", Path: "/x"})
		var pe *Error
		if !errors.As(err, &pe) || pe.Status != status {
			t.Fatalf("Do = %v", err)
		}
		// The date has a resolution of a second; the test may take a while.
		if pe.RetryAfter < 5*time.Minute || pe.RetryAfter > 10*time.Minute {
			t.Fatalf("%d: RetryAfter %s, want about 10m", status, pe.RetryAfter)
		}
		if perr := ProtocolError(pe); perr.RetryAfterMS == nil || *perr.RetryAfterMS < 300_000 {
			t.Fatalf("%d: ProtocolError %+v, want retry_after_ms about 600000", status, perr)
		}
	}
}
