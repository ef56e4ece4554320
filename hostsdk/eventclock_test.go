package hostsdk_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// TestEventDeliveryKeepsBatchesWholeWhenTheClocksDisagree: the dispatcher
// refuses a delivery whose sent_at is more than 24 h behind its clock or
// more than 5 min ahead of it, and an event whose occurred_at is more than
// 5 min ahead of it, as connector_event.invalid — a refusal the host took
// for one of the batch's content: it split a batch of 100 down to single
// events, each kept alone and retried hourly, counted as refused, while
// the cause was this host's clock (or events it stamped while ahead) and
// the same for every event. The host tells the two apart by the
// dispatcher's clock (its signed answer's sent_at): the batch stays whole
// and is retried with backoff, the clock is logged once, at error level,
// and the batch is delivered once the clocks agree (or the dispatcher's
// clock reaches the events).
func TestEventDeliveryKeepsBatchesWholeWhenTheClocksDisagree(t *testing.T) {
	for _, c := range []struct {
		name string
		// offset is the dispatcher's clock less this host's.
		offset time.Duration
		// ahead stamps the events this far ahead of the host's clock
		// (Publish takes up to 5 min).
		ahead time.Duration
		// fix sets the dispatcher's clock right after the first check;
		// without it, the refusal goes away as the clock runs.
		fix    bool
		reason string
	}{
		{"host a day behind", 25 * time.Hour, 0, true, "behind the dispatcher's"},
		{"host ahead", -10 * time.Minute, 0, true, "ahead of the dispatcher's"},
		{"events stamped ahead", -2 * time.Minute, 4 * time.Minute, false, "occurred_at"},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var offset atomic.Int64
				offset.Store(int64(c.offset))
				j := memjournal.New()
				f := newSplitFleetClock(t, j, nil, func() time.Time { return time.Now().Add(time.Duration(offset.Load())) })
				f.conn.mu.Lock()
				pub := f.conn.pub
				f.conn.mu.Unlock()
				events := make([]aip.Event, hostsdk.MaxEventsPerBatch)
				for i := range events {
					events[i] = aip.Event{Kind: "ticket.created", Data: json.RawMessage(`{"n":` + strconv.Itoa(i) + `}`)}
					if c.ahead > 0 {
						events[i].OccurredAt = aip.At(time.Now().Add(c.ahead))
					}
				}
				original, err := pub.Publish(context.Background(), splitChannel, events...)
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(50 * time.Second)
				synctest.Wait()

				if n := pendingIn(t, j); n != 1 {
					t.Errorf("the outbox holds %d batches, want the published one, whole", n)
				}
				f.probe.mu.Lock()
				retried := len(f.probe.retries)
				f.probe.mu.Unlock()
				rs := f.probe.retriesOf(original)
				if retried != 1 || len(rs) < 3 {
					t.Errorf("%d batches retried, %s %d times in 50s; want only the published one, at least 3 times", retried, original, len(rs))
				}
				for _, r := range rs {
					if d := r.next.Sub(r.at); d > eventBackoffMaxWithJitter {
						t.Errorf("the batch is retried %s later, want the backoff of a transient failure (at most %s)", d, eventBackoffMaxWithJitter)
					}
				}
				if n := f.metric(t, hostsdk.MetricEventsRefused); n != 0 {
					t.Errorf("%s = %v, want 0: no event was refused for its content", hostsdk.MetricEventsRefused, n)
				}
				logs := f.logs.String()
				if n := strings.Count(logs, "check this host's clock"); n != 1 {
					t.Errorf("the log says to check this host's clock %d times, want once:\n%s", n, logs)
				}
				for _, want := range []string{"level=ERROR", c.reason} {
					if !strings.Contains(logs, want) {
						t.Errorf("no %q in the log:\n%s", want, logs)
					}
				}

				if c.fix {
					offset.Store(0)
				}
				time.Sleep(3 * time.Minute)
				synctest.Wait()
				if seen, total := f.eventLog(t); total != len(events) || len(seen) != len(events) {
					t.Errorf("the event log holds %d events (%d IDs), want the %d published", total, len(seen), len(events))
				}
				if n := pendingIn(t, j); n != 0 {
					t.Errorf("the outbox holds %d batches once the clocks agree, want none", n)
				}
				if logs := f.logs.String(); !strings.Contains(logs, "no longer refuses event deliveries because of this host's clock") {
					t.Errorf("no log says the clocks agree again:\n%s", logs)
				}
			})
		})
	}
}

// eventBackoffMaxWithJitter is the longest backoff of a transient
// delivery failure: 60 s plus up to 1 s of jitter.
const eventBackoffMaxWithJitter = 61 * time.Second

// TestEventDeliverySplitsForAnEventFarAhead: an event whose occurred_at is
// far ahead of every clock (a provider's time in the outbox of a build
// that did not check it) is the event's own problem, not the clocks': its
// batch is split as for any refused event, so that it does not hold the
// others back, and it waits alone, retried hourly.
func TestEventDeliverySplitsForAnEventFarAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := memjournal.New()
		f := newSplitFleet(t, j, nil)
		now := time.Now()
		far := aip.NewID(aip.PrefixEvent)
		events, err := json.Marshal([]aip.Event{
			{ID: aip.NewID(aip.PrefixEvent), Kind: "ok", OccurredAt: aip.At(now)},
			{ID: far, Kind: "far", OccurredAt: aip.At(now.Add(365 * 24 * time.Hour))},
			{ID: aip.NewID(aip.PrefixEvent), Kind: "ok", OccurredAt: aip.At(now)},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := j.EnqueueEvents(context.Background(), journal.OutboxEntry{ID: "old-batch", ChannelID: splitChannel,
			Events: events, NextAttempt: now, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if seen, total := f.eventLog(t); total != 2 || seen[far] != 0 {
			t.Errorf("the event log holds %d events (%v), want the two not ahead", total, seen)
		}
		if n := pendingIn(t, j); n != 1 {
			t.Errorf("the outbox holds %d batches, want the far event's alone", n)
		}
		if n := f.metric(t, hostsdk.MetricEventsRefused); n != 1 {
			t.Errorf("%s = %v, want 1 (the far event, retried hourly)", hostsdk.MetricEventsRefused, n)
		}
		if logs := f.logs.String(); strings.Contains(logs, "check this host's clock") {
			t.Errorf("the log blames this host's clock for an event far ahead:\n%s", logs)
		}
	})
}
