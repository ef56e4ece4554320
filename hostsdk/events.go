package hostsdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// Event publication bounds: the fleet's event ingress takes no more.
const (
	MaxEventsPerBatch   = aip.MaxEventsPerDelivery
	MaxChannelIDBytes   = aip.MaxChannelIDBytes
	MaxEventKindBytes   = aip.MaxEventKindBytes
	MaxEventBytes       = aip.MaxEventBytes
	maxPendingEventRows = 10000
)

// MaxEventDataDepth bounds how deeply an event's data nests: as deep as a
// signed delivery can carry it (aip.MaxEventDataDepth, the fleet's event
// log's bound too).
const MaxEventDataDepth = aip.MaxEventDataDepth

// EventPublisher puts provider events into the journal's durable outbox.
//
// With Config.EventEndpoint set, the host's delivery loop sends the
// batches to the dispatcher's connector-event ingress as signed envelopes
// and removes each once the dispatcher's signed answer verifies; failed
// batches are retried with backoff (see the package documentation). A
// publication wakes the loop. Without an event endpoint the batches wait in
// the outbox (counted in /ready's recovery summary as pending events).
// Publication is refused while the replica is not serving (draining, lease
// invalid, storage or connector unhealthy) and once the outbox holds 10000
// batches.
type EventPublisher struct {
	h *Host
}

// State returns the host's journal-backed state store, the one
// Call.State, RouteContext.State and UncertainAction.State give: an
// EventSource keeps its polling cursor there, in a namespace of its own
// (not under ReservedStatePrefix), so that a process started on the same
// journal polls from where the last one stopped. It stays writable until
// RunEvents has returned (the host closes it only after waiting for the
// event source in its shutdown), so a cursor written as ctx ends is kept.
func (p *EventPublisher) State() *State { return p.h.state }

// Publish validates a batch of events for a channel the manifest declares
// and stores it in the outbox. Events without an ID get a fresh evt_ ID (give
// an event the provider may deliver again the ID DeriveEventID derives from
// the delivery, so the fleet stores it once) and events without occurred_at
// get the current time; a provider-supplied actor
// moves to data.upstream_actor. Identical batches are stored once. A batch
// the fleet's event ingress would refuse (a channel ID aip.CheckChannelID
// refuses, an event ID twice, data that sets
// aip_connector, which the dispatcher stamps, a NUL in an event's kind, IDs
// or data, data nesting deeper than MaxEventDataDepth, a number in data
// beyond a double's range, ...) is refused here, not left in the outbox. It returns the
// outbox entry ID. Refusals match ErrInvalidEvents (the batch's content),
// ErrNotServing or ErrEventOutboxFull (try again later) with errors.Is. A
// batch the journal fails to store for a storage reason (not because ctx
// ended) makes the replica's storage not ready, as a failed action write
// does, until a storage check writes as much again.
func (p *EventPublisher) Publish(ctx context.Context, channelID string, events ...aip.Event) (string, error) {
	h := p.h
	if !h.ready() {
		return "", fmt.Errorf("%w: events on %s are not accepted now", ErrNotServing, channelID)
	}
	// The fleet's event log stores the channel IDs aip.CheckChannelID
	// takes, and no other: a batch on another channel could never be
	// delivered. Every channel the manifest declares is one
	// (aip.Manifest.Validate refused the manifest at bootstrap otherwise),
	// so this says what is wrong with a channel ID that is not.
	if err := aip.CheckChannelID(channelID); err != nil {
		return "", invalidEvents("hostsdk: %w", err)
	}
	if !h.channels[channelID] {
		return "", invalidEvents("hostsdk: channel %q is not declared in the manifest's channels", channelID)
	}
	if len(events) == 0 || len(events) > MaxEventsPerBatch {
		return "", invalidEvents("hostsdk: a batch holds 1 to %d events, got %d", MaxEventsPerBatch, len(events))
	}
	now := h.cfg.Now()
	batch := make([]aip.Event, len(events))
	seen := make(map[string]int, len(events))
	for i, e := range events {
		// What the fleet's event ingress would refuse is refused here, so
		// a connector learns it now rather than leave a batch in the
		// outbox that can never be delivered.
		if e.ID == "" {
			e.ID = aip.NewID(aip.PrefixEvent)
		} else if err := aip.ValidateID(aip.PrefixEvent, e.ID); err != nil {
			return "", invalidEvents("hostsdk: event ID %q: %v; leave it empty for a fresh one, or derive a UUIDv7-shaped one", e.ID, err)
		}
		if j, dup := seen[e.ID]; dup {
			return "", invalidEvents("hostsdk: event %s appears twice in the batch (events %d and %d); publish each event once", e.ID, j, i)
		}
		seen[e.ID] = i
		if e.Kind == "" || len(e.Kind) > MaxEventKindBytes || !utf8.ValidString(e.Kind) || strings.ContainsRune(e.Kind, 0) {
			return "", invalidEvents("hostsdk: event %s: kind must be 1 to %d bytes of UTF-8 without NUL", e.ID, MaxEventKindBytes)
		}
		for _, f := range []struct{ name, v string }{
			{"session_id", e.SessionID}, {"action_id", e.ActionID}, {"correlation_id", e.CorrelationID},
		} {
			if strings.ContainsRune(f.v, 0) {
				return "", invalidEvents("hostsdk: event %s: %s holds a NUL character, which the fleet's event log cannot store", e.ID, f.name)
			}
		}
		if e.OccurredAt.IsZero() {
			e.OccurredAt = aip.At(now)
		} else if e.OccurredAt.Time.After(now.Add(aip.MaxEnvelopeSkew)) {
			return "", markErr(ErrInvalidEvents, markErr(ErrEventAhead, fmt.Errorf("hostsdk: event %s: occurred_at %s is more than %s ahead of this host's clock", e.ID, e.OccurredAt, aip.MaxEnvelopeSkew)))
		}
		if len(e.Data) > 0 {
			obj, err := decodeData(e.Data)
			if err != nil || obj == nil {
				return "", invalidEvents("hostsdk: event %s: data must be a JSON object", e.ID)
			}
			// A delivery carries data in canonical JSON, whose numbers
			// are doubles (or integers within 64 bits): one beyond a
			// double's range could never be signed into a delivery.
			if path, num, ok := numberBeyondDouble(obj, "data"); ok {
				return "", invalidEvents("hostsdk: event %s: %s: the number %s is beyond the range of an IEEE 754 double (about ±1.8e308), the numbers a delivery carries; send it as a string",
					e.ID, path, truncateNumber(num))
			}
			if hasNUL(obj) {
				return "", invalidEvents("hostsdk: event %s: data holds a NUL character (\\u0000), which the fleet's event log cannot store", e.ID)
			}
			if _, taken := obj[eventProvenance]; taken {
				return "", invalidEvents("hostsdk: event %s: data.%s is set; leave it out, the dispatcher stamps it with the delivering replica", e.ID, eventProvenance)
			}
		}
		if e.Actor != nil {
			data := map[string]json.RawMessage{}
			if len(e.Data) > 0 {
				if err := json.Unmarshal(e.Data, &data); err != nil {
					return "", invalidEvents("hostsdk: event %s: data must be a JSON object when the event has an actor", e.ID)
				}
			}
			if _, taken := data["upstream_actor"]; taken {
				return "", invalidEvents("hostsdk: event %s: data.upstream_actor is already set and the event has an actor", e.ID)
			}
			actor, _ := json.Marshal(e.Actor)
			data["upstream_actor"] = actor
			e.Data, _ = json.Marshal(data)
			e.Actor = nil
		}
		if d := aip.JSONDepth(e.Data); d > MaxEventDataDepth {
			return "", invalidEvents("hostsdk: event %s: data nests %d levels deep; at most %d (a delivery carries it 5 levels down in a signed envelope, which nests at most 256)", e.ID, d, MaxEventDataDepth)
		}
		if len(e.Data) > 0 {
			// A delivery carries data in canonical JSON, and the
			// dispatcher measures the event in that form, which can be
			// longer than data as given (1e15 is 1000000000000000.0).
			canon, err := aip.Canonicalize(e.Data)
			if err != nil {
				return "", invalidEvents("hostsdk: event %s: data: %v", e.ID, err)
			}
			e.Data = canon
		}
		raw, err := json.Marshal(e)
		if err != nil {
			return "", invalidEvents("hostsdk: event %s: %w", e.ID, err)
		}
		if len(raw) > MaxEventBytes {
			return "", invalidEvents("hostsdk: event %s is %d bytes; at most %d", e.ID, len(raw), MaxEventBytes)
		}
		batch[i] = e
	}
	eventsJSON, err := json.Marshal(batch)
	if err != nil {
		return "", err
	}
	digest, err := aip.Digest(map[string]any{"channel_id": channelID, "events": json.RawMessage(eventsJSON)})
	if err != nil {
		return "", err
	}
	pending, err := h.journal.PendingEvents(ctx)
	if err != nil {
		return "", fmt.Errorf("hostsdk: event outbox: %w", err)
	}
	if pending >= maxPendingEventRows {
		return "", markErr(ErrEventOutboxFull, fmt.Errorf("hostsdk: event outbox holds %d batches, the most allowed; events are not being delivered", pending))
	}
	id := strings.ReplaceAll(digest, ":", "_")
	err = h.journal.EnqueueEvents(ctx, journal.OutboxEntry{
		ID: id, ChannelID: channelID, Events: eventsJSON, NextAttempt: now, CreatedAt: now,
	})
	if err != nil {
		// A batch the outbox cannot store for a storage reason makes
		// storage not ready (see storageRecheckMinBytes): the webhook it
		// came from is answered with an error and delivered again, better
		// to a replica that can store it.
		h.connectorWriteFailed(ctx, "storing an event batch on channel "+channelID+" in the outbox",
			len(id)+len(channelID)+len(eventsJSON)+2*8, err)
		return "", fmt.Errorf("hostsdk: event outbox: %w", err)
	}
	h.notifyEvents()
	return id, nil
}

// Errors of EventPublisher.Publish that a caller handling events for
// someone else (an HTTP route, a queue consumer) tells apart with
// errors.Is: ErrInvalidEvents — fix the batch, a retry gets the same
// refusal (but one also marked ErrEventAhead may be taken once this host's
// clock is right); ErrNotServing and ErrEventOutboxFull — try again later.
var (
	// ErrInvalidEvents marks a batch Publish refuses for its content: an
	// undeclared or undeliverable channel, a batch of 0 or more than
	// MaxEventsPerBatch events, or an invalid event. The error's text says
	// what to fix.
	ErrInvalidEvents = errors.New("hostsdk: invalid event batch")
	// ErrEventAhead marks, beside ErrInvalidEvents, an event whose
	// occurred_at is more than aip.MaxEnvelopeSkew ahead of this host's
	// clock: the event's time, or this host's clock, is wrong, and the
	// same batch may be taken once the clock is right (a webhook route
	// answers it as unavailable, to be delivered again, not as a delivery
	// never to resend).
	ErrEventAhead = errors.New("hostsdk: event ahead of this host's clock")
	// ErrEventOutboxFull marks a batch refused because the outbox holds
	// its maximum of pending batches (events are not being delivered).
	ErrEventOutboxFull = errors.New("hostsdk: event outbox is full")
)

// markedError is err, matched by errors.Is as mark too; its text is err's.
type markedError struct {
	mark error
	err  error
}

func (e *markedError) Error() string        { return e.err.Error() }
func (e *markedError) Unwrap() error        { return e.err }
func (e *markedError) Is(target error) bool { return target == e.mark }

func markErr(mark, err error) error { return &markedError{mark: mark, err: err} }

// invalidEvents is a Publish refusal for the batch's content
// (ErrInvalidEvents).
func invalidEvents(format string, args ...any) error {
	return markErr(ErrInvalidEvents, fmt.Errorf(format, args...))
}

// eventProvenance is the member of an event's data the dispatcher stamps
// with the delivering replica (registry.EventProvenance).
const eventProvenance = "aip_connector"

// manifestChannels returns the channel IDs a manifest declares
// (Manifest.ChannelIDs), as a set.
func manifestChannels(m *aip.Manifest) map[string]bool {
	ids := m.ChannelIDs()
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out
}

// decodeData decodes an event's data, valid JSON, keeping its numbers
// as json.Number.
func decodeData(raw json.RawMessage) (map[string]any, error) {
	if !json.Valid(raw) {
		return nil, errors.New("not JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var obj map[string]any
	err := dec.Decode(&obj)
	return obj, err
}

// numberBeyondDouble returns the path (data.a.b[2], members in name
// order) and the text of a number in v (decoded by decodeData) whose
// magnitude a double cannot hold, as aip.Canonicalize refuses it.
func numberBeyondDouble(v any, path string) (string, string, bool) {
	switch x := v.(type) {
	case json.Number:
		if f, err := strconv.ParseFloat(string(x), 64); err != nil || math.IsInf(f, 0) {
			return path, string(x), true
		}
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			if p, n, ok := numberBeyondDouble(x[k], path+aip.MemberPath(k)); ok {
				return p, n, true
			}
		}
	case []any:
		for i, c := range x {
			if p, n, ok := numberBeyondDouble(c, path+"["+strconv.Itoa(i)+"]"); ok {
				return p, n, true
			}
		}
	}
	return "", "", false
}

// truncateNumber shortens a long number for a message.
func truncateNumber(num string) string {
	if len(num) <= 40 {
		return num
	}
	return fmt.Sprintf("%s…%s (%d characters)", num[:24], num[len(num)-8:], len(num))
}

// hasNUL reports whether a decoded JSON value holds a NUL character in a
// string or a member name.
func hasNUL(v any) bool {
	switch x := v.(type) {
	case string:
		return strings.ContainsRune(x, 0)
	case map[string]any:
		for k, c := range x {
			if strings.ContainsRune(k, 0) || hasNUL(c) {
				return true
			}
		}
	case []any:
		for _, c := range x {
			if hasNUL(c) {
				return true
			}
		}
	}
	return false
}
