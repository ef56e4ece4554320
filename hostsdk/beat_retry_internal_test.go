package hostsdk

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestBeatRetryDelayBounds(t *testing.T) {
	lowest := func(uint64) uint64 { return 0 }
	highest := func(n uint64) uint64 { return n - 1 }
	for _, c := range []struct {
		n        int
		interval time.Duration
		lo, hi   time.Duration
	}{
		{1, 10 * time.Second, 500 * time.Millisecond, time.Second},
		{2, 10 * time.Second, time.Second, 2 * time.Second},
		{3, 10 * time.Second, 2 * time.Second, 4 * time.Second},
		{4, 10 * time.Second, 2500 * time.Millisecond, 5 * time.Second}, // capped at half the interval
		{64, 10 * time.Second, 2500 * time.Millisecond, 5 * time.Second},
		{1, time.Second, 250 * time.Millisecond, 500 * time.Millisecond},
		{1, time.Millisecond, 250 * time.Microsecond, 500 * time.Microsecond},
	} {
		lo := beatRetryDelay(c.n, c.interval/2, lowest)
		hi := beatRetryDelay(c.n, c.interval/2, highest)
		if lo != c.lo || hi != c.hi {
			t.Errorf("retry %d with interval %s: delays in [%s, %s], want [%s, %s]", c.n, c.interval, lo, hi, c.lo, c.hi)
		}
	}
}

// TestBeatRetryDelaysAreSpread: hosts whose beats failed together do not
// retry together: the delays of one retry spread over its whole window.
func TestBeatRetryDelaysAreSpread(t *testing.T) {
	lo, hi := time.Hour, time.Duration(0)
	for range 1000 {
		d := beatRetryDelay(4, 5*time.Second, rand.Uint64N)
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < 2500*time.Millisecond || hi > 5*time.Second || lo > 3*time.Second || hi < 4500*time.Millisecond {
		t.Errorf("1000 delays of a capped retry in [%s, %s]; want them spread over [2.5s, 5s]", lo, hi)
	}
}

func TestNextBeatRetry(t *testing.T) {
	const interval = 10 * time.Second
	highest := func(n uint64) uint64 { return n - 1 }
	for _, c := range []struct {
		name                   string
		n                      int
		untilTick, untilExpiry time.Duration
		want                   time.Duration // 0: no retry
	}{
		{"first retry", 1, 9 * time.Second, 20 * time.Second, time.Second},
		{"capped", 5, 9 * time.Second, 20 * time.Second, 5 * time.Second},
		{"the tick comes first", 4, 5 * time.Second, 20 * time.Second, 0},
		{"the tick comes at the same time", 4, 5 * time.Second, 20 * time.Second, 0},
		{"cut to the last chance, a second before the expiry", 4, 9 * time.Second, 4 * time.Second, 3 * time.Second},
		{"the last chance is sooner than any retry", 4, 9 * time.Second, 1400 * time.Millisecond, 0},
		{"the last chance just in time", 4, 9 * time.Second, 1500 * time.Millisecond, 500 * time.Millisecond},
		{"the lease ran out", 1, 9 * time.Second, -time.Second, 0},
	} {
		got, ok := nextBeatRetry(c.n, c.untilTick, c.untilExpiry, interval, highest)
		if !ok {
			got = 0
		}
		if ok != (c.want != 0) || got != c.want {
			t.Errorf("%s: retry in %s (%v), want %s", c.name, got, ok, c.want)
		}
	}
	// With a 2 s interval the margin is a quarter of it, and the first
	// retry at least 500 ms.
	if got, ok := nextBeatRetry(3, 2*time.Second, 1200*time.Millisecond, 2*time.Second, highest); !ok || got != 700*time.Millisecond {
		t.Errorf("2s interval: retry in %s (%v), want 700ms", got, ok)
	}
}
