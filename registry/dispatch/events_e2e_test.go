package dispatch_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
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

// A real host delivers what its connector publishes to the dispatcher's
// ingress: the events land in the tenant's log, stamped with the replica,
// and the host's outbox empties.
func TestConnectorEventsFromRealHost(t *testing.T) {
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
	must(t, reg.PutReplica(ctx, registry.ConnectorReplica{
		ID: cfg.ReplicaID, InstanceID: cfg.InstanceID, VersionID: cfg.VersionID, Endpoint: cfg.PublicEndpoint,
		PeerPrincipalID: p.ID, PeerPrincipalKind: p.Kind, PeerDID: h.DID(), TrustDomain: hostsdktest.TrustDomain,
		TransportProfile: aip.NativeHTTPProfile, Topology: aip.DefaultTopology(), Status: aip.ReplicaReady,
		LeaseExpiresAt: time.Now().Add(time.Hour), Capacity: 4, HealthRevision: state.HealthRevision,
	}))

	var pub *hostsdk.EventPublisher
	select {
	case pub = <-conn.publisher:
	case <-time.After(20 * time.Second):
		t.Fatal("the host did not start the connector's event source")
	}
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
		resp, err := http.Get("http://" + cfg.Bind + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(body), hostsdk.MetricEventsDelivered+" 1")
	})
}
