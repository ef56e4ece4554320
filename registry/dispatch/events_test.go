package dispatch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

const (
	channel     = "chatwoot.webhooks"
	otherTenant = "tenant-other"
)

// eventWorld is a dispatcher with an event log on memregistry, and one
// replica of tenant's instance whose key the test holds, as a host would.
type eventWorld struct {
	t       *testing.T
	reg     *memregistry.Registry
	d       *dispatch.Dispatcher
	srv     *httptest.Server
	issuer  *aip.SigningKey
	hostKey *aip.SigningKey
	host    aip.Principal
	version registry.ConnectorVersion
	replica registry.ConnectorReplica
}

type eventWorldOptions struct {
	// replica adjusts the replica record before it is stored.
	replica func(*registry.ConnectorReplica)
	// versionStatus defaults to active.
	versionStatus registry.VersionStatus
	// noEvents runs the dispatcher without Deps.Events.
	noEvents bool
	// instanceDisabled and typeDisabled switch the instance and its
	// connector type off.
	instanceDisabled, typeDisabled bool
	// events wraps the event log; cfg adjusts the dispatcher's config.
	events func(registry.EventLog) registry.EventLog
	cfg    func(*dispatch.Config)
}

func newEventWorld(t *testing.T, opts eventWorldOptions) *eventWorld {
	t.Helper()
	ctx := t.Context()
	key, _ := aip.GenerateSigningKey()
	iss, _ := aip.GenerateSigningKey()
	hostKey, _ := aip.GenerateSigningKey()
	reg, err := memregistry.New(memregistry.Config{})
	must(t, err)
	w := &eventWorld{t: t, reg: reg, issuer: iss, hostKey: hostKey,
		host: aip.Principal{ID: "agent:events-test", Kind: aip.PrincipalAgent, TrustDomain: hostsdktest.TrustDomain}}

	typeID, versionID, instanceID := aip.NewID(aip.PrefixType), aip.NewID(aip.PrefixVersion), aip.NewID(aip.PrefixInstance)
	m := *testManifest()
	m.Agent = w.host
	m.Channels = []json.RawMessage{json.RawMessage(`{"id":"` + channel + `","description":"verified webhooks"}`)}
	status := opts.versionStatus
	if status == "" || status == registry.VersionRevoked {
		status = registry.VersionActive // revoked once the replica is registered
	}
	must(t, reg.PutConnectorType(ctx, registry.ConnectorType{ID: typeID, Name: "events", Owner: "owner-test", Enabled: true}))
	w.version = registrytest.Version(versionID, typeID, "1.0.0", "owner-test", status, m)
	must(t, reg.AdmitVersion(ctx, w.version))
	instStatus := registry.InstanceEnabled
	if opts.instanceDisabled {
		instStatus = registry.InstanceDisabled
	}
	must(t, reg.PutInstance(ctx, registry.ConnectorInstance{ID: instanceID, ConnectorTypeID: typeID, VersionID: versionID,
		TenantID: tenant, ConfigRevision: 1, SecretProviderRef: "secret://test", Status: instStatus}))
	if opts.typeDisabled {
		must(t, reg.SetConnectorTypeEnabled(ctx, typeID, false))
	}
	w.replica = registry.ConnectorReplica{
		ID: aip.NewID(aip.PrefixReplica), InstanceID: instanceID, VersionID: versionID, Endpoint: "https://replica.test:8443" + aip.MessagesPath,
		PeerPrincipalID: w.host.ID, PeerPrincipalKind: w.host.Kind, PeerDID: hostKey.DID(), TrustDomain: hostsdktest.TrustDomain,
		TransportProfile: aip.NativeHTTPProfile, Topology: aip.DefaultTopology(), Status: aip.ReplicaReady,
		LeaseExpiresAt: time.Now().Add(time.Hour), Capacity: 4, HealthRevision: 7,
	}
	if opts.replica != nil {
		opts.replica(&w.replica)
	}
	must(t, reg.PutReplica(ctx, w.replica))
	if opts.versionStatus == registry.VersionRevoked {
		must(t, reg.SetVersionStatus(ctx, versionID, registry.VersionRevoked))
	}

	verifier, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: []tenanttoken.Issuer{{Name: issuer, DIDs: []string{iss.DID()}}}})
	must(t, err)
	deps := dispatch.Deps{Resolver: reg, Catalog: reg, Tokens: verifier, Events: reg, Records: reg}
	if opts.noEvents {
		deps.Events, deps.Records = nil, nil
	}
	if opts.events != nil {
		deps.Events = opts.events(reg)
	}
	cfg := dispatch.Config{SigningKey: key, PrincipalID: gatewayID}
	if opts.cfg != nil {
		opts.cfg(&cfg)
	}
	w.d, err = dispatch.New(cfg, deps)
	must(t, err)
	w.srv = httptest.NewServer(w.d.Handler())
	t.Cleanup(func() {
		w.srv.Close()
		w.d.Close()
	})
	return w
}

// eventDelivery is a delivery as a host builds it: its envelope, its
// security.connector_event and the key it is signed with.
type eventDelivery struct {
	env *aip.Envelope
	ce  aip.ConnectorEvent
	key *aip.SigningKey
}

func (w *eventWorld) delivery(events ...aip.Event) *eventDelivery {
	w.t.Helper()
	env, err := aip.NewEnvelope(time.Now(), aip.Body{EventStream: &aip.EventStream{Events: events}})
	must(w.t, err)
	from := w.host
	env.From = &from
	env.To = &aip.Principal{ID: gatewayID, Kind: aip.PrincipalService}
	env.CorrelationID = aip.NewID(aip.PrefixCorrelation)
	r := &w.replica
	return &eventDelivery{env: env, key: w.hostKey, ce: aip.ConnectorEvent{TenantID: tenant, InstanceID: r.InstanceID, ReplicaID: r.ID,
		VersionID: r.VersionID, ManifestDigest: w.version.ManifestDigest, LeaseSequence: r.HealthRevision, ChannelID: channel}}
}

func (dl *eventDelivery) sign(t *testing.T) []byte {
	t.Helper()
	must(t, dl.env.SetSecurity(aip.SecurityConnectorEvent, dl.ce))
	raw, err := aip.SignEnvelope(dl.key, dl.env)
	must(t, err)
	return raw
}

// post signs and sends a delivery and returns the status and the answer,
// verified as the host verifies it: signed by the dispatcher DID the host
// pins, from the gateway principal, to the host, answering the delivery.
func (w *eventWorld) post(dl *eventDelivery) (int, *aip.Envelope, http.Header) {
	w.t.Helper()
	return w.postVia(w.srv.Client(), dl)
}

// postVia is post through client (one that dials from another address).
func (w *eventWorld) postVia(client *http.Client, dl *eventDelivery) (int, *aip.Envelope, http.Header) {
	w.t.Helper()
	status, ans, h := w.postRawVia(client, dl.sign(w.t))
	switch {
	case ans.InResponseTo == nil || ans.InResponseTo.Message != dl.env.MessageID:
		w.t.Fatalf("the answer does not answer %s: %+v", dl.env.MessageID, ans.InResponseTo)
	case ans.To == nil || ans.To.ID != dl.env.From.ID:
		w.t.Fatalf("the answer is addressed to %+v, want %s", ans.To, dl.env.From.ID)
	case ans.CorrelationID != dl.env.CorrelationID:
		w.t.Fatalf("the answer's correlation_id %q, want %q", ans.CorrelationID, dl.env.CorrelationID)
	}
	return status, ans, h
}

func (w *eventWorld) postRaw(raw []byte) (int, *aip.Envelope, http.Header) {
	w.t.Helper()
	return w.postRawVia(w.srv.Client(), raw)
}

func (w *eventWorld) postRawVia(client *http.Client, raw []byte) (int, *aip.Envelope, http.Header) {
	w.t.Helper()
	resp, err := client.Post(w.srv.URL+aip.EventsPath, "application/json", bytes.NewReader(raw))
	must(w.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	must(w.t, err)
	return w.verifyAnswer(resp, body)
}

// verifyAnswer verifies an answer as the host does: signed by the
// dispatcher's DID, from the gateway principal.
func (w *eventWorld) verifyAnswer(resp *http.Response, body []byte) (int, *aip.Envelope, http.Header) {
	w.t.Helper()
	v, err := aip.VerifyEnvelope(body, w.d.DID())
	if err != nil {
		w.t.Fatalf("HTTP %d: the answer does not verify with the dispatcher's DID: %v\n%s", resp.StatusCode, err, body)
	}
	if v.Envelope.From == nil || v.Envelope.From.ID != gatewayID {
		w.t.Fatalf("the answer is from %+v, want %s", v.Envelope.From, gatewayID)
	}
	return resp.StatusCode, &v.Envelope, resp.Header
}

// stored returns the tenant's whole log.
func (w *eventWorld) stored(tenantID string) []registry.StoredEvent {
	w.t.Helper()
	page, err := w.reg.Events(w.t.Context(), tenantID, 0, registry.MaxEventPage)
	must(w.t, err)
	return page.Events
}

func event(kind, data string) aip.Event {
	e := aip.Event{ID: aip.NewID(aip.PrefixEvent), Kind: kind, OccurredAt: aip.At(time.Now().Add(-time.Minute))}
	if data != "" {
		e.Data = json.RawMessage(data)
	}
	return e
}

// stampOf decodes an event's data.aip_connector.
func stampOf(t *testing.T, e aip.Event) dispatch.ConnectorStamp {
	t.Helper()
	var d struct {
		Stamp *dispatch.ConnectorStamp `json:"aip_connector"`
	}
	if err := json.Unmarshal(e.Data, &d); err != nil || d.Stamp == nil {
		t.Fatalf("event %s data %s has no aip_connector (%v)", e.ID, e.Data, err)
	}
	return *d.Stamp
}

func TestConnectorEventsAccepted(t *testing.T) {
	w := newEventWorld(t, eventWorldOptions{})
	e1 := event("conversation.created", `{"conversation":{"id":42},"b":[1,2]}`)
	e2 := event("message.created", "")
	dl := w.delivery(e1, e2)
	status, ans, _ := w.post(dl)
	if status != http.StatusOK || ans.Body.EventStream == nil {
		t.Fatalf("HTTP %d %+v, want 200 with an event_stream", status, ans.Body)
	}
	if ans.MessageType != aip.TypeEventStreamResponse || ans.Body.EventStream.NextCursor != nil {
		t.Fatalf("answer %s with next_cursor %v", ans.MessageType, ans.Body.EventStream.NextCursor)
	}
	want := dispatch.ConnectorStamp{InstanceID: w.replica.InstanceID, ReplicaID: w.replica.ID, VersionID: w.replica.VersionID,
		ChannelID: channel, LeaseSequence: w.replica.HealthRevision}
	got := ans.Body.EventStream.Events
	if len(got) != 2 || got[0].ID != e1.ID || got[1].ID != e2.ID {
		t.Fatalf("answered events %+v, want %s and %s", got, e1.ID, e2.ID)
	}
	for _, e := range got {
		if diff := cmp.Diff(want, stampOf(t, e)); diff != "" {
			t.Errorf("event %s aip_connector (-want +got):\n%s", e.ID, diff)
		}
	}
	var d1 map[string]json.RawMessage
	must(t, json.Unmarshal(got[0].Data, &d1))
	if string(d1["conversation"]) != `{"id":42}` || string(d1["b"]) != `[1,2]` {
		t.Errorf("event data lost its members: %s", got[0].Data)
	}
	log := w.stored(tenant)
	if len(log) != 2 {
		t.Fatalf("log holds %d events, want 2", len(log))
	}
	for i, s := range log {
		if s.Sequence != uint64(i+1) || s.ChannelID != channel || s.InstanceID != w.replica.InstanceID || s.ReplicaID != w.replica.ID || s.VersionID != w.replica.VersionID {
			t.Errorf("stored event %d: %+v", i, s)
		}
		if diff := cmp.Diff(got[i], s.Event); diff != "" {
			t.Errorf("answered event %d differs from the stored one (-answer +stored):\n%s", i, diff)
		}
	}
	if n := len(w.stored(otherTenant)); n != 0 {
		t.Errorf("tenant %s's log holds %d events", otherTenant, n)
	}

	// The metrics count the delivery and its events.
	resp, err := w.srv.Client().Get(w.srv.URL + dispatch.PathMetrics)
	must(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{`aip_dispatch_events_received_total{result="accepted"} 1`, `aip_dispatch_events_stored_total 2`} {
		if !strings.Contains(string(metrics), line) {
			t.Errorf("/metrics lacks %q", line)
		}
	}
}

// A redelivery — here after the replica's lease moved on — is answered
// with the events as first stored, and stores nothing new.
func TestConnectorEventsRedelivery(t *testing.T) {
	w := newEventWorld(t, eventWorldOptions{})
	e1, e2 := event("a", `{"n":1}`), event("b", `{"n":2}`)
	status, first, _ := w.post(w.delivery(e1))
	if status != http.StatusOK {
		t.Fatalf("first delivery: HTTP %d %+v", status, first.Body.Error)
	}
	w.replica.HealthRevision++
	must(t, w.reg.PutReplica(t.Context(), w.replica))
	status, again, _ := w.post(w.delivery(e1, e2))
	if status != http.StatusOK {
		t.Fatalf("redelivery: HTTP %d %+v", status, again.Body.Error)
	}
	got := again.Body.EventStream.Events
	if len(got) != 2 {
		t.Fatalf("answered %d events, want 2", len(got))
	}
	if diff := cmp.Diff(first.Body.EventStream.Events[0], got[0]); diff != "" {
		t.Errorf("redelivered event is not answered as first stored (-first +again):\n%s", diff)
	}
	if s := stampOf(t, got[0]); s.LeaseSequence != w.replica.HealthRevision-1 {
		t.Errorf("redelivered event's stamp has lease_sequence %d, want the first delivery's %d", s.LeaseSequence, w.replica.HealthRevision-1)
	}
	if s := stampOf(t, got[1]); s.LeaseSequence != w.replica.HealthRevision {
		t.Errorf("new event's stamp has lease_sequence %d, want %d", s.LeaseSequence, w.replica.HealthRevision)
	}
	if n := len(w.stored(tenant)); n != 2 {
		t.Errorf("log holds %d events, want 2", n)
	}
}

// An event delivered again after the log pruned it (a host whose outbox
// kept it while it was offline, or whose answer was lost) is not stored a
// second time: the delivery is answered 200 with an event_stream, which a
// host takes as delivered and drops from its outbox, listing only the
// events the log holds; readers of the log see each event once. A
// different event under the pruned ID is refused as a conflict.
func TestConnectorEventsPrunedAreNotStoredAgain(t *testing.T) {
	w := newEventWorld(t, eventWorldOptions{})
	e1, e2 := event("a", `{"n":1}`), event("b", `{"n":2}`)
	if status, ans, _ := w.post(w.delivery(e1)); status != http.StatusOK {
		t.Fatalf("first delivery: HTTP %d %+v", status, ans.Body.Error)
	}
	if n, err := w.reg.PruneEvents(t.Context(), time.Now().Add(time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("PruneEvents: %d, %v; want 1", n, err)
	}
	status, again, _ := w.post(w.delivery(e1))
	if status != http.StatusOK || again.Body.EventStream == nil || len(again.Body.EventStream.Events) != 0 {
		t.Fatalf("a pruned event delivered again: HTTP %d %+v, want 200 with an event_stream of no events", status, again.Body)
	}
	status, again, _ = w.post(w.delivery(e1, e2))
	if status != http.StatusOK || again.Body.EventStream == nil {
		t.Fatalf("a pruned event delivered again with a new one: HTTP %d %+v", status, again.Body.Error)
	}
	if got := again.Body.EventStream.Events; len(got) != 1 || got[0].ID != e2.ID {
		t.Fatalf("answered %+v, want only the new event %s", got, e2.ID)
	}
	log := w.stored(tenant)
	if len(log) != 1 || log[0].Event.ID != e2.ID || log[0].Sequence != 2 {
		t.Fatalf("the log holds %+v, want only %s at sequence 2", log, e2.ID)
	}
	// A different event under the pruned ID is an idempotency conflict,
	// as it is while the event is stored: answered as delivered, the host
	// would drop it and it would be lost.
	changed := e1
	changed.Data = json.RawMessage(`{"n":3}`)
	status, ans, _ := w.post(w.delivery(changed))
	checkRefusal(t, status, ans, http.StatusConflict, aip.CodeEventIdempotencyConflict)
	if !strings.Contains(ans.Body.Error.Error.Message, e1.ID) {
		t.Errorf("the conflict %q does not name the event %s", ans.Body.Error.Error.Message, e1.ID)
	}
}

func TestConnectorEventsIdempotencyConflict(t *testing.T) {
	w := newEventWorld(t, eventWorldOptions{})
	e := event("a", `{"n":1}`)
	if status, ans, _ := w.post(w.delivery(e)); status != http.StatusOK {
		t.Fatalf("first delivery: HTTP %d %+v", status, ans.Body.Error)
	}
	changed := e
	changed.Data = json.RawMessage(`{"n":2}`)
	status, ans, _ := w.post(w.delivery(event("b", ""), changed))
	checkRefusal(t, status, ans, http.StatusConflict, aip.CodeEventIdempotencyConflict)
	if n := len(w.stored(tenant)); n != 1 {
		t.Errorf("log holds %d events after a refused batch, want 1 (all or nothing)", n)
	}
}

func checkRefusal(t *testing.T, status int, ans *aip.Envelope, wantStatus int, wantCode string) {
	t.Helper()
	if ans.Body.Error == nil {
		t.Fatalf("HTTP %d with %s, want a signed %s error", status, ans.MessageType, wantCode)
	}
	pe := ans.Body.Error.Error
	if status != wantStatus || pe.Code != wantCode {
		t.Fatalf("HTTP %d %s (%s), want %d %s", status, pe.Code, pe.Message, wantStatus, wantCode)
	}
	if pe.Message == "" {
		t.Errorf("%s has no message", pe.Code)
	}
	temporary := wantCode == aip.CodeEventUnavailable || wantCode == aip.CodeEventCapacity
	if retryable := pe.Retryable != nil && *pe.Retryable; retryable != temporary {
		t.Errorf("%s retryable %v, want %v", pe.Code, retryable, temporary)
	}
	wantAfter := uint64(1000)
	if wantCode == aip.CodeEventCapacity {
		wantAfter = 100
	}
	if temporary && (pe.Category != aip.CategoryTemporary || pe.RetryAfterMS == nil || *pe.RetryAfterMS != wantAfter) {
		t.Errorf("%s: category %s retry_after_ms %v, want temporary and %d", pe.Code, pe.Category, pe.RetryAfterMS, wantAfter)
	}
}

// unsignedRefusal reads an answer that must be an unsigned refusal
// ({"error": ...}, what the dispatcher answers a delivery not
// authenticated as the registered replica's): it must not verify as a
// dispatcher envelope, and must say why with wantCode and wantStatus.
func (w *eventWorld) unsignedRefusal(resp *http.Response, body []byte, wantStatus int, wantCode string) *aip.ProtocolError {
	w.t.Helper()
	if _, err := aip.VerifyEnvelope(body, w.d.DID()); err == nil {
		w.t.Fatalf("HTTP %d: a signed answer, want an unsigned %s: %s", resp.StatusCode, wantCode, body)
	}
	var e dispatch.ErrorResponse
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil {
		w.t.Fatalf("HTTP %d: not an unsigned error (%v): %s", resp.StatusCode, err, body)
	}
	if resp.StatusCode != wantStatus || e.Error.Code != wantCode || e.Error.Message == "" {
		w.t.Fatalf("HTTP %d %s (%s), want %d %s with a message", resp.StatusCode, e.Error.Code, e.Error.Message, wantStatus, wantCode)
	}
	if e.Error.Retryable == nil || *e.Error.Retryable {
		w.t.Errorf("%s retryable %v, want false", e.Error.Code, e.Error.Retryable)
	}
	return e.Error
}

// postUnsigned posts raw and reads its answer with unsignedRefusal.
func (w *eventWorld) postUnsigned(raw []byte, wantStatus int, wantCode string) *aip.ProtocolError {
	w.t.Helper()
	resp, err := w.srv.Client().Post(w.srv.URL+aip.EventsPath, "application/json", bytes.NewReader(raw))
	must(w.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	must(w.t, err)
	return w.unsignedRefusal(resp, body, wantStatus, wantCode)
}

// TestConnectorEventsRefused: every refusal says why. A refusal of a
// delivery authenticated as the registered replica's (signed by its DID,
// from its principal in its trust domain) is a signed envelope answering
// it; a permanent refusal before that is unsigned (unsigned), so that no
// one gets the dispatcher's signed word refusing another's delivery
// (TestEventRefusalIsNoSigningOracle).
func TestConnectorEventsRefused(t *testing.T) {
	other, _ := aip.GenerateSigningKey()
	now := time.Now()
	type mod func(w *eventWorld, dl *eventDelivery)
	events := func(es ...aip.Event) mod {
		return func(w *eventWorld, dl *eventDelivery) { dl.env.Body.EventStream.Events = es }
	}
	many := make([]aip.Event, aip.MaxEventsPerDelivery+1)
	for i := range many {
		many[i] = event("k", "")
	}
	actor := event("k", "")
	actor.Actor = &aip.Principal{ID: "human:someone", Kind: aip.PrincipalHuman}
	badID := event("k", "")
	badID.ID = "evt_123"
	future := event("k", "")
	future.OccurredAt = aip.At(now.Add(10 * time.Minute))
	cursor := "next"
	for _, c := range []struct {
		name     string
		opts     eventWorldOptions
		mod      mod
		status   int
		code     string
		unsigned bool
	}{
		{name: "wrong signer", mod: func(w *eventWorld, dl *eventDelivery) { dl.key = other },
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized, unsigned: true},
		{name: "wrong to", mod: func(w *eventWorld, dl *eventDelivery) { dl.env.To.ID = "service:another-dispatcher" },
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized},
		{name: "wrong to kind", mod: func(w *eventWorld, dl *eventDelivery) { dl.env.To.Kind = aip.PrincipalAgent },
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized},
		{name: "no to", mod: func(w *eventWorld, dl *eventDelivery) { dl.env.To = nil },
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized},
		{name: "wrong from", mod: func(w *eventWorld, dl *eventDelivery) { dl.env.From.ID = "agent:someone-else" },
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized, unsigned: true},
		{name: "wrong from trust domain", mod: func(w *eventWorld, dl *eventDelivery) { dl.env.From.TrustDomain = "other.example" },
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized, unsigned: true},
		{name: "unknown replica", mod: func(w *eventWorld, dl *eventDelivery) { dl.ce.ReplicaID = aip.NewID(aip.PrefixReplica) },
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized, unsigned: true},
		{name: "another instance", mod: func(w *eventWorld, dl *eventDelivery) { dl.ce.InstanceID = aip.NewID(aip.PrefixInstance) },
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized},
		{name: "another version", mod: func(w *eventWorld, dl *eventDelivery) { dl.ce.VersionID = aip.NewID(aip.PrefixVersion) },
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized},
		{name: "another tenant", mod: func(w *eventWorld, dl *eventDelivery) { dl.ce.TenantID = otherTenant },
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized},
		{name: "offline replica", opts: eventWorldOptions{replica: func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaOffline }},
			status: http.StatusServiceUnavailable, code: aip.CodeEventUnavailable},
		{name: "expired lease", opts: eventWorldOptions{replica: func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = now.Add(-time.Second) }},
			status: http.StatusServiceUnavailable, code: aip.CodeEventUnavailable},
		{name: "stale lease sequence", mod: func(w *eventWorld, dl *eventDelivery) { dl.ce.LeaseSequence-- },
			status: http.StatusServiceUnavailable, code: aip.CodeEventUnavailable},
		{name: "version not active", opts: eventWorldOptions{versionStatus: registry.VersionAdmitted},
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized},
		{name: "version revoked", opts: eventWorldOptions{versionStatus: registry.VersionRevoked},
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized},
		{name: "instance disabled", opts: eventWorldOptions{instanceDisabled: true},
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized},
		{name: "connector type disabled", opts: eventWorldOptions{typeDisabled: true},
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized},
		{name: "manifest digest mismatch", mod: func(w *eventWorld, dl *eventDelivery) {
			dl.ce.ManifestDigest = aip.DigestBytes([]byte("another manifest"))
		},
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized},
		{name: "undeclared channel", mod: func(w *eventWorld, dl *eventDelivery) { dl.ce.ChannelID = "calcom.webhooks" },
			status: http.StatusForbidden, code: aip.CodeEventNotAuthorized},
		{name: "no connector_event", mod: func(w *eventWorld, dl *eventDelivery) { dl.ce = aip.ConnectorEvent{} },
			status: http.StatusBadRequest, code: aip.CodeEventInvalid, unsigned: true},
		{name: "next_cursor", mod: func(w *eventWorld, dl *eventDelivery) { dl.env.Body.EventStream.NextCursor = &cursor },
			status: http.StatusBadRequest, code: aip.CodeEventInvalid, unsigned: true},
		{name: "not an event stream", mod: func(w *eventWorld, dl *eventDelivery) {
			dl.env.Body = aip.Body{Ack: &aip.Ack{Status: aip.AckAccepted}}
			dl.env.MessageType = aip.TypeAck
		}, status: http.StatusBadRequest, code: aip.CodeEventInvalid, unsigned: true},
		{name: "no events", mod: events(), status: http.StatusBadRequest, code: aip.CodeEventInvalid},
		{name: "too many events", mod: events(many...), status: http.StatusBadRequest, code: aip.CodeEventInvalid},
		{name: "oversized event", mod: events(event("k", `{"blob":"`+strings.Repeat("x", aip.MaxEventBytes)+`"}`)),
			status: http.StatusBadRequest, code: aip.CodeEventInvalid},
		{name: "event with actor", mod: events(event("k", ""), actor), status: http.StatusBadRequest, code: aip.CodeEventInvalid},
		{name: "data not an object", mod: events(event("k", `[1,2]`)), status: http.StatusBadRequest, code: aip.CodeEventInvalid},
		{name: "data a string", mod: events(event("k", `"text"`)), status: http.StatusBadRequest, code: aip.CodeEventInvalid},
		{name: "conflicting aip_connector", mod: events(event("k", `{"aip_connector":{"replica_id":"crepl_someone"}}`)),
			status: http.StatusBadRequest, code: aip.CodeEventInvalid},
		{name: "event ID twice", mod: func(w *eventWorld, dl *eventDelivery) {
			e := event("k", "")
			dl.env.Body.EventStream.Events = []aip.Event{e, e}
		}, status: http.StatusBadRequest, code: aip.CodeEventInvalid},
		{name: "event ID", mod: events(badID), status: http.StatusBadRequest, code: aip.CodeEventInvalid},
		{name: "no kind", mod: events(event("", "")), status: http.StatusBadRequest, code: aip.CodeEventInvalid},
		{name: "kind too long", mod: events(event(strings.Repeat("k", 257), "")), status: http.StatusBadRequest, code: aip.CodeEventInvalid},
		{name: "future occurred_at", mod: events(future), status: http.StatusBadRequest, code: aip.CodeEventInvalid},
		{name: "stale sent_at", mod: func(w *eventWorld, dl *eventDelivery) {
			dl.env.SentAt = aip.At(now.Add(-aip.MaxEventDeliveryAge - time.Minute))
		},
			status: http.StatusBadRequest, code: aip.CodeEventInvalid},
		{name: "future sent_at", mod: func(w *eventWorld, dl *eventDelivery) {
			dl.env.SentAt = aip.At(now.Add(aip.MaxEnvelopeSkew + time.Minute))
		},
			status: http.StatusBadRequest, code: aip.CodeEventInvalid},
		{name: "no event log", opts: eventWorldOptions{noEvents: true},
			status: http.StatusServiceUnavailable, code: aip.CodeEventUnavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newEventWorld(t, c.opts)
			dl := w.delivery(event("k", `{"n":1}`))
			if c.mod != nil {
				c.mod(w, dl)
			}
			if c.unsigned {
				w.postUnsigned(dl.sign(t), c.status, c.code)
				if n := len(w.stored(tenant)); n != 0 {
					t.Errorf("a refused delivery stored %d events", n)
				}
				return
			}
			status, ans, header := w.post(dl)
			checkRefusal(t, status, ans, c.status, c.code)
			if c.code == aip.CodeEventUnavailable && header.Get("Retry-After") != "1" {
				t.Errorf("Retry-After %q, want 1", header.Get("Retry-After"))
			}
			if n := len(w.stored(tenant)); n != 0 {
				t.Errorf("a refused delivery stored %d events", n)
			}
		})
	}
}

// The events of a delivery that is still accepted at its limits.
func TestConnectorEventsAtLimits(t *testing.T) {
	w := newEventWorld(t, eventWorldOptions{})
	es := make([]aip.Event, aip.MaxEventsPerDelivery)
	for i := range es {
		es[i] = event(strings.Repeat("k", 256), "")
	}
	// An aip_connector equal to the stamp is accepted as it is.
	r := &w.replica
	stamp := fmt.Sprintf(`{"aip_connector":{"lease_sequence":%d,"channel_id":%q,"version_id":%q,"replica_id":%q,"instance_id":%q}}`,
		r.HealthRevision, channel, r.VersionID, r.ID, r.InstanceID)
	es[1].Data = json.RawMessage(stamp)
	es[2].Data = json.RawMessage(`null`)
	status, ans, _ := w.post(w.delivery(es...))
	if status != http.StatusOK {
		t.Fatalf("HTTP %d %+v", status, ans.Body.Error)
	}
	if n := len(w.stored(tenant)); n != aip.MaxEventsPerDelivery {
		t.Errorf("log holds %d events, want %d", n, aip.MaxEventsPerDelivery)
	}
}

func TestConnectorEventsUnusableBodies(t *testing.T) {
	w := newEventWorld(t, eventWorldOptions{})
	for _, c := range []struct {
		name   string
		body   []byte
		status int
		code   string
	}{
		{"oversized body", bytes.Repeat([]byte(" "), aip.MaxEventDeliveryBytes+1), http.StatusRequestEntityTooLarge, aip.CodeEventInvalid},
		{"not JSON", []byte("hello"), http.StatusBadRequest, aip.CodeEventInvalid},
		{"unsigned", func() []byte {
			env := w.delivery(event("k", "")).env
			raw, _ := json.Marshal(env)
			return raw
		}(), http.StatusForbidden, aip.CodeEventNotAuthorized},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Not authenticated as a replica's: unsigned.
			w.postUnsigned(c.body, c.status, c.code)
		})
	}
}

// getEvents reads GET /aip/v1/events with query as tenantID ("" sends no
// token).
func (w *eventWorld) getEvents(tenantID, query string) (int, []byte) {
	w.t.Helper()
	req, err := http.NewRequestWithContext(w.t.Context(), http.MethodGet, w.srv.URL+dispatch.PathEvents+query, nil)
	must(w.t, err)
	if tenantID != "" {
		now := time.Now()
		tok, err := tenanttoken.Mint(w.issuer, tenanttoken.Claims{Issuer: issuer, Audience: tenanttoken.DefaultAudience, TenantID: tenantID,
			IssuedAt: now, Expiry: now.Add(time.Hour)})
		must(w.t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := w.srv.Client().Do(req)
	must(w.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	must(w.t, err)
	return resp.StatusCode, body
}

func TestEventsRead(t *testing.T) {
	w := newEventWorld(t, eventWorldOptions{})
	var ids []string
	for i := range 5 {
		e := event("k", fmt.Sprintf(`{"i":%d}`, i))
		ids = append(ids, e.ID)
		if status, ans, _ := w.post(w.delivery(e)); status != http.StatusOK {
			t.Fatalf("delivery %d: HTTP %d %+v", i, status, ans.Body.Error)
		}
	}
	// Another tenant's events, appended directly.
	theirs := event("k", "")
	_, err := w.reg.AppendEvents(t.Context(), registry.EventBatch{TenantID: otherTenant, InstanceID: aip.NewID(aip.PrefixInstance),
		ReplicaID: aip.NewID(aip.PrefixReplica), ChannelID: channel, Events: []aip.Event{theirs}, ReceivedAt: time.Now()})
	must(t, err)

	page := func(tenantID, query string) dispatch.EventsResponse {
		t.Helper()
		status, body := w.getEvents(tenantID, query)
		if status != http.StatusOK {
			t.Fatalf("GET %s as %s: HTTP %d %s", query, tenantID, status, body)
		}
		var r dispatch.EventsResponse
		must(t, json.Unmarshal(body, &r))
		if r.Events == nil {
			t.Fatalf("GET %s: events is null, want a list: %s", query, body)
		}
		return r
	}
	var got []string
	after := uint64(0)
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		r := page(tenant, fmt.Sprintf("?after=%d&limit=2", after))
		for _, e := range r.Events {
			if e.Sequence != uint64(len(got)+1) || e.ChannelID != channel || e.InstanceID != w.replica.InstanceID {
				t.Errorf("event %+v: want sequence %d on %s of %s", e, len(got)+1, channel, w.replica.InstanceID)
			}
			got = append(got, e.Event.ID)
		}
		if len(r.Events) > 0 && r.NextAfter != r.Events[len(r.Events)-1].Sequence {
			t.Errorf("next_after %d, want the last sequence %d", r.NextAfter, r.Events[len(r.Events)-1].Sequence)
		}
		after = r.NextAfter
		if !r.More {
			break
		}
	}
	if diff := cmp.Diff(ids, got); diff != "" {
		t.Errorf("paged events (-want +got):\n%s", diff)
	}
	if r := page(tenant, "?after=5"); len(r.Events) != 0 || r.NextAfter != 5 || r.More {
		t.Errorf("after the last event: %+v, want no events, next_after 5, more false", r)
	}
	if r := page(tenant, ""); len(r.Events) != 5 || r.More {
		t.Errorf("default page: %d events more %v, want 5 and false", len(r.Events), r.More)
	}
	if r := page(otherTenant, ""); len(r.Events) != 1 || r.Events[0].Event.ID != theirs.ID {
		t.Errorf("%s reads %+v, want only its own event %s", otherTenant, r.Events, theirs.ID)
	}
	if r := page("tenant-empty", ""); len(r.Events) != 0 || r.NextAfter != 0 {
		t.Errorf("an empty log reads %+v", r)
	}

	if status, body := w.getEvents("", ""); status != http.StatusUnauthorized || !strings.Contains(string(body), dispatch.CodeUnauthorized) {
		t.Errorf("without a token: HTTP %d %s, want 401 %s", status, body, dispatch.CodeUnauthorized)
	}
	for _, c := range []struct{ query, reason string }{
		{"?after=-1", "after must be"},
		{"?after=x", "after must be"},
		{"?limit=0", "limit must be"},
		{"?limit=1001", "limit must be"},
		{"?limit=two", "limit must be"},
		{"?afterr=3", `unknown query parameter \"afterr\"`},
		{"?after=0&after=5", `\"after\" is given 2 times`},
		{"?after=%zz", "malformed"},
	} {
		status, body := w.getEvents(tenant, c.query)
		if status != http.StatusBadRequest || !strings.Contains(string(body), c.reason) || !strings.Contains(string(body), dispatch.CodeRequestInvalid) {
			t.Errorf("GET %s: HTTP %d %s, want 400 %s saying %q", c.query, status, body, dispatch.CodeRequestInvalid, c.reason)
		}
	}
}

// TestEventsReadWithoutEventLog: a dispatcher without an event log answers
// a read 503 connector_event.unavailable like its ingress answers a
// delivery: temporary, retryable after 1 s, with Retry-After (every 503
// carries one, docs/dispatch-api.md). It was answered not retryable and
// without Retry-After.
func TestEventsReadWithoutEventLog(t *testing.T) {
	w := newEventWorld(t, eventWorldOptions{noEvents: true})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, w.srv.URL+dispatch.PathEvents, nil)
	must(t, err)
	now := time.Now()
	tok, err := tenanttoken.Mint(w.issuer, tenanttoken.Claims{Issuer: issuer, Audience: tenanttoken.DefaultAudience, TenantID: tenant,
		IssuedAt: now, Expiry: now.Add(time.Hour)})
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := w.srv.Client().Do(req)
	must(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	must(t, err)
	var e dispatch.ErrorResponse
	if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(body, &e) != nil || e.Error == nil || e.Error.Code != aip.CodeEventUnavailable {
		t.Fatalf("HTTP %d %s, want 503 %s", resp.StatusCode, body, aip.CodeEventUnavailable)
	}
	if !e.Error.IsRetryable() || e.Error.RetryAfterMS == nil || *e.Error.RetryAfterMS != 1000 || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("%s (Retry-After %q): want retryable after 1 s with Retry-After 1", body, resp.Header.Get("Retry-After"))
	}
}

func TestNewRequiresRecordsWithEvents(t *testing.T) {
	key, _ := aip.GenerateSigningKey()
	reg, err := memregistry.New(memregistry.Config{})
	must(t, err)
	verifier, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: []tenanttoken.Issuer{{Name: issuer, DIDs: []string{key.DID()}}}})
	must(t, err)
	_, err = dispatch.New(dispatch.Config{SigningKey: key, PrincipalID: gatewayID}, dispatch.Deps{Resolver: reg, Catalog: reg, Tokens: verifier, Events: reg})
	if err == nil || !strings.Contains(err.Error(), "Deps.Records") {
		t.Errorf("New without Records: %v, want an error naming Deps.Records", err)
	}
}

// A delivery as large as allowed, with the most events, is stored, and
// its answer (the events with their stamps) fits in what a host reads.
func TestConnectorEventsLargestDelivery(t *testing.T) {
	w := newEventWorld(t, eventWorldOptions{})
	blob := strings.Repeat("x", (aip.MaxEventDeliveryBytes-12_000)/aip.MaxEventsPerDelivery-120)
	es := make([]aip.Event, aip.MaxEventsPerDelivery)
	for i := range es {
		es[i] = event("k", `{"b":"`+blob+`"}`)
	}
	dl := w.delivery(es...)
	if n := len(dl.sign(t)); n > aip.MaxEventDeliveryBytes || n < aip.MaxEventDeliveryBytes-64<<10 {
		t.Fatalf("the delivery is %d bytes, not just under the limit: adjust the blob", n)
	}
	resp, err := w.srv.Client().Post(w.srv.URL+aip.EventsPath, "application/json", bytes.NewReader(dl.sign(t)))
	must(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	must(t, err)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP %d: %.300s", resp.StatusCode, raw)
	}
	if len(raw) <= aip.MaxEventDeliveryBytes || len(raw) > aip.MaxEventAnswerBytes {
		t.Errorf("the answer is %d bytes; want more than the delivery's bound (the stamps) and at most aip.MaxEventAnswerBytes (%d)",
			len(raw), aip.MaxEventAnswerBytes)
	}
	if n := len(w.stored(tenant)); n != aip.MaxEventsPerDelivery {
		t.Errorf("stored %d events, want %d", n, aip.MaxEventsPerDelivery)
	}
}

// TestEventsReadIsBoundedInBytes: a page stops before its events' data
// pass dispatch.MaxEventPageBytes (with more set), and paging on returns
// every event once, in order.
func TestEventsReadIsBoundedInBytes(t *testing.T) {
	// Text of HTML-sensitive characters: an answer that escaped them
	// (\u003c, six bytes for one) would be six times the data it counted.
	for _, c := range []string{"x", "<"} {
		t.Run(c, func(t *testing.T) { eventsReadIsBoundedInBytes(t, c) })
	}
}

func eventsReadIsBoundedInBytes(t *testing.T, c string) {
	w := newEventWorld(t, eventWorldOptions{})
	blob := strings.Repeat(c, 200<<10)
	const n = 50 // 10 MB of data
	for i := range n / 10 {
		es := make([]aip.Event, 10)
		for j := range es {
			es[j] = event("k", fmt.Sprintf(`{"i":%d,"b":%q}`, i*10+j, blob))
		}
		_, err := w.reg.AppendEvents(t.Context(), registry.EventBatch{TenantID: tenant, InstanceID: w.replica.InstanceID,
			ReplicaID: w.replica.ID, ChannelID: channel, Events: es, ReceivedAt: time.Now()})
		must(t, err)
	}
	var seen []uint64
	after := uint64(0)
	for pages := 0; ; pages++ {
		if pages > n {
			t.Fatal("paging does not end")
		}
		status, body := w.getEvents(tenant, fmt.Sprintf("?after=%d&limit=1000", after))
		if status != http.StatusOK {
			t.Fatalf("HTTP %d %.200s", status, body)
		}
		if len(body) > dispatch.MaxEventPageBytes+300<<10 {
			t.Errorf("a page is %d bytes, over the bound %d", len(body), dispatch.MaxEventPageBytes)
		}
		var r dispatch.EventsResponse
		must(t, json.Unmarshal(body, &r))
		if pages == 0 && (!r.More || len(r.Events) == n) {
			t.Errorf("the first page holds %d of %d events (more %v): not bounded", len(r.Events), n, r.More)
		}
		for _, e := range r.Events {
			seen = append(seen, e.Sequence)
		}
		after = r.NextAfter
		if !r.More {
			break
		}
	}
	if len(seen) != n {
		t.Fatalf("read %d events, want %d", len(seen), n)
	}
	for i, s := range seen {
		if s != uint64(i+1) {
			t.Fatalf("sequence %d at position %d", s, i)
		}
	}
}

// blockingLog holds AppendEvents until release is closed.
type blockingLog struct {
	registry.EventLog
	entered chan struct{}
	release chan struct{}
}

func (b *blockingLog) AppendEvents(ctx context.Context, batch registry.EventBatch) ([]registry.StoredEvent, error) {
	b.entered <- struct{}{}
	<-b.release
	return b.EventLog.AppendEvents(ctx, batch)
}

// TestConnectorEventsCapacity: beyond Config.MaxEventDeliveries deliveries
// in work, one more is refused with a temporary connector_event.capacity
// (the host retries), and is accepted once a slot is free.
func TestConnectorEventsCapacity(t *testing.T) {
	bl := &blockingLog{entered: make(chan struct{}, 1), release: make(chan struct{})}
	w := newEventWorld(t, eventWorldOptions{
		events: func(l registry.EventLog) registry.EventLog { bl.EventLog = l; return bl },
		cfg:    func(c *dispatch.Config) { c.MaxEventDeliveries = 1 },
	})
	first := make(chan int, 1)
	dl := w.delivery(event("k", `{"n":1}`))
	raw := dl.sign(t)
	go func() {
		resp, err := w.srv.Client().Post(w.srv.URL+aip.EventsPath, "application/json", bytes.NewReader(raw))
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	<-bl.entered // the first delivery holds the only slot
	status, ans, hdr := w.post(w.delivery(event("k", `{"n":2}`)))
	checkRefusal(t, status, ans, http.StatusServiceUnavailable, aip.CodeEventCapacity)
	if pe := ans.Body.Error.Error; !pe.IsRetryable() || hdr.Get("Retry-After") == "" {
		t.Errorf("capacity refusal %+v (Retry-After %q): want retryable with a Retry-After", pe, hdr.Get("Retry-After"))
	}
	close(bl.release)
	if s := <-first; s != http.StatusOK {
		t.Fatalf("the first delivery: HTTP %d", s)
	}
	bl.entered = make(chan struct{}, 8)
	if status, ans, _ := w.post(w.delivery(event("k", `{"n":3}`))); status != http.StatusOK {
		t.Fatalf("after the slot was freed: HTTP %d %+v", status, ans.Body.Error)
	}
}

// TestConnectorEventBodiesShareAMemoryBudget: the ingress needs no token,
// so a delivery's body is read only within Config.MaxEventBodyBytes: with
// the budget taken by a delivery still sending its body, the next, from
// another address, waits (aip_dispatch_event_deliveries_waiting{reason=
// "budget"}) instead of being read, and is read and accepted once the
// first ends. A Content-Length above the largest delivery is refused
// unread.
func TestConnectorEventBodiesShareAMemoryBudget(t *testing.T) {
	w := newEventWorld(t, eventWorldOptions{cfg: func(c *dispatch.Config) { c.MaxEventBodyBytes = aip.MaxEventDeliveryBytes }})
	waiting := func() string {
		return w.metric(`aip_dispatch_event_deliveries_waiting{reason="budget"}`)
	}

	// A delivery announcing the largest body, of which it sends a little.
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, w.srv.URL+aip.EventsPath, pr)
	must(t, err)
	req.ContentLength = aip.MaxEventDeliveryBytes
	slow := make(chan int, 1)
	go func() {
		resp, err := w.srv.Client().Do(req)
		if err != nil {
			slow <- 0
			return
		}
		resp.Body.Close()
		slow <- resp.StatusCode
	}()
	_, err = pw.Write([]byte(`{"aip_version":`))
	must(t, err)
	// The second is sent once the first holds the whole budget (it is
	// being read): sent earlier, it could take the budget first.
	for dispatch.EventBodyBytesReserved(w.d) != aip.MaxEventDeliveryBytes {
		select {
		case s := <-slow:
			t.Fatalf("the first delivery ended before it was read: HTTP %d", s)
		case <-time.After(5 * time.Millisecond): // polling the budget
		}
	}

	second := make(chan int, 1)
	go func() {
		status, _, _ := w.postVia(clientFrom("127.0.0.2"), w.delivery(event("k", `{"n":2}`)))
		second <- status
	}()
	for waiting() != "1" {
		select {
		case s := <-second:
			t.Fatalf("the second delivery was read while the budget was taken: HTTP %d", s)
		case <-time.After(5 * time.Millisecond): // polling the gauge
		}
	}
	pw.CloseWithError(errors.New("the host gave up")) // the first ends unfinished
	if s := <-slow; s == http.StatusOK {
		t.Errorf("the unfinished delivery: HTTP %d", s)
	}
	if s := <-second; s != http.StatusOK {
		t.Fatalf("the second delivery: HTTP %d, want it accepted once the budget was free", s)
	}
	if n := len(w.stored(tenant)); n != 1 {
		t.Errorf("%d events stored, want 1", n)
	}

	// Too large, said up front: refused without reading.
	hr, hw := io.Pipe()
	defer hw.Close()
	huge, err := http.NewRequestWithContext(t.Context(), http.MethodPost, w.srv.URL+aip.EventsPath, hr)
	must(t, err)
	huge.ContentLength = aip.MaxEventDeliveryBytes + 1
	resp, err := w.srv.Client().Do(huge)
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a delivery announcing %d bytes: HTTP %d, want 413", huge.ContentLength, resp.StatusCode)
	}

	key, _ := aip.GenerateSigningKey()
	if _, err := dispatch.New(dispatch.Config{SigningKey: key, PrincipalID: gatewayID, MaxEventBodyBytes: 1}, dispatch.Deps{}); err == nil {
		t.Error("a budget smaller than the largest delivery was accepted")
	}
}

// TestEventsReadAfterPastTheLog: an after beyond the last sequence the
// tenant's log has given out (a cursor of another tenant's log, a typo, a
// cursor kept across a restore of the registry) is 400 naming the log's
// last sequence. It was answered as an empty page with next_after the
// cursor and more false, so a reader polling on waited there and silently
// skipped every event stored up to it.
func TestEventsReadAfterPastTheLog(t *testing.T) {
	w := newEventWorld(t, eventWorldOptions{})
	for i := range 3 {
		if status, ans, _ := w.post(w.delivery(event("k", fmt.Sprintf(`{"i":%d}`, i)))); status != http.StatusOK {
			t.Fatalf("delivery %d: HTTP %d %+v", i, status, ans.Body.Error)
		}
	}
	for _, c := range []struct {
		tenant, query string
		last          int
	}{
		{tenant, "?after=4", 3},
		{tenant, "?after=18446744073709551615&limit=5", 3},
		{"tenant-empty", "?after=1", 0},
	} {
		status, body := w.getEvents(c.tenant, c.query)
		want := fmt.Sprintf("is past the last sequence this tenant's event log has given out (%d)", c.last)
		if status != http.StatusBadRequest || !strings.Contains(string(body), dispatch.CodeRequestInvalid) || !strings.Contains(string(body), want) {
			t.Errorf("GET %s as %s: HTTP %d %s; want 400 %s saying %q", c.query, c.tenant, status, body, dispatch.CodeRequestInvalid, want)
		}
	}
	// At the last sequence the page is empty, and the next event follows.
	status, body := w.getEvents(tenant, "?after=3")
	if status != http.StatusOK || !strings.Contains(string(body), `"next_after":3`) {
		t.Fatalf("GET ?after=3: HTTP %d %s, want an empty page", status, body)
	}
	if status, ans, _ := w.post(w.delivery(event("k", `{"i":3}`))); status != http.StatusOK {
		t.Fatalf("delivery: HTTP %d %+v", status, ans.Body.Error)
	}
	var r dispatch.EventsResponse
	status, body = w.getEvents(tenant, "?after=3")
	must(t, json.Unmarshal(body, &r))
	if status != http.StatusOK || len(r.Events) != 1 || r.Events[0].Sequence != 4 {
		t.Fatalf("GET ?after=3 after a fourth event: HTTP %d %s", status, body)
	}
}
