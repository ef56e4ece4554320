package controlplane

import (
	"context"
	"sync"
	"time"
)

// A control plane that does not run for a while (SIGSTOP, a frozen
// container, a starved VM) reads the lifecycle requests that waited in its
// sockets meanwhile only when it runs again: their signed windows may have
// passed, and the host's retries resent the same request several times.
// The freshness rejection of such a request is no clock problem, so
// stallWatch notices the control plane's own stops (its ticker did not run
// for longer than stallThreshold) and recentRejections keeps the request
// IDs already rejected for their window, so that each resent copy is not
// logged again as if it were news.
const (
	// stallTick is how often Run's watch notes that the service runs.
	stallTick = time.Second
	// stallThreshold is the gap between two ticks that counts as a stop:
	// far above any scheduling or GC pause, and at most the future skew a
	// window accepts, so a request that expired across a shorter gap was
	// not made stale by it.
	stallThreshold = 5 * time.Second
	// maxRecentRejections bounds the window-rejected request IDs
	// remembered (anyone can send a request: the set must not grow).
	maxRecentRejections = 256
	// maxRememberedRequestID bounds what is kept of each.
	maxRememberedRequestID = 128
)

// stallWatch records the last time the service was seen running and the
// last stop it saw. Its clock is Config.Now: time.Now's monotonic reading
// keeps a wall-clock step from counting as a stop.
type stallWatch struct {
	mu       sync.Mutex
	last     time.Time // the last tick; zero before Run
	from, to time.Time // the last stop seen; zero if none
}

// tick notes that the service runs at now.
func (w *stallWatch) tick(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.last.IsZero() && now.Sub(w.last) > stallThreshold {
		w.from, w.to = w.last, now
	}
	w.last = now
}

// stop returns the control plane's stop that explains a request signed at
// issued and valid until expires being read only at now: a stop (the last
// one seen, or the one now ending, which the ticker has not seen yet)
// during which the request was valid — it could have arrived then and
// waited to be read. ok is false when there is none: the request was
// read promptly, so its window says something about its sender or the
// clocks.
func (w *stallWatch) stop(now, issued, expires time.Time) (from, to time.Time, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	from, to = w.from, w.to
	if !w.last.IsZero() && now.Sub(w.last) > stallThreshold {
		from, to = w.last, now
	}
	if from.IsZero() || !expires.After(from) || issued.After(to) {
		return time.Time{}, time.Time{}, false
	}
	return from, to, true
}

// watchStalls ticks w until ctx ends.
// (Run ticks once itself before it answers requests.)
func (s *Service) watchStalls(ctx context.Context) {
	t := time.NewTicker(stallTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.stall.tick(s.cfg.Now())
		}
	}
}

// recentRejections remembers the last maxRecentRejections request IDs
// rejected for their window.
type recentRejections struct {
	mu   sync.Mutex
	ids  map[string]struct{}
	ring []string
	next int
}

// seen records id and reports whether it was already recorded.
func (r *recentRejections) seen(id string) bool {
	if len(id) > maxRememberedRequestID {
		id = id[:maxRememberedRequestID]
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.ids[id]; ok {
		return true
	}
	if r.ids == nil {
		r.ids = make(map[string]struct{}, maxRecentRejections)
		r.ring = make([]string, maxRecentRejections)
	}
	if old := r.ring[r.next]; old != "" {
		delete(r.ids, old)
	}
	r.ring[r.next] = id
	r.next = (r.next + 1) % maxRecentRejections
	r.ids[id] = struct{}{}
	return false
}
