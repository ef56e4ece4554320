package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/readbudget"
	"github.com/aipfleet/aipfleet/registry"
)

// The connector-event ingress (POST aip.EventsPath) and the tenants' event
// log read (GET PathEvents); docs/dispatch-api.md describes both.

// PathEvents is the tenant's read of its event log.
const PathEvents = "/aip/v1/events"

// Bounds of GET /aip/v1/events: a page holds DefaultEventPageLimit events
// unless limit says otherwise, at most registry.MaxEventPage, and stops
// (with more set) before its events' data pass MaxEventPageBytes; it
// always holds at least one event when one follows.
const (
	DefaultEventPageLimit = 100
	MaxEventPageBytes     = 8 << 20
	// eventReadChunk is how many events a page reads from the log at once.
	eventReadChunk = 32
)

// MaxEventFutureSkew bounds how far an event's occurred_at may be ahead of
// the dispatcher's clock.
const MaxEventFutureSkew = 5 * time.Minute

// ConnectorStamp is what the ingress writes into each event's
// data.aip_connector (registry.EventProvenance): the replica the delivery
// came from, verified against the registry.
type ConnectorStamp struct {
	InstanceID    string `json:"instance_id"`
	ReplicaID     string `json:"replica_id"`
	VersionID     string `json:"version_id"`
	ChannelID     string `json:"channel_id"`
	LeaseSequence uint64 `json:"lease_sequence"`
}

// EventsResponse is one page of GET /aip/v1/events.
type EventsResponse struct {
	Events []EventRecord `json:"events"`
	// NextAfter is the sequence of the last event returned (the request's
	// after when the page is empty): the next page's after.
	NextAfter uint64 `json:"next_after"`
	// More is true when events after NextAfter exist now.
	More bool `json:"more"`
}

// EventRecord is one event of a tenant's log.
type EventRecord struct {
	Sequence   uint64    `json:"sequence"`
	ChannelID  string    `json:"channel_id"`
	InstanceID string    `json:"instance_id"`
	Event      aip.Event `json:"event"`
}

// answerOverhead bounds the bytes of an answer besides its events (the
// envelope, principals, signature).
const answerOverhead = 4 << 10

// eventsRetryAfter is the retry_after of a temporary refusal (and of a
// refusal because the sender's address holds its share of the read
// budget); eventsCapacityRetryAfter of a refusal for capacity (reference
// §7.4).
const (
	eventsRetryAfter         = time.Second
	eventsCapacityRetryAfter = 100 * time.Millisecond
)

// The read budget of deliveries (Config.MaxEventBodyBytes) gives one
// sender address at most eventsPeerShareDivisor-th of it, and never less
// than the largest delivery. A delivery over its address's share waits for
// that address's own deliveries at most eventsPeerWait, then is refused
// with a signed, retryable connector_event.capacity (retry after
// eventsRetryAfter): a host's deliveries are read in milliseconds, so a
// delivery that waited that long is behind slow or hostile senders at its
// address; its host keeps the batch and delivers again, and the refusal
// frees the connection instead of parking it for the server's ReadTimeout.
const (
	eventsPeerShareDivisor = readbudget.DefaultPeerShareDivisor
	eventsPeerWait         = 2 * time.Second
)

// newEventBodies returns the read budget of deliveries.
func newEventBodies(total int64) (*readbudget.Budget, error) {
	return readbudget.New(readbudget.Config{
		Total:       total,
		PeerShare:   max(total/eventsPeerShareDivisor, aip.MaxEventDeliveryBytes),
		MaxPeerWait: eventsPeerWait,
	})
}

// eventRefusal is a refusal of a delivery: the HTTP status, the
// connector_event code and what to fix. peerBusy marks a refusal because
// the sender's address holds its share of the read budget.
type eventRefusal struct {
	status   int
	code     string
	msg      string
	peerBusy bool
	// details, when set, are the error's details
	// (aip.EventRefusalDetails).
	details *aip.EventRefusalDetails
}

func refuseEvent(status int, code, format string, args ...any) *eventRefusal {
	return &eventRefusal{status: status, code: code, msg: fmt.Sprintf(format, args...)}
}

func invalidEvent(format string, args ...any) *eventRefusal {
	return refuseEvent(http.StatusBadRequest, aip.CodeEventInvalid, format, args...)
}

func unauthorizedEvent(format string, args ...any) *eventRefusal {
	return refuseEvent(http.StatusForbidden, aip.CodeEventNotAuthorized, format, args...)
}

func unavailableEvent(format string, args ...any) *eventRefusal {
	return refuseEvent(http.StatusServiceUnavailable, aip.CodeEventUnavailable, format, args...)
}

// protocolError is the refusal as an AIP error.
func (r *eventRefusal) protocolError() *aip.ProtocolError {
	var pe *aip.ProtocolError
	switch r.code {
	case aip.CodeEventUnavailable:
		pe = aip.NewProtocolError(r.code, aip.CategoryTemporary, true, uint64(eventsRetryAfter.Milliseconds()), aip.TruncateUTF8(r.msg, aip.MaxErrorMessageBytes))
	case aip.CodeEventCapacity:
		after := eventsCapacityRetryAfter
		if r.peerBusy {
			after = eventsRetryAfter
		}
		pe = aip.NewProtocolError(r.code, aip.CategoryTemporary, true, uint64(after.Milliseconds()), aip.TruncateUTF8(r.msg, aip.MaxErrorMessageBytes))
	case aip.CodeEventNotAuthorized:
		pe = aip.NewProtocolError(r.code, aip.CategoryAuth, false, 0, aip.TruncateUTF8(r.msg, aip.MaxErrorMessageBytes))
	default:
		pe = aip.NewProtocolError(r.code, aip.CategoryPermanent, false, 0, aip.TruncateUTF8(r.msg, aip.MaxErrorMessageBytes))
	}
	pe.Source = errorSource
	if r.details != nil {
		pe.Details, _ = json.Marshal(r.details)
	}
	return pe
}

// result is the metrics label of the refusal.
func (r *eventRefusal) result() string {
	switch r.code {
	case aip.CodeEventInvalid:
		return "invalid"
	case aip.CodeEventNotAuthorized:
		return "not_authorized"
	case aip.CodeEventIdempotencyConflict:
		return "idempotency_conflict"
	case aip.CodeEventCapacity:
		if r.peerBusy {
			return "peer_capacity"
		}
		return "capacity"
	}
	return "unavailable"
}

// delivery is one connector-event delivery being checked.
type delivery struct {
	env     *aip.Envelope
	signer  string
	ce      aip.ConnectorEvent
	replica registry.ConnectorReplica
	// trustDomain is the sender's, once known: the answer's From carries
	// it, as the action envelopes to that replica do.
	trustDomain string
	// authenticated is set once the delivery is known to be the
	// registered replica's: signed by its DID, from its principal in its
	// trust domain. A permanent refusal before that is answered unsigned
	// (answerUnsigned).
	authenticated bool
}

// handleConnectorEvents serves POST aip.EventsPath: a replica's signed
// event delivery, checked against the registry (checkDelivery), appended
// to its tenant's event log and answered with a signed event_stream of the
// events as stored (less those the log pruned, which it does not store
// again). Every refusal is a signed error envelope, but a permanent one
// of a delivery not authenticated as the registered replica's, which is
// unsigned (answerUnsigned).
func (d *Dispatcher) handleConnectorEvents() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var dl delivery
		stored, ref := d.receiveEvents(r, w, &dl)
		if ref != nil {
			d.m.eventDeliveries.WithLabelValues(ref.result()).Inc()
			level := d.log.Info
			if ref.status >= 500 {
				level = d.log.Warn
			}
			level("event delivery refused", "code", ref.code, "status", ref.status, "replica_id", dl.ce.ReplicaID,
				"instance_id", dl.ce.InstanceID, "channel_id", dl.ce.ChannelID, "reason", ref.msg)
			if !dl.authenticated && !ref.temporary() {
				answerUnsigned(w, ref)
				return
			}
			d.answerDelivery(w, &dl, ref.status, aip.Body{Error: &aip.ErrorBody{Error: *ref.protocolError()}})
			return
		}
		d.m.eventDeliveries.WithLabelValues("accepted").Inc()
		// An event the log stored once and has pruned since is not
		// stored again (registry.EventLog): the delivery is answered as
		// delivered, so the host drops it from its outbox, and the answer
		// lists only the events the log holds.
		events := make([]aip.Event, 0, len(stored))
		pruned := 0
		for i := range stored {
			if stored[i].Pruned {
				pruned++
				continue
			}
			events = append(events, stored[i].Event)
		}
		d.m.eventsStored.Add(float64(len(events)))
		if pruned > 0 {
			d.log.Info("event delivery: events the log stored and pruned long ago were delivered again; not stored again",
				"replica_id", dl.ce.ReplicaID, "instance_id", dl.ce.InstanceID, "channel_id", dl.ce.ChannelID, "pruned", pruned)
		}
		d.answerDelivery(w, &dl, http.StatusOK, aip.Body{EventStream: &aip.EventStream{Events: events}})
	})
}

// receiveEvents reads, verifies and appends one delivery.
func (d *Dispatcher) receiveEvents(r *http.Request, w http.ResponseWriter, dl *delivery) ([]registry.StoredEvent, *eventRefusal) {
	if r.ContentLength > aip.MaxEventDeliveryBytes {
		return nil, refuseEvent(http.StatusRequestEntityTooLarge, aip.CodeEventInvalid,
			"the delivery exceeds %d bytes; send fewer or smaller events per delivery", aip.MaxEventDeliveryBytes)
	}
	// The body is read only within the budget of Config.MaxEventBodyBytes:
	// this route needs no token, so concurrent deliveries must not hold
	// unbounded memory before their signatures are checked, and one
	// sender address holds at most its share (see newEventBodies). Once
	// granted, the body must arrive at the budget's minimum rate.
	need := int64(aip.MaxEventDeliveryBytes)
	if r.ContentLength >= 0 {
		need = r.ContentLength
	}
	release, err := d.eventBodies.Acquire(r.Context(), r.RemoteAddr, need)
	if errors.Is(err, readbudget.ErrPeerBusy) {
		ref := refuseEvent(http.StatusServiceUnavailable, aip.CodeEventCapacity,
			"this sender's address holds its share of the dispatcher's read budget with other deliveries still being read (%v); deliver again shortly", err)
		ref.peerBusy = true
		return nil, ref
	}
	if err != nil {
		return nil, invalidEvent("the delivery ended before its body could be read: %v", err)
	}
	defer release()
	// Without a read deadline on the connection, the server's ReadTimeout
	// still bounds the read.
	_ = d.eventBodies.SetReadDeadline(w, r, need)
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, aip.MaxEventDeliveryBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, refuseEvent(http.StatusRequestEntityTooLarge, aip.CodeEventInvalid,
				"the delivery exceeds %d bytes; send fewer or smaller events per delivery", aip.MaxEventDeliveryBytes)
		}
		// The read error names the connection's addresses (the
		// dispatcher's own, behind a proxy): this route needs no token,
		// so the refusal says only what happened, and the log has it.
		d.log.Debug("the body of an event delivery could not be read", "remote_addr", r.RemoteAddr, "error", err)
		if timedOut(err) {
			return nil, invalidEvent("the delivery's body did not arrive in time (at %d KiB/s at least, after a grace of %s)",
				readbudget.DefaultMinReadRate>>10, readbudget.DefaultReadGrace)
		}
		return nil, invalidEvent("the delivery's body could not be read")
	}
	if d.deps.Events == nil || d.deps.Records == nil {
		dl.env = probeEnvelope(raw)
		return nil, unavailableEvent("this dispatcher keeps no event log (it runs without Deps.Events); deliver events to a dispatcher that does")
	}
	// The checks and the append (registry reads, a database write) run for
	// at most Config.MaxEventDeliveries deliveries at once.
	select {
	case d.eventSlots <- struct{}{}:
		defer func() { <-d.eventSlots }()
	default:
		dl.env = probeEnvelope(raw)
		return nil, refuseEvent(http.StatusServiceUnavailable, aip.CodeEventCapacity,
			"the dispatcher is working on %d event deliveries already (Config.MaxEventDeliveries); deliver again shortly", cap(d.eventSlots))
	}
	if ref := d.verifyDelivery(r.Context(), raw, dl); ref != nil {
		return nil, ref
	}
	batch, ref := d.eventBatch(dl)
	if ref != nil {
		return nil, ref
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), d.cfg.RegistryTimeout)
	defer cancel()
	stored, err := d.deps.Events.AppendEvents(ctx, batch)
	switch {
	case err == nil:
		return stored, nil
	case errors.Is(err, registry.ErrConflict):
		return nil, refuseEvent(http.StatusConflict, aip.CodeEventIdempotencyConflict,
			"an event ID of this delivery is already stored with other content, or was and has been pruned (%v); give changed events new IDs", err)
	case errors.Is(err, registry.ErrInvalid):
		return nil, invalidEvent("the event log refused the batch: %v", err)
	}
	d.log.Warn("append events", "replica_id", dl.ce.ReplicaID, "error", err)
	return nil, unavailableEvent("the event log is unavailable; retry the same delivery")
}

// verifyDelivery checks the envelope and its sender (docs/dispatch-api.md
// lists the checks in order). Identity comes first, so a sender that is
// not the replica it names learns nothing about that replica's state.
func (d *Dispatcher) verifyDelivery(ctx context.Context, raw []byte, dl *delivery) *eventRefusal {
	v, err := aip.VerifyEnvelope(raw, "")
	if err != nil {
		dl.env = probeEnvelope(raw)
		if errors.Is(err, aip.ErrBadSignature) {
			return unauthorizedEvent("the delivery's signature does not verify: %v", err)
		}
		return invalidEvent("the delivery is not a valid AIP envelope: %v", err)
	}
	env := &v.Envelope
	dl.env, dl.signer = env, v.SignerDID
	if env.MessageType != aip.TypeEventStreamResponse || env.Body.EventStream == nil {
		return invalidEvent("message_type is %s; an event delivery is an %s with an event_stream body", env.MessageType, aip.TypeEventStreamResponse)
	}
	if env.Body.EventStream.NextCursor != nil {
		return invalidEvent("an event delivery carries no next_cursor")
	}
	ok, err := env.SecurityValue(aip.SecurityConnectorEvent, &dl.ce)
	switch {
	case err != nil:
		return invalidEvent("%v", err)
	case !ok:
		return invalidEvent("security.%s is missing: it names the sending replica and the channel", aip.SecurityConnectorEvent)
	case dl.ce.TenantID == "" || dl.ce.InstanceID == "" || dl.ce.ReplicaID == "" || dl.ce.VersionID == "" || dl.ce.ManifestDigest == "" || dl.ce.ChannelID == "":
		return invalidEvent("security.%s needs tenant_id, instance_id, replica_id, version_id, manifest_digest and channel_id", aip.SecurityConnectorEvent)
	}
	ce := &dl.ce
	rctx, cancel := context.WithTimeout(ctx, d.cfg.RegistryTimeout)
	defer cancel()

	rep, err := d.deps.Records.ConnectorReplica(rctx, ce.ReplicaID)
	if errors.Is(err, registry.ErrNotFound) {
		return unauthorizedEvent("replica %s is not registered", ce.ReplicaID)
	}
	if err != nil {
		return d.registryUnavailable("replica", err)
	}
	dl.replica = rep
	switch {
	case v.SignerDID != rep.PeerDID:
		return unauthorizedEvent("the delivery is signed by %s, not by replica %s's registered key", v.SignerDID, rep.ID)
	case env.From == nil || env.From.ID != rep.PeerPrincipalID || (env.From.Kind != "" && env.From.Kind != rep.PeerPrincipalKind):
		return unauthorizedEvent("the delivery is not from replica %s's principal %s", rep.ID, rep.PeerPrincipalID)
	case env.From.TrustDomain != rep.TrustDomain:
		return unauthorizedEvent("the delivery is from trust domain %q, not replica %s's %q", env.From.TrustDomain, rep.ID, rep.TrustDomain)
	}
	dl.trustDomain = rep.TrustDomain
	// From here on the delivery is the replica's: a refusal answers it
	// signed, so that the host can tell it from anybody's words (among
	// them the clock refusals below, whose sent_at a host compares with
	// its own clock).
	dl.authenticated = true
	if env.To == nil || env.To.ID != d.principal.ID || env.To.Kind != d.principal.Kind {
		to := "nobody"
		if env.To != nil {
			to = env.To.ID + " (" + string(env.To.Kind) + ")"
		}
		return unauthorizedEvent("the delivery is addressed to %s, not to this dispatcher (%s (%s)); set the host's gateway principal", to, d.principal.ID, d.principal.Kind)
	}
	now := d.cfg.Now()
	sent := env.SentAt.Time
	if sent.Before(now.Add(-aip.MaxEventDeliveryAge)) {
		return invalidEvent("sent_at %s is more than %s ago", env.SentAt, aip.MaxEventDeliveryAge)
	}
	if sent.After(now.Add(aip.MaxEnvelopeSkew)) {
		return invalidEvent("sent_at %s is more than %s ahead of the dispatcher's clock (%s); check the host's clock", env.SentAt, aip.MaxEnvelopeSkew, aip.At(now))
	}
	if rep.InstanceID != ce.InstanceID || rep.VersionID != ce.VersionID {
		return unauthorizedEvent("replica %s belongs to instance %s at version %s, not to instance %s at version %s",
			rep.ID, rep.InstanceID, rep.VersionID, ce.InstanceID, ce.VersionID)
	}
	inst, err := d.deps.Records.ConnectorInstance(rctx, rep.InstanceID)
	if errors.Is(err, registry.ErrNotFound) {
		return unauthorizedEvent("instance %s is not registered", rep.InstanceID)
	}
	if err != nil {
		return d.registryUnavailable("instance", err)
	}
	switch {
	case inst.TenantID != ce.TenantID:
		return unauthorizedEvent("instance %s does not belong to tenant %s", inst.ID, ce.TenantID)
	case inst.Status != registry.InstanceEnabled:
		return unauthorizedEvent("instance %s is %s", inst.ID, inst.Status)
	case rep.Status != aip.ReplicaReady && rep.Status != aip.ReplicaDraining:
		return unavailableEvent("replica %s is %s in the registry; deliver once it is registered again", rep.ID, rep.Status)
	case !rep.LeaseValid(d.cfg.Now()):
		return unavailableEvent("replica %s's lease expired at %s; deliver once it is renewed", rep.ID, aip.At(rep.LeaseExpiresAt))
	case rep.HealthRevision != ce.LeaseSequence:
		// The check stays exact (reference §7.4); the details tell the
		// host it may sign again with a newer lease at once.
		ref := unavailableEvent("lease_sequence %d is not replica %s's current lease sequence; deliver again with the current one", ce.LeaseSequence, rep.ID)
		ref.details = &aip.EventRefusalDetails{Reason: aip.EventReasonStaleLeaseSequence, LeaseSequence: rep.HealthRevision}
		return ref
	}
	ver, err := d.deps.Records.ConnectorVersion(rctx, rep.VersionID)
	if errors.Is(err, registry.ErrNotFound) {
		return unauthorizedEvent("version %s is not registered", rep.VersionID)
	}
	if err != nil {
		return d.registryUnavailable("version", err)
	}
	switch {
	case ver.Status != registry.VersionActive:
		return unauthorizedEvent("version %s is %s, not active", ver.ID, ver.Status)
	case ver.ManifestDigest != ce.ManifestDigest:
		return unauthorizedEvent("manifest_digest %s is not version %s's admitted manifest %s", ce.ManifestDigest, ver.ID, ver.ManifestDigest)
	case !declaresChannel(&ver.Manifest, ce.ChannelID):
		return unauthorizedEvent("version %s's manifest declares no channel %q", ver.ID, ce.ChannelID)
	}
	// A disabled connector type is switched off fleet-wide: its replicas
	// take no routes and append no events.
	typ, err := d.deps.Records.ConnectorType(rctx, inst.ConnectorTypeID)
	if errors.Is(err, registry.ErrNotFound) {
		return unauthorizedEvent("connector type %s is not registered", inst.ConnectorTypeID)
	}
	if err != nil {
		return d.registryUnavailable("connector type", err)
	}
	if !typ.Enabled {
		return unauthorizedEvent("connector type %s is disabled", typ.ID)
	}
	return nil
}

func (d *Dispatcher) registryUnavailable(what string, err error) *eventRefusal {
	d.log.Warn("event delivery: registry read", "record", what, "error", err)
	return unavailableEvent("the registry is unavailable; retry the same delivery")
}

// eventBatch checks the delivery's events and stamps each one's data with
// the sender (ConnectorStamp).
func (d *Dispatcher) eventBatch(dl *delivery) (registry.EventBatch, *eventRefusal) {
	ce := &dl.ce
	in := dl.env.Body.EventStream.Events
	if len(in) == 0 || len(in) > aip.MaxEventsPerDelivery {
		return registry.EventBatch{}, invalidEvent("a delivery holds 1 to %d events, not %d", aip.MaxEventsPerDelivery, len(in))
	}
	stamp, _ := json.Marshal(ConnectorStamp{InstanceID: ce.InstanceID, ReplicaID: ce.ReplicaID, VersionID: ce.VersionID,
		ChannelID: ce.ChannelID, LeaseSequence: ce.LeaseSequence})
	now := d.cfg.Now()
	out := make([]aip.Event, len(in))
	answerBytes := answerOverhead
	for i, e := range in {
		if err := aip.ValidateID(aip.PrefixEvent, e.ID); err != nil {
			return registry.EventBatch{}, invalidEvent("event %d: id: %v", i, err)
		}
		raw, err := json.Marshal(e)
		if err != nil {
			return registry.EventBatch{}, invalidEvent("event %s: %v", e.ID, err)
		}
		switch {
		case len(raw) > aip.MaxEventBytes:
			return registry.EventBatch{}, invalidEvent("event %s is %d bytes; at most %d", e.ID, len(raw), aip.MaxEventBytes)
		case e.Kind == "" || len(e.Kind) > registry.MaxEventKindBytes:
			return registry.EventBatch{}, invalidEvent("event %s: kind must be 1 to %d bytes", e.ID, registry.MaxEventKindBytes)
		case e.OccurredAt.IsZero():
			return registry.EventBatch{}, invalidEvent("event %s: occurred_at is missing", e.ID)
		case e.OccurredAt.After(now.Add(MaxEventFutureSkew)):
			return registry.EventBatch{}, invalidEvent("event %s: occurred_at %s is more than %s ahead of the dispatcher's clock", e.ID, e.OccurredAt, MaxEventFutureSkew)
		case e.Actor != nil:
			return registry.EventBatch{}, invalidEvent("event %s has an actor; a connector's events carry none (put the provider's actor in data)", e.ID)
		}
		data, err := stampData(e.Data, stamp, ce.TenantID)
		if err != nil {
			return registry.EventBatch{}, invalidEvent("event %s: %v", e.ID, err)
		}
		e.Data = data
		out[i] = e
		if raw, err := json.Marshal(e); err == nil {
			answerBytes += len(raw) + 1
		}
	}
	// The answer lists the events as stored, and a host reads at most
	// aip.MaxEventAnswerBytes of it: a delivery whose stamped events would
	// not fit is refused before anything is stored, or the host would
	// deliver it again forever. (A delivery within its own bound always
	// fits: the stamps of at most aip.MaxEventsPerDelivery events are far
	// smaller than the answer's margin.)
	if answerBytes > aip.MaxEventAnswerBytes-64<<10 {
		return registry.EventBatch{}, invalidEvent("the events with their aip_connector stamps are %d bytes, more than an answer may hold; deliver fewer events at once",
			answerBytes)
	}
	return registry.EventBatch{TenantID: ce.TenantID, InstanceID: ce.InstanceID, ReplicaID: ce.ReplicaID, VersionID: ce.VersionID,
		ChannelID: ce.ChannelID, LeaseSequence: ce.LeaseSequence, Events: out, ReceivedAt: now}, nil
}

// stampData returns data (a JSON object; absent is {}) in canonical JSON
// with member aip_connector set to stamp. data may already carry an equal
// aip_connector, never a different one, and an identity context naming no
// tenant but tenant (checkIdentityTenant).
func stampData(data json.RawMessage, stamp []byte, tenant string) (json.RawMessage, error) {
	obj := map[string]json.RawMessage{}
	if t := bytes.TrimSpace(data); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		if t[0] != '{' {
			return nil, errors.New("data must be a JSON object")
		}
		canon, err := aip.Canonicalize(t)
		if err != nil {
			return nil, fmt.Errorf("data: %v", err)
		}
		if err := json.Unmarshal(canon, &obj); err != nil {
			return nil, fmt.Errorf("data must be a JSON object: %v", err)
		}
	}
	if err := checkIdentityTenant(obj, tenant); err != nil {
		return nil, err
	}
	if old, ok := obj[registry.EventProvenance]; ok {
		a, errA := aip.Canonicalize(old)
		b, _ := aip.Canonicalize(stamp)
		if errA != nil || !bytes.Equal(a, b) {
			return nil, fmt.Errorf("data.%s is already set to another sender; leave it out, the dispatcher sets it", registry.EventProvenance)
		}
	}
	obj[registry.EventProvenance] = stamp
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	return aip.Canonicalize(raw)
}

// checkIdentityTenant refuses event data whose identity context
// (data.identity, an aip.IdentityContext) names a tenant other than
// tenant, the delivery's: reference §7.4 holds data.identity.tenant.id to
// the route's tenant, so that whoever reads an event may trust the tenant
// it names. A connector's event data is largely a provider's payload
// (twenty's is the webhook's body), not the connector's own words. Member names
// are matched as encoding/json matches them to fields (ignoring case), so
// that no reader decoding the data into an identity context finds
// another tenant there; an identity, or a tenant in it, that is no JSON
// object is not an identity context, and is left alone.
func checkIdentityTenant(data map[string]json.RawMessage, tenant string) error {
	for _, name := range foldedMembers(data, "identity") {
		var identity map[string]json.RawMessage
		if json.Unmarshal(data[name], &identity) != nil {
			continue
		}
		for _, tname := range foldedMembers(identity, "tenant") {
			var ref map[string]json.RawMessage
			if json.Unmarshal(identity[tname], &ref) != nil {
				continue
			}
			for _, idname := range foldedMembers(ref, "id") {
				idraw := ref[idname]
				var id string
				if bytes.Equal(idraw, []byte("null")) || json.Unmarshal(idraw, &id) != nil || id != tenant {
					return fmt.Errorf("data.%s.%s.%s is %s, not the delivery's tenant %q: an event names no tenant but the one whose log it goes to (leave the identity's tenant out, or name %q)",
						name, tname, idname, aip.TruncateUTF8(string(idraw), 80), tenant, tenant)
				}
			}
		}
	}
	return nil
}

// foldedMembers returns the names of m's members that encoding/json
// would match to a field named name (equal ignoring case), sorted, so
// that the same data is refused with the same message.
func foldedMembers(m map[string]json.RawMessage, name string) []string {
	var out []string
	for k := range m {
		if strings.EqualFold(k, name) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// declaresChannel reports whether the manifest declares the channel
// (Manifest.ChannelIDs: the forms hostsdk publishes on).
func declaresChannel(m *aip.Manifest, id string) bool {
	return slices.Contains(m.ChannelIDs(), id)
}

// probeEnvelope returns what a delivery that did not verify says about
// itself (its message ID and sender), so the refusal can name the message
// it answers; the values are only echoed, never trusted.
func probeEnvelope(raw []byte) *aip.Envelope {
	var p struct {
		MessageID     string         `json:"message_id"`
		CorrelationID string         `json:"correlation_id"`
		From          *aip.Principal `json:"from"`
	}
	if json.Unmarshal(raw, &p) != nil || aip.ValidateID(aip.PrefixMessage, p.MessageID) != nil {
		return nil
	}
	env := &aip.Envelope{MessageID: p.MessageID}
	if p.From != nil && p.From.Validate() == nil {
		env.From = p.From
	}
	if aip.ValidateID(aip.PrefixCorrelation, p.CorrelationID) == nil {
		env.CorrelationID = p.CorrelationID
	}
	return env
}

// temporary reports whether the refusal goes away by delivering again
// (connector_event.unavailable or .capacity).
func (r *eventRefusal) temporary() bool {
	return r.code == aip.CodeEventUnavailable || r.code == aip.CodeEventCapacity
}

// answerUnsigned writes a permanent refusal of a delivery that is not
// authenticated as the registered replica's (it did not verify, or names
// no replica, or not the one whose key signed it) as an unsigned
// {"error": ...}. Signed, in response to the message ID the delivery
// named and addressed to the principal it named, it would give anyone who
// can reach this route, and has read a host's delivery on the wire, the
// dispatcher's signed word refusing that delivery (sign a copy of it with
// any key, or break its signature): put in place of the real answer, the
// host would take it for a refusal of its events and hold them back. A
// host retries an unsigned answer with backoff and logs it, so the reason
// still reaches a host whose key or registration is wrong. A temporary
// refusal stays signed, so that hosts keep its retry_after: a copy of one
// only makes a host deliver again soon.
func answerUnsigned(w http.ResponseWriter, ref *eventRefusal) {
	pe := ref.protocolError()
	setRetryAfter(w, pe)
	writeJSON(w, ref.status, ErrorResponse{Error: pe})
}

// answerDelivery writes a signed envelope answering the delivery: from the
// gateway principal (in the sender's trust domain when known), to the
// delivery's sender, in response to its message.
func (d *Dispatcher) answerDelivery(w http.ResponseWriter, dl *delivery, status int, body aip.Body) {
	env, err := aip.NewEnvelope(d.cfg.Now(), body)
	var raw []byte
	if err == nil {
		from := d.principal
		from.TrustDomain = dl.trustDomain
		env.From = &from
		if req := dl.env; req != nil {
			env.InResponseTo = &aip.MessageReference{Message: req.MessageID}
			env.To, env.CorrelationID, env.SessionID = req.From, req.CorrelationID, req.SessionID
		}
		raw, err = aip.SignEnvelope(d.key, env)
	}
	if err != nil {
		d.log.Error("sign the answer to an event delivery", "error", err)
		writeError(w, newAPIError(http.StatusInternalServerError, aip.CodeEventUnavailable, aip.CategoryTemporary, true, eventsRetryAfter,
			"the answer could not be signed"))
		return
	}
	if body.Error != nil {
		setRetryAfter(w, &body.Error.Error)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(raw)))
	w.WriteHeader(status)
	w.Write(raw)
}

// handleEvents serves GET /aip/v1/events?after=N&limit=N: the
// authenticated tenant's events after sequence N, in order.
func (d *Dispatcher) handleEvents() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d.deps.Events == nil {
			// As the ingress refuses a delivery: temporary, retry after
			// eventsRetryAfter (a 503 always carries Retry-After).
			writeError(w, newAPIError(http.StatusServiceUnavailable, aip.CodeEventUnavailable, aip.CategoryTemporary, true, eventsRetryAfter,
				"this dispatcher keeps no event log (it runs without Deps.Events); read events from a dispatcher that does"))
			return
		}
		q, e := queryOf(r, "after", "limit")
		if e != nil {
			writeError(w, e)
			return
		}
		var after uint64
		if s := q.Get("after"); s != "" {
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				writeError(w, newAPIError(http.StatusBadRequest, CodeRequestInvalid, aip.CategoryPermanent, false, 0,
					"after must be an event sequence: an integer from 0 (the next_after of the previous page)"))
				return
			}
			after = n
		}
		limit := DefaultEventPageLimit
		if s := q.Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > registry.MaxEventPage {
				writeError(w, newAPIError(http.StatusBadRequest, CodeRequestInvalid, aip.CategoryPermanent, false, 0,
					"limit must be an integer from 1 to "+strconv.Itoa(registry.MaxEventPage)))
				return
			}
			limit = n
		}
		ctx, cancel := context.WithTimeout(r.Context(), d.cfg.RegistryTimeout)
		defer cancel()
		// Read in small chunks and stop at MaxEventPageBytes: events are
		// up to aip.MaxEventBytes each, and a page of a thousand of them
		// must not hold a quarter of a gigabyte in the dispatcher.
		out := EventsResponse{Events: []EventRecord{}, NextAfter: after}
		size := 0
		for len(out.Events) < limit {
			page, err := d.deps.Events.Events(ctx, tenantOf(r.Context()), out.NextAfter, min(eventReadChunk, limit-len(out.Events)))
			if err != nil {
				d.log.Warn("read events", "error", err)
				writeError(w, newAPIError(http.StatusServiceUnavailable, CodeRegistry, aip.CategoryTemporary, true, time.Second,
					"the event log is unavailable; retry later"))
				return
			}
			if after > page.Last {
				// No page of this log ended there: answering an empty
				// page would have the reader wait at after and skip
				// every event stored up to it.
				writeError(w, newAPIError(http.StatusBadRequest, CodeRequestInvalid, aip.CategoryPermanent, false, 0,
					fmt.Sprintf("after %d is past the last sequence this tenant's event log has given out (%d): pass the next_after of a page this log returned, or 0 to read from its start (a cursor of another tenant's log, or kept across a restore of the registry, does not fit this one)", after, page.Last)))
				return
			}
			out.More = page.More
			full := false
			for _, e := range page.Events {
				rec := EventRecord{Sequence: e.Sequence, ChannelID: e.ChannelID, InstanceID: e.InstanceID, Event: e.Event}
				n := len(e.Event.Data) + 512
				if len(out.Events) > 0 && size+n > MaxEventPageBytes {
					out.More, full = true, true
					break
				}
				size += n
				out.Events = append(out.Events, rec)
				out.NextAfter = e.Sequence
			}
			if full || !page.More {
				break
			}
		}
		writeJSON(w, http.StatusOK, out)
	})
}
