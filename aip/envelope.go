package aip

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"
)

// Version is the AIP protocol version this package speaks.
const Version = "1.0"

// MessageType names the kind of an envelope.
type MessageType string

// Message types used by the connector fleet.
const (
	TypeAction              MessageType = "aip.core.v1.action"
	TypeAck                 MessageType = "aip.core.v1.ack"
	TypeStreamChunk         MessageType = "aip.core.v1.stream_chunk"
	TypeActionResult        MessageType = "aip.core.v1.action_result"
	TypeError               MessageType = "aip.core.v1.error"
	TypeCancel              MessageType = "aip.core.v1.cancel"
	TypeEventStreamResponse MessageType = "aip.discovery.v1.event_stream_response"
	TypeManifestResponse    MessageType = "aip.discovery.v1.manifest_response"
	// TypeActionStatusQuery and TypeActionStatus are aipfleet extensions:
	// the dispatcher asks a replica what its journal holds for an action.
	TypeActionStatusQuery MessageType = "aip.fleet.v1.action_status_query"
	TypeActionStatus      MessageType = "aip.fleet.v1.action_status"
)

// Body member names (the external tags).
const (
	BodyAction            = "action"
	BodyActionResult      = "action_result"
	BodyError             = "error"
	BodyCancel            = "cancel"
	BodyEventStream       = "event_stream"
	BodyStreamChunk       = "stream_chunk"
	BodyAck               = "ack"
	BodyManifest          = "manifest"
	BodyActionStatusQuery = "action_status_query"
	BodyActionStatus      = "action_status"
)

// bodyTypes maps each body tag to the message type that must carry it.
var bodyTypes = map[string]MessageType{
	BodyAction:            TypeAction,
	BodyActionResult:      TypeActionResult,
	BodyError:             TypeError,
	BodyCancel:            TypeCancel,
	BodyEventStream:       TypeEventStreamResponse,
	BodyStreamChunk:       TypeStreamChunk,
	BodyAck:               TypeAck,
	BodyManifest:          TypeManifestResponse,
	BodyActionStatusQuery: TypeActionStatusQuery,
	BodyActionStatus:      TypeActionStatus,
}

// Body is an envelope body, externally tagged by its snake_case name:
// {"action": {...}}, {"error": {"error": {...}}}, ... Exactly one member is set.
type Body struct {
	Action            *Action            `json:"action,omitempty"`
	ActionResult      *ActionResult      `json:"action_result,omitempty"`
	Error             *ErrorBody         `json:"error,omitempty"`
	Cancel            *Cancel            `json:"cancel,omitempty"`
	EventStream       *EventStream       `json:"event_stream,omitempty"`
	StreamChunk       *StreamChunk       `json:"stream_chunk,omitempty"`
	Ack               *Ack               `json:"ack,omitempty"`
	Manifest          *Manifest          `json:"manifest,omitempty"`
	ActionStatusQuery *ActionStatusQuery `json:"action_status_query,omitempty"`
	ActionStatus      *ActionStatus      `json:"action_status,omitempty"`
}

// Tag returns the name of the member that is set, or "" when none or more
// than one is.
func (b *Body) Tag() string {
	tag, n := "", 0
	set := func(name string, isSet bool) {
		if isSet {
			tag = name
			n++
		}
	}
	set(BodyAction, b.Action != nil)
	set(BodyActionResult, b.ActionResult != nil)
	set(BodyError, b.Error != nil)
	set(BodyCancel, b.Cancel != nil)
	set(BodyEventStream, b.EventStream != nil)
	set(BodyStreamChunk, b.StreamChunk != nil)
	set(BodyAck, b.Ack != nil)
	set(BodyManifest, b.Manifest != nil)
	set(BodyActionStatusQuery, b.ActionStatusQuery != nil)
	set(BodyActionStatus, b.ActionStatus != nil)
	if n != 1 {
		return ""
	}
	return tag
}

// UnmarshalJSON implements json.Unmarshaler: the body must have exactly one
// member, and it must be a known body.
func (b *Body) UnmarshalJSON(data []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	if len(m) != 1 {
		return fmt.Errorf("aip: envelope body must have exactly one member, got %d", len(m))
	}
	*b = Body{}
	for tag, raw := range m {
		var target any
		switch tag {
		case BodyAction:
			b.Action = new(Action)
			target = b.Action
		case BodyActionResult:
			b.ActionResult = new(ActionResult)
			target = b.ActionResult
		case BodyError:
			b.Error = new(ErrorBody)
			target = b.Error
		case BodyCancel:
			b.Cancel = new(Cancel)
			target = b.Cancel
		case BodyEventStream:
			b.EventStream = new(EventStream)
			target = b.EventStream
		case BodyStreamChunk:
			b.StreamChunk = new(StreamChunk)
			target = b.StreamChunk
		case BodyAck:
			b.Ack = new(Ack)
			target = b.Ack
		case BodyManifest:
			b.Manifest = new(Manifest)
			target = b.Manifest
		case BodyActionStatusQuery:
			b.ActionStatusQuery = new(ActionStatusQuery)
			target = b.ActionStatusQuery
		case BodyActionStatus:
			b.ActionStatus = new(ActionStatus)
			target = b.ActionStatus
		default:
			return fmt.Errorf("aip: unknown envelope body %q", tag)
		}
		if err := json.Unmarshal(raw, target); err != nil {
			return fmt.Errorf("aip: envelope body %s: %w", tag, err)
		}
	}
	return nil
}

// MessageReference points at an earlier message: {"message": "msg_..."}.
type MessageReference struct {
	Message string `json:"message"`
}

// Envelope is a native AIP message.
type Envelope struct {
	AIPVersion     string                     `json:"aip_version"`
	MessageType    MessageType                `json:"message_type"`
	MessageID      string                     `json:"message_id"`
	SentAt         Timestamp                  `json:"sent_at"`
	Body           Body                       `json:"body"`
	SessionID      string                     `json:"session_id,omitempty"`
	CorrelationID  string                     `json:"correlation_id,omitempty"`
	InResponseTo   *MessageReference          `json:"in_response_to,omitempty"`
	IdempotencyKey string                     `json:"idempotency_key,omitempty"`
	From           *Principal                 `json:"from,omitempty"`
	To             *Principal                 `json:"to,omitempty"`
	Trace          map[string]string          `json:"trace,omitempty"`
	Security       map[string]json.RawMessage `json:"security,omitempty"`
	Extensions     map[string]json.RawMessage `json:"extensions,omitempty"`
}

// NewEnvelope returns an envelope with a fresh message ID sent at now, whose
// message type is derived from the body.
func NewEnvelope(now time.Time, body Body) (*Envelope, error) {
	tag := body.Tag()
	if tag == "" {
		return nil, errors.New("aip: envelope body must set exactly one member")
	}
	return &Envelope{
		AIPVersion:  Version,
		MessageType: bodyTypes[tag],
		MessageID:   NewMessageID(),
		SentAt:      At(now),
		Body:        body,
	}, nil
}

// Validate checks version, IDs, that the body matches the message type, and
// the body's own rules.
func (e *Envelope) Validate() error {
	if e.AIPVersion != Version {
		return fmt.Errorf("aip_version %q is not supported; want %q", e.AIPVersion, Version)
	}
	if err := ValidateID(PrefixMessage, e.MessageID); err != nil {
		return fmt.Errorf("message_id: %w", err)
	}
	if e.SentAt.IsZero() {
		return errors.New("sent_at is missing")
	}
	tag := e.Body.Tag()
	if tag == "" {
		return errors.New("body must have exactly one member")
	}
	if want := bodyTypes[tag]; e.MessageType != want {
		return fmt.Errorf("message_type %q does not match a %s body (want %q)", e.MessageType, tag, want)
	}
	for _, p := range []*Principal{e.From, e.To} {
		if p != nil {
			if err := p.Validate(); err != nil {
				return err
			}
		}
	}
	b := &e.Body
	switch {
	case b.Action != nil:
		return b.Action.Validate()
	case b.ActionResult != nil:
		return b.ActionResult.Validate()
	case b.Error != nil:
		return b.Error.Error.Validate()
	case b.Cancel != nil:
		return b.Cancel.Target.Validate()
	case b.StreamChunk != nil:
		if !b.StreamChunk.Kind.Valid() {
			return fmt.Errorf("stream chunk: unknown kind %q", b.StreamChunk.Kind)
		}
	case b.Ack != nil:
		if !b.Ack.Status.Valid() {
			return fmt.Errorf("ack: unknown status %q", b.Ack.Status)
		}
	case b.Manifest != nil:
		return b.Manifest.ValidateShape()
	case b.ActionStatusQuery != nil:
		if b.ActionStatusQuery.ActionID == "" {
			return errors.New("action status query: action_id is empty")
		}
	case b.ActionStatus != nil:
		if !b.ActionStatus.State.Valid() {
			return fmt.Errorf("action status: unknown state %q", b.ActionStatus.State)
		}
	}
	return nil
}

// SetSecurity stores v (marshalled) as security.<name>.
func (e *Envelope) SetSecurity(name string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("aip: security.%s: %w", name, err)
	}
	if e.Security == nil {
		e.Security = make(map[string]json.RawMessage)
	}
	e.Security[name] = raw
	return nil
}

// SecurityValue decodes security.<name> into v and reports whether it was
// present. A member whose name matches a field of v only when case is
// ignored is refused (ErrCaseVariantMember), as in VerifyEnvelope.
func (e *Envelope) SecurityValue(name string, v any) (bool, error) {
	return e.securityValue(name, v, false)
}

// SecurityValueStrict is SecurityValue that also refuses a member matching
// no field of v (by its exact name), for a value whose every member the
// reader must understand: one it does not know may be a constraint it
// would silently not enforce.
func (e *Envelope) SecurityValueStrict(name string, v any) (bool, error) {
	return e.securityValue(name, v, true)
}

func (e *Envelope) securityValue(name string, v any, strict bool) (bool, error) {
	raw, ok := e.Security[name]
	if !ok {
		return false, nil
	}
	if err := checkMemberNames(raw, reflect.TypeOf(v)); err != nil {
		return true, fmt.Errorf("aip: security.%s: %w", name, err)
	}
	var err error
	if strict {
		// raw is one JSON value (a member of the decoded envelope).
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		err = dec.Decode(v)
	} else {
		err = json.Unmarshal(raw, v)
	}
	if err != nil {
		return true, fmt.Errorf("aip: security.%s: %w", name, err)
	}
	return true, nil
}

// Security members used by native signing.
const (
	SecurityDID       = "did"
	SecuritySignature = "signature"
)

// ErrMalformedEnvelope is returned (wrapped) for a body that is not a valid
// envelope.
var ErrMalformedEnvelope = errors.New("aip: malformed envelope")

// SignEnvelope signs env with key: security.did is set to the key's DID, any
// old security.signature is dropped, and the Ed25519 signature over the
// canonical envelope without security.signature is stored in
// security.signature. It returns the signed envelope's canonical JSON.
func SignEnvelope(key *SigningKey, env *Envelope) ([]byte, error) {
	if env.Security == nil {
		env.Security = make(map[string]json.RawMessage)
	}
	delete(env.Security, SecuritySignature)
	didJSON, _ := json.Marshal(key.DID())
	env.Security[SecurityDID] = didJSON
	raw, err := json.Marshal(env)
	if err != nil {
		return nil, fmt.Errorf("aip: sign envelope: %w", err)
	}
	canonical, err := Canonicalize(raw)
	if err != nil {
		return nil, fmt.Errorf("aip: sign envelope: %w", err)
	}
	sig := key.Sign(canonical)
	sigJSON := make([]byte, 0, 90)
	sigJSON = append(sigJSON, '"')
	sigJSON = appendBase64(sigJSON, sig)
	sigJSON = append(sigJSON, '"')
	env.Security[SecuritySignature] = sigJSON
	raw, err = json.Marshal(env)
	if err != nil {
		return nil, fmt.Errorf("aip: sign envelope: %w", err)
	}
	return Canonicalize(raw)
}

// VerifiedEnvelope is an envelope whose native signature verified.
type VerifiedEnvelope struct {
	Envelope  Envelope
	SignerDID string
}

// VerifyEnvelope checks the native signature of a received envelope: the
// Ed25519 signature in security.signature must verify, with the key of the
// did:key in security.did, over the canonical form of the received JSON
// without security.signature (so members this version does not know are
// covered too). It then decodes that canonical form (so the envelope returned
// is exactly what was verified, whatever spelling of it came over the wire)
// and validates it. When expectedDID
// is not empty, the signer must be that DID.
func VerifyEnvelope(raw []byte, expectedDID string) (*VerifiedEnvelope, error) {
	r, err := canonicalizeWithout(raw, "security", SecuritySignature)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformedEnvelope, err)
	}
	if r.removed == nil {
		return nil, fmt.Errorf("%w: security.signature is missing", ErrBadSignature)
	}
	var sig string
	if err := json.Unmarshal(r.removed, &sig); err != nil {
		return nil, fmt.Errorf("%w: security.signature must be a string", ErrBadSignature)
	}
	// Decode what the signature covers, not the wire bytes: canonical form
	// maps several spellings to one (an integer beyond u64 and a long
	// decimal become the nearest double, escapes are resolved), and the
	// caller must see the message that was verified, not another spelling
	// of it that a big-number parser downstream would read differently.
	var env Envelope
	if err := json.Unmarshal(r.canonical, &env); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformedEnvelope, err)
	}
	if env.Security == nil {
		env.Security = make(map[string]json.RawMessage)
	}
	env.Security[SecuritySignature] = json.RawMessage(r.removed)
	if r.foldable {
		if err := checkMemberNames(r.canonical, reflect.TypeFor[Envelope]()); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrMalformedEnvelope, err)
		}
	}
	var did string
	if ok, err := env.SecurityValue(SecurityDID, &did); err != nil || !ok || did == "" {
		return nil, fmt.Errorf("%w: security.did is missing", ErrBadSignature)
	}
	if expectedDID != "" && did != expectedDID {
		return nil, fmt.Errorf("%w: signed by %s, expected %s", ErrBadSignature, did, expectedDID)
	}
	pub, err := ParseDIDKey(did)
	if err != nil {
		return nil, fmt.Errorf("%w: security.did: %v", ErrBadSignature, err)
	}
	if err := VerifySignature(pub, r.canonical, sig); err != nil {
		return nil, err
	}
	if err := env.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformedEnvelope, err)
	}
	return &VerifiedEnvelope{Envelope: env, SignerDID: did}, nil
}
