package calcom

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
	"github.com/aipfleet/aipfleet/products/internal/webhook"
)

// Webhook constants (reference §8.1).
const (
	// WebhookRoute is the host route; {subscription_id} selects the secret.
	WebhookRoute = "POST /webhooks/cal-diy/{subscription_id}"
	// WebhookChannel is the manifest channel the deliveries are published on.
	WebhookChannel = "cal-diy-webhooks"
	// WebhookVersion is the only x-cal-webhook-version accepted.
	WebhookVersion = "2021-10-20"
	// WebhookMaxBody bounds a delivery's body.
	WebhookMaxBody = 1 << 20
	// WebhookMaxAge and WebhookMaxSkew bound a delivery's time (createdAt,
	// or the booking's startTime or endTime for the scheduler's
	// MEETING_STARTED and MEETING_ENDED) against the clock: at most
	// WebhookMaxAge old (WebhookScheduledMaxAge for the scheduler's
	// shape), at most WebhookMaxSkew ahead.
	WebhookMaxAge  = 86400 * time.Second
	WebhookMaxSkew = 300 * time.Second
	// WebhookScheduledMaxAge is how old the booking's startTime or endTime
	// of a delivery in the scheduler's shape may be. Cal.diy's scheduler
	// sends such a delivery at any time until a day after that time, by
	// its own clock (each run first deletes what is a day or more past,
	// then sends the rest, one after the other, each after a DNS check
	// and a delete): one it sends close to a day late reaches the route a
	// little after, later still by this replica's clock when Cal.diy's is
	// behind. It is never sent again, so the hour beyond the day is what
	// keeps those from being refused and lost; the replay fence holds a
	// delivery as long (ReplayWindow).
	WebhookScheduledMaxAge = 25 * time.Hour
	// ReplayWindow is how long the replay fence remembers a delivery
	// after it was received: as long as its time (up to WebhookMaxSkew
	// ahead of the clock when received) stays within the age bound, the
	// longer of WebhookMaxAge and WebhookScheduledMaxAge.
	ReplayWindow = WebhookScheduledMaxAge + WebhookMaxSkew
	// ReplayNamespace is the state namespace of the replay fence.
	ReplayNamespace = "aip.connector.cal_diy.webhook_replay.v1"
	// ReplayCapacity bounds the deliveries the fence remembers within its
	// window; past it the oldest are forgotten. Every delivery rewrites the
	// fence, so the bound keeps that write small.
	ReplayCapacity = 4096

	headerSignature = "X-Cal-Signature-256"
	headerVersion   = "X-Cal-Webhook-Version"
)

// triggerRE bounds a trigger event name (BOOKING_CREATED, ...): it becomes
// the event kind.
var triggerRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,127}$`)

// Routes implements hostsdk.RouteProvider: the webhook route, only when a
// subscription secret is configured.
func (c *Connector) Routes(_ context.Context, rc *hostsdk.RouteContext) ([]hostsdk.Route, error) {
	if len(c.cfg.WebhookSecrets) == 0 {
		return nil, nil
	}
	// A delivery whose time (createdAt, or the booking's startTime or
	// endTime in the scheduler's shape) is up to WebhookMaxSkew ahead of this
	// host's clock passes the age check until its bound (WebhookMaxAge,
	// WebhookScheduledMaxAge) plus WebhookMaxSkew after it was received:
	// the fence remembers every delivery that long (ReplayWindow).
	fence := &webhook.Fence{Namespace: ReplayNamespace, Key: "instance:" + rc.Tenant.InstanceID,
		Window: ReplayWindow, Capacity: ReplayCapacity, EvictOldest: true}
	secrets := make(map[string]*webhook.Secrets, len(c.cfg.WebhookSecrets))
	for id, s := range c.cfg.WebhookSecrets {
		// A subscription without a previous secret gets the zero
		// Secret, which is empty.
		secrets[id] = &webhook.Secrets{Current: s, Previous: c.cfg.PreviousWebhookSecrets[id],
			PreviousSetting: "the " + id + " entry of --" + flagPreviousWebhookSecrets}
	}
	return []hostsdk.Route{{Pattern: WebhookRoute, Handler: c.webhookHandler(rc, fence, secrets)}}, nil
}

// scheduledTriggers are the triggers Cal.diy's scheduler sends in its
// own shape, each with the booking's member whose time the scheduler
// sends it at. scheduleTrigger (packages/features/webhooks/lib/
// scheduleTrigger.ts) stores JSON.stringify({triggerEvent, ...booking})
// as a WebhookScheduledTriggers row whose startAfter is the booking's
// startTime for MEETING_STARTED and its endTime for MEETING_ENDED;
// handleWebhookScheduledTriggers (same directory, run by a cron job)
// first deletes the rows whose startAfter is a day or more past, then
// POSTs every row whose startAfter has come with that stored string as
// the body, x-cal-signature-256 computed over it with the webhook's
// secret (createWebhookSignature, as sendPayload's) and
// x-cal-webhook-version the webhook's version, and deletes the row
// whatever the answer: the body has no payload member, and its
// createdAt is the booking's (days old by the meeting), so the route
// takes that member's time instead, and gives it WebhookScheduledMaxAge
// rather than WebhookMaxAge, since the scheduler may send it up to a day
// after that time. The published API document lists the two among the
// triggers of a webhook and describes no delivery body.
var scheduledTriggers = map[string]string{"MEETING_STARTED": "startTime", "MEETING_ENDED": "endTime"}

// delivery is a Cal.diy webhook body: Cal.diy's default
// {triggerEvent, createdAt, payload} (sendPayload), or for a
// scheduledTriggers trigger without a payload member the scheduler's
// {triggerEvent, ...booking}.
type delivery struct {
	TriggerEvent string
	// Payload is the payload member, or for the scheduler's shape the
	// whole body (the booking's members and triggerEvent), as delivered.
	Payload json.RawMessage
	// At names the member whose time the route checks and the event
	// takes: createdAt, or for the scheduler's shape the booking's
	// startTime or endTime; AtValue is its value as delivered.
	At, AtValue string
	// Scheduled says the body is in the scheduler's shape.
	Scheduled bool
}

// maxAge is how old the delivery's time may be: WebhookMaxAge, or
// WebhookScheduledMaxAge for the scheduler's shape.
func (d delivery) maxAge() time.Duration {
	if d.Scheduled {
		return WebhookScheduledMaxAge
	}
	return WebhookMaxAge
}

// timeAttr is the log attribute naming the delivery's time (created_at,
// start_time or end_time).
func (d delivery) timeAttr() string {
	switch d.At {
	case "startTime":
		return "start_time"
	case "endTime":
		return "end_time"
	}
	return "created_at"
}

// webhookHandler verifies a delivery, fences replays, publishes one event
// and records the delivery: check subscription → bounded body → headers →
// signature (constant time; for the scheduler's shape, another
// subscription's when the URL's does not verify it: movedSubscription) →
// JSON shape → time window (createdAt, or
// the booking's startTime or endTime in the scheduler's shape, which may
// be an hour older: WebhookScheduledMaxAge) → fence →
// publish → record.
//
// Every refusal of a delivery whose signature verified is logged at warn
// (at most a line a minute of each kind, with the count of the others:
// webhook.Refusals), since Cal.diy does not deliver it again; so are an
// unknown subscription, a body over WebhookMaxBody and a signature that
// does not verify, which is what a subscription missing from this replica
// or a secret differing from Cal.diy's looks like.
func (c *Connector) webhookHandler(rc *hostsdk.RouteContext, fence *webhook.Fence, secrets map[string]*webhook.Secrets) http.Handler {
	refusals := &webhook.Refusals{Log: rc.Logger, Route: "cal-diy webhook"}
	ids := slices.Sorted(maps.Keys(secrets))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := c.cfg.Now()
		sub := r.PathValue("subscription_id")
		_, known := secrets[sub]
		unknown := func() {
			// The ID is logged only when it has the syntax of one.
			var args []any
			if subscriptionRE.MatchString(sub) {
				args = []any{"subscription_id", sub}
			}
			refusals.Warn(now, "unknown_subscription", "a delivery for a subscription this replica holds no secret for is refused; "+
				"if Cal.diy sent it, add the subscription to --"+flagWebhookSecrets+" (the delivery is lost)", args...)
			webhook.Fail(w, http.StatusNotFound, webhook.CodeInvalidDelivery, "unknown webhook subscription")
		}
		if !subscriptionRE.MatchString(sub) || (!known && r.ContentLength > MovedMaxBody) {
			unknown()
			return
		}
		// A subscription this replica holds no secret for may still be the
		// URL of a webhook that moved to one it holds, and removed from
		// --webhook-secrets before the scheduler's meetings booked under
		// it were sent (movedSubscription): such a delivery is read (at
		// most MovedMaxBody bytes) and refused only when no secret
		// verifies it.
		limit := int64(WebhookMaxBody)
		if !known {
			limit = MovedMaxBody
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
		if err != nil && !known {
			unknown()
			return
		}
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				refusals.Warn(now, "body_too_large", fmt.Sprintf("a delivery is refused unread: its body is larger than %d bytes "+
					"(if Cal.diy sent it, the delivery is lost)", WebhookMaxBody), "subscription_id", sub)
				webhook.Fail(w, http.StatusRequestEntityTooLarge, webhook.CodeTooLarge, fmt.Sprintf("the body is larger than %d bytes", WebhookMaxBody))
			} else {
				webhook.Fail(w, http.StatusBadRequest, webhook.CodeInvalidDelivery, "the body could not be read")
			}
			return
		}
		sig := r.Header.Get(headerSignature)
		version := r.Header.Get(headerVersion)
		if !known && (len(sig) != 2*sha256.Size || version != WebhookVersion) {
			unknown()
			return
		}
		switch {
		case sig == "":
			webhook.Fail(w, http.StatusBadRequest, webhook.CodeMissingHeader, "x-cal-signature-256 is missing")
			return
		case version == "":
			webhook.Fail(w, http.StatusBadRequest, webhook.CodeMissingHeader, "x-cal-webhook-version is missing")
			return
		case version != WebhookVersion:
			webhook.Fail(w, http.StatusBadRequest, webhook.CodeInvalidDelivery, "x-cal-webhook-version must be "+WebhookVersion)
			return
		}
		verify := func(id string) bool {
			return secrets[id].Verify(rc.Logger, "cal-diy webhook", func(secret []byte) bool {
				return webhook.EqualHex(webhook.HMACSHA256(secret, body), sig)
			}, "subscription_id", id)
		}
		if len(sig) != 2*sha256.Size || !known || !verify(sub) {
			moved := ""
			if len(sig) == 2*sha256.Size {
				moved = movedSubscription(body, sub, ids, verify)
			}
			if moved == "" && !known {
				unknown()
				return
			}
			if moved == "" {
				refusals.Warn(now, "authentication:"+sub, "a delivery is refused: its signature does not verify with the subscription's secret; "+
					"if Cal.diy sent it, the webhook's secret differs from the subscription's file in --"+flagWebhookSecrets+
					" (and --"+flagPreviousWebhookSecrets+") and the delivery is lost",
					"subscription_id", sub)
				webhook.Fail(w, http.StatusUnauthorized, webhook.CodeAuthenticationFailed, "x-cal-signature-256 does not match the body")
				return
			}
			rc.Logger.Info("cal-diy webhook: a delivery of Cal.diy's scheduler to this subscription's URL verified with another subscription's secret: "+
				"the scheduler kept the URL the webhook had when the booking was accepted, and signs with the webhook's secret now; "+
				"taken as the other subscription's",
				"url_subscription_id", sub, "subscription_id", moved)
			sub = moved
		}
		if !utf8.Valid(body) {
			refusals.Warn(now, "invalid_delivery", "a verified delivery is refused and lost: its body is not UTF-8", "subscription_id", sub)
			webhook.Fail(w, http.StatusBadRequest, webhook.CodeInvalidUTF8, "the body is not UTF-8")
			return
		}
		d, at, msg := parseDelivery(body)
		if msg != "" {
			if d.Scheduled {
				refusals.Warn(now, "scheduled_trigger", fmt.Sprintf("a verified %s delivery in the shape of Cal.diy's scheduler ({triggerEvent, ...booking}) "+
					"that cannot be mapped to an event is refused and lost", d.TriggerEvent),
					"subscription_id", sub, "trigger_event", d.TriggerEvent, "reason", msg)
			} else {
				refusals.Warn(now, "invalid_delivery", "a verified delivery that cannot be mapped to an event is refused and lost",
					"subscription_id", sub, "trigger_event", provider.Excerpt(d.TriggerEvent), "reason", msg)
			}
			webhook.Fail(w, http.StatusBadRequest, webhook.CodeInvalidDelivery, msg)
			return
		}
		if maxAge := d.maxAge(); now.Sub(at) > maxAge {
			refusals.Warn(now, "timestamp_old", fmt.Sprintf("a verified delivery is refused and lost: its %s is more than %s before this replica's clock "+
				"(clock_offset: this replica's clock minus %s); if the offset is not the delivery's age, check this host's clock (NTP)", d.At, maxAge, d.At),
				"subscription_id", sub, "trigger_event", d.TriggerEvent, d.timeAttr(), d.AtValue, "clock_offset", now.Sub(at).Round(time.Second).String())
			webhook.Fail(w, http.StatusBadRequest, webhook.CodeInvalidTimestamp, fmt.Sprintf("%s is more than %d hours old", d.At, int(maxAge/time.Hour)))
			return
		}
		if at.Sub(now) > WebhookMaxSkew {
			// As for any event time ahead of the clock
			// (webhook.Refusals.PublishFailed, hostsdk.ErrEventAhead): this
			// replica's clock may be the wrong one, and once it is right
			// the same delivery is taken, so the answer asks for it
			// again rather than saying never to. Cal.diy itself does not
			// deliver again on any status (see the package comment).
			refusals.Warn(now, "timestamp_ahead", "a delivery's "+d.At+" is ahead of this replica's clock; check the clock (NTP)",
				"subscription_id", sub, "trigger_event", d.TriggerEvent, d.timeAttr(), d.AtValue,
				"clock_offset", now.Sub(at).Round(time.Second).String())
			webhook.Fail(w, http.StatusServiceUnavailable, webhook.CodeInvalidTimestamp,
				d.At+" is more than 5 minutes ahead of this replica's clock; deliver again (the replica's operator is told to check its clock)")
			return
		}
		id := fenceID(sub, version, sig, body)
		ctx := r.Context()
		seen, err := fence.Seen(ctx, rc.State, id, now)
		if err != nil {
			rc.Logger.Error("cal-diy webhook: replay fence", "error", err)
			webhook.Fail(w, http.StatusServiceUnavailable, webhook.CodeStorageUnavailable, "the replay fence could not be read")
			return
		}
		if seen {
			webhook.Accepted(w, 1, true)
			return
		}
		ev, err := event(sub, id, d, at)
		if errors.Is(err, errEventTooLarge) {
			refusals.Warn(now, "too_large", fmt.Sprintf("a verified delivery is refused and lost: its event is larger than %d bytes even with its payload cut down", hostsdk.MaxEventBytes),
				"subscription_id", sub, "trigger_event", d.TriggerEvent, d.timeAttr(), d.AtValue, "error", err)
			webhook.Fail(w, http.StatusRequestEntityTooLarge, webhook.CodeTooLarge,
				fmt.Sprintf("the delivery maps to an event larger than %d bytes", hostsdk.MaxEventBytes))
			return
		}
		if err != nil {
			refusals.Warn(now, "invalid_delivery", "a verified delivery that cannot be mapped to an event is refused and lost",
				"subscription_id", sub, "trigger_event", d.TriggerEvent, d.timeAttr(), d.AtValue, "error", err)
			webhook.Fail(w, http.StatusInternalServerError, webhook.CodeInvalidMapping, err.Error())
			return
		}
		if _, err := rc.Events.Publish(ctx, WebhookChannel, ev); err != nil {
			refusals.PublishFailed(w, now, err, "subscription_id", sub, "event_id", ev.ID, "trigger_event", d.TriggerEvent)
			return
		}
		if _, err := fence.Record(ctx, rc.State, id, now); err != nil {
			// The event is stored (an identical redelivery is stored once):
			// the delivery is accepted even though the fence missed it.
			rc.Logger.Warn("cal-diy webhook: replay fence not recorded", "error", err)
		}
		webhook.Accepted(w, 1, false)
	})
}

// MovedMaxBody bounds the body of a delivery movedSubscription checks
// against every subscription's secrets, so that a forged one costs at
// most that many bytes hashed per secret; a booking as Cal.diy's
// scheduler stores it is a few KiB.
const MovedMaxBody = 64 << 10

// movedSubscription returns the subscription, other than sub, whose
// secret (or previous secret) verifies a delivery of Cal.diy's
// scheduler (a MEETING_STARTED or MEETING_ENDED in its shape, at most
// MovedMaxBody bytes) posted to sub's URL whose signature sub's secret
// does not verify; "" when there is none or the body is not such a
// delivery. The scheduler stores each row with the webhook's subscriber
// URL of the moment the booking was accepted and signs it when it sends
// it with the webhook's secret of that moment (WebhookScheduledTriggers'
// subscriberUrl column; its webhook relation's secret): after a webhook
// moved from sub to another subscription (webhook.update with a new
// subscriber_url, which sends that subscription's secret; API v2 leaves
// the stored rows as they are), the meetings booked before still come to
// sub's URL, signed with the other subscription's secret. A secret this
// connector holds verifying the body is what makes it that webhook's
// delivery, so it is taken as the subscription of that secret. ids are
// the subscriptions in order.
func movedSubscription(body []byte, sub string, ids []string, verify func(id string) bool) string {
	if len(body) > MovedMaxBody || !utf8.Valid(body) {
		return ""
	}
	if d, _, msg := parseDelivery(body); !d.Scheduled || msg != "" {
		return ""
	}
	for _, id := range ids {
		if id != sub && verify(id) {
			return id
		}
	}
	return ""
}

// parseDelivery checks the body's shape and returns the delivery and its
// time; msg says what is wrong. A body is Cal.diy's default
// {triggerEvent, createdAt, payload}, whose time is createdAt; or, for a
// scheduledTriggers trigger and no payload member, the scheduler's
// {triggerEvent, ...booking}, whose time is the booking's startTime
// (MEETING_STARTED) or endTime (MEETING_ENDED), when the scheduler sends
// it, and whose payload is the whole body (d.Scheduled is set as soon as
// the shape is known, so a refusal can say which it was).
func parseDelivery(body []byte) (d delivery, at time.Time, msg string) {
	var members map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&members); err != nil || members == nil {
		return d, at, "the body is not a JSON object with triggerEvent, createdAt and payload"
	}
	// Token, not More: More reports no further element at a stray "}"
	// or "]", which would let `{...}}` through.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return d, at, "the body has data after its JSON object"
	}
	if json.Unmarshal(members["triggerEvent"], &d.TriggerEvent) != nil || !triggerRE.MatchString(d.TriggerEvent) {
		return d, at, "triggerEvent must be an event name such as BOOKING_CREATED"
	}
	d.At = "createdAt"
	if member, ok := scheduledTriggers[d.TriggerEvent]; ok {
		// A booking has no payload member: a body with one is Cal.diy's
		// default shape, read as any other.
		if _, nested := members["payload"]; !nested {
			d.Scheduled, d.At, d.Payload = true, member, body
		}
	}
	if json.Unmarshal(members[d.At], &d.AtValue) != nil {
		d.AtValue = ""
	}
	t, err := time.Parse(time.RFC3339Nano, d.AtValue)
	if err != nil {
		if d.Scheduled {
			return d, at, fmt.Sprintf("%s must be an RFC 3339 time: Cal.diy's scheduler sends %s as {triggerEvent, ...booking}, at the booking's %s",
				d.At, d.TriggerEvent, d.At)
		}
		return d, at, "createdAt must be an RFC 3339 time"
	}
	if !d.Scheduled {
		d.Payload = members["payload"]
		if p := bytes.TrimSpace(d.Payload); len(p) == 0 || p[0] != '{' {
			return d, at, "payload must be a JSON object"
		}
	}
	return d, t, ""
}

// fenceID is the delivery's replay ID: hex SHA-256 of the subscription,
// the version, the signature (lowercased) and the raw body, NUL-separated.
func fenceID(sub, version, sig string, body []byte) string {
	h := sha256.New()
	for _, p := range [][]byte{[]byte(sub), []byte(version), []byte(strings.ToLower(sig))} {
		h.Write(p)
		h.Write([]byte{0})
	}
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// payloadTrim is how a payload too large for one event is cut down
// (webhook.TrimPayload): its largest members are left out, largest first
// (a long description or notes, the responses, the attendees), never
// those that name the booking, which let a consumer read the rest
// (booking.get).
var payloadTrim = webhook.Trim{Keep: []string{"uid", "bookingId", "eventTypeId", "type", "startTime", "endTime", "status"}}

// scheduledTrim is payloadTrim for the scheduler's shape, whose payload
// is the booking as Cal.diy stores it (its ID is id) with triggerEvent.
var scheduledTrim = webhook.Trim{Keep: []string{"triggerEvent", "id", "uid", "eventTypeId", "userId", "startTime", "endTime", "status"}}

// event maps a verified delivery to its event. The ID is derived from the
// fence ID (a UUIDv7 shape whose time is at, the delivery's time:
// createdAt, or the booking's startTime or endTime in the scheduler's
// shape), and occurred_at and created_at are that time, so a redelivery
// maps to the same event and the host's outbox stores it once. A payload
// whose event would exceed hostsdk.MaxEventBytes is cut down to
// webhook.MaxInlinePayload (payloadTrim, scheduledTrim), since Cal.diy
// does not deliver a refused delivery again: payload_omitted names what
// was left out, payload_bytes and payload_sha256 describe the payload as
// delivered; the ID stays the whole delivery's.
func event(sub, fence string, d delivery, at time.Time) (aip.Event, error) {
	data := map[string]any{
		"subscription_id": sub,
		"trigger_event":   d.TriggerEvent,
		"created_at":      d.AtValue,
		"webhook_version": WebhookVersion,
		"payload":         d.Payload,
	}
	ev := aip.Event{
		ID:         eventID(fence, at),
		Kind:       "cal_diy." + strings.ToLower(d.TriggerEvent),
		OccurredAt: aip.At(at),
	}
	var err error
	if ev.Data, err = json.Marshal(data); err != nil {
		return aip.Event{}, fmt.Errorf("map the delivery: %w", err)
	}
	if raw, _ := json.Marshal(ev); len(raw) <= hostsdk.MaxEventBytes {
		return ev, nil
	}
	trim := payloadTrim
	if d.Scheduled {
		trim = scheduledTrim
	}
	payload, omitted, err := webhook.TrimPayload(d.Payload, webhook.MaxInlinePayload, trim)
	if err != nil {
		return aip.Event{}, fmt.Errorf("%w: %w", errEventTooLarge, err)
	}
	sum := sha256.Sum256(d.Payload)
	data["payload"] = payload
	data["payload_omitted"] = omitted
	data["payload_bytes"] = len(d.Payload)
	data["payload_sha256"] = hex.EncodeToString(sum[:])
	if ev.Data, err = json.Marshal(data); err != nil {
		return aip.Event{}, fmt.Errorf("map the delivery: %w", err)
	}
	if raw, _ := json.Marshal(ev); len(raw) > hostsdk.MaxEventBytes {
		return aip.Event{}, fmt.Errorf("%w: %d bytes with its payload cut down", errEventTooLarge, len(raw))
	}
	return ev, nil
}

// errEventTooLarge is a delivery whose event exceeds hostsdk.MaxEventBytes
// even with its payload cut down to the members that name the booking.
var errEventTooLarge = errors.New("the delivery's event is too large")

// eventID is the delivery's event ID (hostsdk.DeriveEventID): its time is the
// delivery's time (createdAt, or the booking's startTime or endTime in the
// scheduler's shape), its other bits derive from the fence ID.
func eventID(fence string, at time.Time) string {
	return hostsdk.DeriveEventID(at, []byte("cal-diy"), []byte(fence))
}
