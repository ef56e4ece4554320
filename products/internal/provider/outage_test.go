package provider

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

func TestTransient(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&Error{Status: 0, Err: errors.New("connection reset")}, true},
		{&Error{Status: http.StatusInternalServerError}, true},
		{&Error{Status: http.StatusServiceUnavailable}, true},
		{&Error{Status: http.StatusTooManyRequests}, true},
		{&Error{Status: http.StatusRequestTimeout}, true},
		{fmt.Errorf("wrapped: %w", &Error{Status: http.StatusBadGateway}), true},
		{&Error{Status: http.StatusOK, Message: "the status answer has no status"}, false},
		{&Error{Status: http.StatusNotFound}, false},
		// The provider does not offer the operation: asking again gets
		// the same 501 (provider.not_implemented, not retryable).
		{&Error{Status: http.StatusNotImplemented}, false},
		{&Error{Status: http.StatusUnauthorized}, false},
		{errors.New("not a provider error"), false},
	} {
		if _, got := Transient(tc.err); got != tc.want {
			t.Errorf("Transient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// The waits after transient failures double from the poll interval up to
// the cap; a longer Retry-After is honoured, within its bound; a success
// starts the count again.
func TestOutageBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := Outage{Poll: time.Second, Cap: 30 * time.Second, Budget: time.Hour, MaxRetryWait: 10 * time.Minute}
		fail := &Error{Status: http.StatusBadGateway}
		var got []time.Duration
		for range 8 {
			d, ok := o.Retry(fail, time.Now())
			if !ok {
				t.Fatalf("gave up after %d failures", o.Failures())
			}
			got = append(got, d)
		}
		want := []time.Duration{1, 2, 4, 8, 16, 30, 30, 30}
		for i := range want {
			if got[i] != want[i]*time.Second {
				t.Fatalf("waits %v, want %v seconds", got, want)
			}
		}
		if d, _ := o.Retry(&Error{Status: http.StatusTooManyRequests, RetryAfter: 90 * time.Second}, time.Now()); d != 90*time.Second {
			t.Errorf("Retry-After 90 s: wait %s", d)
		}
		if d, _ := o.Retry(&Error{Status: http.StatusTooManyRequests, RetryAfter: 10 * time.Second}, time.Now()); d != 30*time.Second {
			t.Errorf("Retry-After 10 s under a 30 s backoff: wait %s", d)
		}
		if d, _ := o.Retry(&Error{Status: http.StatusServiceUnavailable, RetryAfter: MaxRetryAfter}, time.Now()); d != 10*time.Minute {
			t.Errorf("Retry-After of a day: wait %s, want the 10 min bound", d)
		}
		o.Reset()
		if d, _ := o.Retry(fail, time.Now()); d != time.Second || o.Failures() != 1 {
			t.Errorf("after a success: wait %s, %d failures; want 1s, 1", d, o.Failures())
		}
		// A poll interval above the cap is never shortened.
		slow := Outage{Poll: time.Minute, Cap: 30 * time.Second}
		if d, _ := slow.Retry(fail, time.Now()); d != time.Minute {
			t.Errorf("poll 1 min, cap 30 s: wait %s", d)
		}
	})
}

// Transient failures go on being retried until they have lasted longer
// than the budget, counted from the start of the first failed read; a
// failure that is not transient ends the wait at once.
func TestOutageBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := Outage{Poll: time.Second, Cap: 30 * time.Second, Budget: 5 * time.Minute}
		fail := &Error{Status: 0, Err: errors.New("no answer")}
		start := time.Now()
		reads := 0
		for {
			began := time.Now()
			reads++
			d, ok := o.Retry(fail, began)
			if !ok {
				break
			}
			time.Sleep(d)
		}
		elapsed := time.Since(start)
		if elapsed <= 5*time.Minute || elapsed > 5*time.Minute+30*time.Second {
			t.Errorf("gave up after %s, want just past the 5 min budget", elapsed)
		}
		if reads < 10 {
			t.Errorf("%d reads in the outage", reads)
		}

		var p Outage
		if _, ok := p.Retry(&Error{Status: http.StatusNotFound}, time.Now()); ok {
			t.Error("a 404 was retried")
		}
		if _, ok := p.Retry(errors.New("adapter's own"), time.Now()); ok {
			t.Error("an error that is not a provider error was retried")
		}
		// The zero budget is the default one.
		if _, ok := p.Retry(fail, time.Now().Add(-DefaultOutageBudget+time.Second)); !ok {
			t.Error("a failure within the default budget ended the wait")
		}
		p.Reset()
		if _, ok := p.Retry(fail, time.Now().Add(-DefaultOutageBudget-time.Second)); ok {
			t.Error("a failure past the default budget did not end the wait")
		}
	})
}
