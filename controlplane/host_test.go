package controlplane_test

import (
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// This file checks that the real host (hostsdk) and the real service agree
// on the wire: registration claims, lease sequences, heartbeats, drain and
// offline. The control plane itself never imports hostsdk; only this test
// does.

// echoConnector is the smallest connector: one tool that echoes.
type echoConnector struct{ manifest aip.Manifest }

func (c echoConnector) Manifest(context.Context, hostsdk.TenantContext) (*aip.Manifest, error) {
	m := c.manifest
	return &m, nil
}

func (echoConnector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	return call.Complete(map[string]any{"echo": json.RawMessage(call.Action.Input)})
}

// signalingStore reports every lifecycle result the store decided.
type signalingStore struct {
	controlplane.Store
	results chan registry.LifecycleResult
}

func (s *signalingStore) ApplyLifecycle(ctx context.Context, cmds []registry.LifecycleCommand) ([]registry.LifecycleResult, error) {
	res, err := s.Store.ApplyLifecycle(ctx, cmds)
	if err == nil {
		for i := range res {
			s.results <- res[i]
		}
	}
	return res, err
}

func TestRealHostLifecycle(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb newBackendFunc) {
		clock := registrytest.NewClock(time.Now())
		b := nb(t, clock)
		ctx := t.Context()
		const trustDomain = "fleet.test"

		// Admit a version whose manifest is exactly what the host binds and
		// digests (agent in the trust domain, no DID).
		typ := registry.ConnectorType{ID: aip.NewID(aip.PrefixType), Name: "echo", Owner: "owner-echo", Enabled: true}
		m := registrytest.Manifest("service:echo", []aip.Capability{registrytest.Capability("echo.say", "echoes its input")})
		m.Agent.TrustDomain = trustDomain
		v := registrytest.Version(aip.NewID(aip.PrefixVersion), typ.ID, "1.0.0", typ.Owner, registry.VersionActive, m)
		inst := registry.ConnectorInstance{
			ID: aip.NewID(aip.PrefixInstance), ConnectorTypeID: typ.ID, VersionID: v.ID, TenantID: "tenant-1",
			ConfigRevision: 2, SecretProviderRef: "secret://echo", Status: registry.InstanceEnabled,
		}
		for _, err := range []error{b.Admin.PutConnectorType(ctx, typ), b.Admin.AdmitVersion(ctx, v), b.Admin.PutInstance(ctx, inst)} {
			if err != nil {
				t.Fatal(err)
			}
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		hostKey, err := aip.GenerateSigningKey()
		if err != nil {
			t.Fatal(err)
		}
		rep := registry.ConnectorReplica{
			ID: aip.NewID(aip.PrefixReplica), InstanceID: inst.ID, VersionID: v.ID,
			Endpoint:        "http://" + ln.Addr().String() + aip.MessagesPath,
			PeerPrincipalID: m.Agent.ID, PeerPrincipalKind: m.Agent.Kind, PeerDID: hostKey.DID(),
			TrustDomain: trustDomain, TransportProfile: aip.NativeHTTPProfile, Topology: aip.DefaultTopology(),
			Status: aip.ReplicaOffline, LeaseExpiresAt: clock.Now(), Capacity: 8,
		}
		if err := b.Admin.PutReplica(ctx, rep); err != nil {
			t.Fatal(err)
		}

		store := &signalingStore{Store: b.Store, results: make(chan registry.LifecycleResult, 64)}
		e := &env{t: t, ctx: ctx, clock: clock, b: b, key: controlKey}
		e.start(store)
		gateway := registrytest.Key("gateway")
		h, err := hostsdk.New(hostsdk.Config{
			Bind: "127.0.0.1:0", Listener: ln, PublicEndpoint: rep.Endpoint,
			ControlPlaneEndpoint: e.srv.URL + controlplane.PathControl, ControlPlaneDID: controlKey.DID(),
			AllowInsecureLoopbackHTTP: true, SigningKey: hostKey,
			ConnectorTypeID: typ.ID, VersionID: v.ID, InstanceID: inst.ID, ReplicaID: rep.ID, TenantID: inst.TenantID,
			GatewayPrincipalID: "service:gateway", GatewayDID: gateway.DID(), TrustDomain: trustDomain,
			ArtifactDigest: v.Attestation.ArtifactDigest, SecretProviderRef: inst.SecretProviderRef, ConfigRevision: inst.ConfigRevision,
			MaxInFlight: 8, LeaseTTL: 2 * time.Second, HeartbeatInterval: time.Second, DrainTimeout: time.Second,
			StateDir: t.TempDir(), Now: clock.Now,
		}, echoConnector{manifest: m})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Start(ctx); err != nil {
			t.Fatalf("the host could not register with the real control plane: %v", err)
		}
		next := func(op string) registry.LifecycleResult {
			t.Helper()
			select {
			case r := <-store.results:
				if r.Err != nil {
					t.Fatalf("%s: %v", op, r.Err)
				}
				return r
			case <-time.After(20 * time.Second):
				t.Fatalf("no %s reached the registry", op)
			}
			return registry.LifecycleResult{}
		}
		if r := next("register"); r.Replica.Status != aip.ReplicaReady || r.Replica.HealthRevision != 1 {
			t.Fatalf("after register: %+v", r.Replica)
		}
		// Two heartbeats, each fenced on the previous sequence.
		for seq := uint64(2); seq <= 3; seq++ {
			r := next("heartbeat")
			if r.Outcome.Lease == nil || r.Outcome.Lease.Sequence != seq || r.Replica.Status != aip.ReplicaReady {
				t.Fatalf("heartbeat: %+v %+v", r.Outcome, r.Replica)
			}
		}
		if err := h.Stop(ctx); err != nil {
			t.Fatalf("the host's shutdown was not clean: %v", err)
		}
		var last registry.LifecycleResult
		for last.Outcome.Status != aip.OutcomeOffline {
			last = next("drain and offline")
		}
		got := e.replica(rep.ID)
		if got.Status != aip.ReplicaOffline || got.HealthRevision != last.Replica.HealthRevision || got.LeaseValid(clock.Now()) {
			t.Fatalf("after the host stopped: %s at %d, lease %s", got.Status, got.HealthRevision, got.LeaseExpiresAt)
		}
	})
}
