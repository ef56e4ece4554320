package aip

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Manifest describes what a connector (an agent) offers.
type Manifest struct {
	ManifestVersion string            `json:"manifest_version"`
	Agent           Principal         `json:"agent"`
	Capabilities    []Capability      `json:"capabilities"`
	Profiles        []string          `json:"profiles"`
	Resources       []json.RawMessage `json:"resources,omitempty"`
	// Channels declares the event channels the connector publishes provider
	// events on. Each entry is a channel ID as a JSON string
	// ("tickets.changes"), or an object naming it in "id" (or "channel_id")
	// beside descriptive members of the connector's choosing, for example
	// {"id":"tickets.changes","direction":"inbound","description":"..."}.
	// A host publishes only on channels declared here
	// (hostsdk.EventPublisher.Publish); ValidateShape refuses an entry of
	// another shape, and Validate a channel ID the fleet's event log could
	// not store (CheckChannelID).
	Channels      []json.RawMessage `json:"channels,omitempty"`
	Security      json.RawMessage   `json:"security,omitempty"`
	Governance    json.RawMessage   `json:"governance,omitempty"`
	Limits        json.RawMessage   `json:"limits,omitempty"`
	Compatibility json.RawMessage   `json:"compatibility,omitempty"`
	Extensions    json.RawMessage   `json:"extensions,omitempty"`
}

// Capability is one thing a connector can do.
type Capability struct {
	ID                    string              `json:"id"`
	Name                  string              `json:"name"`
	Kind                  CapabilityKind      `json:"kind"`
	InputSchema           json.RawMessage     `json:"input_schema"`
	OutputSchema          json.RawMessage     `json:"output_schema,omitempty"`
	Description           string              `json:"description,omitempty"`
	Risk                  Risk                `json:"risk,omitempty"`
	Stability             Stability           `json:"stability,omitempty"`
	Cost                  json.RawMessage     `json:"cost,omitempty"`
	Auth                  json.RawMessage     `json:"auth,omitempty"`
	Bindings              []ProfileBinding    `json:"bindings,omitempty"`
	RequiresHumanApproval *bool               `json:"requires_human_approval,omitempty"`
	Contract              *CapabilityContract `json:"contract,omitempty"`
}

// ProfileBinding binds a capability to a transport profile. Members other
// than "profile" are kept in Metadata and written back flattened.
type ProfileBinding struct {
	Profile  string
	Metadata map[string]json.RawMessage
}

// MarshalJSON implements json.Marshaler.
func (b ProfileBinding) MarshalJSON() ([]byte, error) {
	m := make(map[string]any, len(b.Metadata)+1)
	for k, v := range b.Metadata {
		m[k] = v
	}
	m["profile"] = b.Profile
	return json.Marshal(m)
}

// UnmarshalJSON implements json.Unmarshaler.
func (b *ProfileBinding) UnmarshalJSON(data []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	*b = ProfileBinding{}
	if err := json.Unmarshal(m["profile"], &b.Profile); err != nil || b.Profile == "" {
		return errors.New("aip: capability binding needs a string \"profile\"")
	}
	delete(m, "profile")
	if len(m) > 0 {
		b.Metadata = m
	}
	return nil
}

// CapabilityContract states a capability's behaviour: effects, idempotency,
// execution, data handling, credentials, approval, SLA, transactions and
// compensation.
type CapabilityContract struct {
	SideEffects  []SideEffect          `json:"side_effects"`
	Idempotency  IdempotencyContract   `json:"idempotency"`
	Execution    ExecutionContract     `json:"execution"`
	Data         DataContract          `json:"data"`
	Credentials  *CredentialsContract  `json:"credentials,omitempty"`
	Approval     json.RawMessage       `json:"approval,omitempty"`
	SLA          *SLAContract          `json:"sla,omitempty"`
	Transaction  *TransactionContract  `json:"transaction,omitempty"`
	Compensation *CompensationContract `json:"compensation,omitempty"`
}

// IdempotencyContract says how idempotency keys are handled.
type IdempotencyContract struct {
	Requirement       IdempotencyRequirement `json:"requirement"`
	CollisionBehavior CollisionBehavior      `json:"collision_behavior"`
	KeyScope          KeyScope               `json:"key_scope"`
	TTLMS             *uint64                `json:"ttl_ms,omitempty"`
}

// ExecutionContract says how a capability executes.
type ExecutionContract struct {
	SupportsSync       bool               `json:"supports_sync"`
	SupportsAsync      bool               `json:"supports_async"`
	SupportsStreaming  bool               `json:"supports_streaming"`
	SupportsCancel     bool               `json:"supports_cancel"`
	SupportsRetry      bool               `json:"supports_retry"`
	ExpectedCompletion ExpectedCompletion `json:"expected_completion"`
	RetrySafety        RetrySafety        `json:"retry_safety"`
}

// DataContract describes the data a capability handles.
type DataContract struct {
	Sensitivity       Sensitivity `json:"sensitivity"`
	ContainsPII       bool        `json:"contains_pii"`
	RedactionRequired bool        `json:"redaction_required"`
	Residency         string      `json:"residency,omitempty"`
	Retention         string      `json:"retention,omitempty"`
}

// CredentialsContract says which credentials a capability needs.
type CredentialsContract struct {
	Required          bool     `json:"required"`
	AcceptedIssuers   []string `json:"accepted_issuers"`
	RequiredScopes    []string `json:"required_scopes"`
	AllowOAuthRefresh bool     `json:"allow_oauth_refresh"`
}

// SLAContract states expected latency and availability.
type SLAContract struct {
	ExpectedLatencyMS  *uint64  `json:"expected_latency_ms,omitempty"`
	TimeoutMS          *uint64  `json:"timeout_ms,omitempty"`
	AsyncExpected      bool     `json:"async_expected"`
	MaxQueueDelayMS    *uint64  `json:"max_queue_delay_ms,omitempty"`
	AvailabilityTarget *float64 `json:"availability_target,omitempty"`
}

// MarshalJSON implements json.Marshaler: availability_target is written as
// serde_json writes the upstream f64 (1.0, not 1), so signatures and
// digests over a contract match the reference's.
func (s SLAContract) MarshalJSON() ([]byte, error) {
	type plain SLAContract
	w := struct {
		plain
		AvailabilityTarget json.RawMessage `json:"availability_target,omitempty"`
	}{plain: plain(s)}
	if t := s.AvailabilityTarget; t != nil {
		if math.IsInf(*t, 0) || math.IsNaN(*t) {
			return nil, fmt.Errorf("aip: sla availability_target %v is not a finite number", *t)
		}
		w.AvailabilityTarget = AppendNumber(nil, *t)
	}
	return json.Marshal(w)
}

// TransactionContract states transactional support.
type TransactionContract struct {
	SupportedModes           []TransactionMode `json:"supported_modes"`
	RequiresPlanBeforeCommit bool              `json:"requires_plan_before_commit"`
	DryRunFidelity           string            `json:"dry_run_fidelity"`
}

// CompensationContract states how effects can be compensated.
type CompensationContract struct {
	Mode                     CompensationMode `json:"mode"`
	CompensationCapabilityID string           `json:"compensation_capability_id,omitempty"`
	CompensationWindowMS     *uint64          `json:"compensation_window_ms,omitempty"`
	RequiresApproval         bool             `json:"requires_approval"`
}

// ImplementationSupport is a connector version's claim of which parts of a
// capability's contract it implements.
type ImplementationSupport struct {
	Invocation     bool `json:"invocation"`
	Cancellation   bool `json:"cancellation"`
	Streaming      bool `json:"streaming"`
	Retry          bool `json:"retry"`
	Transaction    bool `json:"transaction"`
	Reconciliation bool `json:"reconciliation"`
	Compensation   bool `json:"compensation"`
	Approval       bool `json:"approval"`
	Credentials    bool `json:"credentials"`
}

// Validate checks the contract's enums and their consistency.
func (c *CapabilityContract) Validate() error {
	for _, e := range c.SideEffects {
		if !e.Valid() {
			return fmt.Errorf("unknown side effect %q", e)
		}
	}
	for _, e := range []struct {
		object, member, value string
		valid                 bool
	}{
		{"idempotency", "requirement", string(c.Idempotency.Requirement), c.Idempotency.Requirement.Valid()},
		{"idempotency", "collision_behavior", string(c.Idempotency.CollisionBehavior), c.Idempotency.CollisionBehavior.Valid()},
		{"idempotency", "key_scope", string(c.Idempotency.KeyScope), c.Idempotency.KeyScope.Valid()},
		{"execution", "expected_completion", string(c.Execution.ExpectedCompletion), c.Execution.ExpectedCompletion.Valid()},
		{"execution", "retry_safety", string(c.Execution.RetrySafety), c.Execution.RetrySafety.Valid()},
	} {
		if !e.valid {
			return enumError(e.object, e.member, e.value)
		}
	}
	if !c.Execution.SupportsSync && !c.Execution.SupportsAsync && !c.Execution.SupportsStreaming {
		return errors.New("execution must support at least one of sync, async or streaming")
	}
	if !c.Data.Sensitivity.Valid() {
		return enumError("data", "sensitivity", string(c.Data.Sensitivity))
	}
	if c.Transaction != nil {
		for _, m := range c.Transaction.SupportedModes {
			if !m.Valid() {
				return fmt.Errorf("unknown transaction mode %q", m)
			}
		}
	}
	if c.Compensation != nil && !c.Compensation.Mode.Valid() {
		return fmt.Errorf("unknown compensation mode %q", c.Compensation.Mode)
	}
	return nil
}

// enumError is CapabilityContract.Validate's error for member of the
// contract's object whose value is not one of its enum's: "unknown data
// sensitivity "secret"", or, empty, that it is missing — a manifest
// written by hand as JSON that left out the whole data object otherwise
// read as an unknown sensitivity "".
func enumError(object, member, value string) error {
	if value == "" {
		return fmt.Errorf("%s.%s is missing (the contract's %s object and its required members must be there)", object, member, object)
	}
	return fmt.Errorf("unknown %s %s %q", object, member, value)
}

// Validate checks the capability's required fields, enums and contract.
func (c *Capability) Validate() error {
	if c.ID == "" {
		return errors.New("capability id is empty")
	}
	if c.Name == "" {
		return fmt.Errorf("capability %s: name is empty", c.ID)
	}
	if c.Kind == "" {
		kinds := make([]string, len(capabilityKinds))
		for i, k := range capabilityKinds {
			kinds[i] = string(k)
		}
		return fmt.Errorf("capability %s: kind is missing; give one of %s", c.ID, strings.Join(kinds, ", "))
	}
	if !c.Kind.Valid() {
		return fmt.Errorf("capability %s: unknown kind %q", c.ID, c.Kind)
	}
	if len(c.InputSchema) == 0 {
		return fmt.Errorf("capability %s: input_schema is missing", c.ID)
	}
	if c.Risk != "" && !c.Risk.Valid() {
		return fmt.Errorf("capability %s: unknown risk %q", c.ID, c.Risk)
	}
	if c.Stability != "" && !c.Stability.Valid() {
		return fmt.Errorf("capability %s: unknown stability %q", c.ID, c.Stability)
	}
	if c.Contract != nil {
		if err := c.Contract.Validate(); err != nil {
			return fmt.Errorf("capability %s contract: %w", c.ID, err)
		}
	}
	return nil
}

// manifestVersions are the manifest_version values Manifest.Validate
// takes: AIP's hosts and connectors write aip-manifest/v1, and its
// registry's examples 1.0. AIP does not constrain the member (reference
// 5.4), but it is part of the digest: another value is a typo (or a
// format this implementation does not know) that would be admitted as it
// is.
var manifestVersions = []string{"aip-manifest/v1", "1.0"}

// Validate checks a manifest as a host binds its own (hostsdk, and
// aip-sidecar for a local connector): what ValidateShape checks, a
// manifest_version of manifestVersions, every capability with a
// contract that declares its side effects (an empty side_effects list
// reads as "may write" too), and every channel ID one CheckChannelID
// takes: a host could never deliver an event on another, and its
// connector would learn so only when its first event was refused. AIP
// bounds a channel ID only in length, so that rule is a host's too, not
// ValidateShape's. AIP leaves the contract optional, but a host
// decides by it
// what an action cut off by a crash, or answered with something unusable,
// becomes: only a capability whose side_effects say it only reads
// (hostsdk.ReadOnly) fails retryable, any other is outcome_unknown.
// Without one a read would be taken for a write silently; the connector
// must say what the capability does.
func (m *Manifest) Validate() error {
	if err := m.ValidateShape(); err != nil {
		return err
	}
	if !slices.Contains(manifestVersions, m.ManifestVersion) {
		return fmt.Errorf("manifest_version is %q; want %q (the form AIP connectors write; %q, the form of its registry examples, is accepted too)",
			m.ManifestVersion, manifestVersions[0], manifestVersions[1])
	}
	for i := range m.Capabilities {
		c := &m.Capabilities[i]
		if c.Contract == nil {
			return fmt.Errorf("capability %s has no contract; declare one with side_effects ([\"read\"] for a capability that changes nothing), idempotency, execution and data (manifest.schema.json in docs/sidecar-protocol.md)", c.ID)
		}
		if len(c.Contract.SideEffects) == 0 {
			return fmt.Errorf("capability %s contract: side_effects is empty; declare what the capability does ([\"read\"] for one that changes nothing)", c.ID)
		}
	}
	for i, raw := range m.Channels {
		if err := checkChannelIDs(raw); err != nil {
			return fmt.Errorf("channels[%d]%w", i, err)
		}
	}
	return nil
}

// checkChannelIDs checks with CheckChannelID the channel IDs a channel
// entry of a shape checkChannel takes declares: the string, or the
// object's "id" and "channel_id". The error starts with the member that
// names it (.id, .channel_id, or nothing for a string) and a colon.
func checkChannelIDs(raw json.RawMessage) error {
	for _, n := range channelEntryIDs(raw) {
		if err := CheckChannelID(n.id); err != nil {
			if n.member == "" {
				return fmt.Errorf(": %w", err)
			}
			return fmt.Errorf(".%s: %w", n.member, err)
		}
	}
	return nil
}

// channelName is a channel ID a channel entry declares, and the object
// member naming it ("" for an entry that is the ID, a string).
type channelName struct{ member, id string }

// channelEntryIDs returns the channel IDs a channel entry declares: the
// entry itself when it is a string, else its "id" and "channel_id"
// members that are strings; empty strings are skipped (ValidateShape
// refuses them).
func channelEntryIDs(raw json.RawMessage) []channelName {
	var id string
	if json.Unmarshal(raw, &id) == nil {
		if id == "" {
			return nil
		}
		return []channelName{{"", id}}
	}
	var o map[string]json.RawMessage
	if json.Unmarshal(raw, &o) != nil {
		return nil
	}
	var out []channelName
	for _, k := range []string{"id", "channel_id"} {
		if json.Unmarshal(o[k], &id) == nil && id != "" {
			out = append(out, channelName{k, id})
		}
	}
	return out
}

// ChannelIDs returns the channel IDs the manifest declares, in the order
// of its channel entries (an entry is the ID, a string, or an object
// naming it in "id" or "channel_id"; an object with both declares both).
// An entry of another shape declares none; ValidateShape refuses it.
func (m *Manifest) ChannelIDs() []string {
	var out []string
	for _, raw := range m.Channels {
		for _, n := range channelEntryIDs(raw) {
			out = append(out, n.id)
		}
	}
	return out
}

// ValidateShape checks what AIP itself requires of a manifest: a
// non-empty version, a valid agent, unique valid capabilities, at least
// one profile and channel entries of the shapes Channels describes. It is the check for a manifest another
// implementation may have written (a version the registry admits, a
// manifest message): AIP does not constrain manifest_version, and leaves
// a capability's contract optional, so those rules of Validate are a
// host's, for the manifest it binds.
func (m *Manifest) ValidateShape() error {
	if m.ManifestVersion == "" {
		return errors.New("manifest_version is empty")
	}
	if err := m.Agent.Validate(); err != nil {
		return fmt.Errorf("manifest agent: %w", err)
	}
	if len(m.Profiles) == 0 {
		return errors.New("manifest lists no profiles")
	}
	seen := make(map[string]bool, len(m.Capabilities))
	for i := range m.Capabilities {
		c := &m.Capabilities[i]
		if err := c.Validate(); err != nil {
			return err
		}
		if seen[c.ID] {
			return fmt.Errorf("capability %s is listed twice", c.ID)
		}
		seen[c.ID] = true
	}
	for i, raw := range m.Channels {
		if err := checkChannel(raw); err != nil {
			return fmt.Errorf("channels[%d] %w", i, err)
		}
	}
	return nil
}

// checkChannel checks a manifest's channel entry has one of the shapes
// Manifest.Channels describes: a channel ID as a non-empty JSON string, or
// an object naming it in a non-empty string "id" or "channel_id". Another
// (42, null, {"name":"x"}) declared no channel, and a connector learned so
// only when publishing on it failed.
func checkChannel(raw json.RawMessage) error {
	const want = `; declare a channel as its ID, a JSON string ("tickets.changes"), or an object naming it in "id" (or "channel_id"): {"id":"tickets.changes"}`
	if !json.Valid(raw) {
		return fmt.Errorf("is not JSON: %s", TruncateUTF8(string(raw), 64))
	}
	var v any
	_ = json.Unmarshal(raw, &v)
	switch v := v.(type) {
	case string:
		if v == "" {
			return errors.New("is an empty string" + want)
		}
		return nil
	case map[string]any:
		named := false
		for _, k := range []string{"id", "channel_id"} {
			if x, ok := v[k]; ok {
				s, isString := x.(string)
				if !isString || s == "" {
					return fmt.Errorf("has %q %s, not a channel ID%s", k, TruncateUTF8(compactJSON(x), 64), want)
				}
				named = true
			}
		}
		if !named {
			return errors.New(`is an object without "id" or "channel_id"` + want)
		}
		return nil
	default:
		return fmt.Errorf("is %s, neither a string nor an object%s", TruncateUTF8(string(raw), 64), want)
	}
}

// compactJSON writes v (decoded JSON) back as JSON for an error.
func compactJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Capability returns the capability with the given ID.
func (m *Manifest) Capability(id string) (*Capability, bool) {
	for i := range m.Capabilities {
		if m.Capabilities[i].ID == id {
			return &m.Capabilities[i], true
		}
	}
	return nil, false
}

// ManifestDigest returns the digest of the manifest as bound to a version:
// the canonical manifest without agent.did (the DID is per replica, so every
// replica of a version shares one digest).
func ManifestDigest(m *Manifest) (string, error) {
	bound := *m
	bound.Agent.DID = ""
	return Digest(&bound)
}

// CapabilityDigests returns a capability's contract digest (of the whole
// canonical capability) and schema digest (of {"input":..., "output":...}).
func CapabilityDigests(c *Capability) (contract, schema string, err error) {
	contract, err = Digest(c)
	if err != nil {
		return "", "", err
	}
	output := c.OutputSchema
	if len(output) == 0 {
		output = json.RawMessage("null")
	}
	schema, err = Digest(map[string]json.RawMessage{"input": c.InputSchema, "output": output})
	if err != nil {
		return "", "", err
	}
	return contract, schema, nil
}
