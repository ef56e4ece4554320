// Package webhook holds what the product adapters' webhook routes share:
// reading a bounded body, checking an HMAC signature in constant time, a
// durable replay fence kept in the host's state store, and the error and
// acceptance answers (reference: `{"error":{"code":...}}` with webhook.*
// codes, and `{"accepted_events": n, ...}`).
//
// A route verifies the delivery, fences it, maps it to provider events and
// publishes them with hostsdk.EventPublisher, which stores them in the
// journal's outbox (identical batches once). The fence is checked before
// publishing and recorded only after the events are stored, so a delivery
// whose publication failed can be delivered again; what a route must hold
// against a copy under another name (Chatwoot's signed material, which its
// unsigned delivery ID does not cover) it claims for the delivery before
// publishing (Fence.Claim).
package webhook

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// MaxBody bounds a webhook body (4 MiB, as the reference's hosts do).
const MaxBody = 4 << 20

// Error codes of webhook answers.
const (
	CodeMissingHeader        = "webhook.missing_header"
	CodeInvalidUTF8          = "webhook.invalid_utf8"
	CodeInvalidTimestamp     = "webhook.invalid_timestamp"
	CodeAuthenticationFailed = "webhook.authentication_failed"
	CodeInvalidDelivery      = "webhook.invalid_delivery"
	CodeStorageUnavailable   = "webhook.storage_unavailable"
	CodeInvalidMapping       = "webhook.invalid_mapping"
	CodeTooLarge             = "webhook.too_large"
)

// Fail answers status with {"error":{"code":code,"message":message}}.
func Fail(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": message}})
}

// PublishFailed answers a delivery whose events hostsdk.EventPublisher
// refused with err, so that the product delivers again only what can
// succeed: events the host refuses for their content
// (hostsdk.ErrInvalidEvents) are 400 invalid_delivery, which a product
// does not resend (a 503 would have it resend the same refused delivery
// until it gives up) — except an event time ahead of this replica's clock
// (hostsdk.ErrEventAhead), 503 invalid_timestamp, since the replica's
// clock may be the wrong one; a replica that does not accept events now
// (draining: hostsdk.ErrNotServing) and a full outbox
// (hostsdk.ErrEventOutboxFull) are 503, to be delivered again; anything
// else is answered 503. (503 is the default of r.ResendStatus, which
// gives those answers their status.) Every refusal is logged with Route and args (what
// names the delivery), at warn, or error for an unexpected one, as Warn
// logs: at most a line a minute of each of those five kinds, the next
// carrying the count of those not logged as not_logged_since. The
// deliveries come verified from a product, and the three that send them
// (Cal.diy, Chatwoot, Twenty) do not deliver a refused delivery again
// (Chatwoot's agent bots only one answered 429 or 500), so the log is
// where a lost event is found; but a product, or an operator, may resend
// one the host keeps refusing (a full outbox, a replica's clock behind),
// and each would otherwise be a line.
func (r *Refusals) PublishFailed(w http.ResponseWriter, now time.Time, err error, args ...any) {
	args = append(args[:len(args):len(args)], "error", err)
	switch {
	case errors.Is(err, hostsdk.ErrEventAhead):
		// This replica's clock may be the one that is wrong: once it is
		// right, the same delivery is taken.
		r.log(now, slog.LevelWarn, "publish_event_ahead", "an event's time is ahead of this replica's clock; check the clock (NTP)", args...)
		Fail(w, r.resendStatus(), CodeInvalidTimestamp, "the event's time is more than 5 minutes ahead of this replica's clock; deliver again (the replica's operator is told to check its clock)")
	case errors.Is(err, hostsdk.ErrInvalidEvents):
		r.log(now, slog.LevelWarn, "publish_invalid_events", "a verified delivery's events cannot be stored; the delivery is refused", args...)
		Fail(w, http.StatusBadRequest, CodeInvalidDelivery, "the delivery's events cannot be stored: "+err.Error())
	case errors.Is(err, hostsdk.ErrNotServing):
		r.log(now, slog.LevelWarn, "publish_not_serving", "a verified delivery is refused: this replica does not accept events now", args...)
		Fail(w, r.resendStatus(), CodeStorageUnavailable, "this replica does not accept events now; deliver again")
	case errors.Is(err, hostsdk.ErrEventOutboxFull):
		r.log(now, slog.LevelWarn, "publish_outbox_full", "the event outbox is full", args...)
		Fail(w, r.resendStatus(), CodeStorageUnavailable, "the replica's event outbox is full (its events are not being delivered); deliver again later")
	default:
		r.log(now, slog.LevelError, "publish", "publish", args...)
		Fail(w, r.resendStatus(), CodeStorageUnavailable, "the events could not be stored; deliver again")
	}
}

// Accepted answers 200 with the number of events accepted and, when they
// were stored, "durably_queued" as their central delivery (the host's
// outbox holds them).
func Accepted(w http.ResponseWriter, n int, duplicate bool) {
	w.Header().Set("Content-Type", "application/json")
	body := map[string]any{"accepted_events": n, "central_delivery": "durably_queued"}
	if duplicate {
		body["duplicate"] = true
	}
	_ = json.NewEncoder(w).Encode(body)
}

// ReadBody reads at most MaxBody bytes of r's body. On failure it has
// answered and returns false.
func ReadBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			Fail(w, http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("the body is larger than %d bytes", MaxBody))
		} else {
			Fail(w, http.StatusBadRequest, CodeInvalidDelivery, "the body could not be read")
		}
		return nil, false
	}
	return body, true
}

// HMACSHA256 returns HMAC-SHA256(secret, parts...).
func HMACSHA256(secret []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, secret)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// EqualHex reports, in constant time for equal lengths, whether gotHex is
// the lowercase or uppercase hex of want.
func EqualHex(want []byte, gotHex string) bool {
	got, err := hex.DecodeString(gotHex)
	if err != nil {
		return false
	}
	return hmac.Equal(want, got)
}

// Fence is a replay fence for one product instance: the delivery IDs seen
// within Window, at most Capacity of them, kept under one key of the
// host's state store (compare-and-set, so replicas sharing a runtime
// database agree). Every recorded delivery rewrites the key, so its cost
// grows with the deliveries inside one window: keep Capacity to what a
// window really holds.
type Fence struct {
	Namespace string // e.g. "aip.connector.chatwoot.webhook_replay.v1"
	Key       string // e.g. "instance:<instance_id>"
	Window    time.Duration
	Capacity  int
	// EvictOldest makes a full fence forget its oldest delivery; without
	// it a full fence refuses new deliveries (ErrFenceFull).
	EvictOldest bool
}

// ErrFenceFull is a delivery refused because the fence holds Capacity
// deliveries within its window.
var ErrFenceFull = errors.New("webhook: replay fence is full")

type fenceState struct {
	// Seen maps a delivery ID to when it was recorded (Unix ms).
	Seen map[string]int64 `json:"seen"`
	// Owners maps a key recorded by Claim to the owner it was claimed
	// for (absent for a key Record recorded).
	Owners map[string]string `json:"owners,omitempty"`
}

// Seen reports whether id was recorded within the window.
func (f *Fence) Seen(ctx context.Context, st *hostsdk.State, id string, now time.Time) (bool, error) {
	v, err := st.Get(ctx, f.Namespace, f.Key)
	if err != nil {
		if isNotFound(err) {
			return false, nil
		}
		return false, err
	}
	var s fenceState
	if err := json.Unmarshal(v.Value, &s); err != nil {
		return false, fmt.Errorf("webhook: replay fence %s/%s: %w", f.Namespace, f.Key, err)
	}
	at, ok := s.Seen[id]
	return ok && now.Sub(time.UnixMilli(at)) <= f.Window, nil
}

// Record records id at now, dropping deliveries older than the window.
// It returns true when id was already recorded within the window (another
// replica or a concurrent delivery got there first).
func (f *Fence) Record(ctx context.Context, st *hostsdk.State, id string, now time.Time) (bool, error) {
	return f.record(ctx, st, id, "", now)
}

// Claim records key at now for owner, in one compare-and-set, unless key
// is already recorded within the window for another owner (or by Record,
// for none): it returns true then, and changes nothing. A key claimed for
// owner before is claimed again (its time renewed). A route claims what
// may be replayed under another name before publishing — the signed
// material of a delivery for its delivery ID — so that of two deliveries
// racing with the same signed material only one publishes, while the
// delivery whose publication failed can be delivered again.
func (f *Fence) Claim(ctx context.Context, st *hostsdk.State, key, owner string, now time.Time) (bool, error) {
	return f.record(ctx, st, key, owner, now)
}

// record records id at now for owner ("" for none); it returns true,
// changing nothing, when id is recorded within the window and owner is ""
// or another owner's.
func (f *Fence) record(ctx context.Context, st *hostsdk.State, id, owner string, now time.Time) (bool, error) {
	dup := false
	_, _, err := st.Update(ctx, f.Namespace, f.Key, func(cur json.RawMessage) (json.RawMessage, error) {
		s := fenceState{Seen: map[string]int64{}}
		if cur != nil {
			if err := json.Unmarshal(cur, &s); err != nil {
				return nil, fmt.Errorf("webhook: replay fence %s/%s: %w", f.Namespace, f.Key, err)
			}
			if s.Seen == nil {
				s.Seen = map[string]int64{}
			}
		}
		forget := func(k string) {
			delete(s.Seen, k)
			delete(s.Owners, k)
		}
		oldest := now.Add(-f.Window).UnixMilli()
		for k, at := range s.Seen {
			if at < oldest {
				forget(k)
			}
		}
		for k := range s.Owners {
			if _, ok := s.Seen[k]; !ok {
				delete(s.Owners, k)
			}
		}
		if _, ok := s.Seen[id]; ok {
			if owner == "" || s.Owners[id] != owner {
				dup = true
				return json.Marshal(s)
			}
			forget(id) // claimed for owner before: claimed again
		}
		dup = false
		if len(s.Seen) >= f.Capacity {
			if !f.EvictOldest {
				return nil, fmt.Errorf("%w: %d deliveries within %s", ErrFenceFull, f.Capacity, f.Window)
			}
			ids := make([]string, 0, len(s.Seen))
			for k := range s.Seen {
				ids = append(ids, k)
			}
			slices.SortFunc(ids, func(a, b string) int { return int(s.Seen[a] - s.Seen[b]) })
			for _, k := range ids[:len(s.Seen)-f.Capacity+1] {
				forget(k)
			}
		}
		s.Seen[id] = now.UnixMilli()
		if owner != "" {
			if s.Owners == nil {
				s.Owners = map[string]string{}
			}
			s.Owners[id] = owner
		}
		return json.Marshal(s)
	})
	return dup, err
}

func isNotFound(err error) bool { return errors.Is(err, journal.ErrNotFound) }
