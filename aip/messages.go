package aip

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
)

// Principal identifies a human, agent, service or organisation.
type Principal struct {
	ID                 string               `json:"id"`
	Kind               PrincipalKind        `json:"kind"`
	DisplayName        string               `json:"display_name,omitempty"`
	TrustDomain        string               `json:"trust_domain,omitempty"`
	DID                string               `json:"did,omitempty"`
	ExternalRefs       []ExternalRef        `json:"external_refs,omitempty"`
	DelegatedAuthority []DelegatedAuthority `json:"delegated_authority,omitempty"`
	AuthContext        json.RawMessage      `json:"auth_context,omitempty"`
}

// ExternalRef links a principal to an identity in another system.
type ExternalRef struct {
	System string `json:"system"`
	Type   string `json:"type"`
	ID     string `json:"id"`
}

// DelegatedAuthority records authority delegated to a principal.
type DelegatedAuthority struct {
	PrincipalID string     `json:"principal_id"`
	Scopes      []string   `json:"scopes"`
	ExpiresAt   *Timestamp `json:"expires_at,omitempty"`
	Reason      string     `json:"reason,omitempty"`
}

// Validate checks the principal's required fields and enums.
func (p *Principal) Validate() error {
	if p.ID == "" {
		return errors.New("principal id is empty")
	}
	if !p.Kind.Valid() {
		return fmt.Errorf("principal %s: unknown kind %q", p.ID, p.Kind)
	}
	return nil
}

// Action asks a capability to do something.
type Action struct {
	ID              string              `json:"id"`
	CapabilityID    string              `json:"capability_id"`
	Input           json.RawMessage     `json:"input"`
	Mode            ActionMode          `json:"mode,omitempty"`
	IdempotencyKey  string              `json:"idempotency_key,omitempty"`
	TimeoutMS       *uint64             `json:"timeout_ms,omitempty"`
	Conversation    json.RawMessage     `json:"conversation,omitempty"`
	MemoryContext   json.RawMessage     `json:"memory_context,omitempty"`
	DelegationChain []json.RawMessage   `json:"delegation_chain,omitempty"`
	Federation      *Federation         `json:"federation,omitempty"`
	Callback        *Callback           `json:"callback,omitempty"`
	Observability   json.RawMessage     `json:"observability,omitempty"`
	Compliance      json.RawMessage     `json:"compliance,omitempty"`
	Identity        *IdentityContext    `json:"identity,omitempty"`
	Approval        json.RawMessage     `json:"approval,omitempty"`
	Transaction     *TransactionRequest `json:"transaction,omitempty"`
}

// Federation records the trust domains an action crossed.
type Federation struct {
	TrustDomain string            `json:"trust_domain"`
	Hops        []json.RawMessage `json:"hops,omitempty"`
}

// Callback tells a connector where to deliver asynchronous output.
type Callback struct {
	Profile  string                     `json:"profile"`
	Target   string                     `json:"target"`
	Metadata map[string]json.RawMessage `json:"metadata,omitempty"`
}

// TransactionRequest asks for transactional execution.
type TransactionRequest struct {
	Mode            TransactionMode `json:"mode"`
	TransactionID   string          `json:"transaction_id,omitempty"`
	PlanID          string          `json:"plan_id,omitempty"`
	CompensationFor string          `json:"compensation_for,omitempty"`
}

// IdentityContext carries the verified identity an action runs under.
type IdentityContext struct {
	Tenant          *TenantRef      `json:"tenant,omitempty"`
	ExternalAccount *AccountRef     `json:"external_account,omitempty"`
	ExternalUser    *AccountRef     `json:"external_user,omitempty"`
	HumanActor      *Principal      `json:"human_actor,omitempty"`
	ServiceAccount  *Principal      `json:"service_account,omitempty"`
	ActedOnBehalfOf *Principal      `json:"acted_on_behalf_of,omitempty"`
	CredentialRef   *CredentialRef  `json:"credential_ref,omitempty"`
	OAuth           json.RawMessage `json:"oauth,omitempty"`
}

// TenantRef names a tenant.
type TenantRef struct {
	ID     string `json:"id"`
	System string `json:"system,omitempty"`
}

// AccountRef names an account in an external system.
type AccountRef struct {
	ID     string `json:"id"`
	System string `json:"system"`
}

// CredentialRef is an opaque reference to a credential (never its value).
type CredentialRef struct {
	ID     string   `json:"id"`
	Issuer string   `json:"issuer"`
	Scopes []string `json:"scopes"`
}

// Validate checks the action's required fields and enums.
func (a *Action) Validate() error {
	if err := ValidateID(PrefixAction, a.ID); err != nil {
		return fmt.Errorf("action id: %w", err)
	}
	if a.CapabilityID == "" {
		return fmt.Errorf("action %s: capability_id is empty", a.ID)
	}
	if len(a.Input) == 0 {
		return fmt.Errorf("action %s: input is missing", a.ID)
	}
	if a.Mode != "" && !a.Mode.Valid() {
		return fmt.Errorf("action %s: unknown mode %q", a.ID, a.Mode)
	}
	if a.Transaction != nil && !a.Transaction.Mode.Valid() {
		return fmt.Errorf("action %s: unknown transaction mode %q", a.ID, a.Transaction.Mode)
	}
	return nil
}

// ActionResult is the outcome of an action.
type ActionResult struct {
	ActionID     string          `json:"action_id"`
	Status       ResultStatus    `json:"status"`
	Output       json.RawMessage `json:"output,omitempty"`
	Message      []MessagePart   `json:"message,omitempty"`
	MemoryUpdate json.RawMessage `json:"memory_update,omitempty"`
	Usage        *Usage          `json:"usage,omitempty"`
	Receipt      *Receipt        `json:"receipt,omitempty"`
	Error        *ProtocolError  `json:"error,omitempty"`
}

// Validate checks the result's required fields and enums.
func (r *ActionResult) Validate() error {
	if r.ActionID == "" {
		return errors.New("action result: action_id is empty")
	}
	if !r.Status.Valid() {
		return fmt.Errorf("action result %s: unknown status %q", r.ActionID, r.Status)
	}
	for i := range r.Message {
		if r.Message[i].Type == "" {
			return fmt.Errorf("action result %s: message part %d has no type", r.ActionID, i)
		}
	}
	if r.Error != nil {
		if err := r.Error.Validate(); err != nil {
			return fmt.Errorf("action result %s: %w", r.ActionID, err)
		}
	}
	return nil
}

// Usage reports resources an action consumed.
type Usage struct {
	Tokens    *uint64         `json:"tokens,omitempty"`
	Tools     *uint64         `json:"tools,omitempty"`
	LatencyMS *uint64         `json:"latency_ms,omitempty"`
	Cost      json.RawMessage `json:"cost,omitempty"`
}

// Receipt links a result to an entry of the executor's receipt hash chain.
type Receipt struct {
	ID   string `json:"id"`
	Hash string `json:"hash"`
}

// Message part types.
const (
	PartText       = "text"
	PartImage      = "image"
	PartFile       = "file"
	PartAudio      = "audio"
	PartForm       = "form"
	PartCard       = "card"
	PartJSON       = "json"
	PartToolResult = "tool_result"
)

// MessagePart is one part of a result message, tagged by "type". Text parts
// use Text and Format, JSON parts use Data and Schema; the other members of
// any part are kept in Fields.
type MessagePart struct {
	Type   string
	Text   string
	Format string
	Data   json.RawMessage
	Schema json.RawMessage
	Fields map[string]json.RawMessage
}

// TextPart returns a text message part.
func TextPart(text string) MessagePart { return MessagePart{Type: PartText, Text: text} }

// JSONPart returns a json message part.
func JSONPart(data json.RawMessage) MessagePart { return MessagePart{Type: PartJSON, Data: data} }

// MarshalJSON implements json.Marshaler.
func (p MessagePart) MarshalJSON() ([]byte, error) {
	m := make(map[string]any, len(p.Fields)+3)
	for k, v := range p.Fields {
		m[k] = v
	}
	m["type"] = p.Type
	switch p.Type {
	case PartText:
		m["text"] = p.Text
		if p.Format != "" {
			m["format"] = p.Format
		}
	case PartJSON:
		data := p.Data
		if len(data) == 0 {
			data = json.RawMessage("null")
		}
		m["data"] = data
		if len(p.Schema) > 0 {
			m["schema"] = p.Schema
		}
	}
	return json.Marshal(m)
}

// UnmarshalJSON implements json.Unmarshaler.
func (p *MessagePart) UnmarshalJSON(data []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	*p = MessagePart{}
	if err := json.Unmarshal(m["type"], &p.Type); err != nil || p.Type == "" {
		return errors.New("aip: message part needs a string \"type\"")
	}
	delete(m, "type")
	take := func(name string, dst any) error {
		raw, ok := m[name]
		if !ok {
			return nil
		}
		delete(m, name)
		if err := json.Unmarshal(raw, dst); err != nil {
			return fmt.Errorf("aip: message part %s: %w", name, err)
		}
		return nil
	}
	switch p.Type {
	case PartText:
		if err := take("text", &p.Text); err != nil {
			return err
		}
		if err := take("format", &p.Format); err != nil {
			return err
		}
	case PartJSON:
		if err := take("data", &p.Data); err != nil {
			return err
		}
		if err := take("schema", &p.Schema); err != nil {
			return err
		}
	}
	if len(m) > 0 {
		p.Fields = m
	}
	return nil
}

// Ack acknowledges an action without its result.
type Ack struct {
	ActionID     string          `json:"action_id"`
	Status       AckStatus       `json:"status"`
	Reason       string          `json:"reason,omitempty"`
	RetryAfterMS *uint64         `json:"retry_after_ms,omitempty"`
	Queue        json.RawMessage `json:"queue,omitempty"`
}

// StreamChunk is one ordered piece of a streaming action's output.
type StreamChunk struct {
	ActionID string          `json:"action_id"`
	Sequence uint64          `json:"sequence"`
	Kind     ChunkKind       `json:"kind"`
	Data     json.RawMessage `json:"data,omitempty"`
	Part     *MessagePart    `json:"part,omitempty"`
}

// ProtocolError is an AIP error.
type ProtocolError struct {
	Code         string          `json:"code"`
	Message      string          `json:"message"`
	Category     ErrorCategory   `json:"category"`
	Retryable    *bool           `json:"retryable,omitempty"`
	RetryAfterMS *uint64         `json:"retry_after_ms,omitempty"`
	Details      json.RawMessage `json:"details,omitempty"`
	Source       json.RawMessage `json:"source,omitempty"`
}

// Error implements error.
func (e *ProtocolError) Error() string { return e.Code + ": " + e.Message }

// IsRetryable reports whether the error says a retry may succeed.
func (e *ProtocolError) IsRetryable() bool { return e.Retryable != nil && *e.Retryable }

// RetryAfter is retry_after_ms as a duration, 0 when absent. A value past
// what a time.Duration holds (about 292 years) saturates at the largest
// Duration rather than wrapping to a short or negative wait.
func (e *ProtocolError) RetryAfter() time.Duration {
	if e.RetryAfterMS == nil {
		return 0
	}
	if ms := *e.RetryAfterMS; ms <= uint64(math.MaxInt64/int64(time.Millisecond)) {
		return time.Duration(ms) * time.Millisecond
	}
	return math.MaxInt64
}

// RetryAfterSeconds is retry_after_ms rounded up to whole seconds, as an
// HTTP Retry-After header carries it, 0 when absent; it does not wrap.
func (e *ProtocolError) RetryAfterSeconds() uint64 {
	if e.RetryAfterMS == nil {
		return 0
	}
	ms := *e.RetryAfterMS
	secs := ms / 1000
	if ms%1000 != 0 {
		secs++
	}
	return secs
}

// Validate checks the error's required fields.
func (e *ProtocolError) Validate() error {
	if e.Code == "" {
		return errors.New("protocol error: code is empty")
	}
	if !e.Category.Valid() {
		return fmt.Errorf("protocol error %s: unknown category %q", e.Code, e.Category)
	}
	return nil
}

// NewProtocolError returns an error with the given code, category and
// retryability, and an optional retry-after in milliseconds (0 = none).
func NewProtocolError(code string, category ErrorCategory, retryable bool, retryAfterMS uint64, message string) *ProtocolError {
	e := &ProtocolError{Code: code, Message: message, Category: category, Retryable: &retryable}
	if retryAfterMS > 0 {
		e.RetryAfterMS = &retryAfterMS
	}
	return e
}

// ErrorBody is the body of an aip.core.v1.error message: {"error": {...}}.
type ErrorBody struct {
	Error ProtocolError `json:"error"`
}

// Cancel asks for an action (or session) to be cancelled.
type Cancel struct {
	Target CancelTarget `json:"target"`
	Reason string       `json:"reason,omitempty"`
}

// CancelTarget is externally tagged: {"action": "act_..."} or
// {"session": "sess_..."}. Exactly one member is set.
type CancelTarget struct {
	Action  string `json:"action,omitempty"`
	Session string `json:"session,omitempty"`
}

// Validate checks that exactly one target is named.
func (t CancelTarget) Validate() error {
	if (t.Action == "") == (t.Session == "") {
		return errors.New("cancel target must name exactly one of action or session")
	}
	return nil
}

// Event is something that happened, published on a channel.
type Event struct {
	ID            string          `json:"id"`
	Kind          string          `json:"kind"`
	OccurredAt    Timestamp       `json:"occurred_at"`
	SessionID     string          `json:"session_id,omitempty"`
	ActionID      string          `json:"action_id,omitempty"`
	CorrelationID string          `json:"correlation_id,omitempty"`
	Actor         *Principal      `json:"actor,omitempty"`
	Data          json.RawMessage `json:"data,omitempty"`
}

// EventStream is a page of events.
type EventStream struct {
	Events     []Event `json:"events"`
	NextCursor *string `json:"next_cursor,omitempty"`
}

// ActionStatusQuery asks the replica that executed an action for the state
// its journal holds. It is an aipfleet extension used by the dispatcher so a
// caller that timed out learns the outcome without re-executing anything.
type ActionStatusQuery struct {
	ActionID string `json:"action_id"`
}

// ActionState is the journaled state of an action on a replica.
type ActionState string

// Journaled action states.
const (
	StateReceived       ActionState = "received"
	StateRunning        ActionState = "running"
	StateCompleted      ActionState = "completed"
	StateFailed         ActionState = "failed"
	StateOutcomeUnknown ActionState = "outcome_unknown"
	StateCancelled      ActionState = "cancelled"
	// StateNotFound means the replica's journal has no record of the action.
	StateNotFound ActionState = "not_found"
	// StatePruned means the replica's journal has no record of the action
	// and the action may be older than records it pruned after its
	// retention: it may have finished there long ago, and it will never run
	// there now.
	StatePruned ActionState = "pruned"
)

// Valid reports whether s is a known state.
func (s ActionState) Valid() bool {
	return oneOf(s, StateReceived, StateRunning, StateCompleted, StateFailed, StateOutcomeUnknown, StateCancelled, StateNotFound, StatePruned)
}

// Terminal reports whether no further transition will happen on its own.
func (s ActionState) Terminal() bool {
	return oneOf(s, StateCompleted, StateFailed, StateOutcomeUnknown, StateCancelled)
}

// ActionStatus answers an ActionStatusQuery.
type ActionStatus struct {
	ActionID  string        `json:"action_id"`
	State     ActionState   `json:"state"`
	Result    *ActionResult `json:"result,omitempty"`
	UpdatedAt Timestamp     `json:"updated_at,omitzero"`
}
