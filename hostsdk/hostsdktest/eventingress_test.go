package hostsdktest_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// TestEventIngressRefusals posts hand-made deliveries for a provisioned
// replica that never registered: a wrong signer is not authorized, the
// right one finds the replica unavailable; both answers are signed by the
// dispatcher in response to the delivery.
func TestEventIngressRefusals(t *testing.T) {
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{InMemory: true})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	in := hostsdktest.NewEventIngress(t, hostsdktest.EventIngressConfig{ControlPlane: cp, Dispatcher: d, InMemory: true})
	cfg := hostsdktest.HostConfig(t, cp, d, hostsdktest.NewMemListener())
	other, _ := aip.GenerateSigningKey()
	client := &http.Client{Transport: in.Transport()}
	for _, c := range []struct {
		name   string
		key    *aip.SigningKey
		status int
		code   string
	}{
		{"another signer", other, http.StatusForbidden, aip.CodeEventNotAuthorized},
		{"not registered", cfg.SigningKey, http.StatusServiceUnavailable, aip.CodeEventUnavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			env, err := aip.NewEnvelope(time.Now(), aip.Body{EventStream: &aip.EventStream{Events: []aip.Event{
				{ID: aip.NewID(aip.PrefixEvent), Kind: "test.event", OccurredAt: aip.At(time.Now())},
			}}})
			if err != nil {
				t.Fatal(err)
			}
			env.From = &aip.Principal{ID: "agent:test", Kind: aip.PrincipalAgent, DID: c.key.DID()}
			env.To = &aip.Principal{ID: d.PrincipalID(), Kind: aip.PrincipalService}
			env.SetSecurity(aip.SecurityConnectorEvent, aip.ConnectorEvent{
				TenantID: cfg.TenantID, InstanceID: cfg.InstanceID, ReplicaID: cfg.ReplicaID, VersionID: cfg.VersionID,
				LeaseSequence: 1, ChannelID: "test.events",
			})
			raw, err := aip.SignEnvelope(c.key, env)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Post(in.Endpoint(), "application/json", bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			v, err := aip.VerifyEnvelope(body, d.DID())
			if err != nil {
				t.Fatalf("answer %s: %v", body, err)
			}
			pe := v.Envelope.Body.Error
			if resp.StatusCode != c.status || pe == nil || pe.Error.Code != c.code ||
				v.Envelope.InResponseTo == nil || v.Envelope.InResponseTo.Message != env.MessageID {
				t.Fatalf("HTTP %d %s, want %d %s in response to the delivery", resp.StatusCode, body, c.status, c.code)
			}
			if len(in.Events()) != 0 {
				t.Errorf("refused events were stored")
			}
		})
	}
}
