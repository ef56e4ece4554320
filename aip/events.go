package aip

import (
	"encoding/json"
	"strconv"
	"time"
)

// Provider events a connector host delivers to the fleet: the host sends
// its outbox batches as signed aip.discovery.v1.event_stream_response
// envelopes (body event_stream, no next_cursor) to the dispatcher's
// EventsPath, To the dispatcher's principal, with security.connector_event
// naming the sending replica; the dispatcher checks them against the
// registry, appends the events to the fleet's event log and answers with a
// signed event_stream of the events it stored.

// EventsPath is the dispatcher's connector-event ingress.
const EventsPath = "/aip/v1/connector-events"

// SecurityConnectorEvent is the security member carrying the
// ConnectorEvent of an event delivery.
const SecurityConnectorEvent = "connector_event"

// ConnectorEvent identifies the replica an event delivery comes from and
// the channel its events belong to (reference §5.6, §7.4). LeaseSequence
// is the replica's current lease sequence (its registry health revision).
type ConnectorEvent struct {
	TenantID       string `json:"tenant_id"`
	InstanceID     string `json:"instance_id"`
	ReplicaID      string `json:"replica_id"`
	VersionID      string `json:"version_id"`
	ManifestDigest string `json:"manifest_digest"`
	LeaseSequence  uint64 `json:"lease_sequence"`
	ChannelID      string `json:"channel_id"`
}

// Event delivery limits (reference §7.4, ConnectorEventIngressLimits).
const (
	// MaxEventsPerDelivery bounds the events of one delivery.
	MaxEventsPerDelivery = 100
	// MaxEventBytes bounds one event's JSON.
	MaxEventBytes = 256 << 10
	// MaxEventKindBytes bounds an event's kind.
	MaxEventKindBytes = 256
	// MaxChannelIDBytes bounds a channel ID.
	MaxChannelIDBytes = 256
	// MaxEventDataDepth bounds how deeply an event's data nests (the data
	// object itself is level 1): a delivery envelope holds the data five
	// levels down (body, event_stream, events, the event), and a signed
	// document nests at most maxCanonicalDepth levels, so deeper data
	// could never be signed into a delivery.
	MaxEventDataDepth = maxCanonicalDepth - 5
	// MaxEventDeliveryBytes bounds a delivery envelope.
	MaxEventDeliveryBytes = 4 << 20
	// MaxEventAnswerBytes bounds the dispatcher's answer to a delivery: the
	// delivered events as stored, each with its aip_connector stamp (a few
	// hundred bytes) and the envelope, so it may exceed the delivery.
	MaxEventAnswerBytes = MaxEventDeliveryBytes + 1<<20
)

// channelIDRule says what CheckChannelID takes.
var channelIDRule = "a channel ID is 1 to " + strconv.Itoa(MaxChannelIDBytes) + " bytes of UTF-8 text without control characters, invisible formatting characters (Unicode Cf) or white space at either end (spaces inside are fine), as the fleet's event log stores it; rename the channel"

// CheckChannelID checks a channel ID as the fleet's event log stores the
// channel_id of an event batch (registry.EventBatch.Validate holds it, as
// every registry identifier, to this rule): 1 to MaxChannelIDBytes bytes
// of UTF-8 text without control characters (unicode.IsControl), invisible
// formatting characters (Unicode Cf, FormatCharacter's) or white space
// (unicode.IsSpace) at either end. AIP itself bounds only the length
// (reference §7.4). It is the one rule for the channels a manifest
// declares (Manifest.Validate: a host refuses at start-up a channel it
// could never deliver events on) and for the channel hostsdk's
// EventPublisher.Publish is given. The error, matching ErrInvalidID,
// names the channel, the character refused (quoted, its code point and
// byte offset) and what a channel ID may be.
func CheckChannelID(id string) error {
	q := strconv.Quote(TruncateUTF8(id, 64))
	if len(id) > 64 {
		q += "..."
	}
	switch {
	case id == "":
		return reasonf(ErrInvalidID, "channel ID is empty; %s", channelIDRule)
	case len(id) > MaxChannelIDBytes:
		return reasonf(ErrInvalidID, "channel ID %s is %d bytes; %s", q, len(id), channelIDRule)
	}
	if fault := IdentifierCharFault(id); fault != "" {
		return reasonf(ErrInvalidID, "channel ID %s %s; %s", q, fault, channelIDRule)
	}
	return nil
}

// MaxEventDeliveryAge is how old a delivery's sent_at may be (a host
// retries a batch for up to a day); a delivery may be at most
// MaxEnvelopeSkew ahead of the receiver's clock.
const MaxEventDeliveryAge = 24 * time.Hour

// Error codes of the connector-event ingress.
const (
	CodeEventInvalid             = "connector_event.invalid"
	CodeEventNotAuthorized       = "connector_event.not_authorized"
	CodeEventUnavailable         = "connector_event.unavailable"
	CodeEventCapacity            = "connector_event.capacity"
	CodeEventIdempotencyConflict = "connector_event.idempotency_conflict"
)

// EventRefusalDetails are the details of a connector_event.unavailable
// refusal whose cause the sender can act on at once. It is an aipfleet
// extension: the code, category and retry hint are upstream's, and a
// sender that ignores the details retries as upstream's does.
type EventRefusalDetails struct {
	// Reason is EventReasonStaleLeaseSequence.
	Reason string `json:"reason"`
	// LeaseSequence is the replica's lease sequence in the registry when
	// the delivery was checked.
	LeaseSequence uint64 `json:"lease_sequence,omitempty"`
}

// EventReasonStaleLeaseSequence: the delivery's lease_sequence is not the
// replica's current one (a heartbeat renewed the lease after the delivery
// was signed). A host that holds a newer lease signs the delivery again
// with it and sends it at once.
const EventReasonStaleLeaseSequence = "stale_lease_sequence"

// MemberPath is the step of a JSON path, as error messages name a value,
// to an object member named name: .name for a plain identifier (at most 64
// bytes of letters, digits and '_', not starting with a digit), otherwise
// ["name"] with the name JSON-quoted and cut to 64 bytes.
func MemberPath(name string) string {
	plain := name != "" && len(name) <= 64
	for i := 0; plain && i < len(name); i++ {
		c := name[i]
		plain = c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9'
	}
	if plain {
		return "." + name
	}
	q, _ := json.Marshal(TruncateUTF8(name, 64))
	return "[" + string(q) + "]"
}
