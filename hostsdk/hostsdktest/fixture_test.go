package hostsdktest_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/examples/echo/echoconnector"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// TestFixture: Start wires a host to the fakes (edit applied first), and
// Result and Act send actions through it.
func TestFixture(t *testing.T) {
	edited := false
	f := hostsdktest.Start(t, echoconnector.Connector{}, func(cfg *hostsdk.Config) { edited = true; cfg.MaxInFlight = 3 })
	if !edited || f.Config.MaxInFlight != 3 || f.Target.ReplicaID != f.Config.ReplicaID || f.Target.DID != f.Host.DID() {
		t.Fatalf("fixture %+v", f.Target)
	}
	a := hostsdktest.NewAction(echoconnector.CapSay, `{"message":"hi"}`)
	res := f.Result(t, a)
	var out echoconnector.Output
	if err := json.Unmarshal(res.Output, &out); err != nil || res.Status != aip.ResultCompleted || res.ActionID != a.ID || out.SideEffects != 1 {
		t.Fatalf("result %+v (%s)", res, res.Output)
	}
	if resp := f.Act(t, hostsdktest.NewAction(echoconnector.CapSay, `{"msg":"x"}`)); resp.Status != http.StatusBadRequest || resp.ProtocolError() == nil {
		t.Fatalf("invalid input answered %d %s", resp.Status, resp.Raw)
	}
}

// TestActInputNotJSON: an action whose input is not JSON (a typo, or ""
// for a capability that takes no input) is refused before signing with an
// error naming the action and its input, not with the envelope encoder's
// "error calling MarshalJSON for type json.RawMessage".
func TestActInputNotJSON(t *testing.T) {
	f := hostsdktest.Start(t, echoconnector.Connector{}, nil)
	for _, input := range []string{``, `not json`, `{"message":"hi"`} {
		a := hostsdktest.NewAction(echoconnector.CapSay, input)
		_, err := f.Dispatcher.Act(hostsdktest.Context(t), f.Target, a)
		if err == nil {
			t.Fatalf("input %q: sent", input)
		}
		for _, want := range []string{"the input of action " + a.ID + " is not JSON", strconv.Quote(input), "{} for a capability that takes no input"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("input %q: error %q does not say %q", input, err, want)
			}
		}
	}
	// A nil input is sent (as null) for the host to refuse.
	a := hostsdktest.NewAction(echoconnector.CapSay, `{}`)
	a.Input = nil
	if resp := f.Act(t, a); resp.ProtocolError() == nil || resp.ProtocolError().Code != hostsdk.CodeInputInvalid {
		t.Fatalf("nil input answered %d %s", resp.Status, resp.Raw)
	}
}

// TestDispatcherSignsAsTheHostsDefaultGateway: a fake dispatcher with its
// default principal is the gateway a host with its default
// GatewayPrincipalID expects (the real dispatcher's default principal), so
// a host configured without --gateway-principal-id (LoadConfig in a
// main's test) answers it. It signed as service:aipfleet-dispatcher, and
// such a host refused every action unsigned.
func TestDispatcherSignsAsTheHostsDefaultGateway(t *testing.T) {
	f := hostsdktest.Start(t, echoconnector.Connector{}, func(cfg *hostsdk.Config) { cfg.GatewayPrincipalID = "" })
	if got := f.Dispatcher.PrincipalID(); got != hostsdk.DefaultGatewayPrincipalID {
		t.Errorf("the dispatcher signs as %q, want the host's default gateway %q", got, hostsdk.DefaultGatewayPrincipalID)
	}
	if res := f.Result(t, hostsdktest.NewAction(echoconnector.CapSay, `{"message":"hi"}`)); res.Status != aip.ResultCompleted {
		t.Fatalf("result %+v", res)
	}
}

// TestStartProvisionsTheEditedIdentity: an edit that gives the host an
// identity of its own (tenant, replica ID, signing key) is what the fake
// control plane pre-provisions, so the host registers and serves. The
// registration was refused as not the pre-provisioned tenant, replica or
// key, with advice about a fleet file the test does not have.
func TestStartProvisionsTheEditedIdentity(t *testing.T) {
	key, err := aip.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	replicaID := aip.NewID(aip.PrefixReplica)
	f := hostsdktest.Start(t, echoconnector.Connector{}, func(cfg *hostsdk.Config) {
		cfg.TenantID, cfg.ReplicaID, cfg.SigningKey = "acme", replicaID, key
	})
	if res := f.Result(t, hostsdktest.NewAction(echoconnector.CapSay, `{"message":"hi"}`)); res.Status != aip.ResultCompleted {
		t.Fatalf("result %+v", res)
	}
	if f.Target.ReplicaID != replicaID || f.Host.DID() != key.DID() {
		t.Errorf("target %+v, host DID %s", f.Target, f.Host.DID())
	}
	if st, ok := f.ControlPlane.Replica(replicaID); !ok || st.Status != aip.ReplicaReady {
		t.Errorf("the control plane's replica %s: %+v (%v)", replicaID, st, ok)
	}
}
