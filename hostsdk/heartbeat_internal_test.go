package hostsdk

import (
	"testing"
	"time"
)

func TestFirstBeatDelayBounds(t *testing.T) {
	const interval = 10 * time.Second
	lo := firstBeatDelay(interval, func(n uint64) uint64 { return 0 })
	hi := firstBeatDelay(interval, func(n uint64) uint64 { return n - 1 })
	if lo != 7500*time.Millisecond || hi != 12500*time.Millisecond {
		t.Fatalf("first beat bounds [%s, %s], want [7.5s, 12.5s]", lo, hi)
	}
	// Odd millisecond intervals floor like the reference: I=1001 ms gives
	// [750, 1250].
	lo = firstBeatDelay(1001*time.Millisecond, func(n uint64) uint64 { return 0 })
	hi = firstBeatDelay(1001*time.Millisecond, func(n uint64) uint64 { return n - 1 })
	if lo != 750*time.Millisecond || hi != 1250*time.Millisecond {
		t.Fatalf("first beat bounds for 1001ms [%s, %s]", lo, hi)
	}
}

func TestNextBeatSkipsMissedTicks(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const i = 10 * time.Second
	for _, c := range []struct {
		now, want time.Duration
	}{
		{0, 10 * time.Second},               // on time
		{9 * time.Second, 10 * time.Second}, // beat took 9s
		{10 * time.Second, 20 * time.Second},
		{25 * time.Second, 30 * time.Second}, // slots at 10 and 20 skipped
		{30 * time.Second, 40 * time.Second},
	} {
		if got := nextBeat(t0, t0.Add(c.now), i).Sub(t0); got != c.want {
			t.Errorf("now=%s: next %s, want %s", c.now, got, c.want)
		}
	}
}
