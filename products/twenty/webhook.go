package twenty

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
	"github.com/aipfleet/aipfleet/products/internal/webhook"
)

// Webhook constants (reference §8.6).
const (
	// WebhookPath is the route's pattern.
	WebhookPath = "POST /webhooks/twenty"
	// Channel is the event channel of verified deliveries.
	Channel = "twenty-webhooks"
	// Headers of a delivery.
	HeaderTimestamp = "X-Twenty-Webhook-Timestamp"
	HeaderSignature = "X-Twenty-Webhook-Signature"
	HeaderNonce     = "X-Twenty-Webhook-Nonce"
	// MaxSkew is the largest difference between a delivery's timestamp
	// and the host's clock.
	MaxSkew = 300_000 * time.Millisecond
	// ReplayNamespace and ReplayCapacity are the replay fence's state
	// namespace and the most deliveries it holds within its window (2 ×
	// MaxSkew: a timestamp is accepted for that long). A full fence
	// records no new delivery until older ones leave the window (the
	// delivery's event is stored and the delivery accepted all the same:
	// a replay of it maps to the same event, which the outbox stores
	// once); 10 000 deliveries in ten minutes is far above what one
	// workspace sends, and every recorded delivery rewrites the fence, so
	// it is kept well below the reference's 100 000.
	ReplayNamespace = "aip.connector.twenty.webhook_replay.v1"
	ReplayCapacity  = 10_000
	// maxTimestampDigits bounds the timestamp header.
	maxTimestampDigits = 32
)

var (
	timestampPattern = regexp.MustCompile(`^[0-9]{1,32}$`)
	signaturePattern = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
	noncePattern     = regexp.MustCompile(`^[0-9a-fA-F]{32}$`)
	// eventNamePattern is a Twenty event name: object.action, e.g.
	// person.created, myCustomObject.updated.
	eventNamePattern = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,127}(\.[A-Za-z][A-Za-z0-9_-]{0,63}){1,3}$`)
)

// Routes implements hostsdk.RouteProvider: POST /webhooks/twenty when a
// webhook secret is configured, none otherwise.
func (c *Connector) Routes(_ context.Context, rc *hostsdk.RouteContext) ([]hostsdk.Route, error) {
	if c.cfg.WebhookSecret.Empty() {
		return nil, nil
	}
	secrets := &webhook.Secrets{Current: c.cfg.WebhookSecret, Previous: c.cfg.PreviousWebhookSecret,
		PreviousSetting: "--" + FlagPreviousWebhookSecretFile}
	h := &webhookHandler{c: c, rc: rc, secrets: secrets, refusals: &webhook.Refusals{Log: rc.Logger, Route: "twenty webhook"}, fence: &webhook.Fence{
		Namespace: ReplayNamespace,
		Key:       "instance:" + rc.Tenant.InstanceID,
		Window:    2 * MaxSkew,
		Capacity:  c.replayCapacity,
	}}
	return []hostsdk.Route{{Pattern: WebhookPath, Handler: h}}, nil
}

type webhookHandler struct {
	c     *Connector
	rc    *hostsdk.RouteContext
	fence *webhook.Fence
	// secrets verify deliveries: the webhook secret and, during a
	// switch, the previous one.
	secrets *webhook.Secrets
	// refusals logs every refusal of a verified delivery, which Twenty
	// does not deliver again, and signatures that do not verify (a
	// secret differing from Twenty's), a line a minute of each kind at
	// most.
	refusals *webhook.Refusals
}

// payload is what a delivery's body must hold; the whole body becomes the
// event's data.
type payload struct {
	EventName   string `json:"eventName"`
	WorkspaceID string `json:"workspaceId"`
	WebhookID   string `json:"webhookId"`
	EventDate   string `json:"eventDate"`
}

// ServeHTTP verifies a delivery: the three headers, the signature
// HMAC-SHA256(secret, "<timestamp>:<raw body>") in constant time, the
// timestamp within MaxSkew, the replay fence (a delivery seen before is
// refused with 401), the payload; then publishes its event and records
// the delivery in the fence (a delivery whose event is stored is accepted
// even when the fence cannot record it).
func (h *webhookHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, ok := webhook.ReadBody(w, r)
	if !ok {
		return
	}
	ts, sig, nonce := r.Header.Get(HeaderTimestamp), r.Header.Get(HeaderSignature), r.Header.Get(HeaderNonce)
	for _, name := range []string{HeaderTimestamp, HeaderSignature, HeaderNonce} {
		if r.Header.Get(name) == "" {
			webhook.Fail(w, http.StatusBadRequest, webhook.CodeMissingHeader, "missing header "+name)
			return
		}
	}
	if !timestampPattern.MatchString(ts) {
		webhook.Fail(w, http.StatusBadRequest, webhook.CodeInvalidTimestamp,
			fmt.Sprintf("%s must be 1 to %d decimal digits (Unix milliseconds)", HeaderTimestamp, maxTimestampDigits))
		return
	}
	if !noncePattern.MatchString(nonce) {
		webhook.Fail(w, http.StatusBadRequest, webhook.CodeInvalidDelivery, HeaderNonce+" must be 32 hex digits")
		return
	}
	now := h.c.cfg.Now()
	verified := signaturePattern.MatchString(sig) && h.secrets.Verify(h.rc.Logger, "twenty webhook", func(secret []byte) bool {
		return webhook.EqualHex(webhook.HMACSHA256(secret, []byte(ts), []byte(":"), body), sig)
	})
	if !verified {
		h.refusals.Warn(now, "authentication", "a delivery is refused: its signature does not verify with this replica's webhook secret; "+
			"if Twenty sent it, its webhook's secret differs from --"+FlagWebhookSecretFile+" (and --"+FlagPreviousWebhookSecretFile+") and the delivery is lost")
		webhook.Fail(w, http.StatusUnauthorized, webhook.CodeAuthenticationFailed, "the signature does not match")
		return
	}
	// The skew is computed in milliseconds: now.Sub of a timestamp
	// centuries away saturates at the smallest time.Duration, whose
	// absolute value is still negative. ms >= 0, so this cannot overflow.
	ms, err := strconv.ParseInt(ts, 10, 64)
	if skew := now.UnixMilli() - ms; err != nil || skew > MaxSkew.Milliseconds() || skew < -MaxSkew.Milliseconds() {
		// A Duration holds ±292 years; a timestamp further away is
		// given in milliseconds.
		offset := "beyond int64 milliseconds"
		switch {
		case err != nil:
		case skew > -math.MaxInt64/int64(time.Millisecond) && skew < math.MaxInt64/int64(time.Millisecond):
			offset = (time.Duration(skew) * time.Millisecond).Round(time.Second).String()
		default:
			offset = strconv.FormatInt(skew, 10) + "ms"
		}
		h.refusals.Warn(now, "timestamp", fmt.Sprintf("a verified delivery is refused and lost: its timestamp is more than %s from this replica's clock "+
			"(clock_offset: this replica's clock minus the timestamp); check this host's clock (NTP)", MaxSkew),
			append(identify(body), "clock_offset", offset, "timestamp", ts)...)
		webhook.Fail(w, http.StatusBadRequest, webhook.CodeInvalidTimestamp,
			fmt.Sprintf("the timestamp is more than %d ms away from the host's clock", MaxSkew.Milliseconds()))
		return
	}
	if !utf8.Valid(body) {
		h.refusals.Warn(now, "invalid_delivery", "a verified delivery is refused and lost: its body is not UTF-8", identify(body)...)
		webhook.Fail(w, http.StatusBadRequest, webhook.CodeInvalidUTF8, "the body is not UTF-8")
		return
	}
	ctx := r.Context()
	// The signature is lowercased first, so one delivery has one key
	// whatever case its hex is in.
	replayKey := replayKey(ts, strings.ToLower(sig), body)
	seen, err := h.fence.Seen(ctx, h.rc.State, replayKey, now)
	if err != nil {
		h.rc.Logger.Error("twenty webhook: replay fence", "err", err)
		webhook.Fail(w, http.StatusServiceUnavailable, webhook.CodeStorageUnavailable, "the replay fence could not be read")
		return
	}
	if seen {
		webhook.Fail(w, http.StatusUnauthorized, webhook.CodeAuthenticationFailed, "this delivery was already received")
		return
	}
	ev, otherWorkspace, msg := h.event(body)
	if ev == nil {
		if otherWorkspace {
			h.refusals.Warn(now, "workspace", "a verified delivery for another workspace is refused and lost: point that workspace's webhook "+
				"at the route of the connector serving it, or fix --"+FlagWorkspaceID, append(identify(body), "reason", msg)...)
		} else {
			h.refusals.Warn(now, "invalid_delivery", "a verified delivery that cannot be mapped to an event is refused and lost",
				append(identify(body), "reason", msg)...)
		}
		webhook.Fail(w, http.StatusBadRequest, webhook.CodeInvalidDelivery, msg)
		return
	}
	if raw, _ := json.Marshal(ev); len(raw) > hostsdk.MaxEventBytes {
		// Twenty does not deliver again: a refused delivery would be
		// lost, so its payload is cut down to fit instead.
		data, err := trimPayload(body)
		if err != nil {
			h.refusals.Warn(now, "too_large", "a verified delivery is refused and lost: its event is too large even with its payload cut down",
				append(identify(body), "event_id", ev.ID, "bytes", len(raw), "error", err)...)
			webhook.Fail(w, http.StatusRequestEntityTooLarge, webhook.CodeTooLarge,
				fmt.Sprintf("the delivery makes an event of %d bytes; at most %d", len(raw), hostsdk.MaxEventBytes))
			return
		}
		ev.Data = data
	}
	if _, err := h.rc.Events.Publish(ctx, Channel, *ev); err != nil {
		h.refusals.PublishFailed(w, now, err, append(identify(body), "event_id", ev.ID)...)
		return
	}
	dup, err := h.fence.Record(ctx, h.rc.State, replayKey, now)
	if err != nil {
		// The event is stored, so the delivery is accepted: Twenty
		// never sends a delivery again (it records any error as a
		// failed call), so an error would only report a stored event
		// as lost. A replay of this delivery maps to the same event,
		// which the outbox stores once.
		h.rc.Logger.Warn("twenty webhook: delivery not recorded in the replay fence; its event is stored", "err", err, "event_id", ev.ID)
		webhook.Accepted(w, 1, false)
		return
	}
	if dup {
		webhook.Fail(w, http.StatusUnauthorized, webhook.CodeAuthenticationFailed, "this delivery was already received")
		return
	}
	webhook.Accepted(w, 1, false)
}

// event maps a verified body to its event, or says why it cannot
// (otherWorkspace: the payload names another workspace), quoting the
// value it refuses cut to provider.MaxExcerptBytes (provider.Excerpt): a
// payload member may be as long as the body.
func (h *webhookHandler) event(body []byte) (ev *aip.Event, otherWorkspace bool, msg string) {
	var p payload
	if err := json.Unmarshal(body, &p); err != nil {
		return nil, false, "the body is not a JSON object with eventName, workspaceId, webhookId and eventDate: " + err.Error()
	}
	switch {
	case !eventNamePattern.MatchString(p.EventName):
		return nil, false, fmt.Sprintf("eventName %q is not an event name like person.created", provider.Excerpt(p.EventName))
	case !uuidPattern.MatchString(p.WorkspaceID) || !strings.EqualFold(p.WorkspaceID, h.c.cfg.WorkspaceID):
		return nil, true, fmt.Sprintf("workspaceId %q is not this connector's workspace", provider.Excerpt(p.WorkspaceID))
	case !uuidPattern.MatchString(p.WebhookID):
		return nil, false, fmt.Sprintf("webhookId %q is not a UUID", provider.Excerpt(p.WebhookID))
	}
	at, err := time.Parse(time.RFC3339Nano, p.EventDate)
	if err != nil {
		return nil, false, fmt.Sprintf("eventDate %q is not an RFC 3339 time", provider.Excerpt(p.EventDate))
	}
	return &aip.Event{
		ID:         EventID(h.c.cfg.WorkspaceID, p.WebhookID, body, at),
		Kind:       "twenty." + p.EventName,
		OccurredAt: aip.At(at),
		Data:       json.RawMessage(body),
	}, false, ""
}

// identify returns what a log line names a verified delivery by, as far
// as its body holds them: event_name, webhook_id, event_date and
// record_id (each an excerpt), so that an operator can read a refused
// delivery's record through the API.
func identify(body []byte) []any {
	var p struct {
		EventName string `json:"eventName"`
		WebhookID string `json:"webhookId"`
		EventDate string `json:"eventDate"`
		Record    struct {
			ID string `json:"id"`
		} `json:"record"`
	}
	_ = json.Unmarshal(body, &p)
	var out []any
	for _, kv := range [][2]string{{"event_name", p.EventName}, {"webhook_id", p.WebhookID}, {"event_date", p.EventDate}, {"record_id", p.Record.ID}} {
		if kv[1] != "" {
			out = append(out, kv[0], provider.Excerpt(kv[1]))
		}
	}
	return out
}

// EventID is a delivery's event ID (hostsdk.DeriveEventID): its time is the
// payload's eventDate, its other bits derive from the workspace, the
// webhook ID and the body, so a redelivery keeps it. (The reference uses
// the first 16 bytes of sha256(workspace ":" webhookId ":" body) as hex;
// the fleet's event log takes only UUIDv7-shaped IDs.)
func EventID(workspaceID, webhookID string, body []byte, at time.Time) string {
	return hostsdk.DeriveEventID(at, []byte("twenty"), []byte(workspaceID), []byte(webhookID), body)
}

// trimPayload returns the data of an event whose payload is too large to
// carry whole: the payload cut down to webhook.MaxInlinePayload by
// leaving out its largest members, largest first: the record's fields (a
// note's or task's body, a rich text field) but its id, and the payload's
// members but eventName, workspaceId, webhookId, eventDate, objectMetadata
// and record; payload_omitted lists what was left out ("record.bodyV2", ...),
// payload_bytes and payload_sha256 describe the whole body. The record's
// id lets a consumer read the rest through the API.
func trimPayload(body []byte) (json.RawMessage, error) {
	trimmed, omitted, err := webhook.TrimPayload(body, webhook.MaxInlinePayload, webhook.Trim{
		Keep:  []string{"eventName", "workspaceId", "webhookId", "eventDate", "objectMetadata", "record"},
		Inner: "record", InnerKeep: []string{"id"},
	})
	if err != nil {
		return nil, err
	}
	var p map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &p); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	p["payload_omitted"], _ = json.Marshal(omitted)
	p["payload_bytes"], _ = json.Marshal(len(body))
	p["payload_sha256"], _ = json.Marshal(hex.EncodeToString(sum[:]))
	return json.Marshal(p)
}

// replayKey is hex sha256(timestamp ":" signature ":" body).
func replayKey(ts, sig string, body []byte) string {
	s := sha256.New()
	s.Write([]byte(ts + ":" + sig + ":"))
	s.Write(body)
	return hex.EncodeToString(s.Sum(nil))
}
