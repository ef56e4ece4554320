package dispatch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// eventsConnector is the test connector with an event channel: it hands
// its publisher to the test.
type eventsConnector struct {
	replicaConnector
	publisher chan *hostsdk.EventPublisher
}

func eventsManifest() *aip.Manifest {
	m := testManifest()
	m.Channels = []json.RawMessage{json.RawMessage(`{"id":"` + channel + `"}`)}
	return m
}

func (c eventsConnector) Manifest(context.Context, hostsdk.TenantContext) (*aip.Manifest, error) {
	return eventsManifest(), nil
}

func (c eventsConnector) RunEvents(ctx context.Context, p *hostsdk.EventPublisher) error {
	c.publisher <- p
	<-ctx.Done()
	return nil
}

// realEventHost is a real host delivering events to a real dispatcher over
// loopback, with the replica registered in the dispatcher's registry (a
// memregistry) at the lease sequence the host's control plane granted.
type realEventHost struct {
	reg   *memregistry.Registry
	cfg   hostsdk.Config
	h     *hostsdk.Host
	cp    *hostsdktest.ControlPlane
	state hostsdktest.ReplicaState
	rep   registry.ConnectorReplica
	pub   *hostsdk.EventPublisher
}

// newRealEventHost starts it; edit, when set, changes the host's
// configuration before it starts.
func newRealEventHost(t *testing.T, edit func(*hostsdk.Config)) *realEventHost {
	t.Helper()
	ctx := t.Context()
	key, _ := aip.GenerateSigningKey()
	iss, _ := aip.GenerateSigningKey()
	reg, err := memregistry.New(memregistry.Config{})
	must(t, err)
	verifier, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: []tenanttoken.Issuer{{Name: issuer, DIDs: []string{iss.DID()}}}})
	must(t, err)
	d, err := dispatch.New(dispatch.Config{SigningKey: key, PrincipalID: gatewayID}, dispatch.Deps{Resolver: reg, Catalog: reg, Tokens: verifier, Events: reg, Records: reg})
	must(t, err)
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(func() { srv.Close(); d.Close() })

	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{LeaseTTL: 5 * time.Minute})
	fake := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{PrincipalID: gatewayID, TrustDomain: hostsdktest.TrustDomain, Key: key})
	cfg := hostsdktest.HostConfig(t, cp, fake, nil)
	cfg.EventEndpoint = srv.URL + aip.EventsPath
	if edit != nil {
		edit(&cfg)
	}

	m := *eventsManifest()
	m.Agent.TrustDomain = hostsdktest.TrustDomain
	must(t, reg.PutConnectorType(ctx, registry.ConnectorType{ID: cfg.ConnectorTypeID, Name: "events", Owner: "owner-test", Enabled: true}))
	version := registrytest.Version(cfg.VersionID, cfg.ConnectorTypeID, "1.0.0", "owner-test", registry.VersionActive, m)
	must(t, reg.AdmitVersion(ctx, version))
	must(t, reg.PutInstance(ctx, registry.ConnectorInstance{ID: cfg.InstanceID, ConnectorTypeID: cfg.ConnectorTypeID, VersionID: cfg.VersionID,
		TenantID: cfg.TenantID, ConfigRevision: 1, SecretProviderRef: "secret://test", Status: registry.InstanceEnabled}))

	conn := eventsConnector{replicaConnector: replicaConnector{c: newCounter(), replica: cfg.ReplicaID}, publisher: make(chan *hostsdk.EventPublisher, 1)}
	h := hostsdktest.StartHost(t, cfg, conn)
	if h.ManifestDigest() != version.ManifestDigest {
		t.Fatalf("host manifest digest %s, registry %s", h.ManifestDigest(), version.ManifestDigest)
	}
	state, ok := cp.Replica(cfg.ReplicaID)
	if !ok {
		t.Fatal("the host did not register")
	}
	p := h.Principal()
	rep := registry.ConnectorReplica{
		ID: cfg.ReplicaID, InstanceID: cfg.InstanceID, VersionID: cfg.VersionID, Endpoint: cfg.PublicEndpoint,
		PeerPrincipalID: p.ID, PeerPrincipalKind: p.Kind, PeerDID: h.DID(), TrustDomain: hostsdktest.TrustDomain,
		TransportProfile: aip.NativeHTTPProfile, Topology: aip.DefaultTopology(), Status: aip.ReplicaReady,
		LeaseExpiresAt: time.Now().Add(time.Hour), Capacity: 4, HealthRevision: state.HealthRevision,
	}
	must(t, reg.PutReplica(ctx, rep))

	var pub *hostsdk.EventPublisher
	select {
	case pub = <-conn.publisher:
	case <-time.After(20 * time.Second):
		t.Fatal("the host did not start the connector's event source")
	}
	return &realEventHost{reg: reg, cfg: cfg, h: h, cp: cp, state: state, rep: rep, pub: pub}
}

// metrics returns the host's /metrics text.
func (x *realEventHost) metrics() string {
	resp, err := http.Get("http://" + x.cfg.Bind + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// A real host delivers what its connector publishes to the dispatcher's
// ingress: the events land in the tenant's log, stamped with the replica,
// and the host's outbox empties.
func TestConnectorEventsFromRealHost(t *testing.T) {
	ctx := t.Context()
	x := newRealEventHost(t, nil)
	reg, cfg, state, pub := x.reg, x.cfg, x.state, x.pub
	e := aip.Event{ID: aip.NewID(aip.PrefixEvent), Kind: "conversation.created", Data: json.RawMessage(`{"conversation":7}`)}
	if _, err := pub.Publish(ctx, channel, e); err != nil {
		t.Fatal(err)
	}
	var log []registry.StoredEvent
	eventually(t, "the event in the tenant's log", func() bool {
		page, err := reg.Events(ctx, cfg.TenantID, 0, 10)
		must(t, err)
		log = page.Events
		return len(log) > 0
	})
	if len(log) != 1 || log[0].Event.ID != e.ID || log[0].ReplicaID != cfg.ReplicaID || log[0].ChannelID != channel {
		t.Fatalf("log %+v, want event %s from %s on %s", log, e.ID, cfg.ReplicaID, channel)
	}
	if s := stampOf(t, log[0].Event); s.ReplicaID != cfg.ReplicaID || s.LeaseSequence != state.HealthRevision {
		t.Errorf("stamp %+v, want replica %s lease sequence %d", s, cfg.ReplicaID, state.HealthRevision)
	}
	// The host acks the batch once the dispatcher's signed answer verifies.
	eventually(t, "the host to count the batch delivered", func() bool {
		return strings.Contains(x.metrics(), hostsdk.MetricEventsDelivered+" 1")
	})
}

// renewingTransport carries a host's event deliveries to the dispatcher.
// Before it forwards one it calls renew with the lease sequence the
// delivery was signed with and whether it is the first: for the first,
// the lease is renewed between the signing and the dispatcher's check. It
// records the sequence of every delivery.
type renewingTransport struct {
	base  http.RoundTripper
	renew func(ctx context.Context, signed uint64, first bool) error
	mu    sync.Mutex
	sent  []uint64
}

func (rt *renewingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	var env struct {
		Security map[string]json.RawMessage `json:"security"`
	}
	var ce aip.ConnectorEvent
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(env.Security[aip.SecurityConnectorEvent], &ce); err != nil {
		return nil, err
	}
	rt.mu.Lock()
	first := len(rt.sent) == 0
	rt.sent = append(rt.sent, ce.LeaseSequence)
	rt.mu.Unlock()
	if err := rt.renew(req.Context(), ce.LeaseSequence, first); err != nil {
		return nil, err
	}
	out := req.Clone(req.Context())
	out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	return rt.base.RoundTrip(out)
}

func (rt *renewingTransport) sequences() []uint64 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return slices.Clone(rt.sent)
}

// A delivery signed just before a heartbeat renewed the lease reaches the
// dispatcher with a lease sequence that is no longer current: the
// dispatcher refuses it (the check stays exact) with details saying so,
// and the host signs it again with its renewed lease and sends it at
// once. The batch is stored without a failed delivery and without
// waiting for the retry backoff.
func TestConnectorEventsStaleLeaseSequenceResentAtOnce(t *testing.T) {
	ctx := t.Context()
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	rt := &renewingTransport{base: base}
	x := newRealEventHost(t, func(cfg *hostsdk.Config) {
		cfg.EventTransport = rt
		cfg.HeartbeatInterval = 2 * time.Second
	})
	var renewedTo uint64
	rt.renew = func(ctx context.Context, signed uint64, first bool) error {
		// Before the first delivery, wait for the host's next heartbeat;
		// before every delivery, record the host's lease sequence in the
		// dispatcher's registry, as the control plane does on a renewal.
		for {
			resp, err := http.Get("http://" + x.cfg.Bind + hostsdk.PathReady)
			if err != nil {
				return err
			}
			var doc hostsdk.ReadyDocument
			err = json.NewDecoder(resp.Body).Decode(&doc)
			resp.Body.Close()
			if err != nil {
				return err
			}
			if doc.Lease != nil && (doc.Lease.Sequence > signed || !first) {
				if first {
					renewedTo = doc.Lease.Sequence
				}
				rep := x.rep
				rep.HealthRevision = doc.Lease.Sequence
				return x.reg.PutReplica(context.WithoutCancel(ctx), rep)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("no heartbeat renewed lease %d: %w", signed, ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}

	e := aip.Event{ID: aip.NewID(aip.PrefixEvent), Kind: "conversation.created", Data: json.RawMessage(`{"conversation":8}`)}
	if _, err := x.pub.Publish(ctx, channel, e); err != nil {
		t.Fatal(err)
	}
	var log []registry.StoredEvent
	eventually(t, "the event in the tenant's log", func() bool {
		page, err := x.reg.Events(ctx, x.cfg.TenantID, 0, 10)
		must(t, err)
		log = page.Events
		return len(log) > 0
	})
	eventually(t, "the host to count the batch delivered", func() bool {
		return strings.Contains(x.metrics(), hostsdk.MetricEventsDelivered+" 1")
	})
	if got, want := rt.sequences(), []uint64{x.state.HealthRevision, renewedTo}; !slices.Equal(got, want) {
		t.Errorf("deliveries signed with lease sequences %v, want %v (the stale one, then at once the renewed one)", got, want)
	}
	for _, l := range strings.Split(x.metrics(), "\n") {
		if strings.HasPrefix(l, hostsdk.MetricEventDeliveryFailures+"{") && !strings.HasSuffix(l, " 0") {
			t.Errorf("the host counted a failed delivery (%s); the stale sequence should have been replaced at once", l)
		}
	}
	if s := stampOf(t, log[0].Event); len(log) != 1 || log[0].Event.ID != e.ID || s.LeaseSequence != renewedTo {
		t.Errorf("log %+v, want event %s stamped with the renewed lease sequence %d", log, e.ID, renewedTo)
	}
}
