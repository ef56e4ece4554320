package hostsdktest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// EventIngressConfig configures a fake connector-event ingress. ControlPlane
// and Dispatcher are required.
type EventIngressConfig struct {
	// ControlPlane is the registry the ingress checks deliveries against:
	// the replica's provisioned DID and identity, its status, lease and
	// health revision (the lease sequence a delivery must carry).
	ControlPlane *ControlPlane
	// Dispatcher is the principal deliveries must be addressed to; its key
	// signs the answers (pin it as the host's gateway).
	Dispatcher *Dispatcher
	// Now defaults to time.Now (which testing/synctest fakes).
	Now func() time.Time
	// InMemory skips the loopback HTTP server: hosts reach the ingress
	// through Transport() (for tests inside a testing/synctest bubble).
	InMemory bool
}

// Delivery is one event delivery the ingress saw, whatever it answered.
type Delivery struct {
	At        time.Time
	MessageID string
	SignerDID string
	// Event is the delivery's security.connector_event.
	Event  aip.ConnectorEvent
	Events []aip.Event
	// Status is the HTTP status answered (0 when the ingress was down and
	// answered nothing signed); Code the error code ("" when stored).
	Status int
	Code   string
}

// EventIngress is an in-process fake of the dispatcher's connector-event
// ingress (aip.EventsPath). It checks the essentials the real dispatcher
// checks: the envelope's type and body, the signature by the replica's
// provisioned DID (and from naming that replica's principal), to naming the
// dispatcher, sent_at freshness, security.connector_event matching the
// provisioned identity, the replica ready or draining with an unexpired
// lease and the delivery's lease_sequence equal to its health revision
// (else a temporary connector_event.unavailable with
// aip.EventReasonStaleLeaseSequence in its details, as the dispatcher), 1 to
// aip.MaxEventsPerDelivery events with evt_ IDs and kinds. It stores the
// events (idempotently by ID) and answers a signed event_stream with the
// dispatcher's key, in response to the delivery; refusals are signed AIP
// errors with the codes of aip/events.go. Faults: FailNext, SetDown,
// SignWith, RefuseSequencesThrough.
type EventIngress struct {
	cp     *ControlPlane
	d      *Dispatcher
	now    func() time.Time
	server *httptest.Server

	mu         sync.Mutex
	deliveries []Delivery
	stored     []aip.Event
	seen       map[string]bool
	faults     []string
	down       bool
	signer     *aip.SigningKey
	staleFloor uint64
	changed    chan struct{}
}

// NewEventIngress starts a fake event ingress (on a loopback HTTP server
// unless cfg.InMemory) and stops it when the test ends.
func NewEventIngress(t testing.TB, cfg EventIngressConfig) *EventIngress {
	t.Helper()
	if cfg.ControlPlane == nil || cfg.Dispatcher == nil {
		t.Fatal("hostsdktest: EventIngressConfig needs ControlPlane and Dispatcher")
	}
	in := &EventIngress{cp: cfg.ControlPlane, d: cfg.Dispatcher, now: cfg.Now, seen: map[string]bool{}, changed: make(chan struct{})}
	if in.now == nil {
		in.now = time.Now
	}
	if !cfg.InMemory {
		in.server = httptest.NewServer(in.Handler())
		t.Cleanup(in.server.Close)
	}
	return in
}

// Endpoint returns the URL of /aip/v1/connector-events (a placeholder
// loopback URL for an in-memory ingress, to use with Transport()).
func (in *EventIngress) Endpoint() string {
	if in.server == nil {
		return "http://127.0.0.1:9" + aip.EventsPath
	}
	return in.server.URL + aip.EventsPath
}

// Handler returns the HTTP handler of POST /aip/v1/connector-events.
func (in *EventIngress) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+aip.EventsPath, in.serve)
	return mux
}

// Transport returns a RoundTripper that hands requests to the handler in
// process (no network), for Config.EventTransport.
func (in *EventIngress) Transport() http.RoundTripper { return handlerTransport{in.Handler()} }

// Configure points a host configuration at the ingress.
func (in *EventIngress) Configure(cfg *hostsdk.Config) {
	cfg.EventEndpoint = in.Endpoint()
	if in.server == nil {
		cfg.EventTransport = in.Transport()
	}
}

// FailNext answers the next n deliveries with a signed error of code (one
// of aip/events.go's codes; its status, category and retryability are the
// real dispatcher's) without storing them.
func (in *EventIngress) FailNext(n int, code string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for range n {
		in.faults = append(in.faults, code)
	}
}

// SetDown makes every delivery fail with an unsigned 503 while on (an
// outage in front of the dispatcher).
func (in *EventIngress) SetDown(on bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.down = on
}

// SignWith signs answers with key instead of the dispatcher's (nil
// restores the dispatcher's key).
func (in *EventIngress) SignWith(key *aip.SigningKey) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.signer = key
}

// RefuseSequencesThrough answers deliveries whose lease_sequence is at most
// seq as stale (temporary connector_event.unavailable), as the real
// dispatcher does when the registry moved past the host's sequence.
func (in *EventIngress) RefuseSequencesThrough(seq uint64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.staleFloor = seq
}

// Deliveries returns the deliveries seen so far.
func (in *EventIngress) Deliveries() []Delivery {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]Delivery(nil), in.deliveries...)
}

// Events returns the stored events in the order first stored.
func (in *EventIngress) Events() []aip.Event {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]aip.Event(nil), in.stored...)
}

// Await blocks until pred holds for the recorded deliveries or ctx ends.
// pred gets a copy of them and runs without the ingress's lock, so it may
// call the ingress's other methods (Events, Deliveries).
func (in *EventIngress) Await(ctx context.Context, pred func([]Delivery) bool) error {
	for {
		in.mu.Lock()
		deliveries, ch := append([]Delivery(nil), in.deliveries...), in.changed
		in.mu.Unlock()
		if pred(deliveries) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("hostsdktest: event deliveries did not reach the expected state: %w", ctx.Err())
		}
	}
}

func (in *EventIngress) record(d Delivery) {
	in.deliveries = append(in.deliveries, d)
	close(in.changed)
	in.changed = make(chan struct{})
}

// eventErrorStatus returns the HTTP status, category, retryability and
// retry hint of an ingress error code.
func eventErrorStatus(code string) (int, aip.ErrorCategory, bool, uint64) {
	switch code {
	case aip.CodeEventNotAuthorized:
		return http.StatusForbidden, aip.CategoryAuth, false, 0
	case aip.CodeEventUnavailable:
		return http.StatusServiceUnavailable, aip.CategoryTemporary, true, 1000
	case aip.CodeEventCapacity:
		return http.StatusTooManyRequests, aip.CategoryTemporary, true, 1000
	case aip.CodeEventIdempotencyConflict:
		return http.StatusConflict, aip.CategoryPermanent, false, 0
	}
	return http.StatusBadRequest, aip.CategoryPermanent, false, 0
}

func (in *EventIngress) serve(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, aip.MaxEventDeliveryBytes))
	in.mu.Lock()
	defer in.mu.Unlock()
	now := in.now()
	rec := Delivery{At: now}
	if in.down {
		in.record(rec)
		http.Error(w, "ingress unavailable", http.StatusServiceUnavailable)
		return
	}
	var req *aip.Envelope
	answer := func(status int, body aip.Body) {
		rec.Status = status
		in.record(rec)
		env, err := aip.NewEnvelope(now, body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		from := in.d.principal
		env.From = &from
		if req != nil {
			env.InResponseTo = &aip.MessageReference{Message: req.MessageID}
			env.To = req.From
		}
		key := in.d.key
		if in.signer != nil {
			key = in.signer
		}
		out, err := aip.SignEnvelope(key, env)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(out)
	}
	refuse := func(code, format string, args ...any) {
		rec.Code = code
		status, cat, retryable, after := eventErrorStatus(code)
		answer(status, aip.Body{Error: &aip.ErrorBody{Error: *aip.NewProtocolError(code, cat, retryable, after, fmt.Sprintf(format, args...))}})
	}
	if err != nil {
		refuse(aip.CodeEventInvalid, "the delivery exceeds %d bytes or could not be read: %v", aip.MaxEventDeliveryBytes, err)
		return
	}
	v, err := aip.VerifyEnvelope(raw, "")
	if err != nil {
		refuse(aip.CodeEventNotAuthorized, "the delivery is not a signed envelope: %v", err)
		return
	}
	req = &v.Envelope
	rec.MessageID, rec.SignerDID = req.MessageID, v.SignerDID
	if es := req.Body.EventStream; es != nil {
		rec.Events = es.Events
	}
	var ce aip.ConnectorEvent
	if ok, err := req.SecurityValue(aip.SecurityConnectorEvent, &ce); !ok || err != nil {
		refuse(aip.CodeEventInvalid, "security.connector_event is missing or malformed")
		return
	}
	rec.Event = ce
	if len(in.faults) > 0 {
		code := in.faults[0]
		in.faults = in.faults[1:]
		refuse(code, "injected: %s", code)
		return
	}
	if req.MessageType != aip.TypeEventStreamResponse || req.Body.EventStream == nil || req.Body.EventStream.NextCursor != nil {
		refuse(aip.CodeEventInvalid, "a delivery is an %s with an event_stream body and no next_cursor", aip.TypeEventStreamResponse)
		return
	}
	if to := req.To; to == nil || to.ID != in.d.principal.ID || to.Kind != aip.PrincipalService {
		refuse(aip.CodeEventInvalid, "the delivery is not addressed to the dispatcher %s", in.d.principal.ID)
		return
	}
	if sent := req.SentAt.Time; sent.Before(now.Add(-aip.MaxEventDeliveryAge)) || sent.After(now.Add(aip.MaxEnvelopeSkew)) {
		refuse(aip.CodeEventInvalid, "sent_at %s is outside the accepted window", req.SentAt)
		return
	}
	in.cp.mu.Lock()
	rep, ok := in.cp.replicas[ce.ReplicaID]
	var spec ReplicaSpec
	var st ReplicaState
	if ok {
		spec, st = rep.spec, rep.state
	}
	in.cp.mu.Unlock()
	if !ok {
		refuse(aip.CodeEventNotAuthorized, "replica %s is not registered", ce.ReplicaID)
		return
	}
	for _, f := range []struct{ name, got, want string }{
		{"tenant_id", ce.TenantID, spec.TenantID},
		{"instance_id", ce.InstanceID, spec.InstanceID},
		{"version_id", ce.VersionID, spec.VersionID},
		{"manifest_digest", ce.ManifestDigest, spec.ManifestDigest},
	} {
		if f.want != "" && f.got != f.want {
			refuse(aip.CodeEventNotAuthorized, "connector_event %s %q does not match the registry (%q)", f.name, f.got, f.want)
			return
		}
	}
	if v.SignerDID != spec.DID {
		refuse(aip.CodeEventNotAuthorized, "the delivery is signed by %s, not replica %s's DID", v.SignerDID, ce.ReplicaID)
		return
	}
	if f := req.From; f == nil || f.Kind != aip.PrincipalAgent || (f.DID != "" && f.DID != spec.DID) {
		refuse(aip.CodeEventNotAuthorized, "from is not the replica's agent principal")
		return
	}
	if (st.Status != aip.ReplicaReady && st.Status != aip.ReplicaDraining) || !st.LeaseExpiresAt.After(now) {
		refuse(aip.CodeEventUnavailable, "replica %s is %s with its lease until %s", ce.ReplicaID, st.Status, aip.At(st.LeaseExpiresAt))
		return
	}
	if ce.LeaseSequence != st.HealthRevision || ce.LeaseSequence <= in.staleFloor {
		// As the dispatcher, with details naming the cause.
		rec.Code = aip.CodeEventUnavailable
		status, cat, retryable, after := eventErrorStatus(rec.Code)
		pe := aip.NewProtocolError(rec.Code, cat, retryable, after,
			fmt.Sprintf("lease_sequence %d is not the registry's %d; retry with the current sequence", ce.LeaseSequence, st.HealthRevision))
		pe.Details, _ = json.Marshal(aip.EventRefusalDetails{Reason: aip.EventReasonStaleLeaseSequence, LeaseSequence: st.HealthRevision})
		answer(status, aip.Body{Error: &aip.ErrorBody{Error: *pe}})
		return
	}
	if ce.ChannelID == "" {
		refuse(aip.CodeEventInvalid, "connector_event.channel_id is empty")
		return
	}
	events := req.Body.EventStream.Events
	if len(events) == 0 || len(events) > aip.MaxEventsPerDelivery {
		refuse(aip.CodeEventInvalid, "a delivery holds 1 to %d events, got %d", aip.MaxEventsPerDelivery, len(events))
		return
	}
	for _, e := range events {
		if !strings.HasPrefix(e.ID, aip.PrefixEvent) || e.Kind == "" || len(e.Kind) > 256 || e.Actor != nil {
			refuse(aip.CodeEventInvalid, "event %q needs an evt_ ID, a kind of 1 to 256 bytes and no actor", e.ID)
			return
		}
	}
	for _, e := range events {
		if !in.seen[e.ID] {
			in.seen[e.ID] = true
			in.stored = append(in.stored, e)
		}
	}
	answer(http.StatusOK, aip.Body{EventStream: &aip.EventStream{Events: events}})
}
