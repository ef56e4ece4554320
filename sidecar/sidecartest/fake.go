package sidecartest

import (
	"context"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// FakeFleet is hostsdktest's in-process control plane and dispatcher:
// the real signed wire over loopback HTTP, without PostgreSQL. The
// dispatcher sends each action straight to the replica named in it.
type FakeFleet struct {
	ControlPlane *hostsdktest.ControlPlane
	Dispatcher   *hostsdktest.Dispatcher
	// EventIngress is the dispatcher's connector-event ingress replicas
	// deliver their events to.
	EventIngress *hostsdktest.EventIngress
	digest       string
	agent        aip.Principal
	typeID       string
	versionID    string
	instanceID   string
	artifact     string
}

// NewFakeFleet starts a fake fleet for the test.
func NewFakeFleet(t testing.TB) *FakeFleet {
	t.Helper()
	f := &FakeFleet{
		ControlPlane: hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{}),
		Dispatcher:   hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain}),
		typeID:       aip.NewID(aip.PrefixType), versionID: aip.NewID(aip.PrefixVersion), instanceID: aip.NewID(aip.PrefixInstance),
		artifact: aip.DigestBytes([]byte("aip-sidecar")),
	}
	f.EventIngress = hostsdktest.NewEventIngress(t, hostsdktest.EventIngressConfig{ControlPlane: f.ControlPlane, Dispatcher: f.Dispatcher})
	return f
}

// Events implements Fleet.
func (f *FakeFleet) Events(t testing.TB) []aip.Event { return f.EventIngress.Events() }

// Kind implements Fleet.
func (f *FakeFleet) Kind() string { return "fake" }

// TrustDomain implements Fleet.
func (f *FakeFleet) TrustDomain() string { return hostsdktest.TrustDomain }

// Admit implements Fleet: replicas must register this manifest's digest.
func (f *FakeFleet) Admit(t testing.TB, m *aip.Manifest) {
	t.Helper()
	d, err := aip.ManifestDigest(m)
	if err != nil {
		t.Fatal(err)
	}
	f.digest, f.agent = d, m.Agent
}

// NewReplica implements Fleet.
func (f *FakeFleet) NewReplica(t testing.TB, opts ReplicaOptions) *Replica {
	t.Helper()
	r := NewReplicaEnv(t, HostEnv{
		ControlEndpoint: f.ControlPlane.Endpoint(), ControlDID: f.ControlPlane.DID(),
		GatewayPrincipalID: f.Dispatcher.PrincipalID(), GatewayDID: f.Dispatcher.DID(),
		TypeID: f.typeID, VersionID: f.versionID, InstanceID: f.instanceID, TenantID: hostsdktest.TenantID,
		TrustDomain: hostsdktest.TrustDomain, ArtifactDigest: f.artifact, SecretProviderRef: "secret://sidecartest",
		EventEndpoint: f.EventIngress.Endpoint(),
	}, opts)
	r.ManifestDigest, r.AgentID, r.AgentKind = f.digest, f.agent.ID, f.agent.Kind
	f.ControlPlane.Provision(hostsdktest.ReplicaSpec{ID: r.ID, DID: r.Key.DID(), InstanceID: r.InstanceID, VersionID: r.VersionID,
		Endpoint: r.Endpoint, TenantID: r.TenantID, ArtifactDigest: f.artifact, ManifestDigest: f.digest})
	return r
}

func (f *FakeFleet) target(r *Replica) hostsdktest.Target {
	return hostsdktest.Target{
		Endpoint: r.Endpoint, Principal: aip.Principal{ID: r.AgentID, Kind: r.AgentKind}, DID: r.Key.DID(),
		TenantID: r.TenantID, InstanceID: r.InstanceID, ReplicaID: r.ID, VersionID: r.VersionID, ManifestDigest: r.ManifestDigest,
	}
}

func fakeAnswer(t testing.TB, resp *hostsdktest.Response, err error) *Answer {
	if err != nil {
		return &Answer{Err: err}
	}
	a := &Answer{HTTPStatus: resp.Status, Chunks: resp.Chunks, Raw: resp.Raw}
	if resp.Envelope != nil {
		a.Result = resp.Envelope.Body.ActionResult
		a.Error = resp.ProtocolError()
	}
	a.OutcomeUnknown = a.Error != nil && a.Error.Code == hostsdk.CodeOutcomeUnknown
	return a
}

func ctxOf(t testing.TB) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 2*time.Minute)
}

// Act implements Fleet.
func (f *FakeFleet) Act(t testing.TB, r *Replica, a *aip.Action) *Answer {
	ctx, cancel := ctxOf(t)
	defer cancel()
	resp, err := f.Dispatcher.Act(ctx, f.target(r), a)
	return fakeAnswer(t, resp, err)
}

// Cancel implements Fleet.
func (f *FakeFleet) Cancel(t testing.TB, r *Replica, actionID, capabilityID, reason string) *Answer {
	t.Helper()
	ctx, cancel := ctxOf(t)
	defer cancel()
	resp, err := f.Dispatcher.Cancel(ctx, f.target(r), actionID, capabilityID, reason)
	return fakeAnswer(t, resp, err)
}

// State implements Fleet.
func (f *FakeFleet) State(t testing.TB, r *Replica, actionID, capabilityID string) aip.ActionState {
	t.Helper()
	ctx, cancel := ctxOf(t)
	defer cancel()
	st, _, err := f.Dispatcher.Status(ctx, f.target(r), actionID, capabilityID)
	if err != nil {
		t.Fatal(err)
	}
	return st.State
}

// Transitions implements Fleet.
func (f *FakeFleet) Transitions(t testing.TB) []Transition {
	var out []Transition
	for _, o := range f.ControlPlane.Operations() {
		if o.Outcome != aip.OutcomeLease && o.Outcome != aip.OutcomeOffline {
			continue
		}
		out = append(out, Transition{At: o.At, Op: o.Op, ReplicaID: o.ReplicaID, ConnectorReady: o.Op != aip.OpHeartbeat || o.ConnectorReady})
	}
	return out
}

// AwaitRestartable implements Fleet: the lease is expired as lease
// maintenance would.
func (f *FakeFleet) AwaitRestartable(t testing.TB, r *Replica) { f.ControlPlane.ExpireLease(r.ID) }

var _ Fleet = (*FakeFleet)(nil)
