// Package logthrottle keeps a log line that every request of a kind would
// write (a hop to a replica that is down, a webhook refused for the
// host's clock) to one line per key in an interval, the next line
// carrying how many were not logged since.
package logthrottle

import (
	"sync"
	"time"
)

// Throttle decides, per key, whether a line may be logged now. Its zero
// value is not usable: give Every. A Throttle is safe for concurrent use.
type Throttle struct {
	// Every is the least time between two lines of one key.
	Every time.Duration
	// MaxKeys bounds the keys remembered; when a new key finds it full,
	// the Throttle starts over (every key may then log at once). 0: no
	// bound, for keys that are the caller's own constants.
	MaxKeys int

	mu   sync.Mutex
	last map[string]*state
}

type state struct {
	at         time.Time
	suppressed int
}

// Allow reports whether a line of key may be logged at now (ok), and how
// many lines of key were not logged since the last one that was. A line
// within Every of the last one of its key is only counted. A now before
// the last line's (the clock was set back, as when a host's clock is
// corrected) logs at once.
func (t *Throttle) Allow(key string, now time.Time) (suppressed int, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.last[key]
	if st != nil {
		if d := now.Sub(st.at); d >= 0 && d < t.Every {
			st.suppressed++
			return 0, false
		}
	} else {
		if t.last == nil || (t.MaxKeys > 0 && len(t.last) >= t.MaxKeys) {
			t.last = map[string]*state{}
		}
		st = &state{}
		t.last[key] = st
	}
	suppressed, st.at, st.suppressed = st.suppressed, now, 0
	return suppressed, true
}
