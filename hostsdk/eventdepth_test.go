package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/registry"
)

// nestedData is an event's data object nesting levels deep (the object
// itself is level 1).
func nestedData(levels int) json.RawMessage {
	return json.RawMessage(`{"a":` + strings.Repeat("[", levels-1) + strings.Repeat("]", levels-1) + `}`)
}

// TestPublishRefusesDataTooDeepForADelivery: a delivery envelope holds an
// event's data five levels down and a signed document nests at most 256
// levels, so data nesting deeper than hostsdk.MaxEventDataDepth could
// never be signed into a delivery. Publish took it, and the delivery loop
// then failed to sign its batch at every attempt, reporting a transport
// failure and retrying the whole batch — the other events of the batch
// with it — every minute for ever. Publish refuses it now, and data
// exactly as deep as allowed is delivered.
func TestPublishRefusesDataTooDeepForADelivery(t *testing.T) {
	if hostsdk.MaxEventDataDepth != registry.MaxEventDataDepth {
		t.Fatalf("hostsdk.MaxEventDataDepth %d, the fleet's event log takes %d", hostsdk.MaxEventDataDepth, registry.MaxEventDataDepth)
	}
	synctest.Test(t, func(t *testing.T) {
		f := newEventFleet(t, true)
		f.conn.mu.Lock()
		pub := f.conn.pub
		f.conn.mu.Unlock()
		_, err := pub.Publish(context.Background(), "test.events",
			aip.Event{Kind: "ok"}, aip.Event{Kind: "deep", Data: nestedData(hostsdk.MaxEventDataDepth + 1)})
		if !errors.Is(err, hostsdk.ErrInvalidEvents) || !strings.Contains(err.Error(), "nests 252 levels deep") {
			t.Fatalf("Publish of data nesting %d levels: %v; want ErrInvalidEvents saying how deep it nests", hostsdk.MaxEventDataDepth+1, err)
		}
		if _, err := pub.Publish(context.Background(), "test.events",
			aip.Event{Kind: "ok"}, aip.Event{Kind: "deep", Data: nestedData(hostsdk.MaxEventDataDepth)}); err != nil {
			t.Fatalf("Publish of data nesting %d levels: %v", hostsdk.MaxEventDataDepth, err)
		}
		synctest.Wait()
		if ev := f.in.Events(); len(ev) != 2 {
			t.Fatalf("the ingress stored %d events, want both of the batch at the depth limit", len(ev))
		}
		if n := f.j.pending(t); n != 0 {
			t.Fatalf("the outbox holds %d batches after delivery", n)
		}
	})
}

// TestEventBatchThatCannotBeSignedIsSplit: a batch already in the outbox
// (written by a build that did not refuse it, or by another writer) holding
// an event that cannot be signed into a delivery is a refusal of its
// content, not a transport failure: it is split so that the other events
// are delivered, and the bad event alone stays in the outbox, retried
// hourly and counted as refused. Before, the whole batch was retried every
// minute for ever as a transport failure and no event of it was delivered.
func TestEventBatchThatCannotBeSignedIsSplit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newEventFleet(t, true)
		now := time.Now()
		events, err := json.Marshal([]aip.Event{
			{ID: aip.NewID(aip.PrefixEvent), Kind: "ok", OccurredAt: aip.At(now)},
			{ID: aip.NewID(aip.PrefixEvent), Kind: "deep", OccurredAt: aip.At(now), Data: nestedData(hostsdk.MaxEventDataDepth + 3)},
			{ID: aip.NewID(aip.PrefixEvent), Kind: "ok", OccurredAt: aip.At(now)},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.j.EnqueueEvents(context.Background(), journal.OutboxEntry{ID: "old-batch", ChannelID: "test.events",
			Events: events, NextAttempt: now, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if ev := f.in.Events(); len(ev) != 2 || ev[0].Kind != "ok" || ev[1].Kind != "ok" {
			t.Fatalf("the ingress stored %+v; want the two events that can be signed", ev)
		}
		if n := f.j.pending(t); n != 1 {
			t.Fatalf("the outbox holds %d batches; want the unsignable event's alone", n)
		}
		if n := f.metric(t, hostsdk.MetricEventsRefused); n != 1 {
			t.Errorf("%s = %v, want 1 (the lone event, retried hourly)", hostsdk.MetricEventsRefused, n)
		}
		if n := f.metric(t, failures(hostsdk.CodeEventTransport)); n != 0 {
			t.Errorf("%d transport failures counted; an unsignable batch is not one", int(n))
		}
		if logs := f.logs.String(); !strings.Contains(logs, "cannot be signed into a delivery") {
			t.Errorf("no log says the event cannot be signed into a delivery:\n%s", logs)
		}
	})
}
