package webhook

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/aipfleet/aipfleet/internal/logthrottle"
)

// RefusalLogEvery is the least time between two log lines of one kind of
// refusal on one route (see Refusals).
const RefusalLogEvery = time.Minute

// Refusals logs a route's refusals at warn without flooding the log, as
// the dispatcher logs its failed hops: the first refusal of a kind is
// logged at once; those of the same kind within RefusalLogEvery of the
// last line are only counted, and the next line of that kind carries
// their count as not_logged_since. A replica whose clock is off, or a
// product sending for another account, has every delivery refused: the
// log says so once a minute with the count, rather than once a delivery
// or never; a stranger posting forged deliveries costs at most a line a
// minute. Kinds are the route's own constants, never taken from a
// request, so the state stays small. A Refusals is safe for concurrent
// use; its zero value with Log and Route set is ready.
//
// The products that send the deliveries (Cal.diy, Chatwoot, Twenty) do
// not deliver a refused delivery again (but for Chatwoot's agent bots,
// which try twice more, 3 s apart, one answered 429 or 500: ResendStatus),
// so for a delivery the route verified the line is where its lost event
// is found.
type Refusals struct {
	// Log receives the lines.
	Log *slog.Logger
	// Route prefixes every line ("chatwoot webhook").
	Route string
	// ResendStatus is the status of PublishFailed's answers that ask the
	// product to deliver again (an event time ahead of the replica's
	// clock, a replica not serving, a full outbox, storage failing), which
	// a route gives its own such answers too. A product that resends only
	// on some statuses needs one of those: Chatwoot's agent bots resend
	// on 429 and 500 alone. Defaults to 503.
	ResendStatus int

	once     sync.Once
	throttle *logthrottle.Throttle
}

// Warn logs Route+": "+msg with args at warn, unless a refusal of kind
// was logged within RefusalLogEvery before now: then it only counts it.
// A line after such refusals carries their number as not_logged_since. A
// now before the last line (the clock was set back, as when a replica's
// clock is corrected) logs at once.
func (r *Refusals) Warn(now time.Time, kind, msg string, args ...any) {
	r.log(now, slog.LevelWarn, kind, msg, args...)
}

// resendStatus is ResendStatus, or 503 when it is not set.
func (r *Refusals) resendStatus() int {
	if r.ResendStatus != 0 {
		return r.ResendStatus
	}
	return http.StatusServiceUnavailable
}

// log is Warn at level.
func (r *Refusals) log(now time.Time, level slog.Level, kind, msg string, args ...any) {
	r.once.Do(func() { r.throttle = &logthrottle.Throttle{Every: RefusalLogEvery} })
	suppressed, ok := r.throttle.Allow(kind, now)
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args[:len(args):len(args)], "not_logged_since", suppressed)
	}
	r.Log.Log(context.Background(), level, r.Route+": "+msg, args...)
}
