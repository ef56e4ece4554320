package logthrottle

import (
	"testing"
	"time"
)

func TestAllow(t *testing.T) {
	th := &Throttle{Every: time.Minute, MaxKeys: 2}
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	step := func(key string, at time.Time, wantSuppressed int, wantOK bool) {
		t.Helper()
		if s, ok := th.Allow(key, at); s != wantSuppressed || ok != wantOK {
			t.Fatalf("Allow(%q, %s) = %d, %v; want %d, %v", key, at.Sub(t0), s, ok, wantSuppressed, wantOK)
		}
	}
	step("a", t0, 0, true)
	step("a", t0.Add(time.Second), 0, false)
	step("a", t0.Add(59*time.Second), 0, false)
	step("b", t0.Add(2*time.Second), 0, true) // keys are apart
	step("a", t0.Add(time.Minute), 2, true)   // the count of those not logged
	step("a", t0.Add(time.Minute+time.Second), 0, false)
	step("a", t0.Add(30*time.Second), 1, true) // the clock went back: at once
	// A third key finds the Throttle full and starts it over.
	step("c", t0.Add(31*time.Second), 0, true)
	step("a", t0.Add(32*time.Second), 0, true)
}
