package hostsdktest

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

// Fixture is a started host with the fake control plane and dispatcher it
// talks to: what a connector's tests need to send it actions.
type Fixture struct {
	ControlPlane *ControlPlane
	Dispatcher   *Dispatcher
	// Events is the fake event ingress the host delivers its provider
	// events to; nil unless the fixture was started with StartWithEvents.
	Events *EventIngress
	Config hostsdk.Config
	Host   *hostsdk.Host
	Target Target
}

// Start starts conn on a host (embedded SQLite journal in a temp dir
// unless edit sets another) wired to a fresh fake control plane and
// dispatcher; edit, when not nil, adjusts the host's configuration first,
// and the fake control plane pre-provisions the replica as edit left it
// (its ID, signing key, instance, version, endpoint, tenant and artifact
// digest), so a test may give the host an identity of its own (a tenant
// acme). A test of a registration the control plane refuses assembles the
// pieces: HostConfig, ControlPlane.Provision, StartHost.
// The host stops when the test ends.
func Start(t testing.TB, conn hostsdk.Connector, edit func(*hostsdk.Config)) *Fixture {
	t.Helper()
	return start(t, conn, false, edit)
}

// StartWithEvents is Start with a fake event ingress (Fixture.Events, on
// a loopback port) that the host delivers its provider events to
// (EventIngress.Configure, before edit runs): a test publishes events
// (EventSource, RouteContext.Events) and reads what the ingress stored
// with f.Events.Events or waits for it with f.Events.Await.
//
//	f := hostsdktest.StartWithEvents(t, myConnector{}, nil)
//	err := f.Events.Await(ctx, func(d []hostsdktest.Delivery) bool { return len(d) > 0 })
func StartWithEvents(t testing.TB, conn hostsdk.Connector, edit func(*hostsdk.Config)) *Fixture {
	t.Helper()
	return start(t, conn, true, edit)
}

func start(t testing.TB, conn hostsdk.Connector, events bool, edit func(*hostsdk.Config)) *Fixture {
	t.Helper()
	f := &Fixture{ControlPlane: NewControlPlane(t, ControlPlaneConfig{})}
	f.Dispatcher = NewDispatcher(t, DispatcherConfig{TrustDomain: TrustDomain})
	f.Config = HostConfig(t, f.ControlPlane, f.Dispatcher, nil)
	if events {
		f.Events = NewEventIngress(t, EventIngressConfig{ControlPlane: f.ControlPlane, Dispatcher: f.Dispatcher})
		f.Events.Configure(&f.Config)
	}
	if edit != nil {
		edit(&f.Config)
		f.ControlPlane.Provision(provisioned(f.Config))
	}
	f.Host = StartHost(t, f.Config, conn)
	f.Target = TargetOf(f.Host, f.Config)
	return f
}

// provisioned is the replica a fleet file written for cfg would
// pre-provision. The DID is that of cfg's signing key (Config.SigningKey,
// else the key in Config.SigningSeedFile); a key that cannot be loaded
// leaves it empty, and the host's own start reports the file.
func provisioned(cfg hostsdk.Config) ReplicaSpec {
	did := ""
	if cfg.SigningKey != nil {
		did = cfg.SigningKey.DID()
	} else if cfg.SigningSeedFile != "" {
		if k, err := aip.LoadSigningKey(cfg.SigningSeedFile); err == nil {
			did = k.DID()
		}
	}
	return ReplicaSpec{
		ID: cfg.ReplicaID, DID: did, InstanceID: cfg.InstanceID, VersionID: cfg.VersionID,
		Endpoint: cfg.PublicEndpoint, TenantID: cfg.TenantID, ArtifactDigest: cfg.ArtifactDigest,
	}
}

// Context returns a context for one test step: cancelled after a minute
// or when the test ends.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// NewAction returns an action with a fresh ID for capability with input
// (JSON).
func NewAction(capability, input string) *aip.Action {
	return &aip.Action{ID: aip.NewActionID(), CapabilityID: capability, Input: json.RawMessage(input)}
}

// Act sends a to the host and returns its verified answer; a transport or
// verification failure fails the test.
func (f *Fixture) Act(t testing.TB, a *aip.Action) *Response {
	t.Helper()
	resp, err := f.Dispatcher.Act(Context(t), f.Target, a)
	if err != nil {
		t.Fatalf("act %s: %v", a.CapabilityID, err)
	}
	return resp
}

// Result sends a and returns its action result; an answer without one (an
// error envelope) fails the test.
func (f *Fixture) Result(t testing.TB, a *aip.Action) *aip.ActionResult {
	t.Helper()
	resp := f.Act(t, a)
	res, err := resp.Result()
	if err != nil {
		t.Fatalf("%s: HTTP %d: %v", a.CapabilityID, resp.Status, err)
	}
	return res
}

// LeaveRunning writes into the embedded journal in cfg.StateDir what a host
// process killed while it ran actions leaves behind: each action journaled
// and started, never finished, with the tenant, capability, idempotency key
// (the action's, or its ID) and input digest the host records. Call it
// before the host starts, in Start's edit for example:
//
//	a := hostsdktest.NewAction("tickets.create", `{"title":"x"}`)
//	f := hostsdktest.Start(t, conn, func(cfg *hostsdk.Config) { hostsdktest.LeaveRunning(t, cfg, a) })
//
// The host's recovery then hands each action to the connector's Reconciler
// (or settles it outcome_unknown without one; a read-only capability's
// fails connector_host.interrupted), and a delivery of the same action
// (f.Act(t, a)) is answered with what recovery journaled, without calling
// Handle. It fails the test for a configuration whose journal is not the
// embedded one in StateDir (Config.Journal or Config.OpenJournal set).
func LeaveRunning(t testing.TB, cfg *hostsdk.Config, actions ...*aip.Action) {
	t.Helper()
	if cfg.Journal != nil || cfg.OpenJournal != nil {
		t.Fatal("hostsdktest.LeaveRunning writes the embedded journal in Config.StateDir; this configuration sets Config.Journal or Config.OpenJournal")
	}
	ctx := Context(t)
	j, err := sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: cfg.StateDir})
	if errors.Is(err, sqliteruntime.ErrLocked) {
		t.Fatalf("hostsdktest.LeaveRunning: a host has the journal in %s open (%v); call LeaveRunning before the host starts, in Start's edit", cfg.StateDir, err)
	}
	if err != nil {
		t.Fatalf("hostsdktest.LeaveRunning: open the journal in %s: %v", cfg.StateDir, err)
	}
	defer j.Close()
	now := time.Now()
	for _, a := range actions {
		digest, err := aip.DigestJSON(a.Input)
		if err != nil {
			t.Fatalf("hostsdktest.LeaveRunning: action %s: input: %v", a.ID, err)
		}
		key := a.IdempotencyKey
		if key == "" {
			key = a.ID
		}
		rec := journal.Action{
			ActionID: a.ID, CapabilityID: a.CapabilityID, TenantID: cfg.TenantID, IdempotencyKey: key,
			InputDigest: digest, FenceToken: FenceToken(now), MessageID: aip.NewID(aip.PrefixMessage), ReceivedAt: now,
		}
		if _, _, err := j.BeginAction(ctx, rec); err != nil {
			t.Fatalf("hostsdktest.LeaveRunning: action %s: %v", a.ID, err)
		}
		if err := j.StartAction(ctx, a.ID, now); err != nil {
			t.Fatalf("hostsdktest.LeaveRunning: action %s: %v", a.ID, err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatalf("hostsdktest.LeaveRunning: close the journal: %v", err)
	}
}
