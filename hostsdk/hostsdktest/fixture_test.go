package hostsdktest_test

import (
	"encoding/json"
	"net/http"
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
