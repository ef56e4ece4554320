package hostsdktest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// Fixture is a started host with the fake control plane and dispatcher it
// talks to: what a connector's tests need to send it actions.
type Fixture struct {
	ControlPlane *ControlPlane
	Dispatcher   *Dispatcher
	Config       hostsdk.Config
	Host         *hostsdk.Host
	Target       Target
}

// Start starts conn on a host (embedded SQLite journal in a temp dir
// unless edit sets another) wired to a fresh fake control plane and
// dispatcher; edit, when not nil, adjusts the host's configuration first.
// The host stops when the test ends.
func Start(t testing.TB, conn hostsdk.Connector, edit func(*hostsdk.Config)) *Fixture {
	t.Helper()
	f := &Fixture{ControlPlane: NewControlPlane(t, ControlPlaneConfig{})}
	f.Dispatcher = NewDispatcher(t, DispatcherConfig{TrustDomain: TrustDomain})
	f.Config = HostConfig(t, f.ControlPlane, f.Dispatcher, nil)
	if edit != nil {
		edit(&f.Config)
	}
	f.Host = StartHost(t, f.Config, conn)
	f.Target = TargetOf(f.Host, f.Config)
	return f
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
