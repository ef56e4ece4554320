package provider

import (
	"errors"
	"net/http"
	"time"
)

// Defaults of Outage.
const (
	// DefaultBackoffCap bounds the exponential backoff between reads
	// that failed transiently.
	DefaultBackoffCap = 30 * time.Second
	// DefaultOutageBudget is how long the reads that follow a long run
	// may keep failing transiently before the wait for the run ends.
	DefaultOutageBudget = 5 * time.Minute
	// DefaultMaxRetryWait bounds the wait a provider's Retry-After asks
	// for.
	DefaultMaxRetryWait = 10 * time.Minute
)

// Transient reports whether err is a failed read worth repeating: no
// answer (or an answer that could not be read), a 5xx, a 408 or a 429 —
// not a 501, which says the provider does not offer the operation
// (provider.not_implemented, not retryable) and answers the same again.
// It returns the *Error it found.
func Transient(err error) (*Error, bool) {
	var pe *Error
	if !errors.As(err, &pe) {
		return nil, false
	}
	s := pe.Status
	return pe, s == 0 || mayHaveApplied5xx(s) || s == http.StatusTooManyRequests || s == http.StatusRequestTimeout
}

// Outage follows the reads that wait for a long run on a provider (a
// crew run, an agent run) through the provider's short outages: after a
// read that failed transiently the next one waits Poll × 2^(failures-1),
// at most Cap (never less than Poll), or the provider's Retry-After when
// that is longer, at most MaxRetryWait (never less than that backoff).
// The reads go on until one succeeds (Reset) or a transient failure comes
// when the failures in a row have lasted longer than Budget, counted from
// the start of the first of them; a failure that is not transient ends
// the wait at once. The caller's context bounds the whole wait.
//
// The zero value of Cap, Budget and MaxRetryWait means its default. An
// Outage is used by one goroutine.
type Outage struct {
	// Poll is the wait after a successful read, and the first backoff.
	Poll time.Duration
	// Cap bounds the exponential backoff (0: DefaultBackoffCap).
	Cap time.Duration
	// Budget is how long transient failures in a row may last (0:
	// DefaultOutageBudget).
	Budget time.Duration
	// MaxRetryWait bounds a wait a Retry-After asks for (0:
	// DefaultMaxRetryWait).
	MaxRetryWait time.Duration

	failures int
	since    time.Time
}

// Failures is the number of reads in a row that failed.
func (o *Outage) Failures() int { return o.failures }

// Since is when the first read of the current outage began (zero when
// the last read succeeded).
func (o *Outage) Since() time.Time { return o.since }

// Reset records a successful read: the outage, if any, is over.
func (o *Outage) Reset() { o.failures, o.since = 0, time.Time{} }

// Retry records that the read begun at began failed with err, and returns
// the wait before the next read and true; or false when the wait for the
// run should end: err is not transient, or transient failures have lasted
// longer than the budget.
func (o *Outage) Retry(err error, began time.Time) (time.Duration, bool) {
	pe, ok := Transient(err)
	if !ok {
		return 0, false
	}
	if o.failures == 0 {
		o.since = began
	}
	o.failures++
	budget := o.Budget
	if budget <= 0 {
		budget = DefaultOutageBudget
	}
	if time.Since(o.since) > budget {
		return 0, false
	}
	return o.delay(pe.RetryAfter), true
}

// delay is the wait before the read that follows the o.failures-th
// failure in a row, whose answer asked for retryAfter (0: none).
func (o *Outage) delay(retryAfter time.Duration) time.Duration {
	capped := o.Cap
	if capped <= 0 {
		capped = DefaultBackoffCap
	}
	poll := max(o.Poll, time.Millisecond)
	d := poll
	for i := 1; i < o.failures && d < capped; i++ {
		d *= 2
	}
	d = max(min(d, capped), poll)
	if retryAfter > d {
		bound := o.MaxRetryWait
		if bound <= 0 {
			bound = DefaultMaxRetryWait
		}
		d = min(retryAfter, max(d, bound))
	}
	return d
}
