package dispatch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// The public client API (docs/dispatch-api.md). Every request is
// authenticated by a bearer token whose verified tenant is the only tenant
// the request acts for.

// API paths.
const (
	PathActions      = "/aip/v1/actions"
	PathAction       = "/aip/v1/actions/{id}"
	PathActionCancel = "/aip/v1/actions/{id}/cancel"
	PathCapabilities = "/aip/v1/capabilities"
	PathHealth       = "/health"
	PathReady        = "/ready"
	PathMetrics      = "/metrics"
	PathJWKS         = "/.well-known/jwks.json"
)

// ContentTypeNDJSON is the media type of a streaming action's response.
const ContentTypeNDJSON = "application/x-ndjson"

// ActionRequest is the body of POST /aip/v1/actions.
type ActionRequest struct {
	// ActionID names the action (act_ + UUIDv7). Sending the same ID again
	// returns the same action's result from the same replica; the
	// dispatcher generates one when it is absent and always returns it.
	ActionID string `json:"action_id,omitempty"`
	// CapabilityID is the capability to invoke. Required.
	CapabilityID string `json:"capability_id"`
	// Input is the capability's input. Required.
	Input json.RawMessage `json:"input"`
	// Mode is sync (the default: one JSON answer) or streaming (NDJSON).
	Mode aip.ActionMode `json:"mode,omitempty"`
	// IdempotencyKey is passed to the connector.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// TimeoutMS bounds the wait for the replica's answer (and the
	// connector's run); defaults to the dispatcher's default timeout.
	TimeoutMS *uint64 `json:"timeout_ms,omitempty"`

	// inputChecked records that DecodeActionRequest already found the
	// whole body (Input included) to be I-JSON, so Validate need not
	// canonicalize Input a second time.
	inputChecked bool
}

// Bounds of an ActionRequest.
const (
	MaxIdempotencyKeyBytes = 256
	MaxCapabilityIDBytes   = registry.MaxIdentifierBytes
	// MaxInputDepth bounds how deeply the input nests (objects and arrays,
	// the input's own outermost one included): the signed envelope holds it
	// three levels down (envelope, body, action), and a replica reads no
	// envelope nested deeper than the canonical JSON limit of 256 levels.
	MaxInputDepth = 253
)

// DecodeActionRequest decodes a request body strictly: the body is one
// JSON object whose members are the request's fields by their exact names
// (unknown members, and names that differ from a field's only in case,
// are refused), with nothing after it; and it is I-JSON (RFC 7493: a
// member name twice in one object — anywhere, the action's own fields
// included —, a number outside the double range, a lone UTF-16
// surrogate), which could not be signed and would mean different things
// to different readers.
//
// A timeout_ms of the wrong JSON type (a string, a negative or fractional
// number) is said to take a whole number of milliseconds (from 1 to the
// dispatcher's maximum, which ActionRequest.Validate checks), not what its
// Go type holds.
func DecodeActionRequest(body []byte) (ActionRequest, error) {
	return decodeActionRequest(body, 0)
}

// decodeActionRequest is DecodeActionRequest; a maxTimeout above zero is
// named as timeout_ms's bound when timeout_ms has the wrong JSON type.
func decodeActionRequest(body []byte, maxTimeout time.Duration) (ActionRequest, error) {
	var r ActionRequest
	if err := aip.DecodeStrict(body, &r); err != nil {
		if te, ok := errors.AsType[*aip.MemberTypeError](err); ok && te.Member == "timeout_ms" {
			c := *te
			c.Want = "a whole number of milliseconds"
			if maxTimeout > 0 {
				c.Want += fmt.Sprintf(" from 1 to %d", maxTimeout.Milliseconds())
			}
			err = &c
		}
		return r, fmt.Errorf("the body is not an action request: %v", err)
	}
	r.inputChecked = true
	return r, nil
}

// Validate checks the request's fields and says what to fix.
func (r *ActionRequest) Validate(maxTimeout time.Duration) error {
	if r.ActionID != "" {
		if err := aip.ValidateID(aip.PrefixAction, r.ActionID); err != nil {
			return fmt.Errorf("action_id: %v (act_ and a UUIDv7 without hyphens, such as act_0192a8f0c1d27e3f8a4b5c6d7e8f9003: choose it before the first send and keep it for every retry)", err)
		}
	}
	switch {
	case r.CapabilityID == "":
		return errors.New("capability_id is required")
	case len(r.CapabilityID) > MaxCapabilityIDBytes:
		return fmt.Errorf("capability_id is longer than %d bytes", MaxCapabilityIDBytes)
	case !printableText(r.CapabilityID):
		return fmt.Errorf("capability_id %q must be UTF-8 text without control characters or leading or trailing spaces", aip.TruncateUTF8(r.CapabilityID, 64))
	}
	if err := checkFormatCharacter("capability_id", r.CapabilityID, "capability ID"); err != nil {
		// The registry refuses it too, but only once the action was
		// admitted, and as the route request's field.
		return err
	}
	switch {
	case len(bytes.TrimSpace(r.Input)) == 0 || bytes.Equal(bytes.TrimSpace(r.Input), []byte("null")):
		return errors.New("input is required (the capability's input object)")
	case r.Mode != "" && r.Mode != aip.ModeSync && r.Mode != aip.ModeStreaming:
		return fmt.Errorf("mode %q is not supported; use sync or streaming", r.Mode)
	case len(r.IdempotencyKey) > MaxIdempotencyKeyBytes:
		return fmt.Errorf("idempotency_key is longer than %d bytes", MaxIdempotencyKeyBytes)
	case !utf8.ValidString(r.IdempotencyKey) || strings.ContainsRune(r.IdempotencyKey, 0):
		// A replica journals the key: it refuses one it cannot store.
		return errors.New("idempotency_key must be UTF-8 text without NUL")
	case r.TimeoutMS != nil && (*r.TimeoutMS == 0 || *r.TimeoutMS > uint64(maxTimeout.Milliseconds())):
		// Compared in milliseconds: a huge value converted to a Duration
		// would overflow and pass.
		return fmt.Errorf("timeout_ms must be from 1 to %d", maxTimeout.Milliseconds())
	}
	if !r.inputChecked {
		if _, err := aip.Canonicalize(r.Input); err != nil {
			return fmt.Errorf("input: %v", err)
		}
	}
	if depth := aip.JSONDepth(r.Input); depth > MaxInputDepth {
		return fmt.Errorf("input nests %d levels deep; at most %d are accepted", depth, MaxInputDepth)
	}
	return nil
}

// printableText reports whether s is UTF-8 text without control
// characters or leading or trailing spaces, as the registry's identifiers
// are (a capability ID, a tenant ID). They hold no invisible formatting
// character either (checkFormatCharacter).
func printableText(s string) bool {
	return utf8.ValidString(s) && strings.TrimSpace(s) == s && strings.IndexFunc(s, unicode.IsControl) < 0
}

// checkFormatCharacter refuses an identifier v (named field, a what such
// as "capability ID") holding an invisible formatting character, which no
// registry identifier may hold (registry.RuleFormatCharacter): it would
// print like an identifier it is not. The error names the field, the
// character's code point and the fix.
func checkFormatCharacter(field, v, what string) error {
	if c, ok := registry.FormatCharacter(v); ok {
		return fmt.Errorf("%s %q holds the invisible formatting character U+%04X, which no %s may hold (it would print like a %s it is not): remove it",
			field, aip.TruncateUTF8(v, 64), c, what, what)
	}
	return nil
}

// Settlement values an answer reports beside the registry's outcomes.
const (
	// SettlementNone: the route's reservation was not settled by this
	// request (no route was made, or settling failed and awaits lease
	// maintenance; see the error).
	SettlementNone registry.RouteSettlement = ""
)

// ActionResponse is the answer of POST /aip/v1/actions and of a cancel: the
// replica's result, or an error, with the routing facts.
type ActionResponse struct {
	ActionID string `json:"action_id"`
	// Result is the replica's verified action result (any status:
	// completed, failed, cancelled, ...).
	Result *aip.ActionResult `json:"result,omitempty"`
	// Error is set when there is no result.
	Error *aip.ProtocolError `json:"error,omitempty"`
	// Route is the assignment that carried the action, once there is one.
	Route *RouteFacts `json:"route,omitempty"`
	// Settlement is how this request settled the route's reservation:
	// completed, outcome_unknown, cancelled or pruned (the replica's
	// journal pruned the action: connector_host.action_expired); "" when
	// it did not.
	Settlement registry.RouteSettlement `json:"settlement,omitempty"`
}

// RouteFacts describe one assignment.
type RouteFacts struct {
	ReplicaID  string    `json:"replica_id"`
	InstanceID string    `json:"instance_id"`
	VersionID  string    `json:"version_id"`
	FenceToken string    `json:"fence_token"`
	AssignedAt time.Time `json:"assigned_at"`
	// Reroutes lists the replicas this request moved the action off, in
	// order, with the refusal that proved it had not started there.
	Reroutes []RerouteFact `json:"reroutes,omitempty"`
}

// RerouteFact is one provably-not-started reroute.
type RerouteFact struct {
	FromReplicaID  string `json:"from_replica_id"`
	FromFenceToken string `json:"from_fence_token"`
	RefusalCode    string `json:"refusal_code"`
}

func factsOf(a *registry.RouteAssignment) *RouteFacts {
	return &RouteFacts{ReplicaID: a.ReplicaID, InstanceID: a.InstanceID, VersionID: a.VersionID,
		FenceToken: a.FenceToken, AssignedAt: a.AssignedAt}
}

// StreamLine is one line of a streaming answer: a chunk as the replica sent
// it, or (last) the final ActionResponse.
type StreamLine struct {
	Chunk *aip.StreamChunk `json:"chunk,omitempty"`
	*ActionResponse
}

// ActionStatusResponse is the answer of GET /aip/v1/actions/{id}.
type ActionStatusResponse struct {
	ActionID     string `json:"action_id"`
	CapabilityID string `json:"capability_id"`
	// Route is the current assignment; History the ones the action was
	// rerouted off, oldest first.
	Route   *RouteFacts  `json:"route"`
	History []RouteFacts `json:"history,omitempty"`
	// Reservation is the registry's bookkeeping of the current route.
	Reservation ReservationFacts `json:"reservation"`
	// Replica is what the pinned replica's journal holds, asked with a
	// signed status query.
	Replica ReplicaFacts `json:"replica"`
}

// ReservationFacts mirror registry.RouteReservation.
type ReservationFacts struct {
	Reserved bool `json:"reserved"`
	Retry    bool `json:"retry"`
	// HandedOutAt is, while reserved, when a resolve last handed the
	// reservation out (reconciliation counts its age from then).
	HandedOutAt *time.Time `json:"handed_out_at,omitempty"`
	// HandOut is the number of the route's last hand-out (1 for the
	// assignment, then one more for each retry or reroute that received
	// it; registry.RouteReservation.HandOut). A settlement releases only
	// the reservation of its own hand-out or a later one.
	HandOut        uint64                   `json:"hand_out,omitempty"`
	LastSettlement registry.RouteSettlement `json:"last_settlement,omitempty"`
}

// ReplicaFacts are the pinned replica's answer to the status query. When
// it could not be asked or did not answer verifiably, Reachable is false
// and Error says why; nothing is guessed.
type ReplicaFacts struct {
	Reachable bool               `json:"reachable"`
	State     aip.ActionState    `json:"state,omitempty"`
	Result    *aip.ActionResult  `json:"result,omitempty"`
	UpdatedAt *aip.Timestamp     `json:"updated_at,omitempty"`
	Error     *aip.ProtocolError `json:"error,omitempty"`
}

// CancelRequest is the optional body of POST /aip/v1/actions/{id}/cancel.
type CancelRequest struct {
	Reason string `json:"reason,omitempty"`
}

// MaxCancelReasonBytes bounds a cancel reason.
const MaxCancelReasonBytes = 1024

// CapabilitiesResponse is one page of GET /aip/v1/capabilities.
type CapabilitiesResponse struct {
	CatalogRevision uint64                          `json:"catalog_revision"`
	Capabilities    []registry.CapabilityDefinition `json:"capabilities"`
	NextCursor      string                          `json:"next_cursor,omitempty"`
	Total           int                             `json:"total"`
}

// ErrorResponse is the body of every error answer that has no action:
// {"error": {...}}.
type ErrorResponse struct {
	Error *aip.ProtocolError `json:"error"`
}
