package dispatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// settleHook is the registry with a hook run before each Settle (the
// embedded registry keeps it an UnsentReleaser, so hand-outs carry claims).
type settleHook struct {
	*memregistry.Registry
	before func(registry.RouteAssignment, registry.RouteSettlement)
}

func (s *settleHook) Settle(ctx context.Context, a registry.RouteAssignment, o registry.RouteSettlement) error {
	s.before(a, o)
	return s.Registry.Settle(ctx, a, o)
}

// TestCancelBeforeNeverDeliveredReroute: the action's hop found no
// connection to its replica A (a partition, or A restarting), and before
// the dispatcher moves the action a client's cancel reaches A under the
// same fence: A journals the action cancelled and the client is answered
// that it is. The action must then not run anywhere.
func TestCancelBeforeNeverDeliveredReroute(t *testing.T) {
	var refuseA atomic.Bool
	var addrA atomic.Value
	dialer := &net.Dialer{}
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if a, _ := addrA.Load().(string); refuseA.Load() && addr == a {
			return nil, errors.New("connection refused (partition)")
		}
		return dialer.DialContext(ctx, network, addr)
	}}}
	var w *world
	var act string
	var cancelStatus atomic.Int64
	var cancelResult atomic.Value
	w = newWorld(t, worldOptions{client: client, resolver: func(reg *memregistry.Registry) registry.Resolver {
		return &settleHook{Registry: reg, before: func(a registry.RouteAssignment, o registry.RouteSettlement) {
			if a.ActionID != act || o != registry.SettlementOutcomeUnknown || !refuseA.CompareAndSwap(true, false) {
				return
			}
			// A is reachable again; the client cancels.
			status, body, _ := w.call(http.MethodPost, dispatch.PathActions+"/"+act+"/cancel", tenant, nil)
			cancelStatus.Store(int64(status))
			var resp dispatch.ActionResponse
			if json.Unmarshal(body, &resp) == nil && resp.Result != nil {
				cancelResult.Store(resp.Result.Status)
			}
		}}
	}})
	a := w.startHost(8, 8)
	b := w.startHost(8, 8)
	addrA.Store(hostAddr(t, a.cfg.PublicEndpoint))
	refuseA.Store(true)
	act = w.actionFavoring(a.cfg.ReplicaID, a.cfg.ReplicaID, b.cfg.ReplicaID)
	status, resp := w.act(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("x", "")})
	got, _ := cancelResult.Load().(aip.ResultStatus)
	t.Logf("cancel answered %d %q; action answered %d %+v on %+v", cancelStatus.Load(), got, status, resp.Error, resp.Route)
	if cancelStatus.Load() != http.StatusOK || got != aip.ResultCancelled {
		t.Fatalf("the cancel was answered %d %q, want 200 cancelled (A journaled it before the action)", cancelStatus.Load(), got)
	}
	if runs := w.counter.runs(act); len(runs) != 0 {
		t.Fatalf("the client was answered that the action is cancelled, yet it ran on %v", runs)
	}
	if resp.Route == nil || resp.Route.ReplicaID != a.cfg.ReplicaID || len(resp.Route.Reroutes) != 0 {
		t.Fatalf("the action moved: %+v", resp.Route)
	}
}

// hostAddr is the host:port of an endpoint URL.
func hostAddr(t *testing.T, endpoint string) string {
	t.Helper()
	u, err := url.Parse(endpoint)
	must(t, err)
	return u.Host
}
