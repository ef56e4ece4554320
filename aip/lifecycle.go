package aip

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Lifecycle protocol constants.
const (
	// ControlPath is the single route of the lifecycle service.
	ControlPath = "/aip/v1/connector-control"
	// MaxControlBytes bounds a lifecycle request or response body.
	MaxControlBytes = 64 << 10
	// MessagesPath is the native AIP ingress of a connector host.
	MessagesPath = "/aip/v1/messages"
	// MaxMessageBytes bounds a native message body.
	MaxMessageBytes = 4 << 20
	// NativeHTTPProfile is the transport profile of native AIP over HTTP.
	NativeHTTPProfile = "aip.native.http.v1"
	// MaxRequestIDBytes bounds a lifecycle request ID.
	MaxRequestIDBytes = 256
	// MaxErrorMessageBytes bounds the message of a rejection.
	MaxErrorMessageBytes = 1024
)

// Lifecycle rejection codes.
const (
	CodeControlRejected        = "connector_control.rejected"
	CodeControlUnavailable     = "connector_control.unavailable"
	CodeControlResponseSigning = "connector_control.response_signing"
)

// Operation is a lifecycle command.
type Operation string

// Lifecycle operations.
const (
	OpRegister  Operation = "register"
	OpHeartbeat Operation = "heartbeat"
	OpDrain     Operation = "drain"
	OpOffline   Operation = "offline"
)

// Valid reports whether o is a known operation.
func (o Operation) Valid() bool { return oneOf(o, OpRegister, OpHeartbeat, OpDrain, OpOffline) }

// ControlRequest is the signed inner object of a lifecycle request.
type ControlRequest struct {
	RequestID string         `json:"request_id"`
	IssuedAt  Timestamp      `json:"issued_at"`
	ExpiresAt Timestamp      `json:"expires_at"`
	SignerDID string         `json:"signer_did"`
	Command   ControlCommand `json:"command"`
}

// ControlCommand is adjacently tagged: {"operation": "...", "payload": {...}}.
// Exactly one of Register, Heartbeat or Transition is set: Register for
// register, Heartbeat for heartbeat, Transition for drain and offline.
type ControlCommand struct {
	Operation  Operation
	Register   *Registration
	Heartbeat  *Heartbeat
	Transition *Transition

	// RawPayload is the payload exactly as received (set by UnmarshalJSON),
	// so digests cover members this version does not know.
	RawPayload json.RawMessage
}

// RegisterCommand returns a register command.
func RegisterCommand(r Registration) ControlCommand {
	return ControlCommand{Operation: OpRegister, Register: &r}
}

// HeartbeatCommand returns a heartbeat command.
func HeartbeatCommand(h Heartbeat) ControlCommand {
	return ControlCommand{Operation: OpHeartbeat, Heartbeat: &h}
}

// TransitionCommand returns a drain or offline command.
func TransitionCommand(op Operation, t Transition) ControlCommand {
	return ControlCommand{Operation: op, Transition: &t}
}

func (c *ControlCommand) payload() (any, error) {
	switch c.Operation {
	case OpRegister:
		if c.Register != nil {
			return c.Register, nil
		}
	case OpHeartbeat:
		if c.Heartbeat != nil {
			return c.Heartbeat, nil
		}
	case OpDrain, OpOffline:
		if c.Transition != nil {
			return c.Transition, nil
		}
	default:
		return nil, fmt.Errorf("aip: unknown lifecycle operation %q", c.Operation)
	}
	return nil, fmt.Errorf("aip: lifecycle %s command has no payload", c.Operation)
}

// MarshalJSON implements json.Marshaler.
func (c ControlCommand) MarshalJSON() ([]byte, error) {
	p, err := c.payload()
	if err != nil {
		return nil, err
	}
	return json.Marshal(struct {
		Operation Operation `json:"operation"`
		Payload   any       `json:"payload"`
	}{c.Operation, p})
}

// UnmarshalJSON implements json.Unmarshaler.
func (c *ControlCommand) UnmarshalJSON(data []byte) error {
	var w struct {
		Operation Operation       `json:"operation"`
		Payload   json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	*c = ControlCommand{Operation: w.Operation, RawPayload: w.Payload}
	if len(w.Payload) == 0 || bytes.Equal(w.Payload, []byte("null")) {
		return fmt.Errorf("aip: lifecycle %q command has no payload", w.Operation)
	}
	var target any
	switch w.Operation {
	case OpRegister:
		c.Register = new(Registration)
		target = c.Register
	case OpHeartbeat:
		c.Heartbeat = new(Heartbeat)
		target = c.Heartbeat
	case OpDrain, OpOffline:
		c.Transition = new(Transition)
		target = c.Transition
	default:
		return fmt.Errorf("aip: unknown lifecycle operation %q", w.Operation)
	}
	if err := json.Unmarshal(w.Payload, target); err != nil {
		return fmt.Errorf("aip: lifecycle %s payload: %w", w.Operation, err)
	}
	return nil
}

// ReplicaID returns the replica the command is about.
func (c *ControlCommand) ReplicaID() string {
	switch {
	case c.Register != nil:
		return c.Register.Replica.ID
	case c.Heartbeat != nil:
		return c.Heartbeat.ReplicaID
	case c.Transition != nil:
		return c.Transition.ReplicaID
	}
	return ""
}

// Topology places a replica: region, zone and capacity class.
type Topology struct {
	Region        string `json:"region"`
	Zone          string `json:"zone"`
	CapacityClass string `json:"capacity_class"`
}

// Default topology labels.
const (
	DefaultRegion        = "global"
	DefaultZone          = "default"
	DefaultCapacityClass = "standard"
)

// DefaultTopology returns global/default/standard.
func DefaultTopology() Topology {
	return Topology{Region: DefaultRegion, Zone: DefaultZone, CapacityClass: DefaultCapacityClass}
}

// Replica is a connector replica as carried by a register request: the
// pre-provisioned identity plus the host's proposed state.
type Replica struct {
	ID                       string        `json:"id"`
	InstanceID               string        `json:"instance_id"`
	VersionID                string        `json:"version_id"`
	Endpoint                 string        `json:"endpoint"`
	PeerPrincipalID          string        `json:"peer_principal_id"`
	PeerPrincipalKind        PrincipalKind `json:"peer_principal_kind"`
	PeerDID                  string        `json:"peer_did"`
	TrustDomain              string        `json:"trust_domain"`
	TransportProfile         string        `json:"transport_profile"`
	Topology                 Topology      `json:"topology"`
	Status                   ReplicaStatus `json:"status"`
	LeaseExpiresAt           Timestamp     `json:"lease_expires_at"`
	Capacity                 uint32        `json:"capacity"`
	ActiveAssignments        uint32        `json:"active_assignments"`
	HealthRevision           uint64        `json:"health_revision"`
	LastControlRequestID     string        `json:"last_control_request_id,omitempty"`
	LastControlRequestDigest string        `json:"last_control_request_digest,omitempty"`
}

// Registration is the register payload: the replica proposal and the claims
// the control plane compares with the registry.
type Registration struct {
	Replica           Replica `json:"replica"`
	ManifestDigest    string  `json:"manifest_digest"`
	ArtifactDigest    string  `json:"artifact_digest"`
	TenantID          string  `json:"tenant_id"`
	ConfigRevision    uint64  `json:"config_revision"`
	SecretProviderRef string  `json:"secret_provider_ref"`
	CapabilityCount   uint32  `json:"capability_count"`
}

// Heartbeat is the heartbeat payload.
type Heartbeat struct {
	ReplicaID        string `json:"replica_id"`
	PreviousSequence uint64 `json:"previous_sequence"`
	InFlight         uint32 `json:"in_flight"`
	ConnectorReady   bool   `json:"connector_ready"`
}

// Transition is the drain and offline payload.
type Transition struct {
	ReplicaID        string `json:"replica_id"`
	PreviousSequence uint64 `json:"previous_sequence"`
}

// ControlResponse is the signed inner object of a lifecycle response.
type ControlResponse struct {
	RequestID string         `json:"request_id"`
	IssuedAt  Timestamp      `json:"issued_at"`
	ExpiresAt Timestamp      `json:"expires_at"`
	SignerDID string         `json:"signer_did"`
	Outcome   ControlOutcome `json:"outcome"`
}

// OutcomeStatus tags a ControlOutcome.
type OutcomeStatus string

// Outcome statuses.
const (
	OutcomeLease    OutcomeStatus = "lease"
	OutcomeOffline  OutcomeStatus = "offline"
	OutcomeRejected OutcomeStatus = "rejected"
)

// The wording of a registration refused because the replica's lease is
// still live, which aipfleet's control plane gives and a host reads to
// wait for that lease (the wire's rejected outcome has no structured
// detail): the message is ControlRuleLeaseLive, ": ", and a reason that
// holds LeaseUntilPhrase followed by the lease's expiry (RFC 3339). A
// request refused under the replay rule (a request ID decided already,
// whose replay is no longer answered with that decision) starts with
// ControlRuleReplay and ": ", which a host waiting for the control plane
// reads to register afresh. A heartbeat or drain refused because the
// replica holds no lease at its previous_sequence — the registry is at
// another sequence (ControlRuleSequence: a newer lifecycle request won the
// fence), or the replica is offline or its lease expired
// (ControlRuleState) — starts with that rule and ": ", which a host reads
// to end its local lease at once. A registration refused because its
// signer is not the replica's pre-provisioned DID reads "signer_did DID"
// followed by SignerNotProvisionedPhrase and the replica ID; one for a
// replica the registry does not hold holds NotProvisionedPhrase: a host
// reads both as a setting of its own to fix.
const (
	ControlRuleLeaseLive       = "lease_live"
	LeaseUntilPhrase           = " with a lease until "
	ControlRuleReplay          = "replay"
	ControlRuleSequence        = "sequence"
	ControlRuleState           = "state"
	SignerNotProvisionedPhrase = " is not the DID pre-provisioned for replica "
	NotProvisionedPhrase       = " is not pre-provisioned; an operator must create it"
)

// ControlOutcome is internally tagged by "status": {"status":"lease",
// "lease":{...}}, {"status":"offline"} or {"status":"rejected","code":...,
// "message":...,"retryable":...}.
type ControlOutcome struct {
	Status    OutcomeStatus
	Lease     *Lease
	Code      string
	Message   string
	Retryable bool
}

// Lease is what register, heartbeat and drain grant: the sequence (the
// replica's health revision) to send back as previous_sequence, and the
// authoritative expiry.
type Lease struct {
	Sequence  uint64    `json:"sequence"`
	ExpiresAt Timestamp `json:"expires_at"`
}

// LeaseOutcome returns a lease outcome.
func LeaseOutcome(l Lease) ControlOutcome { return ControlOutcome{Status: OutcomeLease, Lease: &l} }

// OfflineOutcome returns the offline outcome.
func OfflineOutcome() ControlOutcome { return ControlOutcome{Status: OutcomeOffline} }

// RejectedOutcome returns a rejection; the message is cut to
// MaxErrorMessageBytes.
func RejectedOutcome(code, message string, retryable bool) ControlOutcome {
	return ControlOutcome{Status: OutcomeRejected, Code: code, Message: TruncateUTF8(message, MaxErrorMessageBytes), Retryable: retryable}
}

// MarshalJSON implements json.Marshaler.
func (o ControlOutcome) MarshalJSON() ([]byte, error) {
	switch o.Status {
	case OutcomeLease:
		if o.Lease == nil {
			return nil, errors.New("aip: lease outcome without a lease")
		}
		return json.Marshal(struct {
			Status OutcomeStatus `json:"status"`
			Lease  *Lease        `json:"lease"`
		}{o.Status, o.Lease})
	case OutcomeOffline:
		return json.Marshal(struct {
			Status OutcomeStatus `json:"status"`
		}{o.Status})
	case OutcomeRejected:
		return json.Marshal(struct {
			Status    OutcomeStatus `json:"status"`
			Code      string        `json:"code"`
			Message   string        `json:"message"`
			Retryable bool          `json:"retryable"`
		}{o.Status, o.Code, o.Message, o.Retryable})
	}
	return nil, fmt.Errorf("aip: unknown outcome status %q", o.Status)
}

// controlOutcomeWire is the members a ControlOutcome is read from.
type controlOutcomeWire struct {
	Status    OutcomeStatus `json:"status"`
	Lease     *Lease        `json:"lease"`
	Code      string        `json:"code"`
	Message   string        `json:"message"`
	Retryable bool          `json:"retryable"`
}

// UnmarshalJSON implements json.Unmarshaler.
func (o *ControlOutcome) UnmarshalJSON(data []byte) error {
	var w controlOutcomeWire
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	*o = ControlOutcome(w)
	switch w.Status {
	case OutcomeLease:
		if w.Lease == nil {
			return errors.New("aip: lease outcome without a lease")
		}
	case OutcomeOffline:
	case OutcomeRejected:
		if w.Code == "" {
			return errors.New("aip: rejected outcome without a code")
		}
	default:
		return fmt.Errorf("aip: unknown outcome status %q", w.Status)
	}
	return nil
}

// ControlRequestDigest returns the digest the control plane records for
// replay: the digest of {"request_id", "operation", "payload"} with the
// payload as received.
func ControlRequestDigest(req *ControlRequest) (string, error) {
	payload := req.Command.RawPayload
	if len(payload) == 0 {
		p, err := req.Command.payload()
		if err != nil {
			return "", err
		}
		if payload, err = json.Marshal(p); err != nil {
			return "", err
		}
	}
	idJSON, err := json.Marshal(req.RequestID)
	if err != nil {
		return "", err
	}
	buf := make([]byte, 0, len(payload)+len(idJSON)+64)
	buf = append(buf, `{"operation":"`...)
	buf = append(buf, req.Command.Operation...)
	buf = append(buf, `","payload":`...)
	buf = append(buf, payload...)
	buf = append(buf, `,"request_id":`...)
	buf = append(buf, idJSON...)
	buf = append(buf, '}')
	return DigestJSON(buf)
}

// ConnectorRoute is the pinned route a dispatcher puts in
// security.connector_route of a native action envelope. The host checks it
// against its own identity before running anything.
type ConnectorRoute struct {
	ActionID              string      `json:"action_id"`
	CapabilityID          string      `json:"capability_id"`
	TenantID              string      `json:"tenant_id"`
	InstanceID            string      `json:"instance_id"`
	ReplicaID             string      `json:"replica_id"`
	VersionID             string      `json:"version_id"`
	ManifestDigest        string      `json:"manifest_digest"`
	CatalogRevision       uint64      `json:"catalog_revision"`
	BindingPolicyRevision uint64      `json:"binding_policy_revision"`
	CredentialRevisionRef *string     `json:"credential_revision_ref"`
	QuotaPolicyRef        *string     `json:"quota_policy_ref"`
	ReplicaHealthRevision uint64      `json:"replica_health_revision"`
	FenceToken            string      `json:"fence_token"`
	OriginalMode          *ActionMode `json:"original_mode"`
}

// SecurityConnectorRoute is the security member carrying the ConnectorRoute.
const SecurityConnectorRoute = "connector_route"

// TruncateUTF8 cuts s to at most n bytes without splitting a UTF-8 sequence.
func TruncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}
