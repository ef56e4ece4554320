package hostsdktest_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/examples/echo/echoconnector"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// awaitWithin runs await and fails the test if it has not returned within
// a few seconds (a predicate that deadlocks would otherwise hang the test
// until go test's own timeout).
func awaitWithin(t *testing.T, await func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- await(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Await did not return: its predicate could not call the fake's own methods")
	}
}

// TestControlPlaneAwaitPredicateMayCallIt: a predicate that asks the
// control plane for a replica's state or its operations, as a test
// naturally writes one, does not deadlock Await. (The host registers and
// goes offline first, so that nothing else waits for the control plane.)
func TestControlPlaneAwaitPredicateMayCallIt(t *testing.T) {
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{InMemory: true})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	cfg := hostsdktest.HostConfig(t, cp, d, hostsdktest.NewMemListener())
	h := hostsdktest.StartHost(t, cfg, echoconnector.Connector{})
	if err := h.Stop(hostsdktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	awaitWithin(t, func(ctx context.Context) error {
		return cp.Await(ctx, func(ops []hostsdktest.Operation) bool {
			r, ok := cp.Replica(cfg.ReplicaID)
			return ok && r.Status == aip.ReplicaOffline && len(cp.Operations()) == len(ops) && len(ops) >= 2
		})
	})
}

// TestEventIngressAwaitPredicateMayCallIt: a predicate that reads the
// ingress's stored events or deliveries does not deadlock Await.
func TestEventIngressAwaitPredicateMayCallIt(t *testing.T) {
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{InMemory: true})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	in := hostsdktest.NewEventIngress(t, hostsdktest.EventIngressConfig{ControlPlane: cp, Dispatcher: d, InMemory: true})
	cfg := hostsdktest.HostConfig(t, cp, d, hostsdktest.NewMemListener())
	env, err := aip.NewEnvelope(time.Now(), aip.Body{EventStream: &aip.EventStream{Events: []aip.Event{
		{ID: aip.NewID(aip.PrefixEvent), Kind: "test.event", OccurredAt: aip.At(time.Now())},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	env.From = &aip.Principal{ID: "agent:test", Kind: aip.PrincipalAgent, DID: cfg.SigningKey.DID()}
	env.To = &aip.Principal{ID: d.PrincipalID(), Kind: aip.PrincipalService}
	env.SetSecurity(aip.SecurityConnectorEvent, aip.ConnectorEvent{
		TenantID: cfg.TenantID, InstanceID: cfg.InstanceID, ReplicaID: cfg.ReplicaID, VersionID: cfg.VersionID,
		LeaseSequence: 1, ChannelID: "test.events",
	})
	raw, err := aip.SignEnvelope(cfg.SigningKey, env)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: in.Transport()}
	resp, err := client.Post(in.Endpoint(), "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	awaitWithin(t, func(ctx context.Context) error {
		return in.Await(ctx, func(ds []hostsdktest.Delivery) bool {
			return len(ds) == 1 && len(in.Deliveries()) == 1 && len(in.Events()) == 0
		})
	})
}
