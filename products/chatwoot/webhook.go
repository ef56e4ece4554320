package chatwoot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
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

// Webhook headers and bounds (reference §8.3).
const (
	HeaderDelivery  = "X-Chatwoot-Delivery"
	HeaderTimestamp = "X-Chatwoot-Timestamp"
	HeaderSignature = "X-Chatwoot-Signature"
	// MaxSkew bounds |now - timestamp|.
	MaxSkew = 300 * time.Second
	// MaxDeliveryIDBytes bounds the delivery header.
	MaxDeliveryIDBytes = 512
	// FenceNamespace, FenceWindow and FenceCapacity configure the replay
	// fence (key "instance:<instance_id>", oldest evicted when full; each
	// delivery takes two entries, its delivery ID and its signature). A
	// delivery whose timestamp is up to MaxSkew ahead of this host's clock
	// passes the timestamp check until up to twice MaxSkew after it was
	// received, so the fence remembers it that long (the reference's 300 s
	// window would let such a delivery be replayed after 300 s).
	FenceNamespace = "aip.connector.chatwoot.webhook_replay.v1"
	FenceWindow    = 2 * MaxSkew
	FenceCapacity  = 10000
	// ResendStatus answers a delivery the route could not take for a
	// reason that may pass (its replay fence unreadable, its events not
	// stored: a replica draining, a full outbox, storage failing, an event
	// time ahead of the host's clock), asking for it again. Chatwoot
	// (Webhooks::Trigger, AgentBots::WebhookJob) sends an agent bot's
	// delivery answered 429 or 500 twice more, 3 s apart, under the same
	// delivery ID, and takes every other error answer, 503 included, as a
	// failed delivery it never sends again; it treats 500 like any error
	// for an account or API inbox webhook. So 500, not the reference's
	// 503, which loses an agent bot's delivery.
	ResendStatus = http.StatusInternalServerError
)

var eventName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// Routes implements hostsdk.RouteProvider: POST /webhooks/chatwoot when a
// webhook secret is configured, nothing otherwise.
func (c *Connector) Routes(ctx context.Context, rc *hostsdk.RouteContext) ([]hostsdk.Route, error) {
	if !c.webhooks() {
		return nil, nil
	}
	fence := &webhook.Fence{Namespace: FenceNamespace, Key: "instance:" + rc.Tenant.InstanceID,
		Window: FenceWindow, Capacity: FenceCapacity, EvictOldest: true}
	return []hostsdk.Route{{Pattern: http.MethodPost + " " + WebhookPath, Handler: c.webhookHandler(rc, fence)}}, nil
}

// webhookHandler verifies, fences, maps and publishes a delivery. Every
// refusal of a delivery whose signature verified is logged at warn (at
// most a line a minute of each kind, with the count of the others:
// webhook.Refusals), since Chatwoot does not deliver it again; so is a
// signature that does not verify, which is what a secret differing from
// Chatwoot's looks like. What may pass (the fence unreadable, events not
// stored) is answered ResendStatus, which an agent bot's delivery is
// sent again on.
func (c *Connector) webhookHandler(rc *hostsdk.RouteContext, fence *webhook.Fence) http.Handler {
	secrets := &webhook.Secrets{Current: c.cfg.WebhookSecret, Previous: c.cfg.PreviousWebhookSecret,
		PreviousSetting: "--" + flagPreviousWebhookSecret}
	refusals := &webhook.Refusals{Log: rc.Logger, Route: "chatwoot webhook", ResendStatus: ResendStatus}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := webhook.ReadBody(w, r)
		if !ok {
			return
		}
		delivery, ts, sig := r.Header.Get(HeaderDelivery), r.Header.Get(HeaderTimestamp), r.Header.Get(HeaderSignature)
		for _, h := range [][2]string{{HeaderDelivery, delivery}, {HeaderTimestamp, ts}, {HeaderSignature, sig}} {
			if h[1] == "" {
				webhook.Fail(w, http.StatusBadRequest, webhook.CodeMissingHeader, "the "+h[0]+" header is missing")
				return
			}
		}
		if len(delivery) > MaxDeliveryIDBytes || strings.IndexFunc(delivery, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
			webhook.Fail(w, http.StatusBadRequest, webhook.CodeInvalidDelivery,
				fmt.Sprintf("the %s header must be 1 to %d printable ASCII characters", HeaderDelivery, MaxDeliveryIDBytes))
			return
		}
		unix, err := strconv.ParseInt(ts, 10, 64)
		if err != nil {
			webhook.Fail(w, http.StatusBadRequest, webhook.CodeInvalidTimestamp, "the "+HeaderTimestamp+" header is not integer Unix seconds")
			return
		}
		hexSig, ok := strings.CutPrefix(sig, "sha256=")
		now := c.cfg.Now()
		verified := ok && secrets.Verify(rc.Logger, "chatwoot webhook", func(secret []byte) bool {
			return webhook.EqualHex(webhook.HMACSHA256(secret, []byte(ts), []byte("."), body), hexSig)
		}, "delivery", delivery)
		if !verified {
			// Not verified: the header is a stranger's as much as
			// Chatwoot's, so only its delivery ID (checked above) is
			// logged, and the line is rate-limited.
			refusals.Warn(now, "authentication", "a delivery is refused: its signature does not verify with this replica's webhook secret; "+
				"if Chatwoot sent it, its webhook's secret differs from --"+flagWebhookSecret+" (and --"+flagPreviousWebhookSecret+") and the delivery is lost",
				"delivery", delivery)
			webhook.Fail(w, http.StatusUnauthorized, webhook.CodeAuthenticationFailed, "the signature does not match")
			return
		}
		sent := time.Unix(unix, 0)
		if d := now.Sub(sent); d > MaxSkew || d < -MaxSkew {
			refusals.Warn(now, "timestamp", fmt.Sprintf("a verified delivery is refused and lost: its timestamp is more than %s from this replica's clock "+
				"(clock_offset: this replica's clock minus the timestamp); check this host's clock (NTP)", MaxSkew),
				"delivery", delivery, "clock_offset", d.Round(time.Second).String(), "timestamp", sent.UTC().Format(time.RFC3339))
			webhook.Fail(w, http.StatusBadRequest, webhook.CodeInvalidTimestamp,
				fmt.Sprintf("the timestamp is %s from now; at most %s is accepted", d.Round(time.Second), MaxSkew))
			return
		}
		if !utf8.Valid(body) {
			refusals.Warn(now, "invalid_delivery", "a verified delivery is refused and lost: its body is not UTF-8", "delivery", delivery)
			webhook.Fail(w, http.StatusBadRequest, webhook.CodeInvalidUTF8, "the body is not UTF-8")
			return
		}
		events, err := c.mapDelivery(delivery, sent, body)
		if err != nil {
			if errors.As(err, new(*accountError)) {
				refusals.Warn(now, "account", "a verified delivery for another account is refused and lost: point the Chatwoot webhook "+
					"at the route of the connector serving that account, or fix --"+flagAccountID,
					"delivery", delivery, "reason", err.Error())
			} else {
				refusals.Warn(now, "invalid_delivery", "a verified delivery that cannot be mapped to an event is refused and lost",
					"delivery", delivery, "reason", err.Error())
			}
			webhook.Fail(w, http.StatusBadRequest, webhook.CodeInvalidDelivery, err.Error())
			return
		}
		ctx := r.Context()
		// The delivery ID is not signed: the fence also holds the signed
		// material (the signature over timestamp and body), claimed for
		// this delivery ID before the events are published, so a captured
		// delivery sent again under another delivery ID is a duplicate
		// too — even while, or after, the original's publication fails —
		// while the original itself may be delivered again.
		signedKey := "sig:" + strings.ToLower(hexSig)
		seen, err := fence.Seen(ctx, rc.State, delivery, now)
		if err == nil && !seen {
			seen, err = fence.Claim(ctx, rc.State, signedKey, delivery, now)
		}
		if err != nil {
			rc.Logger.Warn("chatwoot webhook: replay fence unavailable", "error", err)
			webhook.Fail(w, ResendStatus, webhook.CodeStorageUnavailable, "the replay fence could not be read; deliver again later")
			return
		}
		if seen {
			webhook.Accepted(w, len(events), true)
			return
		}
		if len(events) > 0 {
			if _, err := rc.Events.Publish(ctx, Channel, events...); err != nil {
				refusals.PublishFailed(w, now, err, "delivery", delivery)
				return
			}
		}
		if _, err = fence.Record(ctx, rc.State, delivery, now); err != nil {
			// The events are stored, so the delivery is accepted: an
			// error would tell Chatwoot the delivery failed — it marks
			// an API inbox's message failed and moves an agent bot's
			// pending conversation to open — and a redelivery, signed
			// at another time, would publish the same event ID with
			// another occurred_at, which the fleet refuses as a
			// conflict. The signed material stays claimed for this
			// delivery, so a copy under another delivery ID is still a
			// duplicate.
			rc.Logger.Warn("chatwoot webhook: delivery not recorded in the replay fence; its events are stored", "delivery", delivery, "error", err)
		}
		webhook.Accepted(w, len(events), false)
	})
}

// mapDelivery turns a verified delivery into its events: none for the
// connector's own messages (content_attributes carries an AIP action ID),
// else one event chatwoot.<event> whose ID derives from the account and
// the delivery ID, so a redelivery maps to the same event.
func (c *Connector) mapDelivery(delivery string, sent time.Time, body []byte) ([]aip.Event, error) {
	var p map[string]json.RawMessage
	if err := json.Unmarshal(body, &p); err != nil || p == nil {
		return nil, fmt.Errorf("the body is not a JSON object")
	}
	var event string
	if err := json.Unmarshal(p["event"], &event); err != nil || !eventName.MatchString(event) {
		return nil, fmt.Errorf("the body has no event name (a lowercase word like message_created)")
	}
	if err := c.checkAccount(p); err != nil {
		return nil, &accountError{err}
	}
	var attrs map[string]any
	if raw, ok := p["content_attributes"]; ok && json.Unmarshal(raw, &attrs) == nil {
		if id, _ := attrs[ActionIDAttribute].(string); id != "" {
			return nil, nil // the connector's own message: loop prevention
		}
	}
	data := map[string]any{"delivery_id": delivery, "event": event, "account_id": c.cfg.AccountID}
	if id, ok := conversationOf(event, body, p); ok {
		data["conversation_id"] = id
	}
	if len(body) <= webhook.MaxInlinePayload {
		data["payload"] = json.RawMessage(body)
	} else {
		sum := sha256.Sum256(body)
		payload, omitted, err := webhook.TrimPayload(body, webhook.MaxInlinePayload, payloadTrim)
		if err != nil {
			return nil, err
		}
		data["payload"] = payload
		data["payload_omitted"] = omitted
		data["payload_bytes"] = len(body)
		data["payload_sha256"] = hex.EncodeToString(sum[:])
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return nil, err
	}
	return []aip.Event{{
		ID: eventID(c.cfg.AccountID, delivery), Kind: "chatwoot." + event,
		OccurredAt: aip.At(sent), Data: raw,
	}}, nil
}

// payloadTrim is how a payload larger than webhook.MaxInlinePayload is
// cut down to fit: first without conversation.messages, where Chatwoot
// repeats the conversation's last message (in a message event, the
// message itself), then without its largest members, largest first (a
// long message's content, the conversation). What stays (the event, the
// message, conversation and sender IDs) lets a consumer read the rest
// through the API.
var payloadTrim = webhook.Trim{First: []string{"conversation.messages"}, Keep: []string{"event"}}

// eventID returns the delivery's event ID: "evt_" and the first 16 bytes
// of SHA-256("chatwoot" NUL account NUL delivery) with the UUIDv7 version
// and RFC 9562 variant bits set, so it is an AIP event identifier that
// depends on the delivery alone (a redelivery signed at another time keeps
// it; its time field is digest bits, not a clock).
func eventID(accountID int64, delivery string) string {
	return hostsdk.DeriveEventID(time.Time{}, []byte("chatwoot"), []byte(strconv.FormatInt(accountID, 10)), []byte(delivery))
}

// accountError is a delivery refused for the account it names
// (checkAccount).
type accountError struct{ err error }

func (e *accountError) Error() string { return e.err.Error() }
func (e *accountError) Unwrap() error { return e.err }

// checkAccount refuses a payload that names another account, or names
// one it cannot read, in account.id or account_id (either may be absent,
// both are checked when present).
func (c *Connector) checkAccount(p map[string]json.RawMessage) error {
	check := func(where string, raw json.RawMessage) error {
		var id int64
		if err := json.Unmarshal(raw, &id); err != nil {
			return fmt.Errorf("the delivery's %s is %s, not an account ID; this connector serves account %d", where, provider.Excerpt(string(raw)), c.cfg.AccountID)
		}
		if id != c.cfg.AccountID {
			return fmt.Errorf("the delivery is for account %d; this connector serves account %d", id, c.cfg.AccountID)
		}
		return nil
	}
	if raw, ok := p["account"]; ok && string(raw) != "null" {
		var acct map[string]json.RawMessage
		if err := json.Unmarshal(raw, &acct); err != nil {
			return fmt.Errorf("the delivery's account is %s, not an object; this connector serves account %d", provider.Excerpt(string(raw)), c.cfg.AccountID)
		}
		if id, ok := acct["id"]; ok && string(id) != "null" {
			if err := check("account.id", id); err != nil {
				return err
			}
		}
	}
	if raw, ok := p["account_id"]; ok && string(raw) != "null" {
		return check("account_id", raw)
	}
	return nil
}

// conversationOf reads the conversation's display ID (the ID the API's
// paths use). Chatwoot's webhook data of a conversation
// (Conversations::EventDataPresenter#push_data) carries it as id: at the
// top of conversation_* events, and in the conversation member of message
// and typing events; Chatwoot releases before that presenter sent
// conversation.display_id instead, read first when present.
func conversationOf(event string, body []byte, p map[string]json.RawMessage) (int64, bool) {
	var ids struct {
		DisplayID *int64 `json:"display_id"`
		ID        *int64 `json:"id"`
	}
	if raw, ok := p["conversation"]; ok {
		_ = json.Unmarshal(raw, &ids)
	} else if strings.HasPrefix(event, "conversation_") {
		_ = json.Unmarshal(body, &ids)
	}
	switch {
	case ids.DisplayID != nil:
		return *ids.DisplayID, true
	case ids.ID != nil:
		return *ids.ID, true
	}
	return 0, false
}
